"""Callbacks that stop training: ``early_stopping`` and ``terminate_on_nan``."""

from __future__ import annotations

import difflib
import math
import sys
import time as _time
from collections.abc import Mapping, Sequence
from typing import IO, Any, Literal

import jax
import numpy as np

from .._checkpoint._rollback import StateProbe
from .._loop._base import LoopCallbackBase
from .._loop._state import LoopState, StopKind
from .._processes._agreement import gather_to_all
from .._processes._outputs import OUTPUT_PROCESS, writes_here
from .._records import _host
from .._records._logs import PARAMS_FINITE, Logs
from .._time._elapsed import Elapsed, Period, as_period
from .._time._periods import counted_fields, counts

__all__ = ["EarlyStopping", "early_stopping", "TerminateOnNaN", "terminate_on_nan"]

_MISSING: Any = object()

MSG_INTERRUPTED = (
    "early_stopping: {reason}. The run is interrupted, not finished: it keeps its current "
    "state (resume= continues it from a checkpoint); the best state so far, of {best}, is "
    "restored when training ends."
)
_MONITOR_NOT_LOGGED = (
    "early_stopping: monitor {monitor!r} is not in the logs; entries: {entries}.{hint} "
    "Evaluation entries carry the test name (e.g. 'loss_test'); check the spelling, or the "
    "step that should log it."
)


def _find(logs: Logs, key: str) -> Any:
    """The value of ``key`` in ``logs``, ``_MISSING`` when absent; ambiguity is an error."""
    try:
        return logs.entry_value(key)
    except KeyError as error:
        if "ambiguous" in str(error):
            raise
        return _MISSING


def _say(message: str, file: IO[str] | None, verbose: bool) -> None:
    if verbose:
        print(message, file=file if file is not None else sys.stdout, flush=True)


def _stop(
    loop_state: LoopState,
    reason: str,
    file: IO[str] | None,
    verbose: bool,
    *,
    kind: StopKind,
    same_everywhere: bool,
) -> None:
    loop_state.request_stop(reason, kind=kind, same_everywhere=same_everywhere)
    _say(reason, file, verbose)


def _since(now: Elapsed, then: Mapping[str, float]) -> Elapsed:
    return Elapsed(
        steps=int(now.steps - then["steps"]),
        samples=int(now.samples - then["samples"]),
        time=now.time - then["time"],
        date=now.date,
    )


def _copy_tree(tree: Any) -> Any:
    # A copy, so later steps that donate their input buffers cannot delete the best state.
    return jax.tree.map(lambda x: x.copy() if isinstance(x, jax.Array) else x, tree)


