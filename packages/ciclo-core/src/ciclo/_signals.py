"""Graceful stops: the first Ctrl-C (or SIGTERM, when asked) ends the loop after the
current step; a second one interrupts at once."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator, Sequence
from types import FrameType
from typing import Any

__all__ = ["stop_gracefully_on"]


@contextlib.contextmanager
def stop_gracefully_on(loop_state: Any, signals: Sequence[signal.Signals]) -> Iterator[None]:
    """While active, ``signals`` set ``loop_state.stop_iteration`` instead of killing the
    run; the same signal a second time restores the previous handler's behaviour."""
    if not signals or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in signals}
    received: list[signal.Signals] = []

    def handle(signum: int, frame: FrameType | None) -> None:
        sig = signal.Signals(signum)
        if sig in received:
            signal.signal(sig, previous[sig])
            if sig == signal.SIGINT:
                raise KeyboardInterrupt
            signal.raise_signal(sig)
            return
        received.append(sig)
        loop_state.stop_iteration = True
        loop_state.stop_reason = f"stopped by {sig.name}"

    for s in signals:
        signal.signal(s, handle)
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
