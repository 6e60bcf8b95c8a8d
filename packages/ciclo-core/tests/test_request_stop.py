"""``loop_state.request_stop``: the one way to stop a loop, and ``stop_iteration = True``, its
alias (several processes: test_multihost_agreement.py)."""

from __future__ import annotations

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
