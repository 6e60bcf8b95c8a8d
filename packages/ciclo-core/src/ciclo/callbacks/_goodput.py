"""``goodput``: the time ledger of a run, where every second of its wall time went.

It reads the record of the phases of each loop it is in (:mod:`ciclo._time._phases`, marked
by the engine, the evaluations and the checkpoints), counts the time outside them (start-up
before its first loop, other work between loops), adds what the checkpoint it resumed from
carried (the buckets of the processes before this one), and what a resume redid (``lost``).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import statistics
import sys
import threading
import time as _time
from collections.abc import Mapping
from typing import Any

from .._loop._base import LoopCallbackBase
from .._loop._state import LoopState
from .._processes._outputs import OUTPUT_PROCESS, writes_here
from .._records._logs import Logs
from .._time._elapsed import Elapsed
from .._time._phases import (
    CALLBACKS,
    CHECKPOINT,
    COMPILE,
    DATA,
    EVALUATION,
    FIRST_STEP,
    PHASE_NAMES,
    STARTUP,
    STEP,
    Phases,
    process_start_time,
)
from .._time._schedules import Schedule, every

__all__ = ["BUCKETS", "Goodput", "goodput"]

#: The ledger's buckets, in the order a report lists them; they add up to ``total``.
BUCKETS = ("startup", "compile", "data", "step", "evaluation", "checkpoint", "callbacks", "lost")
#: The file next to the checkpoints where the ledger notes how far the run got (how much
#: wall time, at which step), a few times a second: a resume reads it to know what it redoes.
HEARTBEAT_FILE = ".ciclo-goodput.json"
#: Seconds between two notes of the heartbeat file.
HEARTBEAT_SECONDS = 0.1

MSG_BAD_STEPS = "goodput(steps={steps!r}): expected an int >= 1, e.g. goodput(steps=1000)."
_SINCE = ("process", "now")
MSG_BAD_SINCE = "goodput(since={since!r}): expected 'process' (the default) or 'now'."
MSG_WRONG_STATE = "goodput: the checkpoint holds a ledger of another format ({state!r:.80})."


class Goodput(LoopCallbackBase):
    """The time ledger of a run: where each second of its wall time went, in buckets that
    add up to ``total``.

    ``startup`` (up to the first step), ``compile`` (JAX compiling while a loop runs),
    ``data`` (the dataset's ``next``, agreement rounds), ``step`` (the step's callbacks and
    device waits), ``evaluation``, ``checkpoint`` (the time a save blocks the loop),
    ``callbacks`` (other host work) and ``lost`` (after a resume, the work done again).

    ``goodput`` is ``step / total``. The ledger is saved with every checkpoint and continues
    from it; the time lost past the checkpoint is read from :data:`HEARTBEAT_FILE`. Only the
    outermost loop is measured. At its schedule it logs ``goodput_<bucket>`` (seconds),
    ``goodput_total`` and ``goodput``; with several processes also
    ``goodput_slowest_process``, ``goodput_slowest_step`` and ``goodput_straggler`` (the
    slowest process's step time over the median's).

    Args:
        steps: the steps between two entries of the ledger, when spread with ``**``.
        summary: print a one-line summary when the loop ends (on process 0).
        since: ``"process"``: count from the process's start (its imports and set-up are
            start-up); ``"now"``: from the ledger's creation (in a notebook, a test).

    Example:
        >>> import ciclo, numpy as np
        >>> ledger = ciclo.goodput(steps=2, since="now")
        >>> step = lambda state, batch: state + 1
        >>> _ = ciclo.loop(0, [np.ones(1)] * 5, {ciclo.every(1): step, **ledger})
        >>> report = ledger.report()
        >>> abs(sum(report[b] for b in ledger.buckets) - report["total"]) < 1e-6
        True
    """

    __loop_observer__ = True  # reads the loop only: runs once per fused group
    buckets = BUCKETS  #: the names of the buckets, in order

    def __init__(self, steps: int = 1000, *, summary: bool = False, since: str = "process") -> None:
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(MSG_BAD_STEPS.format(steps=steps))
        if not isinstance(summary, bool):
            raise TypeError(f"goodput(summary={summary!r}): expected True or False.")
        if since not in _SINCE:
            raise ValueError(MSG_BAD_SINCE.format(since=since))
        self.steps = steps
        self.summary = summary
        self.since = since
        now = _time.perf_counter()  # "process": its seconds count from the process's start
        self._start = now if since == "now" else now - max(0.0, _time.time() - process_start_time())
        self._restart(self._start)
        self._base = dict.fromkeys(BUCKETS, 0.0)  # the processes before this one (a resume)
        self._loaded: dict[str, float] | None = None  # the checkpoint's, on a resume
        self._used = False  # whether a loop ran with it (a later resume then restarts own)
        self._heartbeat: _Heartbeat | None = None
        self._failed = False  # whether an error ended the loop

    def _restart(self, start: float) -> None:
        """This process's own seconds count from ``start`` on (in ``startup`` until a loop
        owns a record of phases)."""
        self._since = start  # when the time outside a loop's record began
        self._outside = STARTUP  # where it goes: before the first loop, then between loops
        self._closed = dict.fromkeys(PHASE_NAMES, 0.0)  # the seconds of the loops ended
        self._phases: Phases | None = None  # the record of the loop it is in, or was in last
        self._in_loop = False

    # --- the figures ------------------------------------------------------------------------
    def _own(self) -> dict[str, float]:
        """This process's buckets (no ``lost``) and ``total``."""
        own = dict(self._closed)
        if self._in_loop and self._phases is not None:
            for phase, seconds in self._phases.totals().items():
                own[phase] = own.get(phase, 0.0) + seconds
        else:
            own[self._outside] += _time.perf_counter() - self._since
        own.pop("total", None)
        own["total"] = sum(own.values())
        return {
            "startup": own[STARTUP],
            "compile": own[COMPILE],
            "data": own[DATA],
            "step": own[STEP] + own[FIRST_STEP],
            "evaluation": own[EVALUATION],
            "checkpoint": own[CHECKPOINT],
            "callbacks": own[CALLBACKS],
            "total": own["total"],
        }

    def report(self) -> dict[str, float]:
        """The ledger now: ``total``, each bucket of :data:`BUCKETS` (seconds, adding up to
        ``total``), ``goodput`` (``step / total``), and for this process
        ``time_to_first_step`` (from its start to the end of its first step: after a resume,
        the restart's cost), ``first_step`` and ``first_step_compile`` (that step's
        seconds, and those spent compiling in it); the last three are ``nan`` before the
        first step.

        Example:
            >>> import ciclo
            >>> sorted(ciclo.goodput().report())[:3]
            ['callbacks', 'checkpoint', 'compile']
        """
        own = self._own()
        buckets = {b: self._base[b] + own.get(b, 0.0) for b in BUCKETS}
        total = sum(buckets.values())
        out = {"total": total, **buckets, "goodput": buckets["step"] / total if total else 0.0}
        first = None if self._phases is None else self._phases.first_step
        if first is None:
            first = (math.nan, math.nan, math.nan)
        out["first_step"], out["first_step_compile"] = first[0], first[1]
        out["time_to_first_step"] = first[2] - self._start
        return out

    def _logs(self) -> Logs:
        report, logs = self.report(), Logs()
        logs.add_metric("goodput", report["goodput"])
        logs.add_metric("goodput_total", report["total"])
        for bucket in BUCKETS:
            logs.add_metric(f"goodput_{bucket}", report[bucket])
        peers = None if self._phases is None else self._phases.peers
        if peers:
            slowest = max(range(len(peers)), key=peers.__getitem__)
            median = statistics.median(peers)
            logs.add_metric("goodput_slowest_process", float(slowest))
            logs.add_metric("goodput_slowest_step", peers[slowest])
            logs.add_metric("goodput_straggler", peers[slowest] / median if median > 0 else 1.0)
        return logs

    def summary_line(self) -> str:
        """The ledger in one line, as ``summary=True`` prints it at the loop's end."""
        r = self.report()
        parts = ", ".join(f"{b} {r[b]:.1f} s" for b in BUCKETS if b != "step")
        line = (
            f"ciclo.goodput: {100 * r['goodput']:.1f}% of {r['total']:.1f} s in steps "
            f"({r['step']:.1f} s); {parts}"
        )
        if not math.isnan(r["time_to_first_step"]):
            line += f"; first step after {r['time_to_first_step']:.1f} s"
        return line

    # --- a checkpoint holds the buckets ------------------------------------------------------
    checkpoint_key = "ledger"  #: saved as the checkpoint's ``ledger`` item (``_checkpoint/_items``)

    def state_dict(self) -> dict[str, Any]:
        """The buckets now (seconds, with ``total`` and ``step``, the loop's steps): saved
        with a checkpoint, so that a resumed run's ledger continues from them."""
        report = self.report()
        state: dict[str, Any] = {b: report[b] for b in BUCKETS}
        state["total"] = report["total"]
        state["steps"] = self._steps() if self._in_loop else -1
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """On a resume: the buckets of the processes before this one."""
        try:
            loaded = {b: float(state[b]) for b in (*BUCKETS, "total")}
        except (KeyError, TypeError, ValueError):
            raise ValueError(MSG_WRONG_STATE.format(state=dict(state))) from None
        if self._used:  # the same ledger resumed in the same process: its own time restarts
            self._restart(_time.perf_counter())
        self._base = {b: loaded[b] for b in BUCKETS}
        self._loaded = loaded

    # --- the loop ------------------------------------------------------------------------------
    def default_schedule(self) -> Schedule:
        """Spread with ``**`` into ``tasks``: every ``steps`` steps."""
        return every(self.steps)

    def __loop_callback__(self, loop_state: LoopState) -> Logs:
        return self._logs()

    def on_epoch_end(self, state: Any, batch: Any, elapsed: Elapsed, loop_state: LoopState) -> Logs:
        """In ``train_loop``'s ``callbacks=``: an entry at each epoch's end (nothing runs
        at the other steps)."""
        return self.__loop_callback__(loop_state)

    def __loop_phases__(self, loop_state: LoopState, phases: Phases | None) -> None:
        """When the steps begin: the work a resume redoes, and the heartbeat file; at the
        loop's end: the summary."""
        self._phases_of_loop(phases)
        if phases is None:
            if self._heartbeat is not None:
                # Ended by an error, the work since the last checkpoint is lost; else the
                # last checkpoint is the loop's end: a later run redoes nothing.
                self._heartbeat.stop(keep=self._failed)
                self._heartbeat = None
            if self.summary and writes_here(OUTPUT_PROCESS):
                print(self.summary_line(), file=sys.stderr, flush=True)
            return
        self._used, self._failed = True, False

    def checkpoint_at(self, directory: str, *, resumed: bool) -> None:
        """Told by the loop's checkpoint where it writes (at its first save, or when it
        was resumed from ``directory``): counts what a resume redid, and keeps the
        heartbeat file there."""
        if not writes_here(OUTPUT_PROCESS):
            return
        path = os.path.join(directory, HEARTBEAT_FILE)
        if resumed and self._loaded is not None:
            self._base["lost"] += _redone(path, self._loaded)
            self._loaded = None
        if self._heartbeat is None:
            self._heartbeat = _Heartbeat(path, self)

    def _phases_of_loop(self, phases: Phases | None) -> None:
        """Folds the time outside the loop's record into ``startup`` or ``callbacks`` when a
        loop begins, and the record's seconds into the ledger's when it ends."""
        if phases is not None:
            self._closed[self._outside] += phases.origin - self._since
            self._phases, self._in_loop = phases, True
        elif self._in_loop and self._phases is not None:
            totals = self._phases.totals()
            self._since = self._phases.origin + totals.pop("total")
            for phase, seconds in totals.items():
                self._closed[phase] += seconds
            self._outside, self._in_loop = CALLBACKS, False

    def _steps(self) -> int:
        """The steps of the loop it is in (its latest batch's, plus one)."""
        return 0 if self._phases is None else self._phases.number + 1

    def __loop_end__(self, loop_state: LoopState, error: BaseException | None) -> None:
        """Notes whether an error ended the loop (the summary waits for the checkpoint's
        last save)."""
        self._failed = error is not None


