"""The adapter contract: what every framework adapter shares, written once.

An adapter (``ciclo-flax``, ``ciclo-haiku``, ``ciclo-equinox``, or a third party's) is:

- a subclass of :class:`AdapterState` that implements one hook, :meth:`AdapterState.apply`
  (run the model on a batch's inputs);
- a ``create_state(...)`` factory that builds the model's parameters and calls
  :meth:`AdapterState.create`;
- an :class:`Adapter` record registered under the ``ciclo.adapters`` entry-point group.

Everything else (batch unpacking, losses, metrics, sample weights, RNG, strategies, the
``train_step``/``test_step``/``predict_step``/``reset_step`` methods) lives here.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, ClassVar, NamedTuple, TypeVar

import jax
import jax.numpy as jnp
import optax

from .._records._logs import Logs
from ..managed._fields import unknown_name_error
from ..managed._precision import cast_floating, to_float32
from ..managed._state import ManagedState
from ..managed._step import step, train_step
from ..managed._strategies import Strategy
from ._libraries import LibraryFunction, from_libraries
from ._training import requested_extras

__all__ = [
    "AdapterState",
    "Batch",
    "BatchFormat",
    "FunctionState",
    "STATE_OPTIONS",
    "StatefulMetric",
    "as_key",
    "check_options",
    "is_stateful_metric",
    "mean_metric",
    "reduce_values",
]

S = TypeVar("S", bound="AdapterState")

#: ``fn(preds, targets) -> scalar or per-example values``.
LossFn = Callable[[Any, Any], Any]


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


# --- batches -------------------------------------------------------------------------------


class Batch(NamedTuple):
    """A batch unpacked by :meth:`BatchFormat.unpack`."""

    inputs: Any
    targets: Any = None
    sample_weight: Any = None


@dataclasses.dataclass(frozen=True)
class BatchFormat:
    """How batches are read: tuples ``(inputs, targets)`` / ``(inputs, targets,
    sample_weight)``, or mappings with these keys.

    Attributes:
        inputs_key: the mapping key of the model inputs; a tuple of keys passes a dict of
            those entries to the model.
        targets_key: the mapping key of the targets.
        sample_weight_key: the mapping key of the per-example weights (optional in a batch).
    """

    inputs_key: str | tuple[str, ...] = "inputs"
    targets_key: str = "targets"
    sample_weight_key: str = "sample_weight"

    def unpack(self, batch: Any, *, step: str, targets: bool = True) -> Batch:
        """Splits ``batch`` into :class:`Batch` ``(inputs, targets, sample_weight)``.

        Args:
            batch: the batch given to a step.
            step: the step's name, for error messages.
            targets: whether the step needs targets. Without (``predict_step``), a batch
                that is neither a tuple nor a mapping is the inputs itself, and targets in
                a tuple or mapping are ignored.
        """
        if isinstance(batch, Mapping):
            return self._unpack_mapping(batch, step=step, targets=targets)
        if isinstance(batch, tuple | list):
            if not targets and len(batch) in (1, 2, 3):
                return Batch(batch[0])
            if len(batch) == 2:
                return Batch(batch[0], batch[1])
            if len(batch) == 3:
                return Batch(batch[0], batch[1], batch[2])
            kind = type(batch).__name__
            raise ValueError(_BAD_TUPLE.format(step=step, kind=kind, items=len(batch)))
        if not targets:
            return Batch(batch)
        kind = type(batch).__name__
        raise TypeError(_NO_INPUTS.format(step=step, kind=kind, keys=self._keys_text()))

    def _unpack_mapping(self, batch: Mapping[str, Any], *, step: str, targets: bool) -> Batch:
        input_keys = (self.inputs_key,) if isinstance(self.inputs_key, str) else self.inputs_key
        wanted = [*input_keys, self.targets_key] if targets else list(input_keys)
        missing = [key for key in wanted if key not in batch]
        if missing:
            raise KeyError(
                _MISSING_KEYS.format(
                    step=step, keys=sorted(batch), missing=missing, now=self._keys_text()
                )
            )
        if isinstance(self.inputs_key, str):
            inputs = batch[self.inputs_key]
        else:
            inputs = {key: batch[key] for key in self.inputs_key}
        if not targets:
            return Batch(inputs)
        return Batch(inputs, batch[self.targets_key], batch.get(self.sample_weight_key))

    def _keys_text(self) -> str:
        return (
            f"inputs_key={self.inputs_key!r}, targets_key={self.targets_key!r}, "
            f"sample_weight_key={self.sample_weight_key!r}"
        )


# --- reductions ----------------------------------------------------------------------------


def _per_example(values: jax.Array, kind: str, name: str) -> jax.Array:
    if values.ndim == 0:
        raise ValueError(_SCALAR_WITH_WEIGHTS.format(kind=kind, name=name))
    dtype = jnp.promote_types(values.dtype, jnp.float32)
    if not jnp.issubdtype(values.dtype, jnp.floating):
        dtype = jnp.dtype(jnp.float32)
    if values.dtype != dtype:
        values = values.astype(dtype)
    if values.ndim == 1:
        return values
    return values.reshape(values.shape[0], -1).mean(axis=1)


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


# --- static, hashable configuration --------------------------------------------------------


class _NamedFunctions(Mapping[str, Any]):
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

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(tuple(self._items.items()))

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if isinstance(other, _NamedFunctions):
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


def _named_functions(value: Any, what: str, *, stateful: bool) -> _NamedFunctions:
    example = _EXAMPLES[what]
    if value is None:
        return _NamedFunctions({})
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
    return _NamedFunctions(value)


def as_key(key: jax.Array | int | None) -> jax.Array:
    """An RNG key from a key, an int seed, or ``None`` (seed 0).

    Example:
        >>> import ciclo, jax
        >>> bool((jax.random.key_data(ciclo.adapters.as_key(None))
        ...       == jax.random.key_data(jax.random.key(0))).all())
        True
    """
    if key is None:
        return jax.random.key(0)
    if isinstance(key, int):
        return jax.random.key(key)
    return key


#: Field metadata marking a static (non-array, hashable) field of a state.
STATIC = {"static": True}

#: The options of every adapter's ``create_state`` that are passed on as ``**options``.
BATCH_OPTIONS = ("inputs_key", "targets_key", "sample_weight_key")

#: The options of :meth:`ciclo.managed.ManagedState.create` every adapter's
#: ``create_state`` passes on as ``**options``: mixed precision, averaged weights, trainable=.
STATE_OPTIONS = ("compute_dtype", "loss_scale", "ema", "trainable")


def check_options(
    options: Mapping[str, Any],
    factory: Callable[..., Any],
    known: Iterable[str] = BATCH_OPTIONS + STATE_OPTIONS,
) -> None:
    """Rejects the ``**options`` of an adapter's ``create_state`` that it does not take,
    naming the close match (a typo of ``strategy`` does not silently run under ``jit``).

    Args:
        options: the keyword arguments ``factory`` received in ``**options``.
        factory: the ``create_state`` function; its named parameters are accepted names.
        known: the names ``**options`` may hold (by default :data:`BATCH_OPTIONS` and
            :data:`STATE_OPTIONS`).

    Example:
        >>> import ciclo
        >>> def create_state(model, *, strategy="jit", **options):
        ...     ciclo.adapters.check_options(options, create_state)
        >>> create_state(None, stratgey="eager")
        Traceback (most recent call last):
        ...
        TypeError: create_state() got an unknown keyword 'stratgey'; did you mean 'strategy'? ...
    """
    allowed = set(known)
    unknown = [name for name in options if name not in allowed]
    if not unknown:
        return
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        parameters = []  # type: ignore[assignment]
    allowed |= {p.name for p in parameters if p.kind is not p.VAR_KEYWORD}
    # Named as users call it: ciclo_haiku.create_state().
    package = (getattr(factory, "__module__", None) or "").split(".")[0]
    name = getattr(factory, "__name__", "create_state")
    where = f"{package}.{name}()" if package.startswith("ciclo_") else f"{name}()"
    raise unknown_name_error(where, "keyword", unknown[0], sorted(allowed), extra_hint=False)


# --- messages -----------------------------------------------------------------------------
_BAD_TUPLE = (
    "{step}: a batch tuple must be (inputs, targets) or (inputs, targets, sample_weight), got "
    "a {kind} of {items} items. To give the model several inputs, nest them: ((x1, x2), "
    "targets)."
)
_NO_INPUTS = (
    "{step}: cannot find inputs and targets in a batch of type {kind}. Give (inputs, "
    "targets), (inputs, targets, sample_weight), or a dict with keys {keys} (choose the keys "
    "with create_state(..., inputs_key=..., targets_key=...))."
)
_MISSING_KEYS = (
    "{step}: the batch has keys {keys} but not {missing}. Name the keys when creating the "
    "state: create_state(..., inputs_key=..., targets_key=...) (now {now})."
)
_SCALAR_WITH_WEIGHTS = (
    "{kind} {name!r} returned a scalar, so the batch's sample weights cannot be applied to "
    "it. Return one value per example (shape (batch,)), e.g. "
    "optax.softmax_cross_entropy_with_integer_labels(logits, labels) without .mean()."
)
_WEIGHTS_SHAPE = (
    "{kind} {name!r}: sample_weight has shape {shape}, but the {kind} has {n} per-example "
    "values; give one weight per example, shape ({n},)."
)
_RECORDED_CLASH = (
    "{cls}: the model recorded {collection} {name!r} (e.g. with self.sow), but the state's "
    "{own} already has {name!r}, whose value it would replace. Rename the recorded value or "
    "the state's {own} entry."
)
_NO_LOSSES = (
    "{cls}.{step} needs losses to differentiate; create the state with "
    "losses={{'loss': fn(preds, targets)}}, e.g. "
    "losses={{'loss': optax.softmax_cross_entropy_with_integer_labels}}."
)


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


# --- the state -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class AdapterState(ManagedState):
    """The base of every adapter's state: a :class:`~ciclo.managed.ManagedState` whose
    ``train_step``, ``test_step``, ``predict_step`` and ``reset_step`` are written once here.

    An adapter subclasses it (as a ``@dataclasses.dataclass(frozen=True, kw_only=True)``,
    static fields marked ``metadata={"static": True}``) and implements :meth:`apply`.

    Fields (beyond ``step``, ``params``, ``opt_state``, ``key``, ``tx``, ``strategy``):
        model_state: the model's mutable, non-trainable state (batch-norm statistics...),
            updated by ``train_step`` and frozen in ``test_step``/``predict_step``.
        metric_states: the states of stateful metrics, by name.
        losses, metrics: ``{name: fn(preds, targets)}`` (static).
        batch_format: how batches are unpacked (static).

    Steps (each works as ``logs, state = state.train_step(batch)`` and as a loop callback):
        train_step: losses (reduced with sample weights) summed into the objective,
            optimizer applied, ``model_state`` updated; logs losses, metrics and stateful
            metrics.
        test_step: the same logs without gradients; ``model_state`` frozen.
        predict_step: logs the model's predictions as ``logs.outputs.predictions``.
        reset_step: puts stateful metrics back to their initial state.
    """

    model_state: Any = None
    metric_states: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    # Adapter states take declared fields only: an unknown keyword is always an error.
    keyword_extras: ClassVar[bool] = False
    losses: Mapping[str, LossFn] = dataclasses.field(default=_NamedFunctions({}), metadata=STATIC)
    metrics: Mapping[str, Any] = dataclasses.field(default=_NamedFunctions({}), metadata=STATIC)
    batch_format: BatchFormat = dataclasses.field(default=BatchFormat(), metadata=STATIC)

    # --- the hook ------------------------------------------------------------------------
    def apply(
        self, params: Any, model_state: Any, inputs: Any, *, training: bool, key: jax.Array | None
    ) -> tuple[Any, Any]:
        """Runs the model: the one method an adapter implements.

        Args:
            params: the trainable parameters (``state.params``, or values being
                differentiated).
            model_state: the mutable model state (``state.model_state``).
            inputs: the batch's inputs.
            training: ``True`` in ``train_step`` (dropout on, batch statistics used and
                updated), ``False`` otherwise.
            key: an RNG key for this step (``None`` if the state has no key).

        Returns:
            ``(predictions, new_model_state)``; in evaluation the new model state is
            ignored. It may add a third item, logs the model recorded itself
            (``{"losses": {...}, "metrics": {...}}``, e.g. what a Flax module sows): they
            are logged, and its losses add to the total loss that a train step
            differentiates.
        """
        raise NotImplementedError(
            f"{type(self).__name__} must implement apply(self, params, model_state, inputs, *, "
            f"training, key) -> (predictions, new_model_state)."
        )

    # --- building ------------------------------------------------------------------------
    @classmethod
    def create(  # type: ignore[override]
        cls: type[S],
        *,
        params: Any,
        tx: optax.GradientTransformation | None,
        losses: Mapping[str, LossFn] | None,
        metrics: Mapping[str, Any] | None = None,
        model_state: Any = None,
        key: jax.Array | int | None = None,
        strategy: str | Strategy = "jit",
        inputs_key: str | tuple[str, ...] = "inputs",
        targets_key: str = "targets",
        sample_weight_key: str = "sample_weight",
        **fields: Any,
    ) -> S:
        """Builds an adapter state (adapters' ``create_state`` factories end here).

        Args:
            params: the trainable parameters.
            tx: an optax optimizer (``None`` for a state only evaluated or used to predict).
            losses: ``{name: fn(preds, targets)}``, each returning a scalar or per-example
                values (optax losses work as they are); their sum is the objective. A loss
                may ask for ``params`` (the trainable parameters, differentiated: weight
                decay) or ``state`` (the whole state) by parameter name:
                ``fn(preds, targets, params)``.
            metrics: ``{name: fn(preds, targets)}`` like losses (``params`` and ``state``
                too), or
                :class:`StatefulMetric` objects for metrics that are not means.
            model_state: the model's mutable state (``None`` if it has none).
            key: an RNG key or int seed for dropout and other randomness (``None``: seed 0).
            strategy: ``"jit"`` (default), ``"eager"``, ``"data-parallel"``... or a Strategy.
            inputs_key, targets_key, sample_weight_key: the keys of mapping batches.
            **fields: the subclass's own fields (the model, its static parts...); any other
                name is an error naming the close match.
        """
        losses = _named_functions(losses, "losses", stateful=False)
        metrics = _named_functions(metrics, "metrics", stateful=True)
        for name in losses:
            if name in metrics:
                raise ValueError(
                    f"{name!r} is both a loss and a metric; give them different names (a "
                    f"loss is logged anyway)."
                )
        metric_states = {name: m.init() for name, m in metrics.items() if is_stateful_metric(m)}
        return super().create(
            params=params,
            tx=tx,
            strategy=strategy,
            key=as_key(key),
            model_state=model_state,
            metric_states=metric_states,
            losses=losses,
            metrics=metrics,
            batch_format=BatchFormat(inputs_key, targets_key, sample_weight_key),
            **fields,
        )

    # --- shared step logic ---------------------------------------------------------------
    def _step_key(self) -> jax.Array | None:
        return None if self.key is None else self.step_key()

    def compute_inputs(self, batch: Any) -> Any:
        """The batch as it is: an adapter state casts only the model's inputs to the
        ``compute_dtype`` (see :meth:`_predictions`), so targets keep their precision."""
        return batch

    def _predictions(self, inputs: Any, *, training: bool) -> tuple[Any, ...]:
        """:meth:`apply` on ``inputs`` under the state's ``compute_dtype`` (the managed
        step has already cast ``params``): the floating-point inputs cast to it, the
        predictions widened to float32 (losses and metrics are computed in float32, as in
        jmp's ``output_dtype``)."""
        dtype = self.compute_dtype
        applied = self.apply(
            self.params,
            self.model_state,
            cast_floating(inputs, dtype),
            training=training,
            key=self._step_key(),
        )
        if dtype is None:
            return applied
        return (to_float32(applied[0]), *applied[1:])

    def _evaluate(self: S, batch: Batch, *, training: bool, step: str) -> tuple[Logs, S]:
        applied = self._predictions(batch.inputs, training=training)
        preds, model_state = applied[0], applied[1]
        logs = Logs()
        w, targets = batch.sample_weight, batch.targets
        where = f"{type(self).__name__}.{step}"
        for name, fn in self.losses.items():
            try:
                if isinstance(fn, LibraryFunction):
                    value = fn(preds, targets, sample_weight=w)
                else:
                    value = self._call_loss(self.losses, name, fn, preds, targets)
            except Exception as error:
                raise function_failed(error, where, "loss", name, fn, preds, targets) from error
            logs.add_loss(name, self._reduce(self.losses, name, value, w, "loss"))
        metric_states = dict(self.metric_states)
        for name, metric in self.metrics.items():
            try:
                if is_stateful_metric(metric):
                    metric_states[name] = metric.update(metric_states[name], preds, targets, w)
                    logs.add_stateful_metric(name, metric.compute(metric_states[name]))
                    continue
                if isinstance(metric, LibraryFunction):
                    value = metric(preds, targets, sample_weight=w, losses=logs.get("losses"))
                else:
                    value = self._call_loss(self.metrics, name, metric, preds, targets)
            except Exception as error:
                failed = function_failed(error, where, "metric", name, metric, preds, targets)
                raise failed from error
            logs.add_metric(name, self._reduce(self.metrics, name, value, w, "metric"))
        if len(applied) > 2 and applied[2]:  # logs the model recorded (sown losses)
            logs.merge(self._recorded(applied[2], logs))
        changes: dict[str, Any] = {"metric_states": metric_states}
        if training:
            changes["model_state"] = model_state
        return logs, self.replace(**changes)

    def _recorded(self, recorded: Mapping[str, Any], logs: Logs) -> Mapping[str, Any]:
        """The logs the model recorded, checked: none may take the name of one of the
        state's own losses or metrics, whose value it would replace."""
        own = {name: collection for collection, name, _ in logs.entries()}
        for collection, entries in recorded.items():
            for name in entries:
                if name in own:
                    raise ValueError(
                        _RECORDED_CLASH.format(
                            cls=type(self).__name__,
                            collection=collection,
                            name=name,
                            own=own[name],
                        )
                    )
        return recorded

    def _call_loss(
        self, functions: Mapping[str, Any], name: str, fn: Any, preds: Any, targets: Any
    ) -> Any:
        """``fn(preds, targets)``, with ``params=`` / ``state=`` when ``fn`` asks for them
        (in ``train_step`` ``params`` are the differentiated ones: gradients flow)."""
        extras = getattr(functions, "extras", {}).get(name, ())
        if not extras:
            return fn(preds, targets)
        given = {"params": self.params, "state": self}
        return fn(preds, targets, **{extra: given[extra] for extra in extras})

    @staticmethod
    def _reduce(functions: Mapping[str, Any], name: str, value: Any, w: Any, kind: str) -> Any:
        # A term on params or the state (weight decay) is one value for the batch: sample
        # weights do not apply to it.
        if w is not None and getattr(functions, "extras", {}).get(name) and jnp.ndim(value) == 0:
            w = None
        return reduce_values(value, w, kind=kind, name=name)

    def _require_losses(self, step_name: str) -> None:
        if not self.losses:
            raise ValueError(_NO_LOSSES.format(cls=type(self).__name__, step=step_name))

    @train_step
    def train_step(self: S, batch: Any) -> tuple[Logs, S]:
        """One optimization step on ``batch``; returns ``(logs, new_state)``."""
        self._require_losses("train_step")
        unpacked = self.batch_format.unpack(batch, step=f"{type(self).__name__}.train_step")
        return self._evaluate(unpacked, training=True, step="train_step")

    @step
    def test_step(self: S, batch: Any) -> tuple[Logs, S]:
        """Losses and metrics on ``batch`` in evaluation mode; returns ``(logs, state)``
        (only stateful metrics change)."""
        unpacked = self.batch_format.unpack(batch, step=f"{type(self).__name__}.test_step")
        return self._evaluate(unpacked, training=False, step="test_step")

    @step
    def predict_step(self: S, batch: Any) -> tuple[Logs, S]:
        """The model's predictions on ``batch`` (inputs alone, or a training batch whose
        targets are ignored) as ``logs.outputs.predictions``; the state is unchanged."""
        unpacked = self.batch_format.unpack(
            batch, step=f"{type(self).__name__}.predict_step", targets=False
        )
        preds = self._predictions(unpacked.inputs, training=False)[0]
        return Logs().add_output("predictions", preds), self

    @step
    def reset_step(self: S, batch: Any = None) -> tuple[Logs, S]:
        """Puts every stateful metric back to its ``init()`` state."""
        metric_states = {name: self.metrics[name].init() for name in self.metric_states}
        return Logs(), self.replace(metric_states=metric_states)


@dataclasses.dataclass(frozen=True, kw_only=True)
class FunctionState(AdapterState):
    """The reference adapter: a model that is a plain function
    ``apply_fn(params, model_state, inputs, *, training, key) -> (preds, new_model_state)``.

    Example:
        >>> import ciclo, jax.numpy as jnp, optax
        >>> def apply_fn(params, model_state, x, *, training, key):
        ...     return x @ params["w"], model_state
        >>> state = ciclo.adapters.FunctionState.create(
        ...     apply_fn=apply_fn, params={"w": jnp.zeros((3, 2))}, tx=optax.sgd(0.1),
        ...     losses={"loss": optax.softmax_cross_entropy_with_integer_labels},
        ... )
        >>> logs, state = state.train_step((jnp.ones((4, 3)), jnp.zeros(4, jnp.int32)))
        >>> int(state.step)
        1
    """

    apply_fn: Callable[..., tuple[Any, Any]] = dataclasses.field(
        default=None,  # type: ignore[assignment]  # always given to create()
        metadata=STATIC,
    )

    def apply(
        self, params: Any, model_state: Any, inputs: Any, *, training: bool, key: jax.Array | None
    ) -> tuple[Any, Any]:
        return self.apply_fn(params, model_state, inputs, training=training, key=key)
