"""The callback contract: every hook a loop looks for on a callback, in one place.

A callback is a function taking the first 0-4 of ``(state, batch, elapsed, loop_state)``
(see :mod:`ciclo._loop._callback`), or an object implementing some of these hooks. The loop
never probes a callback with ``hasattr`` elsewhere: it asks the helpers of this module.

``__loop_callback__(loop_state)`` (:class:`LoopCallback`)
    What a loop calls at each step where the callback's schedule fires. It returns what a
    function callback returns: ``None``, logs, a state, ``(logs, state)`` or
    ``(outputs, logs, state)``; logs are checked by :func:`as_logs`.

``__loop_end__(loop_state, error)`` (:class:`EndHook`)
    Called once when the loop ends, before ``on_end`` (``error`` is ``None``), or when an
    exception leaves the loop (``error`` is that exception, raised again afterwards). Looked
    up on the class of the callback object, or of the object behind a bound method
    (:func:`end_hook_owners`).

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

``state_dict()`` / ``load_state_dict(state)`` (:class:`Stateful`)
    Callbacks (early stopping...), schedules and datasets that remember something expose
    it as plain Python values and NumPy arrays, so a checkpoint saves it and a resumed run
    restores it (:func:`as_stateful`).

``keys()`` / ``__getitem__`` (:class:`Spreadable`, implemented by :class:`LoopCallbackBase`)
    A callback object may pose as the mapping ``{its default schedule: itself}``, so it can
    be spread into ``tasks`` with ``**`` (``{**ciclo.keras_bar(1000)}``).

In-place restore (:func:`register_restore_in_place`): a type whose objects a resumed loop
updates in place instead of replacing (mutable models captured by a step's closure).

Named hooks (``on_train_batch_end(state, batch, elapsed, loop_state)``, ...): a callback
object in ``callbacks=[...]`` of ``train_loop`` / ``test_loop`` / ``predict_loop`` defines
methods named after the moments of those loops (listed in :mod:`ciclo._loops._named`);
:func:`named_hooks` says which it has.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from .._records._logs import Logs

if TYPE_CHECKING:
    from ._state import LoopState

__all__ = [
    "LoopCallback",
    "EndHook",
    "Observer",
    "FusableCallback",
    "Stateful",
    "Spreadable",
    "LoopCallbackBase",
    "is_observer",
    "is_fusable",
    "steps_per_call",
    "end_hook_owners",
    "as_stateful",
    "is_stateful",
    "named_hooks",
    "as_logs",
    "describe",
    "register_restore_in_place",
    "restore_in_place",
]


@runtime_checkable
class LoopCallback(Protocol):
    """An object a loop can call: it gets the :class:`LoopState` and returns what a
    function callback may return (``None``, logs, a state, or a tuple)."""

    def __loop_callback__(self, loop_state: LoopState) -> Any: ...


class EndHook(Protocol):
    """A callback object told when its loop ends (``error`` is ``None`` on a normal end)."""

    def __loop_end__(self, loop_state: LoopState, error: BaseException | None) -> None: ...


class Observer(Protocol):
    """A callback object whose class sets ``__loop_observer__ = True``: it only reads."""

    __loop_observer__: ClassVar[bool]


class FusableCallback(LoopCallback, Protocol):
    """A step that may run several consecutive batches in one call."""

    def __loop_steps_per_call__(self, loop_state: LoopState) -> int: ...

    def __loop_callback_many__(self, loop_state: LoopState, batches: Sequence[Any]) -> Any: ...


class Stateful(Protocol):
    """Something a checkpoint saves and restores: its state as plain values and arrays."""

    def state_dict(self) -> Mapping[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


class Spreadable(Protocol):
    """A callback object that can be spread into ``tasks``: ``{**obj}`` is
    ``{obj.default_schedule(): obj}``."""

    def keys(self) -> list[Any]: ...

    def __getitem__(self, key: Any) -> Any: ...


class LoopCallbackBase:
    """Convenience base for callback objects: they can be spread into ``tasks`` with
    ``**`` (they map their default schedule to themselves).

    Example:
        >>> import ciclo
        >>> class Printer(ciclo.LoopCallbackBase):
        ...     def __loop_callback__(self, loop_state):
        ...         print(loop_state.elapsed.steps)
        >>> tasks = {**Printer()}  # {ciclo.always(): printer}
    """

    def default_schedule(self) -> Any:
        from .._time._schedules import always

        return always()

    def __loop_callback__(self, loop_state: LoopState) -> Any:
        raise NotImplementedError

    def keys(self) -> list[Any]:
        if not hasattr(self, "_spread_schedule"):
            self._spread_schedule = self.default_schedule()
        return [self._spread_schedule]

    def __getitem__(self, key: Any) -> Any:
        if key is not getattr(self, "_spread_schedule", None):
            raise KeyError(key)
        return self


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


# --- what a step returns ------------------------------------------------------------------
def as_logs(value: Any, not_logs: Callable[[Any], str]) -> Logs:
    """``value`` as :class:`Logs`: a ``Logs`` as is, a dict ``{collection: {name: value}}``
    converted; anything else raises ``TypeError(not_logs(value))``. The one check of what
    callbacks and managed steps return as logs.

    Example:
        >>> as_logs({"metrics": {"accuracy": 1.0}}, lambda v: "not logs")
        {'metrics': {'accuracy': 1.0}}
        >>> as_logs(0.5, lambda v: f"not logs: {describe(v)}")
        Traceback (most recent call last):
        TypeError: not logs: float 0.5
    """
    if isinstance(value, Logs):
        return value
    if isinstance(value, Mapping) and all(isinstance(v, Mapping) for v in value.values()):
        return Logs(value)
    raise TypeError(not_logs(value))


def describe(value: Any) -> str:
    """A short description of a value for error messages."""
    if isinstance(value, Mapping):
        return f"a dict with keys {list(value)[:5]}"
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}"


# --- restoring objects in place -----------------------------------------------------------
#: ``restore_into(original, restored)``: copies the restored values into ``original``.
RestoreInto = Callable[[Any, Any], None]

_IN_PLACE: dict[type, RestoreInto] = {}
_IN_PLACE_ENTRY_POINTS = "ciclo.restore_in_place"
_in_place_loaded: set[str] = set()  # the entry points already run


def register_restore_in_place(node_type: type, restore_into: RestoreInto) -> None:
    """Declares that the objects of ``node_type`` in a loop's state are restored *in place*
    when the loop resumes (``loop(..., resume=...)``): ``restore_into(original, restored)``
    copies the checkpoint's values into the object the state held, and the state keeps that
    object, so code that holds it too (a step closing over a mutable model and optimizer,
    as the Flax NNX tutorial's steps do) sees the restored values.

    Adapters register their framework's mutable objects (``ciclo_flax`` registers
    ``nnx.Module`` and ``nnx.Optimizer`` with ``nnx.update``, on import and through the
    ``ciclo.restore_in_place`` entry-point group, whose functions core runs before a loop
    first resumes). Every other value of the state is replaced by the restored one.

    Args:
        node_type: a pytree node class (subclasses match too).
        restore_into: ``(original, restored) -> None``.

    Example:
        >>> import ciclo, jax, numpy as np
        >>> class Box:  # a mutable pytree node
        ...     def __init__(self, value):
        ...         self.value = value
        >>> jax.tree_util.register_pytree_node(
        ...     Box, lambda b: ((b.value,), None), lambda _, children: Box(children[0])
        ... )
        >>> def copy_into(original, restored):
        ...     original.value = restored.value
        >>> ciclo.adapters.register_restore_in_place(Box, copy_into)
        >>> box = Box(np.zeros(2))
        >>> state = restore_in_place({"box": box, "n": 0}, {"box": Box(np.ones(2)), "n": 3})
        >>> state["box"] is box, box.value.tolist(), state["n"]
        (True, [1.0, 1.0], 3)
    """
    if not isinstance(node_type, type):
        raise TypeError(
            f"register_restore_in_place(node_type, restore_into): node_type must be a class, "
            f"got {node_type!r}."
        )
    if not callable(restore_into):
        raise TypeError(
            f"register_restore_in_place({node_type.__name__}, restore_into): restore_into "
            f"must be a function (original, restored) -> None, got {restore_into!r}."
        )
    _IN_PLACE[node_type] = restore_into


def _load_in_place_entry_points() -> None:
    """Runs the registrations installed adapters declare under the
    ``ciclo.restore_in_place`` entry-point group, each once, for the frameworks already
    imported (the entry point's name; a state cannot hold objects of another). A broken one
    is a warning."""
    import sys
    import warnings
    from importlib.metadata import entry_points

    for entry in entry_points(group=_IN_PLACE_ENTRY_POINTS):
        if entry.name in _in_place_loaded or entry.name not in sys.modules:
            continue
        _in_place_loaded.add(entry.name)
        try:
            entry.load()()
        except Exception as error:
            warnings.warn(
                f"ciclo: the in-place restore {entry.name!r} ({entry.value}) failed: "
                f"{error!r}; objects it registers are replaced on resume, not updated.",
                RuntimeWarning,
                stacklevel=3,
            )


def _restorer(node: Any) -> RestoreInto | None:
    for node_type, restore_into in _IN_PLACE.items():
        if isinstance(node, node_type):
            return restore_into
    return None


def restore_in_place(original: Any, restored: Any) -> Any:
    """``restored`` (a state read from a checkpoint in the structure of ``original``), in
    which every object of a type registered with :func:`register_restore_in_place` is the
    object of ``original``, updated in place with its restored values."""
    _load_in_place_entry_points()
    if not _IN_PLACE:
        return restored
    import jax

    def is_leaf(node: Any) -> bool:
        return _restorer(node) is not None

    originals, treedef = jax.tree_util.tree_flatten(original, is_leaf=is_leaf)
    if not any(is_leaf(node) for node in originals):
        return restored
    news, new_treedef = jax.tree_util.tree_flatten(restored, is_leaf=is_leaf)
    if new_treedef != treedef:  # type: ignore[operator]
        return restored
    leaves = []
    for old, new in zip(originals, news, strict=True):
        restore_into = _restorer(old)
        if restore_into is not None and type(new) is type(old):
            restore_into(old, new)
            leaves.append(old)
        else:
            leaves.append(new)
    return jax.tree_util.tree_unflatten(treedef, leaves)
