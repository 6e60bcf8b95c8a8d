"""Logs: nested ``collection -> name -> value`` dictionaries that stay on device."""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any

import jax

__all__ = ["PARAMS_FINITE", "Logs", "empty_logs", "logs"]

#: ``(collection, name)`` of what a managed train step logs: 1 while its updated parameters
#: are all finite, else 0 (the NaN guards read it; bars and loggers do not show outputs).
PARAMS_FINITE = ("outputs", "params_finite")

_WRITE_ONLY = "Logs.updates is write-only: `logs.updates = other` merges; use entry_value."


class _CollectionView(MutableMapping[str, Any]):
    """``logs.<collection>``: a view of the collection's dict with attribute access."""

    __slots__ = ("_entries",)

    def __init__(self, entries: dict[str, Any]) -> None:
        self._entries = entries

    def __getattr__(self, name: str) -> Any:
        try:
            return self._entries[name]
        except KeyError:
            entries = sorted(self._entries)
            raise AttributeError(
                f"no entry {name!r} in this collection; entries: {entries}"
            ) from None

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "_entries":
            object.__setattr__(self, name, value)
        else:
            self._entries[name] = value

    def __getitem__(self, name: str) -> Any:
        return self._entries[name]

    def __setitem__(self, name: str, value: Any) -> None:
        self._entries[name] = value

    def __delitem__(self, name: str) -> None:
        del self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return repr(self._entries)


_NOT_A_NUMBER = (
    "logs().{}({!r}, {!r}): the value is a {}; log text with add_entry('text', {!r}, ...) "
    "or add_output."
)


