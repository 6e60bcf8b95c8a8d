"""The adapter contract: what every framework adapter shares, written once.

An adapter (``ciclo-flax``, ``ciclo-haiku``, ``ciclo-equinox``, or a third party's) is:

- a subclass of :class:`AdapterState` that implements one hook, :meth:`AdapterState.apply`
  (run the model on a batch's inputs);
- a ``create_state(...)`` factory that builds the model's parameters and calls
  :meth:`AdapterState.create`;
- an :class:`Adapter` record registered under the ``ciclo.adapters`` entry-point group.

Everything else (the ``train_step``/``test_step``/``predict_step``/``reset_step`` methods,
RNG, strategies) lives here, on batches read by ``_batch.py`` and losses and metrics called
by ``_functions.py``.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar, TypedDict, TypeVar

import jax
import jax.numpy as jnp
import optax

from .._records._logs import Logs
from ..managed._fields import unknown_name_error
from ..managed._precision import LossScale, cast_floating, to_float32
from ..managed._state import ManagedState
from ..managed._step import step, train_step
from ..managed._strategies import Strategy
from ._batch import Batch, BatchFormat
from ._functions import (
    NamedFunctions,
    function_failed,
    is_stateful_metric,
    named_functions,
    reduce_values,
)
from ._libraries import LibraryFunction

__all__ = ["AdapterOptions", "AdapterState", "FunctionState", "STATIC", "as_key", "check_options"]

S = TypeVar("S", bound="AdapterState")

#: ``fn(preds, targets) -> scalar or per-example values``.
LossFn = Callable[[Any, Any], Any]


# --- static, hashable configuration --------------------------------------------------------


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


class AdapterOptions(TypedDict, total=False):
    """The options every adapter's ``create_state`` takes in ``**options`` and passes on to
    :meth:`AdapterState.create` and :meth:`ciclo.managed.ManagedState.create` (their Args say
    what each does), so they are typed and documented once for every framework.

    Example:
        >>> from typing import Unpack
        >>> import ciclo
        >>> def create_state(model, *, losses, **options: Unpack[ciclo.adapters.AdapterOptions]):
        ...     return options  # a type checker knows each option's type
        >>> create_state(None, losses=None, strategy="eager")
        {'strategy': 'eager'}
    """

    metrics: Mapping[str, Any] | None
    strategy: str | Strategy
    inputs_key: str | tuple[str, ...]
    targets_key: str
    sample_weight_key: str
    compute_dtype: Any
    loss_scale: float | str | LossScale | None
    ema: float | None
    trainable: Any


# The old names of its keys, for one release (see _deprecated.py).
BATCH_OPTIONS = ("inputs_key", "targets_key", "sample_weight_key")
STATE_OPTIONS = ("compute_dtype", "loss_scale", "ema", "trainable")


def check_options(
    options: Mapping[str, Any],
    factory: Callable[..., Any],
    known: Iterable[str] = tuple(AdapterOptions.__annotations__),
) -> None:
    """Rejects the ``**options`` of an adapter's ``create_state`` that it does not take,
    naming the close match (a typo of ``strategy`` does not silently run under ``jit``).

    Args:
        options: the keyword arguments ``factory`` received in ``**options``.
        factory: the ``create_state`` function; its named parameters are accepted names.
        known: the names ``**options`` may hold (by default :class:`AdapterOptions`'s).

    Example:
        >>> import ciclo
        >>> def create_state(model, **options):
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
_RECORDED_CLASH = (
    "{cls}: the model recorded {collection} {name!r} (self.sow), but the state's {own} "
    "already has {name!r}: rename one of them."
)
_NO_LOSSES = (
    "{cls}.{step} needs losses: create the state with losses={{'loss': fn(preds, targets)}}."
)


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

    Its ``train_step``, ``test_step`` (no gradients), ``predict_step`` (logs
    ``logs.outputs.predictions``) and ``reset_step`` (stateful metrics back to their
    start) work as ``logs, state = state.train_step(batch)`` and as loop callbacks.
    """

    model_state: Any = None
    metric_states: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    # Adapter states take declared fields only: an unknown keyword is always an error.
    keyword_extras: ClassVar[bool] = False
    losses: Mapping[str, LossFn] = dataclasses.field(default=NamedFunctions({}), metadata=STATIC)
    metrics: Mapping[str, Any] = dataclasses.field(default=NamedFunctions({}), metadata=STATIC)
    batch_format: BatchFormat = dataclasses.field(default=BatchFormat(), metadata=STATIC)

    # --- the hook ------------------------------------------------------------------------
    def apply(
        self, params: Any, model_state: Any, inputs: Any, *, training: bool, key: jax.Array | None
    ) -> tuple[Any, Any]:
        """Runs the model: the one method an adapter implements.

        Args:
            params: the trainable parameters (or values being differentiated).
            model_state: the mutable model state (``state.model_state``).
            inputs: the batch's inputs.
            training: ``True`` in ``train_step``, ``False`` otherwise.
            key: an RNG key for this step (``None`` if the state has no key).

        Returns:
            ``(predictions, new_model_state)``, optionally with a third item: logs the model
            recorded itself (``{"losses": {...}, ...}``), whose losses add to the objective.
        """
        signature = "apply(self, params, model_state, inputs, *, training, key)"
        raise NotImplementedError(f"{type(self).__name__} must implement {signature}.")

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
                values; their sum is the objective. A loss may also take ``params`` or
                ``state`` by name: ``fn(preds, targets, params)``.
            metrics: ``{name: fn(preds, targets)}`` like losses, or
                :class:`StatefulMetric` objects for metrics that are not means.
            model_state: the model's mutable state (``None`` if it has none).
            key: an RNG key or int seed for dropout and other randomness (``None``: seed 0).
            strategy: ``"jit"`` (default), ``"eager"``, ``"data-parallel"``... or a Strategy.
            inputs_key, targets_key, sample_weight_key: the keys of mapping batches.
            **fields: the subclass's own fields (the model, its static parts...); any other
                name is an error naming the close match.
        """
        losses = named_functions(losses, "losses", stateful=False)
        metrics = named_functions(metrics, "metrics", stateful=True)
        for name in losses:
            if name in metrics:
                raise ValueError(f"{name!r} is both a loss and a metric: rename one.")
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
        return applied if dtype is None else (to_float32(applied[0]), *applied[1:])

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
