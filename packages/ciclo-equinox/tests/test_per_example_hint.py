"""A per-example Equinox model fed a batch without ``vmap=True``: the shape error says so."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
import pytest

import ciclo_equinox

CE = optax.softmax_cross_entropy_with_integer_labels


class CNN(eqx.Module):
    """A per-example CNN as Equinox's MNIST notebook writes it: images ``(1, 8, 8)``."""

    layers: list

    def __init__(self, key):
        k1, k2 = jax.random.split(key)
        self.layers = [
            eqx.nn.Conv2d(1, 3, kernel_size=4, key=k1),
            jax.nn.relu,
            jnp.ravel,
            eqx.nn.Linear(3 * 5 * 5, 10, key=k2),
        ]

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


@pytest.mark.parametrize(
    ("model", "inputs", "error"),
    [
        (eqx.nn.Linear(4, 3, key=jax.random.key(0)), jnp.ones((8, 4)), TypeError),
        (CNN(jax.random.key(0)), jnp.ones((8, 1, 8, 8)), ValueError),
    ],
)
def test_a_shape_error_of_a_per_example_model_hints_vmap(model, inputs, error):
    state = ciclo_equinox.create_state(model, optax.sgd(0.1), losses={"loss": CE})
    batch = (inputs, jnp.zeros(8, jnp.int32))
    name = type(model).__name__
    with pytest.raises(
        error,
        match=rf"{name} failed on a batch.*per-example model.*create_state\(\.\.\., vmap=True\)",
    ):
        state.train_step(batch)
    fixed = ciclo_equinox.create_state(model, optax.sgd(0.1), losses={"loss": CE}, vmap=True)
    fixed.train_step(batch)


def test_a_shape_error_of_a_batched_model_is_left_alone():
    class Batched(eqx.Module):
        linear: eqx.nn.Linear

        def __call__(self, x):
            return jax.vmap(self.linear)(x[:, :3])  # wrong on any input

    model = Batched(eqx.nn.Linear(4, 3, key=jax.random.key(0)))
    state = ciclo_equinox.create_state(model, optax.sgd(0.1), losses={"loss": CE})
    with pytest.raises(TypeError, match="dot_general") as raised:
        state.train_step((jnp.ones((8, 4)), jnp.zeros(8, jnp.int32)))
    assert "vmap=True" not in str(raised.value)
