"""One step of a loop: run the callbacks whose schedules fire, in order, commit the step's
logs, count the step in flight (:func:`run_step`).

The engine's per-step primitive, for a plain step and for a group of fused steps alike
(:mod:`ciclo._loop._engine`, :mod:`ciclo._loop._fusion`).
"""

from __future__ import annotations

from collections.abc import Iterable

from .._records._logs import Logs
from ._callback import NO_CHANGE, Callback, LoopInterrupted
from ._in_flight import InFlight
from ._state import LoopState

__all__ = ["run_step", "commit"]


def run_step(
    loop_state: LoopState, callbacks: Iterable[Callback], in_flight: InFlight | None = None
) -> None:
    """The per-step primitive: runs ``callbacks`` in order, threading the state and
    collecting their logs in ``loop_state.logs`` (a compiled step's adopted, others copied,
    later ones merged); with ``in_flight``, commits them and counts the step in flight."""
    for callback in callbacks:
        try:  # Callback.__call__, inlined for the common calls: a frame fewer each, per step
            arity = callback.arity  # (benchmarks/loop_overhead.py, trivial step)
            if arity == 2:  # a (state, batch) step
                out = callback.method(loop_state.state, loop_state.batch)
            elif arity < 0:  # an object's __loop_callback__: a managed step, a bar
                out = callback.method(loop_state)
            else:
                out = callback.call(loop_state)
            if out is None:  # an observer's return
                continue
            if type(out) is tuple and len(out) == 2 and type(out[0]) is Logs:
                logs, state = out
            else:
                logs, state = callback.result(out)
        except LoopInterrupted as cut:
            logs, state = callback.cut_short(loop_state, cut)
        except Exception as error:
            error.add_note(
                f"(in ciclo callback {callback.name} at step {loop_state.elapsed.steps})"
            )
            raise
        if state is not NO_CHANGE and state is not None:
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


def commit(loop_state: LoopState) -> None:
    """Commits the step's logs (if any) to history (``accumulated_logs`` reads them there)."""
    logs = loop_state.logs
    if logs:
        loop_state.history.commit(loop_state.elapsed, logs)
