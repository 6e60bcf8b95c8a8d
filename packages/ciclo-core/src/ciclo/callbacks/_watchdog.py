"""``watchdog``: a deadline per phase of the loop, so that a stuck job ends instead of hanging.

A thread reads the record of the loop's phases that the loop hands it
(:mod:`ciclo._time._phases`): the phase the loop is in and since when. Nothing runs on the
per-step path.
"""

from __future__ import annotations

import difflib
import faulthandler
import math
import os
import sys
import threading
import time as _time
from typing import Any

from .._loop._base import LoopCallbackBase
from .._loop._hooks import owners
from .._loop._state import LoopState
from .._processes._agreement import running_agreement
from .._processes._outputs import writes_here
from .._time._phases import (
    CALLBACKS,
    CHECKPOINT,
    DATA,
    EVALUATION,
    FIRST_STEP,
    STARTUP,
    STEP,
    Phases,
)
from .._time._schedules import Schedule, never
from ._writers import WriterLogger

__all__ = ["EXIT_STATUS", "Watchdog", "WatchdogExpired", "watchdog"]

#: The exit status of a process the watchdog ends (``timeout``'s).
EXIT_STATUS = 124
#: The deadlines, by argument, with their defaults (seconds).
DEFAULTS = {
    "step_timeout": 600.0,
    "first_step_timeout": 3600.0,
    "evaluation_timeout": 3600.0,
    "checkpoint_timeout": 1800.0,
    "data_timeout": 600.0,
}
#: Which deadline watches each phase (the first batch of a loop is data).
WATCHED_BY = {
    FIRST_STEP: "first_step_timeout",
    STEP: "step_timeout",
    CALLBACKS: "step_timeout",
    DATA: "data_timeout",
    STARTUP: "data_timeout",
    EVALUATION: "evaluation_timeout",
    CHECKPOINT: "checkpoint_timeout",
}
#: Seconds a writer is given to take the event before the process ends anyway.
WRITE_SECONDS = 5.0

MSG_UNKNOWN = (
    "watchdog({name}=...): no such deadline{close}. The deadlines, in seconds, are "
    + ", ".join(f"{name}={default:g}" for name, default in DEFAULTS.items())
    + " (None: that phase is not watched)."
)
MSG_BAD_TIMEOUT = (
    "watchdog({name}={value!r}): expected seconds, a number > 0, or None to not watch "
    "that phase; the default is {default:g}."
)
MSG_EXPIRED = (
    "ciclo.watchdog: process {process} made {what}; every thread's Python stack follows. "
    "The job ends with exit status {status}. If this phase is that slow when healthy, raise "
    "{name}."
)


class WatchdogExpired(RuntimeError):
    """A phase of the loop outlived its deadline (what the other processes of a job are
    told, naming the stuck one).

    Example:
        >>> str(WatchdogExpired("step 5 stuck"))
        'step 5 stuck'
    """


