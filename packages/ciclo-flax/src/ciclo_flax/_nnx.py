"""Flax NNX: ``create_nnx_state(model, tx, ...)`` and :class:`NNXState`.

The model is split once into a static ``graphdef`` and array states; the compiled step merges
them, runs the model and splits it again. That graph work happens while tracing only, so a
step costs what a hand-written ``jax.jit`` step costs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Unpack

import jax
import optax
from flax import nnx

import ciclo
from ciclo.adapters import (
    AUTO,
    STATIC,
    AdapterState,
    Static,
    check_options,
    detect_rng_arg,
    detect_training_arg,
    stream_keys,
    training_kwargs,
)

from ._sown import call_recording, drop_sown

__all__ = ["NNXState", "create_nnx_state"]

#: The name the ``nnx.Rngs`` given at call time derives its key under.
_CALL_STREAM = ("<call rngs>",)


@dataclasses.dataclass(frozen=True, kw_only=True)
class NNXState(AdapterState):
    """The state of a ``flax.nnx`` model: ``params`` holds the variables selected by ``wrt``
    (``nnx.Param``), ``model_state`` every other variable (batch statistics, RNG counters...),
    updated in training and frozen in evaluation. Build it with
    :func:`ciclo_flax.create_nnx_state`; get the trained model back with :attr:`model`.

    Attributes:
        graphdef: the model's static structure.
        wrt: the filter of trainable variables (static).
        training_arg: a ``__call__`` argument set to the mode, or ``None`` (static).
        rng_streams: the model's RNG streams, reseeded from the state's key at every step.
        rngs_arg: the ``__call__`` argument given an ``nnx.Rngs`` at call time (``rngs``,
            as in ``Dropout(...)(x, rngs=rngs)``), or ``None`` (static).
    """

    graphdef_ref: Static = dataclasses.field(default=None, metadata=STATIC)  # type: ignore[assignment]
    wrt: Any = dataclasses.field(default=nnx.Param, metadata=STATIC)
    training_arg: str | None = dataclasses.field(default=None, metadata=STATIC)
    rng_streams: tuple[str, ...] = dataclasses.field(default=(), metadata=STATIC)
    rngs_arg: str | None = dataclasses.field(default=None, metadata=STATIC)

    @property
    def graphdef(self) -> Any:
        """The model's ``nnx.GraphDef``."""
        return self.graphdef_ref.value

    @property
    def model(self) -> nnx.Module:
        """The model with the state's parameters and model state (a new object)."""
        return nnx.merge(self.graphdef, self.params, self.model_state)

    def with_trainable(self, trainable: Any) -> NNXState:
        """:meth:`ciclo.managed.ManagedState.with_trainable`, also with an ``nnx`` filter."""
        if _is_nnx_filter(trainable):
            trainable = _names_of(self.params, trainable)
        return super().with_trainable(trainable)

    def apply(
        self, params: Any, model_state: Any, inputs: Any, *, training: bool, key: jax.Array | None
    ) -> tuple[Any, Any, ciclo.Logs]:
        # copy=True: fresh Variables at this trace level (mutable under jax.grad).
        model = nnx.merge(self.graphdef, params, model_state, copy=True)
        kwargs: dict[str, Any] = training_kwargs(self.training_arg, training)
        if key is not None and (self.rng_streams or self.rngs_arg):
            # The streams the model holds, and the Rngs given at call time, each get their
            # own key (the step's key itself when there is only one of them).
            keys = stream_keys(key, (*self.rng_streams, *_CALL_STREAM[: bool(self.rngs_arg)]))
            if self.rng_streams:
                nnx.reseed(model, **{name: keys[name] for name in self.rng_streams})
            if self.rngs_arg:
                kwargs[self.rngs_arg] = nnx.Rngs(keys[_CALL_STREAM[0]])
        if training:
            model.train()
        else:
            model.eval()
        # What the model sows as SownLoss / SownMetric comes back as logs, never as state.
        preds, sown = call_recording(model, inputs, kwargs)
        _, _, new_model_state = nnx.split(model, self.wrt, ...)
        return preds, new_model_state, sown


