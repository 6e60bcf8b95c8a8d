"""The record core finds under the ``ciclo.adapters`` entry-point group."""

from __future__ import annotations

from typing import Any

import equinox as eqx

import ciclo

from ._state import create_state

__all__ = ["adapter"]


def _handles(model: Any) -> bool:
    # A (model, state) pair from eqx.nn.make_with_state is claimed too, so that
    # ciclo.create_state(pair, ...) gets create_state's error showing how to pass it.
    is_pair = isinstance(model, tuple) and len(model) == 2
    return isinstance(model, eqx.Module) or (
        is_pair and isinstance(model[0], eqx.Module) and isinstance(model[1], eqx.nn.State)
    )


adapter = ciclo.adapters.Adapter(
    name="equinox",
    distribution="ciclo-equinox",
    handles=_handles,
    create_state=create_state,
)