goodput = Goodput
"""Another name of :class:`Goodput` (the same class)."""


def _redone(path: str, loaded: Mapping[str, float]) -> float:
    """The seconds the interrupted process ran past the checkpoint the run resumed from
    (``loaded``: the ledger it holds), from the heartbeat file it kept; 0 when it has none
    or it is older."""
    try:
        with open(path) as file:
            note = json.load(file)
        total, steps = float(note["total"]), int(note["steps"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0.0
    if steps < loaded.get("steps", -1) or total <= loaded["total"]:
        return 0.0
    return total - loaded["total"]


class _Heartbeat:
    """Notes the ledger's ``total`` and the loop's step in ``path`` every
    :data:`HEARTBEAT_SECONDS`, from a thread (atomically: a kill leaves the previous note)."""

    def __init__(self, path: str, ledger: Goodput) -> None:
        self.path, self.ledger = path, ledger
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ciclo-goodput", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        temporary = f"{self.path}.{os.getpid()}.tmp"
        while not self._stopped.wait(HEARTBEAT_SECONDS):
            note = {"total": self.ledger.report()["total"], "steps": self.ledger._steps()}
            try:
                with open(temporary, "w") as file:
                    json.dump(note, file)
                os.replace(temporary, self.path)
            except OSError:
                pass  # a full disk: the ledger goes on, a resume then counts less as lost

    def stop(self, *, keep: bool) -> None:
        """Stops noting; removes the file unless ``keep``."""
        self._stopped.set()
        self._thread.join(timeout=5.0)
        if not keep:
            with contextlib.suppress(OSError):
                os.remove(self.path)
