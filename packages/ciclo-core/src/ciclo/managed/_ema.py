"""Averaged weights: ``ema_params <- decay * ema_params + (1 - decay) * params`` after each
optimizer update, a field of the state (fused, placed, checkpointed like the parameters).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["as_ema_decay", "ema_fields", "initial_ema_params", "update_ema"]


def as_ema_decay(value: Any) -> float | None:
    """The checked ``ema`` option of a state: ``None`` (no average) or a decay in [0, 1).

    Example:
        >>> as_ema_decay(0.999)
        0.999
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1:
        raise ValueError(_NOT_A_DECAY.format(value=value))
    return float(value)


def initial_ema_params(params: Any) -> Any:
    """A copy of ``params`` with its own buffers (never donated twice).

    Example:
        >>> import jax.numpy as jnp
        >>> initial_ema_params({"w": jnp.ones(2)})["w"].tolist()
        [1.0, 1.0]
    """
    return jax.tree.map(lambda p: jnp.array(p, copy=True), params)


def ema_fields(params: Any, ema: Any) -> dict[str, Any]:
    """The fields ``ema_decay`` and ``ema_params`` of a new state (none without ``ema``).

    Example:
        >>> import jax.numpy as jnp
        >>> sorted(ema_fields({"w": jnp.ones(2)}, 0.9))
        ['ema_decay', 'ema_params']
    """
    decay = as_ema_decay(ema)
    if decay is None:
        return {}
    return {"ema_decay": decay, "ema_params": initial_ema_params(params)}


def update_ema(state: Any) -> Any:
    """``state`` with ``ema_params`` moved towards ``params`` by ``1 - ema_decay``.

    Example:
        >>> import ciclo, jax.numpy as jnp, optax
        >>> state = ciclo.managed.ManagedState.create(
        ...     params={"w": jnp.zeros(1)}, tx=optax.sgd(1.0), ema=0.9
        ... )
        >>> state = state.apply_gradients({"w": -jnp.ones(1)})  # params: 1.0
        >>> state.ema_params["w"].tolist()
        [0.10000000149011612]
    """
    decay = getattr(state, "ema_decay", None)
    if decay is None:
        return state

    def move(average: Any, param: Any) -> Any:
        average = jnp.asarray(average)
        return (average + (1.0 - decay) * (jnp.asarray(param, average.dtype) - average)).astype(
            average.dtype
        )

    return state.replace(ema_params=jax.tree.map(move, state.ema_params, state.params))


_NOT_A_DECAY = "ema={value!r}: give the decay of the parameters' average in [0, 1), or None."
