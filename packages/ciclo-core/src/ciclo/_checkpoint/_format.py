"""The checkpoint format: the layout of a run on disk and the orbax managers that write and
read it. What a checkpoint holds of a loop is :mod:`._items`'s list; how arrays and the state
are encoded, :mod:`._codec`'s; which steps are intact and finite, :mod:`._integrity`'s.

A checkpoint directory is an orbax ``CheckpointManager`` directory; each checkpoint is one
orbax step, named after ``elapsed.steps``, with up to four orbax items:

==========  ================  ===================================================================
item        orbax handler     what it holds
==========  ================  ===================================================================
``state``   ``StandardSave``  the state pytree in its own structure (plain orbax can read it),
                              leaves orbax cannot store left out; a lone array is saved as
                              ``{"value": array}``; absent when no leaf can be saved. With one
                              process saved from a host copy, with several as JAX arrays;
                              restored into the target's placement.
``meta``    ``JsonSave``      ``format`` (:data:`FORMAT`), ``state_leaves`` (the state's leaves
                              described: :func:`._codec.describe`) and the fields of
                              :data:`._items.ITEMS`. Always present.
``arrays``  ``StandardSave``  the NumPy arrays found in ``meta`` (history columns...).
``copies``  ``StandardSave``  trees shaped like the state found in ``meta`` (early stopping's
                              best state), saved and restored like the state.
==========  ================  ===================================================================

The orbax metrics of every checkpoint hold ``{"finite": bool}``, and with ``monitor=``
``{"value", "monitor", "mode"}``, which rank checkpoints (:func:`best_step`).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax

from .._loop._state import LoopState
from . import _codec, _integrity, _items

__all__ = [
    "FORMAT",
    "Contents",
    "Snapshot",
    "WriteFailed",
    "checkpoint_path",
    "open_writer",
    "open_reader",
    "snapshot",
    "write",
    "read",
    "read_newest",
    "read_ending",
    "record_ending",
    "best_step",
]

#: The version written in ``meta["format"]``; a checkpoint with another one is refused.
FORMAT = 1


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
    return text if "://" in text else os.path.abspath(os.path.expanduser(text))


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
        return worst if math.isnan(value) or not _integrity.finite_metrics(metrics) else value

    kept: list[Any] = [_integrity.NewestFinite(), _integrity.Held(path)]
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
        step_name_format=_integrity.IntactSteps(path, ocp.step.standard_name_format()),
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
            raise FileNotFoundError(f"checkpoint directory {path!r} does not exist. {_GIVE}")
        if not os.path.isdir(path):
            raise NotADirectoryError(f"checkpoint directory {path!r} is a file. {_GIVE}")
    import orbax.checkpoint as ocp

    # Not read_only=True: orbax logs a warning for it. Nothing is written without a save.
    options = ocp.CheckpointManagerOptions(
        create=False,
        enable_async_checkpointing=False,
        step_name_format=_integrity.IntactSteps(path, ocp.step.standard_name_format()),
    )
    manager = ocp.CheckpointManager(path, options=options)
    if not _integrity.steps_on_disk(manager, path):
        manager.close()
        if not must_exist:
            return None
        raise FileNotFoundError(
            f"checkpoint directory {path!r} holds no checkpoint (interrupted writes do not "
            f"count). {_GIVE}"
        )
    return manager


_GIVE = "Give the directory that ciclo.checkpoint(...) wrote to."


class Snapshot(NamedTuple):
    """A checkpoint taken at the end of a step, ready to be written (:func:`snapshot`)."""

    step: int  #: the checkpoint's step (``elapsed.steps``)
    items: dict[str, Any]  #: the orbax items of the table above

    @property
    def nbytes(self) -> int:
        """The bytes of the arrays it holds."""
        return sum(getattr(leaf, "nbytes", 0) for leaf in jax.tree_util.tree_leaves(self.items))


def snapshot(loop_state: LoopState, *, host_copy: bool) -> Snapshot:
    """Takes what a checkpoint of ``loop_state`` holds, at the end of a step.

    With ``host_copy``, the arrays are copied to host memory (one transfer of the state,
    :func:`jax.device_get`), so the snapshot can be written while the loop goes on: later
    steps change nothing in it. Only for arrays this process holds whole (one process);
    otherwise the state's arrays are kept as they are, and orbax copies the local shards.
    """
    state_tree, described = _codec.state_to_save(loop_state.state)
    fields, arrays, copies = _items.encode(loop_state)
    items: dict[str, Any] = {"meta": {"format": FORMAT, "state_leaves": described, **fields}}
    saved_copies = {}
    for name, tree in copies.items():
        to_save, _ = _codec.state_to_save(tree)
        if to_save is not None:
            saved_copies[name] = to_save
    for name, tree in (("state", state_tree), ("copies", saved_copies or None)):
        if tree is not None:
            items[name] = _codec.host_copy(tree) if host_copy else tree
    if arrays:
        items["arrays"] = arrays
    return Snapshot(loop_state.elapsed.steps, items)


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
    Returns whether the state is finite (the orbax metrics say so, ``{"finite": bool}``).

    Raises:
        WriteFailed: orbax could not write it (or, async, start writing it).
    """
    import orbax.checkpoint as ocp

    items = snapshot.items
    finite = _codec.all_finite(items.get("state")) if finite is None else finite
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


class WriteFailed(RuntimeError):
    """orbax could not write a checkpoint (its directory cannot be written, a full
    disk...); the cause is orbax's error."""


