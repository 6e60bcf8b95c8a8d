"""Haiku: ``create_state(model, inputs, tx, ...)`` and :class:`HaikuState`."""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any, Unpack

import haiku as hk
import jax
import optax

import ciclo
from ciclo.adapters import (
    AUTO,
    STATIC,
    AdapterState,
    check_options,
    detect_training_arg,
    training_kwargs,
)

__all__ = ["AUTO", "HaikuState", "create_state"]

#: The training flag of Haiku models (``training_arg="auto"`` looks for it).
_FLAGS = ("is_training",)

#: What ``create_state`` accepts as a model.
Model = Callable[..., Any] | hk.Transformed | hk.TransformedWithState


@dataclasses.dataclass(frozen=True, kw_only=True)
class HaikuState(AdapterState):
    """The state of a Haiku model: ``params`` are its parameters and ``model_state`` its
    Haiku state (``hk.get_state``/``hk.set_state``: batch-norm statistics...), updated in
    training and frozen in evaluation. Build it with :func:`ciclo_haiku.create_state`.

    Attributes:
        transformed: the ``hk.Transformed`` or ``hk.TransformedWithState`` (static).
        training_arg: the keyword argument set to ``True`` in training and ``False`` otherwise
            (``"is_training"``), or ``None`` (static).
        with_state: whether ``transformed.apply`` takes and returns Haiku state (static).
        apply_rng: whether ``transformed.apply`` takes an RNG key, i.e. it was not wrapped
            in ``hk.without_apply_rng`` (static).
    """

    transformed: hk.Transformed | hk.TransformedWithState = dataclasses.field(
        default=None,  # type: ignore[assignment]  # always given by create_state
        metadata=STATIC,
    )
    training_arg: str | None = dataclasses.field(default=None, metadata=STATIC)
    with_state: bool = dataclasses.field(default=True, metadata=STATIC)
    apply_rng: bool = dataclasses.field(default=True, metadata=STATIC)

    def apply(
        self, params: Any, model_state: Any, inputs: Any, *, training: bool, key: jax.Array | None
    ) -> tuple[Any, Any]:
        leading = (params, model_state) if self.with_state else (params,)
        if self.apply_rng:
            leading += (key,)
        try:
            out = self.transformed.apply(
                *leading, inputs, **training_kwargs(self.training_arg, training)
            )
        except ValueError as error:
            if "does not match shape" not in str(error):
                raise
            shapes = jax.tree.map(lambda x: tuple(getattr(x, "shape", ())), inputs)
            raise ValueError(_OTHER_INPUTS.format(shapes=shapes, error=error)) from None
        return out if self.with_state else (out, model_state)


_OTHER_INPUTS = (
    "ciclo_haiku: the parameters do not fit this batch's inputs (shapes {shapes}): "
    "create_state initialised them from inputs of another shape; give it a sample of the "
    "real inputs. Haiku: {error}"
)


