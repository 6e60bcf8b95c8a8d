"""Aggregation of log entries, one method per collection (:class:`Spec`), wherever logs are
combined: steps (:class:`Aggregator`), history rows, micro-batches, ``pmap`` devices.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._time._elapsed import Elapsed
from ._history import History
from ._logs import Logs

__all__ = [
    "METHODS",
    "Aggregation",
    "AggregationSpec",
    "Aggregator",
    "Spec",
    "aggregate_history",
    "merge_micro_logs",
    "reduce_across_devices",
    "reduce_stacked",
    "rename_logs",
]

#: How one entry is aggregated: a method name, a callable on the stacked values, or None.
Aggregation = str | Callable[[Any], Any] | None
#: One aggregation for every collection, or a dict ``{collection: aggregation}``.
AggregationSpec = Aggregation | Mapping[str, Aggregation]

#: The aggregation methods by name.
METHODS = ("last", "first", "mean", "sum", "min", "max")
_NUMERIC = (jax.Array, np.ndarray, np.generic, int, float, bool)
_NUMERIC_TYPES: set[type] = set()  # types seen to be subclasses of _NUMERIC


def _is_numeric(value: Any) -> bool:
    """Whether ``value`` can be reduced (caching its type when that alone says so)."""
    if issubclass(type(value), _NUMERIC):
        _NUMERIC_TYPES.add(type(value))
        return True
    return isinstance(value, _NUMERIC)  # e.g. a tracer, by its abstract value


_UNKNOWN = "unknown aggregation {method!r}{where}; use one of {methods}, a callable or None."


def check_method(method: Any, where: str) -> Aggregation:
    """``method`` if it is an aggregation, else a ``ValueError`` listing them.

    Example:
        >>> check_method("mean", "")
        'mean'
    """
    if method is None or callable(method) or method in METHODS:
        return method  # type: ignore[no-any-return]
    raise ValueError(_UNKNOWN.format(method=method, where=where, methods=METHODS))


class Spec:
    """An ``aggregation=`` argument parsed and checked: the method of each collection.

    Example:
        >>> spec = Spec({"metrics": "mean"})
        >>> spec.method("metrics"), spec.method("losses")
        ('mean', 'last')
    """

    def __init__(self, spec: AggregationSpec, default: Aggregation = "last") -> None:
        if isinstance(spec, Mapping):
            self.per_collection = {
                str(c): check_method(m, f" for collection {c!r}") for c, m in spec.items()
            }
            self.default = check_method(default, " (default)")
        else:
            self.per_collection = {}
            self.default = check_method(spec, "")

    def method(self, collection: str) -> Aggregation:
        """The aggregation of ``collection``."""
        return self.per_collection.get(collection, self.default)


def reduce_stacked(method: Aggregation, stacked: Any, weights: Any = None) -> Any:
    """The values of one entry, stacked along axis 0, reduced by ``method`` (NumPy or JAX).

    ``weights`` weigh ``"mean"``; all-zero weights give the unweighted mean.

    Example:
        >>> import numpy as np
        >>> float(reduce_stacked("mean", np.array([1.0, 0.0]), weights=np.array([3.0, 1.0])))
        0.75
    """
    if method == "last":
        return stacked[-1]
    if method == "first":
        return stacked[0]
    if callable(method):
        return method(stacked)
    xp = np if isinstance(stacked, np.ndarray) else jnp
    if method == "mean":
        if weights is None:
            return stacked.mean(axis=0)
        w = xp.asarray(weights)
        if xp is np and not w.sum() > 0:
            return stacked.mean(axis=0)
        return xp.average(stacked, axis=0, weights=w)
    return getattr(xp, str(method))(stacked, axis=0)  # sum, min, max


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
    """``_combine`` of a fixed-size chunk of steps in one call; weight ``-1`` marks padding."""
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


_NOT_A_NUMBER = "cannot aggregate log entry {0}.{1} with {2!r}: not a number; use 'last' for {0!r}."


class Aggregator:
    """Aggregates the logs of many steps into one :class:`Logs`, on device (no host fetch).

    While the steps log the same entries, the reductions of up to 16 steps run as one
    compiled call.

    Args:
        aggregation: a method for every collection, or a dict ``{collection: method}``.
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
        self.spec = Spec(aggregation, default)
        self._values: dict[_Key, Any] = {}
        self._weights: dict[_Key, float] = {}
        self._stacks: dict[_Key, list[Any]] = {}
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
                        raise TypeError(_NOT_A_NUMBER.format(collection, name, method))
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
                value = reduce_stacked(self.spec.method(collection), jnp.stack(self._stacks[key]))
            out.add_entry(collection, name, value)
        return out


