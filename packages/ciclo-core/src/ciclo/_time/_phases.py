"""Where a loop is, and since when: the record of the loop's *phases* that the time ledger
(``ciclo.goodput``) and the watchdog (``ciclo.watchdog``) read.

A loop whose callbacks watch its phases owns one :class:`Phases` (``loop_state.phases``).
The engine marks :meth:`Phases.step` and :meth:`Phases.data` per step, evaluations and
checkpoints mark theirs (:func:`marked`); each mark adds the seconds since the previous one
to the phase that ended, and JAX's compile time moves to ``compile``. A monitor thread
reads :meth:`Phases.current` and :attr:`Phases.number` without a lock (one writer).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from time import perf_counter

import jax.monitoring

__all__ = [
    "CALLBACKS",
    "CHECKPOINT",
    "COMPILE",
    "DATA",
    "EVALUATION",
    "FIRST_STEP",
    "PHASE_NAMES",
    "Phases",
    "STARTUP",
    "STEP",
    "marked",
    "process_start_time",
]

STARTUP = "startup"  #: process start, up to the first step (the restore included)
FIRST_STEP = "first_step"  #: the first step of the outermost loop (its compilation)
STEP = "step"  #: the step's callbacks (the step function and what runs with it)
DATA = "data"  #: waiting on the dataset's ``next``
EVALUATION = "evaluation"  #: an evaluation (``inner_loop``, ``train_loop``'s test sets)
CHECKPOINT = "checkpoint"  #: a checkpoint's blocking time
CALLBACKS = "callbacks"  #: other host work: step-end hooks, between loops
COMPILE = "compile"  #: JAX compiling (from its monitoring events), taken out of the above
PHASE_NAMES = (STARTUP, FIRST_STEP, STEP, DATA, EVALUATION, CHECKPOINT, CALLBACKS, COMPILE)

#: JAX's events whose durations are compilation: tracing, lowering, XLA's compile (or the
#: persistent cache's read), in ``jax._src.dispatch``; they never nest.
COMPILE_EVENTS = frozenset(
    {
        "/jax/core/compile/jaxpr_trace_duration",
        "/jax/core/compile/jaxpr_to_mlir_module_duration",
        "/jax/core/compile/backend_compile_duration",
    }
)


def process_start_time() -> float:
    """This process's start, as a ``time.time()`` date (from ``/proc`` on Linux; elsewhere
    the import of ciclo's time package).

    >>> 0 < time.time() - process_start_time() < 10 * 24 * 3600
    True
    """
    try:  # the process's age: the system's uptime less the process's start after boot
        with open("/proc/self/stat") as stat:
            ticks = int(stat.read().rpartition(")")[2].split()[19])
        with open("/proc/uptime") as uptime:
            up = float(uptime.read().split()[0])
        return time.time() - (up - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return _IMPORTED


_IMPORTED = time.time()


class Phases:
    """The record of a loop's phases (see the module docstring); ``with Phases() as
    phases:`` listens to JAX's compile events inside the block, which ends in ``callbacks``.

    The engine's marks per step, ``step(number)`` and ``data()``, cost a clock reading and
    two stores each; other phases (a loop's first step) are marked with :meth:`enter`.

    Attributes:
        origin: ``time.perf_counter()`` when the record began (in ``startup``).
        number: the step of the latest batch drawn (``-1`` before the first).
        first_step: ``(seconds, compile seconds, end)`` of the loop's first step, once it is
            over, else ``None`` (``end``: ``time.perf_counter()`` at its end).
        peers: with several processes, each process's seconds in steps as of the latest
            round of agreement (``None`` with one process).

    Example:
        >>> with Phases() as record:
        ...     record.step(0); record.data(); record.step(1); record.data()
        ...     record.current()[0], record.number, record.first_step is not None
        ('data', 1, True)
        >>> record.current()[0]
        'callbacks'
    """

    __slots__ = (
        "_compile_mark",
        "_first_start",
        "_thread",
        "arrived",
        "done",
        "first_step",
        "number",
        "origin",
        "peers",
        "phase",
        "seconds",
        "since",
        "stepped",
    )

    def __init__(self) -> None:
        now = time.perf_counter()
        self.origin = now
        self.phase: str | None = STARTUP  # a phase other than step and data, or None
        self.since = now  # when it began
        self.arrived = self.done = now  # the step began / the wait for data began
        self.stepped = 0.0  # the seconds of steps (the first steps apart)
        self.number = -1
        self.seconds: dict[str, float] = dict.fromkeys(PHASE_NAMES, 0.0)
        self.first_step: tuple[float, float, float] | None = None
        self.peers: list[float] | None = None
        self._compile_mark = self._first_start = 0.0
        self._thread = threading.get_ident()

    # --- the loop's block ---------------------------------------------------------------------
    def __enter__(self) -> Phases:
        jax.monitoring.register_event_duration_secs_listener(self._compiled)
        return self

    def __exit__(self, *error: object) -> None:
        """The loop is over: what follows is other host work (``callbacks``)."""
        self.enter(CALLBACKS)
        jax.monitoring.unregister_event_duration_listener(self._compiled)

    # --- the engine's marks ------------------------------------------------------------------
    def step(self, number: int) -> None:
        """A batch was drawn: the step ``number`` begins (the engine, per step)."""
        self.arrived = perf_counter()
        self.number = number
        if self.phase is not None:  # the loop's first batch (or after a phase of its own)
            self._arrival_after_phase()

    def data(self) -> None:
        """The step is done: the loop waits for the next batch (the engine, per step)."""
        now = perf_counter()
        if self.phase is None:
            self.stepped += now - self.arrived
            self.done = now
        else:  # after the first step, or a phase of its own (work queued for the step's end)
            self.enter(DATA)

    def _arrival_after_phase(self) -> None:
        if self.first_step is not None:
            self.enter(STEP)
            return
        self.enter(FIRST_STEP)
        self._first_start, self._compile_mark = self.since, self.seconds[COMPILE]

    def _end_first_step(self, now: float) -> None:
        if self.first_step is None:
            compiled = self.seconds[COMPILE] - self._compile_mark
            self.first_step = (now - self._first_start, compiled, now)

    # --- other phases ------------------------------------------------------------------------
    def current(self) -> tuple[str, float]:
        """The phase the loop is in, and since when (``time.perf_counter()``)."""
        phase = self.phase
        if phase is not None:
            return phase, self.since
        arrived, done = self.arrived, self.done
        return (STEP, arrived) if arrived > done else (DATA, done)

    def enter(self, phase: str) -> str:
        """Enters ``phase`` now; returns the phase left (to enter it again after)."""
        now = time.perf_counter()
        left, since = self.current()
        if left == STEP:
            self.stepped += now - since
        elif left != DATA:  # the wait for data is what no other phase took
            self.seconds[left] += now - since
        if left == FIRST_STEP and phase in (DATA, CALLBACKS):  # the first step is over
            self._end_first_step(now)
        if phase == STEP:
            self.phase, self.arrived = None, now
        elif phase == DATA:
            self.phase, self.arrived, self.done = None, now, now
        else:
            self.phase, self.since = phase, now
        return left

    def totals(self) -> dict[str, float]:
        """The seconds of each phase up to now (the current one included; ``step`` counts
        the first steps too), and ``total``."""
        while True:  # consistent when another thread reads it while the loop marks
            marks = (self.phase, self.since, self.arrived, self.done, self.stepped)
            seconds = dict(self.seconds)
            now = time.perf_counter()
            if marks == (self.phase, self.since, self.arrived, self.done, self.stepped):
                break
        phase, since, arrived, done, stepped = marks
        if phase is not None:
            seconds[phase] += now - since
        elif arrived > done:
            stepped += now - arrived
        seconds[STEP] = stepped
        seconds["total"] = total = now - self.origin
        seconds[DATA] = total - sum(v for k, v in seconds.items() if k not in (DATA, "total"))
        return seconds

    def _compiled(self, event: str, duration_secs: float, **_: str | int) -> None:
        """JAX's listener: compilation in the loop's thread moves to ``compile``."""
        if event in COMPILE_EVENTS and threading.get_ident() == self._thread:
            phase, _since = self.current()
            if phase == STEP:
                self.stepped -= duration_secs
            elif phase != DATA:
                self.seconds[phase] -= duration_secs
            self.seconds[COMPILE] += duration_secs


@contextlib.contextmanager
def marked(phases: Phases | None, phase: str) -> Iterator[None]:
    """Marks ``phase`` on the record ``phases`` (``loop_state.phases``) for the duration of
    the block, and goes back to the phase before it (nothing happens without a record, and
    nesting a phase in itself keeps it).

    Example:
        >>> with marked(None, EVALUATION):
        ...     pass
    """
    if phases is None or phases.current()[0] == phase:
        yield
        return
    left = phases.enter(phase)
    try:
        yield
    finally:
        phases.enter(left)