def create_state(
    model: Model,
    inputs: Any,
    tx: optax.GradientTransformation | None,
    *,
    losses: Mapping[str, Any] | None,
    key: jax.Array | int | None = None,
    params: Any = None,
    model_state: Any = None,
    training_arg: str | None = AUTO,
    **options: Unpack[ciclo.adapters.AdapterOptions],
) -> HaikuState:
    """Builds a :class:`HaikuState` for a Haiku model, ready for ``state.train_step``,
    ``test_step``, ``predict_step`` and every ciclo loop.

    The model is called as ``f(inputs, is_training=...)``: ``inputs`` are a batch's inputs
    (a dict of them when ``inputs_key`` is a tuple of keys), and ``is_training`` is passed
    when the function takes it (``True`` in ``train_step``, ``False`` otherwise). An RNG key,
    different at every step and reproducible from ``key``, is available to
    ``hk.next_rng_key()`` (dropout). States built from the same function share their compiled
    steps (as with ``jax.jit``, globals the function reads are fixed when it is first traced).

    Args:
        model: a function using Haiku modules (it is transformed with
            ``hk.transform_with_state``), or an already transformed ``hk.Transformed`` /
            ``hk.TransformedWithState`` (``hk.without_apply_rng`` ones too).
        inputs: sample inputs (a batch's inputs) to initialize the parameters with; the
            initialization runs with ``is_training=True`` so that every piece of Haiku state
            (moving averages) is created.
        tx: an optax optimizer (``None`` for a state that is only evaluated).
        losses: ``{name: fn(preds, targets)}`` returning a scalar or per-example values,
            e.g. ``{"loss": optax.softmax_cross_entropy_with_integer_labels}``.
        key: an RNG key or seed for initialization and dropout (``None``: seed 0).
        params: already initialized parameters, used instead of ``model.init``.
        model_state: the Haiku state that goes with ``params`` (``{}`` when omitted).
        training_arg: the keyword argument that tells the function whether it trains:
            ``"auto"`` passes ``is_training`` when the function takes it; a name passes
            that argument; ``None`` passes none.
        **options: the options of every adapter (``metrics``, ``strategy``, the keys of
            dict batches, mixed precision, averaged weights, ``trainable``), listed once in
            :class:`ciclo.adapters.AdapterOptions`.

    Returns:
        A :class:`HaikuState`.

    Example:
        >>> import ciclo_haiku, haiku as hk, jax.numpy as jnp, optax
        >>> def forward(x, is_training):
        ...     x = hk.Linear(8)(x)
        ...     x = hk.BatchNorm(True, True, decay_rate=0.9)(x, is_training)
        ...     return hk.Linear(3)(x)
        >>> state = ciclo_haiku.create_state(
        ...     forward, jnp.zeros((2, 4)), optax.adam(1e-3),
        ...     losses={"loss": optax.softmax_cross_entropy_with_integer_labels},
        ... )
        >>> logs, state = state.train_step((jnp.ones((8, 4)), jnp.zeros(8, jnp.int32)))
        >>> int(state.step)
        1
    """
    check_options(options, create_state)
    transformed = _transformed(model)
    with_state = isinstance(transformed, hk.TransformedWithState)
    signature = _function_signature(transformed)
    flag = detect_training_arg(signature, training_arg, "the model function", flags=_FLAGS)
    _check_callable_with_inputs(signature, flag)
    init_key, key = jax.random.split(ciclo.adapters.as_key(key))
    if params is None:
        initialized = _jitted_init(transformed.init, flag)(init_key, inputs)
        params, model_state = initialized if with_state else (initialized, {})
    elif model_state is None:
        model_state = _empty_state_or_error(transformed, with_state, init_key, inputs, flag)
    elif not with_state and model_state:
        raise ValueError(
            "model_state was given, but the model is an hk.Transformed, which has no Haiku "
            "state. Use hk.transform_with_state for a model with state, or drop model_state."
        )
    model_state = dict(model_state)
    # the subclass's own fields, then those of every adapter
    fields = {"transformed": transformed, "training_arg": flag, "with_state": with_state}
    fields["apply_rng"] = _apply_takes_rng(transformed, with_state)
    return HaikuState.create(
        params=params, model_state=model_state, tx=tx, losses=losses, key=key, **fields, **options
    )


def _transformed(model: Any) -> hk.Transformed | hk.TransformedWithState:
    """The model as a transformed pair of functions (functions get ``transform_with_state``)."""
    if isinstance(model, hk.Transformed | hk.TransformedWithState):
        return model
    if isinstance(model, hk.MultiTransformed | hk.MultiTransformedWithState):
        raise TypeError(_MULTI_TRANSFORM)
    if isinstance(model, type) and issubclass(model, hk.Module):
        raise TypeError(_MODULE_CLASS.format(name=model.__name__))
    if hasattr(model, "init") and hasattr(model, "apply"):
        kind = f"{type(model).__module__}.{type(model).__qualname__}"
        raise TypeError(_OTHER_FRAMEWORK.format(kind=kind))
    if not callable(model):
        raise TypeError(_NOT_A_MODEL.format(kind=type(model).__name__))
    try:
        return _transform(model)
    except TypeError:  # an unhashable callable: not cached
        return hk.transform_with_state(model)


