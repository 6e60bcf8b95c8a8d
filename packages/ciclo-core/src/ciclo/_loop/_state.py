"""``LoopState``: what a loop knows at the current step, handed to callbacks."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .._records._history import History
from .._records._logs import Logs
from .._time._elapsed import Elapsed, default_batch_size
from ._callback import callback_name

if TYPE_CHECKING:
    from ._callback import Callback

__all__ = ["LoopState"]


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
        stop_iteration: set to ``True`` to end the loop after this step.
        stop_reason: why the loop stopped (set with ``stop_iteration``, e.g. ``"stopped by
            SIGTERM"``), or ``None``.
        batch_size_fn: ``batch -> int``, how the loop counts the samples of a batch.
        tasks: the running loop's tasks, normalised to ``[(Schedule, [Callback])]`` (read
            only; checkpoints reach the schedules and stateful callbacks through it).
        dataset: the dataset the loop iterates, as given to it.
        initial_elapsed: the count the loop started from (for a resumed loop: the count the
            interrupted loop had started from), so ``elapsed.steps -
            initial_elapsed.steps`` batches were drawn from ``dataset``.
        resumed: ``True`` when the loop continued a run from a checkpoint.
        evaluated: ``True`` once every evaluation set of ``train_loop`` has been evaluated
            in this loop (always ``True`` in other loops): from then on, a monitor missing
            from the logs at an epoch's end was never logged, not just not evaluated yet.
    """

    __slots__ = (
        "_step_end",
        "accumulated_logs",
        "batch",
        "batch_size_fn",
        "dataset",
        "elapsed",
        "evaluated",
        "history",
        "initial_elapsed",
        "logs",
        "metadata",
        "resumed",
        "state",
        "stop_iteration",
        "stop_reason",
        "tasks",
    )

    def __init__(
        self,
        state: Any,
        history: History,
        elapsed: Elapsed,
        metadata: Any = None,
        batch_size_fn: Callable[[Any], int] | None = None,
        *,
        tasks: Sequence[tuple[Any, list[Callback]]] = (),
        dataset: Any = None,
    ) -> None:
        self.state = state
        self.batch: Any = None
        self.history = history
        self.elapsed = elapsed
        self.logs = Logs()
        self.accumulated_logs = Logs()
        self.metadata = metadata
        self.stop_iteration = False
        self.stop_reason: str | None = None
        self.batch_size_fn: Callable[[Any], int] = batch_size_fn or default_batch_size
        self.tasks = list(tasks)
        self.dataset = dataset
        self.initial_elapsed = elapsed
        self.resumed = False
        self.evaluated = True
        self._step_end: list[Callable[[LoopState], None]] = []

    def at_step_end(self, fn: Callable[[LoopState], None]) -> None:
        """Runs ``fn(loop_state)`` once, when the current step is over: after every callback
        of the step ran and its logs were committed to history, with ``elapsed`` counting
        the step. A consistent end-of-step view, e.g. for a checkpoint."""
        if fn not in self._step_end:
            self._step_end.append(fn)

    def run_step_end(self) -> None:
        """Runs (and clears) what :meth:`at_step_end` queued; called by the loop."""
        hooks, self._step_end = self._step_end, []
        for fn in hooks:
            try:
                fn(self)
            except Exception as error:
                error.add_note(
                    f"(in ciclo step-end hook {callback_name(fn)} at step {self.elapsed.steps})"
                )
                raise

    def end_step(self) -> None:
        """Runs the step-end hooks (if any were queued), with ``elapsed`` counting the step
        just done; called by the loop once a step (or a group of fused steps) is complete."""
        if not self._step_end:  # the common case: nothing queued
            return
        before = self.elapsed
        self.elapsed = self.elapsed_after_step()
        try:
            self.run_step_end()
        finally:
            self.elapsed = before

    def elapsed_after_step(self) -> Elapsed:
        """The count once the current batch is done (``elapsed`` counts up to before it).

        Outside a step (in ``on_start`` / ``on_end``, where there is no batch) this is
        ``elapsed`` itself.
        """
        if self.batch is None:
            return self.elapsed
        return self.elapsed.update(self.batch_size_fn(self.batch))

    def steps_after_step(self) -> int:
        """``elapsed_after_step().steps``, without building an :class:`Elapsed`."""
        return self.elapsed.steps if self.batch is None else self.elapsed.steps + 1
