"""The one place where ciclo moves log values from device to host.

Every consumer (history, progress bars, loggers, early stopping) fetches through
:func:`to_host`, or, for a history column's backlog, :func:`send_stacked` then
:func:`land_stacked`, so a test can count transfers and the policy lives in one spot.

Fetching many small arrays one by one costs ~20 µs each; :func:`to_host` stacks
same-shaped arrays on device in fixed-size chunks first (one small compiled call per chunk)
and fetches each chunk in one transfer.
"""

from __future__ import annotations

from typing import Any, TypeVar, cast

import jax
import jax.numpy as jnp
import numpy as np

from .._time._elapsed import ARRAY_TYPE

__all__ = [
    "Chunks",
    "is_device_array",
    "is_landed",
    "land_stacked",
    "send_stacked",
    "start_copies",
    "to_host",
]

T = TypeVar("T")

# Arrays stacked per transfer: a large chunk for a history's backlog (its `max_pending`:
# a stacking call's cost grows with its arguments, so a large one costs less per value), a
# small one for the rest; padded to these sizes so each (shape, dtype) compiles at most twice.
_CHUNKS = (256, 64)
_MIN_GROUP = 8  # below this, fetching one by one is cheaper than a stacking call
# Platforms whose arrays are in host memory already: no copy is started ahead there (on a
# CPU it cost 32 µs for 256 stacked scalars and saved 3 of np.asarray's: NOTES.md).
_IN_HOST_MEMORY = frozenset({"cpu"})

_stack = jax.jit(lambda *arrays: jnp.stack(arrays))
# The stacking call compiled ahead of time, per (chunk size, aval, sharding): calling the
# executable costs 0.44 us an argument against 0.70 through jit's dispatch (256 scalars,
# this project's CPU), and a history pays it once per value it records.
_compiled_stacks: dict[tuple[int, Any, Any], Any] = {}


def _stacked(part: list[jax.Array], size: int) -> jax.Array:
    """``part`` stacked on device, padded with its first array to ``size`` rows."""
    first = part[0]
    arrays = (*part, *[first] * (size - len(part)))
    key = (size, first.aval, first.sharding)
    compiled = _compiled_stacks.get(key)
    if compiled is None:
        compiled = _compiled_stacks[key] = _stack.lower(*arrays).compile()
    try:
        return compiled(*arrays)  # type: ignore[no-any-return]
    except (TypeError, ValueError):  # an array placed otherwise than the first: jit adapts
        return _stack(*arrays)  # type: ignore[no-any-return]


def is_device_array(value: Any) -> bool:
    """Whether ``value`` is, or holds, an array on a device (fetching it costs a transfer)."""
    if type(value) is ARRAY_TYPE or isinstance(value, jax.Array):
        return True
    if isinstance(value, int | float | str | bytes | None):  # the common case, kept cheap
        return False
    return any(isinstance(leaf, jax.Array) for leaf in jax.tree_util.tree_leaves(value))


#: Stacked chunks on their way to the host: ``(count, chunk)``, the first ``count`` rows of
#: each chunk real (the rest pads it to a chunk size).
Chunks = list[tuple[int, jax.Array]]


def _send_chunks(arrays: list[jax.Array]) -> Chunks:
    """Same-shaped arrays stacked on device in chunks, each chunk's copy to the host started
    (nothing waits for the device)."""
    chunks = []
    large, small = _CHUNKS
    start = 0
    while start < len(arrays):
        size = large if len(arrays) - start >= large else small
        part = arrays[start : start + size]
        chunk = _stacked(part, size)
        start_copies([chunk])
        chunks.append((len(part), chunk))
        start += size
    return chunks


def send_stacked(values: list[Any]) -> Chunks | None:
    """Starts moving ``values`` to the host as one stack, when they are at least a few device
    arrays of one shape and dtype (a history column's backlog); else ``None`` (fetch them
    with :func:`to_host`). :func:`land_stacked` waits for them: in between, the host runs
    on and the device works through its queue, so nothing stalls the steps.

    Example:
        >>> import jax.numpy as jnp
        >>> chunks = send_stacked([jnp.float32(i) for i in range(10)])
        >>> land_stacked(chunks).tolist()
        [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]
        >>> send_stacked([1.0, 2.0]) is None
        True
    """
    if len(values) < _MIN_GROUP:
        return None
    first = values[0]
    if not isinstance(first, jax.Array):
        return None
    key = first.aval
    for value in values:  # once per value recorded
        if not (type(value) is ARRAY_TYPE or isinstance(value, jax.Array)):
            return None
        aval = value.aval  # a compiled step's outputs share theirs: no Python __eq__ then
        if aval is not key and aval != key:
            return None
    try:
        return _send_chunks(values)
    except (ValueError, TypeError, RuntimeError):  # e.g. not stackable across devices
        return None


def start_copies(values: list[Any]) -> None:
    """Starts the copy to the host of each device array of ``values`` (nothing waits),
    where it has one to make: not on a CPU (``_IN_HOST_MEMORY``)."""
    for value in values:
        if isinstance(value, jax.Array) and not _IN_HOST_MEMORY.issuperset(
            device.platform for device in value.devices()
        ):
            value.copy_to_host_async()


def is_landed(*sent: Chunks) -> bool:
    """Whether the device has computed every chunk sent (landing them then hardly waits)."""
    # ArrayImpl.is_ready: not in jax.Array's type stubs
    return all(chunk.is_ready() for chunks in sent for _, chunk in chunks)  # type: ignore[attr-defined]


def land_stacked(chunks: Chunks) -> np.ndarray:
    """The values :func:`send_stacked` sent, as one NumPy array (waits for the copies)."""
    parts = [np.asarray(chunk)[:count] for count, chunk in chunks]  # device_get: 16 us more
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def to_host(tree: T) -> T:
    """Fetches every device-array leaf of ``tree`` to host memory (as NumPy values)."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    groups: dict[Any, list[int]] = {}
    for i, leaf in enumerate(leaves):
        if isinstance(leaf, jax.Array):
            groups.setdefault(leaf.aval, []).append(i)  # by shape and dtype
    if not groups:
        return tree
    singles: list[int] = []
    for indices in groups.values():
        if len(indices) < _MIN_GROUP:
            singles.extend(indices)
            continue
        try:
            fetched = land_stacked(_send_chunks([leaves[i] for i in indices]))
        except (ValueError, TypeError, RuntimeError):  # e.g. not stackable across devices
            singles.extend(indices)
            continue
        for i, value in zip(indices, fetched, strict=True):
            leaves[i] = value
    if singles:
        for i, value in zip(singles, jax.device_get([leaves[i] for i in singles]), strict=True):
            leaves[i] = value
    return cast(T, jax.tree_util.tree_unflatten(treedef, leaves))
