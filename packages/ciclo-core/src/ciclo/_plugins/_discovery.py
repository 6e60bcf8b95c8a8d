"""Finding adapters lazily: installed ones (entry-point group ``ciclo.adapters``), those
registered in this process, and their extras. Nothing runs at ``import ciclo``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from importlib import metadata
from typing import Any

from ._record import EXTRA_SIGNATURES, EXTRAS, Adapter

__all__ = [
    "AdapterNotInstalledError",
    "AdapterLoadError",
    "ENTRY_POINT_GROUP",
    "adapter_for",
    "create_equinox_state",
    "create_flax_state",
    "create_haiku_state",
    "create_nnx_state",
    "create_state",
    "get_adapter",
    "installed_adapters",
    "register_adapter",
    "register_extra",
    "register_restore_in_place",
    "registered_extras",
    "extras",
]

ENTRY_POINT_GROUP = "ciclo.adapters"

#: The adapters ciclo knows by name, and the distribution that provides each.
KNOWN_ADAPTERS = {"flax": "ciclo-flax", "haiku": "ciclo-haiku", "equinox": "ciclo-equinox"}


class AdapterNotInstalledError(ImportError):
    """No installed adapter has this name; the message says what to ``pip install``."""


class AdapterLoadError(ImportError):
    """An installed adapter failed to import; the cause is chained."""


def _entry_points() -> Sequence[metadata.EntryPoint]:
    """The entry points of the ``ciclo.adapters`` group (a seam for tests)."""
    return list(metadata.entry_points(group=ENTRY_POINT_GROUP))


_LOADED: dict[str, Adapter] = {}
#: Adapters registered in this process with :func:`register_adapter` (no entry point).
_REGISTERED: dict[str, Adapter] = {}


def installed_adapters() -> list[str]:
    """The names of the installed adapters (nothing is imported).

    Example:
        >>> import ciclo
        >>> isinstance(ciclo.adapters.installed_adapters(), list)
        True
    """
    return sorted({ep.name for ep in _entry_points()} | set(_REGISTERED))


def register_adapter(adapter: Adapter) -> Adapter:
    """Registers ``adapter`` in this process (a script's adapter; replaces one of the same name).

    Returns ``adapter``; a name an installed package registers is a ``ValueError``.

    Example:
        >>> import ciclo
        >>> record = ciclo.adapters.Adapter(
        ...     name="my-framework", distribution="my-adapter",
        ...     handles=lambda model: False, create_state=lambda model, **kwargs: None,
        ... )
        >>> _ = ciclo.adapters.register_adapter(record)
        >>> ciclo.adapters.get_adapter("my-framework") is record
        True
    """
    if not isinstance(adapter, Adapter):
        raise TypeError(f"register_adapter needs a ciclo.adapters.Adapter, got {adapter!r}.")
    installed = [ep for ep in _entry_points() if ep.name == adapter.name]
    if installed:
        where = _describe(installed[0])
        raise ValueError(f"{where} registers the adapter {adapter.name!r}; rename yours.")
    _REGISTERED[adapter.name] = adapter
    _LOADED[adapter.name] = adapter
    return adapter


def _install_hint(name: str) -> str:
    distribution = KNOWN_ADAPTERS.get(name)
    if distribution:
        return f"pip install {distribution}"
    return f"install the package that registers the {name!r} ciclo adapter"


_ADAPTER_IMPORT_FAILED = "the ciclo adapter {!r} ({}) failed to import: {}: {}; fix: {}."
_NOT_AN_ADAPTER = "entry point {} must point to a ciclo.adapters.Adapter, but it loads {}."


def get_adapter(name: str) -> Adapter:
    """The installed adapter called ``name``, imported on first use.

    Raises :class:`AdapterNotInstalledError` (saying what to ``pip install``) or
    :class:`AdapterLoadError`.

    Example:
        >>> import ciclo
        >>> ciclo.adapters.get_adapter("no-such-framework")
        Traceback (most recent call last):
        ...
        ciclo._plugins._discovery.AdapterNotInstalledError: no ciclo adapter named ...
    """
    adapter = _LOADED.get(name) or _REGISTERED.get(name)
    if adapter is not None:
        return adapter
    found = [ep for ep in _entry_points() if ep.name == name]
    if not found:
        hint, installed = _install_hint(name), installed_adapters() or "none"
        raise AdapterNotInstalledError(f"no ciclo adapter named {name!r} ({installed}); {hint}.")
    if len({ep.value for ep in found}) > 1:
        raise AdapterLoadError(
            f"several packages register the ciclo adapter {name!r}: "
            f"{[_describe(ep) for ep in found]}; uninstall all but one."
        )
    entry_point = found[0]
    try:
        adapter = entry_point.load()
    except Exception as error:
        fix = _install_hint(name).replace("pip install", "pip install -U")
        where = _describe(entry_point)
        message = _ADAPTER_IMPORT_FAILED.format(name, where, type(error).__name__, error, fix)
        raise AdapterLoadError(message) from error
    if not isinstance(adapter, Adapter):
        where, kind = _describe(entry_point), type(adapter).__name__
        raise AdapterLoadError(_NOT_AN_ADAPTER.format(where, kind))
    _LOADED[name] = adapter
    return adapter


def _describe(entry_point: metadata.EntryPoint) -> str:
    dist = getattr(entry_point, "dist", None)
    origin = f" from {dist.name} {dist.version}" if dist is not None else ""
    return f"{entry_point.value}{origin}"


_SEVERAL_ADAPTERS = "several ciclo adapters handle a {}: {}; call {}.create_state directly."
_NO_ADAPTER = (
    "no installed ciclo adapter handles it ({}; {}); pip install ciclo-flax, -haiku or -equinox."
)


def adapter_for(model: Any) -> Adapter:
    """The installed adapter that handles ``model`` (those of imported frameworks asked first)."""
    entry_names = installed_adapters()
    imported = [n for n in entry_names if n in _REGISTERED or n.split(".")[0] in sys.modules]
    others = [n for n in entry_names if n not in imported]
    broken: dict[str, str] = {}
    for group in (imported, others):
        matches = []
        for name in group:
            try:
                adapter = get_adapter(name)
            except ImportError as error:
                broken[name] = str(error)
                continue
            if adapter.handles(model):
                matches.append(adapter)
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            names, module = [a.name for a in matches], matches[0].create_state.__module__
            raise TypeError(_SEVERAL_ADAPTERS.format(type(model).__qualname__, names, module))
    text = f"installed adapters: {entry_names or 'none'}"
    if broken:
        text += "; failed to load: " + "; ".join(f"{n}: {e}" for n, e in broken.items())
    raise TypeError(
        _NO_ADAPTER.format(f"{type(model).__module__}.{type(model).__qualname__}", text)
    )


def create_state(model: Any, *args: Any, **kwargs: Any) -> Any:
    """Builds the state of ``model`` with the adapter of its framework (picked by type).

    Example::

        state = ciclo.create_state(
            CNN(), x[:1], optax.adam(1e-3),
            losses={"loss": optax.softmax_cross_entropy_with_integer_labels},
        )
    """
    return adapter_for(model).create_state(model, *args, **kwargs)


def _forward(public: str, adapter_name: str, factory_name: str, args: Any, kwargs: Any) -> Any:
    try:
        adapter = get_adapter(adapter_name)
    except AdapterNotInstalledError:
        hint = _install_hint(adapter_name)
        raise AdapterNotInstalledError(f"ciclo.{public} needs an adapter; fix: {hint}.") from None
    factory = adapter.factory(factory_name)
    if factory is None:
        found = f"ciclo.{public}: {adapter.distribution} has no {factory_name}"
        raise AdapterLoadError(f"{found}; upgrade it: pip install -U {adapter.distribution}.")
    return factory(*args, **kwargs)


def create_flax_state(*args: Any, **kwargs: Any) -> Any:
    """``ciclo_flax.create_state`` (Flax Linen), imported on first use."""
    return _forward("create_flax_state", "flax", "create_state", args, kwargs)


def create_nnx_state(*args: Any, **kwargs: Any) -> Any:
    """``ciclo_flax.create_nnx_state`` (Flax NNX), imported on first use."""
    return _forward("create_nnx_state", "flax", "create_nnx_state", args, kwargs)


def create_haiku_state(*args: Any, **kwargs: Any) -> Any:
    """``ciclo_haiku.create_state``, imported on first use (``pip install ciclo-haiku``)."""
    return _forward("create_haiku_state", "haiku", "create_state", args, kwargs)


def create_equinox_state(*args: Any, **kwargs: Any) -> Any:
    """``ciclo_equinox.create_state``, imported on first use (``pip install ciclo-equinox``)."""
    return _forward("create_equinox_state", "equinox", "create_state", args, kwargs)


#: Extras registered in this process, by kind (for types of a script's own code).
_REGISTERED_EXTRAS: dict[str, dict[type, Callable[..., Any]]] = {kind: {} for kind in EXTRAS}


def register_extra(kind: str, node_type: type, fn: Callable[..., Any], *, argument: str) -> None:
    """Adds ``{node_type: fn}`` to the extra ``kind`` in this process, checking the arguments.

    Example:
        >>> class Box: ...
        >>> register_extra(
        ...     "restore_in_place", Box, lambda original, restored: None, argument="restore_into"
        ... )
        >>> Box in extras("restore_in_place")[0]
        True
    """
    if not isinstance(node_type, type):
        raise TypeError(f"register_{kind}: node_type must be a class, got {node_type!r}.")
    if not callable(fn):
        signature = EXTRA_SIGNATURES[kind]
        raise TypeError(f"register_{kind}: {argument} must be a function {signature}, got {fn!r}.")
    _REGISTERED_EXTRAS[kind][node_type] = fn


def register_restore_in_place(node_type: type, restore_into: Callable[[Any, Any], None]) -> None:
    """Declares that the objects of ``node_type`` in a loop's state are restored *in place*
    when the loop resumes (``loop(..., resume=...)``): ``restore_into(original, restored)``
    copies the checkpoint's values into the object the state held, and the state keeps that
    object, so code that holds it too (a step closing over a mutable model and optimizer,
    as the Flax NNX tutorial's steps do) sees the restored values.

    For a class of your own code. An adapter package declares its framework's classes on
    its record instead (``Adapter(..., restore_in_place={nnx.Pytree: update})``; see
    ``docs/adapters.md``), read when a loop resumes with the framework imported. Every
    other value of the state is replaced by the restored one.

    Args:
        node_type: a pytree node class (subclasses match too).
        restore_into: ``(original, restored) -> None``.

    Example:
        >>> import ciclo, jax, numpy as np
        >>> class Box:  # a mutable pytree node
        ...     def __init__(self, value):
        ...         self.value = value
        >>> jax.tree_util.register_pytree_node(
        ...     Box, lambda b: ((b.value,), None), lambda _, children: Box(children[0])
        ... )
        >>> def copy_into(original, restored):
        ...     original.value = restored.value
        >>> ciclo.adapters.register_restore_in_place(Box, copy_into)
        >>> Box in extras("restore_in_place")[0]
        True
    """
    register_extra("restore_in_place", node_type, restore_into, argument="restore_into")


def registered_extras() -> list[type]:
    """The classes this process registered extras for with :func:`register_extra`.

    Example:
        >>> isinstance(registered_extras(), list)
        True
    """
    return [node_type for table in _REGISTERED_EXTRAS.values() for node_type in table]


def extras(kind: str) -> tuple[dict[type, Callable[..., Any]], dict[str, str]]:
    """``({class: function}, {adapter: error})``: the extra ``kind`` of this process and the
    adapters of imported frameworks (earlier entries win), and the adapters that failed to load.

    Example:
        >>> table, broken = extras("partition_metadata")
        >>> isinstance(table, dict), isinstance(broken, dict)
        (True, True)
    """
    table = dict(_REGISTERED_EXTRAS[kind])
    broken: dict[str, str] = {}
    for name in installed_adapters():
        if name not in _REGISTERED and name.split(".")[0] not in sys.modules:
            continue
        try:
            adapter = get_adapter(name)
        except ImportError as error:
            broken[name] = str(error)
            continue
        for node_type, fn in getattr(adapter, kind).items():
            table.setdefault(node_type, fn)
    return table, broken
