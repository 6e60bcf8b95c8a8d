"""Time tracking: Elapsed, Period / at, and the elapse iterator."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import ciclo


def test_elapsed_update_counts_steps_samples_and_time(clock):
    start = ciclo.Elapsed.create()
    assert (start.steps, start.samples, start.time, start.date) == (0, 0, 0.0, clock.now)
    clock.advance(1.5)
    after = start.update(batch_size=32)
    assert (after.steps, after.samples, after.time, after.date) == (1, 32, 1.5, clock.now)
    assert after.update(8, time=10.0).time == 10.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        after.steps = 3  # type: ignore[misc]


def test_at_and_comparisons():
    elapsed = ciclo.Elapsed(steps=10, samples=320, time=5.0, date=0.0)
    assert ciclo.at(5) == ciclo.Period(steps=5)
    assert elapsed >= ciclo.at(10)
    assert elapsed < ciclo.at(11)
    assert not elapsed >= ciclo.at(samples=321)
    # Any of the given fields suffices.
    assert elapsed >= ciclo.at(11, samples=320)
    assert elapsed >= ciclo.at(samples=10_000, time=5.0)
    assert elapsed < ciclo.at(samples=10_000, time=5.5)
    assert ciclo.at(samples=60_000, time=3600).fields() == {"samples": 60_000, "time": 3600}
    assert ciclo.at(0).reached_by(ciclo.Elapsed.create())


def test_elapse_yields_the_count_before_each_batch():
    batches = [np.zeros((size, 2)) for size in (4, 4, 3)]
    seen = [(e.steps, e.samples, b.shape[0]) for e, b in ciclo.elapse(batches)]
    assert seen == [(0, 0, 4), (1, 4, 4), (2, 8, 3)]


def test_elapse_count_after_iteration_and_finish():
    steps = ciclo.elapse([np.zeros((4, 2))] * 5)
    for _ in steps:
        pass
    assert (steps.elapsed.steps, steps.elapsed.samples) == (5, 20)
    assert steps.finish() == steps.elapsed

    # Breaking out leaves the last batch uncounted until finish().
    steps = ciclo.elapse([np.zeros((4, 2))] * 5)
    for elapsed, _ in steps:
        if elapsed.steps == 2:
            break
    assert steps.elapsed.steps == 2
    assert steps.finish().steps == 3
    assert steps.finish().steps == 3  # idempotent


def test_elapse_checks_stop_before_drawing_a_batch():
    drawn = []

    def dataset():
        for i in range(100):
            drawn.append(i)
            yield np.zeros((4, 1))

    steps = ciclo.elapse(dataset(), stop=3)
    assert [e.steps for e, _ in steps] == [0, 1, 2]
    assert drawn == [0, 1, 2]
    assert steps.elapsed.steps == 3

    drawn.clear()
    steps = ciclo.elapse(dataset(), stop=ciclo.at(samples=10))
    assert [e.samples for e, _ in steps] == [0, 4, 8]
    assert len(drawn) == 3
    assert steps.elapsed.samples == 12


def test_elapse_stop_zero_draws_nothing():
    def dataset():
        raise AssertionError("no batch should be drawn")
        yield

    assert list(ciclo.elapse(dataset(), stop=0)) == []


def test_elapse_continues_from_initial(clock):
    initial = ciclo.Elapsed(steps=5, samples=20, time=7.0, date=clock.now - 1000.0)
    clock.advance(100.0)  # a pause between runs is not loop time
    steps = ciclo.elapse([np.zeros((4, 1))] * 3, initial=initial, stop=7)
    first, _ = next(steps)
    assert (first.steps, first.samples, first.time, first.date) == (5, 20, 7.0, clock.now)
    clock.advance(0.5)
    second, _ = next(steps)
    assert (second.steps, second.samples, second.time) == (6, 24, 7.5)
    assert list(steps) == []
    assert steps.elapsed.steps == 7


def test_batch_sizes():
    dict_batches = [{"label": np.zeros(3), "image": np.zeros((3, 8, 8))}]
    assert [e.samples for e, _ in ciclo.elapse(dict_batches * 2)] == [0, 3]
    # No array leaf: one sample per batch.
    assert [e.samples for e, _ in ciclo.elapse(range(3))] == [0, 1, 2]
    custom = ciclo.elapse(["abc", "de"], batch_size_fn=len)
    assert [e.samples for e, _ in custom] == [0, 3]
    assert custom.elapsed.samples == 5


def test_numpy_scalars_are_numbers():
    # Periods and stops often come out of NumPy arithmetic (len(x) // batch_size * epochs).
    assert ciclo.at(np.int64(5)) == ciclo.at(5)
    assert type(ciclo.at(np.int64(5)).steps) is int
    assert ciclo.at(time=np.float32(0.5)) == ciclo.at(time=0.5)
    assert [e.steps for e, _ in ciclo.elapse(range(10), stop=np.int32(3))] == [0, 1, 2]
    with pytest.raises(TypeError, match=r"stop must be an int .*got (np\.True_|True) \("):
        ciclo.elapse(range(10), stop=np.bool_(True))
