"""Loss and metric objects of the libraries users already have, as ciclo's functions.

``create_state(losses=..., metrics=...)`` of every adapter takes, besides
``fn(preds, targets)`` and :class:`~ciclo.adapters.StatefulMetric`:

- jax_metrics losses and metrics (``jm.losses.Crossentropy()``, ``jm.metrics.Accuracy()``),
  which take keyword arguments (``preds=``, ``target=``);
- ``clu.metrics`` classes (``Accuracy``, ``Average.from_output("loss")``) and
  ``Collection`` s (each of its metrics becomes an entry);
- ``flax.nnx.metrics`` objects (``Accuracy()``, ``Average("loss")``).

Each is recognised by the module of its class (never imported here: ciclo does not depend
on them) and wrapped as a :class:`LibraryFunction`: per batch, a fresh metric is computed
from the keyword arguments these libraries read, and the value is logged like a plain
function's, so the test loop weights it by batch size like the built-in ones (exact for
means such as accuracy and averages; for metrics that are not means of examples, write a
:class:`~ciclo.adapters.StatefulMetric`). The keyword arguments are ``preds`` and
``logits`` (the model's output), ``target``, ``targets`` and ``labels``, ``sample_weight``,
and, for metrics, each loss of the step by name (``loss=``).
"""

from __future__ import annotations

import copy
import typing
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["LibraryFunction", "from_libraries", "library_of"]


def library_of(obj: Any) -> str | None:
    """Which library ``obj`` (an object, or a clu metric class) comes from:
    ``"jax_metrics"``, ``"clu"``, ``"nnx"``, or ``None``.

    Example:
        >>> library_of(len) is None
        True
    """
    cls = obj if isinstance(obj, type) else type(obj)
    for klass in getattr(cls, "__mro__", ()):
        module = getattr(klass, "__module__", "") or ""
        if module.split(".")[0] == "jax_metrics":
            return "jax_metrics"
        if module == "clu.metrics" and klass.__name__ in ("Metric", "Collection"):
            return "clu"
        if module.startswith("flax.nnx") and klass.__name__ == "Metric":
            return "nnx"
    return None


def _jax_metrics(obj: Any, kwargs: dict[str, Any]) -> Any:
    if callable(getattr(obj, "batch_updates", None)):  # a metric
        return obj.batch_updates(**kwargs).compute()
    return obj(**kwargs)  # a loss


def _clu(cls: Any, kwargs: dict[str, Any]) -> Any:
    return cls.from_model_output(**kwargs).compute()


def _nnx(metric: Any, kwargs: dict[str, Any]) -> Any:
    fresh = copy.deepcopy(metric)  # nnx metrics are mutable: never touch the user's
    fresh.reset()
    fresh.update(**kwargs)
    return fresh.compute()


_CALLS: dict[str, Callable[[Any, dict[str, Any]], Any]] = {
    "jax_metrics": _jax_metrics,
    "clu": _clu,
    "nnx": _nnx,
}


class LibraryFunction:
    """A loss or metric object of another library, called as ciclo calls its functions:
    ``fn(preds, targets)``; the adapter's steps also pass ``sample_weight`` and, to
    metrics, the step's ``losses``.

    Attributes:
        obj: the library's object (or clu metric class).
        library: ``"jax_metrics"``, ``"clu"`` or ``"nnx"``.
    """

    __slots__ = ("__name__", "library", "obj")

    def __init__(self, obj: Any, library: str) -> None:
        self.obj = obj
        self.library = library
        self.__name__ = getattr(obj, "__name__", None) or type(obj).__name__

    def __call__(
        self,
        preds: Any,
        targets: Any,
        *,
        sample_weight: Any = None,
        losses: Mapping[str, Any] | None = None,
    ) -> Any:
        # Under each name a library may ask for them by.
        kwargs: dict[str, Any] = {**(losses or {}), "sample_weight": sample_weight}
        kwargs |= dict.fromkeys(("preds", "logits"), preds)
        kwargs |= dict.fromkeys(("target", "targets", "labels"), targets)
        return _CALLS[self.library](self.obj, kwargs)

    def __repr__(self) -> str:
        return f"LibraryFunction({self.obj!r})"


def _fields(collection: type) -> dict[str, Any]:
    """The metric classes of a ``clu.metrics.Collection``, by field name (not its private
    fields, such as its reduction counter)."""
    try:
        hints = typing.get_type_hints(collection)
    except Exception:  # unresolvable string annotations: what the class holds
        hints = dict(getattr(collection, "__annotations__", {}))
    return {name: cls for name, cls in hints.items() if not name.startswith("_")}


def from_libraries(functions: Mapping[str, Any]) -> dict[str, Any]:
    """``{name: loss or metric}`` with the objects of other libraries wrapped as
    :class:`LibraryFunction` (a ``clu.metrics.Collection`` becomes one entry per metric,
    named by its fields); other values are kept as they are.

    Example:
        >>> from_libraries({"accuracy": len})
        {'accuracy': <built-in function len>}
    """
    out: dict[str, Any] = {}
    for name, fn in functions.items():
        library = library_of(fn)
        if library is None:
            out[name] = fn
        elif library == "clu" and isinstance(fn, type) and hasattr(fn, "single_from_model_output"):
            for field, metric in _fields(fn).items():
                out[field] = LibraryFunction(metric, "clu")
        else:
            out[name] = LibraryFunction(fn, library)
    return out
