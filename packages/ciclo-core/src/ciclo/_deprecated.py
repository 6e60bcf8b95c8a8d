"""Old public spellings, kept for one release: each still works, with a
``DeprecationWarning`` that names the new one. One table for every public namespace (as
optax keeps its deprecations), served by the namespace's ``__getattr__``.

Example:
    >>> import warnings, ciclo
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     bar = ciclo.KerasBar
    >>> bar is ciclo.callbacks.KerasBar
    True
    >>> print(caught[0].message)
    ciclo.KerasBar is deprecated: use ciclo.callbacks.KerasBar; it goes in the next release.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from typing import Any

__all__ = ["DEPRECATED", "deprecated_getattr"]

# fmt: off
_CALLBACKS = {  # the function-style name at the top level, the class in ciclo.callbacks
    "checkpoint": "Checkpoint", "rollback_on_nan": "RollbackOnNaN", "goodput": "Goodput",
    "early_stopping": "EarlyStopping", "terminate_on_nan": "TerminateOnNaN",
    "csv_logger": "CSVLogger", "tensorboard_logger": "TensorBoardLogger",
    "writer_logger": "WriterLogger", "learning_rate_monitor": "LearningRateMonitor",
    "keras_bar": "KerasBar", "tqdm_bar": "TqdmBar", "throughput": "Throughput",
    "profiler": "Profiler", "watchdog": "Watchdog",
}
# fmt: on

#: ``{namespace: {old name: where it is now}}``. A place inside a private module means the
#: name has no public successor (it was internal to what uses it).
DEPRECATED: dict[str, dict[str, str]] = {
    "ciclo": {
        **{cls: f"ciclo.callbacks.{cls}" for cls in _CALLBACKS.values()},
        "LazyState": "ciclo.lazy_state",
    },
    "ciclo.callbacks": {
        **{name: f"ciclo.{name}" for name in _CALLBACKS},
        "inner_loop": "ciclo.inner_loop",
    },
    "ciclo.adapters": {
        "BATCH_OPTIONS": "ciclo.adapters._adapter.BATCH_OPTIONS",
        "STATE_OPTIONS": "ciclo.adapters._adapter.STATE_OPTIONS",
        "TRAINING_FLAGS": "ciclo.adapters._training.TRAINING_FLAGS",
        "INVERTED_FLAGS": "ciclo.adapters._training.INVERTED_FLAGS",
        "EXTRAS": "ciclo._plugins._record.EXTRAS",
        "ENTRY_POINT_GROUP": "ciclo._plugins._discovery.ENTRY_POINT_GROUP",
        "is_stateful_metric": "ciclo.adapters._functions.is_stateful_metric",
    },
    "ciclo.testing": {
        "LoopbackRun": "ciclo._processes._loopback.LoopbackRun",
        "classification_data": "ciclo.testing._conformance.classification_data",
    },
}


def deprecated_getattr(namespace: str) -> Callable[[str], Any]:
    """The module ``__getattr__`` of ``namespace``: an old name warns and gives its value;
    any other is an ``AttributeError``."""
    table = DEPRECATED.get(namespace, {})

    def __getattr__(name: str) -> Any:
        if name not in table:
            raise AttributeError(f"module {namespace!r} has no attribute {name!r}")
        module, _, attribute = table[name].rpartition(".")
        advice = "it is internal now" if "._" in module else f"use {table[name]}"
        warnings.warn(
            f"{namespace}.{name} is deprecated: {advice}; it goes in the next release.",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(module), attribute)

    return __getattr__
