"""Shared fixtures of ciclo-core's tests: a tiny linear-regression problem with a
``jax.jit`` step over a plain-dict state, and a controllable clock for time schedules."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ciclo
import ciclo._time._elapsed

W_TRUE = np.array([1.0, -2.0, 0.5], np.float32)


def make_batches(n: int, batch_size: int = 4, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """``n`` batches ``{"x": (batch_size, 3), "y": (batch_size,)}`` of a linear target."""
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(n):
        x = rng.normal(size=(batch_size, 3)).astype(np.float32)
        batches.append({"x": x, "y": x @ W_TRUE})
    return batches


@jax.jit
def regression_step(state: dict[str, Any], batch: dict[str, Any]) -> tuple[ciclo.Logs, Any]:
    """One SGD step; logs the loss and the sign accuracy of the predictions."""
    x, y = batch["x"], batch["y"]

    def loss_fn(w: jax.Array) -> tuple[jax.Array, jax.Array]:
        pred = x @ w
        return jnp.mean((pred - y) ** 2), pred

    (loss, pred), grad = jax.value_and_grad(loss_fn, has_aux=True)(state["w"])
    logs = ciclo.logs()
    logs.add_loss("loss", loss)
    logs.add_metric("accuracy", jnp.mean(jnp.sign(pred) == jnp.sign(y)))
    return logs, {"w": state["w"] - 0.1 * grad, "count": state["count"] + 1}


def initial_state() -> dict[str, jax.Array]:
    return {"w": jnp.zeros(3, jnp.float32), "count": jnp.zeros((), jnp.int32)}


def run_by_hand(
    batches: list[dict[str, np.ndarray]],
) -> tuple[list[dict[str, jax.Array]], list[ciclo.Logs]]:
    """The reference: ``regression_step`` applied in a plain Python loop.

    Returns the state *before* each step (and the final one last) and each step's logs,
    fetched to the host in one go.
    """
    state = initial_state()
    states, logs_list = [state], []
    for batch in batches:
        logs, state = regression_step(state, batch)
        states.append(state)
        logs_list.append(logs)
    return jax.device_get(states), jax.device_get(logs_list)


class Regression:
    """The shared problem, handed to tests by the ``regression`` fixture (test modules
    cannot import conftest under ``--import-mode=importlib``)."""

    step = staticmethod(regression_step)
    batches = staticmethod(make_batches)
    initial_state = staticmethod(initial_state)
    run_by_hand = staticmethod(run_by_hand)


@pytest.fixture
def regression() -> Regression:
    return Regression()


class FakeClock:
    """Stands in for the ``time`` module inside ``ciclo._time._elapsed``: time only moves when a
    test says so."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def time(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(ciclo._time._elapsed, "_time", fake)
    return fake


@pytest.fixture
def count_fetches(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The trees moved from device to host (``_host.to_host`` calls) during the test."""
    from ciclo._records import _host

    calls: list[Any] = []
    original = _host.to_host

    def counting(tree: Any) -> Any:
        calls.append(tree)
        return original(tree)

    monkeypatch.setattr(_host, "to_host", counting)
    return calls
