"""Flax's partitioning metadata for ciclo's sharded strategies.

Linen's ``nn.with_partitioning`` / ``nn.with_logical_partitioning`` box parameters in
``nn.Partitioned`` / ``nn.LogicallyPartitioned``; NNX keeps ``out_sharding`` (and
``sharding_rules``) in each ``nnx.Variable``'s metadata. Both are pytree nodes that wrap the
arrays, so they travel with the parameters into gradients and optimizer states;
:func:`register` teaches ``ciclo.managed.sharded`` / ``fsdp`` to read them, so an annotated
model needs no rules.
"""

from __future__ import annotations

from typing import Any

import jax

import ciclo

__all__ = ["register"]


def _linen_spec(node: Any) -> jax.sharding.PartitionSpec:
    import flax.linen as nn

    if isinstance(node, nn.LogicallyPartitioned):
        # Logical names go through the node's rules, else those of nn.logical_axis_rules(...).
        spec: jax.sharding.PartitionSpec = nn.logical_to_mesh_axes(node.names, node.rules)
        return spec
    return node.get_partition_spec()  # type: ignore[no-any-return]


def _nnx_spec(variable: Any) -> jax.sharding.PartitionSpec | None:
    from flax.nnx import spmd

    return spmd.get_var_pspec(variable)


def register() -> None:
    """Registers Flax's annotated nodes with :func:`ciclo.managed.register_partition_metadata`
    (done on ``import ciclo_flax``, and by core through the ``ciclo.partition_metadata``
    entry point when a sharded strategy first places a state).

    Example:
        >>> import ciclo, ciclo_flax, flax.linen as nn, jax.numpy as jnp
        >>> boxed = nn.Partitioned(jnp.zeros((8, 4)), names=("data", None))
        >>> ciclo.managed.partition_specs({"kernel": boxed})["kernel"].value
        P('data',)
    """
    from flax import nnx
    from flax.core import meta

    ciclo.managed.register_partition_metadata(meta.Partitioned, _linen_spec)
    ciclo.managed.register_partition_metadata(nnx.Variable, _nnx_spec)


register()  # on import of ciclo_flax
