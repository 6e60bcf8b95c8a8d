"""One step of a loop: run the callbacks whose schedules fire, in order, then commit.

These are the engine's per-step primitives, shared by the plain path
(:mod:`ciclo._loop._engine`) and fused groups (:mod:`ciclo._loop._fusion`).
"""

from __future__ import annotations

from collections.abc import Iterable

from ._callback import NO_CHANGE, Callback
from ._state import LoopState

__all__ = ["run_callbacks", "commit"]


def run_callbacks(callbacks: Iterable[Callback], loop_state: LoopState) -> None:
    """Runs callbacks in order, threading the state and merging their logs."""
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
            loop_state.logs.merge(logs)


def commit(loop_state: LoopState) -> None:
    """Commits the step's logs (if any) to history and to ``accumulated_logs``."""
    logs = loop_state.logs
    if logs:
        loop_state.history.commit(loop_state.elapsed, logs)
        loop_state.accumulated_logs.merge(logs)
