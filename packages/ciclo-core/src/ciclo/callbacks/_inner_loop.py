"""Aggregating the logs of many steps into one, and running a loop inside a loop."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._records._history import History
from .._records._logs import Logs
from .._time._elapsed import Elapsed

__all__ = ["Aggregator", "aggregate_history", "inner_loop", "rename_logs"]

#: How one entry is aggregated: a method name, a callable on the stacked values, or
#: ``None`` to leave the entry out.
Aggregation = str | Callable[[Any], Any] | None
AggregationSpec = Aggregation | Mapping[str, Aggregation]

_METHODS = ("last", "first", "mean", "sum", "min", "max")
_NUMERIC = (jax.Array, np.ndarray, np.generic, int, float, bool)
_NUMERIC_TYPES: set[type] = set()  # types seen to be subclasses of _NUMERIC


def _is_numeric(value: Any) -> bool:
    """Whether ``value`` can be reduced (remembering its type when that alone says so)."""
    if issubclass(type(value), _NUMERIC):
        _NUMERIC_TYPES.add(type(value))
        return True
    return isinstance(value, _NUMERIC)  # e.g. a tracer, by its abstract value


def _check_method(method: Any, where: str) -> Aggregation:
    if method is None or callable(method) or method in _METHODS:
        return method  # type: ignore[no-any-return]
    raise ValueError(
        f"unknown aggregation {method!r} {where}; use one of {', '.join(map(repr, _METHODS))}, "
        f"a callable on the values stacked along axis 0 (e.g. jnp.median), None to leave "
        f"the entries out, or a dict {{collection: aggregation}}."
    )


class _Spec:
    """``aggregation=`` parsed: the method of each collection."""

    def __init__(self, spec: AggregationSpec, default: Aggregation = "last") -> None:
        if isinstance(spec, Mapping):
            self.per_collection = {
                str(c): _check_method(m, f"for collection {c!r}") for c, m in spec.items()
            }
            self.default = _check_method(default, "(default)")
        else:
            self.per_collection = {}
            self.default = _check_method(spec, "")

    def method(self, collection: str) -> Aggregation:
        return self.per_collection.get(collection, self.default)


def _combine_values(method: str, acc: Any, value: Any, weight: Any) -> Any:
    if method == "mean":
        return acc + value * weight
    return {"sum": jnp.add, "min": jnp.minimum, "max": jnp.maximum}[method](acc, value)


@functools.partial(jax.jit, static_argnums=0)
def _combine(method: str, acc: Any, values: Any, weight: Any) -> Any:
    return jax.tree.map(lambda a, v: _combine_values(method, a, v, weight), acc, values)


@functools.partial(jax.jit, static_argnums=0)
def _fold(
    methods: tuple[str, ...], acc: tuple[Any, ...], steps: tuple[tuple[Any, ...], ...], weights: Any
) -> tuple[Any, ...]:
    """``_combine`` of a chunk of steps in one call, in order (the same operations).

    Entries are positional (the i-th of ``acc`` and of each step has ``methods[i]``), and
    ``weights`` is one integer array, in which ``-1`` marks a padding step (a repeat of
    another), left out: every chunk has the same size, so this compiles once.
    """
    out = list(acc)
    for values, weight in zip(steps, weights, strict=True):
        for i, (method, value) in enumerate(zip(methods, values, strict=True)):
            out[i] = jnp.where(weight >= 0, _combine_values(method, out[i], value, weight), out[i])
    return tuple(out)


@jax.jit
def _scale(values: Any, weight: Any) -> Any:
    return jax.tree.map(lambda v: v * weight, values)


@jax.jit
def _divide(sums: Any, weights: Any) -> Any:
    return jax.tree.map(lambda s, w: s / w, sums, weights)


_Key = tuple[str, str]

#: Steps whose reductions run in one compiled call, once their entries repeat.
_CHUNK = 16


class Aggregator:
    """Aggregates the logs of many steps into one :class:`Logs`, on device.

    ``add`` never fetches a value to the host; ``result`` returns device values.
    ``"mean"`` is weighted (by samples in the predefined loops), so a small last batch is
    not over-weighted. While the steps log the same entries, the reductions (``"mean"``,
    ``"sum"``, ``"min"``, ``"max"``) of up to 16 steps run as one compiled call, so that
    aggregating costs a fraction of a dispatch per step; a step that logs other entries
    than the step before costs at most one call per method.

    Args:
        aggregation: a method for every collection (``"last"``, ``"first"``, ``"mean"``,
            ``"sum"``, ``"min"``, ``"max"``, a callable on the values stacked along axis 0, or
            ``None`` to drop), or a dict ``{collection: method}``.
        default: the method of collections the dict does not name.

    Example:
        >>> import ciclo
        >>> agg = Aggregator({"metrics": "mean"})
        >>> agg.add(ciclo.logs().add_metric("acc", 1.0), weight=3)
        >>> agg.add(ciclo.logs().add_metric("acc", 0.0), weight=1)
        >>> float(agg.result().metrics.acc)
        0.75
    """

    def __init__(self, aggregation: AggregationSpec, default: Aggregation = "last") -> None:
        self.spec = _Spec(aggregation, default)
        self._values: dict[_Key, Any] = {}
        self._weights: dict[_Key, float] = {}
        self._stacks: dict[_Key, list[Any]] = {}
        # Steps whose reductions are not combined yet; all reduce the entries `_keys`, which
        # `_values` already holds.
        self._pending: list[tuple[dict[_Key, Any], float]] = []
        self._keys: tuple[_Key, ...] = ()

    def add(self, logs: Mapping[str, Mapping[str, Any]], weight: float = 1) -> None:
        """Adds the logs of one step, weighing ``"mean"`` entries by ``weight``."""
        values, weights = self._values, self._weights
        reduced: dict[_Key, Any] = {}
        for collection, entries in logs.items():
            method = self.spec.method(collection)
            if method is None:
                continue
            if method == "last":
                for name, value in entries.items():
                    values[(collection, name)] = value
            elif method == "first":
                for name, value in entries.items():
                    values.setdefault((collection, name), value)
            elif callable(method):
                for name, value in entries.items():
                    self._stacks.setdefault((collection, name), []).append(value)
                    values[(collection, name)] = None
            else:
                mean = method == "mean"
                for name, value in entries.items():
                    if type(value) not in _NUMERIC_TYPES and not _is_numeric(value):
                        raise TypeError(
                            f"cannot aggregate log entry {collection}.{name} with {method!r}: "
                            f"it is {type(value).__name__}, not a number or an array. Use "
                            f"aggregation={{{collection!r}: 'last'}} (or None to drop it)."
                        )
                    key = (collection, name)
                    reduced[key] = value
                    if mean:
                        weights[key] = weights.get(key, 0.0) + weight
        if not reduced:
            return
        if tuple(reduced) == self._keys:
            self._pending.append((reduced, weight))
            if len(self._pending) == _CHUNK:
                self._fold()
            return
        self._fold()
        self._combine(reduced, weight)
        self._keys = tuple(reduced)

    def _combine(self, reduced: dict[_Key, Any], weight: float) -> None:
        """Combines one step's reduced entries into the running values."""
        values = self._values
        groups: dict[str, tuple[dict[_Key, Any], dict[_Key, Any]]] = {}
        for key, value in reduced.items():
            method = self.spec.method(key[0])
            existing, new = groups.setdefault(str(method), ({}, {}))
            (existing if key in values else new)[key] = value
        for method, (existing, new) in groups.items():
            if existing:
                acc = {k: values[k] for k in existing}
                values.update(_combine(method, acc, existing, weight))
            if new:
                values.update(_scale(new, weight) if method == "mean" else new)

    def _fold(self) -> None:
        """Combines the pending steps (all with the entries ``_keys``) in one call."""
        pending, self._pending = self._pending, []
        if not pending:
            return
        weights = [weight for _, weight in pending]
        if not all(type(w) is int for w in weights):  # keep the dtypes of a Python float
            for reduced, weight in pending:
                self._combine(reduced, weight)
            return
        keys = self._keys
        methods = tuple(str(self.spec.method(collection)) for collection, _ in keys)
        acc = tuple(self._values[key] for key in keys)
        steps = [tuple(reduced.values()) for reduced, _ in pending]
        padding = _CHUNK - len(steps)
        steps += [steps[-1]] * padding
        weights += [-1] * padding
        folded = _fold(methods, acc, tuple(steps), np.asarray(weights, np.int32))
        self._values.update(zip(keys, folded, strict=True))

    def result(self) -> Logs:
        """The aggregated logs (an entry appears if some step had it)."""
        self._fold()
        out = Logs()
        means = {k: v for k, v in self._values.items() if k in self._weights}
        if means:
            weights = {k: self._weights[k] or float("nan") for k in means}
            means = _divide(means, weights)
        for key, value in self._values.items():
            collection, name = key
            if key in means:
                value = means[key]
            elif key in self._stacks:
                method = self.spec.method(collection)
                assert callable(method)
                value = method(jnp.stack(self._stacks[key]))
            out.add_entry(collection, name, value)
        return out


