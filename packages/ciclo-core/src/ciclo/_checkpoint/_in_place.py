"""Objects a resumed loop updates in place instead of replacing: mutable models captured
by a step's closure (NNX modules and optimizers). Which classes, and how each is updated,
comes from the adapters' records (``Adapter.restore_in_place``) and from
``ciclo.adapters.register_restore_in_place`` for a script's own classes."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import jax

from .._plugins._discovery import extras

__all__ = ["RestoreInto", "restore_in_place"]

#: ``restore_into(original, restored)``: copies the restored values into ``original``.
RestoreInto = Callable[[Any, Any], None]

_BROKEN_ADAPTER = (
    "ciclo: the adapter {name!r} failed to load ({error}); objects whose in-place restore "
    "it declares are replaced on resume, not updated."
)


def restore_in_place(original: Any, restored: Any) -> Any:
    """``restored`` (a state read from a checkpoint in the structure of ``original``), in
    which every object of a class restored in place (an adapter's, or one registered with
    ``ciclo.adapters.register_restore_in_place``) is the object of ``original``, updated in
    place with its restored values."""
    table, broken = extras("restore_in_place")
    for name, error in broken.items():
        warnings.warn(_BROKEN_ADAPTER.format(name=name, error=error), RuntimeWarning, stacklevel=3)
    if not table:
        return restored

    def restorer(node: Any) -> RestoreInto | None:
        for node_type, restore_into in table.items():
            if isinstance(node, node_type):
                return restore_into
        return None

    def is_leaf(node: Any) -> bool:
        return restorer(node) is not None

    originals, treedef = jax.tree_util.tree_flatten(original, is_leaf=is_leaf)
    if not any(is_leaf(node) for node in originals):
        return restored
    news, new_treedef = jax.tree_util.tree_flatten(restored, is_leaf=is_leaf)
    if new_treedef != treedef:  # type: ignore[operator]
        return restored
    leaves = []
    for old, new in zip(originals, news, strict=True):
        restore_into = restorer(old)
        if restore_into is not None and type(new) is type(old):
            restore_into(old, new)
            leaves.append(old)
        else:
            leaves.append(new)
    return jax.tree_util.tree_unflatten(treedef, leaves)
