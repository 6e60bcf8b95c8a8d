"""Dispatch runs ahead of Python, bounded: at most a few steps queued on the device."""

from __future__ import annotations

from collections import deque
from typing import Any

import jax

from .._records._logs import Logs
from ._state import LoopState

__all__ = ["InFlight", "first_array"]


class InFlight:
    """Bounds how many steps JAX may have queued ahead of Python.

    Example:
        >>> import jax.numpy as jnp
        >>> in_flight = InFlight(limit=2)
        >>> for i in range(5):
        ...     in_flight.push_tree(jnp.ones(()) * i)
        >>> len(in_flight.queue)
        2
    """

    __slots__ = ("limit", "queue")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.queue: deque[jax.Array] = deque()

    def push(self, loop_state: LoopState) -> None:
        if self.limit <= 0:
            return
        marker = first_array(loop_state.logs)
        if marker is None:
            marker = first_array(loop_state.state)
            if marker is None:
                return
        queue = self.queue
        queue.append(marker)
        if len(queue) > self.limit:
            oldest = queue.popleft()
            if not oldest.is_deleted():  # donated buffers are gone, and so finished
                oldest.block_until_ready()

    def push_tree(self, *trees: Any) -> None:
        """Marks the first array of the first tree that has one as this step's result."""
        if self.limit <= 0:
            return
        marker = None
        for tree in trees:
            marker = first_array(tree)
            if marker is not None:
                break
        else:
            return
        self.queue.append(marker)
        if len(self.queue) > self.limit:
            oldest = self.queue.popleft()
            if not oldest.is_deleted():  # donated buffers are gone, and so finished
                oldest.block_until_ready()


def first_array(tree: Any) -> jax.Array | None:
    if isinstance(tree, Logs):  # the common case, without flattening
        for values in tree.values():
            for value in values.values():
                if isinstance(value, jax.Array):
                    return value
        return None
    for leaf in jax.tree_util.tree_leaves(tree):
        if isinstance(leaf, jax.Array):
            return leaf
    return None
