"""The callback contract: every hook a loop looks for on a callback, in one place.

A callback is a function taking the first 0-4 of ``(state, batch, elapsed, loop_state)``
(see :mod:`ciclo._loop._callback`), or an object implementing some of these hooks. The loop
never probes a callback elsewhere: it asks the helpers of this module. Hooks looked up on
an *object* are found on the callback itself or on the object behind a bound method
(:func:`owners`, :func:`hook_owners`), each object once.

The hooks (the table of ``docs/callbacks.md`` says what each one is):
``__loop_callback__(loop_state)`` (:class:`LoopCallback`), ``__loop_end__(loop_state,
error)`` (:class:`EndHook`), ``__loop_restart__(loop_state)`` (:class:`RestartHook`),
``__loop_phases__(loop_state, phases)`` (:class:`PhaseWatcher`), the class attributes
``__loop_observer__`` (:func:`is_observer`) and ``__loop_transient__``
(:func:`is_transient`), ``__loop_steps_per_call__`` with ``__loop_callback_many__``
(:class:`FusableCallback`), ``__loop_lower__`` (:func:`lowered`), ``state_dict`` /
``load_state_dict`` (:class:`Stateful`), and ``keys()`` / ``__getitem__`` (a callback
object poses as ``{its default schedule: itself}``, spread into ``tasks`` with ``**``).

Named hooks (``on_train_batch_end(state, batch, elapsed, loop_state)``, ...): a callback
object in ``callbacks=[...]`` of ``train_loop`` / ``test_loop`` / ``predict_loop`` defines
methods named after the moments of those loops (listed in :mod:`ciclo._loops._named`);
:func:`named_hooks` says which it has.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from ._state import LoopState

__all__ = [
    "LoopCallback",
    "EndHook",
    "RestartHook",
    "FusableCallback",
    "Stateful",
    "is_observer",
    "is_transient",
    "is_fusable",
    "steps_per_call",
    "owners",
    "hook_owners",
    "PhaseWatcher",
    "lowered",
    "is_stateful",
    "named_hooks",
]


@runtime_checkable
class LoopCallback(Protocol):
    """An object a loop can call: it gets the :class:`LoopState` and returns what a
    function callback may return (``None``, logs, a state, or a tuple)."""

    def __loop_callback__(self, loop_state: LoopState) -> Any: ...


class EndHook(Protocol):
    """A callback object told when its loop ends (``error`` is ``None`` on a normal end)."""

    def __loop_end__(self, loop_state: LoopState, error: BaseException | None) -> None: ...


class RestartHook(Protocol):
    """A callback object that can put a stopped loop back to an earlier point."""

    def __loop_restart__(self, loop_state: LoopState) -> Iterable[Any] | None: ...


class FusableCallback(LoopCallback, Protocol):
    """A step that may run several consecutive batches in one call."""

    def __loop_steps_per_call__(self, loop_state: LoopState) -> int: ...

    def __loop_callback_many__(self, loop_state: LoopState, batches: Sequence[Any]) -> Any: ...


class PhaseWatcher(Protocol):
    """Reads the loop's phases (see the module docstring)."""

    def __loop_phases__(self, loop_state: LoopState, phases: Any) -> None: ...


class Stateful(Protocol):
    """Something a checkpoint saves and restores: its state as plain values and arrays."""

    def state_dict(self) -> Mapping[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


# --- the probes ---------------------------------------------------------------------------
def is_observer(fn: Any) -> bool:
    """Whether ``fn`` (or the object behind it, for a bound method) is an observer.

    Example:
        >>> import ciclo
        >>> is_observer(ciclo.keras_bar(10)), is_observer(print)
        (True, False)
    """
    return any(getattr(owner, "__loop_observer__", False) for owner in owners([fn]))


def is_transient(fn: Any) -> bool:
    """Whether ``fn`` is a watcher outside the run (its bound methods are not: a
    checkpoint keeps the state of their tasks, as it always did).

    Example:
        >>> import ciclo
        >>> is_transient(ciclo.watchdog()), is_transient(print)
        (True, False)
    """
    return bool(getattr(fn, "__loop_transient__", False))


def is_fusable(fn: Any) -> bool:
    """Whether ``fn`` can run several steps in one call (``__loop_callback_many__``).

    Example:
        >>> is_fusable(lambda state: state)
        False
    """
    return hasattr(fn, "__loop_callback_many__")


def steps_per_call(fn: FusableCallback, loop_state: LoopState) -> int:
    """How many consecutive steps the fusable ``fn`` wants to run in one call."""
    return int(fn.__loop_steps_per_call__(loop_state))


def lowered(fn: Any, loop_state: LoopState) -> Any:
    """The call ``fn`` compiles for the loop's state and batch, lowered
    (``__loop_lower__``), or ``None`` when ``fn`` does not compile its own call.

    Example:
        >>> lowered(lambda state, batch: state, None) is None
        True
    """
    lower = getattr(fn, "__loop_lower__", None)
    return None if lower is None else lower(loop_state)


def owners(fns: Iterable[Any]) -> list[Any]:
    """The distinct objects behind ``fns`` (themselves, and the objects of bound methods),
    in order of appearance.

    Example:
        >>> class Run:
        ...     def step(self, state): ...
        >>> run = Run()
        >>> owners([run.step, run]) == [run.step, run]
        True
    """
    found: dict[int, Any] = {}
    for fn in fns:
        for owner in (fn, getattr(fn, "__self__", None)):
            if owner is not None:
                found.setdefault(id(owner), owner)
    return list(found.values())


def hook_owners(fns: Iterable[Any], hook: str) -> list[Any]:
    """The distinct objects behind ``fns`` whose class defines the method ``hook``
    (``"__loop_end__"``, ``"__loop_restart__"``, ``"__loop_phases__"``), in order.

    Example:
        >>> class Run:
        ...     def step(self, state): ...
        ...     def __loop_end__(self, loop_state, error): ...
        >>> run = Run()
        >>> hook_owners([run.step, print, run], "__loop_end__") == [run]
        True
    """
    return [o for o in owners(fns) if callable(getattr(type(o), hook, None))]


def is_stateful(obj: Any) -> bool:
    """Whether ``obj`` has callable ``state_dict`` and ``load_state_dict``.

    Example:
        >>> import ciclo
        >>> is_stateful(ciclo.every(2)), is_stateful(print)
        (True, False)
    """
    return callable(getattr(obj, "state_dict", None)) and callable(
        getattr(obj, "load_state_dict", None)
    )


def named_hooks(obj: Any, names: Iterable[str]) -> list[str]:
    """Which of the methods ``names`` (named moments such as ``on_epoch_end``) ``obj`` has.

    Example:
        >>> class Report:
        ...     def on_epoch_end(self, state, batch, elapsed, loop_state): ...
        >>> named_hooks(Report(), ["on_train_begin", "on_epoch_end"])
        ['on_epoch_end']
    """
    return [name for name in names if callable(getattr(obj, name, None))]
