"""Managed steps with broadcasts and statics: ``step(state, batch, broadcasts, statics)``."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import ciclo
from ciclo.managed import ManagedState

DEVICES = jax.device_count()
TX = optax.sgd(0.05, momentum=0.9)
needs_devices = pytest.mark.skipif(
    DEVICES < 2, reason="needs several devices: XLA_FLAGS=--xla_force_host_platform_device_count=8"
)


def make_state(strategy="jit", **options):
    params = {"w": jnp.zeros(4), "b": jnp.zeros(())}
    return ManagedState.create(params=params, tx=TX, strategy="jit").with_strategy(
        strategy, **options
    )


def make_batches(steps=4, batch_size=16, seed=0):
    rng = np.random.default_rng(seed)
    w = rng.normal(size=4).astype(np.float32)
    out = []
    for _ in range(steps):
        x = rng.normal(size=(batch_size, 4)).astype(np.float32)
        out.append((x, x @ w))
    return out


def counting_steps():
    """A train step and a plain step that count their traces (Python runs only then)."""
    traces = []

    @ciclo.managed.train_step
    def train_step(state, batch, broadcasts, statics):
        traces.append(statics)
        x, y = batch
        pred = x @ state.params["w"] + state.params["b"]
        error = (pred - y) ** 2
        if statics == "weighted":  # Python branches on statics
            error = error * broadcasts["weight"]
        logs = ciclo.logs().add_loss("loss", jnp.mean(error))
        # broadcasts arrive whole on every device: 5 entries, not divisible by 8.
        logs.add_metric("table_sum", broadcasts["table"].sum())
        return logs, state

    @ciclo.managed.step
    def eval_step(state, batch, broadcasts, statics):
        traces.append(statics)
        x, _ = batch
        return ciclo.logs().add_metric(statics, (x * broadcasts).sum()), state

    return traces, train_step, eval_step


def broadcasts(weight=2.0):
    return {"weight": jnp.asarray(weight), "table": jnp.arange(5.0)}


def test_broadcasts_and_statics_reach_the_step():
    _, _, eval_step = counting_steps()
    batch = make_batches(steps=1)[0]
    logs, _ = eval_step(make_state(), batch, jnp.full(4, 3.0), "scaled_sum")
    np.testing.assert_allclose(float(logs.metrics.scaled_sum), 3 * batch[0].sum(), rtol=1e-5)


def test_a_changed_statics_recompiles_an_equal_one_does_not():
    traces, train_step, _ = counting_steps()
    state, batch = make_state(), make_batches(steps=1)[0]
    _, state = train_step(state, batch, broadcasts(), "weighted")
    _, state = train_step(state, batch, broadcasts(3.0), "weighted")  # new values: no trace
    assert traces == ["weighted"]
    _, state = train_step(state, batch, broadcasts(), "plain")
    assert traces == ["weighted", "plain"]
    _, state = train_step(state, batch, broadcasts(), "".join(["weigh", "ted"]))  # equal
    _, state = train_step(state, batch, broadcasts(), "plain")
    assert traces == ["weighted", "plain"]
    assert int(state.step) == 5


def test_equal_statics_objects_share_one_compilation():
    traces, _, eval_step = counting_steps()

    @dataclasses.dataclass(frozen=True)
    class Mode:
        name: str

    state, batch = make_state(), make_batches(steps=1)[0]
    eval_step(state, batch, jnp.ones(4), ("sum", Mode("a")))
    eval_step(state, batch, jnp.ones(4), ("sum", Mode("a")))
    eval_step(state, batch, jnp.ones(4), ("sum", Mode("b")))
    assert traces == [("sum", Mode("a")), ("sum", Mode("b"))]


def test_statics_change_the_computation_and_broadcasts_the_values():
    _, train_step, _ = counting_steps()
    batch = make_batches(steps=1)[0]
    plain, _ = train_step(make_state(), batch, broadcasts(), "plain")
    weighted, _ = train_step(make_state(), batch, broadcasts(3.0), "weighted")
    np.testing.assert_allclose(float(weighted.losses.loss), 3 * float(plain.losses.loss), rtol=1e-6)
    assert float(plain.metrics.table_sum) == 10.0


@needs_devices
@pytest.mark.parametrize("strategy", ["data-parallel", "fsdp", "pmap"])
def test_broadcasts_reach_every_device_whole(strategy):
    _, train_step, _ = counting_steps()
    ref, par = make_state(), make_state(strategy)
    for batch in make_batches():
        ref_logs, ref = train_step(ref, batch, broadcasts(), "weighted")
        logs, par = train_step(par, batch, broadcasts(), "weighted")
    assert float(logs.metrics.table_sum) == 10.0
    np.testing.assert_allclose(float(logs.losses.loss), float(ref_logs.losses.loss), rtol=1e-5)
    for a, b in zip(jax.tree.leaves(par.params), jax.tree.leaves(ref.params), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_bound_steps_run_in_a_loop_fused_and_share_compilations():
    traces, train_step, _ = counting_steps()
    batches = make_batches(steps=8)
    bound = train_step.bind(broadcasts(), statics="weighted")
    state, history, _ = ciclo.loop(make_state(steps_per_call=4), batches, {ciclo.every(1): bound})
    assert int(state.step) == 8
    assert len(history.collect("loss")) == 8
    assert traces == ["weighted"]  # one fused compilation for both groups of 4
    # The same steps one by one give the same parameters.
    ref = make_state()
    for batch in batches:
        _, ref = train_step(ref, batch, broadcasts(), "weighted")
    np.testing.assert_allclose(np.asarray(state.params["w"]), np.asarray(ref.params["w"]), 1e-5)
    # Binding an equal statics again reuses the compiled steps.
    again = train_step.bind(broadcasts(), statics="weighted")
    again(ref, batches[0])
    assert traces == ["weighted", "weighted"]  # the unfused step, once


def test_a_bound_step_takes_arguments_given_in_a_call_first():
    _, _, eval_step = counting_steps()
    bound = eval_step.bind(jnp.ones(4), statics="bound")
    batch = make_batches(steps=1)[0]
    logs, _ = bound(make_state(), batch, jnp.full(4, 2.0), "given")
    assert sorted(logs.metrics) == ["given"]
    np.testing.assert_allclose(float(logs.metrics.given), 2 * batch[0].sum(), rtol=1e-5)


@dataclasses.dataclass(frozen=True, kw_only=True)
class WeightedState(ManagedState):
    @ciclo.managed.train_step
    def train_step(self, batch, broadcasts, statics=None):
        x, y = batch
        error = jnp.mean((x @ self.params["w"] + self.params["b"] - y) ** 2)
        return ciclo.logs().add_loss("loss", error * broadcasts), self


def test_step_methods_take_broadcasts_and_bind_them():
    state = WeightedState.create(params={"w": jnp.zeros(4), "b": jnp.zeros(())}, tx=TX)
    batch = make_batches(steps=1)[0]
    logs, _ = state.train_step(batch, jnp.asarray(2.0))
    state, history, _ = ciclo.loop(
        state, [batch], {ciclo.every(1): state.train_step.bind(jnp.asarray(2.0))}
    )
    assert history.collect("loss") == [pytest.approx(float(logs.losses.loss))]
    assert int(state.step) == 1


def test_broadcasts_for_a_step_without_them_is_a_clear_error():
    @ciclo.managed.step
    def plain(state, batch):
        return ciclo.logs(), state

    with pytest.raises(TypeError, match=r"plain was given broadcasts and statics, but it takes "):
        plain(make_state(), make_batches(steps=1)[0], jnp.ones(2), "mode")
    with pytest.raises(TypeError, match=r"def plain\(state, batch, broadcasts, statics\)"):
        plain.bind(jnp.ones(2))


def test_unhashable_statics_is_a_clear_error():
    _, _, eval_step = counting_steps()
    with pytest.raises(TypeError, match=r"statics must be hashable .* got list \['sum'\]"):
        eval_step.bind(jnp.ones(4), statics=["sum"])
