"""The checkpoint codec. The state is saved in its own structure, leaves orbax cannot store
left out and every leaf described in ``state_leaves`` (:func:`describe`), which a restore
target is checked against (:func:`check_structure`) and filled from (:func:`fill`). ``meta``
is JSON: its NumPy arrays go to the ``arrays`` item (:func:`split`) and its state-shaped trees
to the ``copies`` item (:func:`extract_copies`), both by reference; :func:`join` undoes both.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

ARRAY = "__ciclo_array__"  # a reference from ``meta`` into the ``arrays`` item
STATE = "__ciclo_state__"  # a reference from ``meta`` into the ``copies`` item
_VALUE_KINDS = ("jax", "numpy", "numpy-scalar", "python", "shape")


# --- plain-Python metadata with NumPy arrays ------------------------------------------------
_NOT_SAVABLE = (
    "cannot save {where} in a checkpoint: it holds a {kind} ({text!r}). A checkpoint stores "
    "JSON values (dicts with str keys, lists, str, int, float, bool, None) and NumPy arrays."
)


def split(value: Any, arrays: dict[str, np.ndarray], where: str) -> Any:
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
            out[key] = split(item, arrays, f"{where}[{key!r}]")
        return out
    if isinstance(value, list | tuple):
        return [split(item, arrays, f"{where}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, np.ndarray | np.generic) and value.dtype != object:
        array = np.asarray(value)
        ref: dict[str, Any] = {
            ARRAY: None,
            "shape": list(array.shape),
            "dtype": array.dtype.name,
            "scalar": isinstance(value, np.generic),
        }
        if array.size:  # orbax cannot store empty arrays; their shape says it all
            ref[ARRAY] = f"a{len(arrays)}"
            arrays[ref[ARRAY]] = array.copy() if isinstance(value, np.ndarray) else array
        return ref
    raise TypeError(
        _NOT_SAVABLE.format(where=where, kind=type(value).__name__, text=str(value)[:60])
    )


def join(value: Any, arrays: Mapping[str, Any], copies: Mapping[str, Any]) -> Any:
    """Undoes :func:`split` (tuples come back as lists) and puts back the state-shaped
    trees of :func:`extract_copies`."""
    if isinstance(value, dict):
        if STATE in value:
            return copies.get(value[STATE])  # None when they were not read
        if ARRAY in value:
            name = value[ARRAY]
            dtype = np.dtype(value["dtype"])
            array = (
                np.zeros(value["shape"], dtype)
                if name is None
                else np.asarray(arrays[name], dtype=dtype)
            )
            return array[()] if value["scalar"] else array
        return {key: join(item, arrays, copies) for key, item in value.items()}
    if isinstance(value, list):
        return [join(item, arrays, copies) for item in value]
    return value


def collect_references(
    value: Any, arrays: list[dict[str, Any]], copies: list[dict[str, Any]]
) -> None:
    if isinstance(value, dict):
        if ARRAY in value:
            if value[ARRAY] is not None:
                arrays.append(value)
            return
        if STATE in value:
            copies.append(value)
            return
        for item in value.values():
            collect_references(item, arrays, copies)
    elif isinstance(value, list):
        for item in value:
            collect_references(item, arrays, copies)


# --- the state pytree ------------------------------------------------------------------------
def flatten(state: Any) -> tuple[list[tuple[Any, Any]], Any]:
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


def describe(path: Any, leaf: Any) -> list[Any]:
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


def state_to_save(state: Any) -> tuple[Any, list[list[Any]]]:
    """The tree orbax saves (unsaved leaves as ``None``; ``None`` if nothing is saved) and
    the description of every leaf."""
    leaves, treedef = flatten(state)
    described = [describe(path, leaf) for path, leaf in leaves]
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


def check_structure(saved: list[list[Any]], target: list[list[Any]], where: str) -> None:
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


def is_key(value: Any) -> bool:
    return bool(jnp.issubdtype(value.dtype, jax.dtypes.prng_key))


def _uncommitted(value: Any) -> Any:
    """``value`` as an uncommitted array on the default device (free to move, as a freshly
    created array is), through host memory."""
    if is_key(value):
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
    if saved[1] == "python":
        return _PYTHON_TYPES.get(saved[3], float)()  # False, 0 or 0.0: a placeholder
    if isinstance(target, jax.Array):
        return jax.ShapeDtypeStruct(target.shape, target.dtype, sharding=target.sharding)  # type: ignore[no-untyped-call]
    if isinstance(target, jax.ShapeDtypeStruct) and saved[1] == "jax":
        sharding = target.sharding or jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        return jax.ShapeDtypeStruct(target.shape, target.dtype, sharding=sharding)  # type: ignore[no-untyped-call]
    dtype = target.dtype if isinstance(target, np.ndarray | np.generic) else saved[3]
    return abstract(saved[2], dtype)


def abstract(shape: Sequence[int], dtype: Any) -> Any:
    """A host (NumPy) array to restore into, as orbax wants it: no sharding."""
    return jax.ShapeDtypeStruct(tuple(shape), np.dtype(dtype))  # type: ignore[no-untyped-call]


def abstract_state(target: Any, saved: list[list[Any]]) -> Any:
    """What orbax restores a state saved as described by ``saved`` into, shaped like
    ``target`` (``None`` when no leaf was saved)."""
    if not any(d[4] for d in saved):
        return None
    leaves, treedef = flatten(target)
    abstract = [
        _restore_target(leaf, d) if d[4] else None
        for (_, leaf), d in zip(leaves, saved, strict=True)
    ]
    return _wrap(jax.tree_util.tree_unflatten(treedef, abstract), treedef)


def fill(target: Any, saved: list[list[Any]], restored: Any) -> Any:
    """``target`` with the restored leaves, each placed like the target's."""
    leaves, treedef = flatten(target)
    if restored is None:
        return jax.tree_util.tree_unflatten(treedef, [_unsaved(leaf) for _, leaf in leaves])
    tree = restored["value"] if jax.tree_util.treedef_is_leaf(treedef) else restored
    values, _ = flatten(tree)
    return jax.tree_util.tree_unflatten(
        treedef,
        [
            _like(leaf, value, d) if d[4] else _unsaved(leaf)
            for (_, leaf), (_, value), d in zip(leaves, values, saved, strict=True)
        ],
    )


