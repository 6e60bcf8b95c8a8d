"""The callback convention: what a loop calls, with which arguments, and what it may return.

The hooks a callback object may implement are defined in :mod:`ciclo._loop._hooks`; this
module wraps a function or object as a :class:`Callback` that a loop calls.
"""

from __future__ import annotations

import functools
import inspect
import sys
import time
from collections.abc import Callable
from typing import Any

from .._records._logs import Logs
from ._hooks import LoopCallback, is_fusable, is_observer
from ._naming import callback_name, count_positional
from ._returns import NO_CHANGE, parse_return
from ._state import LoopState

__all__ = [
    "Callback",
    "LoopInterrupted",
    "positional_arity",
    "check_single_argument",
    "is_periodic_action",
    "inject",
    "as_callback",
    "check_not_a_class",
    "NO_CHANGE",
]

MSG_A_CLASS = (
    "callback {name} is a class, not a callback: make one and pass it, {spelled}(...), "
    "not {spelled} itself."
)

#: Not callbacks' arguments: a callback with one parameter of these names is a mistake.
_NOT_THE_STATE = {
    "elapsed": "schedules take an Elapsed, callbacks take (state, batch, elapsed, ...)",
    "batch": "the batch is the second argument",
    "loop_state": "the LoopState is the fourth argument",
}
_TOO_MANY_ARGUMENTS = (
    "callback {name}{signature} needs {required} positional arguments, but a loop passes at "
    "most 4: the first 0-4 of (state, batch, elapsed, loop_state). Example: def "
    "{function}(state, batch, elapsed, loop_state): ..."
)
_KEYWORD_ONLY_ARGUMENTS = (
    "callback {name}{signature} needs keyword-only arguments {keyword_only}, but a loop passes "
    "only positional ones: the first 0-4 of (state, batch, elapsed, loop_state). Give them "
    "defaults or bind them with functools.partial."
)
_ONE_ARGUMENT_NOT_THE_STATE = (
    "callback {name}({arg}) takes one argument named {arg!r}, but a loop passes the first "
    "0-4 of (state, batch, elapsed, loop_state) by position: a one-argument callback gets the "
    "state ({reason}). Take the arguments up to it: def {function}({fix}): ..."
)
_NOT_A_CALLBACK = (
    "{fn!r} is not a callback: give a function taking the first 0-4 of (state, batch, "
    "elapsed, loop_state), or an object with a __loop_callback__(loop_state) method."
)


class LoopInterrupted(Exception):
    """Raised by a loop run inside a callback of another loop (an evaluation inside a
    training loop) when a stop signal of the outer loop cut it short: its result would be
    partial. A :class:`Callback` that raises it returns nothing (the partial result is not
    recorded), and the outer loop stops after the current step.

    Args:
        reason: why (``"stopped by SIGTERM"``).
        then: what follows, for the loop's stop message (``"; a resumed run ..."``).
    """

    def __init__(self, reason: str, then: str = "") -> None:
        super().__init__(reason)
        self.reason, self.then = reason, then


