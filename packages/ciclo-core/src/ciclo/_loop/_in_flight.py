"""Dispatch runs ahead of Python, bounded: at most a few steps queued on the device."""

from __future__ import annotations

from collections import deque
from typing import Any

import jax

from .._records._logs import Logs
from .._time._elapsed import ARRAY_TYPE

__all__ = ["PROBE_EVERY", "InFlight", "adapts_to_device", "default_steps_in_flight", "first_array"]

#: Steps JAX may run ahead of Python by default. On a CPU, Python dispatching further ahead
#: competes with XLA's threads for the same cores (8 took a small MLP from 1.04 to 1.12 of
#: the hand-written loop on 2 cores); on an accelerator, waiting that often costs the host
#: a sync every other step (an H200 ran the trivial and MLP loops 5-24 us a step faster
#: with 8). See benchmarks/NOTES.md.
CPU_STEPS_IN_FLIGHT = 2
ACCELERATOR_STEPS_IN_FLIGHT = 8


def default_steps_in_flight() -> int:
    """``max_steps_in_flight`` when the loop is given none: 2 on a CPU, 8 on an accelerator.

    Example:
        >>> import jax
        >>> default_steps_in_flight() == (2 if jax.default_backend() == "cpu" else 8)
        True
    """
    return CPU_STEPS_IN_FLIGHT if jax.default_backend() == "cpu" else ACCELERATOR_STEPS_IN_FLIGHT


def adapts_to_device() -> bool:
    """Whether a training loop's bound adapts to how far the device is behind: on a CPU.

    On 2 CPU cores, a small MLP (784-128-10) ran at 0.97-0.98 of the hand-written loop when
    the loop waited at every step (for the step 2 before), and at 1.05-1.07 when it waited
    every 2 or 3 steps, with no more steps queued: XLA's threads then have the cores to
    themselves. A step the device finishes before Python dispatches the next (a trivial or
    tiny step) gains nothing from that wait and pays about 1 us for it: there the loop
    checks every ``limit`` steps instead. On an accelerator a wait is a host sync: every
    ``limit`` steps always. See benchmarks/NOTES.md.

    Example:
        >>> import jax
        >>> adapts_to_device() == (jax.default_backend() == "cpu")
        True
    """
    return jax.default_backend() == "cpu"


#: While waiting at every step, every this many waits the bound looks first whether the
#: device has caught up (then it checks every ``limit`` steps, until a check finds it behind).
PROBE_EVERY = 16


class InFlight:
    """Bounds how many steps JAX may have queued ahead of Python.

    Every ``every`` steps (by default ``limit``), the step's result is marked, and the loop
    waits for the mark made ``limit`` steps before it: so at most ``limit + every`` steps
    are queued, and a step pays a counter (the wait, when there is one, is shared by
    ``every`` steps). ``limit <= 0``: unbounded.

    ``adaptive=True`` (a training loop on a CPU, see :func:`adapts_to_device`): a wait at
    every step while the device is behind, and a look every ``limit`` steps while it keeps
    up. Every :data:`PROBE_EVERY` waits, the bound looks whether the mark is done before
    waiting for it: if it is, it marks every ``limit`` steps from then on, and while each
    mark it looks at is done it waits for none; the first one not done is waited for, and
    the bound waits at every step again. Either way at most ``2 * limit`` steps are queued.

    Example:
        >>> import jax.numpy as jnp
        >>> in_flight = InFlight(limit=2)
        >>> for i in range(5):
        ...     in_flight.push_tree(jnp.ones(()) * i)
        >>> len(in_flight.marks)  # marks made at steps 2 and 4; the first was waited for
        1
        >>> in_flight = InFlight(limit=2, every=1)
        >>> for i in range(5):
        ...     in_flight.push_tree(jnp.ones(()) * i)
        >>> len(in_flight.marks)  # the marks of the last 2 steps; the others were waited for
        2
        >>> in_flight = InFlight(limit=2, adaptive=True)
        >>> for i in range(40):  # each step done before the next: the device keeps up
        ...     in_flight.push_tree((jnp.ones(()) * i).block_until_ready())
        >>> in_flight.every  # so the bound looks every 2 steps
        2
    """

    __slots__ = ("countdown", "every", "held", "limit", "marks", "probe")

    def __init__(self, limit: int, every: int | None = None, *, adaptive: bool = False) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError(
                f"max_steps_in_flight must be an int >= 0 (the steps JAX may run ahead of "
                f"Python; 0: unbounded), got {limit!r}."
            )
        if adaptive and every is not None:
            raise ValueError("InFlight(adaptive=True) chooses its own `every`: pass none.")
        adaptive = adaptive and limit > 0
        every = 1 if adaptive else limit if every is None or limit == 0 else every
        if limit and (every < 1 or limit % every):
            raise ValueError(f"InFlight(every={every}) must divide limit={limit}.")
        self.limit = limit
        if limit > 0:
            self._mark_every(every)
        else:  # no mark is ever made
            self.every, self.held, self.countdown = every, 0, -1
        # waits until the next look (never reaching 0 when not adaptive)
        self.probe = PROBE_EVERY if adaptive else -1
        self.marks: deque[jax.Array] = deque()

    def _mark_every(self, every: int) -> None:
        """Marks every ``every`` steps from now on, keeping the marks of the last ``limit``
        steps (the oldest is waited for)."""
        self.every = self.countdown = every  # countdown: steps until the next mark
        self.held = self.limit // every

    def push_tree(self, *trees: Any) -> None:
        """Counts a step whose results are ``trees`` (the first array found is its mark)."""
        self.countdown -= 1
        if self.countdown == 0:
            self.mark(*trees)

    def mark(self, *trees: Any) -> None:
        """Marks this step by the first array of ``trees`` and waits for the mark made
        ``limit`` steps before; the loop calls it when :attr:`countdown` reaches 0."""
        self.countdown = self.every
        for tree in trees:
            marker = first_array(tree)
            if marker is not None:
                break
        else:
            return
        marks = self.marks
        marks.append(marker)
        if len(marks) > self.held:
            oldest = marks.popleft()
            if oldest.is_deleted():  # donated buffers are gone, and so finished
                return
            self.probe -= 1
            if self.probe:
                oldest.block_until_ready()
            else:
                self._look(oldest)

    def _look(self, oldest: Any) -> None:
        """An adaptive bound's look at a mark: done, the bound checks every ``limit`` steps
        (and waits for none); not done, it waits for it, and then at every step."""
        if oldest.is_ready():
            if self.every != self.limit:  # caught up: from now on a look every limit steps
                self._mark_every(self.limit)
                while len(self.marks) > self.held:
                    self.marks.popleft()
            self.probe = 1
            return
        oldest.block_until_ready()
        self._mark_every(1)
        self.probe = PROBE_EVERY


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
