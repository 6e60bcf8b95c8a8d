"""The engine's plan of the tasks (``_loop/_plan.py``): skipping the schedules that cannot
fire gives exactly the steps, callbacks and order of asking every schedule at every step,
and a schedule the plan skipped is caught up before its state is read."""

from __future__ import annotations

import itertools
import types

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ciclo


def _schedules():
    every_steps = st.integers(1, 7).map(lambda n: ciclo.every(n))
    every_samples = st.integers(1, 40).map(lambda n: ciclo.every(samples=n))
    after = st.tuples(st.integers(0, 12), st.integers(1, 5)).map(
        lambda a: ciclo.after(a[0]).every(a[1])
    )
    after_samples = st.integers(0, 60).map(lambda n: ciclo.after(samples=n))
    constant = st.sampled_from([ciclo.always, ciclo.never]).map(lambda make: make())
    asked = st.integers(1, 5).map(lambda n: lambda e, n=n: e.steps % n == 1)  # not planned
    every_1 = st.just(None).map(lambda _: ciclo.every(1))
    return _with_combinations(
        st.one_of(every_steps, every_samples, after, after_samples, constant, asked, every_1)
    )


def _with_combinations(schedules):
    """``schedules``, and ``&`` and ``|`` of two (planned when both parts are)."""
    pairs = st.tuples(schedules, schedules, st.booleans()).map(
        lambda a: (
            ciclo._time._schedules.as_schedule(a[0]) | a[1]
            if a[2]
            else ciclo._time._schedules.as_schedule(a[0]) & a[1]
        )
    )
    return st.one_of(schedules, pairs)


def _fired_by_asking(make_schedules, sizes):
    """Every schedule asked at every step, by hand: the rule the plan must keep."""
    schedules = [ciclo._time._schedules.as_schedule(s) for s in make_schedules()]
    fired = []
    for elapsed, _ in ciclo.elapse([np.zeros((n, 1)) for n in sizes]):
        fired.append([i for i, s in enumerate(schedules) if s(elapsed)])
    return fired


@settings(max_examples=60, deadline=None)
@given(
    st.lists(_schedules(), min_size=1, max_size=5),
    st.lists(st.integers(1, 9), min_size=1, max_size=40),
    st.integers(0, 1_000_000),
)
def test_the_plan_fires_what_asking_every_schedule_fires(schedules, sizes, seed):
    import copy

    def make():
        return copy.deepcopy(schedules)

    fired = []

    def recorder(i):
        def record(state, batch, elapsed):
            if not fired or fired[-1][0] != elapsed.steps:
                fired.append((elapsed.steps, []))
            fired[-1][1].append(i)

        return record

    tasks = {schedule: recorder(i) for i, schedule in enumerate(make())}
    ciclo.loop(None, [np.zeros((n, 1)) for n in sizes], tasks)
    expected = _fired_by_asking(make, sizes)
    got = {step: indices for step, indices in fired}
    assert [got.get(step, []) for step in range(len(sizes))] == expected


def _time_schedules():
    every = st.sampled_from([0.03, 0.05, 0.1, 0.25]).map(lambda t: ciclo.every(time=t))
    after = st.sampled_from([0.0, 0.1, 0.4]).map(lambda t: ciclo.after(time=t))
    after_every = st.tuples(st.sampled_from([0.05, 0.3]), st.sampled_from([0.04, 0.2])).map(
        lambda a: ciclo.after(time=a[0]).every(time=a[1])
    )
    return _with_combinations(st.one_of(every, after, after_every, _schedules()))


