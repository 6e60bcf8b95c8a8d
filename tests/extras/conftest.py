"""The optional integrations, tested with the real packages (``nox -s extras``)."""

import sys
import types


def _import_clu_without_tensorflow() -> None:
    """clu's ``metric_writers`` imports TensorFlow only for its ``SummaryWriter``; stand in
    for that one module when TensorFlow is absent (clu's other writers and its periodic
    actions do not need it)."""
    try:
        import tensorflow  # noqa: F401
    except ImportError:
        stub = types.ModuleType("clu.metric_writers.summary_writer")
        stub.SummaryWriter = None  # type: ignore[attr-defined]
        sys.modules.setdefault("clu.metric_writers.summary_writer", stub)


_import_clu_without_tensorflow()
