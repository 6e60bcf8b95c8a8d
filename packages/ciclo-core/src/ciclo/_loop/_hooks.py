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

``__loop_lower__(loop_state)`` (:class:`Lowerable`)
    A step that compiles its own call (a managed step, bound or not) gives that call on the
    loop's current state and batch, lowered and not run (a ``jax.stages.Lowered``): what
    ``throughput(flops_per_step=step)`` reads the FLOPs of a step from (:func:`lowered`).

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
    "Lowerable",
    "Spreadable",
    "LoopCallbackBase",
    "is_observer",
    "is_fusable",
    "steps_per_call",
    "end_hook_owners",
    "lowered",
    "as_stateful",
    "is_stateful",
    "named_hooks",
    "as_logs",
    "is_logs",
    "parse_return",
    "describe",
    "register_restore_in_place",
    "restore_in_place",
    "COLLECTIONS",
    "NO_CHANGE",
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


class Lowerable(Protocol):
    """A step that gives its compiled call on the loop's state and batch, lowered."""

    def __loop_lower__(self, loop_state: LoopState) -> Any: ...


class Spreadable(Protocol):
    """A callback object that can be spread into ``tasks``: ``{**obj}`` is
    ``{obj.default_schedule(): obj}``."""

    def keys(self) -> list[Any]: ...

    def __getitem__(self, key: Any) -> Any: ...


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
        from .._time._schedules import always

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
        from .._records._history import History
        from .._time._elapsed import Elapsed, default_batch_size
        from ._state import LoopState

        names = self.by_hand_arguments
        if names is None:
            names = ("logs",) if is_observer(self) else ("state", "logs")
        who = type(self).__name__
        if len(args) > len(names):
            raise TypeError(
                f"{who} called by hand takes (elapsed, {', '.join(names)}), got "
                f"{1 + len(args)} positional arguments."
            )
        given = dict(zip(names, args, strict=False))
        for name, value in kwargs.items():
            if name not in (*names, "batch") or name in given:
                raise TypeError(
                    f"{who} called by hand takes (elapsed, {', '.join(names)}, batch=None); "
                    f"got {'a second value for' if name in given else 'an unknown argument'} "
                    f"{name!r}."
                )
            given[name] = value
        if isinstance(elapsed, int) and not isinstance(elapsed, bool):
            elapsed = Elapsed.create(steps=elapsed)
        if not isinstance(elapsed, Elapsed):
            raise TypeError(
                f"{who} called by hand takes an Elapsed first (what ciclo.elapse yields), got "
                f"{describe(elapsed)}. Example: for elapsed, batch in ciclo.elapse(data): "
                f"...; callback(elapsed, {', '.join(names)})."
            )
        batch = given.get("batch")
        loop_state: LoopState | None = getattr(self, "_by_hand_loop", None)
        if loop_state is None:
            loop_state = LoopState(
                None,
                History(),
                elapsed,
                batch_size_fn=lambda b: 0 if b is _NO_BATCH else default_batch_size(b),
            )
            self._by_hand_loop = loop_state
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
                    f"{who} called by hand: logs must be ciclo.logs() or a dict, "
                    f"got {describe(bad)}."
                ),
            )
        )
        out = self.__loop_callback__(loop_state)
        _, state = parse_return(out, f"{who} (called by hand)")
        if state is not NO_CHANGE:
            loop_state.state = state
        loop_state.history.commit(elapsed, loop_state.logs)  # as a loop commits a step
        loop_state.remember(loop_state.logs)
        loop_state.end_step()
        if callable(getattr(type(self), "__loop_end__", None)):  # the end of a one-step loop
            loop_state.elapsed, loop_state.batch = loop_state.elapsed_after_step(), None
            self.__loop_end__(loop_state, None)  # type: ignore[attr-defined]
        if "state" in names:
            return loop_state.stop_iteration, loop_state.state
        return loop_state.stop_iteration

    def keys(self) -> list[Any]:
        if not hasattr(self, "_spread_schedule"):
            self._spread_schedule = self.default_schedule()
        return [self._spread_schedule]

    def __getitem__(self, key: Any) -> Any:
        if key is not getattr(self, "_spread_schedule", None):
            raise KeyError(key)
        return self


#: The batch of a call by hand made without ``batch=``: one step, no samples.
_NO_BATCH: Any = type("NoBatch", (), {"__repr__": lambda self: "NO_BATCH"})()


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
#: The collections ciclo itself writes and reads. A dict returned on its own (not in a
#: tuple) is logs only when every key is one of these (Haiku params, ``{"linear": {"w":
#: ...}}``, are not logs).
COLLECTIONS = frozenset({"losses", "metrics", "stateful_metrics", "outputs"})

#: Marks "the step returned no state" (``None`` cannot: it may be a state part).
NO_CHANGE: Any = type("NoChange", (), {"__repr__": lambda self: "NO_CHANGE"})()

_LOGS_HELP = (
    "Logs are ciclo.logs(), a dict {collection: {name: value}} (e.g. {'metrics': "
    "{'accuracy': acc}}) or, in a tuple, a flat dict {name: array} (read as metrics)."
)


