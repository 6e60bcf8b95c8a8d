"""Schedules fire once per boundary crossing, for steps, samples and time alike (DESIGN §3)."""

from __future__ import annotations

import itertools
import json
from contextlib import nullcontext

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ciclo

FAST = settings(max_examples=60, deadline=None)
# The fake clock is patched once per test; examples only ever move it forward.
FAST_WITH_CLOCK = settings(FAST, suppress_health_check=[HealthCheck.function_scoped_fixture])


def at_count(steps: int = 0, samples: int = 0, time: float = 0.0) -> ciclo.Elapsed:
    return ciclo.Elapsed(steps=steps, samples=samples, time=time, date=0.0)


def firings(schedule, counts, unit="samples"):
    """The counts (in ``unit``) at which ``schedule`` fired, calling it once per count."""
    return [c for c in counts if schedule(at_count(**{unit: c}))]


def first_reaching(counts, boundaries):
    """For each boundary, the first count that reaches it (the call that crosses it)."""
    return [next(c for c in counts if c >= b) for b in boundaries]


# --- every: steps, samples, time ------------------------------------------------------------


def test_every_steps_fires_on_multiples():
    assert firings(ciclo.every(3), range(11), unit="steps") == [0, 3, 6, 9]
    assert firings(ciclo.every(steps=1), range(4), unit="steps") == [0, 1, 2, 3]
    assert firings(ciclo.every(np.int64(3)), range(7), unit="steps") == [0, 3, 6]


@pytest.mark.parametrize(
    "schedule",
    [ciclo.every(5), ciclo.every(samples=7), ciclo.every(time=2.5)],
    ids=["steps", "samples", "time"],
)
def test_step_zero_fires_for_every_kind(schedule):
    # The documented rule in _schedules.py: boundaries are 0, n, 2n... and a fresh
    # schedule called exactly on one fires, so the very first step fires.
    assert schedule(at_count())


@pytest.mark.parametrize("unit", ["steps", "samples", "time"])
def test_a_fresh_schedule_first_called_between_boundaries_waits_for_the_next(unit):
    schedule = ciclo.every(**{unit: 10})
    assert not schedule(at_count(**{unit: 4}))
    assert not schedule(at_count(**{unit: 9}))
    assert schedule(at_count(**{unit: 10}))
    assert not schedule(at_count(**{unit: 12}))


@FAST
@given(period=st.integers(1, 16), data=st.data())
def test_every_samples_fires_exactly_once_per_multiple_crossed(period, data):
    sizes = data.draw(st.lists(st.integers(1, period), min_size=1, max_size=60))
    counts = list(itertools.accumulate(sizes, initial=0))

    fired = firings(ciclo.every(samples=period), counts)

    multiples = range(0, counts[-1] + 1, period)
    assert len(fired) == len(multiples)
    assert fired == first_reaching(counts, multiples)


