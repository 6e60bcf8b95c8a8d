"""A state's fields: declared, checked by name (a typo names its close match), and
registered as a pytree (data fields are children, static fields one :class:`Static`)."""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import operator
from collections.abc import Iterable, Sequence
from typing import Any

import jax

from ._static import Static

__all__ = [
    "close_match",
    "create_options",
    "declare_fields",
    "field_names",
    "register_state",
    "unknown_name_error",
]


def close_match(name: str, candidates: Iterable[str]) -> str | None:
    """The candidate closest to ``name`` (a likely typo of it), or ``None``.

    Example:
        >>> close_match("parmas", ["params", "step", "tx"])
        'params'
    """
    matches = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return matches[0] if matches else None


_EXTRA_ON_PURPOSE = (
    " To add an extra field of that name on purpose, pass extra={{{name!r}: ...}} "
    "(or declare it in a subclass)."
)
_FIELDS_ARE_DECLARED = (
    " Fields are declared, not added by replace(): declare {name!r} as a field of a "
    "subclass, or at create(..., extra={{{name!r}: ...}})."
)


def unknown_name_error(
    where: str, kind: str, name: str, candidates: Sequence[str], *, extra_hint: bool | None
) -> TypeError:
    """The error for an unknown keyword or field ``name`` given to ``where``, naming the
    close match among ``candidates`` if there is one.

    ``extra_hint``: ``True`` adds how to declare an extra field of that name on purpose
    (``extra=``), ``None`` how to declare one at all, ``False`` lists the accepted names.

    Example:
        >>> print(unknown_name_error("f()", "keyword", "stratgey", ["strategy"], extra_hint=False))
        f() got an unknown keyword 'stratgey'; did you mean 'strategy'? It takes: ['strategy'].
    """
    match = close_match(name, candidates)
    message = f"{where} got an unknown {kind} {name!r}" + (
        f"; did you mean {match!r}?" if match else "."
    )
    if extra_hint is True:
        message += _EXTRA_ON_PURPOSE.format(name=name)
    elif extra_hint is None:
        message += _FIELDS_ARE_DECLARED.format(name=name)
    else:
        message += f" It takes: {sorted(candidates)}."
    return TypeError(message)


_FIELD_NAMES: dict[type, frozenset[str]] = {}
_CREATE_OPTIONS: dict[type, frozenset[str]] = {}
_DECLARED: set[type] = set()


def field_names(cls: type) -> frozenset[str]:
    """The names of the dataclass fields of ``cls`` (cached)."""
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = frozenset(f.name for f in dataclasses.fields(cls))
    return names


def create_options(cls: type) -> frozenset[str]:
    """The named keywords of ``cls.create`` (every class up the MRO), for close matches."""
    options = _CREATE_OPTIONS.get(cls)
    if options is None:
        names: set[str] = set()
        for klass in cls.__mro__:
            create = klass.__dict__.get("create")
            if isinstance(create, classmethod):
                parameters = inspect.signature(create.__func__).parameters.values()
                names |= {p.name for p in parameters if p.kind is p.KEYWORD_ONLY}
        options = _CREATE_OPTIONS[cls] = frozenset(names)
    return options


def declare_fields(cls: type, base: type) -> None:
    """Makes the annotated fields of undecorated subclasses of ``base`` fields (as in the
    original ciclo, whose states were flax ``struct`` dataclasses): each class up the MRO
    that annotates fields without being a dataclass itself becomes a
    ``dataclass(frozen=True, kw_only=True)``, so ``create`` checks them like the built-in
    ones."""
    if cls in _DECLARED:
        return
    for klass in reversed(cls.__mro__):
        if (
            issubclass(klass, base)
            and inspect.get_annotations(klass)
            and "__dataclass_fields__" not in klass.__dict__
        ):
            dataclasses.dataclass(frozen=True, kw_only=True)(klass)
    _DECLARED.add(cls)


def _is_static(field: dataclasses.Field[Any]) -> bool:
    """A static field: ``metadata={"static": True}``, or flax's
    ``struct.field(pytree_node=False)``."""
    return bool(field.metadata.get("static", False)) or field.metadata.get("pytree_node") is False


#: The key of a state's :class:`Static` node data in its ``__dict__``.
_NODE_DATA = "__ciclo_static__"

_UNHASHABLE_STATIC = (
    "{cls}: the static field {name!r} holds an unhashable {type} ({value!r}), and a compiled "
    "step hashes static fields to find its compiled version. Make it hashable (a tuple, a "
    "frozen dataclass), hold it in a ciclo.adapters.Static (compared by identity), or make "
    "it a data field (arrays)."
)


def register_state(cls: type) -> None:
    """Registers the state class ``cls`` as a pytree: data fields are its children, its
    static fields one :class:`Static` (hashed once per state; a compiled step's output
    state carries its input's, so the step finds its compiled version by identity).

    Unflattening (a compiled step's output state) fills the instance's ``__dict__``
    directly, without ``__init__``: the fields were checked when the state was built, and
    a frozen dataclass's ``__init__`` costs microseconds per step (as would
    ``jax.tree_util.register_dataclass``, which calls it).
    """
    fields = dataclasses.fields(cls)
    meta = tuple(f.name for f in fields if _is_static(f))
    data = tuple(f.name for f in fields if not _is_static(f))
    keys = tuple(jax.tree_util.GetAttrKey(name) for name in data)
    new, set_attribute = object.__new__, object.__setattr__
    # The static part of an unflattened state's __dict__, by node data (a loop's steps
    # unflatten with the same one).
    static_parts: dict[Static, dict[str, Any]] = {}

    def node_data(state: Any) -> Static:
        values = state.__dict__
        static: Static | None = values.get(_NODE_DATA)
        if static is None:
            static = values[_NODE_DATA] = Static(tuple(values[n] for n in meta))
            if not static.hashable:
                _raise_unhashable(cls, meta, static.value)
        return static

    children = operator.itemgetter(*data)  # one C call (data has at least 5 fields)

    def flatten(state: Any) -> tuple[tuple[Any, ...], Static]:
        values = state.__dict__
        return children(values), values.get(_NODE_DATA) or node_data(state)

    def flatten_with_keys(state: Any) -> tuple[list[tuple[Any, Any]], Static]:
        values = state.__dict__
        return [(k, values[n]) for k, n in zip(keys, data, strict=True)], node_data(state)

    def unflatten(static: Static, children: Iterable[Any]) -> Any:
        part = static_parts.get(static)
        if part is None:
            if len(static_parts) >= 64:
                static_parts.clear()
            part = static_parts[static] = dict(zip(meta, static.value, strict=True))
            part[_NODE_DATA] = static
        state: Any = new(cls)
        values = part.copy()
        values.update(zip(data, children, strict=True))
        set_attribute(state, "__dict__", values)
        return state

    jax.tree_util.register_pytree_with_keys(cls, flatten_with_keys, unflatten, flatten)


def _raise_unhashable(cls: type, names: tuple[str, ...], values: tuple[Any, ...]) -> None:
    for name, value in zip(names, values, strict=True):
        try:
            hash(value)
        except TypeError:
            raise TypeError(
                _UNHASHABLE_STATIC.format(
                    cls=cls.__name__, name=name, type=type(value).__name__, value=value
                )
            ) from None
