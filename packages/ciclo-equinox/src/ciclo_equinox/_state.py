"""Equinox: ``create_state(model, tx, ...)`` and :class:`EquinoxState`.

The model is partitioned once, with Equinox filters, into trainable arrays (``params``),
other arrays (``frozen``) and its non-array part (a static field, held flattened as
Equinox's own ``filter_jit`` holds it: leaves and structure, hashed once). The compiled
step combines them, sets the inference flags for the mode, and runs the model (vmapped over
the batch for per-example models); that tree work happens while tracing only, so a step
costs what a hand-written ``eqx.filter_jit`` step costs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Unpack

import equinox as eqx
import jax
import optax

import ciclo
from ciclo.adapters import AUTO, STATIC, AdapterState, Static, check_options, detect_rng_arg

__all__ = ["EquinoxState", "create_state"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class EquinoxState(AdapterState):
    """The state of an Equinox model: ``params`` holds the arrays selected by ``filter_spec``
    (by default every floating-point array), ``frozen`` the model's other arrays,
    ``model_state`` its ``eqx.nn.State`` (batch-norm statistics) or ``None``. Build it with
    :func:`ciclo_equinox.create_state`; get the trained model back with :attr:`model`.

    In ``train_step`` the model runs with every ``inference`` flag off (dropout on, batch
    statistics used and updated); in the other steps with every flag on
    (``eqx.nn.inference_mode``), so the model state is frozen there.

    Attributes:
        frozen: the model's arrays that are not trained (not selected by ``filter_spec``).
        skeleton: the model's non-array part, ``Static((leaves, treedef))`` (static).
        key_arg: the ``__call__`` keyword given an RNG key, or ``None`` (static).
        vmap: whether the model is per-example and vmapped over the batch (static).
        axis_name: the name of the vmapped batch axis, for ``eqx.nn.BatchNorm`` (static).
    """

    frozen: Any = None
    skeleton: Static = dataclasses.field(default=None, metadata=STATIC)  # type: ignore[assignment]
    key_arg: str | None = dataclasses.field(default=None, metadata=STATIC)
    vmap: bool = dataclasses.field(default=False, metadata=STATIC)
    axis_name: str = dataclasses.field(default="batch", metadata=STATIC)

    @property
    def model(self) -> eqx.Module:
        """The model with the state's parameters (a new object; pair it with
        ``state.model_state`` for a stateful model)."""
        model: eqx.Module = eqx.combine(self.params, self.frozen, self._non_arrays())
        return model

    def _non_arrays(self) -> Any:
        leaves, treedef = self.skeleton.value
        return jax.tree_util.tree_unflatten(treedef, leaves)

    def apply(
        self, params: Any, model_state: Any, inputs: Any, *, training: bool, key: jax.Array | None
    ) -> tuple[Any, Any]:
        model = eqx.nn.inference_mode(
            eqx.combine(params, self.frozen, self._non_arrays()), value=not training
        )
        if model_state is not None:
            # eqx.nn.State.set invalidates the State it is called on: hand the model a copy,
            # so the state kept by ciclo stays usable (this matters with strategy="eager").
            leaves, treedef = jax.tree_util.tree_flatten(model_state)
            model_state = jax.tree_util.tree_unflatten(treedef, leaves)
        if key is None or self.key_arg is None:
            key = None
        if not self.vmap:
            try:
                return self._call(model, inputs, model_state, key)
            except (TypeError, ValueError) as error:
                if not self._runs_per_example(model, inputs, model_state, key):
                    _raise_other_inputs(model, inputs, error)
                    raise
                name = type(model).__name__
                raise type(error)(_PER_EXAMPLE.format(name=name, error=error)) from error
        batch_size = _batch_size(inputs, model)
        keys = None if key is None else jax.random.split(key, batch_size)
        try:
            return jax.vmap(
                lambda x, k: self._call(model, x, model_state, k),
                in_axes=(0, None if keys is None else 0),
                out_axes=(0, None),
                axis_name=self.axis_name,
            )(inputs, keys)
        except (TypeError, ValueError) as error:
            if "out_axes" not in str(error) or model_state is None:
                _raise_other_inputs(model, inputs, error)
                raise
            raise ValueError(
                _STATE_DIFFERS.format(name=type(model).__name__, axis_name=self.axis_name)
            ) from error

    def _runs_per_example(self, model: Any, inputs: Any, model_state: Any, key: Any) -> bool:
        """Whether the model, which failed on the batch, runs on its first example alone
        (shapes only: nothing is computed)."""
        leaves = jax.tree_util.tree_leaves(inputs)
        if not leaves or not all(getattr(x, "ndim", 0) for x in leaves):
            return False
        example = jax.tree_util.tree_map(lambda x: x[0], inputs)
        try:
            jax.eval_shape(lambda x: self._call(model, x, model_state, key), example)
        except Exception:
            return False
        return True

    def _call(self, model: Any, inputs: Any, model_state: Any, key: Any) -> tuple[Any, Any]:
        kwargs: dict[str, Any] = {} if key is None or self.key_arg is None else {self.key_arg: key}
        try:
            if model_state is None:
                return model(inputs, **kwargs), None
            out = model(inputs, model_state, **kwargs)
        except NameError as error:
            if "axis name" not in str(error):
                raise
            hint = (_AXIS_NAME_HINT if self.vmap else _VMAP_HINT).format(axis_name=self.axis_name)
            raise NameError(
                _UNBOUND_AXIS.format(name=type(model).__name__, hint=hint, error=error)
            ) from error
        if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], eqx.nn.State)):
            raise TypeError(
                _NOT_OUT_AND_STATE.format(name=type(model).__name__, out=_describe(out))
            )
        return out[0], out[1]


def _raise_other_inputs(model: Any, inputs: Any, error: Exception) -> None:
    """Explains ``error`` when it is about shapes: the model was built for other inputs."""
    if "shape" not in str(error):
        return
    shapes = jax.tree.map(lambda x: tuple(getattr(x, "shape", ())), inputs)
    name = type(model).__name__
    raise type(error)(_OTHER_INPUTS.format(name=name, shapes=shapes, error=error)) from error


def _describe(value: Any) -> str:
    if isinstance(value, jax.Array):
        return f"an array of shape {value.shape}"
    if isinstance(value, tuple):
        return f"a tuple of {len(value)} ({', '.join(type(v).__name__ for v in value)})"
    return f"a {type(value).__name__}"


def _batch_size(inputs: Any, model: Any) -> int:
    leaves = jax.tree_util.tree_leaves(inputs)
    if not leaves or not getattr(leaves[0], "shape", ()):
        raise ValueError(
            f"vmap=True maps {type(model).__name__} over the leading (batch) axis of the "
            f"inputs, but the inputs have none ({_describe(inputs)}). Pass batched arrays."
        )
    return int(leaves[0].shape[0])


def _detect_key_arg(model: Any, key_arg: str | None) -> str | None:
    """The ``__call__`` keyword given the step's RNG key: ``key`` when ``"auto"`` finds it."""
    return detect_rng_arg(
        model, key_arg, f"{type(model).__name__}.__call__", candidates=("key",), option="key_arg"
    )


