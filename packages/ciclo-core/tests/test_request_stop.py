"""``loop_state.request_stop``: the one way to stop a loop, and ``stop_iteration = True``, its
alias (several processes: test_multihost_agreement.py)."""

from __future__ import annotations

import json

import pytest

import ciclo


def _stop_at(step, how):
    def callback(state, batch, elapsed, loop_state):
        if elapsed.steps == step:
            how(loop_state)

    return callback


@pytest.mark.parametrize(
    ("how", "reason"),
    [
        (lambda ls: ls.request_stop("enough"), "enough"),
        (lambda ls: ls.request_stop("decided alike", same_everywhere=True), "decided alike"),
        (lambda ls: setattr(ls, "stop_iteration", True), None),
    ],
    ids=["request_stop", "same_everywhere", "stop_iteration-alias"],
)
def test_a_stop_ends_the_loop_after_the_step(how, reason):
    reasons = []
    _, _, elapsed = ciclo.loop(
        0,
        range(10),
        {ciclo.every(1): _stop_at(3, how)},
        on_end=lambda state, batch, elapsed, loop_state: reasons.append(loop_state.stop_reason),
    )
    assert elapsed.steps == 4  # step 3 ran to its end, nothing after it
    assert reasons == [reason]


def test_the_callbacks_after_the_one_that_stops_still_run_that_step():
    ran = []
    stop = _stop_at(2, lambda ls: ls.request_stop("stop"))
    ciclo.loop(0, range(10), {ciclo.every(1): [stop, lambda state, batch: ran.append(batch)]})
    assert ran == [0, 1, 2]


def test_a_reason_set_after_the_alias_is_kept():
    def stop(state, batch, elapsed, loop_state):
        loop_state.stop_iteration = True
        loop_state.stop_reason = "set afterwards"

    seen = []
    ciclo.loop(
        0, range(5), {ciclo.every(1): stop}, on_end=lambda s, b, e, ls: seen.append(ls.stop_reason)
    )
    assert seen == ["set afterwards"]


@pytest.mark.parametrize(
    ("kind", "finished"),
    [
        (ciclo.StopKind.CALLBACK, True),
        (ciclo.StopKind.EARLY_STOPPING, True),
        ("nan", True),  # a kind's value is the kind
        (ciclo.StopKind.INTERRUPTED, False),
        (ciclo.StopKind.ROLLBACK, False),
    ],
)
def test_the_kind_not_the_text_decides_whether_a_resumed_run_stays_finished(
    tmp_path, kind, finished
):
    def stop(state, batch, elapsed, loop_state):
        if elapsed.steps == 1:  # a text that once meant other kinds: only `kind` counts
            loop_state.request_stop("early_stopping: stopped by SIGTERM", kind=kind)
        return state + 1

    ckpt = ciclo.checkpoint(tmp_path, async_save=False)
    seen = []
    tasks = {ciclo.every(1): stop, ciclo.every(100): ckpt}
    on_end = lambda s, b, e, loop_state: seen.append(loop_state.stop_kind)  # noqa: E731
    ciclo.loop(0, range(4), tasks, resume=ckpt, on_end=on_end)
    assert seen == [kind]
    ended = json.loads((tmp_path / "2" / "meta" / "metadata").read_text())["end"]
    assert ended == (
        {"reason": str(kind), "step": 2, "message": "early_stopping: stopped by SIGTERM"}
        if finished
        else None
    )
    state, _, elapsed = ciclo.loop(
        0, range(4), {ciclo.every(1): lambda s: s + 1, ciclo.every(100): ckpt}, resume=ckpt
    )
    assert (elapsed.steps, state) == ((2, 2) if finished else (4, 4))


def test_a_bad_kind_is_named_with_the_kinds_to_choose_from():
    loop_state = ciclo.LoopState(None, ciclo.history(), ciclo.Elapsed.create())
    with pytest.raises(
        ValueError,
        match=r"request_stop\(kind='done'\): expected a ciclo.StopKind, one of \['callback', ",
    ):
        loop_state.request_stop("enough", kind="done")
    assert not loop_state.stop_iteration


def test_a_stop_without_a_reason_keeps_the_reason_and_kind_of_the_stop_made():
    loop_state = ciclo.LoopState(None, ciclo.history(), ciclo.Elapsed.create())
    assert loop_state.stop_kind is None  # while the loop runs
    loop_state.request_stop("stopped by SIGINT", kind=ciclo.StopKind.INTERRUPTED)
    loop_state.stop_iteration = True
    assert (loop_state.stop_reason, loop_state.stop_kind) == ("stopped by SIGINT", "interrupted")
    loop_state.stop_iteration = False
    assert (loop_state.stop_reason, loop_state.stop_kind) == (None, None)
