"""create_state rejects unknown options, naming the close match."""

import equinox as eqx
import jax
import optax
import pytest

import ciclo_equinox

CE = optax.softmax_cross_entropy_with_integer_labels


@pytest.mark.parametrize(
    ("typo", "match"),
    [
        ("stratgey", "strategy"),
        ("metrcs", "metrics"),
        ("filter_spek", "filter_spec"),
        ("vmpa", "vmap"),
    ],
)
def test_create_state_names_the_close_match(typo, match):
    model = eqx.nn.Linear(4, 3, key=jax.random.key(0))
    with pytest.raises(TypeError, match=rf"create_state\(\).*'{typo}'; did you mean '{match}'\?"):
        ciclo_equinox.create_state(model, None, losses={"l": CE}, **{typo: 1})