def _has_state_index(model: Any) -> bool:
    is_index = lambda x: isinstance(x, eqx.nn.StateIndex)  # noqa: E731
    return any(is_index(x) for x in jax.tree_util.tree_leaves(model, is_leaf=is_index))


def _with_initial_state(model: Any) -> tuple[Any, eqx.nn.State | None]:
    """``(model, state)`` as ``eqx.nn.make_with_state`` makes them, for a model built
    directly whose stateful layers hold their initial values (``state`` is ``None`` when it
    has no stateful layers). Stateful layers are named by their path, so two models built
    alike share compiled steps and states."""
    if not _has_state_index(model):
        return model, None
    try:
        return eqx.nn.make_with_state(lambda: model)()
    except ValueError:
        name = type(model).__name__
        raise ValueError(_NO_STATE.format(name=name)) from None


def _check_model(model: Any, tx: Any) -> None:
    if isinstance(model, eqx.Module):
        if isinstance(tx, eqx.nn.State):
            raise TypeError(
                "create_state got an eqx.nn.State as tx (second argument). Pass the model "
                "state by keyword: create_state(model, tx, state=model_state, ...)."
            )
        return
    if isinstance(model, tuple) and len(model) == 2 and isinstance(model[1], eqx.nn.State):
        raise TypeError(_MODEL_AND_STATE)
    kind = f"{type(model).__module__}.{type(model).__qualname__}"
    raise TypeError(_NOT_A_MODULE.format(kind=kind))


