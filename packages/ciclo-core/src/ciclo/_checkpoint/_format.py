"""The checkpoint format: the one module that knows how a run is laid out on disk, in both
directions (writing for ``ciclo.checkpoint``, reading for restore, resume and the evaluator).

A checkpoint directory is an orbax ``CheckpointManager`` directory; each checkpoint is one
orbax step, named after ``elapsed.steps`` (the count of steps it holds), with up to four
items:

==========  ================  ===================================================================
item        orbax handler     what it holds
==========  ================  ===================================================================
``state``   ``StandardSave``  the state pytree in its own structure (plain orbax can read it).
                              Leaves orbax cannot store (strings, functions, empty arrays) are
                              left out (``None``); they come from the state restored into. A
                              lone array is saved as ``{"value": array}``. Absent when no leaf
                              can be saved. With one process its JAX arrays are saved from a
                              host copy (orbax records NumPy arrays, PRNG keys stay keys);
                              with several, as JAX arrays. Either is restored into the
                              target's placement.
``meta``    ``JsonSave``      plain Python: the fields below. Always present.
``arrays``  ``StandardSave``  the NumPy arrays found in ``meta`` (history columns...), which
                              ``meta`` refers to as ``{"__ciclo_array__": name, "shape",
                              "dtype", "scalar"}`` (name ``None``: an empty array, not stored).
``copies``  ``StandardSave``  pytrees shaped like the state found in callback states (early
                              stopping's best state), saved and restored like the state (same
                              shardings); ``meta`` refers to them as ``{"__ciclo_state__":
                              name, "leaves": [...]}``.
==========  ================  ===================================================================

The fields of ``meta``:

===================  ===========================================================================
field                what it holds
===================  ===========================================================================
``format``           :data:`FORMAT` (``1``); anything else is not a ciclo checkpoint.
``elapsed``          ``Elapsed.to_dict()`` after the step that was saved.
``initial_elapsed``  the count the run's loop started from.
``data``             ``{"position": batches drawn from the dataset, "state": its state_dict()
                     or None, "skipped": batches of them that rollbacks skipped}``
                     (``LoopState.skipped_batches``; written when not 0, absent: 0).
``state_leaves``     ``[path, kind, shape, dtype, saved]`` for each leaf of the state: what a
                     restore target is checked against.
``schedules``        each task's ``schedule.state_dict()``, in task order (a watchdog's
                     task left out: ``checkpointed_tasks``).
``callbacks``        ``[{"name": class qualname, "state": state_dict()}]`` for each distinct
                     callback with ``state_dict`` / ``load_state_dict``, in task order.
``history``          ``History.state_dict()``.
``logs``             the loop's latest logs, ``{collection: {name: value}}``.
``end``              why and where the run ended, ``{"reason", "step", "message"}`` (see
                     ``LoopState.ending``), in the checkpoint saved when it ended; ``None``
                     in the others. Optional: checkpoints written before it (ciclo 0.1)
                     have no ``end`` and resume as runs that have not ended.
===================  ===========================================================================

Every checkpoint has orbax metrics ``{"finite": bool}``: a checkpoint of a non-finite state
(saved at the stop after a NaN) never evicts the newest finite one, and resume and
:func:`read_newest` pass it over. A damaged checkpoint (a truncated or missing file, a
missing item, bad JSON, orbax's own files included: a step whose ``_CHECKPOINT_METADATA``
or ``metrics`` cannot be read is hidden from orbax, which would fail to open the
directory, see :func:`steps_on_disk`) is a :class:`DamagedCheckpoint`;
:func:`read_newest` passes it over with a warning. Nothing is ever deleted but by the
``keep`` policy: a passed-over checkpoint whose step a resumed run saves again is set aside
(:func:`set_aside`).

The orbax metrics of a checkpoint written with ``monitor=`` also hold ``{"value": float,
"monitor": name, "mode": "min" | "max"}``; they rank checkpoints (:func:`best_step`).

Writing: :func:`open_writer`, :func:`snapshot` then :func:`write`, :func:`set_aside`.
Reading: :func:`open_reader`, :func:`read` (a :class:`Contents`), :func:`read_newest`,
:func:`best_step`.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import os
import re
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .._loop._hooks import is_stateful
from .._loop._state import LoopState
from .._processes._agreement import gather_to_all
from .._records import _host
from .._time._elapsed import Elapsed

__all__ = [
    "FORMAT",
    "Contents",
    "checkpoint_path",
    "open_writer",
    "open_reader",
    "Snapshot",
    "snapshot",
    "write",
    "read",
    "best_step",
    "DamagedCheckpoint",
    "WriteFailed",
    "abandon_writes",
    "read_newest",
    "steps_on_disk",
    "read_ending",
    "record_ending",
    "passed_over",
    "set_aside",
    "all_finite",
    "is_finite_step",
    "structure_error",
    "callback_name",
    "stateful_callbacks",
    "is_sequence",
    "is_stateful_dataset",
    "OtherTopology",
]

#: The version written in ``meta["format"]``; a checkpoint with another one is refused.
FORMAT = 1
_ARRAY = "__ciclo_array__"  # a reference from ``meta`` into the ``arrays`` item
_STATE = "__ciclo_state__"  # a reference from ``meta`` into the ``copies`` item
_VALUE_KINDS = ("jax", "numpy", "numpy-scalar", "python", "shape")


# --- paths and managers ----------------------------------------------------------------------
def checkpoint_path(directory: str | os.PathLike[str]) -> str:
    """An absolute local path (orbax needs one), or a URL such as ``gs://...`` as given.

    Example:
        >>> checkpoint_path("gs://bucket/run")
        'gs://bucket/run'
    """
    try:
        text = os.fspath(directory)
    except TypeError:
        raise TypeError(
            f"a checkpoint directory must be a str or a path, got {directory!r} "
            f"({type(directory).__name__})."
        ) from None
    if not isinstance(text, str):
        text = os.fsdecode(text)
    if "://" in text:
        return text
    return os.path.abspath(os.path.expanduser(text))


class _NewestFinite:
    """An orbax preservation policy: keeps the newest checkpoint of a finite state, so that
    a NaN state saved after it never evicts it (``keep=1`` included)."""

    def should_preserve(self, checkpoints: Sequence[Any], *, context: Any) -> list[bool]:
        finite = [i for i, info in enumerate(checkpoints) if _finite_metrics(info.metrics)]
        return [bool(finite) and i == finite[-1] for i in range(len(checkpoints))]


#: By checkpoint directory, what must not be evicted yet: ``held(steps) -> [bool]`` for the
#: steps on disk (``rollback_on_nan`` holds the pre-fault checkpoints it may still need).
HELD: dict[str, Callable[[list[int]], list[bool]]] = {}


class _Held:
    """An orbax preservation policy: keeps what :data:`HELD` holds for ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path

    def should_preserve(self, checkpoints: Sequence[Any], *, context: Any) -> list[bool]:
        held = HELD.get(self.path)
        return [False] * len(checkpoints) if held is None else held([c.step for c in checkpoints])


