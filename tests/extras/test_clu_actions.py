"""clu periodic actions in a loop's tasks are called as clu expects: ``action(step, t)``."""

from __future__ import annotations

import numpy as np
import pytest

import ciclo

periodic_actions = pytest.importorskip("clu.periodic_actions")


class Record(periodic_actions.PeriodicAction):
    """Remembers the steps at which it triggered, and every call."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.applied: list[tuple[int, float]] = []

    def _apply(self, step, t):
        self.applied.append((step, t))


def test_a_clu_action_is_called_with_the_step_and_the_time():
    action = Record(every_steps=2)
    state, _, _ = ciclo.loop(0, [np.ones(2)] * 6, {ciclo.every(1): [lambda s: s + 1, action]})
    assert state == 6
    assert [step for step, _ in action.applied] == [2, 4, 6]  # the steps done
    times = [t for _, t in action.applied]
    assert times == sorted(times)
    assert all(isinstance(t, float) for t in times)


def test_report_progress_runs_in_a_loop():
    report = periodic_actions.ReportProgress(num_train_steps=4, every_steps=2)
    ciclo.loop(None, [np.ones(2)] * 4, {ciclo.every(1): report})
    assert report._last_step == 4  # called at every step, as clu requires
