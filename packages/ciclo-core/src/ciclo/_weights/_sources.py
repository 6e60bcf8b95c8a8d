"""Where weights come from: each source as ``{name: shape and dtype}``, read without
loading anything, and a reader that places the chosen arrays on the target's shardings
(each device reading only its part where the format allows: Orbax, safetensors)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import numpy as np

from ..managed._trainable import named_leaves, param_name

__all__ = ["Source", "open_source"]


class Source(NamedTuple):
    """``shapes``: ``{name: jax.ShapeDtypeStruct}`` of every array of the source;
    ``read({name: target leaf})``: those arrays, each with the dtype and sharding of its
    target."""

    shapes: dict[str, jax.ShapeDtypeStruct]
    read: Callable[[dict[str, Any]], dict[str, jax.Array]]


def _sds(shape: Any, dtype: Any) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(tuple(shape), np.dtype(dtype))  # type: ignore[no-untyped-call]


def _placed(value: Any, target: Any) -> jax.Array:
    if not isinstance(value, jax.Array):  # a host array, or a Python number
        value = np.asarray(value)
    placed: jax.Array = jax.device_put(value.astype(target.dtype), target.sharding)
    return placed


def _from_tree(tree: Any) -> Source:
    leaves = named_leaves(tree)

    def read(wanted: dict[str, Any]) -> dict[str, jax.Array]:
        return {name: _placed(leaves[name], target) for name, target in wanted.items()}

    shapes = {
        n: _sds(np.shape(x), getattr(x, "dtype", None) or np.result_type(x))
        for n, x in leaves.items()
    }
    return Source(shapes, read)


def _from_safetensors(path: str) -> Source:
    try:
        from safetensors import safe_open
    except ImportError as error:
        raise ImportError(f"reading {path!r} needs pip install ciclo-core[safetensors].") from error

    with safe_open(path, framework="numpy") as file:
        shapes = {
            name: _sds(
                file.get_slice(name).get_shape(),
                _SAFETENSORS_DTYPES[file.get_slice(name).get_dtype()],
            )
            for name in file.keys()  # noqa: SIM118 (safe_open is no mapping)
        }

    def read(wanted: dict[str, Any]) -> dict[str, jax.Array]:
        with safe_open(path, framework="numpy") as file:
            return {name: _read_slices(file, name, target) for name, target in wanted.items()}

    return Source(shapes, read)


def _read_slices(file: Any, name: str, target: Any) -> jax.Array:
    """Tensor ``name`` of an open safetensors file, each device reading only its slice."""
    part = file.get_slice(name)

    def read(index: Any) -> np.ndarray:
        return np.asarray(part[index] if index else file.get_tensor(name)).astype(target.dtype)

    return jax.make_array_from_callback(target.shape, target.sharding, read)


_SAFETENSORS_DTYPES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "I64": "int64", "I32": "int32",
    "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool",
}  # fmt: skip


def _from_msgpack(path: str) -> Source:
    try:
        from flax import serialization
    except ImportError as error:
        raise ImportError(f"reading {path!r} needs flax: pip install flax.") from error
    with open(path, "rb") as file:
        return _from_tree(serialization.msgpack_restore(file.read()))


def _from_orbax(path: str, prefix: str = "") -> Source:
    """A plain Orbax pytree checkpoint (``ocp.StandardCheckpointer``'s), or the part of it
    under ``prefix``."""
    import orbax.checkpoint as ocp
    from etils import epath  # type: ignore[import-untyped]

    handler, directory = ocp.PyTreeCheckpointHandler(), epath.Path(path)
    tree = handler.metadata(directory).tree
    found = {
        param_name(p)[len(prefix) :]: (p, m)
        for p, m in jax.tree_util.tree_flatten_with_path(tree)[0]
        if param_name(p).startswith(prefix) and hasattr(m, "shape")
    }
    shapes = {name: _sds(m.shape, m.dtype) for name, (_, m) in found.items()}

    def read(wanted: dict[str, Any]) -> dict[str, jax.Array]:
        by_path = {found[name][0]: target for name, target in wanted.items()}

        def target(path: Any, _: Any) -> Any:
            t = by_path.get(path)  # the others are not read
            if t is None:
                return ocp.PLACEHOLDER
            return jax.ShapeDtypeStruct(t.shape, t.dtype, sharding=t.sharding)  # type: ignore[no-untyped-call]

        item = jax.tree_util.tree_map_with_path(target, tree)
        args = ocp.checkpoint_utils.construct_restore_args(item)
        restored = handler.restore(directory, args=ocp.args.PyTreeRestore(item, restore_args=args))
        values = dict(jax.tree_util.tree_flatten_with_path(restored)[0])
        return {name: values[found[name][0]] for name in wanted}

    return Source(shapes, read)


def _ciclo_steps(path: str) -> list[int]:
    """The steps of a ``ciclo.checkpoint`` directory: its step directories holding the
    ``state`` and ``meta`` items (the layout ``_checkpoint/_format.py`` documents)."""
    return sorted(
        int(entry)
        for entry in os.listdir(path)
        if entry.isdigit() and {"state", "meta"} <= set(os.listdir(os.path.join(path, entry)))
    )


def open_source(source: Any, *, use: str, step: int | None) -> Source:
    """The :class:`Source` of ``source`` (see ``ciclo.load_weights``)."""
    if not isinstance(source, str | os.PathLike):
        return _from_tree(getattr(source, use) if hasattr(source, "opt_state") else source)
    path = os.fspath(source)
    if not os.path.exists(path):
        raise FileNotFoundError(f"load_weights: no such file or directory {path!r}.")
    if path.endswith(".safetensors"):
        return _from_safetensors(path)
    if path.endswith(".msgpack"):
        return _from_msgpack(path)
    steps = _ciclo_steps(path) if os.path.isdir(path) else []
    if steps:
        if step is None:
            step = steps[-1]
        elif step not in steps:
            raise FileNotFoundError(f"load_weights: no step {step} in {path!r}; steps: {steps}.")
        return _from_orbax(os.path.join(path, str(step), "state"), prefix=use + "/")
    if os.path.isdir(path) and os.path.exists(os.path.join(path, "_METADATA")):
        return _from_orbax(path)
    raise ValueError(
        f"load_weights: {path!r} is no ciclo or Orbax checkpoint directory, .safetensors or "
        f".msgpack file."
    )
