"""The engine's plan of the tasks (``_loop/_plan.py``): skipping the schedules that cannot
fire gives exactly the steps, callbacks and order of asking every schedule at every step,
and a schedule the plan skipped is caught up before its state is read."""

from __future__ import annotations

import numpy as np
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
    return st.one_of(every_steps, every_samples, after, after_samples, constant, asked)


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


def test_every_1_is_not_asked_once_planned():
    calls = []

    class Counting(ciclo.Schedule):
        def __init__(self):
            self.inner = ciclo.every(1)

        def __call__(self, elapsed):
            calls.append(elapsed.steps)
            return self.inner(elapsed)

        def next_due(self, elapsed):
            return self.inner.next_due(elapsed)

    ran = []
    ciclo.loop(None, range(10), {Counting(): lambda state, batch: ran.append(batch)})
    assert ran == list(range(10))
    assert calls == [0]  # asked at the first step, then known to fire at every step


def test_a_planned_every_n_is_asked_only_when_due():
    calls = []

    class Counting(ciclo.Schedule):
        def __init__(self):
            self.inner = ciclo.every(4)

        def __call__(self, elapsed):
            calls.append(elapsed.steps)
            return self.inner(elapsed)

        def next_due(self, elapsed):
            return self.inner.next_due(elapsed)

    ciclo.loop(None, range(10), {ciclo.every(1): lambda: None, Counting(): lambda: None})
    assert calls == [0, 4, 8]


def test_skipped_schedules_are_caught_up_before_a_checkpoint_reads_them():
    seen = {}
    every_3 = ciclo.every(3)

    def look(state, batch, elapsed, loop_state):
        loop_state.at_step_end(lambda ls: seen.setdefault(ls.elapsed.steps, every_3.state_dict()))

    ciclo.loop(None, range(8), {ciclo.every(1): look, every_3: lambda: None})
    # at the end of step k, every(3) remembers step k as if it had been asked there
    assert {steps: state["last"] for steps, state in seen.items()} == {k + 1: k for k in range(8)}


def test_the_same_tasks_run_a_second_loop_from_zero():
    # every(1) remembers the last count it saw (caught up at the loop's end), so a second
    # loop over the same tasks, counting from 0 again, fires from its first step
    ran = []
    tasks = {ciclo.every(1): lambda state, batch: ran.append(batch)}
    ciclo.loop(None, range(3), tasks)
    ciclo.loop(None, range(3), tasks)
    assert ran == [0, 1, 2, 0, 1, 2]
