"""The record core finds under the ``ciclo.adapters`` entry-point group."""

from __future__ import annotations

from typing import Any

import haiku as hk

import ciclo

from ._state import create_state

__all__ = ["adapter"]


def _handles(model: Any) -> bool:
    """``ciclo.create_state`` recognizes transformed Haiku models (a plain function could
    be anything: build those with ``ciclo.create_haiku_state``)."""
    return isinstance(model, hk.Transformed | hk.TransformedWithState)


adapter = ciclo.adapters.Adapter(
    name="haiku",
    distribution="ciclo-haiku",
    handles=_handles,
    create_state=create_state,
)
