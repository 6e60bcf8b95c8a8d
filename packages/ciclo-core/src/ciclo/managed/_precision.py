"""Mixed precision: parameters and optimizer state stay in float32, a managed step computes
in a lower ``compute_dtype`` (``bfloat16``, ``float16``), and what it reports is float32.

The policy is jmp's (``param_dtype=float32, compute_dtype=..., output_dtype=float32``),
applied by the managed step, not by the model: inside the compiled step the parameters are
cast to the compute dtype before the forward pass (so the backward pass runs in it too, and
the gradients, taken w.r.t. the float32 parameters, come back in float32), floating inputs
are cast as well, and floating logs are cast back to float32. A loss scale keeps small
float16 gradients from flushing to zero: :class:`LossScale`, static or dynamic.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, cast

import jax
import jax.numpy as jnp

__all__ = [
    "LossScale",
    "all_finite",
    "apply_scaled_gradients",
    "as_compute_dtype",
    "as_loss_scale",
    "cast_floating",
    "precision_fields",
    "restore_dtypes",
    "run_in_compute_dtype",
    "scale_loss",
    "to_float32",
    "unscale_gradients",
]

_LOSS_SCALE_HELP = (
    "loss_scale={value!r}: give a number (a static scale, e.g. 2.0**12), 'dynamic' (start "
    "at 2**15, halve on a non-finite gradient and skip that update, double after 2000 "
    "finite steps), a ciclo.managed.LossScale, or None (no scaling; bfloat16 needs none)."
)


def as_compute_dtype(value: Any) -> jnp.dtype | None:
    """The validated ``compute_dtype`` of a state: ``None`` (compute in the parameters'
    dtype) or a floating-point dtype.

    Example:
        >>> as_compute_dtype("bfloat16")
        dtype(bfloat16)
    """
    if value is None:
        return None
    try:
        dtype = jnp.dtype(value)
    except TypeError:
        dtype = None
    if dtype is None or not jnp.issubdtype(dtype, jnp.floating):
        raise TypeError(
            f"compute_dtype={value!r} is not a floating-point dtype; use jnp.bfloat16 (or "
            f"jnp.float16 with loss_scale='dynamic'), or None to compute in float32."
        )
    return cast(jnp.dtype, dtype)


def _is_floating(leaf: Any) -> bool:
    dtype = getattr(leaf, "dtype", None)
    return dtype is not None and jnp.issubdtype(dtype, jnp.floating)


def cast_floating(tree: Any, dtype: Any) -> Any:
    """``tree`` with its floating-point arrays cast to ``dtype`` (integer arrays, keys and
    other leaves unchanged); ``tree`` itself when ``dtype`` is ``None``.

    Example:
        >>> import jax.numpy as jnp
        >>> x = cast_floating({"w": jnp.ones(2), "n": jnp.arange(2)}, jnp.bfloat16)
        >>> str(x["w"].dtype), str(x["n"].dtype)
        ('bfloat16', 'int32')
    """
    if dtype is None:
        return tree
    return jax.tree.map(lambda x: x.astype(dtype) if _is_floating(x) else x, tree)


def to_float32(tree: Any) -> Any:
    """``tree`` with its floating-point arrays narrower than float32 widened to float32:
    what a mixed-precision step reports (logs, losses, predictions).

    Example:
        >>> import jax.numpy as jnp
        >>> str(to_float32(jnp.ones(2, jnp.bfloat16)).dtype)
        'float32'
    """

    def widen(x: Any) -> Any:
        if _is_floating(x) and jnp.dtype(x.dtype).itemsize < 4:
            return jnp.asarray(x, jnp.float32)
        return x

    return jax.tree.map(widen, tree)


def restore_dtypes(new: Any, old: Any) -> Any:
    """``new`` with each floating-point array cast back to the dtype of the array in the
    same place of ``old`` (a state the model changed in the compute dtype keeps its own
    dtypes, so a fused step's carry and a checkpoint see the same dtypes); ``new`` as it is
    when the two trees differ in structure.

    Example:
        >>> import jax.numpy as jnp
        >>> str(restore_dtypes([jnp.ones(1, jnp.bfloat16)], [jnp.ones(1)])[0].dtype)
        'float32'
    """
    new_leaves, treedef = jax.tree_util.tree_flatten(new)
    old_leaves, old_treedef = jax.tree_util.tree_flatten(old)
    if treedef != old_treedef:  # type: ignore[operator]
        return new
    leaves = [
        n.astype(o.dtype) if _is_floating(n) and _is_floating(o) and n.dtype != o.dtype else n
        for n, o in zip(new_leaves, old_leaves, strict=True)
    ]
    return jax.tree_util.tree_unflatten(treedef, leaves)


def all_finite(tree: Any) -> jax.Array:
    """Whether every floating-point value of ``tree`` is finite (a scalar bool array).

    Example:
        >>> import jax.numpy as jnp
        >>> bool(all_finite({"g": jnp.array([1.0, jnp.inf])}))
        False
    """
    checks = [jnp.isfinite(x).all() for x in jax.tree.leaves(tree) if _is_floating(x)]
    return jnp.stack(checks).all() if checks else jnp.array(True)


@dataclasses.dataclass(frozen=True)
class LossScale:
    """A loss scale for float16 training (as in jmp and optax): the loss is multiplied by
    ``scale`` before differentiation and the gradients divided by it, so that small
    gradients survive float16's range.

    Static (``dynamic=False``): the scale never changes; a non-finite gradient is applied
    as it is. Dynamic: a step whose gradients are not all finite is skipped (parameters,
    optimizer state and averaged parameters unchanged; ``step`` still counts it) and the
    scale is divided by ``factor``; after ``period`` finite steps in a row it is multiplied
    by ``factor``. ``scale`` and the count of finite steps are arrays of the state, so a
    checkpoint saves them and a resumed run continues with the same scale.

    Example:
        >>> import ciclo, jax.numpy as jnp
        >>> scale = ciclo.managed.LossScale.create("dynamic")
        >>> float(scale.scale), float(scale.adjust(jnp.array(False)).scale)
        (32768.0, 16384.0)
    """

    scale: jax.Array
    finite_steps: jax.Array
    dynamic: bool = dataclasses.field(default=False, metadata={"static": True})
    period: int = dataclasses.field(default=2000, metadata={"static": True})
    factor: float = dataclasses.field(default=2.0, metadata={"static": True})

    @classmethod
    def create(
        cls, value: float | str = "dynamic", *, period: int = 2000, factor: float = 2.0
    ) -> LossScale:
        """A static scale (a number) or a dynamic one (``"dynamic"``, starting at 2**15).

        Raises:
            ValueError: for a scale that is not a positive number or ``"dynamic"``.
        """
        dynamic = value == "dynamic"
        if not dynamic and (
            isinstance(value, bool) or not isinstance(value, int | float) or not value > 0
        ):
            raise ValueError(_LOSS_SCALE_HELP.format(value=value))
        if isinstance(period, bool) or not isinstance(period, int) or period < 1:
            raise ValueError(f"LossScale(period={period!r}): expected an int >= 1.")
        if not isinstance(factor, int | float) or not factor > 1:
            raise ValueError(f"LossScale(factor={factor!r}): expected a number > 1.")
        initial = 2.0**15 if dynamic else float(value)
        return cls(
            jnp.asarray(initial, jnp.float32),
            jnp.zeros((), jnp.int32),
            dynamic=dynamic,
            period=period,
            factor=float(factor),
        )

    def scale_loss(self, loss: jax.Array) -> jax.Array:
        """``loss * scale``, in the loss's dtype."""
        return loss * self.scale.astype(loss.dtype)

    def unscale(self, grads: Any) -> Any:
        """``grads / scale``."""
        return jax.tree.map(lambda g: g / self.scale.astype(g.dtype), grads)

    def adjust(self, finite: jax.Array) -> LossScale:
        """The scale after a step whose gradients were all finite (``finite``) or not."""
        if not self.dynamic:
            return self
        grown = self.finite_steps + 1 >= self.period
        scale = jnp.where(
            finite,
            jnp.where(grown, self.scale * self.factor, self.scale),
            jnp.maximum(self.scale / self.factor, 1.0),
        )
        count = jnp.where(finite & ~grown, self.finite_steps + 1, 0)
        return dataclasses.replace(self, scale=scale, finite_steps=count.astype(jnp.int32))


jax.tree_util.register_dataclass(
    LossScale, data_fields=["scale", "finite_steps"], meta_fields=["dynamic", "period", "factor"]
)


def as_loss_scale(value: Any) -> LossScale | None:
    """The ``loss_scale`` option of a state as a :class:`LossScale` (``None``: none).

    Example:
        >>> float(as_loss_scale(1024).scale)
        1024.0
    """
    if value is None or isinstance(value, LossScale):
        return value
    if isinstance(value, str) and value != "dynamic":
        raise ValueError(_LOSS_SCALE_HELP.format(value=value))
    return LossScale.create(value)


def precision_fields(compute_dtype: Any, loss_scale: Any, trains: bool = True) -> dict[str, Any]:
    """The fields of a new state with the ``compute_dtype`` and ``loss_scale`` options
    (none when neither is given); float16 gradients need a loss scale when it ``trains``.

    Example:
        >>> import jax.numpy as jnp
        >>> precision_fields(jnp.bfloat16, None)
        {'compute_dtype': dtype(bfloat16)}
    """
    fields: dict[str, Any] = {}
    dtype = as_compute_dtype(compute_dtype)
    if dtype is not None:
        fields["compute_dtype"] = dtype
    scale = as_loss_scale(loss_scale)
    if dtype == jnp.float16 and scale is None and trains:
        raise ValueError("compute_dtype=float16 underflows gradients: give loss_scale='dynamic'.")
    if scale is not None:
        fields["loss_scale"] = scale
    return fields


def run_in_compute_dtype(
    run: Callable[[Any, Any], tuple[Any, Any]], state: Any, batch: Any
) -> tuple[Any, Any]:
    """``run(state, batch) -> (logs, new_state)`` under the state's ``compute_dtype``: on
    the state with its parameters cast to it and on ``state.compute_inputs(batch)``. The
    logs come back in float32, and the new state with the dtypes of ``state`` (its own
    parameters, unless ``run`` replaced them). Without a compute dtype, ``run(state,
    batch)``.
    """
    dtype = getattr(state, "compute_dtype", None)
    if dtype is None:
        return run(state, batch)
    params = state.params
    computed = cast_floating(params, dtype)
    logs, new_state = run(state.replace(params=computed), state.compute_inputs(batch))
    if new_state.params is computed:  # unchanged: the float32 values, not a round trip
        new_state = new_state.replace(params=params)
    return to_float32(logs), restore_dtypes(new_state, state)


def scale_loss(state: Any, loss: jax.Array) -> jax.Array:
    """``loss`` times the state's loss scale (``loss`` itself without one)."""
    scale: LossScale | None = getattr(state, "loss_scale", None)
    return loss if scale is None else scale.scale_loss(loss)


def unscale_gradients(state: Any, grads: Any) -> Any:
    """``grads`` divided by the state's loss scale (``grads`` itself without one)."""
    scale: LossScale | None = getattr(state, "loss_scale", None)
    return grads if scale is None else scale.unscale(grads)


def apply_scaled_gradients(state: Any, grads: Any) -> Any:
    """``state.apply_gradients(grads)``, and with a loss scale its adjustment: under a
    dynamic scale, gradients that are not all finite leave ``params``, ``opt_state`` and
    ``ema_params`` as they were (``step`` still counts the step)."""
    scale: LossScale | None = getattr(state, "loss_scale", None)
    updated = state.apply_gradients(grads)
    if scale is None:
        return updated
    finite = all_finite(grads)
    if scale.dynamic:

        def select(new: Any, old: Any) -> Any:
            return jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)

        updated = updated.replace(
            **{
                name: select(getattr(updated, name), getattr(state, name))
                for name in ("params", "opt_state", "ema_params")
            }
        )
    return updated.replace(loss_scale=scale.adjust(finite))
