"""``LoopState``: what a loop knows at the current step, handed to callbacks."""

from __future__ import annotations

import dataclasses
import enum
import warnings
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from .._records._history import History
from .._records._logs import Logs
from .._time._elapsed import Elapsed, Period, as_period, default_batch_size
from .._time._phases import Phases
from ._naming import callback_name

__all__ = [
    "DATA_ENDED",
    "ENDING_WORDS",
    "LoopInputs",
    "LoopState",
    "STOPPED_ENDINGS",
    "StopArbiter",
    "StopKind",
    "record_ending",
    "run_ending",
]


@dataclasses.dataclass
class LoopInputs:
    """What a loop was given that only saving, resuming and progress bars read: its tasks,
    normalised to ``[(Schedule, [Callback])]``, its dataset and its ``stop``, as given (a bar
    without a total reads the last two; ``stop`` ``None``: until the dataset ends).

    Example:
        >>> LoopInputs(tasks=[], dataset=[1, 2, 3]).dataset
        [1, 2, 3]
    """

    tasks: Sequence[tuple[Any, Sequence[Any]]] = ()
    dataset: Any = None
    stop: Any = None


class StopArbiter(Protocol):
    """Decides when a stop that one process requests takes effect (several processes: at
    one agreed step everywhere). ``None`` on a loop of one process: a stop is immediate."""

    def request(self, reason: str | None, kind: StopKind) -> None: ...

    def request_reason(self, reason: str | None) -> None: ...

    def elapsed_after(self, elapsed: Elapsed, batch_size: int) -> Elapsed: ...


class StopKind(enum.StrEnum):
    """What kind of stop ended a loop (``loop_state.request_stop(reason, kind=...)``): how
    the run ended is decided on the kind, never on the reason's text. A checkpoint records
    the kind of a finished run as its ending's ``reason`` (these values, as written before
    kinds existed), and a resumed run stays finished after ``CALLBACK``, ``EARLY_STOPPING``
    and ``NAN`` unless ``resume_stopped=True``.

    Example:
        >>> import ciclo
        >>> ciclo.StopKind("early_stopping") is ciclo.StopKind.EARLY_STOPPING
        True
    """

    CALLBACK = "callback"  #: a callback ended the run (the default of ``request_stop``)
    EARLY_STOPPING = "early_stopping"  #: ``early_stopping`` ended the run
    NAN = "nan"  #: ``terminate_on_nan``, or ``rollback_on_nan`` past its last rollback
    ROLLBACK = "rollback"  #: ``rollback_on_nan`` stopped the engine to roll back: not over
    INTERRUPTED = "interrupted"  #: a signal or a preemption notice: to resume, not finished


#: The kinds of stop that finish a run: a resumed run stays finished (see :class:`StopKind`).
STOPPED_ENDINGS = (StopKind.CALLBACK, StopKind.EARLY_STOPPING, StopKind.NAN)

#: What a run's ending says in messages.
ENDING_WORDS = {
    "stop": "its stop was reached",
    "data": "its data ran out",
    "early_stopping": "early stopping ended it",
    "nan": "the NaN guard (terminate_on_nan or rollback_on_nan) ended it",
    "callback": "a callback stopped it",
}


def run_ending(loop_state: LoopState, stop_reached: bool) -> dict[str, Any] | None:
    """Why and where a loop that went through its steps ended: ``{"reason", "step",
    "message"}``, where ``reason`` is ``"stop"`` (its ``stop`` was reached), ``"data"``
    (its dataset ran out first) or the :class:`StopKind` of a stop that finishes a run;
    ``None`` for a loop stopped by a signal (interrupted, not finished) or to roll back.

    Example:
        >>> import ciclo
        >>> loop_state = ciclo.LoopState(None, ciclo.history(), ciclo.Elapsed.create(steps=7))
        >>> run_ending(loop_state, stop_reached=True)["reason"]
        'stop'
        >>> loop_state.request_stop("stopped by SIGTERM", kind=ciclo.StopKind.INTERRUPTED)
        >>> run_ending(loop_state, stop_reached=False) is None
        True
    """
    if loop_state.stop_iteration:
        kind = loop_state.stop_kind
        if kind not in STOPPED_ENDINGS:
            return None
        reason = str(kind)
    else:
        reason = "stop" if stop_reached else "data"
    return {"reason": reason, "step": loop_state.elapsed.steps, "message": loop_state.stop_reason}


#: How the warning of a dataset that ended before ``stop`` begins.
DATA_ENDED = "ciclo: the dataset ended"
_DATA_ENDED_BEFORE_STOP = DATA_ENDED + (
    " after {drawn} batches (step {step}{skipped}), before stop={stop} was reached: the run "
    "ends here. Give more data (more epochs, a repeated dataset) or a smaller stop."
)