def _row_weights(samples: list[int], final: int | None) -> list[float]:
    """A row's weight is the samples its step consumed: up to the next row of a later
    step, or up to ``final`` (the loop's returned count) for the last step."""
    if final is None:
        return [1.0] * len(samples)
    weights = []
    for i, s in enumerate(samples):
        upto = next((t for t in samples[i + 1 :] if t > s), final)
        weights.append(float(upto - s))
    return weights


def aggregate_history(
    history: History, aggregation: AggregationSpec, elapsed: Elapsed | None = None
) -> Logs:
    """Aggregates the rows of ``history`` (on the host; the history is fetched anyway).

    ``"mean"`` weighs each row by the samples of its step (needs ``elapsed``, the count the
    loop returned; unweighted without it).
    """
    spec = _Spec(aggregation)
    rows = list(history)
    weights = _row_weights(
        [int(row.get("elapsed", {}).get("samples", 0)) for row in rows],
        None if elapsed is None else elapsed.samples,
    )
    columns: dict[_Key, tuple[list[Any], list[float]]] = {}
    for row, weight in zip(rows, weights, strict=True):
        for collection, entries in row.items():
            if collection == "elapsed" or spec.method(collection) is None:
                continue
            for name, value in entries.items():
                column = columns.setdefault((collection, name), ([], []))
                column[0].append(value)
                column[1].append(weight)
    out = Logs()
    for (collection, name), (values, column_weights) in columns.items():
        method = spec.method(collection)
        out.add_entry(collection, name, _reduce(method, values, column_weights, collection, name))
    return out


