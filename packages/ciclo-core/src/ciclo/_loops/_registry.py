"""Which callbacks run under each named schedule of a predefined loop: ``tasks`` entries, then
``callbacks=[...]`` hook methods, then (step schedules only) the state's own step method.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .._loop._base import LoopCallbackBase
from .._loop._callback import check_not_a_class, positional_arity
from .._loop._hooks import LoopCallback, named_hooks
from .._loop._naming import callback_name
from .._loop._state import LoopState
from .._time._schedules import always
from ._named import NAMED_SCHEDULES, STATE_METHODS, NamedSchedule, named_schedule, owner

__all__ = ["Hook", "Registry", "check_no_hooks", "loop_tasks"]


class Hook:
    """An internal loop callback: ``fn(loop_state)``, named for error messages.

    Example:
        >>> hook = Hook("my hook", lambda loop_state: None)
        >>> hook.__qualname__
        'my hook'
    """

    def __init__(self, name: str, fn: Callable[[LoopState], Any]) -> None:
        self.fn = fn
        self.__qualname__ = name

    def __loop_callback__(self, loop_state: LoopState) -> Any:
        return self.fn(loop_state)


class _StateMethod:
    """Calls the *current* state's method, looked up on each call (the state is replaced)."""

    def __init__(self, method: str) -> None:
        self.method = method
        self.__qualname__ = f"state.{method}"
        self._arity: dict[type, int] = {}

    def __loop_callback__(self, loop_state: LoopState) -> Any:
        state = loop_state.state
        bound = getattr(state, self.method)
        arity = self._arity.get(type(state))
        if arity is None:
            arity = self._arity[type(state)] = positional_arity(bound)
            if arity > 3:
                msg = "a loop passes at most (batch, elapsed, loop_state)"
                raise TypeError(f"state.{self.method} takes {arity} arguments; {msg}.")
        return bound(*(loop_state.batch, loop_state.elapsed, loop_state)[:arity])


def _state_hook(state: Any, method: str) -> Any:
    """The state's step method: a managed step (a class-level loop callback) as it is."""
    attribute = getattr(type(state), method, None)
    return attribute if isinstance(attribute, LoopCallback) else _StateMethod(method)


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, list | tuple):
        return list(value)
    return [value]


def _overrides_default_schedule(obj: Any) -> bool:
    return (
        isinstance(obj, LoopCallbackBase)
        and type(obj).default_schedule is not LoopCallbackBase.default_schedule
    )


_STEP_SLOT = object()  # where the step schedule's callbacks go among ordinary tasks

_NO_HOOK = (
    "callback {} has no hook that {} calls ({}); give it a method of {}, "
    "or put it in tasks={{ciclo.every(100): callback}}."
)
_NO_STEP = "{0} has no {1}: give tasks={{ciclo.{2}: fn}} or a state with `{1}`."