def as_logs(value: Any, not_logs: Callable[[Any], str]) -> Logs:
    """``value``, found in the logs slot of a returned tuple, as :class:`Logs`: a ``Logs``
    as is, a dict ``{collection: {name: value}}`` converted, a flat dict ``{name: array}``
    read as metrics (as the original ciclo's Flax example returns); anything else raises
    ``TypeError(not_logs(value))``. The one check of what callbacks and managed steps
    return as logs.

    Example:
        >>> as_logs({"metrics": {"accuracy": 1.0}}, lambda v: "not logs")
        {'metrics': {'accuracy': 1.0}}
        >>> as_logs({"loss": 0.5, "accuracy": 1.0}, lambda v: "not logs")
        {'metrics': {'loss': 0.5, 'accuracy': 1.0}}
        >>> as_logs(0.5, lambda v: f"not logs: {describe(v)}")
        Traceback (most recent call last):
        TypeError: not logs: float 0.5
    """
    if isinstance(value, Logs):
        return value
    if isinstance(value, Mapping):
        nested = [isinstance(v, Mapping) for v in value.values()]
        if all(nested):
            return Logs(value)
        if not any(nested):
            return Logs({"metrics": value})
    raise TypeError(not_logs(value))


def is_logs(value: Any) -> bool:
    """Whether ``value``, returned on its own, is logs: a :class:`Logs`, or a dict whose
    keys are all ciclo's :data:`COLLECTIONS`, each holding a dict (``{}``: empty logs).

    Example:
        >>> is_logs({"metrics": {"accuracy": 1.0}}), is_logs({"linear": {"w": 1.0}})
        (True, False)
    """
    if isinstance(value, Logs):
        return True
    return isinstance(value, Mapping) and all(
        k in COLLECTIONS and isinstance(v, Mapping) for k, v in value.items()
    )


def parse_return(out: Any, who: str, kind: str = "callback") -> tuple[Logs | None, Any]:
    """What a callback or a step returned, as ``(logs or None, state or NO_CHANGE)``.

    The rules (one place for callbacks and managed steps): ``None`` changes nothing; a
    plain tuple is ``(logs, state)`` or ``(outputs, logs, state)`` (a NamedTuple, or any
    tuple subclass, is a state, never unpacked), its logs read by :func:`as_logs` and its
    outputs added to the ``outputs`` collection; a single value is logs when
    :func:`is_logs` says so; a list or a string is an error; another dict is an error
    (it is neither logs nor, by position, a state); anything else, falsy or not, is the
    state. ``who`` names the culprit in errors (``"callback train_step"``), ``kind`` what
    it is (``"callback"``, ``"managed step"``).

    Example:
        >>> from typing import NamedTuple
        >>> class TrainingState(NamedTuple):
        ...     params: dict
        ...     opt_state: tuple
        >>> parse_return(TrainingState({}, ()), "callback update")
        (None, TrainingState(params={}, opt_state=()))
        >>> parse_return(({"loss": 0.5}, 1), "callback step")
        ({'metrics': {'loss': 0.5}}, 1)
    """
    if out is None:
        return None, NO_CHANGE
    if type(out) is tuple:
        if len(out) == 2:
            logs, state = out
            outputs = None
        elif len(out) == 3:
            outputs, logs, state = out
        else:
            raise TypeError(
                f"{who} returned a tuple of {len(out)} items; a {kind} returns (logs, state), "
                f"(outputs, logs, state), logs, a state or None."
            )
        if logs is not None:
            lead = (
                f"{who} returned the logs part of its tuple that is not logs"
                if kind == "callback"
                else f"{who} must return (logs, state); the logs part of its tuple is not logs"
            )
            logs = as_logs(
                logs,
                lambda bad: (
                    f"{lead}: {describe(bad)}. {_LOGS_HELP} To return a new state on its "
                    f"own, return (None, state)."
                ),
            )
        if outputs is not None:
            logs = Logs() if logs is None else logs
            if isinstance(outputs, Mapping):
                for key, value in outputs.items():
                    logs.add_output(key, value)
            else:
                logs.add_output("outputs", outputs)
        return logs, (NO_CHANGE if state is None else state)
    if is_logs(out):
        return (out if isinstance(out, Logs) else Logs(out)), NO_CHANGE
    if isinstance(out, list | str | bytes | set | frozenset):
        raise TypeError(
            f"{who} returned a {type(out).__name__} ({str(out)[:40]!r}), which cannot be a "
            f"state ({describe(out)}): a {kind} returns (logs, state), (outputs, logs, "
            f"state), logs, a state or None. {_LOGS_HELP} Return None, logs, (logs, state) "
            f"or a new state (a pytree of arrays)."
        )
    if isinstance(out, Mapping):
        raise TypeError(
            f"{who} returned a dict that is not logs: {describe(out)}. {_LOGS_HELP} "
            f"Returned on its own, a dict is logs only when keyed by ciclo's collections "
            f"{sorted(COLLECTIONS)}. To return a new state on its own, return (None, state)."
        )
    return None, out


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