class _BestMonitored:
    """An orbax preservation policy: ``policy`` (a ``BestN``) applied to the checkpoints
    with a monitored value only; the others are left to the other policies."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy

    def should_preserve(self, checkpoints: Sequence[Any], *, context: Any) -> list[bool]:
        scored = [
            i
            for i, info in enumerate(checkpoints)
            if isinstance(info.metrics, Mapping) and "value" in info.metrics
        ]
        kept = self.policy.should_preserve([checkpoints[i] for i in scored], context=context)
        result = [False] * len(checkpoints)
        for i, keep in zip(scored, kept, strict=True):
            result[i] = bool(keep)
        return result


def _finite_metrics(metrics: Any) -> bool:
    """Whether a checkpoint's orbax metrics say its state is finite (older checkpoints,
    written without the flag, count as finite)."""
    return not isinstance(metrics, Mapping) or metrics.get("finite", True) is not False


#: Steps whose orbax files (read when a manager opens the directory: the step's
#: ``_CHECKPOINT_METADATA``, its ``metrics`` item) cannot be read, by directory:
#: ``{path: {step: (file, error)}}``. orbax would fail to open the directory for them, so
#: :class:`_IntactSteps` hides them from its managers and :func:`read` reports them damaged.
_unreadable: dict[str, dict[int, tuple[str, Exception]]] = {}
_ORBAX_FILES = ("_CHECKPOINT_METADATA", os.path.join("metrics", "metrics"))


def _orbax_damage(step_directory: str) -> tuple[str, Exception] | None:
    """``(file, error)`` for the first of orbax's own files of a step that cannot be read;
    ``None`` when they read. orbax writes ``_CHECKPOINT_METADATA`` before it commits a step,
    so a committed step without it is damaged too (orbax would warn about it at every read);
    a missing ``metrics`` item is orbax's to handle."""
    for name in _ORBAX_FILES:
        file = os.path.join(step_directory, name)
        try:
            with open(file, encoding="utf-8") as f:
                value = json.load(f)
        except FileNotFoundError as error:
            if name == _ORBAX_FILES[0]:
                return file, error
            continue
        except (OSError, ValueError) as error:
            return file, error
        if not isinstance(value, dict):
            return file, ValueError(f"not a JSON object: {str(value)[:40]!r}")
    return None


class _IntactSteps:
    """orbax's standard step names (``<step>``), less the steps of a local directory whose
    orbax files cannot be read (recorded in ``_unreadable[path]``): an orbax step name
    format, given to every manager ciclo opens."""

    def __init__(self, path: str) -> None:
        import orbax.checkpoint as ocp

        self.path = path
        self.names = ocp.step.standard_name_format()

    def __str__(self) -> str:
        return f"ciclo intact steps of {self.names}"

    def build_name(self, step: int) -> str:
        return str(self.names.build_name(step))

    def find_all(self, base_path: Any) -> Any:
        found, unreadable = [], {}
        for metadata in self.names.find_all(base_path):
            damage = None if "://" in self.path else _orbax_damage(str(metadata.path))
            if damage is None:
                found.append(metadata)
            else:
                unreadable[metadata.step] = damage
        _unreadable[self.path] = unreadable
        return iter(found)

    def find_step(self, base_path: Any, step: int) -> Any:
        metadata = self.names.find_step(base_path, step)
        if "://" not in self.path and _orbax_damage(str(metadata.path)) is not None:
            raise ValueError(f"checkpoint {step} in {self.path!r} is damaged")
        return metadata


def steps_on_disk(manager: Any, path: str) -> list[int]:
    """The steps of ``path``, oldest first: those of ``manager`` and those it hides because
    orbax's own files of the step cannot be read (damaged, see :func:`read`)."""
    return sorted({*manager.all_steps(), *_unreadable.get(path, {})})


def open_writer(
    path: str, *, keep: int | None, monitor: str | None, mode: str, async_save: bool
) -> Any:
    """The ``CheckpointManager`` that ``ciclo.checkpoint`` writes ``path`` with.

    Without ``monitor`` it keeps the latest ``keep`` checkpoints; with it, the best ``keep``
    by the monitored value (NaN is worst) plus the latest, to resume from. Either way the
    newest checkpoint of a finite state is kept too (see :func:`write`). With
    ``async_save``, orbax writes in threads of its own (the path of several processes);
    its step directories are still created within ``save``: a directory that cannot be
    written is an error there and then, not a background thread waiting for a directory
    that never comes. Without it, ``save`` writes the whole checkpoint before it returns
    (on ciclo's writer thread, for an async save of one process: see ``_writer.py``).
    """
    import orbax.checkpoint as ocp
    from orbax.checkpoint import checkpoint_managers as policies

    worst = math.inf if mode == "min" else -math.inf

    def best_fn(metrics: Any) -> float:
        # orbax writes the metrics only when it has a best_fn; ciclo ranks with its own.
        value = float(metrics.get("value", math.nan)) if isinstance(metrics, Mapping) else math.nan
        return worst if math.isnan(value) or not _finite_metrics(metrics) else value

    kept: list[Any] = [_NewestFinite(), _Held(path)]
    if monitor is None:
        kept.append(policies.LatestN(n=keep))
    else:
        kept.append(policies.LatestN(n=1))  # the latest is always kept, to resume from
        kept.append(
            _BestMonitored(policies.BestN(get_metric_fn=best_fn, reverse=mode == "min", n=keep))
        )
    options = ocp.CheckpointManagerOptions(
        enable_async_checkpointing=async_save,
        async_options=ocp.AsyncOptions(create_directories_asynchronously=False),
        preservation_policy=policies.AnyPreservationPolicy(kept),
        best_fn=best_fn,
        best_mode=mode,
        cleanup_tmp_directories=True,
        step_name_format=_IntactSteps(path),
    )
    return ocp.CheckpointManager(path, options=options)