class Registry:
    """The callbacks of one predefined loop, sorted by named schedule.

    Args:
        loop_name: ``"train_loop"``... (for error messages).
        names: the named schedules this loop runs.
        step_name: its step schedule (``"on_train_step"``...).
        state, tasks, callbacks: the loop's arguments.

    Attributes:
        named: named schedule -> callbacks.
        step_phase: ``(schedule, callbacks)`` of the step, in ``tasks`` order.

    Example:
        >>> import ciclo
        >>> registry = Registry(
        ...     "test_loop", ("on_test_step", "on_test_end"), "on_test_step", None,
        ...     {ciclo.on_test_step: print}, None,
        ... )
        >>> registry.named["on_test_step"]
        [<built-in function print>]
    """

    def __init__(
        self,
        loop_name: str,
        names: Sequence[str],
        step_name: str,
        state: Any,
        tasks: Mapping[Any, Any] | None,
        callbacks: Sequence[Any] | None,
    ) -> None:
        self.loop_name, self.names, self.step_name = loop_name, names, step_name
        self.named: dict[str, list[Any]] = {n: [] for n in names}
        self.step_phase: list[tuple[Any, Any]] = []
        self._add_tasks(tasks)
        self._add_objects(callbacks)
        for schedule_name, method in STATE_METHODS.items():
            if (
                schedule_name in self.named
                and not self.named[schedule_name]
                and named_hooks(state, [method])
            ):
                self.named[schedule_name].append(_state_hook(state, method))
        if self.named[step_name] and not any(s is _STEP_SLOT for s, _ in self.step_phase):
            self.step_phase.insert(0, (_STEP_SLOT, None))

    def _named(self, key: NamedSchedule | str) -> str:
        name = named_schedule(key).name
        if name not in self.named:
            moment = f"{NAMED_SCHEDULES[name]!r} is not a moment of {self.loop_name}"
            runs = f"{self.loop_name} runs {', '.join(self.names)}"
            raise ValueError(f"{moment}: it belongs to {owner(name)}; {runs}.")
        return name

    def _add_tasks(self, tasks: Mapping[Any, Any] | None) -> None:
        if tasks is None:
            return
        if not isinstance(tasks, Mapping):
            kind = type(tasks).__name__
            raise TypeError(f"{self.loop_name}: tasks must be a dict of schedules, got {kind}.")
        for key, callbacks in tasks.items():
            if isinstance(key, NamedSchedule | str):
                name = self._named(key)
                if name == self.step_name and not self.named[name]:
                    self.step_phase.append((_STEP_SLOT, None))
                self.named[name].extend(_as_list(callbacks))
            else:
                self.step_phase.append((key, callbacks))

    def _add_objects(self, callbacks: Sequence[Any] | None) -> None:
        if callbacks is None:
            return
        if not isinstance(callbacks, list | tuple):
            kind = type(callbacks).__name__
            raise TypeError(f"{self.loop_name}: callbacks must be a list, got {kind}.")
        for obj in callbacks:
            check_not_a_class(obj)
            hooks = named_hooks(obj, NAMED_SCHEDULES)
            used = [n for n in hooks if n in self.named]
            for name in used:
                self.named[name].append(getattr(obj, name))
            if used:
                continue
            if _overrides_default_schedule(obj):
                self.step_phase.append((obj.default_schedule(), obj))
                continue
            has = f"its hooks are {', '.join(hooks)}" if hooks else "it has no hook method"
            name, schedules = callback_name(obj), ", ".join(self.names)
            raise TypeError(_NO_HOOK.format(name, self.loop_name, has, schedules))

    def step_tasks(self) -> list[tuple[Any, list[Any]]]:
        """The step phase with the step schedule's callbacks in place."""
        return [
            (always(), self.named[self.step_name]) if s is _STEP_SLOT else (s, c)
            for s, c in self.step_phase
        ]

    def require_step(self, method: str) -> None:
        """Raises when the loop has nothing to run at its step."""
        if not self.step_phase:
            raise ValueError(_NO_STEP.format(self.loop_name, method, self.step_name))


def loop_tasks(*pairs: tuple[Any, Any]) -> dict[Any, Any]:
    """A tasks dict from ``(schedule, callbacks)`` pairs; empty ones skipped, repeats joined.

    Example:
        >>> import ciclo
        >>> every = ciclo.every(2)
        >>> loop_tasks((every, [print]), (ciclo.always(), []), (every, len))
        {every(steps=2): [<built-in function print>, <built-in function len>]}
    """
    out: dict[Any, Any] = {}
    for schedule, callbacks in pairs:
        if callbacks is None or (isinstance(callbacks, list) and not callbacks):
            continue
        if schedule in out:  # the same schedule object twice: run both, in order
            out[schedule] = [*_as_list(out[schedule]), *_as_list(callbacks)]
        else:
            out[schedule] = callbacks
    return out


def check_no_hooks(loop_name: str, loop_kwargs: Mapping[str, Any]) -> None:
    """Rejects ``on_start=`` / ``on_end=``: a predefined loop has named moments instead.

    Example:
        >>> check_no_hooks("test_loop", {"on_end": print})
        Traceback (most recent call last):
        ...
        TypeError: test_loop takes no on_end=; use tasks={ciclo.on_test_end: ...}.
    """
    for key, named in (("on_start", "begin"), ("on_end", "end")):
        if key in loop_kwargs:
            prefix = loop_name.split("_")[0]
            raise TypeError(
                f"{loop_name} takes no {key}=; use tasks={{ciclo.on_{prefix}_{named}: ...}}."
            )
