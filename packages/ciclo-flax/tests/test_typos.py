"""create_state and create_nnx_state reject unknown options, naming the close match."""

import flax.linen as nn
import jax.numpy as jnp
import optax
import pytest
from flax import nnx

import ciclo_flax

CE = optax.softmax_cross_entropy_with_integer_labels


@pytest.mark.parametrize(
    ("typo", "match"),
    [("stratgey", "strategy"), ("metrcs", "metrics"), ("rng_stream", "rng_streams")],
)
def test_create_state_names_the_close_match(typo, match):
    with pytest.raises(TypeError, match=rf"create_state\(\).*'{typo}'; did you mean '{match}'\?"):
        ciclo_flax.create_state(nn.Dense(3), jnp.zeros((1, 4)), None, losses={"l": CE}, **{typo: 1})


def test_create_nnx_state_names_the_close_match():
    model = nnx.Linear(4, 3, rngs=nnx.Rngs(0))
    with pytest.raises(TypeError, match=r"create_nnx_state\(\).*'wtr'; did you mean 'wrt'\?"):
        ciclo_flax.create_nnx_state(model, None, losses={"l": CE}, wtr=nnx.Param)