class Logs(dict[str, Any]):
    """Nested logs ``{collection: {name: value}}``, a JAX pytree whose values stay on device.

    Example:
        >>> import ciclo
        >>> logs = ciclo.logs().add_loss("loss", 0.5).add_metric("accuracy", 0.9)
        >>> logs.losses.loss, logs.entry_value("accuracy")
        (0.5, 0.9)
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if not args and not kwargs:  # empty (as made once per step): nothing to fill
            return
        super().__init__()
        for collection, entries in dict(*args, **kwargs).items():
            self._set_collection(collection, entries)

    def _set_collection(self, collection: str, entries: Any) -> None:
        if not isinstance(entries, Mapping):
            kind = type(entries).__name__
            raise TypeError(f"Logs collection {collection!r} must be a mapping, got {kind}.")
        dict.__setitem__(self, collection, dict(entries))

    def __setitem__(self, collection: str, entries: Any) -> None:
        self._set_collection(collection, entries)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if name == "updates":  # the property's getter raised; Python then asks us
            raise AttributeError(_WRITE_ONLY)
        try:
            return _CollectionView(self[name])
        except KeyError:
            raise AttributeError(
                f"Logs has no collection {name!r}; collections: {sorted(self)}"
            ) from None

    def add_entry(self, collection: str, name: str, value: Any) -> Logs:
        """Sets ``self[collection][name] = value`` and returns ``self``."""
        entries = self.get(collection)
        if entries is None:
            entries = {}
            dict.__setitem__(self, collection, entries)
        entries[name] = value
        return self

    def add_loss(self, name: str, value: Any) -> Logs:
        """Adds a loss; managed train steps differentiate the sum of all losses."""
        return self._add_number("add_loss", "losses", name, value)

    def add_metric(self, name: str, value: Any) -> Logs:
        """Adds a metric (averaged over an evaluation, weighted by samples)."""
        return self._add_number("add_metric", "metrics", name, value)

    def add_stateful_metric(self, name: str, value: Any) -> Logs:
        """Adds a metric that already accumulates over steps (reported as is)."""
        return self._add_number("add_stateful_metric", "stateful_metrics", name, value)

    def _add_number(self, method: str, collection: str, name: str, value: Any) -> Logs:
        if isinstance(value, str | bytes):
            raise TypeError(_NOT_A_NUMBER.format(method, name, value, type(value).__name__, name))
        return self.add_entry(collection, name, value)

    def add_output(self, name: str, value: Any) -> Logs:
        """Adds a model output (e.g. predictions)."""
        return self.add_entry("outputs", name, value)

    def add_losses(self, **values: Any) -> Logs:
        """Adds several losses by name: ``logs.add_losses(loss=l, l2=r)``."""
        for name, value in values.items():
            self.add_loss(name, value)
        return self

    def add_metrics(self, **values: Any) -> Logs:
        """Adds several metrics by name: ``logs.add_metrics(accuracy=a, f1=f)``.

        Example:
            >>> import ciclo
            >>> ciclo.logs().add_metrics(accuracy=0.9, f1=0.8)
            {'metrics': {'accuracy': 0.9, 'f1': 0.8}}
        """
        for name, value in values.items():
            self.add_metric(name, value)
        return self

    def add_stateful_metrics(self, **values: Any) -> Logs:
        """Adds several stateful metrics by name."""
        for name, value in values.items():
            self.add_stateful_metric(name, value)
        return self

    def add_outputs(self, **values: Any) -> Logs:
        """Adds several outputs by name."""
        return self.add_entries("outputs", **values)

    def add_entries(self, collection: str, **values: Any) -> Logs:
        """Adds several entries of ``collection`` by name."""
        for name, value in values.items():
            self.add_entry(collection, name, value)
        return self

    def merge(self, other: Mapping[str, Any] | None) -> Logs:
        """Merges ``other`` into ``self`` in place (entries of ``other`` win); returns ``self``."""
        if other is None:
            return self
        for collection, entries in other.items():
            if type(entries) is not dict and not isinstance(entries, Mapping):
                found = f"collection {collection!r} is a {type(entries).__name__}"
                raise TypeError(f"cannot merge logs: {found}, not a mapping.")
            mine = self.get(collection)
            if mine is None:
                dict.__setitem__(self, collection, dict(entries))
            else:
                mine.update(entries)
        return self

    @property
    def updates(self) -> None:
        """Write-only: ``logs.updates = other`` merges ``other`` into ``logs``."""
        raise AttributeError(_WRITE_ONLY)

    @updates.setter
    def updates(self, other: Mapping[str, Any] | None) -> None:
        self.merge(other)

    def entries(self) -> Iterator[tuple[str, str, Any]]:
        """Yields ``(collection, name, value)`` for every entry."""
        for collection, entries in self.items():
            for name, value in entries.items():
                yield collection, name, value

    def entry_value(self, key: str) -> Any:
        """The value of ``"name"`` (in one collection) or ``"collection.name"``, else KeyError."""
        if "." in key:
            collection, name = key.split(".", 1)
            if collection in self and name in self[collection]:
                return self[collection][name]
            raise KeyError(f"no log entry {key!r}; entries: {self._keys()}")
        found = [c for c, entries in self.items() if key in entries]
        if not found:
            raise KeyError(f"no log entry {key!r}; entries: {self._keys()}")
        if len(found) > 1:
            names = [f"{c}.{key}" for c in found]
            raise KeyError(f"log entry {key!r} is ambiguous; use one of {names}.")
        return self[found[0]][key]

    def _keys(self) -> list[str]:
        return [f"{c}.{n}" for c, n, _ in self.entries()]

    def copy(self) -> Logs:
        """A copy two levels deep (values are shared)."""
        return Logs({c: dict(e) for c, e in self.items()})


def logs(*args: Any, **kwargs: Any) -> Logs:
    """Creates a :class:`Logs`.

    Example:
        >>> import ciclo
        >>> ciclo.logs().add_metric("accuracy", 1.0)
        {'metrics': {'accuracy': 1.0}}
    """
    return Logs(*args, **kwargs)


def _flatten_logs(value: Logs) -> tuple[tuple[dict[str, Any], ...], tuple[str, ...]]:
    keys = tuple(sorted(value))
    return tuple([value[k] for k in keys]), keys


def _flatten_logs_with_keys(value: Logs) -> tuple[tuple[tuple[Any, Any], ...], tuple[str, ...]]:
    keys = tuple(sorted(value))
    return tuple((jax.tree_util.DictKey(k), value[k]) for k in keys), keys


def _unflatten_logs(keys: tuple[str, ...], children: Any) -> Logs:
    out = empty_logs()
    _update(out, zip(keys, children, strict=True))
    return out


#: ``Logs()`` without its ``__init__``, in one C call, for the per-step path.
empty_logs = functools.partial(dict.__new__, Logs)
_update = dict.update


jax.tree_util.register_pytree_with_keys(
    Logs, _flatten_logs_with_keys, _unflatten_logs, _flatten_logs
)
