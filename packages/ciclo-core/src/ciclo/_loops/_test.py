"""``test_loop``: evaluate a state on a dataset, with the metrics aggregated over it; and
the batch loop that ``test_loop`` and ``predict_loop`` share."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from .._loop._arguments import is_empty
from .._loop._in_flight import STEPS_IN_FLIGHT, InFlight
from .._loop._state import DATA_ENDED, LoopState
from .._records._aggregate import AggregationSpec, Aggregator
from .._records._history import History
from .._records._logs import Logs
from .._time._elapsed import Elapsed, Period
from .._time._schedules import always
from ._loop import loop
from ._named import moments
from ._registry import Hook, Registry, check_no_hooks, loop_tasks

__all__ = [
    "TEST_AGGREGATION",
    "evaluate_dataset",
    "run_batches",
    "test_loop",
]

#: The aggregation of test_loop: sample-weighted means of losses and metrics, the last
#: value of stateful metrics and of other collections, no outputs.
TEST_AGGREGATION: dict[str, Any] = {
    "losses": "mean",
    "metrics": "mean",
    "stateful_metrics": "last",
    "outputs": None,
}


def run_batches(
    registry: Registry,
    prefix: str,
    state: Any,
    dataset: Iterable[Any],
    after_step: Callable[[LoopState], None],
    on_end: list[Any],
    **loop_options: Any,
) -> tuple[Any, History, Elapsed]:
    """The loop of test_loop / predict_loop: ``on_reset_step``, ``on_<prefix>_begin``; per
    batch ``on_<prefix>_batch_begin``, the step phase, ``on_<prefix>_batch_end`` and
    ``after_step`` (which bounds the steps in flight itself); then ``on_end``."""
    named = registry.named
    tasks = loop_tasks(
        (always(), named[f"on_{prefix}_batch_begin"]),
        *registry.step_tasks(),
        (always(), named[f"on_{prefix}_batch_end"]),
        (always(), [Hook(registry.loop_name, after_step)]),
    )
    on_start = named["on_reset_step"] + named[f"on_{prefix}_begin"]
    return loop(
        state,
        dataset,
        tasks,
        on_start=on_start,
        on_end=on_end,
        max_steps_in_flight=0,
        **loop_options,
    )


def test_loop(
    state: Any,
    dataset: Iterable[Any],
    tasks: Mapping[Any, Any] | None = None,
    *,
    callbacks: Sequence[Any] | None = None,
    aggregation: AggregationSpec | None = None,
    stop: int | Period | None = None,
    batch_size_fn: Callable[[Any], int] | None = None,
    metadata: Any = None,
    **loop_kwargs: Any,
) -> tuple[Any, Logs, Elapsed]:
    """Evaluates ``state`` on ``dataset`` and returns the metrics aggregated over it.

    Losses and metrics are averaged weighted by the samples of each batch, so they equal
    the metric computed on the whole set at once (a small last batch is not over-weighted);
    stateful metrics keep their last value; outputs are dropped. Aggregation runs on device
    (nothing is fetched per batch); the returned logs hold device values.

    Order: ``on_reset_step``, ``on_test_begin``; per batch ``on_test_batch_begin``,
    ``on_test_step`` with the ordinary schedules of ``tasks`` (in tasks order),
    ``on_test_batch_end``; then ``on_test_end``, whose callbacks see the aggregated logs in
    ``loop_state.logs``.

    Args:
        state: the state; its ``test_step`` / ``reset_step`` methods run unless ``tasks`` or
            ``callbacks`` give callbacks for ``on_test_step`` / ``on_reset_step``.
        dataset: an iterable of batches.
        tasks: ``{schedule: callbacks}``, named (``ciclo.on_test_step``) or ordinary.
        callbacks: objects with hook methods named after test schedules.
        aggregation: overrides per collection, merged into the default
            ``{"losses": "mean", "metrics": "mean", "stateful_metrics": "last",
            "outputs": None}`` (see :func:`ciclo.inner_loop` for the methods).
        stop: evaluate only this much of the dataset.
        batch_size_fn: ``batch -> int``, the weight of a batch (leading dimension by default).
        metadata: as in :func:`ciclo.loop`.
        **loop_kwargs: passed on to :func:`ciclo.loop`; ``max_steps_in_flight`` (8 by default)
            bounds the evaluation steps queued ahead of Python.

    Returns:
        ``(state, logs, elapsed)``: the state after the last step, the aggregated logs, and
        the count of evaluation steps and samples.

    Example:
        >>> import ciclo, numpy as np
        >>> def test_step(state, batch):
        ...     return ciclo.logs().add_metric("mean", batch.mean())
        >>> _, logs, elapsed = ciclo.test_loop(
        ...     None, [np.ones(4), np.zeros(2)], {ciclo.on_test_step: test_step}
        ... )
        >>> round(float(logs.metrics.mean), 4), elapsed.samples
        (0.6667, 6)
    """
    return evaluate_dataset(
        state,
        dataset,
        tasks,
        "test_loop(dataset=...)",
        callbacks=callbacks,
        aggregation=aggregation,
        stop=stop,
        batch_size_fn=batch_size_fn,
        metadata=metadata,
        **loop_kwargs,
    )


test_loop.__test__ = False  # type: ignore[attr-defined]  # not a pytest test when imported


def evaluate_dataset(
    state: Any,
    dataset: Iterable[Any],
    tasks: Mapping[Any, Any] | None,
    where: str,
    *,
    callbacks: Sequence[Any] | None = None,
    aggregation: AggregationSpec | None = None,
    stop: int | Period | None = None,
    after_batch: Callable[[], None] | None = None,
    **loop_kwargs: Any,
) -> tuple[Any, Logs, Elapsed]:
    """:func:`test_loop` (its other options pass on in ``loop_kwargs``), whose error for a
    dataset that yields no batch names the dataset as ``where`` (``"test_dataset['valid']"``
    in ``train_loop``); ``after_batch`` is called after each batch."""
    check_no_hooks("test_loop", loop_kwargs)
    if is_empty(dataset) and stop != 0:  # the error below, without loop's warning first
        raise ValueError(_SAW_NO_BATCH.format(where=where))
    registry = Registry("test_loop", moments("test"), "on_test_step", state, tasks, callbacks)
    registry.require_step("test_step")
    if aggregation is None or isinstance(aggregation, Mapping):
        aggregator = Aggregator({**TEST_AGGREGATION, **(aggregation or {})})
    else:
        aggregator = Aggregator(aggregation)
    in_flight = InFlight(loop_kwargs.pop("max_steps_in_flight", STEPS_IN_FLIGHT))
    result: list[Logs] = []

    def accumulate(loop_state: LoopState) -> None:
        aggregator.add(loop_state.logs, loop_state.batch_size_fn(loop_state.batch))
        in_flight.push_tree(loop_state.logs, loop_state.state)
        loop_state.logs = Logs()  # aggregated: the per-batch logs go no further
        if after_batch is not None:
            after_batch()

    with warnings.catch_warnings():  # stop is at most how much of the set to evaluate
        warnings.filterwarnings("ignore", f"{DATA_ENDED} .*", RuntimeWarning)
        state, _, elapsed = run_batches(
            registry,
            "test",
            state,
            dataset,
            accumulate,
            [
                Hook("test_loop aggregation", lambda _: aggregator.result()),
                *registry.named["on_test_end"],
                Hook("test_loop result", lambda loop_state: result.append(loop_state.logs.copy())),
            ],
            stop=stop,
            **loop_kwargs,
        )
    if elapsed.steps == 0 and stop != 0:
        raise ValueError(_SAW_NO_BATCH.format(where=where))
    return state, result[0], elapsed


_SAW_NO_BATCH = (
    "the evaluation saw no batch: {where} yielded nothing, so there is no metric to report. "
    "It is empty, or an iterator or generator that an earlier evaluation used up: give a "
    "function returning a fresh dataset (called for each evaluation) or a re-iterable one "
    "such as a list."
)
