"""The plan of a loop's tasks: which schedules must be asked at a step, and which answer
is already known.

A schedule that can say when it fires next (:meth:`ciclo.Schedule.next_due`: step, sample
and time schedules, ``always``, ``never``, ``&`` and ``|`` of those) is asked only once its
count is due; one that fires at every step (``every(1)``) is not asked at all. So a step
where nothing but the step function fires costs one comparison: :attr:`TaskPlan.next_steps`,
:attr:`TaskPlan.next_samples` and :attr:`TaskPlan.next_time` against the count, then
:attr:`TaskPlan.steady`. Other schedules (functions, ``~``) are asked at every step, in
order, each after the callbacks of the tasks before it ran.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

from .._time._elapsed import Elapsed
from .._time._schedules import NOT_AGAIN, Due, Schedule
from ._callback import Callback

__all__ = ["TaskPlan"]

_ASK, _PLANNED, _EVERY_STEP = 0, 1, 2
_NOW = Due(-math.inf, -math.inf, False, -math.inf)  # ask at the next step


class _Task:
    __slots__ = ("callbacks", "due", "mode", "schedule")

    def __init__(self, schedule: Schedule, callbacks: list[Callback], mode: int) -> None:
        self.schedule, self.callbacks, self.mode, self.due = schedule, callbacks, mode, _NOW


class TaskPlan:
    """Which callbacks fire at each step of one loop (see the module docstring).

    Example:
        >>> import ciclo
        >>> from ciclo._loop._callback import Callback
        >>> hello, bye = Callback(lambda: None), Callback(lambda: None)
        >>> plan = TaskPlan([(ciclo.every(1), [hello]), (ciclo.every(3), [bye])])
        >>> count = lambda n: ciclo.Elapsed(steps=n, samples=n, time=0.0, date=0.0)
        >>> [len(list(plan.fired(count(n)))) for n in range(5)]
        [2, 1, 1, 2, 1]
    """

    __slots__ = ("next_samples", "next_steps", "next_time", "steady", "tasks")

    def __init__(self, tasks: Sequence[tuple[Schedule, list[Callback]]]) -> None:
        schedules = [schedule for schedule, _ in tasks]
        shared = {id(s) for s in schedules if sum(s is other for other in schedules) > 1}
        # A schedule in two tasks is asked twice a step, and may answer differently: ask it.
        self.tasks = [
            _Task(schedule, callbacks, _ASK if id(schedule) in shared else _PLANNED)
            for schedule, callbacks in tasks
        ]
        #: No planned schedule fires before the count reaches these (-inf: ask this step).
        self.next_steps: float = -math.inf
        self.next_samples: float = -math.inf
        self.next_time: float = -math.inf
        #: The callbacks of the schedules that fire at every step, in order.
        self.steady: list[Callback] = []

    def fired(self, elapsed: Elapsed) -> Iterator[Callback]:
        """The callbacks that fire at ``elapsed``, in order; each schedule is asked only when
        the iteration reaches it, so the callbacks before it have run."""
        for task in self.tasks:
            mode = task.mode
            if mode == _EVERY_STEP:
                yield from task.callbacks
            elif mode == _PLANNED:
                due, now = task.due, elapsed
                if now.steps >= due.steps or now.samples >= due.samples or now.time >= due.time:
                    fires = task.schedule(elapsed)
                    self._plan(task, elapsed)
                    if fires:
                        yield from task.callbacks
            elif task.schedule(elapsed):
                yield from task.callbacks
        self._replan()

    def _plan(self, task: _Task, elapsed: Elapsed) -> None:
        due = task.schedule.next_due(elapsed)
        if due is None:
            task.mode = _ASK
        elif due.every_step:
            task.mode = _EVERY_STEP
        else:
            task.due = due

    def _replan(self) -> None:
        if any(task.mode == _ASK for task in self.tasks):
            self.next_steps = self.next_samples = self.next_time = -math.inf
            return
        planned = [NOT_AGAIN, *(task.due for task in self.tasks if task.mode == _PLANNED)]
        self.next_steps, self.next_samples, _, self.next_time = map(min, zip(*planned, strict=True))
        self.steady = [c for task in self.tasks if task.mode == _EVERY_STEP for c in task.callbacks]

    def wake(self) -> None:
        """Asks every schedule at the next step (an event no count foretells: a pass's end)."""
        for task in self.tasks:
            task.due = _NOW
        self.next_steps = -math.inf

    def catch_up(self, elapsed: Elapsed) -> None:
        """Tells the schedules the plan did not ask that the loop went past ``elapsed``
        (before their state is read: a checkpoint, the loop's end)."""
        for task in self.tasks:
            if task.mode != _ASK:
                task.schedule.passed(elapsed)