class Contents(NamedTuple):
    """What one checkpoint holds, read back."""

    step: int  #: the checkpoint's step (``elapsed.steps``)
    state: Any  #: the state, in the structure and placement of the target
    fields: dict[str, Any]  #: the values of :data:`._items.ITEMS`, by key


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

    where = str(_items.Where(path, step))
    steps = _integrity.steps_on_disk(manager, path)
    if step in _integrity.unreadable.get(path, {}):
        raise _integrity.damaged(path, step, *_integrity.unreadable[path][step], steps)
    meta_file = os.path.join(path, str(step), "meta", "metadata")
    try:
        meta = manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
        meta = meta["meta"]
    except Exception as error:
        raise _integrity.damaged(path, step, meta_file, error, steps) from error
    if not isinstance(meta, dict) or "format" not in meta:
        raise _integrity.damaged(path, step, meta_file, ValueError("no format field"), steps)
    if meta["format"] != FORMAT:
        raise ValueError(
            f"{where} was not written by ciclo.checkpoint (or by an incompatible version: "
            f"format {meta['format']}, expected {FORMAT})."
        )
    missing = [key for key in ("state_leaves", *_items.missing_fields(meta)) if key not in meta]
    if missing:
        missed = KeyError(f"missing fields {missing}")
        raise _integrity.damaged(path, step, meta_file, missed, steps)
    described = [_codec.describe(p, leaf) for p, leaf in _codec.flatten(target)[0]]
    _codec.check_structure(meta["state_leaves"], described, where)
    items: dict[str, Any] = {}
    abstract = _codec.abstract_state(target, meta["state_leaves"])
    if abstract is not None:
        items["state"] = ocp.args.StandardRestore(abstract)
    arrays_refs: list[dict[str, Any]] = []
    copies_refs: list[dict[str, Any]] = []
    _codec.collect_references(meta, arrays_refs, copies_refs)
    if arrays_refs:
        items["arrays"] = ocp.args.StandardRestore(
            {ref[_codec.ARRAY]: _codec.abstract(ref["shape"], ref["dtype"]) for ref in arrays_refs}
        )
    copies_abstract = {}
    for ref in copies_refs if copies else []:
        _codec.check_structure(ref["leaves"], described, f"a copy of the state in {where}")
        copy_abstract = _codec.abstract_state(target, ref["leaves"])
        if copy_abstract is not None:
            copies_abstract[ref[_codec.STATE]] = copy_abstract
    if copies_abstract:
        items["copies"] = ocp.args.StandardRestore(copies_abstract)
    try:
        restored = manager.restore(step, args=ocp.args.Composite(**items)) if items else {}
    except Exception as error:
        if "tree structures do not match" in str(error):  # orbax's own structure check
            try:
                saved = ocp.StandardCheckpointHandler().metadata(_step_path(path, step) / "state")
            except Exception:
                saved = None
            difference = _codec.saved_difference(getattr(saved, "tree", saved), target)
            raise _codec.structure_error(where, difference) from None
        found = _integrity.FILE_IN_ERROR.search(str(error))
        file = found.group(1) if found else os.path.join(path, str(step), *items.keys())
        raise _integrity.damaged(path, step, file, error, steps) from error
    state = _codec.fill(target, meta["state_leaves"], restored.get("state"))
    filled = {
        ref[_codec.STATE]: _codec.fill(
            target, ref["leaves"], restored.get("copies", {}).get(ref[_codec.STATE])
        )
        for ref in (copies_refs if copies else [])
    }
    meta = _codec.join(meta, restored.get("arrays", {}), filled)
    return Contents(step, state, _items.decode(meta))


def read_newest(manager: Any, path: str, target: Any, *, copies: bool = True) -> Contents:
    """Reads the newest intact checkpoint of a finite state (:func:`read`; damaged and
    non-finite ones passed over with a warning: :func:`._integrity.newest`).

    Raises:
        DamagedCheckpoint: every checkpoint is damaged (the newest one's error).
        ValueError: ``target`` does not have the saved structure (not passed over: the
            other checkpoints have the same structure).
    """
    return _integrity.newest(
        manager, path, lambda step: read(manager, path, step, target, copies=copies)
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


def _step_path(path: str, step: int) -> Any:
    from etils import epath  # type: ignore[import-untyped]

    return epath.Path(path) / str(step)


def record_ending(path: str, step: int, ending: dict[str, Any]) -> None:
    """Writes ``ending`` into the ``end`` field of checkpoint ``step``, already written at
    the step where its run then ended (an epoch's end that was the run's last step): the
    rest of a checkpoint taken at that step is what it holds. Only the ``meta`` item's JSON
    file changes, replaced whole (atomically on a local disk)."""
    meta_file = _step_path(path, step) / "meta" / "metadata"
    meta = json.loads(meta_file.read_text())
    meta["end"] = ending
    text = json.dumps(meta)
    if "://" in path:
        meta_file.write_text(text)
        return
    partial = f"{os.fspath(meta_file)}.ciclo-partial"
    with open(partial, "w") as f:
        f.write(text)
    os.replace(partial, os.fspath(meta_file))


def best_step(manager: Any, path: str) -> int:
    """The step whose monitored value is best (``ciclo.checkpoint(monitor=...)``).

    Raises:
        ValueError: no checkpoint has a monitored value (NaN values count as none).
    """
    scored: list[tuple[float, int]] = []
    for step in manager.all_steps():
        metrics = manager.metrics(step)
        if (
            isinstance(metrics, Mapping)
            and "value" in metrics
            and _integrity.finite_metrics(metrics)
        ):
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
