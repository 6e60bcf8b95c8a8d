"""Graceful stops: the first Ctrl-C (or SIGTERM) ends the loop after the current step; a
second one interrupts at once.

Only the outermost loop handles stop signals. A loop run inside a callback of another (an
evaluation inside a training loop) ends at its next batch when the outermost loop is
stopped, and raises :class:`~ciclo._loop._callback.LoopInterrupted` instead of returning
a partial result: the callback that ran it records nothing, and the outer loop stops
after the step that ran it (so a stop waits for at most one batch of an evaluation, not
for its end). With several processes an inner loop runs to its end: its steps are
collectives, which one process cannot leave alone.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from types import FrameType
from typing import Any

import jax

from .._processes._outputs import OUTPUT_PROCESS, writes_here
from ._callback import LoopInterrupted
from ._state import StopKind

__all__ = ["stop_gracefully_on", "exit_if_terminated"]

_handling = False  # whether a loop of the main thread already handles stop signals
_received: list[signal.Signals] = []  # the signals the outermost loop received
_nested: list[Any] = []  # the loop states of loops running inside the outermost one


@contextlib.contextmanager
def stop_gracefully_on(
    loop_state: Any,
    signals: Sequence[signal.Signals],
    received: list[signal.Signals] | None = None,
) -> Iterator[list[signal.Signals]]:
    """While active, ``signals`` call ``loop_state.request_stop`` instead of killing the
    run; the same signal a second time restores the previous handler's behaviour.

    Yields ``received`` (a new list by default), where the signals received are appended
    (empty unless a signal stopped the loop).

    A loop started while another loop of the main thread handles signals (a loop inside a
    callback) handles none: a signal the outer loop receives, before or while it runs,
    stops it after its current batch, and it then raises ``LoopInterrupted`` (with one
    process; with several, it runs to its end, as every process runs its collectives).
    """
    global _handling
    received = [] if received is None else received
    if threading.current_thread() is not threading.main_thread() or (
        _handling and jax.process_count() > 1
    ):
        yield received
        return
    if _handling and jax.process_count() > 1:
        # Its steps are collectives: one process cannot end it alone (the processes agree
        # on the outer loop's stop, after the step that runs it).
        yield received
        return
    if _handling:
        if _received:  # the outer loop is stopping: this loop ends after one batch
            loop_state.request_stop(f"stopped by {_received[0].name}", kind=StopKind.INTERRUPTED)
        _nested.append(loop_state)
        try:
            yield received
        finally:
            _nested.remove(loop_state)
        if _received:
            raise LoopInterrupted(f"stopped by {_received[0].name}")
        return
    if not signals:
        yield received
        return
    previous = {s: signal.getsignal(s) for s in signals}

    def handle(signum: int, frame: FrameType | None) -> None:
        sig = signal.Signals(signum)
        if sig in received:
            signal.signal(sig, previous[sig])
            if sig == signal.SIGINT:
                raise KeyboardInterrupt
            signal.raise_signal(sig)
            return
        received.append(sig)
        _received.append(sig)
        for stopped in (loop_state, *_nested):
            stopped.request_stop(f"stopped by {sig.name}", kind=StopKind.INTERRUPTED)

    for s in signals:
        signal.signal(s, handle)
    _handling = True
    _received.clear()
    try:
        yield received
    finally:
        _handling = False
        _received.clear()
        for s, handler in previous.items():
            signal.signal(s, handler)


def exit_if_terminated(received: Sequence[signal.Signals], loop_state: Any) -> None:
    """After a graceful stop by a signal other than Ctrl-C (SIGTERM from a scheduler or a
    preemption), ends the process with status ``128 + signal`` and a message, so the
    scheduler sees an interrupted run rather than a finished one."""
    if not received or received[0] == signal.SIGINT:
        return
    sig = received[0]
    if writes_here(OUTPUT_PROCESS):  # with several processes, one message for the job
        print(
            f"ciclo: {loop_state.stop_reason or f'stopped by {sig.name}'} after "
            f"{loop_state.elapsed.steps} steps; exiting with status {128 + sig}.",
            file=sys.stderr,
            flush=True,
        )
    raise SystemExit(128 + sig)
