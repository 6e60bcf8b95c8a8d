"""The record core finds under the ``ciclo.adapters`` entry-point group."""

from __future__ import annotations

from typing import Any

import equinox as eqx

import ciclo

from ._state import create_state

__all__ = ["adapter"]


def _handles(model: Any) -> bool:
    return isinstance(model, eqx.Module)


adapter = ciclo.adapters.Adapter(
    name="equinox",
    distribution="ciclo-equinox",
    handles=_handles,
    create_state=create_state,
)