def _partition(model: Any, filter_spec: Any) -> tuple[Any, Any, Static]:
    name = type(model).__name__
    arrays, rest = eqx.partition(model, eqx.is_array)
    try:
        params, frozen = eqx.partition(arrays, filter_spec)
    except (TypeError, ValueError) as error:
        raise TypeError(
            _BAD_FILTER.format(name=name, filter_spec=filter_spec, error=error)
        ) from error
    if not jax.tree_util.tree_leaves(params):
        raise ValueError(
            f"{name} has no arrays selected by filter_spec={filter_spec!r}, so there is "
            f"nothing to train. Check the filter (default eqx.is_inexact_array)."
        )
    path_leaves = jax.tree_util.tree_leaves_with_path(params)
    not_float = [jax.tree_util.keystr(p) for p, x in path_leaves if not eqx.is_inexact_array(x)]
    if not_float:
        raise TypeError(_NOT_FLOAT.format(name=name, leaves=not_float[:5]))
    # Flattened, a list of layers is structure, not an unhashable value: models built alike
    # share compiled steps. (An unhashable leaf is compared by identity: it still works.)
    leaves, treedef = jax.tree_util.tree_flatten(rest)
    skeleton = Static((tuple(leaves), treedef))
    return params, frozen, skeleton


def create_state(
    model: eqx.Module,
    tx: optax.GradientTransformation | None,
    *,
    losses: Mapping[str, Any] | None,
    state: eqx.nn.State | None = None,
    key: jax.Array | int | None = None,
    vmap: bool = False,
    axis_name: str = "batch",
    filter_spec: Callable[[Any], bool] | Any = eqx.is_inexact_array,
    key_arg: str | None = AUTO,
    **options: Unpack[ciclo.adapters.AdapterOptions],
) -> EquinoxState:
    """Builds an :class:`EquinoxState` for an Equinox model, ready for ``state.train_step``,
    ``test_step``, ``predict_step`` and every ciclo loop.

    The model is called as ``model(x)``, ``model(x, key=key)``, ``model(x, state)`` or
    ``model(x, state, key=key)`` (returning ``(y, new_state)``): with the model state when
    there is one, with a key when its ``__call__`` takes ``key``. In ``train_step`` every
    ``inference`` flag is off (dropout on, batch statistics used and updated); in the other
    steps every flag is on (``eqx.nn.inference_mode``) and the model state is frozen. The key
    differs per step and is reproducible from ``key``; with ``vmap=True`` each example gets
    its own key.

    Args:
        model: an ``eqx.Module``, built with its initial parameters.
        tx: an optax optimizer (``None`` for a state that is only evaluated).
        losses: ``{name: fn(preds, targets)}`` returning a scalar or per-example values,
            e.g. ``{"loss": optax.softmax_cross_entropy_with_integer_labels}``.
        state: the model's ``eqx.nn.State`` (from ``eqx.nn.make_with_state``); built from
            the model when it holds stateful layers with their initial values.
        key: an RNG key or seed for dropout and other randomness (``None``: seed 0).
        vmap: the model is per-example (the usual Equinox idiom): ciclo vmaps it over the
            leading axis of the inputs, the model state shared by the batch.
        axis_name: the name of that vmapped axis, which ``eqx.nn.BatchNorm(axis_name=...)``
            averages over.
        filter_spec: which arrays are trained, as in ``eqx.partition``: a function
            ``array -> bool`` or a pytree of bools; the other arrays stay as they are.
        key_arg: the ``__call__`` keyword that receives the RNG key: ``"auto"`` passes
            ``key=`` when ``__call__`` takes ``key``; ``None`` passes no key.
        **options: the options of every adapter (``metrics``, ``strategy``, the keys of
            dict batches, mixed precision, averaged weights, ``trainable``), listed once in
            :class:`ciclo.adapters.AdapterOptions`.

    Returns:
        An :class:`EquinoxState`.

    Example:
        >>> import ciclo_equinox, equinox as eqx, jax, jax.numpy as jnp, optax
        >>> state = ciclo_equinox.create_state(
        ...     eqx.nn.Linear(4, 3, key=jax.random.key(0)), optax.adam(1e-3), vmap=True,
        ...     losses={"loss": optax.softmax_cross_entropy_with_integer_labels},
        ... )
        >>> logs, state = state.train_step((jnp.ones((8, 4)), jnp.zeros(8, jnp.int32)))
        >>> int(state.step)
        1
    """
    check_options(options, create_state)
    _check_model(model, tx)
    if state is None:
        model, state = _with_initial_state(model)
    elif not isinstance(state, eqx.nn.State):
        raise TypeError(
            f"state must be an eqx.nn.State (from eqx.nn.make_with_state), got "
            f"{type(state).__name__}."
        )
    if not isinstance(vmap, bool):
        raise TypeError(f"vmap must be True or False, got {vmap!r}.")
    model = eqx.nn.delete_init_state(model)  # the initial values live in `state`
    params, frozen, skeleton = _partition(model, filter_spec)
    # the subclass's own fields, then those of every adapter
    fields = {"frozen": frozen, "skeleton": skeleton, "key_arg": _detect_key_arg(model, key_arg)}
    fields |= {"vmap": vmap, "axis_name": axis_name}
    return EquinoxState.create(
        params=params, model_state=state, tx=tx, losses=losses, key=key, **fields, **options
    )


