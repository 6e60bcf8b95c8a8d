"""What a checkpoint holds of a loop: a list of items (:data:`ITEMS`), each a field of the
checkpoint's ``meta`` that declares how it is taken from the loop at a save, decoded when
read, and put back into a resumed loop. Something new to save is a new item here, not a
branch in the format (:mod:`._format` writes and reads whatever the items give it).

- ``elapsed``, ``initial_elapsed``: ``Elapsed.to_dict()`` after the saved step, and where the
  run's loop started;
- ``data``: ``{"position": batches drawn, "state": the dataset's state_dict() or None (per
  process: ``_topology``), "skipped": batches rollbacks skipped (when not 0)}``;
- ``ledger``: a ``ciclo.goodput()`` ledger's ``state_dict()``, or ``None``;
- ``schedules``: each task's ``schedule.state_dict()`` (a watchdog's task left out);
- ``callbacks``: ``[{"name": class qualname, "state": state_dict()}]`` of each stateful
  callback; trees shaped like the state in them are saved like the state;
- ``history``, ``logs``: ``History.state_dict()`` and the latest logs;
- ``end``: ``LoopState.ending`` (why and where the run ended), else ``None``.

Fields added after format 1 (``end``, ``ledger``) have defaults (:func:`decode`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax

from .._loop._hooks import is_stateful, is_transient
from .._loop._naming import callback_name
from .._loop._state import LoopState
from .._records import _host
from .._records._logs import Logs
from .._time._elapsed import Elapsed
from . import _codec, _topology


class Where(NamedTuple):
    """A checkpoint, for messages: ``str(where)`` is ``checkpoint <step> in '<path>'``."""

    path: str
    step: int

    def __str__(self) -> str:
        return f"checkpoint {self.step} in {self.path!r}"


_REQUIRED = object()


class Item(NamedTuple):
    """One field of a checkpoint's ``meta``.

    Example:
        >>> item = Item("steps", lambda loop_state: loop_state.elapsed.steps)
        >>> item.key, item.read(3)
        ('steps', 3)
    """

    key: str  #: the field
    save: Callable[[LoopState], Any]  #: its value at a save (JSON values, NumPy arrays)
    #: ``(value, loop_state, where)``: puts the read value back into a resumed loop
    put_back: Callable[[Any, LoopState, Where], None] | None = None
    read: Callable[[Any], Any] = lambda value: value  #: decodes the value read from JSON
    missing: Any = _REQUIRED  #: the value of a checkpoint written without it (else damaged)
    copies: bool = False  #: whether trees shaped like the state in it are saved like the state
    of_tasks: bool = False  #: whether it is put back only into a loop given the run's tasks
    #: ``(value, arrays)``: the JSON value, its arrays moved to ``arrays`` (``_codec.split``)
    split: Callable[[Any, dict[str, Any]], Any] | None = None


# --- the tasks whose state is saved ----------------------------------------------------------
def checkpointed_tasks(
    tasks: Sequence[tuple[Any, Sequence[Any]]],
) -> list[tuple[Any, Sequence[Any]]]:
    """The tasks whose schedules' state a checkpoint holds, in order: all but those whose
    every callback is a watcher outside the run (``__loop_transient__``: a watchdog), which
    a resumed run may add or leave out."""
    return [
        (schedule, callbacks)
        for schedule, callbacks in tasks
        if not callbacks or not all(is_transient(getattr(c, "fn", c)) for c in callbacks)
    ]


def _stateful_owners(tasks: Sequence[tuple[Any, Sequence[Any]]]) -> list[Any]:
    """The distinct objects of ``tasks`` with ``state_dict``/``load_state_dict`` (also
    reached through their bound methods; a state's own methods are not callbacks)."""
    found: dict[int, Any] = {}
    for _, callbacks in tasks:
        for callback in callbacks:
            fn = getattr(callback, "fn", callback)
            owner = getattr(fn, "__self__", None)
            for candidate in (fn, owner):
                if candidate is None or not is_stateful(candidate):
                    continue
                if candidate is owner and not jax.tree_util.treedef_is_leaf(
                    jax.tree_util.tree_structure(owner)
                ):
                    continue  # a state's method
                found.setdefault(id(candidate), candidate)
                break
    return list(found.values())


def stateful_callbacks(tasks: Sequence[tuple[Any, Sequence[Any]]]) -> list[Any]:
    """The stateful callbacks whose state the ``callbacks`` field holds, in this order (those
    that are items of their own, :func:`task_items`, left out)."""
    return [o for o in _stateful_owners(tasks) if not isinstance(_key_of(o), str)]


def task_items(tasks: Sequence[tuple[Any, Sequence[Any]]]) -> dict[str, Any]:
    """``{key: object}`` for the objects of ``tasks`` saved as a field of their own: those
    whose ``checkpoint_key`` names it (a ``ciclo.goodput()`` ledger: ``"ledger"``).

    Raises:
        ValueError: two objects of the loop name the same field.
    """
    found: dict[str, Any] = {}
    for owner in _stateful_owners(tasks):
        key = _key_of(owner)
        if isinstance(key, str):
            if key in found:
                raise ValueError(f"a loop can hold one {key}; it has {found[key]!r} and {owner!r}.")
            found[key] = owner
    return found


def _key_of(owner: Any) -> Any:
    return getattr(owner, "checkpoint_key", None)


# --- the items ---------------------------------------------------------------------------------
def _set(attribute: str, wrap: Callable[[Any], Any] = lambda v: v) -> Any:
    def put_back(value: Any, loop_state: LoopState, where: Where) -> None:
        setattr(loop_state, attribute, wrap(value))

    return put_back


def _data(loop_state: LoopState) -> dict[str, Any]:
    skipped = loop_state.skipped_batches
    position = loop_state.elapsed.steps - loop_state.initial_elapsed.steps + skipped
    state = _topology.data_state(loop_state.inputs.dataset)
    return {"position": position, "state": state, **({"skipped": skipped} if skipped else {})}


def _read_data(value: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "position": int(value["position"]),
        "state": _topology.own_data_state(value["state"]),
        "skipped": int(value.get("skipped", 0)),
    }


_SAME_TASKS = (
    "Resume with the same tasks (schedules and callbacks, in the same order) as the "
    "interrupted run."
)


def _load_schedules(saved: list[Any], loop_state: LoopState, where: Where) -> None:
    tasks = checkpointed_tasks(loop_state.inputs.tasks)
    if len(saved) != len(tasks):
        raise ValueError(
            f"{where} was written by a loop with {len(saved)} tasks; this loop has "
            f"{len(tasks)}. {_SAME_TASKS}"
        )
    for i, ((schedule, _), state) in enumerate(zip(tasks, saved, strict=True)):
        try:
            schedule.load_state_dict(state)
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(
                f"cannot restore schedule {schedule!r} (task {i}) from {where}: the checkpoint "
                f"holds the state of another kind of schedule ({str(state)[:80]}). {_SAME_TASKS}"
            ) from error


def _callbacks(loop_state: LoopState) -> list[dict[str, Any]]:
    owners = stateful_callbacks(loop_state.inputs.tasks)
    return [{"name": callback_name(type(o)), "state": o.state_dict()} for o in owners]


def _split_callbacks(value: list[dict[str, Any]], arrays: dict[str, Any]) -> list[Any]:
    where = "the state_dict() of callback {}"
    return [
        {"name": c["name"], "state": _codec.split(c["state"], arrays, where.format(c["name"]))}
        for c in value
    ]


def _load_callbacks(saved: list[Any], loop_state: LoopState, where: Where) -> None:
    owners = stateful_callbacks(loop_state.inputs.tasks)
    names = [callback_name(type(owner)) for owner in owners]
    if names != [c["name"] for c in saved]:
        raise ValueError(
            f"{where} holds the state of callbacks {[c['name'] for c in saved]}; this "
            f"loop's stateful callbacks are {names}. {_SAME_TASKS}"
        )
    for owner, c in zip(owners, saved, strict=True):
        owner.load_state_dict(c["state"])


def owned(key: str, name: str) -> Item:
    """The item of the task object whose ``checkpoint_key`` is ``key`` (``name``: what it is
    called in messages): its ``state_dict()``, loaded back with ``load_state_dict`` and told
    where its checkpoints are (``checkpoint_at(path, resumed=True)``)."""

    def save(loop_state: LoopState) -> Any:
        owner = task_items(loop_state.inputs.tasks).get(key)
        return None if owner is None else owner.state_dict()

    def put_back(value: Any, loop_state: LoopState, where: Where) -> None:
        owner = task_items(loop_state.inputs.tasks).get(key)
        if owner is None:
            return  # a loop without one: the saved one is left in the checkpoint
        if value is None:
            raise ValueError(f"this loop has a {name}, {where} has none. {_SAME_TASKS}")
        owner.load_state_dict(value)
        owner.checkpoint_at(where.path, resumed=True)

    return Item(key, save, put_back, missing=None, of_tasks=True)


def _put_data(value: Mapping[str, Any], loop_state: LoopState, where: Where) -> None:
    loop_state.skipped_batches = value["skipped"]


def _put_history(value: Any, loop_state: LoopState, where: Where) -> None:
    loop_state.history.load_state_dict(value)


def _schedules(loop_state: LoopState) -> list[Any]:
    return [schedule.state_dict() for schedule, _ in checkpointed_tasks(loop_state.inputs.tasks)]


def _elapsed(attribute: str) -> Item:
    return Item(
        attribute,
        lambda s: getattr(s, attribute).to_dict(),
        _set(attribute),
        lambda value: Elapsed(**value),
    )


#: What a checkpoint holds of a loop, in the order it is put back (the tasks' first: a loop
#: with other tasks is refused before anything is changed).
ITEMS: tuple[Item, ...] = (
    owned("ledger", "ledger (ciclo.goodput)"),
    Item("schedules", _schedules, _load_schedules, of_tasks=True),
    Item(
        "callbacks",
        _callbacks,
        _load_callbacks,
        copies=True,
        of_tasks=True,
        split=_split_callbacks,
    ),
    _elapsed("elapsed"),
    _elapsed("initial_elapsed"),
    Item("data", _data, _put_data, _read_data),
    Item("history", lambda s: s.history.state_dict(), _put_history),
    Item(
        "logs",
        lambda s: {c: dict(entries) for c, entries in s.accumulated_logs.items()},
        _set("accumulated_logs", Logs),
    ),
    Item("end", lambda s: s.ending, missing=None),
)


# --- meta, both ways -------------------------------------------------------------------------
def encode(loop_state: LoopState) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """``(fields, arrays, copies)`` of a checkpoint of ``loop_state``: the JSON fields of its
    items, the NumPy arrays they refer to, and the state-shaped trees they refer to (not
    copied to the host: the format saves them like the state)."""
    values = {item.key: item.save(loop_state) for item in ITEMS}
    copies: dict[str, Any] = {}
    state_def = _codec.flatten(loop_state.state)[1]
    if not jax.tree_util.treedef_is_leaf(state_def):
        for item in ITEMS:
            if item.copies:
                values[item.key] = _codec.extract_copies(values[item.key], state_def, copies)
    values = _host.to_host(values)  # one transfer for every item
    arrays: dict[str, Any] = {}
    fields = {
        item.key: item.split(values[item.key], arrays)
        if item.split
        else _codec.split(values[item.key], arrays, f"the {item.key}")
        for item in ITEMS
    }
    return fields, arrays, copies


def missing_fields(meta: Mapping[str, Any]) -> list[str]:
    """The required fields that ``meta`` lacks (a damaged checkpoint)."""
    return [item.key for item in ITEMS if item.missing is _REQUIRED and item.key not in meta]


def decode(meta: Mapping[str, Any]) -> dict[str, Any]:
    """The items' values out of a checkpoint's ``meta`` (arrays and copies already joined)."""
    meta = dict(meta)
    if "ledger" not in meta:  # ciclo 0.1 kept the ledger among the callbacks
        old = [c for c in meta["callbacks"] if c["name"] == "Goodput"]
        meta["ledger"] = old[0]["state"] if old else None
        meta["callbacks"] = [c for c in meta["callbacks"] if c["name"] != "Goodput"]
    return {
        item.key: item.read(meta[item.key]) if item.key in meta else item.missing for item in ITEMS
    }


def put_back(
    fields: Mapping[str, Any], loop_state: LoopState, where: Where, *, tasks: bool = True
) -> None:
    """Puts the items' values into ``loop_state`` (the state is the caller's); the tasks'
    items (schedules, callbacks, ledger) only with ``tasks``.

    Raises:
        ValueError: the loop's tasks are not those of the run that wrote the checkpoint.
    """
    for item in ITEMS:
        if item.put_back is not None and (tasks or not item.of_tasks):
            item.put_back(fields[item.key], loop_state, where)