class Watchdog(LoopCallbackBase):
    """Deadlines, in seconds, for each phase of the loop: when one passes, the job ends
    instead of hanging silently.

    A thread watches the phase the outermost loop is in and since when. When a deadline
    passes it prints every thread's stack (:mod:`faulthandler`) after a line naming the
    phase, step and deadline, writes ``watchdog/expired`` to the loop's writers, tells the
    other processes (which end within ``fault_timeout``) and exits with status 124. A
    checkpoint holds nothing of it: a resumed run may add or leave out a watchdog.

    Args:
        step_timeout: a step (and the work queued for its end), after the first.
        first_step_timeout: the first step of the loop, with its compilation.
        evaluation_timeout: one evaluation (``inner_loop``, ``train_loop``'s test sets).
        checkpoint_timeout: a checkpoint's blocking time (including the final save).
        data_timeout: waiting for a batch or a round of agreement (above ``fault_timeout``).

    Each is seconds (a number > 0), or ``None`` to not watch that phase.

    Example:
        >>> import ciclo, numpy as np
        >>> step = lambda state, batch: state + 1
        >>> _ = ciclo.loop(0, [np.ones(1)] * 3, {ciclo.every(1): step,
        ...                **ciclo.watchdog(step_timeout=60)})
    """

    #: Not part of the run: its task is left out of checkpoints (``checkpointed_tasks``).
    __loop_transient__ = True

    def __init__(
        self,
        *,
        step_timeout: float | None = DEFAULTS["step_timeout"],
        first_step_timeout: float | None = DEFAULTS["first_step_timeout"],
        evaluation_timeout: float | None = DEFAULTS["evaluation_timeout"],
        checkpoint_timeout: float | None = DEFAULTS["checkpoint_timeout"],
        data_timeout: float | None = DEFAULTS["data_timeout"],
        **unknown: Any,
    ) -> None:
        for name in unknown:
            close = difflib.get_close_matches(name, list(DEFAULTS), n=1)
            raise TypeError(
                MSG_UNKNOWN.format(name=name, close=f" (did you mean {close[0]}?)" if close else "")
            )
        given = {
            "step_timeout": step_timeout,
            "first_step_timeout": first_step_timeout,
            "evaluation_timeout": evaluation_timeout,
            "checkpoint_timeout": checkpoint_timeout,
            "data_timeout": data_timeout,
        }
        for name, value in given.items():
            if value is None:
                continue
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value <= 0
            ):
                raise ValueError(
                    MSG_BAD_TIMEOUT.format(name=name, value=value, default=DEFAULTS[name])
                )
        self.deadlines = {n: None if v is None else float(v) for n, v in given.items()}
        self._monitor: _Monitor | None = None

    def __repr__(self) -> str:
        given = ", ".join(f"{n}={v}" for n, v in self.deadlines.items())
        return f"watchdog({given})"

    def default_schedule(self) -> Schedule:
        """Spread with ``**`` into ``tasks``: never called at a step (its thread watches)."""
        return never()

    def __loop_callback__(self, loop_state: LoopState) -> None:
        """Nothing: the watchdog's thread does the work."""

    def on_train_begin(self, state: Any, batch: Any, elapsed: Any, loop_state: LoopState) -> None:
        """Nothing (its place in ``train_loop``'s ``callbacks=``: the thread does the work)."""

    def __loop_phases__(self, loop_state: LoopState, phases: Phases | None) -> None:
        """Starts the watching thread when the steps begin; stops it at the loop's end."""
        if self._monitor is not None:
            self._monitor.stop()
            self._monitor = None
        if phases is not None:
            self._monitor = _Monitor(self, loop_state, phases)

    def deadline_of(self, phase: str) -> tuple[str, float | None]:
        """The argument that watches ``phase`` and its deadline (``None``: unwatched)."""
        name = WATCHED_BY.get(phase, "step_timeout")
        return name, self.deadlines[name]


watchdog = Watchdog
"""Another name of :class:`Watchdog` (the same class)."""


class _Monitor:
    """The watching thread of one loop."""

    def __init__(self, dog: Watchdog, loop_state: LoopState, phases: Phases) -> None:
        self.dog, self.loop_state, self.phases = dog, loop_state, phases
        self.started = _time.perf_counter()
        watched = [d for d in dog.deadlines.values() if d is not None]
        self.poll = min(1.0, max(0.05, min(watched, default=10.0) / 20))
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ciclo-watchdog-deadlines")
        self._thread.daemon = True
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=5.0)

    def _run(self) -> None:
        phases = self.phases
        while not self._stopped.wait(self.poll):
            (phase, since), step = phases.current(), phases.number
            if (phase, since) != phases.current():  # the loop moved on while it was read
                continue
            name, deadline = self.dog.deadline_of(phase)
            if deadline is None:
                continue
            seconds = _time.perf_counter() - max(since, self.started)
            if seconds > deadline and not self._stopped.is_set():
                self._expire(phase, max(step, 0), name, deadline, seconds)

    def _expire(self, phase: str, step: int, name: str, deadline: float, seconds: float) -> None:
        agreement = running_agreement()
        process = 0 if agreement is None else agreement.process
        what = f"no progress for {seconds:.1f} s in the phase {phase!r} at step {step}"
        what += f" (its deadline {name}={deadline:g} s)"
        message = MSG_EXPIRED.format(process=process, what=what, status=EXIT_STATUS, name=name)
        print(message, file=sys.stderr, flush=True)
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
        self._write_event(step, deadline)
        if agreement is not None:
            agreement.fail(WatchdogExpired(f"its watchdog ended it: {what}"))
            if agreement.process == 0:  # it holds the coordination service: others first
                agreement.wait_for_the_others(seconds=min(agreement.timeout, 10.0))
        sys.stdout.flush()
        os._exit(EXIT_STATUS)

    def _write_event(self, step: int, deadline: float) -> None:
        """``watchdog/expired`` to each writer of the loop, each given a few seconds (the
        loop's thread is stuck: a writer might be the culprit)."""
        tasks = self.loop_state.inputs.tasks
        fns = [getattr(callback, "fn", callback) for _, cbs in tasks for callback in cbs]
        writers = [o for o in owners(fns) if isinstance(o, WriterLogger) and writes_here(o.process)]
        for logger in writers:
            writer = logger.metric_writer

            def write(writer: Any = writer) -> None:
                writer.write_scalars(step, {"watchdog/expired": deadline})
                writer.flush()

            thread = threading.Thread(target=write, daemon=True)
            thread.start()
            thread.join(WRITE_SECONDS)
