"""HaikuState passes the whole adapter conformance suite."""

from __future__ import annotations

import haiku as hk
import jax

import ciclo.testing
import ciclo_haiku
from ciclo.testing import CLASSES


def forward(x, is_training):
    # No bias before batch norm: its true gradient is zero, and Adam would turn rounding noise
    # into full-size updates that differ between strategies (the data_parallel check).
    x = hk.Linear(32, with_bias=False)(x)
    x = hk.BatchNorm(True, True, decay_rate=0.9)(x, is_training)
    x = jax.nn.relu(x)
    if is_training:
        x = hk.dropout(hk.next_rng_key(), 0.5, x)
    return hk.Linear(CLASSES)(x)


# A transformed function holds no state (parameters live in the ciclo state), so one serves
# as a fresh model for every check, and the checks share compiled steps.
MODEL = hk.transform_with_state(forward)


class TestHaikuConformance(ciclo.testing.AdapterConformance):
    adapter = "haiku"

    def make_model(self):
        return MODEL

    def create_state(self, model, **kwargs):
        return ciclo_haiku.create_state(model, ciclo.testing.sample_inputs(), **kwargs)
