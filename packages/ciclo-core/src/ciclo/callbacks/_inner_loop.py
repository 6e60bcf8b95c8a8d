"""Running a loop inside a loop (an evaluation, a probe) and logging its aggregated result."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .._loop._state import LoopState
from .._records._aggregate import AggregationSpec, Spec, aggregate_history, rename_logs
from .._records._history import History
from .._records._logs import Logs
from .._time._elapsed import Elapsed
from .._time._phases import EVALUATION, marked

__all__ = ["inner_loop"]


def _as_history(rows: list[Any]) -> History | None:
    """The original ciclo's history (a list of dicts) as a :class:`History`, or ``None``."""
    if not all(
        isinstance(row, Mapping) and all(isinstance(v, Mapping) for v in row.values())
        for row in rows
    ):
        return None
    history = History()
    for step, row in enumerate(rows):
        logs = Logs({c: entries for c, entries in row.items() if c != "elapsed"})
        history.commit(Elapsed.create(steps=step), logs)
    return history


_NOT_A_RESULT = "inner_loop({!r}): the loop function returned {}, not (state, history, elapsed)."


def _split_result(name: str, result: Any) -> tuple[Any, Any, Elapsed | None]:
    """``(state, history or logs, elapsed)`` from what a loop function returned."""
    if isinstance(result, History | Logs):
        return None, result, None
    if isinstance(result, tuple) and len(result) in (2, 3):
        state, logs = result[0], result[1]
        elapsed = result[2] if len(result) == 3 else None
        if isinstance(logs, list) and (converted := _as_history(logs)) is not None:
            return state, converted, None
        if isinstance(logs, History | Mapping) and (
            elapsed is None or isinstance(elapsed, Elapsed)
        ):
            return state, logs, elapsed
    raise TypeError(_NOT_A_RESULT.format(name, type(result).__name__))


def inner_loop(
    name: str,
    loop_fn: Callable[[Any], Any],
    aggregation: AggregationSpec = "last",
    *,
    output_state: bool = False,
) -> Callable[[Any], tuple[Logs, Any]]:
    """A callback that runs a whole loop and logs its result, entries renamed ``<entry>_<name>``.

    Args:
        name: the suffix of the entries (and the callback's name in errors).
        loop_fn: ``state -> (state, history, elapsed)`` like :func:`ciclo.loop`, or
            ``state -> (state, logs, elapsed)`` like :func:`ciclo.test_loop`.
        aggregation: how the history's rows become one value per entry: ``"last"``,
            ``"mean"`` (by samples), ``"sum"``..., or a dict ``{collection: aggregation}``.
        output_state: keep the state the inner loop returns (else ``None``: unchanged).

    Returns:
        a callback ``state -> (logs, None)`` (``(logs, new_state)`` with ``output_state``).

    Example:
        >>> import ciclo, numpy as np
        >>> def probe(state, batch):
        ...     return ciclo.logs().add_metric("mean", batch.mean())
        >>> evaluate = ciclo.inner_loop(
        ...     "probe",
        ...     lambda state: ciclo.loop(state, [np.ones(2), np.zeros(2)], {ciclo.every(1): probe}),
        ...     aggregation="mean",
        ... )
        >>> logs, _ = evaluate(0)
        >>> logs.metrics.mean_probe
        0.5
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"inner_loop name must be a non-empty string, got {name!r}.")
    if not callable(loop_fn):
        raise TypeError(f"inner_loop({name!r}): loop_fn must be a function, got {loop_fn!r}.")
    Spec(aggregation)  # validates early

    def run(
        state: Any, batch: Any = None, elapsed: Any = None, loop_state: LoopState | None = None
    ) -> tuple[Logs, Any]:
        phases = None if loop_state is None else loop_state.phases
        with marked(phases, EVALUATION):  # for the ledger and the watchdog
            result = loop_fn(state)
        new_state, logs, elapsed = _split_result(name, result)
        if isinstance(logs, History):
            logs = aggregate_history(logs, aggregation, elapsed)
        return rename_logs(logs, name), (new_state if output_state else None)

    run.__qualname__ = run.__name__ = f"inner_loop({name!r})"
    return run
