"""train_loop's epoch clock plans when all its periods are in steps or passes: the loop asks
it only at the steps where something can happen (a pass's end wakes it), and everything fires
at the steps it fires at when the clock is asked at every step."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import ciclo
from ciclo._loops import _clock

BATCHES = [np.full((2, 1), float(i), np.float32) for i in range(24)]


@jax.jit
def train_step(state, batch):
    return ciclo.logs().add_loss("loss", state.sum()), state * 0.5 + batch.mean()


@jax.jit
def eval_step(state, batch):
    return ciclo.logs().add_metric("score", (state * batch.mean()).sum())


def passes_of(*lengths):
    """A function giving passes of these lengths, one per call, with no ``len()``."""
    calls = iter(lengths)
    return lambda: (batch for batch in BATCHES[: next(calls)])


def events(directory=None, stop=None, resume=False, dataset=BATCHES, step=train_step, **options):
    """What fired at which step, and how many steps the clock decided."""
    seen: list[tuple[str, int]] = []
    decided: list[int] = []
    decide = _clock.EpochClock.decide

    def counting(self, elapsed):
        if elapsed is not self._step:
            decided.append(elapsed.steps)
        decide(self, elapsed)

    def note(name):
        return lambda state, batch, elapsed: seen.append((name, elapsed.steps))

    tasks = {
        ciclo.on_train_step: step,
        ciclo.on_test_step: eval_step,
        ciclo.on_epoch_begin: note("begin"),
        ciclo.on_epoch_end: note("end"),
    }
    if directory is not None:
        tasks[ciclo.every(7)] = ciclo.checkpoint(directory, async_save=False)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_clock.EpochClock, "decide", counting)
        _, history, elapsed = ciclo.train_loop(
            np.zeros(1, np.float32),
            dataset,
            tasks,
            test_dataset={"a": lambda: BATCHES[:1], "b": lambda: BATCHES[:2]},
            stop=stop,
            resume=directory if resume else None,
            **options,
        )
    scores = {k: history.collect("steps", f"score_{k}")[0] for k in ("a", "b")}
    return seen, scores, elapsed.steps, decided


def asked_at_every_step(monkeypatch):
    monkeypatch.setattr(_clock.EpochClock, "next_due", lambda self: None)


@pytest.mark.parametrize(
    ("options", "epoch", "test"),
    [
        ({"epoch_duration": 5}, 5, None),
        ({"epochs": 2}, 24, None),
        ({"epoch_duration": 6, "test_every": {"a": 4, "b": None}}, 6, 4),
        ({"test_every": 7}, None, 7),
    ],
    ids=["epoch_duration", "epochs", "test_every_per_set", "no_epochs"],
)
def test_a_planned_clock_fires_where_an_asked_one_does(monkeypatch, options, epoch, test):
    planned = events(**options)
    asked_at_every_step(monkeypatch)
    asked = events(**options)
    assert planned[:3] == asked[:3]
    assert planned[0]  # something fired
    assert any(planned[1].values())
    steps = asked[2]
    assert asked[3] == list(range(steps))  # asked: a decision at every step
    # Planned: the first step, the step whose count after it reaches each boundary, and
    # the step after an epoch's end (it begins the next).
    ends = set(range(epoch, steps + 1, epoch)) if epoch else set()
    tests = set(range(test, steps + 1, test)) if test else set()
    expected = {0} | {b - 1 for b in ends | tests} | {b for b in ends if b < steps}
    assert planned[3] == sorted(expected)


@pytest.mark.parametrize("test", [None, 4], ids=["tests_follow_passes", "a_test_every_4"])
def test_passes_of_unknown_length_wake_the_planned_clock_where_they_end(monkeypatch, test):
    lengths = (5, 1, 3, 7)  # a pass of one batch both begins and ends an epoch
    every = {"a": test, "b": None}
    planned = events(dataset=passes_of(*lengths), epochs=4, test_every=every)
    asked_at_every_step(monkeypatch)
    asked = events(dataset=passes_of(*lengths), epochs=4, test_every=every)
    assert planned[:3] == asked[:3]
    ends = [4, 5, 8, 15]  # each pass's last step
    assert [s for name, s in planned[0] if name == "end"] == ends
    assert [s for name, s in planned[0] if name == "begin"] == [0, 5, 6, 9]
    assert asked[3] == list(range(16))
    # Planned: the first step, each pass's last step (woken), the step after it (it begins
    # the next pass) and the step whose count after it reaches a multiple of 4.
    fours = {b - 1 for b in range(4, 17, 4)} if test else set()
    assert planned[3] == sorted({0} | set(ends) | {e + 1 for e in ends[:-1]} | fours)


def test_a_fused_step_ends_its_groups_where_the_passes_end():
    """The groups of a fused step end at each pass's last step, as woken: the epoch ends
    and the evaluations after them see the state of that step."""
    fused = ciclo.fuse_steps(train_step, 4)
    planned = events(dataset=passes_of(5, 3, 7), epochs=3, step=fused)
    unfused = events(dataset=passes_of(5, 3, 7), epochs=3)
    assert planned[:3] == unfused[:3]
    assert planned[1]["a"] == [4, 7, 14]


def test_periods_in_samples_are_asked_at_every_step():
    seen, scores, steps, decided = events(epoch_duration=ciclo.at(samples=10))
    assert len(decided) == steps
    assert [s for name, s in seen if name == "end"] == [4, 9, 14, 19]
    assert scores["a"] == [4, 9, 14, 19]


def test_a_resume_mid_epoch_continues_the_planned_clock_as_the_uninterrupted_run(tmp_path):
    whole = events(tmp_path / "whole", epoch_duration=5, test_every={"a": 3, "b": None})
    first = events(tmp_path / "cut", stop=16, epoch_duration=5, test_every={"a": 3, "b": None})
    second = events(tmp_path / "cut", resume=True, epoch_duration=5, test_every={"a": 3, "b": None})
    assert first[0] + second[0] == whole[0]  # the events from step 14 (checkpoint) on
    assert second[1] == whole[1]  # the resumed history holds the first part's rows
    assert second[2] == whole[2] == 24
