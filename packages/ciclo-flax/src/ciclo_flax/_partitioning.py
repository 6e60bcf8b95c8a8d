"""Flax's partitioning metadata for ciclo's sharded strategies.

Linen's ``nn.with_partitioning`` / ``nn.with_logical_partitioning`` box parameters in
``nn.Partitioned`` / ``nn.LogicallyPartitioned``; NNX keeps ``out_sharding`` (and
``sharding_rules``) in each ``nnx.Variable``'s metadata. Both are pytree nodes that wrap the
arrays, so they travel with the parameters into gradients and optimizer states;
:data:`PARTITION_METADATA`, on the adapter's record, teaches ``ciclo.managed.sharded`` /
``fsdp`` to read them, so an annotated model needs no rules.
"""

from __future__ import annotations

from typing import Any

import jax
from flax import nnx
from flax.core import meta

__all__ = ["PARTITION_METADATA"]


def _linen_spec(node: Any) -> jax.sharding.PartitionSpec:
    """The ``PartitionSpec`` of a Linen ``nn.Partitioned`` box (logical names through the
    rules of the box, else of ``nn.logical_axis_rules(...)``).

    Example:
        >>> import ciclo, ciclo_flax, flax.linen as nn, jax.numpy as jnp
        >>> boxed = nn.Partitioned(jnp.zeros((8, 4)), names=("data", None))
        >>> ciclo.managed.partition_specs({"kernel": boxed})["kernel"].value
        P('data',)
    """
    import flax.linen as nn

    if isinstance(node, nn.LogicallyPartitioned):
        # Logical names go through the node's rules, else those of nn.logical_axis_rules(...).
        spec: jax.sharding.PartitionSpec = nn.logical_to_mesh_axes(node.names, node.rules)
        return spec
    return node.get_partition_spec()  # type: ignore[no-any-return]


def _nnx_spec(variable: Any) -> jax.sharding.PartitionSpec | None:
    from flax.nnx import spmd

    return spmd.get_var_pspec(variable)


#: Flax's annotated nodes, each with how its ``PartitionSpec`` is read
#: (``Adapter.partition_metadata``).
PARTITION_METADATA: dict[type, Any] = {meta.Partitioned: _linen_spec, nnx.Variable: _nnx_spec}
