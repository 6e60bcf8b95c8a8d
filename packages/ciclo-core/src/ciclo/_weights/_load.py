"""``ciclo.load_weights`` and ``ciclo.weights_plan``: a state's parameters from another
run's weights, matched by name, every difference decided by a policy and shown in a plan."""

from __future__ import annotations

import inspect
import os
import re
from collections.abc import Callable, Mapping
from typing import Any, ParamSpec, TypeVar

import jax
import jax.numpy as jnp

from .._processes._outputs import OUTPUT_PROCESS, writes_here
from ..managed._ema import initial_ema_params
from ..managed._state import ManagedState
from ..managed._trainable import named_leaves
from ._plan import WeightsPlan
from ._sources import Source, open_source

__all__ = ["load_weights", "weights_plan"]

S = TypeVar("S", bound=ManagedState)
P = ParamSpec("P")
Transform = Callable[[str], str | None] | Mapping[str, str] | None
_POLICIES = ("error", "keep", "ignore")


def _rename(name: str, transform: Transform) -> str | None:
    if transform is None:
        return name
    if callable(transform):
        return transform(name)
    for pattern, replacement in transform.items():
        name = re.sub(pattern, replacement, name)
    return name


def _plan(
    state: Any,
    source: Any,
    transform: Transform,
    missing: str,
    unexpected: str,
    mismatched: str,
    use: str,
    step: Any,
) -> tuple[WeightsPlan, Source]:
    policies = {"missing": missing, "unexpected": unexpected, "mismatched": mismatched}
    if not isinstance(state, ManagedState):
        raise TypeError(f"load_weights needs a ciclo state (create_state), got {type(state)}.")
    for kind, policy in policies.items():
        if policy not in _POLICIES:
            raise ValueError(f"load_weights({kind}={policy!r}): use one of {_POLICIES}.")
    opened = open_source(source, use=use, step=step)
    if not opened.shapes:
        raise ValueError(f"load_weights: {source!r} holds no {use!r} arrays.")
    targets = named_leaves(state.params)
    sources: dict[str, str] = {}  # the state's name: the source's
    ignored: list[str] = []  # the source's names that transform leaves out
    for name in opened.shapes:
        new = _rename(name, transform)
        if new is None:
            ignored.append(name)
        elif new in sources:
            raise ValueError(f"load_weights: transform maps {sources[new]!r}, {name!r} to {new!r}.")
        else:
            sources[new] = name
    found: dict[str, list[str]] = {
        "missing": [t for t in targets if t not in sources],
        "unexpected": [sources[t] for t in sources if t not in targets],
        "mismatched": [],
    }
    loaded, cast, bad = [], [], []
    for name in (t for t in targets if t in sources):
        leaf, saved = targets[name], opened.shapes[sources[name]]
        if saved.shape != leaf.shape or jnp.promote_types(saved.dtype, leaf.dtype) != leaf.dtype:
            bad.append(name)
            found["mismatched"].append(
                f"{name}: state {leaf.shape} {leaf.dtype}, source {saved.shape} {saved.dtype}"
            )
        else:
            loaded.append(name)
            if saved.dtype != leaf.dtype:
                cast.append(f"{name}: {saved.dtype} -> {leaf.dtype}")
    for kind, names in found.items():
        if names and policies[kind] == "error":
            where = repr(source) if isinstance(source, str | os.PathLike) else "the source"
            raise ValueError(
                f"load_weights: {len(names)} {kind} in {where}: {', '.join(names)}. Rename with "
                f"transform=, or pass {kind}='keep' (the state keeps its own)."
            )
    plan = WeightsPlan(
        loaded=loaded,
        kept=found["missing"] + bad,
        ignored=ignored + found["unexpected"] + [sources[b] for b in bad],
        mismatched=found["mismatched"],
        cast=cast,
        sources={name: sources[name] for name in loaded},
    )
    return plan, opened


