"""No device->host transfer per step: every fetch of a log value goes through
``ciclo._records._host.to_host``, and a loop calls it far less than once per step.

On CPU ``jax.transfer_guard`` does not fire, so the checks count calls instead: of
``to_host`` itself, and of the arrays' host conversion outside ``to_host`` (which would
catch a ``float(x)`` or ``bool(x)`` on a device value hidden in a code path).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ciclo
import ciclo._records._host

STEPS = 1000


@dataclasses.dataclass
class FetchSpy:
    to_host_calls: int = 0
    hidden_fetches: int = 0  # host conversions of device arrays outside to_host
    inside: int = 0


@pytest.fixture
def spy(monkeypatch):
    """Counts ``to_host`` and ``land_stacked`` calls and, where JAX lets us, conversions
    that bypass them."""
    counts = FetchSpy()
    host = ciclo._records._host

    def counted(real):
        def fetch(values):
            counts.to_host_calls += 1
            counts.inside += 1
            try:
                return real(values)
            finally:
                counts.inside -= 1

        return fetch

    # The two ways ciclo fetches: a tree, and a history column's backlog as one array.
    monkeypatch.setattr(host, "to_host", counted(host.to_host))
    monkeypatch.setattr(host, "land_stacked", counted(host.land_stacked))  # a sent backlog

    # Every host conversion of a jax.Array (np.asarray, float, bool, .item(), device_get)
    # reads its `_value` property.
    array_type = type(jnp.zeros(()))
    value = getattr(array_type, "_value", None)
    if isinstance(value, property) and value.fget is not None:
        real_value = value.fget

        def spied_value(self):
            if not counts.inside:
                counts.hidden_fetches += 1
            return real_value(self)

        monkeypatch.setattr(array_type, "_value", property(spied_value))
        counts.hidden_fetches = 0
    else:  # pragma: no cover - depends on the JAX version
        counts.hidden_fetches = -1
    return counts


def test_the_spy_sees_a_hidden_fetch(spy):
    if spy.hidden_fetches < 0:
        pytest.skip("this JAX version's arrays have no `_value` property to spy on")
    x = jnp.ones(2) + 1
    float(x[0])
    assert spy.hidden_fetches == 1
    ciclo._records._host.to_host({"x": x})
    assert spy.hidden_fetches == 1
    assert spy.to_host_calls == 1


def test_a_1000_step_loop_fetches_far_less_than_once_per_step(regression, spy):
    batches = regression.batches(STEPS, batch_size=2)
    _, history, elapsed = ciclo.loop(
        regression.initial_state(), batches, {ciclo.every(1): regression.step}
    )
    calls_during_loop = spy.to_host_calls
    hidden_during_loop = spy.hidden_fetches

    steps, loss, accuracy = history.collect("steps", "loss", "accuracy")
    calls_in_all = spy.to_host_calls

    # What the same jitted step gives when run by hand (fetched after the spy's counts).
    _, ref_logs = regression.run_by_hand(batches)

    assert elapsed.steps == STEPS
    assert calls_during_loop <= 20
    assert calls_in_all <= 21
    if hidden_during_loop >= 0:
        assert hidden_during_loop == 0
    assert steps == list(range(STEPS))
    assert loss == [float(logs.losses.loss) for logs in ref_logs]
    assert accuracy == [float(logs.metrics.accuracy) for logs in ref_logs]


def test_hooks_and_stacked_commits_do_not_fetch_per_step(spy):
    @jax.jit
    def fused(state, batch):
        # Four steps in one call, logs stacked along axis 0.
        def body(w, x):
            return w + x.sum(), ciclo.logs().add_loss("loss", w)

        state, logs = jax.lax.scan(body, state, batch.reshape(4, -1))
        return logs, state

    def commit_stacked(state, batch, elapsed, loop_state):
        logs, new_state = fused(state, batch)
        steps = [
            ciclo.Elapsed(elapsed.steps * 4 + i, elapsed.samples + i, elapsed.time, 0.0)
            for i in range(4)
        ]
        loop_state.history.commit_many(steps, logs)
        return None, new_state

    def end(state):
        return ciclo.logs().add_metric("final", state)

    batches = [np.full((4, 1), i, np.float32) for i in range(50)]
    state, history, _ = ciclo.loop(
        jnp.float32(0.0), batches, {ciclo.every(1): commit_stacked}, on_end=end
    )
    assert spy.to_host_calls <= 5
    if spy.hidden_fetches >= 0:
        assert spy.hidden_fetches == 0
    assert len(history) == 201
    loss = history.collect("loss")
    assert len(loss) == 200
    assert loss[:6] == [0.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    assert history.collect("final") == [float(state)]


@pytest.mark.parametrize("in_host_memory", [True, False])
def test_a_copy_is_started_ahead_only_off_the_host(monkeypatch, in_host_memory):
    # On a CPU the arrays are host memory: a copy started ahead only costs there. Elsewhere
    # (simulated: no platform counts as host memory) each stacked chunk's copy starts at
    # once, so that landing it 256 steps later does not wait.
    from jax._src.array import ArrayImpl

    host = ciclo._records._host
    if not in_host_memory:
        monkeypatch.setattr(host, "_IN_HOST_MEMORY", frozenset())
    started = []
    real = ArrayImpl.copy_to_host_async
    monkeypatch.setattr(
        ArrayImpl, "copy_to_host_async", lambda self: (started.append(self.shape), real(self))
    )
    history = ciclo.history(fetch_interval=1e9)
    elapsed = ciclo.Elapsed.create()
    for i in range(300):  # a chunk of 256, then one of 64 (44 rows padded)
        history.commit(elapsed, ciclo.logs().add_metric("x", jnp.float32(i)))
    assert history.collect("x") == list(range(300))
    assert started == ([] if in_host_memory else [(256,), (64,)])
