"""The built-in callbacks' classes, for typing and ``isinstance``; each is made by its one
top-level name (``ciclo.keras_bar(10)`` makes a ``KerasBar``: the name is the class).
Also the metric writers and the writer protocol.

Example:
    >>> import ciclo
    >>> ciclo.keras_bar is ciclo.callbacks.KerasBar
    True
"""

import typing as _typing

from .._checkpoint._callback import Checkpoint
from .._checkpoint._rollback import RollbackOnNaN
from .._deprecated import deprecated_getattr as _deprecated_getattr
from ._early_stopping import EarlyStopping, TerminateOnNaN
from ._goodput import Goodput
from ._loggers import CSVLogger, TensorBoardLogger
from ._lr_monitor import LearningRateMonitor
from ._profiler import Profiler
from ._progress import KerasBar, TqdmBar
from ._throughput import Throughput, compiled_flops
from ._watchdog import Watchdog, WatchdogExpired
from ._writers import MetricWriter, MLflowWriter, TensorBoardWriter, WandbWriter, WriterLogger

# fmt: off
__all__ = [
    "KerasBar", "TqdmBar", "EarlyStopping", "TerminateOnNaN", "CSVLogger",
    "TensorBoardLogger", "WriterLogger", "LearningRateMonitor", "Throughput", "Profiler",
    "Goodput", "Watchdog", "Checkpoint", "RollbackOnNaN",
    "WatchdogExpired", "compiled_flops",
    "MetricWriter", "TensorBoardWriter", "WandbWriter", "MLflowWriter",
]
# fmt: on

if not _typing.TYPE_CHECKING:  # old spellings warn for one release (ciclo/_deprecated.py)
    __getattr__ = _deprecated_getattr(__name__)