def _row_weights(samples: list[int], final: int | None) -> list[float]:
    """Each row's weight: the samples its step consumed (up to the next step's, or ``final``)."""
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
    """Aggregates the rows of ``history`` on the host; ``elapsed`` weighs ``"mean"`` by samples.

    Example:
        >>> import ciclo
        >>> history = ciclo.History()
        >>> for steps, value in enumerate([1.0, 3.0]):
        ...     elapsed = ciclo.Elapsed.create(steps=steps, samples=2 * steps)
        ...     history.commit(elapsed, ciclo.logs().add_metric("m", value))
        >>> aggregate_history(history, "mean").metrics.m
        2.0
    """
    spec = Spec(aggregation)
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
        out.add_entry(
            collection, name, _reduce_column(method, values, column_weights, collection, name)
        )
    return out


def _reduce_column(
    method: Aggregation, values: list[Any], weights: list[float], *where: str
) -> Any:
    """One column of history values (host values) reduced with :func:`reduce_stacked`."""
    if method in ("last", "first"):
        return reduce_stacked(method, values)
    try:
        stacked = np.stack([np.asarray(v) for v in values])
        if stacked.dtype.kind not in "biufc":  # bool, int, unsigned, float, complex
            raise TypeError
    except (TypeError, ValueError):
        raise TypeError(_NOT_A_NUMBER.format(*where, method)) from None
    result = reduce_stacked(method, stacked, np.asarray(weights))
    return result.item() if np.ndim(result) == 0 and hasattr(result, "item") else result


def rename_logs(logs: Mapping[str, Mapping[str, Any]], suffix: str) -> Logs:
    """``logs`` with every entry renamed ``<entry>_<suffix>`` (``elapsed`` left out).

    Example:
        >>> import ciclo
        >>> rename_logs(ciclo.logs().add_metric("acc", 1.0), "test")
        {'metrics': {'acc_test': 1.0}}
    """
    out = Logs()
    for collection, entries in logs.items():
        if collection == "elapsed":
            continue
        for name, value in entries.items():
            out.add_entry(collection, f"{name}_{suffix}", value)
    return out


MICRO_BATCHES = Spec({"losses": "mean", "metrics": "mean"})


def merge_micro_logs(stacked: Logs, rows: int) -> Logs:
    """A batch's logs from its micro-batches' stacked logs (means; outputs back in batch order).

    Example:
        >>> import ciclo, jax.numpy as jnp
        >>> stacked = ciclo.logs().add_loss("l", jnp.array([1.0, 3.0]))
        >>> _ = stacked.add_output("y", jnp.array([[0, 2], [1, 3]]))
        >>> merged = merge_micro_logs(stacked, rows=2)
        >>> float(merged.losses.l), merged.outputs.y.tolist()
        (2.0, [0, 1, 2, 3])
    """
    merged = Logs()
    for collection, name, value in stacked.entries():
        if collection == "outputs" and value.ndim >= 2 and value.shape[1] == rows:
            value = jnp.moveaxis(value, 0, 1).reshape(-1, *value.shape[2:])
        else:
            value = reduce_stacked(MICRO_BATCHES.method(collection), value)
        merged.add_entry(collection, name, value)
    return merged


def reduce_across_devices(logs: Logs, axis_name: str) -> Logs:
    """A ``pmap`` step's logs reduced over ``axis_name``: outputs gathered, floats averaged.

    Example:
        >>> import ciclo, jax, jax.numpy as jnp
        >>> step = jax.pmap(
        ...     lambda x: reduce_across_devices(ciclo.logs().add_metric("m", x.sum()), "d"),
        ...     axis_name="d", devices=jax.local_devices()[:1],
        ... )
        >>> step(jnp.ones((1, 3))).metrics.m.tolist()
        [3.0]
    """

    def reduce(collection: str, value: Any) -> Any:
        value = jnp.asarray(value)
        if collection == "outputs" and value.ndim:
            return jax.lax.all_gather(value, axis_name, tiled=True)
        if jnp.issubdtype(value.dtype, jnp.inexact):
            return jax.lax.pmean(value, axis_name)  # type: ignore[no-untyped-call]
        return value

    return type(logs)(
        {
            collection: {name: reduce(collection, v) for name, v in entries.items()}
            for collection, entries in logs.items()
        }
    )