def open_reader(path: str, *, must_exist: bool) -> Any:
    """A ``CheckpointManager`` to read ``path``; ``None`` when there is nothing to read
    and ``must_exist`` is false.

    Raises:
        FileNotFoundError: (``must_exist``) no such directory, or no complete checkpoint in it.
        NotADirectoryError: ``path`` is a file.
    """
    if "://" not in path:
        if not os.path.exists(path):
            if not must_exist:
                return None
            raise FileNotFoundError(
                f"checkpoint directory {path!r} does not exist. Give the directory that "
                f"ciclo.checkpoint(...) wrote to."
            )
        if not os.path.isdir(path):
            raise NotADirectoryError(
                f"checkpoint directory {path!r} is a file, not a directory. Give the "
                f"directory that ciclo.checkpoint(...) wrote to."
            )
    import orbax.checkpoint as ocp

    # Not read_only=True: orbax logs a warning for it. Nothing is written without a save.
    options = ocp.CheckpointManagerOptions(
        create=False, enable_async_checkpointing=False, step_name_format=_IntactSteps(path)
    )
    manager = ocp.CheckpointManager(path, options=options)
    if not steps_on_disk(manager, path):
        manager.close()
        if not must_exist:
            return None
        raise FileNotFoundError(
            f"checkpoint directory {path!r} holds no checkpoint (no completed step "
            f"directory). Checkpoints whose writing was interrupted are not counted."
        )
    return manager


# --- plain-Python metadata with NumPy arrays ------------------------------------------------
_NOT_SAVABLE = (
    "cannot save {where} in a checkpoint: it holds a {kind} ({text!r}). A checkpoint stores "
    "JSON values (dicts with str keys, lists, str, int, float, bool, None) and NumPy arrays."
)


