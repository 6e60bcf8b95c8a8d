"""A state's fields: declared (annotations of undecorated subclasses too) and checked by
name, a typo naming its close match."""

from __future__ import annotations

import dataclasses
import difflib
import inspect
from collections.abc import Iterable, Sequence

__all__ = [
    "close_match",
    "create_options",
    "declare_fields",
    "field_names",
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
