"""Graceful stops: the first Ctrl-C (or SIGTERM) ends the loop after the current step; a
second one interrupts at once.

Only the outermost loop handles stop signals: a loop run inside a callback of another
(an evaluation inside a training loop) runs to its end, and the outer loop stops after
the step that ran it, so what it records stays consistent.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from types import FrameType
from typing import Any

from .._processes._outputs import OUTPUT_PROCESS, writes_here

__all__ = ["stop_gracefully_on", "exit_if_terminated"]

_handling = False  # whether a loop of the main thread already handles stop signals


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
    """
    global _handling
    received = [] if received is None else received
    if not signals or _handling or threading.current_thread() is not threading.main_thread():
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
        loop_state.request_stop(f"stopped by {sig.name}")

    for s in signals:
        signal.signal(s, handle)
    _handling = True
    try:
        yield received
    finally:
        _handling = False
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
