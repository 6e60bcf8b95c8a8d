"""``profiler``: a ``jax.profiler`` trace of a few steps (TensorBoard, xprof, Perfetto)."""

from __future__ import annotations

import os
from typing import Any

import jax

from .._loop._base import LoopCallbackBase
from .._loop._state import LoopState
from .._processes._outputs import check_output_process, writes_here
from .._time._elapsed import Elapsed
from .._time._schedules import Schedule, always

__all__ = ["Profiler", "profiler"]


class Profiler(LoopCallbackBase):
    """Takes a ``jax.profiler`` trace of ``steps`` steps, under ``logdir/plugins/profile/``.

    The device is waited for once, at the end of each trace; the loop's end ends one.

    Args:
        logdir: the directory of the traces (a TensorBoard log directory).
        start: the step to start at, or a schedule (``ciclo.every(1000)``).
        steps: how many steps each trace covers.
        perfetto: also write a Perfetto trace.
        process: the process that traces (``None``: every process).

    Example:
        >>> import ciclo, tempfile
        >>> trace = ciclo.profiler(tempfile.mkdtemp(), start=3, steps=2)  # doctest: +SKIP
    """

    __loop_observer__ = True  # reads the loop only

    def __init__(
        self,
        logdir: str | os.PathLike[str],
        *,
        start: int | Schedule = 10,
        steps: int = 5,
        perfetto: bool = False,
        process: int | None = 0,
    ) -> None:
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise TypeError(f"profiler(steps={steps!r}): expected an int >= 1")
        if not callable(start) and (
            isinstance(start, bool) or not isinstance(start, int) or start < 0
        ):
            raise TypeError(f"profiler(start={start!r}): expected an int >= 0 or a schedule")
        self.logdir = os.fspath(logdir)
        self.start, self.steps, self.perfetto = start, steps, perfetto
        self.process = check_output_process(process, "profiler")
        self.traces: list[int] = []  #: the steps at which each trace started
        self._stop_at: int | None = None

    def default_schedule(self) -> Schedule:
        """Spread with ``**`` into ``tasks``: asked at every step."""
        return always()

    def _due(self, elapsed: Elapsed) -> bool:
        if callable(self.start):
            return bool(self.start(elapsed))
        return elapsed.steps == self.start and not self.traces

    def stop(self, loop_state: LoopState) -> None:
        """Ends the trace being taken (waiting for the device)."""
        if self._stop_at is None:
            return
        jax.block_until_ready(loop_state.state)  # type: ignore[no-untyped-call]  # once per trace
        jax.profiler.stop_trace()  # type: ignore[no-untyped-call]
        self._stop_at = None

    def __loop_callback__(self, loop_state: LoopState) -> None:
        if not writes_here(self.process):
            return
        elapsed = loop_state.elapsed
        if self._stop_at is not None and elapsed.steps >= self._stop_at:
            self.stop(loop_state)
        if self._stop_at is None and self._due(elapsed):
            jax.profiler.start_trace(self.logdir, create_perfetto_trace=self.perfetto)
            self._stop_at = elapsed.steps + self.steps
            self.traces.append(elapsed.steps)

    def __loop_end__(self, loop_state: LoopState, error: BaseException | None) -> None:
        self.stop(loop_state)

    def on_train_batch_begin(
        self, state: Any, batch: Any, elapsed: Elapsed, loop_state: LoopState
    ) -> None:
        self.__loop_callback__(loop_state)


profiler = Profiler
"""Another name of :class:`Profiler` (the same class)."""
