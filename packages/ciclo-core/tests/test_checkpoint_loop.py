"""The loop hooks a checkpoint relies on: ``loop_state.at_step_end``, ``__loop_end__``,
what ``LoopState`` exposes, and graceful stops on SIGINT / SIGTERM (nested loops too)."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

import ciclo


def test_at_step_end_sees_the_whole_step_committed() -> None:
    seen = []

    def request(loop_state: ciclo.LoopState) -> None:
        loop_state.at_step_end(snapshot)
        loop_state.at_step_end(snapshot)  # asked twice, runs once

    def snapshot(loop_state: ciclo.LoopState) -> None:
        history = loop_state.history
        seen.append((loop_state.elapsed.steps, len(history), history.collect("later")[-1]))

    def later(state: Any, batch: Any, elapsed: ciclo.Elapsed) -> Any:
        return ciclo.logs().add_metric("later", elapsed.steps)

    tasks = {ciclo.every(2): lambda s, b, e, ls: request(ls), ciclo.every(1): later}
    ciclo.loop(None, range(4), tasks)
    # the count after the step, its row committed, logs of callbacks that ran after
    assert seen == [(1, 1, 0), (3, 3, 2)]


def test_a_failing_step_end_hook_names_itself() -> None:
    def broken(loop_state: ciclo.LoopState) -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom") as info:
        ciclo.loop(None, range(3), {ciclo.every(1): lambda s, b, e, ls: ls.at_step_end(broken)})
    assert any("step-end hook" in note and "broken" in note for note in info.value.__notes__)


class Ender:
    def __init__(self, log: list[Any]) -> None:
        self.log = log

    def __call__(self, state: Any) -> Any:
        return state + 1

    def on_step(self, state: Any) -> Any:
        return state

    def __loop_end__(self, loop_state: ciclo.LoopState, error: BaseException | None) -> None:
        self.log.append(("end", loop_state.elapsed.steps, repr(error)))


def test_loop_end_runs_once_before_on_end_and_after_errors() -> None:
    log: list[Any] = []
    ender = Ender(log)
    tasks = {ciclo.every(1): [ender, ender.on_step], ciclo.every(2): ender.on_step}
    ciclo.loop(0, range(3), tasks, on_end=lambda: log.append("on_end"))
    assert log == [("end", 3, "None"), "on_end"]

    log.clear()

    def fail(state: Any, batch: int) -> None:
        if batch == 1:
            raise ZeroDivisionError("step 1")

    with pytest.raises(ZeroDivisionError):
        ciclo.loop(0, range(3), {ciclo.every(1): [ender.on_step, fail]})
    assert log == [("end", 1, "ZeroDivisionError('step 1')")]


def test_loop_state_exposes_the_tasks_the_dataset_and_where_the_loop_started() -> None:
    seen = []
    dataset = range(5, 9)

    def look(state: Any, batch: Any, elapsed: Any, loop_state: ciclo.LoopState) -> None:
        inputs = loop_state.inputs  # what checkpoints read, apart from the callbacks' view
        seen.append((inputs.tasks, inputs.dataset, loop_state.initial_elapsed.steps))

    start = ciclo.Elapsed.create(steps=10)
    ciclo.loop(None, dataset, {ciclo.at(steps=12).reached_by: look}, elapsed=start)
    ((tasks, data, initial),) = seen[:1]
    assert data is dataset
    assert initial == 10
    assert len(seen) == 2
    ((schedule, callbacks),) = tasks
    assert schedule(ciclo.Elapsed.create(steps=12))
    assert [c.fn for c in callbacks] == [look]


def _signal_at(sig: signal.Signals, step: int) -> Any:
    def send(state: Any, batch: Any, elapsed: ciclo.Elapsed) -> Any:
        if elapsed.steps == step:
            signal.raise_signal(sig)
        return state + 1

    return send


def test_sigterm_finishes_the_step_saves_runs_on_end_and_exits_143(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ended = []
    ckpt = ciclo.checkpoint(tmp_path)
    tasks = {ciclo.every(1): _signal_at(signal.SIGTERM, 2), ciclo.every(100): ckpt}
    with pytest.raises(SystemExit) as info:
        ciclo.loop(0, range(10), tasks, on_end=lambda s, b, e: ended.append((s, e.steps)))
    assert info.value.code == 128 + signal.SIGTERM
    assert ended == [(3, 3)]  # the step that got the signal finished
    assert ckpt.all_steps() == [1, 3]
    assert ciclo.restore(tmp_path, 0).state == 3
    assert (
        f"ciclo: stopped by SIGTERM (checkpoint 3 saved in {ckpt.directory}) after 3 steps; "
        f"exiting with status 143." in capsys.readouterr().err
    )
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handler restored


def test_ctrl_c_returns_after_saving(tmp_path: Path) -> None:
    reasons = []
    ckpt = ciclo.checkpoint(tmp_path)
    tasks = {ciclo.every(1): _signal_at(signal.SIGINT, 2), ciclo.every(2): ckpt}
    state, _, elapsed = ciclo.loop(
        0, range(10), tasks, on_end=lambda s, b, e, ls: reasons.append(ls.stop_reason)
    )
    # the step that got the signal also had a scheduled checkpoint: saved once
    assert (state, elapsed.steps, ckpt.all_steps()) == (3, 3, [1, 3])
    assert reasons == [f"stopped by SIGINT (checkpoint 3 saved in {ckpt.directory})"]


def test_a_signal_in_a_nested_loop_stops_the_outer_loop_after_its_step() -> None:
    inner_steps = []

    def evaluate(state: Any) -> Any:
        _, _, elapsed = ciclo.loop(0, range(4), {ciclo.every(1): _signal_at(signal.SIGINT, 1)})
        inner_steps.append(elapsed.steps)
        return state + 1

    reasons = []
    state, history, elapsed = ciclo.loop(
        0,
        range(10),
        {ciclo.every(1): [evaluate, ciclo.inner_loop("probe", _probe)]},
        on_end=lambda s, b, e, ls: reasons.append(ls.stop_reason),
    )
    # Issue 28: the inner loop ends at its next batch, and its callback records nothing.
    assert inner_steps == []
    assert (state, elapsed.steps) == (0, 1)  # the outer one stopped after that step
    assert "probe" not in " ".join(history.keys())  # the probe was cut at once too
    assert reasons == [
        "stopped by SIGINT; inner_loop('probe') at step 0 ended at its next batch and is not "
        "recorded"
    ]


def _probe(state: Any) -> Any:
    seen = []

    def probe(state: Any, batch: Any) -> Any:
        seen.append(batch)
        return ciclo.logs().add_metric("mean", batch)

    result = ciclo.loop(state, range(100), {ciclo.every(1): probe})
    pytest.fail(f"the probe ran to its end: {seen}")
    return result
