"""``steps_per_call="auto"``: the loop picks how many steps of a managed step (or of a
``ciclo.fuse_steps`` step) it fuses.

A :class:`AutoFusion` per step and strategy measures, while the loop runs, the time per
step and the share of it the host spends dispatching the step (over a few windows, see
:data:`WINDOW_SECONDS`). A step whose dispatch takes at most :data:`DISPATCH_SHARE` at K = 1
keeps K = 1: a large step never compiles a fused call. Otherwise it doubles K (2, 4, ...
:data:`MAX_STEPS`) until :data:`MISSES` doublings in a row did not make a step at least
``1 - GAIN`` faster than the fastest K so far, or a whole loop is too short to measure the
next K, and keeps that fastest K (measuring again from it every :data:`REPROBE_SECONDS`).
Groups cut short by a schedule run as calls of powers of 2 (:func:`power_of_2_parts`), so
at most ``log2(MAX_STEPS) + 1`` fused programs are compiled. With several processes, K
stays 1: each process would measure its own, and their fused calls must match.
"""

from __future__ import annotations

import time
from typing import Any

import jax

from .._time._phases import COMPILE_EVENTS

__all__ = ["AutoFusion", "MAX_STEPS", "power_of_2_parts", "synced_now"]

#: The largest K auto-fusion uses.
MAX_STEPS = 64
#: Fusing is tried when dispatching takes more than this share of the loop's time at K = 1
#: (doubling K then saves about half of it: at least 10%).
DISPATCH_SHARE = 0.2
#: A doubled K is kept when a step takes at most this fraction of the fastest K's time (at
#: 0.9 the 200 us MLP stopped at K = 1-8; 64 ran 0.77 of the hand loop, 8 0.83: NOTES.md).
GAIN = 0.97
#: Doublings in a row that may fail to pay before the fastest K is kept (a fused call
#: costs more than a plain one, so K = 2 can be slower than 1 where 8 is faster).
MISSES = 3
#: A doubled K whose steps are this many times slower than the fastest K's is never tried
#: again, not even when measured anew (XLA:CPU ran a small CNN's convolutions 13x slower
#: under the fused call's loop: a structural cost; a busy host read K = 2 2.3x slower once).
SLOWER = 4.0
#: A measurement (a window) spans at least this many seconds, :data:`WINDOW_CALLS` calls and
#: two of the loop's in-flight periods, from and to a moment the device has run every call
#: made (:func:`synced_now`); each decision takes the fastest of :data:`WINDOWS` windows
#: (something else that ran in a window, an evaluation between two groups, only slows it
#: down) and the middle of their dispatch shares (a busy host's preempted dispatch read 0.21
#: of a 2 ms step in one window, 0.02-0.14 in the others). Time JAX spent compiling is left
#: out of a window. A window that held a whole loop shorter than a window closes at the
#: loop's end (the step's ``__loop_end__``), the device caught up, if it holds
#: :data:`WINDOW_STEPS` steps (so loops of a few hundred fast steps are measured too); one
#: opened inside a loop and cut by its end is dropped: it would hold the loop's last group,
#: cut into powers of 2, and the end's own work (a rollback's restart drops it too).
WINDOW_SECONDS = 0.02
WINDOW_CALLS = 4
WINDOW_STEPS = 16  # two periods of the loop's default bound (8: _loop/_in_flight.py)
WINDOWS = 3
#: A K kept is measured again after this many seconds (a busy moment may have chosen it).
REPROBE_SECONDS = 10.0


#: Seconds JAX spent tracing and compiling in this process, counted once a controller exists:
#: a window's time leaves them out (a new K, a history's new stack shape compile once).
_compiling = [0.0]
_listening: list[bool] = []


def _count_compiles(event: str, duration_secs: float, **_: str | int) -> None:
    if event in COMPILE_EVENTS:  # the ledger's definition of compiling
        _compiling[0] += duration_secs


def synced_now(state: Any) -> float:
    """The time once the device has computed ``state`` (the arrays not donated since)."""
    for leaf in jax.tree_util.tree_leaves(state):
        if isinstance(leaf, jax.Array) and not leaf.is_deleted():
            leaf.block_until_ready()
    return time.perf_counter()


def power_of_2_parts(count: int) -> list[int]:
    """``count`` as decreasing powers of 2 (the calls a cut group runs as).

    Example:
        >>> power_of_2_parts(13)
        [8, 4, 1]
    """
    return [1 << bit for bit in range(count.bit_length() - 1, -1, -1) if count >> bit & 1]


