"""``LoopCallbackBase``: the convenience base of callback objects (spread into ``tasks``
with ``**``, called by hand in a loop of your own)."""

from __future__ import annotations

from typing import Any, ClassVar

from .._time._schedules import always
from ._by_hand import call_by_hand, called_by_hand
from ._state import LoopState

__all__ = ["LoopCallbackBase", "called_by_hand"]


class LoopCallbackBase:
    """Convenience base for callback objects: they can be spread into ``tasks`` with
    ``**`` (they map their default schedule to themselves), and called by hand in a loop
    of your own (see :meth:`__call__`).

    Example:
        >>> import ciclo
        >>> class Printer(ciclo.LoopCallbackBase):
        ...     def __loop_callback__(self, loop_state):
        ...         print(loop_state.elapsed.steps)
        >>> tasks = {**Printer()}  # {ciclo.always(): printer}
    """

    #: What a call by hand takes after ``elapsed``, in order; ``None``: ``("logs",)`` for
    #: an observer (bars, loggers), ``("state", "logs")`` otherwise (checkpoint, early
    #: stopping).
    by_hand_arguments: ClassVar[tuple[str, ...] | None] = None

    def default_schedule(self) -> Any:
        return always()

    def __loop_callback__(self, loop_state: LoopState) -> Any:
        raise NotImplementedError

    def __call__(self, elapsed: Any, *args: Any, **kwargs: Any) -> Any:
        """Runs the callback by hand, in a loop of your own, doing what it does in
        :func:`ciclo.loop` at a step where its schedule fires::

            for elapsed, batch in ciclo.elapse(dataset, stop=ciclo.at(total_steps)):
                logs, state = train_step(state, batch)
                if call_checkpoint(elapsed):
                    checkpoint(elapsed, state)     # saves the state
                keras_bar(elapsed, logs)           # one bar update; complete at total_steps

        ``elapsed`` is what :func:`ciclo.elapse` yields with the batch (the count before
        it); the call ends that batch's step, so a checkpoint is named after the steps its
        state holds (``elapsed.steps + 1``), as in a loop, and a bar reaches ``total``. Then
        come the arguments of :attr:`by_hand_arguments`, by position or by name:
        ``keras_bar(elapsed, logs)``, ``checkpoint(elapsed, state, logs=None)``,
        ``early_stopping(elapsed, state, logs)``; ``batch=`` counts its samples (for a bar
        in samples). Logs may be ``ciclo.logs()`` or a dict, as a step returns them. Each
        call is a loop of one step, ended: a checkpoint's files are written when it returns.

        Returns:
            ``(stop, state)`` for a callback that takes a state, else ``stop``: whether it
            asks to end the run (early stopping, ``terminate_on_nan``), and the state it
            leaves (early stopping's best weights at the end).
        """
        return call_by_hand(self, self.by_hand_arguments, elapsed, args, kwargs)

    def keys(self) -> list[Any]:
        if not hasattr(self, "_spread_schedule"):
            self._spread_schedule = self.default_schedule()
        return [self._spread_schedule]

    def __getitem__(self, key: Any) -> Any:
        if key is not getattr(self, "_spread_schedule", None):
            raise KeyError(key)
        return self
