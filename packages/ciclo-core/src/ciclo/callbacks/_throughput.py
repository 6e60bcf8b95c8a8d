"""``throughput``: steps/s, samples/s, FLOP/s and MFU logged into the history, measured on
the host between two calls (no device sync: the bound on steps queued ahead of Python keeps
the host's pace equal to the device's over a window)."""

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

_FORMS = (
    "a number of FLOPs, a jitted step function (jax.jit), or a managed step "
    "(state.train_step, type(state).train_step, ciclo.managed.train_step(...))"
)
MSG_FLOPS_FAILED = (
    "throughput(flops_per_step={step}): reading the FLOPs of one step on the loop's state and "
    "batch failed ({error}). flops_per_step takes " + _FORMS + ": the step must accept "
    "(state, batch). Or pass the FLOPs as a number (ciclo.callbacks.compiled_flops(step, "
    "state, batch) computes them)."
)


def compiled_flops(fn: Any, *args: Any, **kwargs: Any) -> float | None:
    """The FLOPs of one call of the jitted ``fn`` on ``args``, as XLA's ``cost_analysis``
    of the compiled call reports them (``None`` when it reports none).

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
    """The FLOPs of a lowered call (``jax.jit(f).lower(...)``), as XLA's ``cost_analysis``
    of the compiled call reports them (``None`` when it reports none)."""
    analysis: Any = lowered_call.compile().cost_analysis()
    if isinstance(analysis, list | tuple):  # older jax: one dict per device program
        analysis = analysis[0] if analysis else None
    flops = analysis.get("flops") if isinstance(analysis, dict) else None
    return float(flops) if flops is not None and flops > 0 else None


class Throughput(LoopCallbackBase):
    """Logs the loop's pace as metrics: ``steps_per_second``, ``samples_per_second`` and,
    given the FLOPs of a step, ``flops_per_second`` and ``mfu`` (the fraction of
    ``peak_flops``).

    Each value covers the window since the previous log (every ``steps`` steps); the first
    call opens the window and logs nothing. Time is read on the host, so nothing waits for
    the device: with the loop's bound on steps queued ahead, the host's pace over a window
    is the device's. The values go into the history like any metric, and the bars show them.

    Args:
        steps: the window, in steps (in ``train_loop``; in ``ciclo.loop`` the schedule it is
            put under decides, ``every(steps)`` when spread with ``**``).
        flops_per_step: the FLOPs of one step, or the step itself: a jitted function
            (``jax.jit``), or a managed step, bound or not (``state.train_step``,
            ``type(state).train_step``, an adapter's state's ``train_step``). Its compiled
            call's ``cost_analysis`` on the loop's state and batch gives the FLOPs, read at
            the first call, when the loop starts: a step that cannot be lowered on them
            stops the loop there, with an error naming ``throughput`` (see
            :func:`compiled_flops`).
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
            raise TypeError(
                f"throughput(peak_flops={peak_flops!r}): expected the device's peak FLOP/s "
                "(a number, e.g. 989e12 for an H100's bf16 dense peak)"
            )
        if flops_per_step is not None and not callable(flops_per_step):
            if isinstance(flops_per_step, bool) or not isinstance(flops_per_step, int | float):
                raise TypeError(
                    f"throughput(flops_per_step={describe(flops_per_step)}): expected {_FORMS}."
                )
            if not flops_per_step > 0:
                raise ValueError(
                    f"throughput(flops_per_step={flops_per_step!r}): the FLOPs of a step must "
                    f"be > 0."
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
        """The FLOPs of a step; a step given as ``flops_per_step`` is lowered on the loop's
        state and batch once, at the first call (when the loop starts)."""
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
            raise TypeError(
                MSG_FLOPS_FAILED.format(step=name, error=f"{type(error).__name__}: {error}")
            ) from error
        self.flops_per_step = flops
        return flops

    def measure(self, loop_state: LoopState) -> Logs | None:
        """The pace since the previous call (``None`` at the first call, which starts the
        window and reads the FLOPs of a step given as ``flops_per_step``, and after a jump
        back in the count)."""
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

    # --- hooks ---------------------------------------------------------------------------
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