class AutoFusion:
    """The K of one managed step under one ``steps_per_call="auto"`` strategy.

    :meth:`steps` is the loop's ``__loop_steps_per_call__``; :meth:`timed` wraps each call of
    the step, so the controller knows how long the host took to dispatch it.

    Example:
        >>> auto = AutoFusion()
        >>> auto.k, auto.settled
        (1, False)
    """

    __slots__ = (
        "alone",
        "best",
        "best_k",
        "ceiling",
        "compiled",
        "dispatch",
        "first_steps",
        "k",
        "misses",
        "reprobe_at",
        "settled",
        "start",
        "start_steps",
        "windows",
    )

    def __init__(self) -> None:
        if not _listening:
            jax.monitoring.register_event_duration_secs_listener(_count_compiles)
            _listening.append(True)
        # With several processes, their groups must match (a fused call runs each step's
        # collectives): K stays 1 (a fixed K is the same everywhere).
        self.alone = jax.process_count() == 1
        self.k = 1
        self.settled = False
        self.best, self.best_k = float("inf"), 1  # the fastest seconds per step, and its K
        self.misses = 0  # doublings since the best that did not pay
        self.ceiling = MAX_STEPS  # the largest K to try
        self.reprobe_at = 0.0  # when a settled K is measured again
        self.start: float | None = None  # the window's start (None: no window open)
        self.start_steps = 0
        self.compiled = 0.0  # _compiling[0] at the window's start
        self.dispatch = 0.0  # seconds spent in the step's calls since the window's start
        self.first_steps = -1  # the step at which the loop now running asked first
        self.windows: list[tuple[float, float]] = []  # (seconds per step, dispatch share)

    def steps(self, loop_state: Any) -> int:
        """K for the group starting at this step: the loop asks it at each group's start
        (and once before its first batch, when the answer says only whether it may fuse)."""
        if self.alone is False:  # several processes: each would pick its own K
            return 1
        if loop_state.batch is None:
            return MAX_STEPS
        now = time.perf_counter()
        if self.settled:
            if now < self.reprobe_at:
                return self.k
            # measured again from this K: a busy moment may have decided (a large step
            # settles again at once, without compiling anything)
            self.settled, self.best, self.misses, self.start = False, float("inf"), 0, None
        steps, compiled = loop_state.elapsed.steps, _compiling[0]
        if self.first_steps < 0:
            self.first_steps = steps
        if self.start is None or steps <= self.start_steps:  # a new loop: see WINDOW_SECONDS
            self._open(synced_now(loop_state.state), steps, compiled)
            return self.k
        span, count = now - self.start - (compiled - self.compiled), steps - self.start_steps
        if span < WINDOW_SECONDS or count < max(WINDOW_CALLS * self.k, WINDOW_STEPS):
            return self.k
        now = synced_now(loop_state.state)
        self._close(now, steps, compiled, self.dispatch)
        self._open(now, steps, compiled)
        return self.k

    def loop_ended(self, loop_state: Any, error: BaseException | None) -> None:
        """The step's ``__loop_end__``: a window that held the whole loop closes at its end,
        once the device has run it (too short to measure this K: the fastest is kept); one
        opened inside the loop is dropped (see :data:`WINDOW_SECONDS`)."""
        whole = self.start is not None and self.start_steps == self.first_steps
        if whole and not self.settled and error is None:
            steps = loop_state.elapsed.steps
            if steps - self.start_steps >= WINDOW_STEPS:
                self._close(synced_now(loop_state.state), steps, _compiling[0], self.dispatch)
            elif self.best < float("inf"):
                self._settle()
        self.start, self.first_steps = None, -1

    def _open(self, now: float, steps: int, compiled: float) -> None:
        self.start, self.start_steps, self.compiled, self.dispatch = now, steps, compiled, 0.0

    def _close(self, now: float, steps: int, compiled: float, dispatch: float) -> None:
        """Ends the window at ``now`` (a group's start or the loop's end), the device caught
        up."""
        span = now - self.start - (compiled - self.compiled)  # type: ignore[operator]
        if span <= 0:  # all of it compiling
            return
        self.windows.append((span / (steps - self.start_steps), dispatch / span))
        if len(self.windows) == WINDOWS:  # the fastest time, the middle share (see WINDOWS)
            times, shares = zip(*self.windows, strict=True)
            self.windows = []
            self._decide(min(times), sorted(shares)[WINDOWS // 2])

    def _decide(self, per_step: float, share: float) -> None:
        if per_step < GAIN * self.best:
            self.best, self.best_k, self.misses = per_step, self.k, 0
        else:
            self.misses += 1
            if per_step > SLOWER * self.best:  # fusing this far is slower by construction
                self.ceiling = self.k // 2
        # the share decides at K = 1 only: fused, it falls with K (a busy host read 0.14-0.17
        # at K = 2-16 where K = 32 still halved the step: benchmarks/NOTES.md)
        unfused = share <= DISPATCH_SHARE and self.k == 1
        if unfused or self.k >= self.ceiling or self.misses == MISSES:
            self._settle()
        else:
            self.k *= 2
            self.start = None  # the first group of the new K compiles it

    def _settle(self) -> None:
        self.k, self.settled, self.windows = self.best_k, True, []
        self.reprobe_at = time.perf_counter() + REPROBE_SECONDS

    def timed(self, call: Any, *args: Any) -> Any:
        """``call(*args)``, its duration counted as dispatch (compiling left out)."""
        start, compiled = time.perf_counter(), _compiling[0]
        try:
            return call(*args)
        finally:
            self.dispatch += time.perf_counter() - start - (_compiling[0] - compiled)
