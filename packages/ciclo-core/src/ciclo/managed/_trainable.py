"""Which parameters train (``trainable=``): parameters named by ``/``-joined paths, the
filter as a mask over the leaves of ``params``, the optimizer that keeps no state for the
frozen ones, and the trainable part that gradients are taken with respect to."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import jax
import optax  # type: ignore[import-untyped]

from ._sharding import key_path

__all__ = [
    "keep_frozen",
    "masked_optimizer",
    "named_leaves",
    "param_name",
    "trainable_mask",
    "trainable_part",
    "with_part",
]

#: A mask over the leaves of ``params`` (``True``: trained), or ``None``: all are trained.
Mask = tuple[bool, ...] | None


def param_name(path: Any) -> str:
    """A parameter's name: its path ``/``-joined (``encoder/layers/0/kernel``), without the
    ``value`` of a variable's box (an NNX ``Param``, as ``nnx.state`` saves it).

    Example:
        >>> import jax
        >>> (path, _), = jax.tree_util.tree_flatten_with_path({"dense": {"kernel": 0.0}})[0]
        >>> param_name(path)
        'dense/kernel'
    """
    name = key_path(path)
    return name[: -len("/value")] if name.endswith("/value") else name


def named_leaves(tree: Any) -> dict[str, Any]:
    """``{name: leaf}`` for the leaves of ``tree``, in its order."""
    return {param_name(p): leaf for p, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def trainable_mask(params: Any, trainable: str | Callable[[str], bool] | None) -> Mask:
    """Which leaves of ``params`` the filter selects: a regex searched in each name, or a
    function of the name.

    Raises:
        TypeError: ``trainable`` is neither; ValueError: it selects no parameter.
    """
    if trainable is None:
        return None
    selects: Callable[[str], Any]
    if isinstance(trainable, str | re.Pattern):
        selects = re.compile(trainable).search
    elif callable(trainable):
        selects = trainable
    else:
        raise TypeError(f"trainable={trainable!r}: give a regex of names or a function of one.")
    names = list(named_leaves(params))
    mask = tuple(bool(selects(name)) for name in names)
    if not any(mask):
        raise ValueError(f"trainable={trainable!r} selects no parameter; names: {names[:5]}.")
    return None if all(mask) else mask


def masked_optimizer(tx: Any, mask: Mask) -> Any:
    """``tx`` for the trained leaves, zero updates and no state for the frozen ones
    (``optax.multi_transform`` with ``optax.set_to_zero``: its frozen part is empty)."""
    if mask is None or tx is None:
        return tx

    def labels(params: Any) -> Any:
        treedef = jax.tree_util.tree_structure(params)
        return jax.tree_util.tree_unflatten(treedef, ["train" if m else "frozen" for m in mask])

    return optax.multi_transform({"train": tx, "frozen": optax.set_to_zero()}, labels)


def trainable_part(params: Any, mask: Mask) -> Any:
    """What gradients are taken with respect to: ``params``, or the list of its trained
    leaves (the frozen ones are constants: JAX computes no gradient for them)."""
    if mask is None:
        return params
    return [leaf for leaf, m in zip(jax.tree.leaves(params), mask, strict=True) if m]


def with_part(params: Any, mask: Mask, part: Any, fill: Callable[[Any], Any] | None = None) -> Any:
    """``params`` with the trained leaves from ``part`` (a :func:`trainable_part`); the
    frozen ones as they are, or ``fill(leaf)`` (zeros for gradients)."""
    if mask is None:
        return part
    leaves, treedef = jax.tree.flatten(params)
    trained = iter(part)
    chosen = [
        next(trained) if m else (fill(x) if fill else x) for x, m in zip(leaves, mask, strict=True)
    ]
    return jax.tree_util.tree_unflatten(treedef, chosen)


def keep_frozen(mask: Mask, new: Any, old: Any) -> Any:
    """``new`` params with the frozen leaves of ``old``, bit for bit."""
    return new if mask is None else with_part(old, mask, trainable_part(new, mask))
