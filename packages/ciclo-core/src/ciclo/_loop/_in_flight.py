"""Dispatch runs ahead of Python, bounded: at most a few steps queued on the device."""

from __future__ import annotations

from collections import deque
from typing import Any

import jax

from .._records._logs import Logs
from .._time._elapsed import ARRAY_TYPE

__all__ = ["STEPS_IN_FLIGHT", "InFlight", "first_array"]

#: Steps JAX may run ahead of Python by default, on every backend: the loop marks a step
#: every 8 steps and waits for the mark made 8 steps before. On 2 CPU cores a wait at every
#: step (for the step 2 before) cost the small rows of benchmarks/matrix.py 10-40% (a
#: blocked Python thread wakes late) and helped no row; 8 was as fast as unbounded on every
#: row, quiet and busy. On an accelerator, waiting more often costs the host a sync every
#: other step (an H200 ran the trivial and MLP loops 5-24 us a step faster with 8). See
#: benchmarks/NOTES.md.
STEPS_IN_FLIGHT = 8


class InFlight:
    """Bounds how many steps JAX may have queued ahead of Python.

    Every ``limit`` steps, the step's result is marked, and the loop waits for the mark
    made before it: so at most ``2 * limit`` steps are queued, and a step pays a counter
    (the wait, when there is one, is shared by ``limit`` steps). ``limit <= 0``: unbounded.

    Example:
        >>> import jax.numpy as jnp
        >>> in_flight = InFlight(limit=2)
        >>> for i in range(5):
        ...     in_flight.push_tree(jnp.ones(()) * i)
        >>> len(in_flight.marks)  # marks made at steps 2 and 4; the first was waited for
        1
    """

    __slots__ = ("countdown", "limit", "marks")

    def __init__(self, limit: int) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError(
                f"max_steps_in_flight must be an int >= 0 (the steps JAX may run ahead of "
                f"Python; 0: unbounded), got {limit!r}."
            )
        self.limit = limit
        self.countdown = limit if limit > 0 else -1  # steps to the next mark (never 0: unbounded)
        self.marks: deque[jax.Array] = deque()

    def push_tree(self, *trees: Any) -> None:
        """Counts a step whose results are ``trees`` (the first array found is its mark)."""
        self.countdown -= 1
        if self.countdown == 0:
            self.mark(*trees)

    def mark(self, *trees: Any) -> None:
        """Marks this step by the first array of ``trees`` and waits for the mark made
        ``limit`` steps before; the loop calls it when :attr:`countdown` reaches 0."""
        self.countdown = self.limit
        for tree in trees:
            marker = first_array(tree)
            if marker is not None:
                break
        else:
            return
        marks = self.marks
        marks.append(marker)
        if len(marks) > 1:
            oldest = marks.popleft()
            if not oldest.is_deleted():  # donated buffers are gone, and so finished
                oldest.block_until_ready()


def first_array(tree: Any) -> jax.Array | None:
    """The first array of ``tree``: the mark of a step whose results it holds.

    Example:
        >>> import ciclo, jax.numpy as jnp
        >>> first_array(ciclo.logs().add_metric("n", 1).add_metric("x", jnp.ones(2)))
        Array([1., 1.], dtype=float32)
    """
    if type(tree) is Logs:  # the common case, without flattening
        for values in tree.values():
            for value in values.values():
                if type(value) is ARRAY_TYPE or isinstance(value, jax.Array):
                    return value  # type: ignore[no-any-return]
        return None
    for leaf in jax.tree_util.tree_leaves(tree):
        if isinstance(leaf, jax.Array):
            return leaf
    return None
