"""Losses and metrics a model records itself, for Linen and NNX alike.

A Linen module sows into the ``losses`` and ``metrics`` collections (``self.sow("losses",
"l2", value)``); an NNX module sows :class:`SownLoss` and :class:`SownMetric` variables
(``self.sow(ciclo_flax.SownLoss, "l2", value)``, or ``self.sow("losses", ...)`` as in
Linen). Either way the step turns them into logs with :func:`sown_logs`, one rule for both:
each value is named by its variable's name (its path, ``"blocks/0/l2"``, when several
modules sow the same name), reduced to a scalar by its mean; a name sown several times in
one call is summed (losses) or averaged (metrics). Sown losses add to the objective.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from typing import Any

import jax.numpy as jnp
from flax import nnx

import ciclo

__all__ = ["SOWN", "SownLoss", "SownMetric", "call_recording", "drop_sown", "sown_logs"]

#: The Linen collections (and NNX variable names) whose values a model records as logs.
SOWN = ("losses", "metrics")


class SownLoss(nnx.Intermediate):  # type: ignore[type-arg]
    """The type of a loss an NNX module records: ``self.sow(ciclo_flax.SownLoss, "l2",
    value)`` in ``__call__`` logs ``value`` under ``logs.losses.l2`` and adds it to the
    objective that ``train_step`` differentiates. Recorded anew at every call, never kept
    in the state. ``self.sow("losses", ...)`` is the same.

    Example:
        >>> import ciclo_flax, jax.numpy as jnp
        >>> from flax import nnx
        >>> class Model(nnx.Module):
        ...     def __init__(self, rngs):
        ...         self.linear = nnx.Linear(4, 3, rngs=rngs)
        ...     def __call__(self, x):
        ...         l2 = 1e-3 * jnp.sum(self.linear.kernel[...] ** 2)
        ...         self.sow(ciclo_flax.SownLoss, "l2", l2)
        ...         return self.linear(x)
        >>> outputs, sown = call_recording(Model(nnx.Rngs(0)), jnp.ones((2, 4)), {})
        >>> list(sown.losses)
        ['l2']
    """


class SownMetric(nnx.Intermediate):  # type: ignore[type-arg]
    """The type of a metric an NNX module records: ``self.sow(ciclo_flax.SownMetric,
    "gate_entropy", value)`` logs ``value`` under ``logs.metrics.gate_entropy``, in training
    and evaluation. ``self.sow("metrics", ...)`` is the same.

    Example:
        >>> import ciclo_flax
        >>> from flax import nnx
        >>> issubclass(ciclo_flax.SownMetric, nnx.Intermediate)
        True
    """


def _register_names() -> None:
    # ``self.sow("losses", ...)`` resolves the name through NNX's registry of Linen
    # collection names; a name another library registered first is left to it (its type
    # is recorded too, see _recorded_types).
    for name, kind in zip(SOWN, (SownLoss, SownMetric), strict=True):
        with contextlib.suppress(ValueError):
            nnx.register_variable_name(name, kind)


_register_names()


def _recorded_types() -> dict[type[nnx.Variable[Any]], str]:
    """``{variable type: collection}``: ours, and whatever type ``"losses"`` and
    ``"metrics"`` name in NNX's registry (one a user registered before ours)."""
    types: dict[type[nnx.Variable[Any]], str] = {SownLoss: "losses", SownMetric: "metrics"}
    for collection in SOWN:
        with contextlib.suppress(ValueError):
            types.setdefault(nnx.variable_type_from_name(collection), collection)
    return types


#: ``nnx.capture`` (newer Flax); without it sown variables are popped after the call.
_capture = getattr(nnx, "capture", None)


def call_recording(model: Any, inputs: Any, kwargs: Mapping[str, Any]) -> tuple[Any, ciclo.Logs]:
    """Calls an NNX ``model(inputs, **kwargs)`` and returns ``(outputs, sown)``: the losses
    and metrics it sowed, as logs (:func:`sown_logs`). The model keeps none of them: they are
    collected with ``nnx.capture``, so each call starts empty and the model's state never
    holds them (values sown with other types, ``nnx.Intermediate``, are not kept either).

    Example: see :class:`SownLoss`.
    """
    types = _recorded_types()
    if _capture is not None:
        outputs, *states = _capture(model, *types)(inputs, **kwargs)
    else:  # older Flax: sow stores a variable on the module; take them all off again
        outputs = model(inputs, **kwargs)
        *states, _ = nnx.pop(model, *types, nnx.Intermediate)
    flat: dict[str, list[tuple[tuple[Any, ...], Any]]] = {}
    for collection, state in zip(types.values(), states, strict=True):
        flat.setdefault(collection, []).extend(
            (path, variable.get_value()) for path, variable in nnx.to_flat_state(state)
        )
    return outputs, sown_logs(flat)


def drop_sown(model: nnx.Module) -> nnx.Module:
    """``model`` without the values it sowed in calls outside ciclo (``SownLoss``,
    ``SownMetric``, ``nnx.Intermediate``...): a copy when it holds any, as the model passed
    in is never modified."""
    types = (*_recorded_types(), nnx.Intermediate)
    if not any(True for _ in nnx.to_flat_state(nnx.state(model, types))):
        return model
    model = nnx.clone(model)
    nnx.pop(model, types)
    return model


def sown_logs(collections: Mapping[str, Iterable[tuple[tuple[Any, ...], Any]]]) -> ciclo.Logs:
    """The recorded losses and metrics as logs. ``collections`` maps ``"losses"`` and
    ``"metrics"`` to ``(path, value)`` pairs, ``value`` a tuple of the values sown in one
    call (Flax's default ``sow``) or one value (``put_variable``, a custom ``reduce_fn``).
    Each entry is named by the last part of its path (the whole path, joined by ``/``,
    when two paths end alike); each value is reduced by its mean; several are summed
    (losses) or averaged (metrics).

    Example:
        >>> import jax.numpy as jnp
        >>> sown_logs({"losses": [(("Dense_0", "l2"), (jnp.array(2.0), jnp.array(1.0)))]})
        {'losses': {'l2': Array(3., dtype=float32)}}
    """
    logs = ciclo.logs()
    for collection, entries in collections.items():
        entries = list(entries)
        last = [path[-1] for path, _ in entries]
        for path, value in entries:
            name = str(path[-1]) if last.count(path[-1]) == 1 else "/".join(map(str, path))
            parts = value if isinstance(value, tuple) else (value,)
            if not parts:
                continue
            means = [jnp.mean(jnp.asarray(part)) for part in parts]
            total = sum(means[1:], means[0])
            logs.add_entry(
                collection, name, total if collection == "losses" else total / len(parts)
            )
    return logs