def record_ending(loop_state: LoopState, stop: int | Period | None) -> None:
    """Sets ``loop_state.ending`` when a loop's steps are over (``stop``: the loop's); warns
    once when a finite dataset ran out before ``stop`` was reached, naming both counts."""
    period = as_period(stop, "stop")
    reached = period is not None and period.reached_by(loop_state.elapsed)
    loop_state.ending = run_ending(loop_state, reached)
    ending = loop_state.ending
    if period is not None and ending is not None and ending["reason"] == "data":
        skipped = loop_state.skipped_batches
        drawn = loop_state.elapsed.steps - loop_state.initial_elapsed.steps + skipped
        of_them = f", {skipped} of them skipped by rollback_on_nan" if skipped else ""
        shown = (
            stop
            if isinstance(stop, int)
            else "ciclo.at({})".format(", ".join(f"{k}={v:g}" for k, v in period.fields().items()))
        )
        warnings.warn(
            _DATA_ENDED_BEFORE_STOP.format(
                drawn=drawn, step=loop_state.elapsed.steps, skipped=of_them, stop=shown
            ),
            RuntimeWarning,
            stacklevel=4,
        )


class LoopState:
    """What a loop knows at the current step; handed to callbacks that take 4 arguments
    and to objects implementing ``__loop_callback__``.

    Attributes:
        state: the current state.
        batch: the current batch.
        history: the :class:`History` being written.
        elapsed: the count before the current batch.
        logs: the logs produced at this step so far.
        accumulated_logs: the latest value of every entry seen in this loop.
        metadata: free-form data of the loop (e.g. which loop this is).
        stop_iteration: whether the loop ends after this step (``True``: a stop without
            a reason).
        stop_reason: why the loop stopped (e.g. ``"stopped by SIGTERM"``), or ``None``.
        stop_kind: the :class:`StopKind` of the stop, ``None`` while the loop runs.
        batch_size_fn: ``batch -> int``, how the loop counts this process's samples.
        initial_elapsed: the count the loop (or the run it resumed) started from.
        resumed: ``True`` when the loop continued a run from a checkpoint.
        skipped_batches: batches of the dataset rollbacks skipped (checkpoints save it).
        evaluated: ``True`` once every evaluation set of ``train_loop`` was evaluated.
        inputs: the loop's tasks and dataset (:class:`LoopInputs`), for checkpoints.
        ending: ``{"reason", "step", "message"}`` once its steps are over, kept by the
            last checkpoint so that a resumed finished run stays finished.
        phases: the record of the loop's phases while its batches run, when a callback
            reads one; ``None`` otherwise.
        finished: ``True`` when ``resume=`` found the run already finished.
    """

    __slots__ = (
        "_accumulated",
        "_arbiter",
        "_first_row",
        "_kind",
        "_reason",
        "_step_end",
        "_stop",
        "_wake_plan",
        "batch",
        "batch_size_fn",
        "elapsed",
        "ending",
        "evaluated",
        "finished",
        "history",
        "initial_elapsed",
        "inputs",
        "logs",
        "metadata",
        "phases",
        "resumed",
        "skipped_batches",
        "state",
    )

    def __init__(
        self,
        state: Any,
        history: History,
        elapsed: Elapsed,
        metadata: Any = None,
        batch_size_fn: Callable[[Any], int] | None = None,
        *,
        inputs: LoopInputs | None = None,
    ) -> None:
        self.state = state
        self.batch: Any = None
        self.history = history
        self.elapsed = elapsed
        self.logs = Logs()
        self.metadata = metadata
        self.batch_size_fn: Callable[[Any], int] = batch_size_fn or default_batch_size
        self.inputs = inputs if inputs is not None else LoopInputs()
        self.initial_elapsed = elapsed
        self.resumed = False
        self.skipped_batches = 0
        self.evaluated = True
        self.ending: dict[str, Any] | None = None
        self.finished = False
        self.phases: Phases | None = None
        self._stop = False
        self._reason: str | None = None
        self._kind: StopKind | None = None
        self._arbiter: StopArbiter | None = None
        self._accumulated = Logs()  # what came before this loop's rows (a resume's logs)
        self._first_row = len(history)  # this loop's first row of history
        self._step_end: list[Callable[[LoopState], None]] = []
        self._wake_plan: Callable[[], None] = lambda: None  # the engine's TaskPlan.wake

    # --- stopping --------------------------------------------------------------------------
    def request_stop(
        self,
        reason: str | None = None,
        *,
        kind: StopKind | str = StopKind.CALLBACK,
        same_everywhere: bool = False,
    ) -> None:
        """Asks the loop to end after the current step, for ``reason`` (kept as
        :attr:`stop_reason`); with several processes, all stop at one agreed step.

        Args:
            reason: why, for messages and :attr:`stop_reason`.
            kind: a :class:`StopKind` (a callback's stop by default).
            same_everywhere: every process makes this request at this step (the decision
                derives from identical counts or history): no agreement is needed.

        Example:
            >>> import ciclo
            >>> def stop_at_3(state, batch, elapsed, loop_state):
            ...     if elapsed.steps == 3:
            ...         loop_state.request_stop("enough")
            >>> _, _, elapsed = ciclo.loop(0, range(10), {ciclo.every(1): stop_at_3})
            >>> elapsed.steps
            4
        """
        try:
            kind = StopKind(kind)
        except ValueError:
            raise ValueError(
                f"request_stop(kind={kind!r}): expected a ciclo.StopKind, one of "
                f"{[str(k) for k in StopKind]}."
            ) from None
        if self._arbiter is not None and not same_everywhere:
            self._arbiter.request(reason, kind)
        elif reason is None:  # keeps the reason given before, and the kind of a stop made
            self.apply_stop(self._reason, self._kind if self._stop and self._kind else kind)
        else:
            self.apply_stop(reason, kind)

    def apply_stop(self, reason: str | None, kind: StopKind) -> None:
        """Ends the loop after this step, for ``reason``: a stop decided (or agreed between
        the processes), as opposed to one requested."""
        self._stop, self._reason, self._kind = True, reason, kind

    @property
    def stop_iteration(self) -> bool:
        return self._stop

    @stop_iteration.setter
    def stop_iteration(self, value: bool) -> None:
        if value:
            self.request_stop()
        else:
            self._stop, self._reason, self._kind = False, None, None

    @property
    def stop_kind(self) -> StopKind | None:
        return self._kind

    @property
    def stop_reason(self) -> str | None:
        return self._reason

    @stop_reason.setter
    def stop_reason(self, value: str | None) -> None:
        if self._arbiter is not None and not self._stop:
            self._arbiter.request_reason(value)
        else:
            self._reason = value

    # --- logs -------------------------------------------------------------------------------
    @property
    def accumulated_logs(self) -> Logs:
        """The latest value of every entry seen in this loop: read from the history's rows
        of this loop when asked (a step pays nothing for it)."""
        accumulated = Logs(self._accumulated)
        return accumulated.merge(self.history.latest_since(self._first_row))

    @accumulated_logs.setter
    def accumulated_logs(self, logs: Logs) -> None:
        self._accumulated, self._first_row = Logs(logs), len(self.history)

    def remember(self, logs: Logs) -> None:
        """Adds ``logs`` to :attr:`accumulated_logs` without a row of history."""
        self._accumulated.merge(logs)

    # --- the end of a step ------------------------------------------------------------------
    def at_step_end(self, fn: Callable[[LoopState], None]) -> None:
        """Runs ``fn(loop_state)`` once, when the current step is over: after every callback
        of the step ran and its logs were committed to history, with ``elapsed`` counting
        the step. A consistent end-of-step view, e.g. for a checkpoint."""
        if fn not in self._step_end:
            self._step_end.append(fn)

    def end_step(self) -> None:
        """Runs (and clears) the step-end hooks (if any were queued), with ``elapsed``
        counting the step just done; called by the loop once a step (or a group of fused
        steps) is complete."""
        if not self._step_end:  # the common case: nothing queued
            return
        before, hooks, self._step_end = self.elapsed, self._step_end, []
        self.elapsed = self.elapsed_after_step()
        try:
            for fn in hooks:
                try:
                    fn(self)
                except Exception as error:
                    step = self.elapsed.steps
                    error.add_note(f"(in ciclo step-end hook {callback_name(fn)} at step {step})")
                    raise
        finally:
            self.elapsed = before

    def elapsed_after_step(self) -> Elapsed:
        """The count once the current batch is done (``elapsed`` counts up to before it).

        Outside a step (in ``on_start`` / ``on_end``, where there is no batch) this is
        ``elapsed`` itself.
        """
        if self.batch is None:
            return self.elapsed
        if self._arbiter is not None:
            return self._arbiter.elapsed_after(self.elapsed, self.batch_size_fn(self.batch))
        return self.elapsed.update(self.batch_size_fn(self.batch))

    def steps_after_step(self) -> int:
        """``elapsed_after_step().steps``, without building an :class:`Elapsed`."""
        return self.elapsed.steps if self.batch is None else self.elapsed.steps + 1

    def arbitrate_stops(self, arbiter: StopArbiter | None) -> None:
        """Routes :meth:`request_stop` through ``arbiter`` (the agreement of several
        processes), or back to an immediate stop with ``None``."""
        self._arbiter = arbiter
