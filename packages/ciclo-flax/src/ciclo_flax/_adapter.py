"""The record core finds under the ``ciclo.adapters`` entry-point group: the factories, and
the extras core reads when flax is imported (NNX objects restored in place, Flax's
partitioning metadata)."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
from flax import nnx

import ciclo

from ._in_place import RESTORE_IN_PLACE
from ._linen import create_state as create_linen_state
from ._nnx import create_nnx_state
from ._partitioning import PARTITION_METADATA

__all__ = ["adapter"]


def _handles(model: Any) -> bool:
    return isinstance(model, nn.Module | nnx.Module)


def _create_state(model: Any, *args: Any, **kwargs: Any) -> Any:
    """``ciclo.create_state``: Linen modules and NNX models each to their factory."""
    if isinstance(model, nnx.Module):
        return create_nnx_state(model, *args, **kwargs)
    return create_linen_state(model, *args, **kwargs)


adapter = ciclo.adapters.Adapter(
    name="flax",
    distribution="ciclo-flax",
    handles=_handles,
    create_state=_create_state,
    factories={"create_nnx_state": create_nnx_state},
    restore_in_place=RESTORE_IN_PLACE,
    partition_metadata=PARTITION_METADATA,
)
