"""Flax Linen: ``create_state(module, inputs, tx, ...)`` and :class:`FlaxState`."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Any, Unpack

import flax.core
import flax.errors
import flax.linen as nn
import flax.traverse_util
import jax
import optax

import ciclo
from ciclo.adapters import (
    AUTO,
    STATIC,
    AdapterState,
    Static,
    check_options,
    detect_training_arg,
    stream_keys,
    training_kwargs,
)

from ._sown import SOWN, sown_logs

__all__ = ["FlaxState", "create_state"]


_OTHER_INPUTS = (
    "ciclo_flax: {name}'s parameters do not fit this batch's inputs (shapes {shapes}): "
    "create_state initialised them from sample inputs of another shape (a wrong feature "
    "count?). Flax: {error} Give create_state a sample of the real inputs, e.g. "
    "ciclo_flax.create_state(module, x_train[:1], tx, ...)."
)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _init(module: Static, flag: str | None, rngs: Any, inputs: Any) -> Any:
    return module.value.init(rngs, inputs, **training_kwargs(flag, False))


@dataclasses.dataclass(frozen=True, kw_only=True)
class FlaxState(AdapterState):
    """The state of a Flax Linen module: ``params`` is the ``"params"`` collection and
    ``model_state`` the other collections (``{"batch_stats": ...}``), updated in training and
    frozen in evaluation. Build it with :func:`ciclo_flax.create_state`.

    Attributes:
        module: the Linen module.
        training_arg: the ``__call__`` argument set to the mode (``training``, ``train``,
            ``is_training``; ``deterministic`` gets the opposite), or ``None``.
        rng_streams: the RNG streams given a fresh key at every step (``("dropout",)``).
    """

    module_ref: Static = dataclasses.field(default=None, metadata=STATIC)  # type: ignore[assignment]
    training_arg: str | None = dataclasses.field(default=None, metadata=STATIC)
    rng_streams: tuple[str, ...] = dataclasses.field(default=("dropout",), metadata=STATIC)

    @property
    def module(self) -> nn.Module:
        """The Linen module."""
        module: nn.Module = self.module_ref.value
        return module

    @property
    def variables(self) -> dict[str, Any]:
        """All the module's variables, ``{"params": ..., **model_state}``, for ``module.apply``."""
        return {"params": self.params, **self.model_state}

    def apply(
        self, params: Any, model_state: Any, inputs: Any, *, training: bool, key: jax.Array | None
    ) -> tuple[Any, Any, ciclo.Logs]:
        variables = {"params": params, **model_state}
        rngs = None if key is None else stream_keys(key, self.rng_streams)
        kwargs = training_kwargs(self.training_arg, training)
        mutable = [*(model_state if training else ()), *SOWN]
        try:
            preds, updates = self.module.apply(
                variables, inputs, rngs=rngs, mutable=mutable, **kwargs
            )
        except flax.errors.ScopeParamShapeError as error:
            shapes = jax.tree.map(lambda x: tuple(getattr(x, "shape", ())), inputs)
            raise ValueError(
                _OTHER_INPUTS.format(name=type(self.module).__name__, shapes=shapes, error=error)
            ) from None
        updates = dict(updates)
        sown = sown_logs({c: _flat(updates.pop(c)) for c in SOWN if c in updates})
        if training and model_state:
            return preds, {**model_state, **updates}, sown
        return preds, model_state, sown


def _flat(tree: Any) -> list[tuple[tuple[Any, ...], Any]]:
    """A sown collection's ``(path, value)`` pairs (``self.sow`` stores a tuple of values)."""
    flat = flax.traverse_util.flatten_dict(
        flax.core.unfreeze(tree), is_leaf=lambda _, v: isinstance(v, tuple)
    )
    return list(flat.items())


_NOT_A_LINEN_MODULE = "ciclo_flax.create_state needs a flax.linen.Module, got {kind}.{hint}"
_NNX_HINT = " For a flax.nnx module use ciclo_flax.create_nnx_state(model, tx, ...)."
_NO_PARAMS = (
    "{name} has no 'params' collection (its variables have {collections}); "
    "ciclo needs parameters to train. Check that the module creates some with "
    "self.param or submodules."
)


def create_state(
    module: nn.Module,
    inputs: Any,
    tx: optax.GradientTransformation | None,
    *,
    losses: Mapping[str, Any] | None,
    key: jax.Array | int | None = None,
    variables: Mapping[str, Any] | None = None,
    training_arg: str | None = AUTO,
    rng_streams: Sequence[str] = ("dropout",),
    **options: Unpack[ciclo.adapters.AdapterOptions],
) -> FlaxState:
    """Builds a :class:`FlaxState` for a Flax Linen module, ready for ``state.train_step``,
    ``test_step``, ``predict_step`` and every ciclo loop.

    Args:
        module: a ``flax.linen.Module``.
        inputs: sample inputs (a batch's inputs) to initialize the variables with.
        tx: an optax optimizer (``None`` for a state that is only evaluated).
        losses: ``{name: fn(preds, targets)}`` returning a scalar or per-example values,
            e.g. ``{"loss": optax.softmax_cross_entropy_with_integer_labels}``.
        key: an RNG key or seed for initialization and dropout (``None``: seed 0).
        variables: already initialized variables (``{"params": ..., "batch_stats": ...}``),
            used instead of ``module.init``.
        training_arg: the ``__call__`` argument that says whether the module trains:
            ``"auto"`` finds ``training``, ``train``, ``is_training`` or ``deterministic``
            (set to the opposite); ``None`` passes none.
        rng_streams: RNG streams the module draws from (``make_rng``), each given a key
            derived from the state's key and step.
        **options: the options of every adapter (``metrics``, ``strategy``, the keys of
            dict batches, mixed precision, averaged weights, ``trainable``), listed once in
            :class:`ciclo.adapters.AdapterOptions`.

    Returns:
        A :class:`FlaxState`.

    Example:
        >>> import ciclo_flax, flax.linen as nn, jax.numpy as jnp, optax
        >>> state = ciclo_flax.create_state(
        ...     nn.Dense(3), jnp.zeros((1, 4)), optax.adam(1e-3),
        ...     losses={"loss": optax.softmax_cross_entropy_with_integer_labels},
        ... )
        >>> logs, state = state.train_step((jnp.ones((8, 4)), jnp.zeros(8, jnp.int32)))
        >>> int(state.step)
        1
    """
    check_options(options, create_state)
    if not isinstance(module, nn.Module):
        hint = _NNX_HINT if _is_nnx(module) else ""
        raise TypeError(_NOT_A_LINEN_MODULE.format(kind=type(module).__name__, hint=hint))
    name = type(module).__name__
    flag = detect_training_arg(module.__call__, training_arg, f"{name}.__call__")
    init_key, key = jax.random.split(ciclo.adapters.as_key(key))
    if variables is None:
        rngs = {"params": init_key, **stream_keys(init_key, rng_streams)}
        variables = _init(Static(module), flag, rngs, inputs)
    variables = dict(variables)
    if "params" not in variables:
        raise ValueError(_NO_PARAMS.format(name=name, collections=sorted(variables)))
    params = variables.pop("params")
    for collection in SOWN:  # recorded anew at each step, never state
        variables.pop(collection, None)
    # the subclass's own fields, then those of every adapter
    fields = {"module_ref": Static(module), "training_arg": flag, "rng_streams": tuple(rng_streams)}
    return FlaxState.create(
        params=params, model_state=variables, tx=tx, losses=losses, key=key, **fields, **options
    )


def _is_nnx(model: Any) -> bool:
    from flax import nnx

    return isinstance(model, nnx.Module)
