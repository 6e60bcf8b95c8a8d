"""The callback contract: every hook a loop looks for on a callback, in one place.

A callback is a function taking the first 0-4 of ``(state, batch, elapsed, loop_state)``
(see :mod:`ciclo._loop._callback`), or an object implementing some of these hooks. The loop
never probes a callback with ``hasattr`` elsewhere: it asks the helpers of this module.

``__loop_callback__(loop_state)`` (:class:`LoopCallback`)
    What a loop calls at each step where the callback's schedule fires. It returns what a
    function callback returns: ``None``, logs, a state, ``(logs, state)`` or
    ``(outputs, logs, state)``, read by :func:`ciclo._loop._returns.parse_return`.

``__loop_end__(loop_state, error)`` (:class:`EndHook`)
    Called once when the loop ends, before ``on_end`` (``error`` is ``None``), or when an
    exception leaves the loop (``error`` is that exception, raised again afterwards). Looked
    up on the class of the callback object, or of the object behind a bound method
    (:func:`end_hook_owners`).

``__loop_restart__(loop_state) -> batches or None`` (:class:`RestartHook`)
    Called by the outermost loop each time the engine has returned (its data or ``stop``
    reached, or a callback's stop), before the end hooks, unless a signal stopped it: a
    callback that puts the loop back to an earlier point (a rollback) does so and returns
    the batches to run from there, and the engine runs again; ``None``: the loop ends.
    With several processes every process calls it at the same step. Looked up like
    ``__loop_end__`` (:func:`restart_hook_owners`).

``__loop_observer__ = True`` (:class:`Observer`, a class attribute)
    The callback only reads the loop (a progress bar, a logger) and returns nothing: inside a
    group of fused steps it runs once, after the group, instead of cutting it
    (:func:`is_observer`).

``__loop_steps_per_call__(loop_state) -> K`` and ``__loop_callback_many__(loop_state, batches)``
    (:class:`FusableCallback`)
    A step that can run ``K`` consecutive batches in one call (a managed step under a
    strategy with ``steps_per_call=K``); ``__loop_callback_many__`` returns the logs stacked
    along a new first axis and the last state (:func:`is_fusable`, :func:`steps_per_call`;
    the grouping lives in :mod:`ciclo._loop._fusion`).

``__loop_lower__(loop_state)`` (:class:`Lowerable`)
    A step that compiles its own call (a managed step, bound or not) gives that call on the
    loop's current state and batch, lowered and not run (a ``jax.stages.Lowered``): what
    ``throughput(flops_per_step=step)`` reads the FLOPs of a step from (:func:`lowered`).

``__loop_phases__(loop_state, phases)`` (:class:`PhaseWatcher`)
    A callback object that reads the loop's phases (the time ledger ``ciclo.goodput``, the
    watchdog): a loop with one owns a record of its phases (``loop_state.phases``,
    :mod:`ciclo._time._phases`), and calls this with the record when its first batch is
    about to be drawn (after a resume), and with ``None`` once the loop's end hooks have
    run (:func:`phase_watchers`).

``state_dict()`` / ``load_state_dict(state)`` (:class:`Stateful`)
    Callbacks (early stopping...), schedules and datasets that remember something expose
    it as plain Python values and NumPy arrays, so a checkpoint saves it and a resumed run
    restores it (:func:`as_stateful`).

``keys()`` / ``__getitem__`` (:class:`Spreadable`, implemented by
    :class:`~ciclo._loop._base.LoopCallbackBase`)
    A callback object may pose as the mapping ``{its default schedule: itself}``, so it can
    be spread into ``tasks`` with ``**`` (``{**ciclo.keras_bar(1000)}``).

Named hooks (``on_train_batch_end(state, batch, elapsed, loop_state)``, ...): a callback
object in ``callbacks=[...]`` of ``train_loop`` / ``test_loop`` / ``predict_loop`` defines
methods named after the moments of those loops (listed in :mod:`ciclo._loops._named`);
:func:`named_hooks` says which it has.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar, Protocol, runtime_checkable

from ._state import LoopState

__all__ = [
    "LoopCallback",
    "EndHook",
    "RestartHook",
    "Observer",
    "FusableCallback",
    "Stateful",
    "Lowerable",
    "Spreadable",
    "is_observer",
    "is_fusable",
    "steps_per_call",
    "end_hook_owners",
    "restart_hook_owners",
    "PhaseWatcher",
    "phase_watchers",
    "lowered",
    "as_stateful",
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


class Observer(Protocol):
    """A callback object whose class sets ``__loop_observer__ = True``: it only reads."""

    __loop_observer__: ClassVar[bool]


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


class Lowerable(Protocol):
    """A step that gives its compiled call on the loop's state and batch, lowered."""

    def __loop_lower__(self, loop_state: LoopState) -> Any: ...


