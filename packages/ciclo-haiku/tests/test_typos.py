"""create_state rejects unknown options, naming the close match."""

import haiku as hk
import jax.numpy as jnp
import optax
import pytest

import ciclo_haiku

CE = optax.softmax_cross_entropy_with_integer_labels


def forward(x):
    return hk.Linear(3)(x)


@pytest.mark.parametrize(
    ("typo", "match"),
    [
        ("stratgey", "strategy"),
        ("metrcs", "metrics"),
        ("trainig_arg", "training_arg"),
        ("inputs_kye", "inputs_key"),
    ],
)
def test_create_state_names_the_close_match(typo, match):
    with pytest.raises(TypeError, match=rf"create_state\(\).*'{typo}'; did you mean '{match}'\?"):
        ciclo_haiku.create_state(forward, jnp.zeros((1, 4)), None, losses={"l": CE}, **{typo: 1})