class EarlyStopping(LoopCallbackBase):
    """Stops training when ``monitor`` has not improved for ``patience``.

    In :func:`ciclo.train_loop` it checks at each epoch end, after the epoch's evaluation
    (so ``monitor="loss_test"`` sees the new evaluation); a check where the monitored
    entry was not produced (no evaluation this epoch) is skipped. The first value fetched
    at a check is the only device-to-host transfer it makes.

    Args:
        monitor: a log entry: ``"loss_test"``, ``"accuracy_test"``, or ``"coll.name"``.
        patience: how many checks without improvement stop training (an int, counted in
            evaluations), or a period (``ciclo.at(steps=2000)``) without improvement.
        min_delta: the least change that counts as an improvement: absolute, or relative
            to the best value with ``min_delta_mode="rel"`` (``0.01`` = 1%).
        mode: ``"min"`` (lower is better) or ``"max"``.
        baseline: a value to beat: patience runs until the monitored value beats it.
        restore_best_weights: at the end of training (stopped early or not), return the
            state of the best check. The whole state is restored (optimizer state
            included); it is kept as a copy on device.
        start_from: ignore checks before this count (an int in steps, or a period): a
            warm-up.
        min_delta_mode: ``"abs"`` or ``"rel"``.
        verbose: print why training stopped and which state is restored.
        file: where to print (stdout by default).

    It goes in ``callbacks=[...]``; its ``state_dict()`` / ``load_state_dict()`` (best
    value, patience counter, best state) are saved with checkpoints.

    Hooks: ``on_epoch_end`` (check, after the epoch's evaluation) and ``on_train_end``
    (restore the best state). In :func:`ciclo.loop`, call it under a schedule to check and
    pass ``on_end=stopper.on_train_end`` to restore.

    Attributes:
        best: the best monitored value so far (``None`` before the first check).
        best_step: the step label of the best check: the ``elapsed.steps`` of that moment,
            the ``steps`` of its row in the history and the CSV (the checkpoint saved
            there is ``best_step + 1``, the steps it holds).
        stopped_step: the step label of the check that stopped training, or ``None``.

    Example:
        >>> import ciclo
        >>> stopper = ciclo.early_stopping("accuracy_test", patience=3, mode="max")
        >>> stopper.improves(0.9, 0.8), stopper.improves(0.8, 0.9)
        (True, False)
    """

    def __init__(
        self,
        monitor: str,
        patience: int | Period,
        min_delta: float = 0.0,
        mode: Literal["min", "max"] = "min",
        baseline: float | None = None,
        restore_best_weights: bool = False,
        start_from: int | Period = 0,
        *,
        min_delta_mode: Literal["abs", "rel"] = "abs",
        verbose: bool = True,
        file: IO[str] | None = None,
    ) -> None:
        if not isinstance(monitor, str) or not monitor:
            raise TypeError(
                f"early_stopping: monitor must be the name of a log entry, e.g. "
                f"'loss_test' or 'metrics.accuracy_test', got {monitor!r}."
            )
        if mode not in ("min", "max"):
            raise ValueError(
                f"early_stopping: mode must be 'min' (lower is better, e.g. a loss) or 'max' "
                f"(e.g. an accuracy), got {mode!r}."
            )
        if min_delta_mode not in ("abs", "rel"):
            raise ValueError(
                f"early_stopping: min_delta_mode must be 'abs' (improve by min_delta) or "
                f"'rel' (improve by min_delta * |best|), got {min_delta_mode!r}."
            )
        if min_delta < 0:
            raise ValueError(f"early_stopping: min_delta must be >= 0, got {min_delta!r}.")
        if isinstance(patience, Period):
            counted_fields(patience, "early_stopping: a patience period")
        elif isinstance(patience, bool) or not isinstance(patience, int) or patience < 0:
            raise TypeError(
                f"early_stopping: patience must be a number of evaluations (an int >= 0) or a "
                f"period such as ciclo.at(steps=1000), got {patience!r}."
            )
        self.monitor, self.patience, self.mode = monitor, patience, mode
        self.min_delta, self.min_delta_mode = float(min_delta), min_delta_mode
        self.baseline = baseline
        self.restore_best_weights = restore_best_weights
        self.start_from = as_period(start_from, "start_from")
        self.verbose, self.file = verbose, file
        self.best: float | None = None
        self.best_step: int | None = None
        self.best_weights: Any = None
        self.wait = 0
        self.wait_since: dict[str, float] | None = None
        self.checks = 0
        self.stopped_step: int | None = None
        self.seen = False  # whether the monitored entry ever appeared

    # --- the rule ----------------------------------------------------------------------------
    def improves(self, value: float, reference: float | None) -> bool:
        """Whether ``value`` beats ``reference`` by more than ``min_delta``."""
        if math.isnan(value):
            return False
        if reference is None or math.isnan(reference):
            return True
        relative = self.min_delta_mode == "rel" and math.isfinite(reference)
        delta = self.min_delta * abs(reference) if relative else self.min_delta
        return value < reference - delta if self.mode == "min" else value > reference + delta

    def _patience_over(self, now: Elapsed) -> bool:
        if isinstance(self.patience, Period):
            assert self.wait_since is not None
            return _since(now, self.wait_since) >= self.patience
        return self.wait >= self.patience

    def _value(self, loop_state: LoopState, *, strict: bool) -> float | None:
        value = _find(loop_state.logs, self.monitor)
        if value is not _MISSING:
            self.seen = True
            return float(np.asarray(_host.to_host(value)))
        if self.seen or _find(loop_state.accumulated_logs, self.monitor) is not _MISSING:
            return None  # produced before, not at this step (no evaluation this time)
        # Missing and never seen: a misspelling, unless this step just had no evaluation
        # (evaluations rarer than epochs). An evaluation entry ends like the monitor
        # ("_test"); a monitor without a suffix is a training entry, logged every step.
        names = [n for _, n, _ in loop_state.logs.entries()]
        if "_" in self.monitor:
            suffix = "_" + self.monitor.rsplit("_", 1)[-1]
            expected = any(n.endswith(suffix) for n in names)
        else:
            expected = bool(names)
        close = difflib.get_close_matches(self.monitor.split(".")[-1], names, n=1, cutoff=0.8)
        if strict or expected or close:
            self._raise_missing(loop_state, close)
        return None

    def _raise_missing(self, loop_state: LoopState, close: list[str] | None = None) -> None:
        entries = {
            f"{c}.{n}"
            for logs in (loop_state.logs, loop_state.accumulated_logs)
            for c, n, _ in logs.entries()
        }
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise KeyError(
            _MONITOR_NOT_LOGGED.format(monitor=self.monitor, entries=sorted(entries), hint=hint)
        )

    def check(self, loop_state: LoopState, *, strict: bool = True) -> None:
        """Looks at the monitored value of this step and stops when patience is over.

        A missing value is an error when ``strict``; otherwise the check is skipped (in
        ``train_loop``, an epoch without an evaluation).
        """
        now = loop_state.elapsed_after_step()  # counts (start_from, a patience period)
        label = loop_state.elapsed.steps  # the step label of this check, as in the history
        if self.start_from is not None and not now >= self.start_from:
            return
        value = self._value(loop_state, strict=strict)
        if value is None:
            return
        self.checks += 1
        self.wait += 1
        if self.wait_since is None:
            self.wait_since = counts(now)
        if self.restore_best_weights and self.best_weights is None:
            self.best_weights = _copy_tree(loop_state.state)
        if self.improves(value, self.best):
            self.best, self.best_step = value, label
            if self.restore_best_weights:
                self.best_weights = _copy_tree(loop_state.state)
            if self.baseline is None or self.improves(value, self.baseline):
                self.wait, self.wait_since = 0, counts(now)
                return
        if self._patience_over(now):
            self.stopped_step = label
            patience = (
                f"{self.patience} evaluations"
                if isinstance(self.patience, int)
                else ", ".join(f"{v:g} {k}" for k, v in self.patience.fields().items())
            )
            baseline = "" if self.baseline is None else f", baseline {self.baseline:g}"
            best = "none" if self.best is None else f"{self.best:.6g} at step {self.best_step}"
            _stop(
                loop_state,
                f"early_stopping at step {label}: {self.monitor} has not improved by more "
                f"than {self.min_delta:g} for {patience} (last {value:.6g}, best "
                f"{best}{baseline}).",
                self.file,
                self.verbose,
                kind=StopKind.EARLY_STOPPING,
                same_everywhere=True,  # decided on the history, identical on every process
            )

    # --- hooks -------------------------------------------------------------------------------
    def __loop_callback__(self, loop_state: LoopState) -> None:
        self.check(loop_state)

    def on_epoch_end(self, state: Any, batch: Any, elapsed: Elapsed, loop_state: LoopState) -> None:
        # Until every evaluation set has run, a missing evaluation entry may not be due yet.
        self.check(loop_state, strict=loop_state.evaluated)

    def on_train_end(
        self, state: Any, batch: Any, elapsed: Elapsed, loop_state: LoopState
    ) -> tuple[None, Any] | None:
        """Returns the best state when ``restore_best_weights`` (stopped early or not).

        A run interrupted by a signal or a preemption notice has not finished: it keeps its
        current state, which its checkpoint saves and a resumed run continues from.
        """
        if not self.restore_best_weights or self.best_weights is None:
            return None
        if loop_state.stop_kind is StopKind.INTERRUPTED:
            reason = loop_state.stop_reason
            message = MSG_INTERRUPTED.format(reason=reason, best=self._best_text())
            _say(message, self.file, self.verbose)
            return None
        if self.best_step is None:  # every check was NaN: nothing is best
            _say(
                f"early_stopping: {self.monitor} was never a number (NaN at every check); "
                f"keeping the final state.",
                self.file,
                self.verbose,
            )
            return None
        restoring = f"early_stopping: restoring the state of {self._best_text()}."
        _say(restoring, self.file, self.verbose)
        return None, self.best_weights

    def _best_text(self) -> str:
        if self.best is None:
            return "no step (no check yet)"
        return f"step {self.best_step} ({self.monitor} = {self.best:.6g})"

    # --- saving ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint must keep: plain Python values, and the best state as a pytree."""
        return {
            "best": self.best,
            "best_step": self.best_step,
            "wait": self.wait,
            "wait_since": None if self.wait_since is None else dict(self.wait_since),
            "checks": self.checks,
            "stopped_step": self.stopped_step,
            "seen": self.seen,
            "best_weights": self.best_weights,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores what :meth:`state_dict` returned."""
        self.best = None if state["best"] is None else float(state["best"])
        self.best_step = state["best_step"]
        self.wait = int(state["wait"])
        self.wait_since = None if state["wait_since"] is None else dict(state["wait_since"])
        self.checks = int(state["checks"])
        self.stopped_step = state["stopped_step"]
        self.seen = bool(state.get("seen", self.best is not None))
        self.best_weights = state["best_weights"]


early_stopping = EarlyStopping
"""Another name of :class:`EarlyStopping` (the same class)."""


class TerminateOnNaN(LoopCallbackBase):
    """Stops training when a loss is NaN or infinite, or the parameters are.

    To keep steps free of device syncs it looks at the current step's values at most every
    ``interval`` seconds: a NaN that spreads to the parameters (the usual case) is caught
    within ``interval``. ``interval=0`` checks every step (one host transfer per step).
    Besides ``keys`` it reads ``params_finite``, which a managed train step logs, so a NaN
    that reaches the parameters but not the loss (NaN inputs through a ReLU) stops it too;
    for a plain step, ``state_every=N`` checks the state itself every N steps (a compiled
    reduction, read once ready or a step later). It prints one line when the run stops,
    naming the step and (with several processes) the process that saw the NaN.

    Args:
        keys: the entries to watch (``"loss"``, ``"metrics.accuracy"``); every loss by
            default.
        interval: seconds between checks.
        state_every: check the state for NaN or inf every that many steps (``None``: not).
        verbose: print why it stopped.
        file: where to print (stdout by default).

    Use it as ``callbacks=[ciclo.terminate_on_nan()]`` in :func:`ciclo.train_loop` (checked
    after each training step), or under a schedule in :func:`ciclo.loop`.

    Example:
        >>> import ciclo
        >>> ciclo.terminate_on_nan(interval=0).interval
        0
    """

    __loop_observer__ = True  # reads the loop only: runs once per fused group

    def __init__(
        self,
        keys: Sequence[str] | None = None,
        *,
        interval: float = 0.5,
        state_every: int | None = None,
        verbose: bool = True,
        file: IO[str] | None = None,
    ) -> None:
        if (
            isinstance(interval, bool)
            or not isinstance(interval, int | float)
            or not interval >= 0  # NaN too
        ):
            raise ValueError(f"terminate_on_nan(interval={interval!r}): expected seconds >= 0.")
        self.watch = None if keys is None else list(keys)
        self.interval = interval
        self.verbose, self.file = verbose, file
        self._probe = StateProbe("terminate_on_nan", state_every)
        self._last = -math.inf
        self._seen: str | None = None  # what this process saw, once it asked to stop

    def _watched(self, logs: Logs) -> dict[str, Any]:
        if self.watch is None:
            found = {f"losses.{n}": v for n, v in logs.get("losses", {}).items()}
        else:
            found = {k: v for k in self.watch if (v := _find(logs, k)) is not _MISSING}
        flag = logs.get(PARAMS_FINITE[0], {}).get(PARAMS_FINITE[1])
        return found if flag is None else {**found, "the parameters": flag}

    def check(self, loop_state: LoopState) -> None:
        """Checks this step's values when ``interval`` has passed since the last check."""
        fault = self._probe.fault(loop_state)  # at the same steps on every process
        if self._seen is not None:
            return  # asked to stop already: the loop stops within the agreement's steps
        bad = [] if fault is None else ["the state"]
        now = _time.monotonic()
        watched = self._watched(loop_state.logs) if now - self._last >= self.interval else {}
        if watched:
            self._last = now
            for key, value in _host.to_host(watched).items():
                value = np.asarray(value, float)
                if not (np.all(value) if key == "the parameters" else np.isfinite(value).all()):
                    bad.append(key)
        if bad:
            where = f" on process {jax.process_index()}" if jax.process_count() > 1 else ""
            step = loop_state.elapsed.steps if fault is None else fault[0]
            self._seen = f"NaN or inf in {', '.join(bad)} at step {step}{where}"
            reason = f"terminate_on_nan: {self._seen}"
            loop_state.request_stop(reason, kind=StopKind.NAN)  # agreed between processes

    def __loop_callback__(self, loop_state: LoopState) -> None:
        self.check(loop_state)

    def on_train_batch_end(
        self, state: Any, batch: Any, elapsed: Elapsed, loop_state: LoopState
    ) -> None:
        self.check(loop_state)

    def __loop_end__(self, loop_state: LoopState, error: BaseException | None) -> None:
        """Prints, once and on one process, what stopped the run (when it did stop)."""
        seen, self._seen = self._seen, None
        self._probe.reset()
        if error is not None or not loop_state.stop_iteration:
            return
        if jax.process_count() > 1:
            seen = next((s for s in gather_to_all("terminate_on_nan", seen) if s), None)
        if seen is not None and writes_here(OUTPUT_PROCESS):
            last = loop_state.elapsed.steps - 1
            _say(
                f"terminate_on_nan: {seen}; training stopped after step {last}.",
                self.file,
                self.verbose,
            )


terminate_on_nan = TerminateOnNaN
"""Another name of :class:`TerminateOnNaN` (the same class)."""
