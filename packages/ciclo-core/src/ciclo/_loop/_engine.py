"""The engine: runs a loop's batches through its tasks, one step at a time.

:func:`run` is the whole per-step path of every loop. Per batch it takes the callbacks that
fire (:class:`~ciclo._loop._plan.TaskPlan`: a comparison when only ``every(1)`` tasks fire),
runs them in order (:func:`~ciclo._loop._step.run_step`), commits the step's logs,
bounds the steps in flight and runs what callbacks queued for the step's end. Consecutive
steps of a fused callback (K steps per call) are collected by the same path into a
:class:`~ciclo._loop._fusion.Group` and run as one call.

The engine knows nothing of checkpoints, processes or signals: :func:`ciclo.loop` composes
those around it (``ciclo._loops._loop``), and they reach the engine through the iterator
of batches (``ciclo.elapse``, which the agreement of several processes pauses) and through
``loop_state.request_stop``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

from .._records._logs import Logs, empty_logs
from .._time._elapsed import Elapsed, elapse
from .._time._phases import CALLBACKS, Phases
from .._time._schedules import Schedule
from ._callback import Callback
from ._fusion import Group
from ._hooks import steps_per_call
from ._in_flight import InFlight
from ._plan import TaskPlan
from ._state import LoopState
from ._step import run_step

__all__ = ["run"]


def run(
    loop_state: LoopState,
    steps: elapse,
    tasks: Sequence[tuple[Schedule, list[Callback]]],
    *,
    max_steps_in_flight: int,
    phases: Phases | None = None,
) -> None:
    """Runs every batch of ``steps``: the callbacks whose schedules fire, in order, then a
    commit of the step's logs, then what callbacks queued with ``loop_state.at_step_end``;
    until ``steps`` ends or ``loop_state.request_stop`` is called. ``loop_state.elapsed``
    then counts every batch drawn.

    Tasks holding a fusable callback that asks for several steps per call (K > 1) when the
    loop starts (asked before the first batch: ``loop_state.batch`` is None; the managed
    steps' ``steps_per_call="auto"`` answers its largest K there) group its consecutive
    steps (see :func:`ciclo.loop`); a fusable callback whose K becomes larger than 1 later
    runs one step per call.

    ``phases``: the record a ledger or a watchdog reads (``ciclo._time._phases``), given
    by the outermost loop that holds it: each batch drawn and each step done is marked.
    """
    plan = TaskPlan(tasks)
    loop_state._wake_plan = plan.wake  # an event no count foretells (train_loop's pass ends)
    in_flight = InFlight(max_steps_in_flight)
    fusing = any(
        callback.fusable and steps_per_call(callback.fn, loop_state) > 1
        for _, callbacks in tasks
        for callback in callbacks
    )
    group: Group | None = None
    elapsed: Elapsed | None = None
    try:
        for elapsed, batch in steps:
            loop_state.elapsed = elapsed
            loop_state.batch = batch
            if phases is not None:
                phases.step(elapsed.steps)
            fired: Iterable[Callback]
            if (
                elapsed.steps < plan.next_steps
                and elapsed.samples < plan.next_samples
                and elapsed.time < plan.next_time
            ):
                fired = plan.steady  # the list (made an iterator where one is needed)
            else:
                fired = plan.fired(elapsed)
            if group is not None:  # a fused group is open: does this step extend it?
                fired = iter(fired)
                first = next(fired, None)
                if first is group.fused and group.accepts_batch(batch):
                    group.add(elapsed, batch, list(fired))
                else:
                    group.run(loop_state, in_flight)
                    loop_state.elapsed, loop_state.batch = elapsed, batch
                    if first is not None:
                        fired = itertools.chain((first,), fired)
                    group = _fused_step(loop_state, fired, in_flight)
            elif fusing:
                group = _fused_step(loop_state, fired, in_flight)
            else:
                loop_state.logs = empty_logs()
                run_step(loop_state, fired, in_flight)
            if group is not None:
                if not group.is_complete(loop_state):
                    continue
                group.run(loop_state, in_flight)
                group = None
            # the step-end hooks and stop_iteration, read as the slots they are (once per step)
            if loop_state._step_end:
                plan.catch_up(elapsed)
                if phases is not None:
                    phases.enter(CALLBACKS)
                loop_state.end_step()
            if loop_state._stop:
                break
            if phases is not None:
                phases.data()
        if group is not None:
            group.run(loop_state, in_flight)
            loop_state.end_step()
    finally:
        if elapsed is not None:
            plan.catch_up(elapsed)
    loop_state.elapsed = steps.finish()
    loop_state.batch = None
    loop_state.logs = Logs()


def _fused_step(
    loop_state: LoopState, fired: Iterable[Callback], in_flight: InFlight
) -> Group | None:
    """:func:`~ciclo._loop._step.run_step` in a loop that fuses steps: when a fused callback
    (K > 1) fires, the callbacks before it have run, and the group it starts is returned
    (the rest of the step runs with the group)."""
    loop_state.logs = empty_logs()
    fired = iter(fired)
    for callback in fired:
        if callback.fusable:
            size = steps_per_call(callback.fn, loop_state)
            if size > 1:
                group = Group(callback, size, loop_state.logs, loop_state.batch)
                group.add(loop_state.elapsed, loop_state.batch, list(fired))
                return group
        run_step(loop_state, (callback,))
    run_step(loop_state, (), in_flight)
    return None