def create_nnx_state(
    model: nnx.Module,
    tx: optax.GradientTransformation | None,
    *,
    losses: Mapping[str, Any] | None,
    key: jax.Array | int | None = None,
    wrt: Any = nnx.Param,
    training_arg: str | None = AUTO,
    rngs_arg: str | None = AUTO,
    **options: Unpack[ciclo.adapters.AdapterOptions],
) -> NNXState:
    """Builds an :class:`NNXState` for a ``flax.nnx`` model, ready for ``state.train_step``,
    ``test_step``, ``predict_step`` and every ciclo loop.

    The model is put in training mode (``model.train()``) in ``train_step`` and evaluation
    mode (``model.eval()``) otherwise; its RNG streams (``nnx.Rngs`` held by ``Dropout``...)
    get a key derived from the state's key and step, so dropout differs per step and is
    reproducible from ``key``. A model whose ``__call__`` takes ``rngs`` (the Flax MNIST
    tutorial's CNN: ``self.dropout(x, rngs=rngs)``) is called with ``rngs=nnx.Rngs(...)``
    made from that key, in every step (in evaluation dropout ignores it). Losses and
    metrics the model sows (``self.sow(ciclo_flax.SownLoss, "l2", value)``,
    :class:`~ciclo_flax.SownMetric`) are logged in every step, and sown losses add to the
    objective; they are collected anew at each call and never kept in the state. The model
    object passed in is not modified.

    Args:
        model: a ``flax.nnx.Module`` (already initialized, as NNX modules are).
        tx: an optax optimizer (``None`` for a state that is only evaluated).
        losses: ``{name: fn(preds, targets)}``, e.g.
            ``{"loss": optax.softmax_cross_entropy_with_integer_labels}``.
        key: an RNG key or seed for the per-step RNG streams (``None``: seed 0).
        wrt: an ``nnx`` filter of the trainable variables (as in
            ``nnx.Optimizer(model, tx, wrt=...)``); default ``nnx.Param``.
        training_arg: a ``__call__`` argument set to the mode (``"auto"`` finds
            ``training``, ``train``, ``is_training``, ``deterministic``; ``None`` passes none).
        rngs_arg: a ``__call__`` argument given an ``nnx.Rngs`` at call time (``"auto"``
            finds ``rngs``; ``None`` passes none).
        **options: the options of every adapter (``metrics``, ``strategy``, the keys of
            dict batches, mixed precision, averaged weights, ``trainable``: here also an
            ``nnx`` filter), listed once in :class:`ciclo.adapters.AdapterOptions`.

    Returns:
        An :class:`NNXState`.

    Example:
        >>> import ciclo_flax, jax.numpy as jnp, optax
        >>> from flax import nnx
        >>> state = ciclo_flax.create_nnx_state(
        ...     nnx.Linear(4, 3, rngs=nnx.Rngs(0)), optax.adam(1e-3),
        ...     losses={"loss": optax.softmax_cross_entropy_with_integer_labels},
        ... )
        >>> logs, state = state.train_step((jnp.ones((8, 4)), jnp.zeros(8, jnp.int32)))
        >>> int(state.step)
        1
    """
    check_options(options, create_nnx_state)
    if not isinstance(model, nnx.Module):
        raise TypeError(
            f"ciclo_flax.create_nnx_state needs a flax.nnx.Module, got {type(model).__name__}. "
            f"For a flax.linen module use ciclo_flax.create_state(module, inputs, tx, ...)."
        )
    name = type(model).__name__
    flag = detect_training_arg(model.__call__, training_arg, f"{name}.__call__")  # type: ignore[operator]
    call_rngs = detect_rng_arg(
        model.__call__,  # type: ignore[operator]
        rngs_arg,
        f"{name}.__call__",
        candidates=("rngs",),
        option="rngs_arg",
    )
    graphdef, params, model_state = nnx.split(drop_sown(model), wrt, ...)
    if not jax.tree_util.tree_leaves(params):
        raise ValueError(
            f"{name} has no variables matching wrt={wrt!r}, so there is nothing to train. "
            f"Check the filter (default nnx.Param)."
        )
    if _is_nnx_filter(options.get("trainable")):
        options["trainable"] = _names_of(params, options["trainable"])
    streams = sorted(
        {node.tag for _, node in nnx.iter_graph(model) if isinstance(node, nnx.RngStream)}
    )
    # the subclass's own fields, then those of every adapter
    fields = {"graphdef_ref": Static(graphdef), "wrt": wrt, "training_arg": flag}
    fields |= {"rng_streams": tuple(streams), "rngs_arg": call_rngs}
    return NNXState.create(
        params=params, model_state=model_state, tx=tx, losses=losses, key=key, **fields, **options
    )


def _is_nnx_filter(value: Any) -> bool:
    """An ``nnx`` filter (a Variable type, ``nnx.PathContains(...)``...), not a regex or a
    function of names, which ``ManagedState.create`` reads itself."""
    return isinstance(value, type | tuple | list) or type(value).__module__.startswith("flax.")


def _names_of(params: Any, where: Any) -> Any:
    """The function of names that selects what the ``nnx`` filter ``where`` selects."""
    selects = nnx.filterlib.to_predicate(where)
    chosen = frozenset(
        "/".join(map(str, path))
        for path, value in nnx.to_flat_state(params)
        if selects(path, value)
    )
    return chosen.__contains__