@FAST
@given(period=st.integers(1, 16), data=st.data())
def test_every_samples_fires_once_per_call_that_crosses_a_boundary(period, data):
    # Batches up to 5 periods: one call may cross several multiples, and fires once.
    sizes = data.draw(st.lists(st.integers(1, 5 * period), min_size=1, max_size=40))
    counts = list(itertools.accumulate(sizes, initial=0))
    schedule = ciclo.every(samples=period)

    fired = [schedule(at_count(samples=c)) for c in counts]

    crossed = [c // period > p // period for p, c in itertools.pairwise(counts)]
    assert fired == [True, *crossed]


@FAST
@given(period_eighths=st.integers(1, 24), data=st.data())
def test_every_time_fires_exactly_once_per_multiple_crossed(period_eighths, data):
    # Times in eighths of a second are exact in binary floating point.
    period = period_eighths / 8
    ticks = data.draw(st.lists(st.integers(1, period_eighths), min_size=1, max_size=60))
    times = [t / 8 for t in itertools.accumulate(ticks, initial=0)]

    fired = firings(ciclo.every(time=period), times, unit="time")

    multiples = [k * period for k in range(int(times[-1] // period) + 1)]
    assert fired == first_reaching(times, multiples)


@FAST
@given(period=st.integers(1, 8), data=st.data())
def test_every_samples_in_a_loop_with_random_batch_sizes(period, data):
    sizes = data.draw(st.lists(st.integers(1, period), min_size=1, max_size=30))
    dataset = [np.zeros((size, 1), np.float32) for size in sizes]
    seen = []

    def record(state, batch, elapsed):
        seen.append(elapsed.samples)

    _, _, elapsed = ciclo.loop(None, dataset, {ciclo.every(samples=period): record})

    counts = list(itertools.accumulate(sizes[:-1], initial=0))  # what each step sees
    assert elapsed.samples == sum(sizes)
    assert seen == first_reaching(counts, range(0, counts[-1] + 1, period))


@FAST_WITH_CLOCK
@given(period_eighths=st.integers(1, 16), durations=st.lists(st.integers(1, 16), max_size=30))
def test_every_time_in_a_loop_with_a_controlled_clock(period_eighths, durations, clock):
    # Each step "takes" its duration on the fake clock; nothing sleeps.
    period = period_eighths / 8
    seen = []

    def work(state, batch, elapsed):
        clock.advance(durations[elapsed.steps] / 8)

    def record(state, batch, elapsed):
        seen.append(elapsed.time)

    # Issue 28: an empty dataset is a warning.
    empty = pytest.warns(RuntimeWarning, match="is empty") if not durations else nullcontext()
    with empty:
        _, _, elapsed = ciclo.loop(
            None, range(len(durations)), {ciclo.every(1): work, ciclo.every(time=period): record}
        )

    times = [t / 8 for t in itertools.accumulate(durations[:-1], initial=0)]
    assert elapsed.time == sum(durations) / 8
    if not durations:
        assert seen == []
        return
    boundaries = [k * period for k in range(int(times[-1] // period) + 1)]
    assert seen == sorted(set(first_reaching(times, boundaries)))


def test_time_schedule_with_controlled_elapsed_update():
    schedule = ciclo.every(time=1.0)
    elapsed = at_count()
    fired = []
    for t in (0.4, 0.9, 1.3, 1.9, 3.5, 3.6, 4.0):
        fired.append(schedule(elapsed))
        elapsed = elapsed.update(batch_size=1, time=t)
    fired.append(schedule(elapsed))
    # counts 0, .4, .9, 1.3, 1.9, 3.5, 3.6, 4.0: crossings at 0, 1 (1.3), 2 and 3 (3.5), 4
    assert fired == [True, False, False, True, False, True, False, True]


@pytest.mark.parametrize("unit", ["steps", "samples", "time"])
def test_a_schedule_reused_for_a_new_count_from_zero_starts_afresh(unit):
    # E.g. the same tasks drive an evaluation loop at the end of every epoch.
    schedule = ciclo.every(**{unit: 10})
    first_run = firings(schedule, range(0, 26, 2), unit=unit)
    second_run = firings(schedule, range(0, 26, 2), unit=unit)
    assert first_run == second_run == [0, 10, 20]
    # A count that goes back without reaching zero follows the same fresh rule.
    assert firings(schedule, [15, 18, 20], unit=unit) == [20]
    assert firings(schedule, [10, 12], unit=unit) == [10]


def test_a_schedule_called_twice_at_the_same_count_fires_once():
    schedule = ciclo.every(samples=4)
    assert firings(schedule, [0, 0, 3, 4, 4, 9, 9]) == [0, 4, 9]


# --- combinators ----------------------------------------------------------------------------


def test_invert():
    assert firings(~ciclo.every(3), range(10), unit="steps") == [1, 2, 4, 5, 7, 8]
    assert firings(~ciclo.never(), range(3), unit="steps") == [0, 1, 2]
    assert firings(~ciclo.always(), range(3), unit="steps") == []


@FAST
@given(period=st.integers(1, 10), sizes=st.lists(st.integers(1, 20), min_size=1, max_size=30))
def test_invert_fires_exactly_when_the_inner_schedule_does_not(period, sizes):
    counts = list(itertools.accumulate(sizes, initial=0))
    plain, inverted = ciclo.every(samples=period), ~ciclo.every(samples=period)
    for c in counts:
        assert inverted(at_count(samples=c)) is (not plain(at_count(samples=c)))


def test_invert_in_a_loop():
    seen = []
    ciclo.loop(None, range(7), {~ciclo.every(2): lambda s, b, e: seen.append(e.steps)})
    assert seen == [1, 3, 5]


def test_and_or():
    assert firings(ciclo.every(2) & ciclo.every(3), range(13), unit="steps") == [0, 6, 12]
    assert firings(ciclo.every(2) | ciclo.every(3), range(10), unit="steps") == [
        0,
        2,
        3,
        4,
        6,
        8,
        9,
    ]
    assert firings(ciclo.every(2) & ~ciclo.every(4), range(9), unit="steps") == [2, 6]


def test_combinators_evaluate_both_sides():
    calls = []

    def spy(elapsed):
        calls.append(elapsed.steps)
        return True

    assert not (ciclo.never() & spy)(at_count(steps=1))
    assert (ciclo.always() | spy)(at_count(steps=2))
    assert not (spy & ciclo.never())(at_count(steps=3))
    assert (spy | ciclo.always())(at_count(steps=4))
    assert calls == [1, 2, 3, 4]


def test_a_stateful_schedule_behind_a_false_and_stays_in_step():
    inner = ciclo.every(samples=10)
    gated = ciclo.never() & inner
    for samples in (0, 4, 8, 12, 16, 20, 24):
        gated(at_count(samples=samples))
    assert inner.state_dict() == {"last": 24}
    # Un-gated now, it fires at the next crossing (30), not at once.
    assert not inner(at_count(samples=28))
    assert inner(at_count(samples=32))


def test_plain_callables_combine_on_either_side():
    def odd(elapsed):
        return elapsed.steps % 2 == 1

    assert firings(odd & ciclo.every(3), range(10), unit="steps") == [3, 9]
    assert firings(ciclo.every(3) | odd, range(7), unit="steps") == [0, 1, 3, 5, 6]


# --- after, piecewise, always, never --------------------------------------------------------


def test_after():
    assert firings(ciclo.after(3), range(6), unit="steps") == [3, 4, 5]
    assert firings(ciclo.after(samples=10), [0, 6, 12, 18], unit="samples") == [12, 18]
    assert firings(ciclo.after(0), range(2), unit="steps") == [0, 1]


def test_after_every():
    assert firings(ciclo.after(10).every(5), range(30), unit="steps") == [10, 15, 20, 25]
    counts = list(range(0, 40, 3))  # batches of 3 samples
    fired = firings(ciclo.after(samples=10).every(samples=4), counts)
    assert fired == first_reaching(counts, range(10, counts[-1] + 1, 4))


def test_piecewise():
    schedule = ciclo.piecewise({0: ciclo.every(1), 3: ciclo.every(2)})
    assert firings(schedule, range(8), unit="steps") == [0, 1, 2, 4, 6]
    by_samples = ciclo.piecewise({0: ciclo.never(), ciclo.at(samples=20): ciclo.always()})
    assert firings(by_samples, [0, 8, 16, 24, 32]) == [24, 32]
    # Before the first start nothing fires.
    late = ciclo.piecewise({5: ciclo.always()})
    assert firings(late, range(7), unit="steps") == [5, 6]


def test_always_never():
    assert firings(ciclo.always(), range(3), unit="steps") == [0, 1, 2]
    assert firings(ciclo.never(), range(3), unit="steps") == []


# --- resuming -------------------------------------------------------------------------------


def _resumable_schedules(p: int, q: int):
    return [
        ciclo.every(samples=p),
        ciclo.every(samples=p) | ciclo.every(3),
        (ciclo.every(samples=p) & ~ciclo.every(samples=q)) | ciclo.after(40),
        ciclo.after(samples=q).every(samples=p),
        ciclo.piecewise({0: ciclo.every(samples=q), ciclo.at(samples=30): ciclo.every(samples=p)}),
    ]


@FAST
@given(
    p=st.integers(1, 12),
    q=st.integers(1, 12),
    sizes=st.lists(st.integers(1, 15), min_size=2, max_size=40),
    data=st.data(),
)
def test_state_dict_round_trip_fires_like_an_uninterrupted_run(p, q, sizes, data):
    split = data.draw(st.integers(1, len(sizes) - 1))
    counts = list(itertools.accumulate(sizes, initial=0))
    calls = [at_count(steps=i, samples=c) for i, c in enumerate(counts)]
    for index, uninterrupted in enumerate(_resumable_schedules(p, q)):
        expected = [uninterrupted(e) for e in calls]

        first = _resumable_schedules(p, q)[index]
        before = [first(e) for e in calls[:split]]
        saved = json.loads(json.dumps(first.state_dict()))  # plain Python values
        resumed = _resumable_schedules(p, q)[index]
        resumed.load_state_dict(saved)
        after = [resumed(e) for e in calls[split:]]

        assert before + after == expected, uninterrupted
