"""ciclo: a functional training loop for JAX.

Thread one pytree ``state`` through a loop over a dataset; a dict maps *schedules* (when)
to *callbacks* (what). See https://github.com/ciclo-jax/ciclo for the guide.
"""

from . import adapters as adapters
from . import callbacks as callbacks
from . import managed as managed
from ._checkpoint._callback import Checkpoint as Checkpoint
from ._checkpoint._callback import checkpoint as checkpoint
from ._checkpoint._lazy import LazyState as LazyState
from ._checkpoint._lazy import lazy_state as lazy_state
from ._checkpoint._restore import Restored as Restored
from ._checkpoint._restore import restore as restore
from ._checkpoint._restore import restore_best as restore_best
from ._checkpoint._rollback import RollbackOnNaN as RollbackOnNaN
from ._checkpoint._rollback import rollback_on_nan as rollback_on_nan
from ._data._stateful import stateful_dataset as stateful_dataset
from ._loop._base import LoopCallbackBase as LoopCallbackBase
from ._loop._callback import Callback as Callback
from ._loop._callback import inject as inject
from ._loop._hooks import LoopCallback as LoopCallback
from ._loop._state import LoopState as LoopState
from ._loops._evaluate_checkpoints import evaluate_checkpoints as evaluate_checkpoints
from ._loops._loop import loop as loop
from ._loops._named import on_epoch_begin as on_epoch_begin
from ._loops._named import on_epoch_end as on_epoch_end
from ._loops._named import on_predict_batch_begin as on_predict_batch_begin
from ._loops._named import on_predict_batch_end as on_predict_batch_end
from ._loops._named import on_predict_begin as on_predict_begin
from ._loops._named import on_predict_end as on_predict_end
from ._loops._named import on_predict_step as on_predict_step
from ._loops._named import on_reset_step as on_reset_step
from ._loops._named import on_test_batch_begin as on_test_batch_begin
from ._loops._named import on_test_batch_end as on_test_batch_end
from ._loops._named import on_test_begin as on_test_begin
from ._loops._named import on_test_end as on_test_end
from ._loops._named import on_test_step as on_test_step
from ._loops._named import on_train_batch_begin as on_train_batch_begin
from ._loops._named import on_train_batch_end as on_train_batch_end
from ._loops._named import on_train_begin as on_train_begin
from ._loops._named import on_train_end as on_train_end
from ._loops._named import on_train_step as on_train_step
from ._loops._predict import predict_loop as predict_loop
from ._loops._test import test_loop as test_loop
from ._loops._train import train_loop as train_loop
from ._plugins._discovery import create_equinox_state as create_equinox_state
from ._plugins._discovery import create_flax_state as create_flax_state
from ._plugins._discovery import create_haiku_state as create_haiku_state
from ._plugins._discovery import create_nnx_state as create_nnx_state
from ._plugins._discovery import create_state as create_state
from ._processes._agreement import ProcessFailedError as ProcessFailedError
from ._records._history import History as History
from ._records._history import history as history
from ._records._logs import Logs as Logs
from ._records._logs import logs as logs
from ._time._elapsed import Elapsed as Elapsed
from ._time._elapsed import Period as Period
from ._time._elapsed import at as at
from ._time._elapsed import elapse as elapse
from ._time._schedules import NamedSchedule as NamedSchedule
from ._time._schedules import Schedule as Schedule
from ._time._schedules import after as after
from ._time._schedules import always as always
from ._time._schedules import every as every
from ._time._schedules import never as never
from ._time._schedules import piecewise as piecewise

# Fine-tuning (issue 42)
from ._weights._load import load_weights as load_weights
from ._weights._load import weights_plan as weights_plan
from ._weights._plan import WeightsPlan as WeightsPlan
from .callbacks._early_stopping import EarlyStopping as EarlyStopping
from .callbacks._early_stopping import TerminateOnNaN as TerminateOnNaN
from .callbacks._early_stopping import early_stopping as early_stopping
from .callbacks._early_stopping import terminate_on_nan as terminate_on_nan
from .callbacks._goodput import Goodput as Goodput
from .callbacks._goodput import goodput as goodput
from .callbacks._inner_loop import inner_loop as inner_loop
from .callbacks._loggers import CSVLogger as CSVLogger
from .callbacks._loggers import TensorBoardLogger as TensorBoardLogger
from .callbacks._loggers import csv_logger as csv_logger
from .callbacks._loggers import tensorboard_logger as tensorboard_logger
from .callbacks._lr_monitor import LearningRateMonitor as LearningRateMonitor
from .callbacks._lr_monitor import learning_rate_monitor as learning_rate_monitor
from .callbacks._profiler import Profiler as Profiler
from .callbacks._profiler import profiler as profiler
from .callbacks._progress import KerasBar as KerasBar
from .callbacks._progress import TqdmBar as TqdmBar
from .callbacks._progress import keras_bar as keras_bar
from .callbacks._progress import tqdm_bar as tqdm_bar
from .callbacks._throughput import Throughput as Throughput
from .callbacks._throughput import throughput as throughput
from .callbacks._watchdog import Watchdog as Watchdog
from .callbacks._watchdog import watchdog as watchdog
from .callbacks._writers import WriterLogger as WriterLogger
from .callbacks._writers import writer_logger as writer_logger

__version__ = "0.1.0"
