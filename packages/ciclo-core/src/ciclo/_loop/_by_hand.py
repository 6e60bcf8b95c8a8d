"""Running a callback object by hand, in a loop of your own: ``keras_bar(elapsed, logs)``,
``checkpoint(elapsed, state)``. Each call is a loop of one step, ended, on a
:class:`LoopState` the callback keeps between calls (see
:meth:`ciclo.LoopCallbackBase.__call__`)."""

from __future__ import annotations

import weakref
from typing import Any

from .._records._history import History
from .._records._logs import Logs
from .._time._elapsed import Elapsed, default_batch_size
from ._hooks import is_observer
from ._naming import describe
from ._returns import NO_CHANGE, as_logs, parse_return
from ._state import LoopState

__all__ = ["call_by_hand", "called_by_hand"]

#: The loop state of each callback object called by hand, kept between its calls (here, not
#: on the user's object), by ``id``; an entry goes with its object.
_LOOPS: dict[int, LoopState] = {}

#: The batch of a call by hand made without ``batch=``: one step, no samples.
_NO_BATCH: Any = type("NoBatch", (), {"__repr__": lambda self: "NO_BATCH"})()

_BAD_KEYWORD = "{who} called by hand takes (elapsed, {names}, batch=None); got {problem} {name!r}."
_NOT_ELAPSED_FIRST = (
    "{who} called by hand takes an Elapsed first (what ciclo.elapse yields), got {given}. "
    "Example: for elapsed, batch in ciclo.elapse(data): ...; callback(elapsed, {names})."
)


def call_by_hand(
    callback: Any, names: tuple[str, ...] | None, elapsed: Any, args: Any, kwargs: Any
) -> Any:
    """Runs ``callback.__loop_callback__`` as a loop does at a step where its schedule
    fires, on ``elapsed`` and the arguments ``names`` (``None``: ``("logs",)`` for an
    observer, ``("state", "logs")`` otherwise) given by position or by name; ``batch=``
    counts its samples. Returns ``(stop, state)`` when ``names`` holds ``"state"``, else
    ``stop``.

    Example:
        >>> import ciclo
        >>> class Stop(ciclo.LoopCallbackBase):
        ...     def __loop_callback__(self, loop_state):
        ...         loop_state.stop_iteration = True
        >>> call_by_hand(Stop(), None, 0, (None, {"loss": 1.0}), {})
        (True, None)
    """
    if names is None:
        names = ("logs",) if is_observer(callback) else ("state", "logs")
    who = type(callback).__name__
    if len(args) > len(names):
        raise TypeError(
            f"{who} called by hand takes (elapsed, {', '.join(names)}), got "
            f"{1 + len(args)} positional arguments."
        )
    given = dict(zip(names, args, strict=False))
    for name, value in kwargs.items():
        if name not in (*names, "batch") or name in given:
            problem = "a second value for" if name in given else "an unknown argument"
            raise TypeError(
                _BAD_KEYWORD.format(who=who, names=", ".join(names), problem=problem, name=name)
            )
        given[name] = value
    if isinstance(elapsed, int) and not isinstance(elapsed, bool):
        elapsed = Elapsed.create(steps=elapsed)
    if not isinstance(elapsed, Elapsed):
        raise TypeError(
            _NOT_ELAPSED_FIRST.format(who=who, given=describe(elapsed), names=", ".join(names))
        )
    batch = given.get("batch")
    loop_state = _LOOPS.get(id(callback))
    if loop_state is None:
        loop_state = _LOOPS[id(callback)] = LoopState(
            None,
            History(),
            elapsed,
            batch_size_fn=lambda b: 0 if b is _NO_BATCH else default_batch_size(b),
        )
        weakref.finalize(callback, _LOOPS.pop, id(callback), None)
    loop_state.history = History()  # this call's row only: nothing piles up
    loop_state.elapsed = elapsed
    loop_state.batch = _NO_BATCH if batch is None else batch
    loop_state.state = given.get("state")
    loop_state.stop_iteration, loop_state.stop_reason = False, None
    logs = given.get("logs")
    loop_state.logs = (
        Logs()
        if logs is None
        else as_logs(
            logs,
            lambda bad: (
                f"{who} called by hand: logs must be ciclo.logs() or a dict, got {describe(bad)}."
            ),
        )
    )
    out = callback.__loop_callback__(loop_state)
    _, state = parse_return(out, f"{who} (called by hand)")
    if state is not NO_CHANGE:
        loop_state.state = state
    loop_state.history.commit(elapsed, loop_state.logs)  # as a loop commits a step
    loop_state.remember(loop_state.logs)
    loop_state.end_step()
    if callable(getattr(type(callback), "__loop_end__", None)):  # the end of a one-step loop
        loop_state.elapsed, loop_state.batch = loop_state.elapsed_after_step(), None
        callback.__loop_end__(loop_state, None)
    if "state" in names:
        return loop_state.stop_iteration, loop_state.state
    return loop_state.stop_iteration


def called_by_hand(loop_state: LoopState) -> bool:
    """Whether ``loop_state`` is that of a callback called by hand (no loop around it).

    Example:
        >>> import ciclo
        >>> called_by_hand(ciclo.LoopState(None, ciclo.history(), ciclo.Elapsed.create()))
        False
    """
    return any(loop_state is kept for kept in _LOOPS.values())