def positional_arity(fn: Callable[..., Any]) -> int:
    """How many of ``(state, batch, elapsed, loop_state)`` a loop passes to ``fn``: its
    positional parameters (4 with ``*args``); raises ``TypeError`` for what a loop cannot
    call (more than 4 required, required keyword-only arguments).

    Example:
        >>> positional_arity(lambda state, batch: None)
        2
    """
    name = callback_name(fn)
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        raise TypeError(
            f"cannot read the signature of callback {name}; wrap it in a def taking the first "
            f"0-4 of (state, batch, elapsed, loop_state)."
        ) from None
    params = [
        p
        for p in signature.parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    required = [p for p in params if p.default is p.empty]
    if len(required) > 4:
        raise TypeError(
            _TOO_MANY_ARGUMENTS.format(
                name=name,
                signature=signature,
                required=len(required),
                function=getattr(fn, "__name__", "callback"),
            )
        )
    keyword_only = [
        p.name
        for p in signature.parameters.values()
        if p.kind is p.KEYWORD_ONLY and p.default is p.empty
    ]
    if keyword_only:
        raise TypeError(
            _KEYWORD_ONLY_ARGUMENTS.format(
                name=name, signature=signature, keyword_only=keyword_only
            )
        )
    return count_positional(fn, 4) or 0


def check_not_a_class(obj: Any) -> None:
    """Raises ``TypeError`` for a callback class given where a callback goes (the class
    ``ciclo.keras_bar`` instead of ``ciclo.keras_bar(1000)``): its hooks are unbound.

    Example:
        >>> class Bar:
        ...     def __loop_callback__(self, loop_state): ...
        >>> check_not_a_class(Bar)
        Traceback (most recent call last):
        TypeError: callback Bar is a class, not a callback: make one and pass it, Bar(...), ...
    """
    if not isinstance(obj, type):
        return
    module = sys.modules.get(obj.__module__)
    aliases = [n for n, v in vars(module).items() if v is obj and n.islower()] if module else []
    spelled = aliases[0] if aliases else obj.__name__  # keras_bar for KerasBar
    raise TypeError(MSG_A_CLASS.format(name=obj.__name__, spelled=spelled))


def check_single_argument(fn: Callable[..., Any]) -> None:
    """Raises ``TypeError`` for a one-argument callback whose parameter is named
    ``elapsed``, ``batch`` or ``loop_state``: a loop passes it the state.

    Example:
        >>> check_single_argument(lambda elapsed: None)
        Traceback (most recent call last):
        TypeError: callback <lambda>(elapsed) takes one argument named 'elapsed', ...
    """
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return
    if len(params) != 1 or params[0].kind not in (
        params[0].POSITIONAL_ONLY,
        params[0].POSITIONAL_OR_KEYWORD,
    ):
        return
    arg = params[0].name
    if arg in _NOT_THE_STATE:
        wanted = ("state", "batch", "elapsed", "loop_state")
        fix = ", ".join(wanted[: wanted.index(arg) + 1])
        raise TypeError(
            _ONE_ARGUMENT_NOT_THE_STATE.format(
                name=callback_name(fn),
                arg=arg,
                reason=_NOT_THE_STATE[arg],
                function=getattr(fn, "__name__", "callback"),
                fix=fix,
            )
        )


def inject(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` callable with all of ``(state, batch, elapsed, loop_state)``: the wrapper
    passes the first arguments ``fn`` takes, as a loop calls a callback (the original
    ciclo's ``ciclo.inject``).

    Example:
        >>> import ciclo
        >>> ciclo.inject(lambda state, batch: state + batch)(1, 2, "elapsed", "loop_state")
        3
    """
    arity = positional_arity(fn)

    @functools.wraps(fn)
    def call(*args: Any) -> Any:
        return fn(*args[:arity])

    return call


def is_periodic_action(fn: Any) -> bool:
    """Whether ``fn`` is a ``clu.periodic_actions.PeriodicAction`` (recognised by its
    class, so clu is never imported).

    Example:
        >>> is_periodic_action(print)
        False
    """
    return any(
        klass.__name__ == "PeriodicAction" and klass.__module__ == "clu.periodic_actions"
        for klass in type(fn).__mro__
    )


def _periodic_action_call(action: Any) -> Callable[[LoopState], None]:
    """Calls a clu action as clu expects, ``action(step, t)``: ``step`` the steps done
    (this one included), ``t`` ``time.monotonic()`` (clu's clock)."""

    def call(loop_state: LoopState) -> None:
        action(loop_state.steps_after_step(), t=time.monotonic())

    return call


class Callback:
    """A callback ready to run: the user's function or object, called with the right
    arguments, its result validated and normalised to ``(logs, state)``.

    Attributes:
        fn: the user's function or object.
        name: its name, for error messages.
        arity: how many of ``(state, batch, elapsed, loop_state)`` it takes; ``-1`` for an
            object called through ``__loop_callback__(loop_state)``.
        observer: it only reads the loop (see :func:`~ciclo._loop._hooks.is_observer`).
        fusable: it may run several steps in one call (see
            :func:`~ciclo._loop._hooks.is_fusable`).
        fresh_logs: the logs it returns are new objects at each call (a compiled function
            or a managed step), which a loop may keep without copying.
    """

    __slots__ = ("arity", "fn", "fresh_logs", "fusable", "method", "name", "observer")

    def __init__(self, fn: Any) -> None:
        self.method: Callable[..., Any]
        self.fn = fn
        self.name = callback_name(fn)
        self.observer = is_observer(fn)
        self.fusable = is_fusable(fn)
        self.fresh_logs = self.fusable or _is_compiled(fn)
        if isinstance(fn, type) and isinstance(fn, LoopCallback):
            check_not_a_class(fn)
        if is_periodic_action(fn):
            self.method = _periodic_action_call(fn)
            self.arity = -1
        elif isinstance(fn, LoopCallback):
            self.method = fn.__loop_callback__
            self.arity = -1
        elif callable(fn):
            self.method = fn
            self.arity = positional_arity(fn)
            if self.arity == 1:
                check_single_argument(fn)
        else:
            raise TypeError(_NOT_A_CALLBACK.format(fn=fn))

    def __call__(self, loop_state: LoopState) -> tuple[Logs | None, Any]:
        try:
            out = self.call(loop_state)
        except LoopInterrupted as cut:
            return self.cut_short(loop_state, cut)
        return self.result(out)

    def call(self, loop_state: LoopState) -> Any:
        """What it returns, given the first ``arity`` of the loop's four arguments."""
        arity = self.arity
        if arity == 2:  # the common (state, batch) step
            return self.method(loop_state.state, loop_state.batch)
        if arity < 0:
            return self.method(loop_state)
        args = (loop_state.state, loop_state.batch, loop_state.elapsed, loop_state)
        return self.method(*args[:arity])

    def cut_short(self, loop_state: LoopState, cut: LoopInterrupted) -> tuple[None, Any]:
        """An outer loop's stop cut it (``cut``): nothing recorded, the reason says so."""
        loop_state.stop_reason = (
            f"{cut.reason}; {self.name} at step {loop_state.elapsed.steps} ended at its next "
            f"batch and is not recorded{cut.then}"
        )
        return None, NO_CHANGE

    def result(self, out: Any) -> tuple[Logs | None, Any]:
        """Its return value as ``(logs or None, state or NO_CHANGE)`` (``parse_return``)."""
        if type(out) is tuple and len(out) == 2:  # (logs, state): the common case, checked
            logs, state = out
            if logs is None or type(logs) is Logs:
                return logs, (NO_CHANGE if state is None else state)
        return parse_return(out, f"callback {self.name}")


def _is_compiled(fn: Any) -> bool:
    """Whether ``fn`` is a ``jax.jit``-compiled function (whose outputs are always new)."""
    return callable(getattr(fn, "lower", None)) and callable(getattr(fn, "trace", None))


def as_callback(fn: Any) -> Callback:
    """Wraps a function or a ``__loop_callback__`` object as a :class:`Callback`."""
    return fn if isinstance(fn, Callback) else Callback(fn)
