"""The built-in callbacks, in one namespace (each is also at the top level: ``ciclo.keras_bar``).

Each callback is a class (``KerasBar``) with a lowercase name that is the same class
(``keras_bar``), so ``ciclo.keras_bar(10)`` makes a ``KerasBar``.

Example:
    >>> import ciclo
    >>> ciclo.callbacks.keras_bar is ciclo.keras_bar is ciclo.callbacks.KerasBar
    True
"""

from .._checkpoint._callback import Checkpoint as Checkpoint
from .._checkpoint._callback import checkpoint as checkpoint
from .._checkpoint._rollback import RollbackOnNaN as RollbackOnNaN
from .._checkpoint._rollback import rollback_on_nan as rollback_on_nan
from ._early_stopping import EarlyStopping as EarlyStopping
from ._early_stopping import TerminateOnNaN as TerminateOnNaN
from ._early_stopping import early_stopping as early_stopping
from ._early_stopping import terminate_on_nan as terminate_on_nan
from ._goodput import Goodput as Goodput
from ._goodput import goodput as goodput
from ._inner_loop import inner_loop as inner_loop
from ._loggers import CSVLogger as CSVLogger
from ._loggers import TensorBoardLogger as TensorBoardLogger
from ._loggers import csv_logger as csv_logger
from ._loggers import tensorboard_logger as tensorboard_logger
from ._lr_monitor import LearningRateMonitor as LearningRateMonitor
from ._lr_monitor import learning_rate_monitor as learning_rate_monitor
from ._profiler import Profiler as Profiler
from ._profiler import profiler as profiler
from ._progress import KerasBar as KerasBar
from ._progress import TqdmBar as TqdmBar
from ._progress import keras_bar as keras_bar
from ._progress import tqdm_bar as tqdm_bar
from ._throughput import Throughput as Throughput
from ._throughput import compiled_flops as compiled_flops
from ._throughput import throughput as throughput
from ._watchdog import Watchdog as Watchdog
from ._watchdog import WatchdogExpired as WatchdogExpired
from ._watchdog import watchdog as watchdog
from ._writers import MetricWriter as MetricWriter
from ._writers import MLflowWriter as MLflowWriter
from ._writers import TensorBoardWriter as TensorBoardWriter
from ._writers import WandbWriter as WandbWriter
from ._writers import WriterLogger as WriterLogger
from ._writers import writer_logger as writer_logger
