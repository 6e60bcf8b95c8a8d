"""``Adapter``: the record an adapter package registers under ``ciclo.adapters``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["Adapter", "EXTRAS"]

#: The extras an adapter may carry: tables ``{class: function}`` for objects in a state.
EXTRAS = ("restore_in_place", "partition_metadata")

_BAD_EXTRA = "ciclo.adapters.Adapter({!r}): {} maps classes to functions ({}), got {!r}: {!r}."
#: Each extra's function signature, for messages.
EXTRA_SIGNATURES = {
    "restore_in_place": "(original, restored) -> None",
    "partition_metadata": "node -> PartitionSpec | None",
}


@dataclasses.dataclass(frozen=True)
class Adapter:
    """What an adapter package registers under the ``ciclo.adapters`` entry-point group.

    The entry point's name is the framework's import name; an adapter is loaded only once its
    framework is imported.

    Attributes:
        name: the framework's import name (``flax``).
        distribution: the adapter's pip name, for messages (``"ciclo-flax"``).
        handles: ``model -> bool``: whether :attr:`create_state` accepts this model.
        create_state: the factory :func:`ciclo.create_state` forwards to.
        factories: other factories by name (``{"create_nnx_state": ...}``).
        restore_in_place: ``{class: restore_into(original, restored)}`` (see
            :func:`ciclo.adapters.register_restore_in_place`).
        partition_metadata: ``{class: spec_of(node)}`` (see
            :func:`ciclo.managed.register_partition_metadata`).

    Example::

        adapter = ciclo.adapters.Adapter(
            name="myframework", distribution="ciclo-myframework",
            handles=lambda model: isinstance(model, myframework.Module),
            create_state=create_state,
        )
    """

    name: str
    distribution: str
    handles: Callable[[Any], bool]
    create_state: Callable[..., Any]
    factories: Mapping[str, Callable[..., Any]] = dataclasses.field(default_factory=dict)
    restore_in_place: Mapping[type, Callable[[Any, Any], None]] = dataclasses.field(
        default_factory=dict
    )
    partition_metadata: Mapping[type, Callable[[Any], Any]] = dataclasses.field(
        default_factory=dict
    )

    def __post_init__(self) -> None:
        for extra in EXTRAS:
            for key, value in getattr(self, extra).items():
                if not isinstance(key, type) or not callable(value):
                    signature = EXTRA_SIGNATURES[extra]
                    raise TypeError(_BAD_EXTRA.format(self.name, extra, signature, key, value))

    def factory(self, name: str) -> Callable[..., Any] | None:
        """The factory called ``name`` (``"create_state"`` or one of :attr:`factories`)."""
        return self.create_state if name == "create_state" else self.factories.get(name)
