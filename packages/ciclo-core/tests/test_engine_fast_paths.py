"""The per-step fast paths of the engine give the same answers as the general code."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ciclo
from ciclo._loop._hooks import (
    hook_owners,
    is_fusable,
    is_observer,
    is_stateful,
    is_transient,
)
from ciclo._loop._returns import as_logs
from ciclo._time._elapsed import default_batch_size
from ciclo._time._schedules import _Every


def _general_batch_size(batch):
    for leaf in jax.tree_util.tree_leaves(batch):
        shape = getattr(leaf, "shape", None)
        if shape is not None and len(shape) > 0:
            return int(shape[0])
    return 1


BATCHES = [
    np.zeros((4, 2)),
    jnp.zeros((3,)),
    np.zeros(()),
    (np.zeros((5, 784)), np.zeros(5)),
    (np.zeros(()), np.zeros((7,))),
    (jnp.zeros((2, 2)),),
    (jnp.zeros(()), jnp.zeros((9,))),
    (),
    [np.zeros((6,))],
    {"x": np.zeros((8, 1))},
    3,
    2.5,
    True,
    np.int64(4),
]


@pytest.mark.parametrize("batch", BATCHES)
def test_default_batch_size_fast_paths_match_the_general_rule(batch) -> None:
    assert default_batch_size(batch) == _general_batch_size(batch)


@pytest.mark.parametrize("batch", BATCHES)
def test_elapse_counts_samples_by_the_general_rule(batch) -> None:
    # elapse inlines default_batch_size's fast paths: they must count what it counts.
    steps = ciclo.elapse([batch] * 3)
    assert [elapsed.samples for elapsed, _ in steps] == [
        i * _general_batch_size(batch) for i in range(3)
    ]
    assert steps.finish().samples == 3 * _general_batch_size(batch)


def test_every_step_fast_path_matches_the_general_rule() -> None:
    counts = [0, 1, 2, 2, 3, 5, 5, 0, 0, 1, 4, 3, 3, 10]
    fast = _Every("steps", 1)
    general = _Every("steps", 1)
    general._each_step = False
    for steps in counts:
        elapsed = ciclo.Elapsed(steps=steps, samples=steps, time=0.0, date=0.0)
        assert fast(elapsed) == general(elapsed), steps
    assert fast.state_dict() == general.state_dict()


def test_elapsed_update_is_a_plain_frozen_elapsed() -> None:
    e = ciclo.Elapsed.create().update(batch_size=4)
    assert type(e) is ciclo.Elapsed
    assert (e.steps, e.samples) == (1, 4)
    assert e == ciclo.Elapsed(steps=1, samples=4, time=e.time, date=e.date)
    with pytest.raises(AttributeError, match="cannot assign to field"):
        e.steps = 3  # type: ignore[misc]


def test_history_keeps_rows_in_order_across_host_device_and_stacked_commits() -> None:
    history = ciclo.history(fetch_interval=1e9)
    e = ciclo.Elapsed.create()
    history.commit(e, ciclo.logs().add_metric("a", 1.0))  # host: stored at once
    history.commit(e, ciclo.logs().add_metric("a", jnp.asarray(2.0)))  # device: waits
    history.commit(e, ciclo.logs().add_metric("b", 5))  # host, but after a waiting row
    history.commit_many([e, e], ciclo.logs().add_metric("a", jnp.asarray([3.0, 4.0])))
    history.commit(e, None)
    assert len(history) == 6
    assert history.collect("a") == [1.0, 2.0, 3.0, 4.0]
    assert history.collect("b") == [5]
    assert [row.get("metrics", {}) for row in history] == [
        {"a": 1.0},
        {"a": 2.0},
        {"b": 5},
        {"a": 3.0},
        {"a": 4.0},
        {},
    ]


_RETURNS = {
    "logs and state": lambda state, logs: (logs, state + 1),
    "logs and None": lambda state, logs: (logs, None),
    "None and state": lambda state, logs: (None, state + 1),
    "outputs, logs and state": lambda state, logs: ({"y": state}, logs, state + 1),
    "the state alone": lambda state, logs: state + 1,
    "None": lambda state, logs: None,
    "a list": lambda state, logs: [logs],
}


@pytest.mark.parametrize("kind", list(_RETURNS))
def test_a_state_batch_step_called_in_place_reads_as_any_callback(kind) -> None:
    # run_step calls a (state, batch) callback itself; one taking elapsed too goes through
    # Callback.__call__. Every return, good or bad, must read the same both ways.
    def outcome(step):
        try:
            state, history, _ = ciclo.loop(0, range(3), {ciclo.every(1): step})
        except TypeError as error:
            return str(error)
        return state, [{k: v for k, v in row.items() if k != "elapsed"} for row in history]

    def two(state, batch):
        return _RETURNS[kind](state, ciclo.logs().add_metric("b", batch))

    def three(state, batch, elapsed):
        return _RETURNS[kind](state, ciclo.logs().add_metric("b", batch))

    three.__qualname__ = two.__qualname__  # the same name in the messages
    assert outcome(two) == outcome(three)
    if kind == "a list":
        with pytest.raises(TypeError, match=r"callback .*two returned"):
            ciclo.loop(0, range(3), {ciclo.every(1): two})


def test_a_stop_that_cuts_a_state_batch_callback_is_recorded_and_raises_nothing() -> None:
    from ciclo._loop._callback import LoopInterrupted

    def evaluate(state, batch):
        if batch == 1:  # as a loop run inside it does when the outer loop's stop cut it
            raise LoopInterrupted("stopped by SIGTERM")
        return ciclo.logs().add_metric("b", batch), state + 1

    reasons = []
    state, history, _ = ciclo.loop(
        0,
        range(3),
        {ciclo.every(1): evaluate},
        on_end=lambda s, b, e, loop_state: reasons.append(loop_state.stop_reason),
    )
    assert state == 2  # the cut call changed nothing
    assert history.collect("steps", "b") == ([0, 2], [0, 2])
    assert reasons == [
        "stopped by SIGTERM; "
        f"{evaluate.__qualname__} at step 1 ended at its next batch and is not recorded"
    ]


def test_hook_probes() -> None:
    bar = ciclo.keras_bar(10)

    class Run:
        def step(self, state):
            return state

        def __loop_end__(self, loop_state, error):
            pass

    run = Run()
    assert is_observer(bar)
    assert not is_observer(run.step)
    assert not is_fusable(run.step)
    assert hook_owners([run.step, bar, run], "__loop_end__") == [run]
    assert hook_owners([run.step, bar], "__loop_restart__") == []
    dog = ciclo.watchdog()
    assert is_transient(dog)
    assert not is_transient(run.step)
    assert is_stateful(ciclo.every(3))
    assert not is_stateful(run)


def test_as_logs_names_what_is_wrong() -> None:
    assert as_logs({"metrics": {"a": 1}}, str) == {"metrics": {"a": 1}}
    with pytest.raises(TypeError, match="not logs: list"):
        as_logs([1], lambda bad: f"not logs: {type(bad).__name__}")


def test_a_plain_bar_redraws_on_the_steps_its_interval_says(monkeypatch) -> None:
    import io

    from ciclo.callbacks import _progress

    clock = [100.0]
    monkeypatch.setattr(_progress._time, "monotonic", lambda: clock[0])

    def step(state, batch):
        clock[0] += 0.03  # each step takes 30 ms
        return ciclo.logs().add_metric("x", 1.0), state

    out = io.StringIO()
    bar = ciclo.keras_bar(40, interval=0.1, plain_interval=0.25, dynamic=False, file=out)
    ciclo.loop(0, [np.zeros(1)] * 40, {ciclo.every(1): [step, bar]})
    drawn = [int(line.split("/")[0]) for line in out.getvalue().splitlines()]
    # The rule: the first step draws, then each step at least 0.25 s after the last
    # draw, and the last step (the final line).
    expected, last = [], None
    for i in range(40):
        now = 100.0 + 0.03 * (i + 1)
        if last is None or now - last >= 0.25 or i == 39:
            expected.append(i + 1)
            last = now
    assert drawn == expected
