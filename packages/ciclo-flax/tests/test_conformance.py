"""Both Flax states (Linen and NNX) pass the whole adapter conformance suite."""

from __future__ import annotations

import flax.linen as nn
from flax import nnx

import ciclo.testing
import ciclo_flax
from ciclo.testing import CLASSES, FEATURES


class LinenMLP(nn.Module):
    @nn.compact
    def __call__(self, x, training: bool):
        x = nn.Dense(32)(x)
        x = nn.BatchNorm(use_running_average=not training, momentum=0.9)(x)
        x = nn.Dropout(0.5, deterministic=not training)(nn.relu(x))
        return nn.Dense(CLASSES)(x)


class NNXMLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.linear = nnx.Linear(FEATURES, 32, rngs=rngs)
        self.norm = nnx.BatchNorm(32, momentum=0.9, rngs=rngs)
        self.dropout = nnx.Dropout(0.5, rngs=rngs)
        self.out = nnx.Linear(32, CLASSES, rngs=rngs)

    def __call__(self, x):
        return self.out(self.dropout(nnx.relu(self.norm(self.linear(x)))))


class TestLinenConformance(ciclo.testing.AdapterConformance):
    adapter = "flax"

    def make_model(self):
        return LinenMLP()

    def create_state(self, model, **kwargs):
        return ciclo_flax.create_state(model, ciclo.testing.sample_inputs(), **kwargs)


class TestNNXConformance(ciclo.testing.AdapterConformance):
    adapter = "flax"

    def make_model(self):
        return NNXMLP(nnx.Rngs(0))

    def create_state(self, model, **kwargs):
        return ciclo_flax.create_nnx_state(model, **kwargs)