class _Clocked:
    """Batches that set a fake clock as each is drawn: ``elapse`` then counts the times
    given, the same in every loop over them."""

    def __init__(self, clock, sizes, seconds):
        self.clock, self.sizes, self.seconds = clock, sizes, seconds

    def __iter__(self):
        for size, now in zip(self.sizes, itertools.accumulate(self.seconds), strict=True):
            self.clock[0] = now
            yield np.zeros((size, 1))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(_time_schedules(), min_size=1, max_size=5),
    st.lists(st.tuples(st.integers(1, 9), st.floats(0.0, 0.08)), min_size=1, max_size=40),
)
def test_planned_time_schedules_fire_what_asking_at_every_step_fires(schedules, batches):
    import copy

    from ciclo._time import _elapsed

    clock = [0.0]
    sizes, seconds = zip(*batches, strict=True)
    fake_time = types.SimpleNamespace(time=lambda: clock[0])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_elapsed, "_time", fake_time)
        clock[0] = 0.0
        asked = [ciclo._time._schedules.as_schedule(s) for s in copy.deepcopy(schedules)]
        expected = [
            [i for i, s in enumerate(asked) if s(elapsed)]
            for elapsed, _ in ciclo.elapse(_Clocked(clock, sizes, seconds))
        ]
        clock[0], fired = 0.0, [[] for _ in sizes]

        def record(i):
            return lambda state, batch, elapsed: fired[elapsed.steps].append(i)

        tasks = {s: record(i) for i, s in enumerate(copy.deepcopy(schedules))}
        ciclo.loop(None, _Clocked(clock, sizes, seconds), tasks)
    assert fired == expected


class _Counting(ciclo.Schedule):
    """``inner``, noting in ``calls`` each step at which the loop asks it."""

    def __init__(self, inner, calls):
        self.inner, self.calls = inner, calls

    def __call__(self, elapsed):
        self.calls.append(elapsed.steps)
        return self.inner(elapsed)

    def next_due(self, elapsed):
        return self.inner.next_due(elapsed)


def test_a_time_schedule_is_asked_only_when_its_time_is_due(monkeypatch):
    from ciclo._time import _elapsed

    calls, clock = [], [0.0]
    monkeypatch.setattr(_elapsed, "_time", types.SimpleNamespace(time=lambda: clock[0]))

    ran = []
    clocked = _Clocked(clock, [1] * 10, [0.4] * 10)  # steps 0-9 counted at 0, 0.4, ... 3.6 s
    ciclo.loop(
        None,
        clocked,
        {
            ciclo.every(1): lambda: None,
            _Counting(ciclo.every(time=1.0), calls): lambda state, batch, e: ran.append(e),
        },
    )
    assert calls == [0, 3, 5, 8]  # at 0 s, then the first step at or past 1, 2 and 3 s
    assert [round(e.time, 6) for e in ran] == [0.0, 1.2, 2.0, 3.2]


def test_every_1_is_not_asked_once_planned():
    calls = []

    ran = []
    ciclo.loop(
        None, range(10), {_Counting(ciclo.every(1), calls): lambda state, batch: ran.append(batch)}
    )
    assert ran == list(range(10))
    assert calls == [0]  # asked at the first step, then known to fire at every step


def test_a_planned_every_n_is_asked_only_when_due():
    calls = []

    ciclo.loop(
        None,
        range(10),
        {ciclo.every(1): lambda: None, _Counting(ciclo.every(4), calls): lambda: None},
    )
    assert calls == [0, 4, 8]


def test_skipped_schedules_are_caught_up_before_a_checkpoint_reads_them():
    seen = {}
    every_3, combined = ciclo.every(3), ciclo.every(4) | ciclo.every(samples=5)

    def look(state, batch, elapsed, loop_state):
        def keep(ls):
            seen[ls.elapsed.steps] = [every_3.state_dict(), *combined.state_dict()["children"]]

        loop_state.at_step_end(keep)

    tasks = {ciclo.every(1): look, every_3: lambda: None, combined: lambda: None}
    ciclo.loop(None, [np.zeros((2, 1))] * 8, tasks)
    # at the end of step k, each schedule (each part of `|`) remembers step k's count as if
    # it had been asked there
    remembered = {steps: [state["last"] for state in states] for steps, states in seen.items()}
    assert remembered == {k + 1: [k, k, 2 * k] for k in range(8)}


def test_the_same_tasks_run_a_second_loop_from_zero():
    # every(1) remembers the last count it saw (caught up at the loop's end), so a second
    # loop over the same tasks, counting from 0 again, fires from its first step
    ran = []
    tasks = {ciclo.every(1): lambda state, batch: ran.append(batch)}
    ciclo.loop(None, range(3), tasks)
    ciclo.loop(None, range(3), tasks)
    assert ran == [0, 1, 2, 0, 1, 2]
