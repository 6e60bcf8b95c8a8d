"""``predict_loop``: run a prediction step over a dataset and collect its outputs."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._loop._in_flight import STEPS_IN_FLIGHT, InFlight
from .._loop._state import LoopState
from .._records._logs import Logs
from .._time._elapsed import Elapsed, Period
from ._named import moments
from ._registry import Registry, check_no_hooks
from ._test import run_batches

__all__ = ["predict_loop"]


def _concatenate(name: str, values: list[Any]) -> Any:
    def concat(*leaves: Any) -> Any:
        xp = np if all(isinstance(x, np.ndarray | np.generic) for x in leaves) else jnp
        if all(np.ndim(x) == 0 for x in leaves):
            return xp.stack(leaves)
        try:
            return xp.concatenate(leaves, axis=0)
        except (TypeError, ValueError) as error:
            msg = f"predict_loop cannot concatenate output {name!r}: {error}"
            raise ValueError(f"{msg}; pass concatenate=False.") from None

    return jax.tree.map(concat, *values)


def predict_loop(
    state: Any,
    dataset: Iterable[Any],
    tasks: Mapping[Any, Any] | None = None,
    *,
    callbacks: Sequence[Any] | None = None,
    concatenate: bool = False,
    stop: int | Period | None = None,
    batch_size_fn: Callable[[Any], int] | None = None,
    metadata: Any = None,
    **loop_kwargs: Any,
) -> tuple[Any, dict[str, Any], Elapsed]:
    """Runs the prediction step over ``dataset`` and collects its outputs (kept on device).

    A step returns ``(outputs, logs, state)`` (or logs with an ``outputs`` collection); a
    non-dict ``outputs`` is collected as ``"outputs"``.

    Args:
        state: the state; its ``predict_step`` runs unless ``tasks``/``callbacks`` give one.
        dataset: an iterable of batches.
        tasks, callbacks: as in :func:`test_loop`, with the predict schedules.
        concatenate: concatenate each output along the batch axis (else a list per batch).
        stop, batch_size_fn, metadata, **loop_kwargs: as in :func:`ciclo.loop`.

    Returns:
        ``(state, outputs, elapsed)`` with ``outputs`` a dict ``{name: values}``.

    Example:
        >>> import ciclo, numpy as np
        >>> def predict_step(state, batch):
        ...     return batch * 2, None, None
        >>> _, outputs, _ = ciclo.predict_loop(
        ...     None, [np.ones(2), np.ones(3)], {ciclo.on_predict_step: predict_step},
        ...     concatenate=True,
        ... )
        >>> outputs["outputs"]
        array([2., 2., 2., 2., 2.])
    """
    check_no_hooks("predict_loop", loop_kwargs)
    registry = Registry(
        "predict_loop", moments("predict"), "on_predict_step", state, tasks, callbacks
    )
    registry.require_step("predict_step")
    in_flight = InFlight(loop_kwargs.pop("max_steps_in_flight", STEPS_IN_FLIGHT))
    collected: dict[str, list[Any]] = {}

    def collect(loop_state: LoopState) -> None:
        outputs = loop_state.logs.get("outputs", {})
        for name, value in outputs.items():
            collected.setdefault(name, []).append(value)
        in_flight.push_tree(outputs, loop_state.logs, loop_state.state)
        loop_state.logs = Logs()

    state, _, elapsed = run_batches(
        registry,
        "predict",
        state,
        dataset,
        collect,
        registry.named["on_predict_end"],
        stop=stop,
        batch_size_fn=batch_size_fn,
        metadata=metadata,
        **loop_kwargs,
    )
    if concatenate:
        return state, {k: _concatenate(k, v) for k, v in collected.items()}, elapsed
    return state, collected, elapsed
