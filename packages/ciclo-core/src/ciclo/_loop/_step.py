"""One step of a loop: run the callbacks whose schedules fire, in order, then commit.

The engine's per-step primitives, for a plain step and for a group of fused steps alike
(:mod:`ciclo._loop._engine`, :mod:`ciclo._loop._fusion`).
"""

from __future__ import annotations

from collections.abc import Iterable

from .._records._logs import Logs
from ._callback import NO_CHANGE, Callback
from ._state import LoopState

__all__ = ["run_callbacks", "commit"]


def run_callbacks(callbacks: Iterable[Callback], loop_state: LoopState) -> None:
    """Runs callbacks in order, threading the state and collecting their logs in
    ``loop_state.logs``: the first logs of a step are adopted as they are when the callback
    returns new ones each call (a compiled step), copied otherwise; later ones are merged.
    """
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


def commit(loop_state: LoopState) -> None:
    """Commits the step's logs (if any) to history (``accumulated_logs`` reads them there)."""
    logs = loop_state.logs
    if logs:
        loop_state.history.commit(loop_state.elapsed, logs)
