"""The reference adapter (FunctionState: a model that is a plain JAX function) passes the
conformance suite, which also shows the suite needs no framework."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import pytest

import ciclo
import ciclo.testing
from ciclo._plugins import _discovery
from ciclo.adapters import FunctionState
from ciclo.testing import CLASSES, FEATURES


@dataclasses.dataclass(frozen=True)
class PureMLP:
    """Dense -> batch norm -> relu -> dropout -> dense, written with jax.numpy."""

    hidden: int = 32
    rate: float = 0.5
    momentum: float = 0.9

    def init(self, key):
        k1, k2 = jax.random.split(key)
        params = {
            "w1": jax.random.normal(k1, (FEATURES, self.hidden)) / FEATURES**0.5,
            "b1": jnp.zeros(self.hidden),
            "w2": jax.random.normal(k2, (self.hidden, CLASSES)) / self.hidden**0.5,
            "b2": jnp.zeros(CLASSES),
        }
        model_state = {"mean": jnp.zeros(self.hidden), "var": jnp.ones(self.hidden)}
        return params, model_state

    def __call__(self, params, model_state, x, *, training, key):
        h = x @ params["w1"] + params["b1"]
        if training:
            mean, var = h.mean(0), h.var(0)
            m = self.momentum
            model_state = {
                "mean": m * model_state["mean"] + (1 - m) * mean,
                "var": m * model_state["var"] + (1 - m) * var,
            }
        else:
            mean, var = model_state["mean"], model_state["var"]
        h = jax.nn.relu((h - mean) / jnp.sqrt(var + 1e-5))
        if training:
            keep = jax.random.bernoulli(key, 1 - self.rate, h.shape)
            h = jnp.where(keep, h / (1 - self.rate), 0.0)
        return h @ params["w2"] + params["b2"], model_state


def create_function_state(model, tx, *, losses, metrics=None, key=None, **options):
    init_key, key = jax.random.split(ciclo.adapters.as_key(key))
    params, model_state = model.init(init_key)
    return FunctionState.create(
        apply_fn=model,
        params=params,
        model_state=model_state,
        tx=tx,
        losses=losses,
        metrics=metrics,
        key=key,
        **options,
    )


REFERENCE = ciclo.adapters.Adapter(
    name="reference",
    distribution="ciclo-core",
    handles=lambda model: isinstance(model, PureMLP),
    create_state=create_function_state,
)


class EntryPoint:
    name = "reference"
    value = "tests:REFERENCE"
    dist = None

    def load(self):
        return REFERENCE


@pytest.fixture(autouse=True)
def registered(monkeypatch):
    real = _discovery._entry_points
    monkeypatch.setattr(_discovery, "_entry_points", lambda: [*real(), EntryPoint()])
    monkeypatch.setattr(_discovery, "_LOADED", {})


class TestReferenceConformance(ciclo.testing.AdapterConformance):
    adapter = "reference"

    def make_model(self):
        return PureMLP()

    def create_state(self, model, **kwargs):
        return create_function_state(model, **kwargs)


def test_skipping_a_check_needs_a_known_name_and_a_reason():
    with pytest.raises(ValueError, match=r"skip\['rng'\] needs a written reason"):

        class NoReason(ciclo.testing.AdapterConformance):
            skip = {"rng": ""}  # noqa: RUF012

    with pytest.raises(ValueError, match=r"skip names an unknown check 'dropout'; checks: \("):

        class Unknown(ciclo.testing.AdapterConformance):
            skip = {"dropout": "the model has none"}  # noqa: RUF012


def test_a_skipped_check_reports_its_reason():
    class Skipping(ciclo.testing.AdapterConformance):
        adapter = "reference"
        skip = {"rng": "this adapter's test model has no dropout"}  # noqa: RUF012

    with pytest.raises(pytest.skip.Exception, match="skips 'rng': this adapter's test model"):
        Skipping().test_rng()
