"""``Adapter``: the record an adapter package registers under the ``ciclo.adapters``
entry-point group, the one way a package plugs into ciclo."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["Adapter", "EXTRAS"]

#: The extras an adapter may carry: tables ``{class: function}`` that core reads when it
#: meets objects of those classes (subclasses too) in a state.
EXTRAS = ("restore_in_place", "partition_metadata")

_BAD_EXTRA = (
    "ciclo.adapters.Adapter({name!r}): {extra} maps classes to functions ({signature}), "
    "got {key!r}: {value!r}. Example: {extra}={{{example}}}."
)
#: Each extra's function signature and an example entry, for messages.
EXTRA_SIGNATURES = {
    "restore_in_place": ("(original, restored) -> None", "nnx.Module: update_in_place"),
    "partition_metadata": ("node -> PartitionSpec | None", "nn.Partitioned: spec_of"),
}


@dataclasses.dataclass(frozen=True)
class Adapter:
    """What an adapter package registers under the ``ciclo.adapters`` entry-point group.

    The entry point's name is the import name of the framework (``flax``, ``haiku``,
    ``equinox``): :func:`ciclo.create_state` only loads adapters whose framework is already
    imported, so building a state never imports another framework; core reads the extras
    (:attr:`restore_in_place`, :attr:`partition_metadata`) of the adapters whose framework
    is imported, the first time it needs them (a state cannot hold objects of a framework
    that is not imported).

    Attributes:
        name: the framework's import name (the entry point's name).
        distribution: the adapter's pip name, for error messages (``"ciclo-flax"``).
        handles: ``model -> bool``: whether :attr:`create_state` accepts this model.
        create_state: ``create_state(model, ...)``, the factory :func:`ciclo.create_state`
            forwards to.
        factories: other public factories by name (``{"create_nnx_state": ...}``), found
            by the lazy forwards of ``ciclo``.
        restore_in_place: ``{class: restore_into}``: objects of these classes in a loop's
            state are updated in place when the loop resumes, ``restore_into(original,
            restored)`` copying the checkpoint's values into the object the state held
            (mutable models captured by a step's closure, as NNX's are); see
            :func:`ciclo.adapters.register_restore_in_place`.
        partition_metadata: ``{class: spec_of}``: pytree nodes carrying sharding
            annotations, and ``spec_of(node) -> PartitionSpec | None``, read by the sharded
            strategies; see :func:`ciclo.managed.register_partition_metadata`.

    Example (in ``my_adapter/__init__.py``, with ``[project.entry-points."ciclo.adapters"]
    myframework = "my_adapter:adapter"`` in its ``pyproject.toml``)::

        adapter = ciclo.adapters.Adapter(
            name="myframework",
            distribution="ciclo-myframework",
            handles=lambda model: isinstance(model, myframework.Module),
            create_state=create_state,
            restore_in_place={myframework.Module: myframework.update},
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
                    signature, example = EXTRA_SIGNATURES[extra]
                    raise TypeError(
                        _BAD_EXTRA.format(
                            name=self.name,
                            extra=extra,
                            signature=signature,
                            key=key,
                            value=value,
                            example=example,
                        )
                    )

    def factory(self, name: str) -> Callable[..., Any] | None:
        """The factory called ``name`` (``"create_state"`` or one of :attr:`factories`)."""
        if name == "create_state":
            return self.create_state
        return self.factories.get(name)
