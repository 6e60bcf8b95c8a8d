"""The one place where ciclo moves log values from device to host.

Every consumer (history, progress bars, loggers, early stopping) fetches through
:func:`to_host`, so a test can count transfers and the policy lives in one spot.
"""

from __future__ import annotations

from typing import Any, TypeVar, cast

import jax

__all__ = ["to_host"]

T = TypeVar("T")


def to_host(tree: T) -> T:
    """Fetches every array leaf of ``tree`` to host memory in one batched transfer."""
    return cast(T, jax.device_get(tree))


def is_device_array(value: Any) -> bool:
    """Whether ``value`` is, or holds, an array on a device (fetching it costs a transfer)."""
    if isinstance(value, jax.Array):
        return True
    if isinstance(value, int | float | str | bytes | None):  # the common case, kept cheap
        return False
    return any(isinstance(leaf, jax.Array) for leaf in jax.tree_util.tree_leaves(value))
