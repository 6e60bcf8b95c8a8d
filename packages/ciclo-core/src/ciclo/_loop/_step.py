"""One step of a loop: run the callbacks whose schedules fire, in order, commit the step's
logs, count the step in flight (:func:`run_step`).

The engine's per-step primitive, for a plain step and for a group of fused steps alike
(:mod:`ciclo._loop._engine`, :mod:`ciclo._loop._fusion`).
"""

from __future__ import annotations

from collections.abc import Iterable

from .._records._logs import Logs
from ._callback import NO_CHANGE, Callback
from ._in_flight import InFlight
from ._state import LoopState

__all__ = ["run_step", "run_callbacks", "commit"]


def run_step(
    loop_state: LoopState, callbacks: Iterable[Callback], in_flight: InFlight | None = None
) -> None:
    """The per-step primitive: runs ``callbacks`` in order, threading the state and
    collecting their logs in ``loop_state.logs`` (a compiled step's adopted, others copied,
    later ones merged); with ``in_flight``, commits them and counts the step in flight."""
    for callback in callbacks:
        try:
            logs, state = callback(loop_state)
        except Exception as error:
            error.add_note(
                f"(in ciclo callback {callback.name} at step {loop_state.elapsed.steps})"
            )
            raise
        if state is not NO_CHANGE:
            loop_state.state = state
        if logs:
            current = loop_state.logs
            if current:
                current.merge(logs)
            else:
                loop_state.logs = logs if callback.fresh_logs else Logs(logs)
    if in_flight is None:
        return
    logs = loop_state.logs
    if logs:  # commit(loop_state), inlined: benchmarks/loop_overhead.py, trivial step
        loop_state.history.commit(loop_state.elapsed, logs)
    in_flight.countdown -= 1  # InFlight.push_tree, inlined: the same benchmark
    if in_flight.countdown == 0:
        in_flight.mark(logs, loop_state.state)


def run_callbacks(callbacks: Iterable[Callback], loop_state: LoopState) -> None:
    """:func:`run_step` outside a step (a loop's start and end, an epoch's end): no commit."""
    run_step(loop_state, callbacks)


def commit(loop_state: LoopState) -> None:
    """Commits the step's logs (if any) to history (``accumulated_logs`` reads them there)."""
    logs = loop_state.logs
    if logs:
        loop_state.history.commit(loop_state.elapsed, logs)