def load_weights(
    state: S,
    source: Any,
    *,
    transform: Transform = None,
    missing: str = "error",
    unexpected: str = "error",
    mismatched: str = "error",
    use: str = "params",
    step: int | None = None,
) -> S:
    """A new state whose parameters come from ``source``, matched by name (the
    ``/``-joined path, ``"encoder/layers/0/kernel"``), each placed on the sharding of the
    state's (read by parts where the source allows); prints the plan. The optimizer state
    is new (``tx.init``), ``step`` 0, ``ema_params`` the loaded ones; other fields stay.

    Args:
        state: a ciclo state (``create_state``, ``ManagedState.create``) to load into.
        source: a ``ciclo.checkpoint`` directory, an Orbax checkpoint directory
            (``ocp.StandardCheckpointer``), a ``.safetensors`` or Flax ``.msgpack`` file,
            a pytree of arrays, or another state.
        transform: renames the source's names to the state's: a function (``None``
            leaves a name out) or ``{regex: replacement}``, applied in order.
        missing, unexpected, mismatched: parameters only in the state, only in the source,
            or of another shape or a narrowing dtype: ``"error"`` (naming them all),
            ``"keep"`` or ``"ignore"`` (the state keeps its own; the plan lists them).
        use: the field read from a ciclo checkpoint or a state: ``"params"`` or
            ``"ema_params"``.
        step: the checkpoint of a ciclo checkpoint directory (default: the newest).

    Example:
        >>> import ciclo, jax.numpy as jnp, optax
        >>> state = ciclo.managed.ManagedState.create(
        ...     params={"body": jnp.zeros(2)}, tx=optax.sgd(0.1)
        ... )
        >>> source = {"encoder": jnp.ones(2)}
        >>> state = ciclo.load_weights(state, source, transform={"^encoder": "body"})
        weights plan: 1 loaded, 0 kept, 0 ignored, 0 mismatched, 0 cast
          loaded     body
        >>> state.params["body"].tolist()
        [1.0, 1.0]
    """
    plan, opened = _plan(state, source, transform, missing, unexpected, mismatched, use, step)
    if writes_here(OUTPUT_PROCESS):
        print(plan)
    targets = named_leaves(state.params)
    arrays = opened.read({plan.sources[n]: targets[n] for n in plan.loaded})
    leaves = [arrays[plan.sources[n]] if n in plan.sources else x for n, x in targets.items()]
    params = jax.tree_util.tree_unflatten(jax.tree.structure(state.params), leaves)
    new = state.replace(step=jnp.zeros_like(state.step), params=params)
    if state.ema_params is not None:
        new = new.replace(ema_params=initial_ema_params(params))
    return new.with_trainable(state.trainable)


def _planning(load: Callable[P, Any]) -> Callable[P, WeightsPlan]:
    """``load``'s signature, returning the plan instead of loading."""
    signature = inspect.signature(load)

    def weights_plan(*args: P.args, **kwargs: P.kwargs) -> WeightsPlan:
        """What :func:`load_weights` would do, without loading: a :class:`WeightsPlan` (its
        ``str`` is the screen ``load_weights`` prints). Same arguments and errors.

        Example:
            >>> import ciclo, jax.numpy as jnp, optax
            >>> state = ciclo.managed.ManagedState.create(
            ...     params={"body": jnp.zeros(2), "head": jnp.zeros(3)}, tx=optax.sgd(0.1)
            ... )
            >>> print(ciclo.weights_plan(state, {"body": jnp.ones(2)}, missing="keep"))
            weights plan: 1 loaded, 1 kept, 0 ignored, 0 mismatched, 0 cast
              loaded     body
              kept       head
        """
        try:
            given = signature.bind(*args, **kwargs)
        except TypeError as error:  # named as Python names a function's own
            raise TypeError(f"weights_plan() {error}") from None
        given.apply_defaults()
        return _plan(**given.arguments)[0]

    weights_plan.__signature__ = signature.replace(return_annotation=WeightsPlan)  # type: ignore[attr-defined]
    return weights_plan


weights_plan = _planning(load_weights)