class Spreadable(Protocol):
    """A callback object that can be spread into ``tasks``: ``{**obj}`` is
    ``{obj.default_schedule(): obj}``."""

    def keys(self) -> list[Any]: ...

    def __getitem__(self, key: Any) -> Any: ...


# --- the probes ---------------------------------------------------------------------------
def _owner(fn: Any) -> Any:
    """The object behind a bound method, or ``fn`` itself."""
    return getattr(fn, "__self__", fn)


def is_observer(fn: Any) -> bool:
    """Whether ``fn`` (or the object behind it, for a bound method) is an observer.

    Example:
        >>> import ciclo
        >>> is_observer(ciclo.keras_bar(10)), is_observer(print)
        (True, False)
    """
    return bool(getattr(_owner(fn), "__loop_observer__", False))


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


def end_hook_owners(fns: Iterable[Any]) -> list[EndHook]:
    """The distinct objects behind ``fns`` (themselves, or the objects of bound methods)
    whose class defines ``__loop_end__``, in order of appearance.

    Example:
        >>> class Run:
        ...     def step(self, state): ...
        ...     def __loop_end__(self, loop_state, error): ...
        >>> run = Run()
        >>> end_hook_owners([run.step, print, run]) == [run]
        True
    """
    found: dict[int, Any] = {}
    for fn in fns:
        for owner in (fn, getattr(fn, "__self__", None)):
            if owner is not None and callable(getattr(type(owner), "__loop_end__", None)):
                found.setdefault(id(owner), owner)
    return list(found.values())


def restart_hook_owners(fns: Iterable[Any]) -> list[RestartHook]:
    """The distinct objects behind ``fns`` whose class defines ``__loop_restart__``, in
    order of appearance (as :func:`end_hook_owners`).

    Example:
        >>> class Rollback:
        ...     def __loop_restart__(self, loop_state): ...
        >>> rollback = Rollback()
        >>> restart_hook_owners([print, rollback, rollback]) == [rollback]
        True
    """
    found: dict[int, Any] = {}
    for fn in fns:
        for owner in (fn, getattr(fn, "__self__", None)):
            if owner is not None and callable(getattr(type(owner), "__loop_restart__", None)):
                found.setdefault(id(owner), owner)
    return list(found.values())


def phase_watchers(fns: Iterable[Any]) -> list[PhaseWatcher]:
    """The distinct objects behind ``fns`` (themselves, or the objects of bound methods)
    whose class defines ``__loop_phases__``, in order of appearance.

    Example:
        >>> import ciclo
        >>> phase_watchers([ciclo.keras_bar(10), print])
        []
    """
    found: dict[int, Any] = {}
    for fn in fns:
        for owner in (fn, getattr(fn, "__self__", None)):
            if owner is not None and callable(getattr(type(owner), "__loop_phases__", None)):
                found.setdefault(id(owner), owner)
    return list(found.values())


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


def as_stateful(obj: Any) -> Stateful | None:
    """``obj`` typed as :class:`Stateful` when it is, else ``None``."""
    return obj if is_stateful(obj) else None


def named_hooks(obj: Any, names: Iterable[str]) -> list[str]:
    """Which of the methods ``names`` (named moments such as ``on_epoch_end``) ``obj`` has.

    Example:
        >>> class Report:
        ...     def on_epoch_end(self, state, batch, elapsed, loop_state): ...
        >>> named_hooks(Report(), ["on_train_begin", "on_epoch_end"])
        ['on_epoch_end']
    """
    return [name for name in names if callable(getattr(obj, name, None))]