# States built from the same function share one transform, so they share compiled steps (the
# transform is a static field, part of the steps' cache key), as Flax states of equal modules do.
@functools.lru_cache(maxsize=64)
def _transform(function: Callable[..., Any]) -> hk.TransformedWithState:
    return hk.transform_with_state(function)


@functools.lru_cache(maxsize=64)
def _jitted_init(init: Callable[..., Any], flag: str | None) -> Callable[..., Any]:
    kwargs = training_kwargs(flag, True)
    return jax.jit(lambda rng, inputs: init(rng, inputs, **kwargs))


def _function_signature(transformed: Any) -> inspect.Signature | None:
    """The signature of the transformed function (``init``'s without its leading ``rng``)."""
    try:
        signature = inspect.signature(transformed.init)
    except (TypeError, ValueError):
        return None
    parameters = list(signature.parameters.values())
    if parameters and parameters[0].name == "rng":
        parameters = parameters[1:]
    return signature.replace(parameters=parameters)


def _check_callable_with_inputs(signature: inspect.Signature | None, flag: str | None) -> None:
    if signature is None:
        return
    try:
        signature.bind(object(), **training_kwargs(flag, True))
    except TypeError as error:
        call = "f(inputs" + ("" if flag is None else f", {flag}=...") + ")"
        raise TypeError(
            _NOT_CALLABLE_WITH_INPUTS.format(call=call, signature=signature, error=error)
        ) from None


def _apply_takes_rng(transformed: Any, with_state: bool) -> bool:
    """Whether ``transformed.apply`` takes an RNG (not wrapped in ``hk.without_apply_rng``)."""
    try:
        parameters = list(inspect.signature(transformed.apply).parameters)
    except (TypeError, ValueError):
        return True
    position = 2 if with_state else 1
    return len(parameters) > position and parameters[position] == "rng"


def _empty_state_or_error(
    transformed: Any, with_state: bool, rng: jax.Array, inputs: Any, flag: str | None
) -> dict[str, Any]:
    """``{}`` for ``params=`` without ``model_state=``, if the model has no Haiku state."""
    if with_state:
        _, state = jax.eval_shape(_jitted_init(transformed.init, flag), rng, inputs)
        if state:
            raise ValueError(_STATE_MISSING.format(names=sorted(state)))
    return {}


_MULTI_TRANSFORM = (
    "ciclo_haiku.create_state got an hk.multi_transform result, which has several apply "
    "functions; ciclo trains one. Transform a single function that returns the predictions, "
    "e.g. ciclo_haiku.create_state(forward, ...), or hk.transform_with_state(forward)."
)
_MODULE_CLASS = (
    "ciclo_haiku.create_state got the Haiku module class {name}; Haiku modules can only be "
    "built inside a transformed function. Pass a function that builds and calls it, e.g. "
    "ciclo_haiku.create_state(lambda x: {name}(...)(x), ...)."
)
_OTHER_FRAMEWORK = (
    "ciclo_haiku.create_state got a {kind}, which has init/apply but is not an hk.Transformed "
    "or hk.TransformedWithState. For a model of another framework use "
    "ciclo.create_state(model, ...), which picks its adapter; for Haiku pass the function or "
    "hk.transform_with_state(function)."
)
_NOT_A_MODEL = (
    "ciclo_haiku.create_state needs a function using Haiku modules, or an hk.Transformed / "
    "hk.TransformedWithState, got {kind}. Example: def forward(x, is_training): ...; "
    "ciclo_haiku.create_state(forward, x[:1], tx, losses=...)."
)
_NOT_CALLABLE_WITH_INPUTS = (
    "ciclo calls the model function as {call}, but its signature is {signature} ({error}). "
    "Make it take the batch's inputs as one argument (a dict of inputs with "
    "inputs_key=('a', 'b')), with defaults for the other arguments."
)
_STATE_MISSING = (
    "params were given without model_state, but the model has Haiku state ({names}). Pass "
    "both from init: params, model_state = transformed.init(rng, inputs, is_training=True)."
)
