"""EquinoxState passes the whole adapter conformance suite."""

from __future__ import annotations

import equinox as eqx
import jax

import ciclo.testing
import ciclo_equinox
from ciclo.testing import CLASSES, FEATURES


class MLP(eqx.Module):
    """A per-example model (the Equinox idiom): ciclo vmaps it over the batch."""

    linear: eqx.nn.Linear
    norm: eqx.nn.BatchNorm
    dropout: eqx.nn.Dropout
    out: eqx.nn.Linear

    def __init__(self, key):
        k1, k2 = jax.random.split(key)
        self.linear = eqx.nn.Linear(FEATURES, 32, key=k1)
        self.norm = eqx.nn.BatchNorm(32, axis_name="batch", momentum=0.9, mode="batch")
        self.dropout = eqx.nn.Dropout(0.5)
        self.out = eqx.nn.Linear(32, CLASSES, key=k2)

    def __call__(self, x, state, *, key):
        x, state = self.norm(self.linear(x), state)
        return self.out(self.dropout(jax.nn.relu(x), key=key)), state


class TestEquinoxConformance(ciclo.testing.AdapterConformance):
    adapter = "equinox"

    def make_model(self):
        # Built directly, stateful layers hold their initial state; create_state takes it.
        return MLP(jax.random.key(0))

    def create_state(self, model, **kwargs):
        return ciclo_equinox.create_state(model, vmap=True, **kwargs)
