"""Losses and metrics: how they are called, reduced over a batch (sample weights) and
reported when they fail, and :class:`StatefulMetric`, the protocol of a metric that is not
a per-batch mean."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from ._libraries import from_libraries
from ._training import requested_extras

__all__ = [
    "NamedFunctions",
    "StatefulMetric",
    "function_failed",
    "is_stateful_metric",
    "mean_metric",
    "named_functions",
    "reduce_values",
]

_SCALAR_WITH_WEIGHTS = (
    "{kind} {name!r} returned a scalar, so the batch's sample weights cannot apply: return "
    "one value per example (no .mean())."
)
_WEIGHTS_SHAPE = (
    "{kind} {name!r}: sample_weight has shape {shape}, but the {kind} has {n} per-example "
    "values; give one weight per example, shape ({n},)."
)


class StatefulMetric(NamedTuple):
    """A metric that is not a per-batch mean: four pure functions, like an optax transform.

    The metric's state is a pytree of arrays kept in ``state.metric_states[name]``; train and
    test steps update it, ``reset_step`` puts it back to ``init()``, and every step logs
    ``compute(metric_state)`` under ``logs.stateful_metrics[name]`` (the value so far).

    Attributes:
        init: ``() -> metric_state``, the empty state.
        update: ``(metric_state, preds, targets, sample_weight) -> metric_state``, adds a
            batch (``sample_weight`` is ``None`` or one weight per example).
        merge: ``(metric_state, metric_state) -> metric_state``, combines the states of two
            disjoint sets of batches (other devices, hosts or evaluation shards).
        compute: ``metric_state -> value``, the metric of everything seen.

    Example:
        >>> import ciclo, jax.numpy as jnp
        >>> largest_error = ciclo.adapters.StatefulMetric(
        ...     init=lambda: jnp.zeros(()),
        ...     update=lambda m, preds, targets, w: jnp.maximum(m, jnp.abs(preds - targets).max()),
        ...     merge=jnp.maximum,
        ...     compute=lambda m: m,
        ... )
        >>> m = largest_error.init()
        >>> m = largest_error.update(m, jnp.array([1.0, 4.0]), jnp.zeros(2), None)
        >>> float(largest_error.compute(m))
        4.0
    """

    init: Callable[[], Any]
    update: Callable[[Any, Any, Any, Any], Any]
    merge: Callable[[Any, Any], Any]
    compute: Callable[[Any], Any]


def is_stateful_metric(metric: Any) -> bool:
    """Whether ``metric`` follows the :class:`StatefulMetric` protocol (has callable
    ``init``, ``update``, ``merge`` and ``compute``)."""
    return all(callable(getattr(metric, name, None)) for name in StatefulMetric._fields)


def mean_metric(fn: Callable[[Any, Any], Any]) -> StatefulMetric:
    """A :class:`StatefulMetric` that is the exact sample-weighted mean of ``fn(preds, targets)``
    (per-example values) over every batch seen, however the batches are sized or weighted.

    Plain metric functions are logged per batch and averaged by the test loop weighted by
    batch size; use this when batches carry sample weights and you want the exact weighted
    mean of the whole evaluation.

    Example:
        >>> import ciclo, jax.numpy as jnp
        >>> accuracy = ciclo.adapters.mean_metric(lambda p, t: p.argmax(-1) == t)
        >>> m = accuracy.update(accuracy.init(), jnp.eye(2), jnp.array([0, 0]), None)
        >>> float(accuracy.compute(m))
        0.5
    """

    def init() -> tuple[jax.Array, jax.Array]:
        return jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32)

    def update(
        metric_state: tuple[jax.Array, jax.Array], preds: Any, targets: Any, sample_weight: Any
    ) -> tuple[jax.Array, jax.Array]:
        values = _per_example(jnp.asarray(fn(preds, targets)), "metric", _name(fn))
        weights = (
            jnp.ones_like(values)
            if sample_weight is None
            else _checked_weights(sample_weight, values, "metric", _name(fn))
        )
        total, count = metric_state
        return total + jnp.sum(values * weights), count + jnp.sum(weights)

    def merge(
        a: tuple[jax.Array, jax.Array], b: tuple[jax.Array, jax.Array]
    ) -> tuple[jax.Array, jax.Array]:
        return a[0] + b[0], a[1] + b[1]

    def compute(metric_state: tuple[jax.Array, jax.Array]) -> jax.Array:
        total, count = metric_state
        return jnp.where(count > 0, total / jnp.where(count > 0, count, 1.0), 0.0)

    return StatefulMetric(init, update, merge, compute)


def _name(fn: Any) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__


def _per_example(values: jax.Array, kind: str, name: str) -> jax.Array:
    if values.ndim == 0:
        raise ValueError(_SCALAR_WITH_WEIGHTS.format(kind=kind, name=name))
    dtype = jnp.promote_types(values.dtype, jnp.float32)
    if not jnp.issubdtype(values.dtype, jnp.floating):
        dtype = jnp.dtype(jnp.float32)
    if values.dtype != dtype:
        values = values.astype(dtype)
    return values if values.ndim == 1 else values.reshape(values.shape[0], -1).mean(axis=1)


def _checked_weights(sample_weight: Any, values: jax.Array, kind: str, name: str) -> jax.Array:
    weights = jnp.asarray(sample_weight)
    if weights.shape != values.shape:
        raise ValueError(
            _WEIGHTS_SHAPE.format(kind=kind, name=name, shape=weights.shape, n=values.shape[0])
        )
    return weights.astype(values.dtype)


def reduce_values(values: Any, sample_weight: Any = None, *, kind: str, name: str) -> jax.Array:
    """Reduces a loss's or metric's output to a scalar.

    A scalar is returned as is (it cannot take sample weights: that is an error). Per-example
    values (leading axis = batch; trailing axes are averaged first) give their mean, or
    with ``sample_weight`` their weighted mean ``sum(w * v) / sum(w)`` (``0`` when all
    weights are zero).

    Example:
        >>> import ciclo, jax.numpy as jnp
        >>> v = jnp.array([1.0, 3.0])
        >>> float(ciclo.adapters.reduce_values(v, jnp.array([1.0, 0.0]), kind="loss", name="l"))
        1.0
    """
    values = jnp.asarray(values)
    if values.ndim == 0 and sample_weight is None:
        scalar: jax.Array = values.astype(jnp.promote_types(values.dtype, jnp.float32))
        return scalar
    per_example = _per_example(values, kind, name)
    if sample_weight is None:
        return per_example.mean()
    weights = _checked_weights(sample_weight, per_example, kind, name)
    total = jnp.sum(weights)
    safe_total = jnp.where(total > 0, total, jnp.ones_like(total))
    mean: jax.Array = jnp.where(total > 0, jnp.sum(weights * per_example) / safe_total, 0.0)
    return mean


class NamedFunctions(Mapping[str, Any]):
    """An immutable, hashable ``{name: function}`` (a static field of a state: hashed with
    the state's other static fields, once, in its ``Static`` node data), with the extra
    arguments each function asks for by name (``params``, ``state``), read once."""

    __slots__ = ("_items", "extras")

    def __init__(self, items: Mapping[str, Any]) -> None:
        self._items = dict(items)
        self.extras = {
            name: () if is_stateful_metric(fn) else requested_extras(fn)
            for name, fn in self._items.items()
        }

    def __getitem__(self, name: str) -> Any:
        return self._items[name]

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __hash__(self) -> int:
        return hash(tuple(self._items.items()))

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if isinstance(other, NamedFunctions):
            return self._items == other._items
        return NotImplemented

    def __repr__(self) -> str:
        return repr(self._items)


_EXAMPLES = {
    "losses": "losses={'loss': optax.softmax_cross_entropy_with_integer_labels}",
    "metrics": "metrics={'accuracy': lambda logits, labels: logits.argmax(-1) == labels}",
}
_FUNCTION_KINDS = {
    False: "fn(preds, targets)",
    True: "fn(preds, targets) or a ciclo.adapters.StatefulMetric",
}


def named_functions(value: Any, what: str, *, stateful: bool) -> NamedFunctions:
    """``value`` (``None`` or ``{name: fn(preds, targets)}``, the ``losses`` or ``metrics``
    of a state) checked, as a :class:`NamedFunctions`."""
    example = _EXAMPLES[what]
    if value is None:
        return NamedFunctions({})
    if not isinstance(value, Mapping):
        raise TypeError(
            f"{what} must be a dict {{name: fn(preds, targets)}}, got "
            f"{type(value).__name__}. Example: {example}."
        )
    value = from_libraries(value)  # jax_metrics, clu.metrics, nnx.metrics objects
    for name, fn in value.items():
        if not isinstance(name, str):
            raise TypeError(f"{what}: names must be strings, got {name!r}. Example: {example}.")
        if stateful and is_stateful_metric(fn):
            continue
        if not callable(fn):
            kinds = _FUNCTION_KINDS[stateful]
            raise TypeError(f"{what}[{name!r}] must be {kinds}, got {fn!r}. Example: {example}.")
    return NamedFunctions(value)


# --- a loss or metric that fails ----------------------------------------------------------
MSG_FUNCTION_FAILED = (
    "{step}: {kind} {name!r} ({function}) failed on preds {preds} and targets {targets}: "
    "{error}\n{convention}{hint}"
)
_CONVENTIONS = {
    "function": (
        "Losses and metrics are called as fn(preds, targets), predictions first, and may "
        "also take, by name, params (the trainable parameters) and state (the whole state): "
        "fn(preds, targets, params)."
    ),
    "stateful": (
        "A StatefulMetric's update is called as update(metric_state, preds, targets, "
        "sample_weight), sample_weight None or one weight per example."
    ),
}
_INTEGER_LABELS_HINT = (
    " The targets are integer labels {targets} and the preds have one more axis {preds}: "
    "use a {kind} for integer labels (optax.softmax_cross_entropy_with_integer_labels), or "
    "give one-hot targets (jax.nn.one_hot(labels, {classes}))."
)
_ONE_HOT_HINT = (
    " The targets have the preds' shape {preds}: if they are one-hot, use a {kind} for "
    "one-hot targets (optax.softmax_cross_entropy), or give integer labels (targets.argmax(-1))."
)


def _shapes(tree: Any) -> str:
    """``float32[8, 3]``, or a pytree of them, for error messages."""

    def one(leaf: Any) -> str:
        shape, dtype = getattr(leaf, "shape", None), getattr(leaf, "dtype", None)
        if shape is None or dtype is None:
            return type(leaf).__name__
        return f"{dtype}[{', '.join(str(d) for d in shape)}]"

    leaves = jax.tree.leaves(tree)
    if len(leaves) == 1 and not isinstance(tree, Mapping | tuple | list):
        return one(tree)
    return str(jax.tree.map(one, tree))


def _hint(kind: str, preds: Any, targets: Any) -> str:
    """A likely cause: integer labels given to a loss for one-hot targets, or the reverse."""
    p_shape, t_shape = getattr(preds, "shape", None), getattr(targets, "shape", None)
    t_dtype = getattr(targets, "dtype", None)
    if p_shape is None or t_shape is None or t_dtype is None:
        return ""
    if jnp.issubdtype(t_dtype, jnp.integer) and tuple(p_shape[:-1]) == tuple(t_shape):
        return _INTEGER_LABELS_HINT.format(
            targets=_shapes(targets), preds=_shapes(preds), kind=kind, classes=p_shape[-1]
        )
    if tuple(p_shape) == tuple(t_shape) and len(p_shape) > 1:
        return _ONE_HOT_HINT.format(preds=_shapes(preds), kind=kind)
    return ""


def function_failed(
    error: Exception, step: str, kind: str, name: str, fn: Any, preds: Any, targets: Any
) -> Exception:
    """The error to raise when the loss or metric ``name`` failed with ``error``: it names
    the function, how losses and metrics are called, and the shapes they got (a
    ``TypeError`` stays one; anything else becomes a ``ValueError``)."""
    message = MSG_FUNCTION_FAILED.format(
        step=step,
        kind=kind,
        name=name,
        function=getattr(fn, "__qualname__", None) or type(fn).__name__,
        preds=_shapes(preds),
        targets=_shapes(targets),
        error=f"{type(error).__name__}: {error}",
        convention=_CONVENTIONS["stateful" if is_stateful_metric(fn) else "function"],
        # a call with the wrong arguments is not about shapes
        hint="" if "argument" in str(error) else _hint(kind, preds, targets),
    )
    return (TypeError if isinstance(error, TypeError) else ValueError)(message)
