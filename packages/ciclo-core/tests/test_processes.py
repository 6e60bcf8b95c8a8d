"""Several processes, in one process: the checks and rules that need no second process
(the 2-process runs are in test_multihost_agreement.py)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np
import pytest

import ciclo
from ciclo._loop._agreed import AgreedDecisions
from ciclo._processes._outputs import writes_here
from ciclo.managed._strategies import check_feedable


def devices(*processes: int) -> np.ndarray:
    return np.array([SimpleNamespace(process_index=p) for p in processes], dtype=object)


def test_a_batch_axis_spanning_the_processes_can_be_fed():
    mesh = devices(0, 0, 1, 1).reshape(2, 2)  # rows: processes
    check_feedable("sharded", mesh, ["data", "model"], ["data"])


def test_a_batch_axis_inside_each_process_is_rejected_with_the_fix():
    mesh = devices(0, 0, 1, 1).reshape(2, 2)  # the batch axis, columns, crosses processes
    with pytest.raises(ValueError, match=r"'model': 2, 'data': 2.*several processes.*spans"):
        check_feedable("sharded", mesh, ["model", "data"], ["data"])


def test_processes_holding_unequal_parts_of_the_batch_axis_are_rejected():
    with pytest.raises(ValueError, match="different numbers of positions"):
        check_feedable("data-parallel", devices(0, 0, 0, 1), ["data"], ["data"])


@pytest.mark.parametrize(
    ("option", "match"),
    [({"agree_every": 0}, "agree_every=0: expected None .* or an int >= 1"),
     ({"agree_every": 1.5}, "agree_every=1.5"),
     ({"fault_timeout": 0}, "fault_timeout=0: expected a number of seconds > 0")],
)  # fmt: skip
def test_agreement_options_are_checked_with_one_process_too(option, match):
    with pytest.raises(ValueError, match=match):
        ciclo.loop(0, [1, 2], {}, **option)


@pytest.mark.parametrize("make", [ciclo.keras_bar, ciclo.tqdm_bar])
def test_output_process_must_be_an_index_or_none(make):
    with pytest.raises(TypeError, match=r"process=-1\): expected a process index >= 0, or None"):
        make(10, process=-1)


def test_one_process_writes_every_output():
    assert writes_here(0)
    assert writes_here(None)
    assert not writes_here(1)
    assert ciclo.keras_bar(10, process=1).finished  # another process draws it


def _agreed_loop_state(**exchanges) -> tuple[ciclo.LoopState, AgreedDecisions]:
    loop_state = ciclo.LoopState(None, ciclo.history(), ciclo.Elapsed.create())
    transport = SimpleNamespace(count=2, every=None, process=1, **exchanges)
    return loop_state, AgreedDecisions(transport, loop_state, [])


def test_a_requested_stop_is_only_a_request_until_agreed():
    loop_state, decisions = _agreed_loop_state()
    loop_state.stop_iteration = True
    loop_state.stop_reason = "early stop"
    assert not loop_state.stop_iteration  # the engine carries on to the agreement
    assert loop_state.stop_reason is None
    assert (decisions.requested, decisions.requested_reason) == (True, "early stop")
    assert decisions.requested_kind is ciclo.StopKind.CALLBACK
    loop_state.apply_stop("early stop (on process 1)", ciclo.StopKind.CALLBACK)
    assert loop_state.stop_iteration
    assert loop_state.stop_reason == "early stop (on process 1)"
    assert loop_state.stop_kind is ciclo.StopKind.CALLBACK


def test_a_stop_decided_alike_everywhere_is_not_exchanged():
    loop_state, decisions = _agreed_loop_state()
    loop_state.request_stop("patience ran out", same_everywhere=True)
    assert loop_state.stop_iteration
    assert loop_state.stop_reason == "patience ran out"
    assert not decisions.requested


def test_a_step_of_a_process_counts_the_samples_of_all():
    loop_state, _ = _agreed_loop_state()
    loop_state.batch = np.zeros((4, 3))
    after = loop_state.elapsed_after_step()
    assert (after.steps, after.samples) == (1, 8)
    assert after.time == loop_state.elapsed.time  # the agreed clock, not this process's


def test_process_0_spaces_the_rounds_by_what_its_last_round_took():
    records: list[dict] = []
    waits = iter([0.05, 0.003])  # the first round waits for everyone; then a slow read

    def read(number, what):
        time.sleep(next(waits))
        return [records[number], records[number]]

    _, decisions = _agreed_loop_state(post=lambda number, record: records.append(record), read=read)
    decisions.agreement.process = 0
    clock = SimpleNamespace(set_clock=lambda seconds, date: None)
    decisions._round(clock, 0)  # the first round's wait is not what a round costs
    assert decisions.round_seconds == 0.0
    decisions._round(clock, 1)
    assert 0.003 <= decisions.round_seconds < 0.05
    # 1 ms a step since the round before: rounds about 0.1 s apart after a fast round,
    # 200 times the round after a slow one, 0.5 s apart at most
    for took, every in [(0.0001, 100), (0.002, 400), (0.05, 500)]:
        decisions.last_round = (1000, time.time() - 1.0)
        decisions.round_seconds = took
        assert decisions._record(2000, ended=None)["every"] == pytest.approx(every, rel=0.02)