_REDUCERS: dict[str, Callable[..., Any]] = {"sum": np.sum, "min": np.min, "max": np.max}


def _reduce(method: Aggregation, values: list[Any], weights: list[float], *where: str) -> Any:
    if method == "last":
        return values[-1]
    if method == "first":
        return values[0]
    try:
        stacked = np.stack([np.asarray(v) for v in values])
        if stacked.dtype.kind not in "biufc":  # bool, int, unsigned, float, complex
            raise TypeError
    except (TypeError, ValueError):
        raise TypeError(
            f"cannot aggregate log entry {'.'.join(where)} with {method!r}: its values are "
            f"not numbers or arrays of one shape. Use aggregation={{{where[0]!r}: 'last'}}."
        ) from None
    if callable(method):
        result = method(stacked)
    elif method == "mean":
        w = np.asarray(weights)
        result = np.average(stacked, axis=0, weights=w) if w.sum() > 0 else stacked.mean(0)
    else:
        result = _REDUCERS[str(method)](stacked, axis=0)
    return result.item() if np.ndim(result) == 0 and hasattr(result, "item") else result


def rename_logs(logs: Mapping[str, Mapping[str, Any]], suffix: str) -> Logs:
    """``logs`` with every entry renamed ``<entry>_<suffix>`` (collections kept)."""
    out = Logs()
    for collection, entries in logs.items():
        if collection == "elapsed":
            continue
        for name, value in entries.items():
            out.add_entry(collection, f"{name}_{suffix}", value)
    return out


def _split_result(name: str, result: Any) -> tuple[Any, Any, Elapsed | None]:
    """``(state, history or logs, elapsed)`` from what a loop function returned."""
    if isinstance(result, History | Logs):
        return None, result, None
    if isinstance(result, tuple) and len(result) in (2, 3):
        state, logs = result[0], result[1]
        elapsed = result[2] if len(result) == 3 else None
        if isinstance(logs, History | Mapping) and (
            elapsed is None or isinstance(elapsed, Elapsed)
        ):
            return state, logs, elapsed
    raise TypeError(
        f"inner_loop({name!r}): the loop function returned {type(result).__name__}; it must "
        f"return what ciclo's loops return: (state, history, elapsed) like ciclo.loop, or "
        f"(state, logs, elapsed) like ciclo.test_loop. Example: "
        f"inner_loop({name!r}, lambda state: ciclo.test_loop(state, make_dataset()))."
    )


def inner_loop(
    name: str,
    loop_fn: Callable[[Any], Any],
    aggregation: AggregationSpec = "last",
    *,
    output_state: bool = False,
) -> Callable[[Any], tuple[Logs, Any]]:
    """A callback that runs a whole loop (an evaluation, a probe...) and logs its result,
    each entry renamed ``<entry>_<name>`` (``accuracy`` -> ``accuracy_test``).

    Args:
        name: the suffix of the entries (and the callback's name in errors).
        loop_fn: ``state -> (state, history, elapsed)`` like :func:`ciclo.loop`, or
            ``state -> (state, logs, elapsed)`` like :func:`ciclo.test_loop` (whose logs are
            already aggregated and are used as they are).
        aggregation: how the rows of the inner history become one value per entry:
            ``"last"`` (default), ``"first"``, ``"mean"`` (weighted by samples), ``"sum"``,
            ``"min"``, ``"max"``, a callable on the values stacked along axis 0, or a dict
            ``{collection: aggregation}`` (collections it does not name use ``"last"``;
            ``None`` leaves a collection out).
        output_state: keep the state the inner loop returns (by default the outer state is
            left unchanged, as an evaluation should).

    Returns:
        a callback ``state -> (logs, state)``.

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
        raise TypeError(
            f"inner_loop({name!r}): loop_fn must be a function state -> (state, history, "
            f"elapsed), got {loop_fn!r}."
        )
    _Spec(aggregation)  # validates early

    def run(state: Any) -> tuple[Logs, Any]:
        new_state, logs, elapsed = _split_result(name, loop_fn(state))
        if isinstance(logs, History):
            logs = aggregate_history(logs, aggregation, elapsed)
        return rename_logs(logs, name), (new_state if output_state else None)

    run.__qualname__ = run.__name__ = f"inner_loop({name!r})"
    return run