def extract_copies(value: Any, state_def: Any, copies: dict[str, Any]) -> Any:
    """``value`` with every pytree shaped like the state (early stopping's best state...)
    moved to ``copies`` and replaced by a reference: orbax saves them like the state."""
    leaves, treedef = flatten(value)
    if treedef == state_def:
        name = f"s{len(copies)}"
        copies[name] = value
        return {STATE: name, "leaves": [describe(p, leaf) for p, leaf in leaves]}
    if isinstance(value, Mapping):
        return {key: extract_copies(item, state_def, copies) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [extract_copies(item, state_def, copies) for item in value]
    return value


def host_copy(tree: Any) -> Any:
    """``tree`` with its arrays copied to host memory, all transfers at once: JAX arrays
    become NumPy arrays (PRNG key arrays stay JAX arrays, copied: they are small, and orbax
    saves them with their implementation), NumPy arrays are copied. What the loop does with
    the state afterwards (donating its buffers, updating NumPy arrays in place) cannot
    change the copy."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    on_device = [leaf for leaf in leaves if isinstance(leaf, jax.Array) and not is_key(leaf)]
    fetched = iter(jax.device_get(on_device))

    def copy(leaf: Any) -> Any:
        if isinstance(leaf, jax.Array):
            if is_key(leaf):
                data = np.array(jax.random.key_data(leaf))
                return jax.random.wrap_key_data(
                    jax.device_put(data, leaf.sharding), impl=jax.random.key_impl(leaf)
                )
            return next(fetched)
        return leaf.copy() if isinstance(leaf, np.ndarray) else leaf

    return jax.tree_util.tree_unflatten(treedef, [copy(leaf) for leaf in leaves])


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


def saved_difference(saved: Any, target: Any) -> str:
    """The first path where ``target`` differs from ``saved``, the tree orbax's metadata of
    a ``state`` item holds (``None`` when it could not be read)."""
    same = "the same leaves, in a different tree (e.g. adam vs adamw optimizer states)"
    try:
        saved_paths = _normal_paths(saved)
        target_paths = _normal_paths(state_to_save(target)[0])
    except Exception:  # the metadata could not tell: say what is known
        return same
    for normal, shown in target_paths.items():
        if normal not in saved_paths:
            return f"first differing path: {shown}, in the state but not in the checkpoint"
    for normal in saved_paths:
        if normal not in target_paths:
            return f"first differing path: {normal!r}, in the checkpoint but not in the state"
    return same
