"""The epoch clock of ``train_loop``: which training steps begin an epoch, which end one,
and after which ones each evaluation set is evaluated."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from .._loop._state import LoopState
from .._time._elapsed import Elapsed
from .._time._schedules import Due, Schedule, every
from ._epochs import PassEnds
from ._registry import Hook

__all__ = ["EpochClock"]


def _every(period: tuple[str, float] | None) -> Schedule | None:
    return None if period is None else every(**{period[0]: period[1]})  # type: ignore[arg-type]


class EpochClock:
    """Decides, once per training step, whether the step begins an epoch, whether it ends
    one, and which evaluation sets are due after it.

    A step ends an epoch when the count *after* it crosses a multiple of the epoch's
    duration; an epoch begins at the first step of the loop when the count is on a
    boundary (e.g. 0), and at the step after one ended. An evaluation set without a
    duration of its own follows epoch ends.

    The loop reaches the clock through schedules (:meth:`begins`, :meth:`ends`,
    :meth:`test_due`, and :attr:`schedule`, which holds what the clock remembers for
    checkpoints): being schedules rather than callbacks, they do not split a fused group
    of steps. Whichever of them the loop asks first at a step makes the step's decision
    (from the ``loop_state`` that the :attr:`bind` hook attaches in ``on_start``); the others read
    it, so the order in which they are asked does not matter. When every period is in steps
    or passes, they plan (:meth:`next_due`): between two boundaries nothing happens, and the
    loop does not ask them (a pass's end, which no count foretells, wakes it).

    Args:
        epoch: the epoch's ``(unit, amount)`` (see ``_time._periods.period_unit``), a
            :class:`~._epochs.PassEnds` (``epochs=`` over data of unknown length: an epoch
            ends with a pass), or ``None`` when the whole run is one epoch.
        tests: ``{name: (unit, amount) or None}``, each evaluation set's own period.

    Example:
        >>> import ciclo
        >>> clock = EpochClock(("steps", 2), {"test": None})
        >>> loop_state = ciclo.LoopState(None, ciclo.history(), ciclo.Elapsed.create())
        >>> clock.attach(loop_state)
        >>> ends = clock.ends()
        >>> fired = []
        >>> for elapsed, batch in ciclo.elapse([[0.0]] * 5):
        ...     loop_state.elapsed, loop_state.batch = elapsed, batch
        ...     fired.append(ends(elapsed))
        >>> fired
        [False, True, False, True, False]
    """

    def __init__(
        self,
        epoch: tuple[str, float] | PassEnds | None,
        tests: Mapping[str, tuple[str, float] | None],
    ) -> None:
        self.epoch = epoch
        self._epoch_schedule = epoch if isinstance(epoch, PassEnds) else _every(epoch)
        if isinstance(epoch, PassEnds):  # a pass's end wakes the loop's plan: it asks the clock
            epoch.passes.on_last = lambda: self._loop_state and self._loop_state._wake_plan()
        self._test_schedules = {name: _every(test) for name, test in tests.items()}
        self.first = True  # no step decided yet in this run
        self.begun = self.ended = False  # the decided step begins / ends an epoch
        self.due = dict.fromkeys(tests, False)  # the decided step is followed by evaluation
        self._step: Elapsed | None = None  # the step decided last (its count before it)
        self._after: Elapsed | None = None  # and its count after it
        # A stop cut the evaluation of the decided step: the sets still to evaluate after
        # it, and whether it ended an epoch (see cut); the later tasks of the step then
        # do not fire, and a resumed run runs them first (see owed).
        self.owed: list[str] = []
        self.owed_epoch_end = False
        self._loop_state: LoopState | None = None
        self.schedule: Schedule = _ClockSchedule(self)
        self.bind = Hook("train_loop clock", self.attach)

    def attach(self, loop_state: LoopState) -> None:
        """Reads the current step from ``loop_state`` (what :attr:`bind` does in on_start)."""
        self._loop_state = loop_state

    @property
    def loop_state(self) -> LoopState:
        """The loop the clock decides for (bound in ``on_start``)."""
        assert self._loop_state is not None, "the clock is bound in on_start"
        return self._loop_state

    def decide(self, elapsed: Elapsed) -> None:
        """Makes the decision of the step whose count before it is ``elapsed``, once."""
        if elapsed is self._step:
            return
        assert self._loop_state is not None, "the clock is bound in on_start"
        self._step = elapsed
        self._after = after = self._loop_state.elapsed_after_step()
        if self.first:
            if self.epoch is None:
                self.begun = True
            elif isinstance(self.epoch, PassEnds):
                self.begun = self.epoch.begins()
            else:
                unit, amount = self.epoch
                self.begun = getattr(elapsed, unit) % amount == 0
            # Show the schedules where this loop starts, so that a boundary crossed by the
            # first step counts (a continued run may start mid-epoch).
            for schedule in self.schedules():
                schedule(elapsed)
            self.first = False
        else:
            self.begun = self.ended
        self.ended = self._epoch_schedule(after) if self._epoch_schedule else False
        for name, test in self._test_schedules.items():
            self.due[name] = test(after) if test else self.ended

    def next_due(self) -> Due | None:
        """When the decision can next be other than "nothing happens", asked right after a
        decision: the next step, when this one ended an epoch (the next begins one); else the
        step whose count after it reaches the next boundary of a period, when all are in
        steps or passes (``None``, ask at every step, when one is not: samples, time).

        Example:
            >>> import ciclo
            >>> clock = EpochClock(("steps", 5), {"test": None})
            >>> loop_state = ciclo.LoopState(None, ciclo.history(), ciclo.Elapsed.create())
            >>> clock.attach(loop_state)
            >>> for elapsed, batch in ciclo.elapse([[0.0]] * 2):
            ...     loop_state.elapsed, loop_state.batch = elapsed, batch
            ...     clock.decide(elapsed)
            >>> clock.next_due()  # the step whose count after it is 5 ends the epoch
            Due(steps=4, samples=inf, every_step=False, time=inf)
        """
        if self._step is None or self._after is None:
            return None
        boundary = math.inf
        for schedule in self.schedules():
            due = schedule.next_due(self._after)
            if due is None or due.every_step or min(due.samples, due.time) != math.inf:
                return None  # not all in steps: what `passed` could not tell them
            boundary = min(boundary, due.steps)
        if self.ended or self.owed:  # the next step begins an epoch, or runs what is owed
            return Due(steps=self._step.steps + 1)
        return Due(steps=boundary - 1)  # the step whose count after it reaches the boundary

    def passed(self, elapsed: Elapsed) -> None:
        """The loop went past the step counted ``elapsed`` without asking: the periods (all in
        steps, as :meth:`next_due` planned them) saw the count after it."""
        after = Elapsed(elapsed.steps + 1, elapsed.samples, elapsed.time, elapsed.date)
        for schedule in self.schedules():
            schedule.passed(after)

    def cut(self, name: str) -> None:
        """A stop cut the evaluation of set ``name`` at the decided step: it, the sets due
        after it and the step's epoch end are owed; nothing more of them runs now."""
        names = list(self.due)
        self.owed = [n for n in names[names.index(name) :] if self.due[n]]
        self.owed_epoch_end = self.ended

    def take_owed(self) -> tuple[list[str], bool]:
        """What a cut step still owes (from the checkpoint of a resumed run), once."""
        owed = (self.owed, self.owed_epoch_end)
        self.owed, self.owed_epoch_end = [], False
        return owed

    def restore(self, *, first: bool, ended: bool) -> None:
        """Continues a run whose last decided step ``ended`` an epoch (or none, ``first``)."""
        self.first, self.ended, self._step = first, ended, None

    def schedules(self) -> tuple[Schedule, ...]:
        """The periodic schedules behind the decisions (their state is the clock's)."""
        candidates = (self._epoch_schedule, *self._test_schedules.values())
        return tuple(s for s in candidates if s is not None)

    def begins(self) -> Schedule:
        """Fires at the first step of each epoch."""
        return _Flag(self, "begins", lambda: self.begun)

    def ends(self) -> Schedule:
        """Fires at the step that completes an epoch."""
        inner = (self._epoch_schedule,) if self._epoch_schedule else ()
        return _Flag(self, "ends", lambda: self.ended and not self.owed, *inner)

    def test_due(self, name: str) -> Schedule:
        """Fires at the steps after which the evaluation set ``name`` is evaluated."""
        test = self._test_schedules[name]
        inner = (test,) if test else ()
        return _Flag(self, f"test_due[{name!r}]", lambda: self.due[name] and not self.owed, *inner)


class _ClockSchedule(Schedule):
    """The clock as a task of the loop: it never fires; it makes the step's decision when
    asked first, and saves and restores what the clock remembers."""

    def __init__(self, clock: EpochClock) -> None:
        self.clock = clock

    def __call__(self, elapsed: Elapsed) -> bool:
        self.clock.decide(elapsed)
        return False

    def next_due(self, elapsed: Elapsed) -> Due | None:
        return self.clock.next_due()

    def passed(self, elapsed: Elapsed) -> None:
        self.clock.passed(elapsed)

    def children(self) -> tuple[Schedule, ...]:
        return self.clock.schedules()

    def state_dict(self) -> dict[str, Any]:
        # A resumed run needs to know whether the last step ended an epoch (the next one
        # then begins one): the count alone does not say it for epochs in samples or time.
        state = {**super().state_dict(), "first": self.clock.first, "ends": self.clock.ended}
        if self.clock.owed:  # a stop cut an evaluation: what the resumed run runs first
            state["owed"] = {"tests": self.clock.owed, "epoch_end": self.clock.owed_epoch_end}
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.clock.restore(first=bool(state["first"]), ended=bool(state["ends"]))
        owed = state.get("owed") or {"tests": [], "epoch_end": False}
        self.clock.owed = list(owed["tests"])
        self.clock.owed_epoch_end = bool(owed["epoch_end"])

    def __repr__(self) -> str:
        return "train_loop.clock"


class _Flag(Schedule):
    """Fires when the clock's decision for the current step says so."""

    def __init__(
        self, clock: EpochClock, label: str, get: Callable[[], bool], *inner: Schedule
    ) -> None:
        self.clock, self.label, self.get, self.inner = clock, label, get, inner

    def __call__(self, elapsed: Elapsed) -> bool:
        self.clock.decide(elapsed)
        return bool(self.get())

    def next_due(self, elapsed: Elapsed) -> Due | None:
        return self.clock.next_due()  # the clock's schedule tells its periods what passed

    def children(self) -> tuple[Schedule, ...]:
        return self.inner

    def __repr__(self) -> str:
        return f"train_loop.{self.label}"
