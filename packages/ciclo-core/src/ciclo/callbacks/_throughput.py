"""``throughput``: steps/s, samples/s, FLOP/s and MFU, timed on the host (no device sync)."""

from __future__ import annotations

import time as _time
from collections.abc import Callable
from typing import Any

from .._loop._base import LoopCallbackBase
from .._loop._hooks import lowered
from .._loop._naming import describe
from .._loop._state import LoopState
from .._records._logs import Logs
from .._time._elapsed import Elapsed
from .._time._schedules import Schedule, every

__all__ = ["Throughput", "throughput", "compiled_flops"]

_FORMS = "a number, a jitted step or a managed step"
_NO_FLOPS = "throughput(flops_per_step={}): lowering on (state, batch) failed ({}); pass a number."


def compiled_flops(fn: Any, *args: Any, **kwargs: Any) -> float | None:
    """The FLOPs of one call of the jitted ``fn`` on ``args`` (XLA's ``cost_analysis``), or None.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> compiled_flops(jax.jit(lambda a: a @ a), jnp.ones((8, 8)))
        1024.0
    """
    lower = getattr(fn, "lower", None)
    if lower is None:
        import jax

        lower = jax.jit(fn).lower
    return lowered_flops(lower(*args, **kwargs))


def lowered_flops(lowered_call: Any) -> float | None:
    """The FLOPs of a lowered call (``jax.jit(f).lower(...)``), or ``None``."""
    analysis: Any = lowered_call.compile().cost_analysis()
    if isinstance(analysis, list | tuple):  # older jax: one dict per device program
        analysis = analysis[0] if analysis else None
    flops = analysis.get("flops") if isinstance(analysis, dict) else None
    return float(flops) if flops is not None and flops > 0 else None


class Throughput(LoopCallbackBase):
    """Logs the loop's pace: ``steps_per_second``, ``samples_per_second``, ``flops_per_second``
    and ``mfu`` (the last two given the FLOPs of a step).

    Each value covers the window since the previous log; the first call logs nothing.

    Args:
        steps: the window, in steps (``every(steps)`` when spread with ``**``).
        flops_per_step: the FLOPs of one step, or the step itself (a jitted function or a
            managed step), lowered on the loop's state and batch at the first call.
        peak_flops: the devices' peak FLOP/s, for ``mfu``.
        prefix: put before each name (e.g. ``"train_"``).

    Example:
        >>> import ciclo, numpy as np
        >>> step = lambda state, batch: state
        >>> _, history, _ = ciclo.loop(None, [np.ones(2)] * 5, {ciclo.every(1): step,
        ...                            **ciclo.throughput(2)})
        >>> len(history.collect("steps_per_second"))  # at steps 2 and 4
        2
    """

    def __init__(
        self,
        steps: int = 100,
        *,
        flops_per_step: float | Callable[..., Any] | None = None,
        peak_flops: float | None = None,
        prefix: str = "",
    ) -> None:
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise TypeError(f"throughput(steps={steps!r}): expected an int >= 1")
        if peak_flops is not None and not (
            isinstance(peak_flops, int | float) and not isinstance(peak_flops, bool)
        ):
            raise TypeError(f"throughput(peak_flops={peak_flops!r}): expected a number (FLOP/s)")
        if flops_per_step is not None and not callable(flops_per_step):
            if isinstance(flops_per_step, bool) or not isinstance(flops_per_step, int | float):
                given = describe(flops_per_step)
                raise TypeError(f"throughput(flops_per_step={given}): expected {_FORMS}.")
            if not flops_per_step > 0:
                raise ValueError(
                    f"throughput(flops_per_step={flops_per_step!r}): FLOPs must be > 0."
                )
        self.steps = steps
        self.flops_per_step = flops_per_step
        self.peak_flops = peak_flops
        self.prefix = prefix
        self._mark: tuple[float, int, int] | None = None

    def default_schedule(self) -> Schedule:
        """Spread with ``**`` into ``tasks``: every ``steps`` steps."""
        return every(self.steps)

    def _flops(self, loop_state: LoopState) -> float | None:
        """The FLOPs of a step (a step given is lowered once, at the first call)."""
        step = self.flops_per_step
        if step is None or isinstance(step, int | float):
            return step
        try:
            call = lowered(step, loop_state)  # a managed step lowers its own compiled call
            if call is None:
                flops = compiled_flops(step, loop_state.state, loop_state.batch)
            else:
                flops = lowered_flops(call)
        except Exception as error:
            name = getattr(step, "__qualname__", None) or describe(step)
            why = f"{type(error).__name__}: {error}"
            raise TypeError(_NO_FLOPS.format(name, why)) from error
        self.flops_per_step = flops
        return flops

    def measure(self, loop_state: LoopState) -> Logs | None:
        """The pace since the previous call (``None`` at the first, or if the count went back)."""
        now, elapsed = _time.perf_counter(), loop_state.elapsed
        mark, self._mark = self._mark, (now, elapsed.steps, elapsed.samples)
        if mark is None:
            self._flops(loop_state)  # checked when the loop starts, not at the first window
            now = _time.perf_counter()  # compiling is not part of the window
            self._mark = (now, elapsed.steps, elapsed.samples)
            return None
        if elapsed.steps <= mark[1] or now <= mark[0]:
            return None
        seconds = now - mark[0]
        steps_per_second = (elapsed.steps - mark[1]) / seconds
        p = self.prefix
        logs = Logs().add_metric(f"{p}steps_per_second", steps_per_second)
        if elapsed.samples > mark[2]:
            logs.add_metric(f"{p}samples_per_second", (elapsed.samples - mark[2]) / seconds)
        flops = self._flops(loop_state)
        if flops is not None:
            logs.add_metric(f"{p}flops_per_second", flops * steps_per_second)
            if self.peak_flops:
                logs.add_metric(f"{p}mfu", flops * steps_per_second / self.peak_flops)
        return logs

    def __loop_callback__(self, loop_state: LoopState) -> Logs | None:
        return self.measure(loop_state)

    def on_train_batch_end(
        self, state: Any, batch: Any, elapsed: Elapsed, loop_state: LoopState
    ) -> Logs | None:
        if self._mark is not None and elapsed.steps - self._mark[1] < self.steps:
            return None
        return self.measure(loop_state)


throughput = Throughput
"""Another name of :class:`Throughput` (the same class)."""