def _split(value: Any, arrays: dict[str, np.ndarray], where: str) -> Any:
    """``value`` with every NumPy array replaced by a reference into ``arrays`` (for JSON)."""
    if value is None or isinstance(value, str | bool | int | float):
        return value
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(
                    f"cannot save {where} in a checkpoint: key {key!r} is a "
                    f"{type(key).__name__}; use str keys (JSON objects have str keys)."
                )
            out[key] = _split(item, arrays, f"{where}[{key!r}]")
        return out
    if isinstance(value, list | tuple):
        return [_split(item, arrays, f"{where}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, np.ndarray | np.generic) and value.dtype != object:
        array = np.asarray(value)
        ref: dict[str, Any] = {
            _ARRAY: None,
            "shape": list(array.shape),
            "dtype": array.dtype.name,
            "scalar": isinstance(value, np.generic),
        }
        if array.size:  # orbax cannot store empty arrays; their shape says it all
            ref[_ARRAY] = f"a{len(arrays)}"
            arrays[ref[_ARRAY]] = array.copy() if isinstance(value, np.ndarray) else array
        return ref
    raise TypeError(
        _NOT_SAVABLE.format(where=where, kind=type(value).__name__, text=str(value)[:60])
    )


def _join(value: Any, arrays: Mapping[str, Any], copies: Mapping[str, Any]) -> Any:
    """Undoes :func:`_split` (tuples come back as lists) and puts back the state-shaped
    trees of :func:`_extract_copies`."""
    if isinstance(value, dict):
        if _STATE in value:
            return copies.get(value[_STATE])  # None when they were not read
        if _ARRAY in value:
            name = value[_ARRAY]
            dtype = np.dtype(value["dtype"])
            array = (
                np.zeros(value["shape"], dtype)
                if name is None
                else np.asarray(arrays[name], dtype=dtype)
            )
            return array[()] if value["scalar"] else array
        return {key: _join(item, arrays, copies) for key, item in value.items()}
    if isinstance(value, list):
        return [_join(item, arrays, copies) for item in value]
    return value


def _collect_references(
    value: Any, arrays: list[dict[str, Any]], copies: list[dict[str, Any]]
) -> None:
    if isinstance(value, dict):
        if _ARRAY in value:
            if value[_ARRAY] is not None:
                arrays.append(value)
            return
        if _STATE in value:
            copies.append(value)
            return
        for item in value.values():
            _collect_references(item, arrays, copies)
    elif isinstance(value, list):
        for item in value:
            _collect_references(item, arrays, copies)


# --- the state pytree ------------------------------------------------------------------------
def _flatten(state: Any) -> tuple[list[tuple[Any, Any]], Any]:
    # None counts as a leaf so that a placeholder None keeps the structure intact.
    return jax.tree_util.tree_flatten_with_path(state, is_leaf=lambda x: x is None)


def _kind(leaf: Any) -> str:
    if leaf is None:
        return "none"
    if isinstance(leaf, jax.Array):
        return "jax"
    if isinstance(leaf, jax.ShapeDtypeStruct):  # a lazy state's (`_lazy`)
        return "shape"
    if isinstance(leaf, np.ndarray):
        return "numpy" if leaf.dtype != object else "other"
    if isinstance(leaf, np.generic):
        return "numpy-scalar"
    if isinstance(leaf, bool | int | float):
        return "python"
    return "other"


def _describe(path: Any, leaf: Any) -> list[Any]:
    """``[path, kind, shape, dtype, saved]`` of one leaf, JSON-able."""
    kind = _kind(leaf)
    if kind in ("jax", "numpy", "numpy-scalar", "shape"):
        shape = list(np.shape(leaf))
        dtype = str(leaf.dtype)
        saved = math.prod(shape) > 0
    elif kind == "python":
        shape, dtype, saved = [], type(leaf).__name__, True
    else:
        shape, dtype, saved = None, type(leaf).__name__, False
    return [jax.tree_util.keystr(path), kind, shape, dtype, saved]


def _state_to_save(state: Any) -> tuple[Any, list[list[Any]]]:
    """The tree orbax saves (unsaved leaves as ``None``; ``None`` if nothing is saved) and
    the description of every leaf."""
    leaves, treedef = _flatten(state)
    described = [_describe(path, leaf) for path, leaf in leaves]
    values = [
        (np.asarray(leaf) if isinstance(leaf, np.generic) else leaf) if d[4] else None
        for (_, leaf), d in zip(leaves, described, strict=True)
    ]
    if not any(d[4] for d in described):
        return None, described
    return _wrap(jax.tree_util.tree_unflatten(treedef, values), treedef), described


def _wrap(tree: Any, treedef: Any) -> Any:
    # orbax's StandardSave takes a tree, not a lone array or scalar.
    return {"value": tree} if jax.tree_util.treedef_is_leaf(treedef) else tree


_OTHER_STRUCTURE = (
    "cannot restore {where} into this state: it does not have the structure of the saved one "
    "({difference}). Restore into a state built exactly like the one that was saved (same "
    "model, optimizer, e.g. adam vs adamw, and fields); to change the structure, restore into "
    "the old one and convert it yourself."
)


def structure_error(where: str, difference: str) -> ValueError:
    """The error for a state that does not have the saved structure."""
    return ValueError(_OTHER_STRUCTURE.format(where=where, difference=difference))


def _check_structure(saved: list[list[Any]], target: list[list[Any]], where: str) -> None:
    problems: list[str] = []
    saved_paths = [d[0] for d in saved]
    target_paths = [d[0] for d in target]
    if saved_paths != target_paths:
        first = next(
            (
                f"first differing path: {t!r} in the state, {s!r} in the checkpoint"
                for s, t in zip(saved_paths, target_paths, strict=False)
                if s != t
            ),
            f"first differing path: "
            f"{(saved_paths + target_paths)[min(len(saved_paths), len(target_paths))]!r}",
        )
        problems.append(first)
        missing = [p for p in saved_paths if p not in set(target_paths)]
        extra = [p for p in target_paths if p not in set(saved_paths)]
        if missing:
            problems.append(f"leaves in the checkpoint but not in the state: {missing[:5]}")
        if extra:
            problems.append(f"leaves in the state but not in the checkpoint: {extra[:5]}")
        if not missing and not extra:
            problems.append("the same leaves in a different order")
    else:
        for s, t in zip(saved, target, strict=True):
            s_value, t_value = s[1] in _VALUE_KINDS, t[1] in _VALUE_KINDS
            if s_value != t_value:
                problems.append(f"{t[0]}: the checkpoint holds a {s[3]} there, the state a {t[3]}")
            elif s_value and s[2] != t[2]:
                problems.append(
                    f"{t[0]}: shape {tuple(s[2])} {s[3]} in the checkpoint, "
                    f"{tuple(t[2])} {t[3]} in the state"
                )
            elif (
                s_value and "python" not in (s[1], t[1]) and _dtype_kind(s[3]) != _dtype_kind(t[3])
            ):
                problems.append(
                    f"{t[0] or 'the state (one array)'}: {s[3]} in the checkpoint, {t[3]} in "
                    f"the state (restoring would cast the values)"
                )
            if len(problems) >= 5:
                break
    if problems:
        raise structure_error(where, "; ".join(problems))


def _dtype_kind(name: str) -> str:
    """The kind of a saved dtype name (``"floating"``, ``"integer"``, ``"bool"``,
    ``"complexfloating"``), or the name itself for another one (a PRNG key's ``key<fry>``).

    Example:
        >>> _dtype_kind("bfloat16"), _dtype_kind("uint8"), _dtype_kind("key<fry>")
        ('floating', 'integer', 'key<fry>')
    """
    try:
        dtype = jnp.dtype(name)
    except TypeError:
        return name
    for kind in (jnp.bool_, jnp.integer, jnp.floating, jnp.complexfloating):
        if jnp.issubdtype(dtype, kind):
            return kind.__name__
    return name


def _is_key(value: Any) -> bool:
    return bool(jnp.issubdtype(value.dtype, jax.dtypes.prng_key))


def _uncommitted(value: Any) -> Any:
    """``value`` as an uncommitted array on the default device (free to move, as a freshly
    created array is), through host memory."""
    if _is_key(value):
        data = jax.device_put(np.asarray(jax.random.key_data(value)))
        return jax.random.wrap_key_data(data, impl=jax.random.key_impl(value))
    return jax.device_put(np.asarray(value))


def _like(target: Any, value: Any, saved: list[Any]) -> Any:
    """``value`` with the type, dtype and placement (sharding, committed or not) of
    ``target``; for a lazy state's shape, the kind ``saved`` describes, placed on its
    sharding (uncommitted where it has none, as a freshly built array)."""
    if isinstance(target, jax.ShapeDtypeStruct):
        return _built(target, value, saved)
    if isinstance(target, jax.Array):
        if not isinstance(value, jax.Array):
            value = jax.device_put(np.asarray(value, dtype=target.dtype), target.sharding)
        elif value.dtype != target.dtype:
            value = value.astype(target.dtype)
        if not target.committed:
            return _uncommitted(value) if value.committed else value
        if value.sharding != target.sharding:
            value = jax.device_put(value, target.sharding)
        return value
    if isinstance(target, np.ndarray):
        return np.asarray(value, dtype=target.dtype)
    if isinstance(target, np.generic):
        return target.dtype.type(np.asarray(value).item())
    if isinstance(target, bool | int | float) and not isinstance(value, type(target)):
        return type(target)(np.asarray(value).item())
    return value


def _built(shape: jax.ShapeDtypeStruct, value: Any, saved: list[Any]) -> Any:
    """``value``, restored into a lazy state's ``shape``, as the built state holds it."""
    if saved[1] == "python":
        return _PYTHON_TYPES[saved[3]](np.asarray(value).item())
    if saved[1] == "numpy":
        return np.asarray(value, dtype=saved[3])
    if saved[1] == "numpy-scalar":
        return np.dtype(saved[3]).type(np.asarray(value).item())
    if shape.sharding is None:
        return _uncommitted(value) if value.committed else value
    return value if value.sharding == shape.sharding else jax.device_put(value, shape.sharding)


def _unsaved(leaf: Any) -> Any:
    """An unsaved leaf as the restored state holds it: itself, or a lazy state's empty
    array built."""
    if not isinstance(leaf, jax.ShapeDtypeStruct):
        return leaf
    empty = np.zeros(leaf.shape, leaf.dtype)
    return jax.device_put(empty, leaf.sharding)  # None: uncommitted, on the default device


_PYTHON_TYPES: dict[str, type] = {"bool": bool, "int": int, "float": float}


def _restore_target(target: Any, saved: list[Any]) -> Any:
    """What orbax restores one saved leaf into."""
    import orbax.checkpoint as ocp

    if saved[1] == "python":
        return _PYTHON_TYPES.get(saved[3], float)()  # False, 0 or 0.0: a placeholder
    if isinstance(target, jax.Array):
        return ocp.utils.to_shape_dtype_struct(target)
    if isinstance(target, jax.ShapeDtypeStruct) and saved[1] == "jax":
        sharding = target.sharding or jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        return jax.ShapeDtypeStruct(target.shape, target.dtype, sharding=sharding)  # type: ignore[no-untyped-call]
    dtype = target.dtype if isinstance(target, np.ndarray | np.generic) else saved[3]
    return _abstract(saved[2], dtype)


def _abstract(shape: Sequence[int], dtype: Any) -> Any:
    """A host (NumPy) array to restore into, as orbax wants it: no sharding."""
    return jax.ShapeDtypeStruct(tuple(shape), np.dtype(dtype))  # type: ignore[no-untyped-call]


def _abstract_state(target: Any, saved: list[list[Any]]) -> Any:
    """What orbax restores a state saved as described by ``saved`` into, shaped like
    ``target`` (``None`` when no leaf was saved)."""
    if not any(d[4] for d in saved):
        return None
    leaves, treedef = _flatten(target)
    abstract = [
        _restore_target(leaf, d) if d[4] else None
        for (_, leaf), d in zip(leaves, saved, strict=True)
    ]
    return _wrap(jax.tree_util.tree_unflatten(treedef, abstract), treedef)


def _fill(target: Any, saved: list[list[Any]], restored: Any) -> Any:
    """``target`` with the restored leaves, each placed like the target's."""
    leaves, treedef = _flatten(target)
    if restored is None:
        return jax.tree_util.tree_unflatten(treedef, [_unsaved(leaf) for _, leaf in leaves])
    tree = restored["value"] if jax.tree_util.treedef_is_leaf(treedef) else restored
    values, _ = _flatten(tree)
    return jax.tree_util.tree_unflatten(
        treedef,
        [
            _like(leaf, value, d) if d[4] else _unsaved(leaf)
            for (_, leaf), (_, value), d in zip(leaves, values, saved, strict=True)
        ],
    )


# --- what of a loop is saved --------------------------------------------------------------------
def _stateful(owner: Any) -> bool:
    return is_stateful(owner)


def _is_pytree_node(value: Any) -> bool:
    return not jax.tree_util.treedef_is_leaf(jax.tree_util.tree_structure(value))


def checkpointed_tasks(
    tasks: Sequence[tuple[Any, Sequence[Any]]],
) -> list[tuple[Any, Sequence[Any]]]:
    """The tasks whose schedules' state a checkpoint holds, in order: all but those whose
    every callback is a watcher outside the run (``__loop_transient__``: a watchdog), which
    a resumed run may add or leave out."""
    return [
        (schedule, callbacks)
        for schedule, callbacks in tasks
        if not callbacks
        or not all(getattr(getattr(c, "fn", c), "__loop_transient__", False) for c in callbacks)
    ]


def stateful_callbacks(tasks: Sequence[tuple[Any, Sequence[Any]]]) -> list[Any]:
    """The distinct callback objects of ``tasks`` with ``state_dict``/``load_state_dict``
    (also reached through their bound methods; a state's own methods are not callbacks):
    those whose state a checkpoint holds, in this order."""
    found: dict[int, Any] = {}
    for _, callbacks in tasks:
        for callback in callbacks:
            fn = getattr(callback, "fn", callback)
            owner = getattr(fn, "__self__", None)
            for candidate in (fn, owner):
                if candidate is None or not _stateful(candidate):
                    continue
                if candidate is owner and _is_pytree_node(owner):
                    continue
                found.setdefault(id(candidate), candidate)
                break
    return list(found.values())


def callback_name(owner: Any) -> str:
    """The name a checkpoint records for a stateful callback (its class's qualname)."""
    return type(owner).__qualname__


def is_sequence(dataset: Any) -> bool:
    """Whether ``dataset`` is indexable by batch (a sequence, a NumPy or JAX array)."""
    return isinstance(dataset, np.ndarray | jax.Array) or (
        isinstance(dataset, Sequence) and not isinstance(dataset, str | bytes)
    )


def is_stateful_dataset(dataset: Any) -> bool:
    """Whether a checkpoint holds ``dataset.state_dict()`` (a non-sequence with
    ``state_dict`` and ``load_state_dict``)."""
    return _stateful(dataset) and not is_sequence(dataset)


def _extract_copies(value: Any, state_def: Any, copies: dict[str, Any]) -> Any:
    """``value`` with every pytree shaped like the state (early stopping's best state...)
    moved to ``copies`` and replaced by a reference: orbax saves them like the state."""
    leaves, treedef = _flatten(value)
    if treedef == state_def:
        name = f"s{len(copies)}"
        copies[name] = value
        return {_STATE: name, "leaves": [_describe(p, leaf) for p, leaf in leaves]}
    if isinstance(value, Mapping):
        return {key: _extract_copies(item, state_def, copies) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_extract_copies(item, state_def, copies) for item in value]
    return value


# --- writing ------------------------------------------------------------------------------------
def _host_copy(tree: Any) -> Any:
    """``tree`` with its arrays copied to host memory, all transfers at once: JAX arrays
    become NumPy arrays (PRNG key arrays stay JAX arrays, copied: they are small, and orbax
    saves them with their implementation), NumPy arrays are copied. What the loop does with
    the state afterwards (donating its buffers, updating NumPy arrays in place) cannot
    change the copy."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    on_device = [leaf for leaf in leaves if isinstance(leaf, jax.Array) and not _is_key(leaf)]
    fetched = iter(jax.device_get(on_device))

    def copy(leaf: Any) -> Any:
        if isinstance(leaf, jax.Array):
            if _is_key(leaf):
                data = np.array(jax.random.key_data(leaf))
                return jax.random.wrap_key_data(
                    jax.device_put(data, leaf.sharding), impl=jax.random.key_impl(leaf)
                )
            return next(fetched)
        return leaf.copy() if isinstance(leaf, np.ndarray) else leaf

    return jax.tree_util.tree_unflatten(treedef, [copy(leaf) for leaf in leaves])


def _items(loop_state: LoopState, *, host_copy: bool) -> dict[str, Any]:
    """The items of a checkpoint of ``loop_state`` (see the tables above), unwrapped; with
    ``host_copy``, nothing in them refers to the live state (see :func:`snapshot`)."""
    state_tree, described = _state_to_save(loop_state.state)
    state_def = _flatten(loop_state.state)[1]
    copies: dict[str, Any] = {}
    owners = stateful_callbacks(loop_state.inputs.tasks)
    callbacks = [{"name": callback_name(owner), "state": owner.state_dict()} for owner in owners]
    if not jax.tree_util.treedef_is_leaf(state_def):
        callbacks = _extract_copies(callbacks, state_def, copies)
    dataset = loop_state.inputs.dataset
    live: dict[str, Any] = _host.to_host(
        {
            "logs": {c: dict(entries) for c, entries in loop_state.accumulated_logs.items()},
            "callbacks": callbacks,
            "dataset": dataset.state_dict() if is_stateful_dataset(dataset) else None,
        }
    )
    if live["dataset"] is not None and jax.process_count() > 1:
        live["dataset"] = {PER_PROCESS: _gather_data_state(live["dataset"])}
    arrays: dict[str, np.ndarray] = {}
    meta = {
        "format": FORMAT,
        "elapsed": loop_state.elapsed.to_dict(),
        "initial_elapsed": loop_state.initial_elapsed.to_dict(),
        "data": {
            "position": loop_state.elapsed.steps
            - loop_state.initial_elapsed.steps
            + loop_state.skipped_batches,
            "state": _split(live["dataset"], arrays, "the dataset's state_dict()"),
            **({"skipped": loop_state.skipped_batches} if loop_state.skipped_batches else {}),
        },
        "state_leaves": described,
        "schedules": copy.deepcopy(
            [schedule.state_dict() for schedule, _ in checkpointed_tasks(loop_state.inputs.tasks)]
        ),
        "callbacks": [
            {
                "name": c["name"],
                "state": _split(c["state"], arrays, f"the state_dict() of callback {c['name']}"),
            }
            for c in live["callbacks"]
        ],
        "history": _split(loop_state.history.state_dict(), arrays, "the history"),
        "logs": _split(live["logs"], arrays, "the latest logs"),
        "end": copy.deepcopy(loop_state.ending),
    }
    saved_copies = {}
    for name, tree in copies.items():
        to_save, _ = _state_to_save(tree)
        if to_save is not None:
            saved_copies[name] = to_save
    items: dict[str, Any] = {"meta": meta}
    if state_tree is not None:
        items["state"] = _host_copy(state_tree) if host_copy else state_tree
    if saved_copies:
        items["copies"] = _host_copy(saved_copies) if host_copy else saved_copies
    if arrays:
        items["arrays"] = arrays
    return items


def all_finite(state: Any) -> bool:
    """Whether every float leaf of ``state`` is finite (no NaN, no inf).

    Example:
        >>> all_finite({"w": np.ones(2), "n": 3}), all_finite([np.array([1.0, np.nan])])
        (True, False)
    """
    host: list[Any] = []
    device: list[Any] = []
    for leaf in jax.tree_util.tree_leaves(state):
        if isinstance(leaf, jax.Array):
            if jnp.issubdtype(leaf.dtype, jnp.inexact) and leaf.size:
                device.append(leaf)
        elif isinstance(leaf, float | np.floating | np.ndarray) and np.issubdtype(
            np.asarray(leaf).dtype, np.inexact
        ):
            host.append(leaf)
    if not all(bool(np.isfinite(leaf).all()) for leaf in host):
        return False
    return not device or bool(_device_finite(device))


@jax.jit
def _device_finite(leaves: list[jax.Array]) -> jax.Array:
    # one reduction per leaf, one transfer of one bool for the whole state
    return jnp.all(jnp.stack([jnp.isfinite(leaf).all() for leaf in leaves]))


class Snapshot(NamedTuple):
    """A checkpoint taken at the end of a step, ready to be written (:func:`snapshot`)."""

    step: int  #: the checkpoint's step (``elapsed.steps``)
    items: dict[str, Any]  #: the items of the tables above


def snapshot(loop_state: LoopState, *, host_copy: bool) -> Snapshot:
    """Takes what a checkpoint of ``loop_state`` holds, at the end of a step.

    With ``host_copy``, the arrays are copied to host memory (one transfer of the state,
    :func:`jax.device_get`), so the snapshot can be written while the loop goes on: later
    steps change nothing in it. Only for arrays this process holds whole (one process);
    otherwise the state's arrays are kept as they are, and orbax copies the local shards.
    """
    return Snapshot(loop_state.elapsed.steps, _items(loop_state, host_copy=host_copy))


def write(
    manager: Any,
    snapshot: Snapshot,
    *,
    value: float | None = None,
    monitor: str | None = None,
    mode: str = "min",
    finite: bool | None = None,
) -> bool:
    """Writes ``snapshot`` as checkpoint ``snapshot.step`` with ``manager`` (from
    :func:`open_writer`); with ``value``, the monitored value that ranks it. With an async
    manager the write goes on in the background (``manager.wait_until_finished()``).
    Returns whether the state is finite: the orbax metrics say so (``{"finite": bool}``),
    so that a non-finite state never evicts the newest finite checkpoint and resume and
    restore pass it over.

    Raises:
        WriteFailed: orbax could not write it (or, async, start writing it).
    """
    import orbax.checkpoint as ocp

    items = snapshot.items
    finite = all_finite(items.get("state")) if finite is None else finite
    args = {
        name: ocp.args.JsonSave(item) if name == "meta" else ocp.args.StandardSave(item)
        for name, item in items.items()
    }
    metrics: dict[str, Any] = {"finite": finite}
    if value is not None:
        metrics.update(value=value, monitor=monitor, mode=mode)
    try:
        manager.save(snapshot.step, args=ocp.args.Composite(**args), metrics=metrics, force=True)
    except Exception as error:
        raise WriteFailed(str(error)) from error
    return finite


def abandon_writes() -> None:
    """The process ends while orbax writes (a second Ctrl-C during a save): orbax's threads
    then fail as the interpreter shuts down (``cannot schedule new futures after interpreter
    shutdown``, ``Event loop is closed``), and their tracebacks say nothing the user does
    not know. Silences orbax's logs and the errors of threads other than the main one."""
    for name in ("absl", "asyncio"):
        logging.getLogger(name).disabled = True
    previous = threading.excepthook

    def quiet(args: Any) -> None:
        if args.thread is threading.main_thread():
            previous(args)

    threading.excepthook = quiet


class WriteFailed(RuntimeError):
    """orbax could not write a checkpoint (its directory cannot be written, a full
    disk...); the cause is orbax's error."""


# --- reading ------------------------------------------------------------------------------------
class Contents(NamedTuple):
    """What one checkpoint holds, read back (the ``meta`` fields, decoded)."""

    step: int  #: the checkpoint's step (``elapsed.steps``)
    state: Any  #: the state, in the structure and placement of the target
    elapsed: Elapsed
    initial_elapsed: Elapsed
    history: dict[str, Any]  #: for ``History.load_state_dict``
    schedules: list[Any]  #: each task's schedule state, in task order
    callbacks: list[tuple[str, Any]]  #: ``(callback_name, state)`` of each stateful callback
    logs: dict[str, Any]  #: the loop's latest logs, ``{collection: {name: value}}``
    data_position: int  #: how many batches the run had drawn from its dataset
    data_state: Any  #: this process's ``state_dict()`` of the dataset, ``None``, or OtherTopology
    data_skipped: int = 0  #: how many of the batches drawn rollbacks skipped


class DamagedCheckpoint(ValueError):
    """A checkpoint that cannot be read: a truncated or missing file, a missing item, bad
    JSON. Its message names the step, the file and the fix; ``step`` and ``file`` say them.
    """

    def __init__(self, message: str, *, step: int, file: str) -> None:
        super().__init__(message)
        self.step, self.file = step, file


_REQUIRED_META = (
    "elapsed",
    "initial_elapsed",
    "data",
    "state_leaves",
    "schedules",
    "callbacks",
    "history",
    "logs",
)
_FILE_IN_ERROR = re.compile(r'(?:local )?file "([^"]+)"')

#: Checkpoints passed over by a read in this process, ``{path: {step: why}}``:
#: ``"damaged"`` or ``"non-finite"``. The writer of ``path`` replaces them when it reaches
#: their step, setting them aside (:func:`set_aside`), never deleting them.
_passed_over: dict[str, dict[int, str]] = {}


def passed_over(path: str) -> dict[int, str]:
    """The steps of ``path`` that a resume or restore of this process passed over, with
    why (``"damaged"``, ``"non-finite"``)."""
    return dict(_passed_over.get(path, {}))


_DAMAGED = (
    "checkpoint {step} in {path!r} is damaged: cannot read {file!r} ({error_kind}: {error}). "
    "Restore another step (step=..., this directory holds {others}), or resume=, which falls "
    "back to the newest intact checkpoint; move {step_directory!r} away to keep it from being "
    "tried."
)


def _damaged(path: str, step: int, file: str, error: BaseException, steps: list[int]) -> Any:
    others = sorted(s for s in steps if s != step)
    return DamagedCheckpoint(
        _DAMAGED.format(
            step=step,
            path=path,
            file=file,
            error_kind=type(error).__name__,
            error=str(error)[:200],
            others=others,
            step_directory=os.path.join(path, str(step)),
        ),
        step=step,
        file=file,
    )


def read_ending(manager: Any, step: int) -> dict[str, Any] | None:
    """The ``end`` field of checkpoint ``step``: why and where its run ended, or ``None``
    (a run that had not ended, a checkpoint without the field, or one whose metadata
    cannot be read: :func:`read` then names the damage)."""
    import orbax.checkpoint as ocp

    try:
        meta = manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
        ending = meta["meta"].get("end")
    except Exception:
        return None
    return ending if isinstance(ending, dict) and "reason" in ending else None


def record_ending(path: str, step: int, ending: dict[str, Any]) -> None:
    """Writes ``ending`` into the ``end`` field of checkpoint ``step``, already written at
    the step where its run then ended (an epoch's end that was the run's last step): the
    rest of a checkpoint taken at that step is what it holds. Only the ``meta`` item's JSON
    file changes, replaced whole (atomically on a local disk)."""
    from etils import epath  # type: ignore[import-untyped]

    meta_file = epath.Path(path) / str(step) / "meta" / "metadata"
    meta = json.loads(meta_file.read_text())
    meta["end"] = copy.deepcopy(ending)
    text = json.dumps(meta)
    if "://" in path:
        meta_file.write_text(text)
        return
    partial = f"{os.fspath(meta_file)}.ciclo-partial"
    with open(partial, "w") as f:
        f.write(text)
    os.replace(partial, os.fspath(meta_file))


_NOT_A_CICLO_CHECKPOINT = (
    "{where} was not written by ciclo.checkpoint (or by an incompatible version: format "
    "{found}, expected {expected})."
)


def read(manager: Any, path: str, step: int, target: Any, *, copies: bool = True) -> Contents:
    """Reads checkpoint ``step`` of ``manager`` (from :func:`open_reader`) into the
    structure of ``target``; the state-shaped trees of callback states only when
    ``copies`` (a resumed loop needs them, ``restore`` does not: they come back ``None``).

    Raises:
        DamagedCheckpoint: a file or item of the checkpoint is missing or unreadable.
        ValueError: not a ciclo checkpoint (of this format), or ``target`` does not have
            the saved structure.
    """
    import orbax.checkpoint as ocp

    where = f"checkpoint {step} in {path!r}"
    steps = steps_on_disk(manager, path)
    if step in _unreadable.get(path, {}):
        raise _damaged(path, step, *_unreadable[path][step], steps)
    meta_file = os.path.join(path, str(step), "meta", "metadata")
    try:
        meta = manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
        meta = meta["meta"]
    except Exception as error:
        raise _damaged(path, step, meta_file, error, steps) from error
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        if meta is None or (isinstance(meta, dict) and "format" not in meta):
            raise _damaged(path, step, meta_file, ValueError("no format field"), steps)
        found = meta.get("format") if isinstance(meta, dict) else None
        raise ValueError(_NOT_A_CICLO_CHECKPOINT.format(where=where, found=found, expected=FORMAT))
    missing = [key for key in _REQUIRED_META if key not in meta]
    if missing:
        raise _damaged(path, step, meta_file, KeyError(f"missing fields {missing}"), steps)
    described = [_describe(p, leaf) for p, leaf in _flatten(target)[0]]
    _check_structure(meta["state_leaves"], described, where)
    items: dict[str, Any] = {}
    abstract = _abstract_state(target, meta["state_leaves"])
    if abstract is not None:
        items["state"] = ocp.args.StandardRestore(abstract)
    arrays_refs: list[dict[str, Any]] = []
    copies_refs: list[dict[str, Any]] = []
    _collect_references(meta, arrays_refs, copies_refs)
    if arrays_refs:
        items["arrays"] = ocp.args.StandardRestore(
            {ref[_ARRAY]: _abstract(ref["shape"], ref["dtype"]) for ref in arrays_refs}
        )
    copies_abstract = {}
    if not copies:
        copies_refs = []
    for ref in copies_refs:
        _check_structure(ref["leaves"], described, f"a copy of the state in {where}")
        copy_abstract = _abstract_state(target, ref["leaves"])
        if copy_abstract is not None:
            copies_abstract[ref[_STATE]] = copy_abstract
    if copies_abstract:
        items["copies"] = ocp.args.StandardRestore(copies_abstract)
    try:
        restored = manager.restore(step, args=ocp.args.Composite(**items)) if items else {}
    except Exception as error:
        if "tree structures do not match" in str(error):  # orbax's own structure check
            difference = _saved_difference(path, step, target)
            raise structure_error(where, difference) from None
        found = _FILE_IN_ERROR.search(str(error))
        file = found.group(1) if found else os.path.join(path, str(step), *items.keys())
        raise _damaged(path, step, file, error, steps) from error
    state = _fill(target, meta["state_leaves"], restored["state"] if "state" in items else None)
    restored_copies = restored["copies"] if "copies" in items else {}
    filled = {
        ref[_STATE]: _fill(target, ref["leaves"], restored_copies.get(ref[_STATE]))
        for ref in copies_refs
    }
    arrays = restored["arrays"] if "arrays" in items else {}
    meta = _join(meta, arrays, filled)
    return Contents(
        step=step,
        state=state,
        elapsed=Elapsed(**meta["elapsed"]),
        initial_elapsed=Elapsed(**meta["initial_elapsed"]),
        history=meta["history"],
        schedules=meta["schedules"],
        callbacks=[(c["name"], c["state"]) for c in meta["callbacks"]],
        logs=meta["logs"],
        data_position=int(meta["data"]["position"]),
        data_state=_own_data_state(meta["data"]["state"]),
        data_skipped=int(meta["data"].get("skipped", 0)),
    )


#: The key of the data state of a run of several processes: one state per process.
PER_PROCESS = "per_process"

_DATA_STATE_NOT_JSON = (
    "with several processes, a dataset's state_dict() must hold JSON values (numbers, "
    "strings, lists, dicts) so that process 0 can save every process's state: {error}. "
    "Return plain values from the dataset's state_dict()."
)


def _gather_data_state(state: Any) -> list[Any]:
    """Every process's dataset ``state_dict()``, in process order (each process draws its
    own part of the data, so each has its own position)."""
    try:
        return gather_to_all("data-state", _json_ready(state))
    except TypeError as error:
        raise TypeError(_DATA_STATE_NOT_JSON.format(error=error)) from None


def _json_ready(value: Any) -> Any:
    if isinstance(value, np.ndarray | np.generic):
        return value.tolist()
    if isinstance(value, Mapping):
        return {str(k): _json_ready(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_ready(v) for v in value]
    return value


class OtherTopology(NamedTuple):
    """The dataset states of a checkpoint written by another number of processes than this
    run has, one per process that wrote it (a run of one process saves one state). Whether
    they can be re-split over this run's processes is the dataset's business (see
    ``_resume.skip_consumed``)."""

    states: list[Any]


def _own_data_state(saved: Any) -> Any:
    """This process's dataset state out of what a checkpoint holds, or an
    :class:`OtherTopology` when another number of processes wrote it."""
    if saved is None:
        return None
    per_process = isinstance(saved, Mapping) and set(saved) == {PER_PROCESS}
    states = list(saved[PER_PROCESS]) if per_process else [saved]  # one process: one state
    if len(states) != jax.process_count():
        return OtherTopology(states)
    return states[jax.process_index()]


def _normal_paths(tree: Any) -> dict[str, str]:
    """``{normalized path: shown path}`` of the leaves of ``tree``, empty inner nodes counted
    as leaves; normalized as orbax stores a tree (tuples as lists, named fields as keys)."""

    def empty(x: Any) -> bool:  # None, or a node without leaves (optax's EmptyState())
        return x is None or jax.tree_util.tree_structure(x).num_leaves == 0  # type: ignore[attr-defined]

    def part(key: Any) -> str:
        for attribute in ("key", "idx", "name"):
            if hasattr(key, attribute):
                return str(getattr(key, attribute))
        return str(key)

    leaves = jax.tree_util.tree_flatten_with_path(tree, is_leaf=empty)[0]
    return {"/".join(part(k) for k in p): jax.tree_util.keystr(p) for p, _ in leaves}


def _saved_difference(path: str, step: int, target: Any) -> str:
    """The first path where ``target`` differs from the state saved in checkpoint
    ``step`` (read from orbax's metadata of the ``state`` item)."""
    try:
        import orbax.checkpoint as ocp
        from etils import epath  # type: ignore[import-untyped]

        saved = ocp.StandardCheckpointHandler().metadata(epath.Path(path) / str(step) / "state")
        saved_paths = _normal_paths(getattr(saved, "tree", saved))
        tree = _state_to_save(target)[0]
        target_paths = _normal_paths(tree)
    except Exception:  # the metadata could not tell: say what is known
        return "the same leaves, in a different tree (e.g. adam vs adamw optimizer states)"
    for normal, shown in target_paths.items():
        if normal not in saved_paths:
            return f"first differing path: {shown}, in the state but not in the checkpoint"
    for normal in saved_paths:
        if normal not in target_paths:
            return f"first differing path: {normal!r}, in the checkpoint but not in the state"
    return "the same leaves, in a different tree (e.g. adam vs adamw optimizer states)"


def is_finite_step(manager: Any, step: int) -> bool:
    """Whether checkpoint ``step`` holds a finite state (by its orbax metrics; unreadable
    metrics count as finite: reading it then tells)."""
    try:
        return _finite_metrics(manager.metrics(step))
    except Exception:
        return True


_NON_FINITE_PASSED_OVER = (
    "ciclo: checkpoints {nonfinite} in {path!r} hold a non-finite state (NaN or inf, saved "
    "when the run stopped); reading checkpoint {step}, the newest finite one. They are left "
    "in place: restore(step=...) reads them."
)


def read_newest(manager: Any, path: str, target: Any, *, copies: bool = True) -> Contents:
    """Reads the newest intact checkpoint of a finite state (:func:`read`).

    Damaged checkpoints are passed over with a warning naming the step and the file;
    checkpoints of a non-finite state (saved at a stop after a NaN) are passed over with a
    warning while an older finite one exists. Nothing is deleted.

    Raises:
        DamagedCheckpoint: every checkpoint is damaged (the newest one's error).
        ValueError: ``target`` does not have the saved structure (not passed over: the
            other checkpoints have the same structure).
    """
    steps = steps_on_disk(manager, path)[::-1]
    finite = [step for step in steps if is_finite_step(manager, step)]
    order = finite + [step for step in steps if step not in finite]
    skipped = _passed_over.setdefault(path, {})
    first_error: DamagedCheckpoint | None = None
    for step in order:
        try:
            contents = read(manager, path, step, target, copies=copies)
        except DamagedCheckpoint as error:
            first_error = first_error or error
            skipped[step] = "damaged"
            warnings.warn(
                f"ciclo: passing over damaged checkpoint {step} ({error.file!r}); reading "
                f"the next older one. The damaged one is left in place.",
                RuntimeWarning,
                stacklevel=3,
            )
            continue
        nonfinite = [s for s in steps if s > step and s not in finite]
        for later in nonfinite:
            skipped[later] = "non-finite"
        if nonfinite:
            warnings.warn(
                _NON_FINITE_PASSED_OVER.format(nonfinite=sorted(nonfinite), path=path, step=step),
                RuntimeWarning,
                stacklevel=3,
            )
        elif step not in finite:
            warnings.warn(
                f"ciclo: checkpoint {step} in {path!r} holds a non-finite state (NaN or "
                f"inf) and no older intact checkpoint is finite; reading it.",
                RuntimeWarning,
                stacklevel=3,
            )
        return contents
    assert first_error is not None
    raise first_error


def set_aside(path: str, step: int, why: str) -> str:
    """Renames the step directory of checkpoint ``step`` to ``<step>.<why>[.n]`` (a name
    orbax does not read as a step), so a new checkpoint of that step can be written;
    returns the new path. Local directories only (a URL's is left in place)."""
    source = os.path.join(path, str(step))
    target = f"{source}.{why}"
    n = 1
    while os.path.exists(target):
        n += 1
        target = f"{source}.{why}.{n}"
    os.rename(source, target)
    return target


def best_step(manager: Any, path: str) -> int:
    """The step whose monitored value is best (``ciclo.checkpoint(monitor=...)``).

    Raises:
        ValueError: no checkpoint has a monitored value (NaN values count as none).
    """
    scored: list[tuple[float, int]] = []
    for step in manager.all_steps():
        metrics = manager.metrics(step)
        if isinstance(metrics, Mapping) and "value" in metrics and _finite_metrics(metrics):
            value = float(metrics["value"])
            if math.isnan(value):
                continue
            scored.append((value if metrics.get("mode") == "min" else -value, step))
    if not scored:
        raise ValueError(
            f"no checkpoint in {path!r} has a monitored value, so none is best: write "
            f"checkpoints with ciclo.checkpoint({path!r}, monitor='<log entry>', mode=...)."
        )
    return min(scored)[1]
