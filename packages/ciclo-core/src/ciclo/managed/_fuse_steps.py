"""``ciclo.fuse_steps``: what ``steps_per_call`` does for a managed step, for a plain
``(state, batch) -> (logs, state)`` step: the same ``lax.scan`` (``_compile.fuse``), the
same grouping by the loop (``ciclo._loop._fusion``) and the same controller (``_auto``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax

from .._loop._returns import NO_CHANGE, parse_return
from .._loop._state import LoopState
from .._records._logs import Logs
from ._auto import AutoFusion
from ._compile import fuse, run_group

__all__ = ["FusedSteps", "fuse_steps"]


class FusedSteps:
    """A step the loop runs up to ``steps_per_call`` batches at a time (see
    :func:`fuse_steps`); called directly, ``fused(state, batch)`` runs one step."""

    def __init__(self, step: Callable[[Any, Any], Any], steps_per_call: int | str) -> None:
        if not callable(step):
            raise TypeError(
                f"fuse_steps(step): step must be a function (state, batch) -> (logs, state), "
                f"got {type(step).__name__}."
            )
        fixed = isinstance(steps_per_call, int) and not isinstance(steps_per_call, bool)
        if not (fixed and steps_per_call >= 1) and steps_per_call != "auto":  # type: ignore[operator]
            raise ValueError(
                f"fuse_steps(steps_per_call={steps_per_call!r}): steps_per_call must be an int "
                '>= 1 (the steps one call runs) or "auto" (the loop measures and picks it).'
            )
        self.step, self.steps_per_call = step, steps_per_call
        self.__name__ = getattr(step, "__name__", type(step).__name__)
        self._auto = AutoFusion() if steps_per_call == "auto" else None

        def body(state: Any, batch: Any, _: Any) -> tuple[Logs, Any]:
            logs, new_state = parse_return(step(state, batch), f"fuse_steps({self.__name__})")
            return (logs or Logs()), (state if new_state is NO_CHANGE else new_state)

        fused = fuse(body, last_row=True)
        self._fused = jax.jit(lambda state, batches: fused(state, batches, None))

    def __call__(self, state: Any, batch: Any) -> Any:
        return self.step(state, batch)

    def __repr__(self) -> str:
        return f"<ciclo.fuse_steps {self.__name__}, steps_per_call={self.steps_per_call!r}>"

    def __loop_callback__(self, loop_state: LoopState) -> Any:
        if self._auto is not None:  # "auto": the call's time is measured
            return self._auto.timed(self.step, loop_state.state, loop_state.batch)
        return self.step(loop_state.state, loop_state.batch)

    def __loop_end__(self, loop_state: LoopState, error: BaseException | None) -> None:
        if self._auto is not None:  # the loop's end may close a measurement
            self._auto.loop_ended(loop_state, error)

    def __loop_steps_per_call__(self, loop_state: LoopState) -> int:
        if self._auto is not None:
            return self._auto.steps(loop_state)
        return self.steps_per_call  # type: ignore[return-value]

    def __loop_callback_many__(
        self, loop_state: LoopState, batches: Sequence[Any]
    ) -> tuple[Logs, Any, Logs]:
        return run_group(self._fused, loop_state.state, batches, self._auto)

    def __loop_lower__(self, loop_state: LoopState) -> Any:
        lower = getattr(self.step, "lower", None)  # a jax.jit step; else nothing to lower
        return None if lower is None else lower(loop_state.state, loop_state.batch)


def fuse_steps(step: Callable[[Any, Any], Any], steps_per_call: int | str = "auto") -> FusedSteps:
    """``step(state, batch) -> (logs, state)``, a plain function such as a ``jax.jit``
    step, as a loop callback that runs up to ``steps_per_call`` consecutive batches in one
    compiled call (a ``lax.scan`` of ``step``), as a managed step's ``steps_per_call`` does.

    Every step is still recorded, and schedules fire on the steps they name (see
    :func:`ciclo.loop` on fused steps). ``"auto"`` (the default) measures while the loop
    runs and fuses as many steps as pay (a large step stays at one and compiles nothing
    more). ``step`` must depend on its arguments only, as under ``jax.jit``: fused, it is
    traced once per group size. Batches of another shape end a group.

    Example:
        >>> import ciclo, jax, numpy as np
        >>> @jax.jit
        ... def train_step(state, batch):
        ...     return ciclo.logs().add_metric("total", state + batch.sum()), state + 1
        >>> state, history, _ = ciclo.loop(
        ...     0.0, [np.ones(2)] * 10, {ciclo.every(1): ciclo.fuse_steps(train_step, 4)}
        ... )
        >>> float(state), len(history.collect("total"))
        (10.0, 10)
    """
    return FusedSteps(step, steps_per_call)