_OTHER_INPUTS = (
    "ciclo_equinox: {name} does not run on this batch's inputs (shapes {shapes}): it was "
    "built for inputs of another shape (a wrong feature count?). Equinox: {error}"
)
_PER_EXAMPLE = (
    "{name} failed on a batch of inputs ({error}), but it runs on a single example: it is a "
    "per-example model (the usual Equinox idiom). Use create_state(..., vmap=True) so ciclo "
    "vmaps it over the batch."
)
_STATE_DIFFERS = (
    "{name} (vmap=True) returned a model state that differs between the examples of a "
    "batch; the state must be shared by the batch, as eqx.nn.BatchNorm's is (it averages "
    "over axis_name={axis_name!r})."
)
_AXIS_NAME_HINT = (
    "create_state(..., vmap=True, axis_name=...) with the axis name its layers use (now "
    "{axis_name!r})"
)
_VMAP_HINT = "create_state(..., vmap=True) so ciclo vmaps it over the batch"
_UNBOUND_AXIS = (
    "{name} uses a named axis (eqx.nn.BatchNorm(axis_name=...)) that is not bound: it is a "
    "per-example model; use {hint}. ({error})"
)
_NOT_OUT_AND_STATE = (
    "{name} was called as model(x, state) because the ciclo state has a model state, so it "
    "must return (output, new_state) with an eqx.nn.State, but it returned {out}."
)
_NO_STATE = (
    "{name} has stateful layers (eqx.nn.BatchNorm, eqx.nn.StateIndex...) but no state was "
    "given. Pass the state eqx.nn.make_with_state returns: model, model_state = "
    "eqx.nn.make_with_state({name})(...); create_state(model, tx, state=model_state, ...)."
)
_MODEL_AND_STATE = (
    "create_state got a (model, state) tuple, as eqx.nn.make_with_state returns. Pass them "
    "apart: model, model_state = eqx.nn.make_with_state(Model)(...); create_state(model, tx, "
    "state=model_state, ...)."
)
_NOT_A_MODULE = (
    "ciclo_equinox.create_state needs an equinox.Module, got {kind}. Define the model as a "
    "subclass of eqx.Module (for a plain function use ciclo.adapters.FunctionState)."
)
_BAD_FILTER = (
    "filter_spec must be a function array -> bool (e.g. eqx.is_inexact_array) or a pytree of "
    "bools that is a prefix of {name}, as in eqx.partition; got {filter_spec!r} ({error})."
)
_NOT_FLOAT = (
    "filter_spec selects arrays of {name} that are not floating point, which cannot be "
    "differentiated: {leaves}. Select floating-point arrays only, e.g. combine your filter "
    "with eqx.is_inexact_array."
)
