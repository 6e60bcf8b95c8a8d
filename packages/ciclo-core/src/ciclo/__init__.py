"""ciclo: a functional training loop for JAX.

Thread one pytree ``state`` through a loop over a dataset; a dict maps *schedules* (when)
to *callbacks* (what). See https://github.com/ciclo-jax/ciclo for the guide.

Each callback has one name here, the function-style one (``ciclo.keras_bar``); its class,
for typing and ``isinstance``, is in :mod:`ciclo.callbacks` (``ciclo.callbacks.KerasBar``).
"""

import typing as _typing

from . import adapters as adapters
from . import callbacks as callbacks
from . import managed as managed
from ._checkpoint._callback import checkpoint
from ._checkpoint._lazy import lazy_state
from ._checkpoint._restore import Restored, restore, restore_best
from ._checkpoint._rollback import rollback_on_nan
from ._data._stateful import stateful_dataset
from ._deprecated import deprecated_getattr as _deprecated_getattr
from ._loop._base import LoopCallbackBase
from ._loop._callback import Callback, inject
from ._loop._hooks import LoopCallback
from ._loop._state import LoopState, StopKind
from ._loops._evaluate_checkpoints import evaluate_checkpoints
from ._loops._loop import loop
from ._loops._named import (
    on_epoch_begin,
    on_epoch_end,
    on_predict_batch_begin,
    on_predict_batch_end,
    on_predict_begin,
    on_predict_end,
    on_predict_step,
    on_reset_step,
    on_test_batch_begin,
    on_test_batch_end,
    on_test_begin,
    on_test_end,
    on_test_step,
    on_train_batch_begin,
    on_train_batch_end,
    on_train_begin,
    on_train_end,
    on_train_step,
)
from ._loops._predict import predict_loop
from ._loops._test import test_loop
from ._loops._train import train_loop
from ._plugins._discovery import (
    create_equinox_state,
    create_flax_state,
    create_haiku_state,
    create_nnx_state,
    create_state,
)
from ._processes._agreement import ProcessFailedError
from ._records._history import History, history
from ._records._logs import Logs, logs
from ._time._elapsed import Elapsed, Period, at, elapse
from ._time._schedules import NamedSchedule, Schedule, after, always, every, never, piecewise
from ._weights._load import load_weights, weights_plan
from ._weights._plan import WeightsPlan
from .callbacks._early_stopping import early_stopping, terminate_on_nan
from .callbacks._goodput import goodput
from .callbacks._inner_loop import inner_loop
from .callbacks._loggers import csv_logger, tensorboard_logger
from .callbacks._lr_monitor import learning_rate_monitor
from .callbacks._profiler import profiler
from .callbacks._progress import keras_bar, tqdm_bar
from .callbacks._throughput import throughput
from .callbacks._watchdog import watchdog
from .callbacks._writers import writer_logger
from .managed._fuse_steps import fuse_steps

# fmt: off
__all__ = [
    # loops
    "loop", "train_loop", "test_loop", "predict_loop", "evaluate_checkpoints",
    # time and schedules
    "Elapsed", "Period", "at", "elapse",
    "Schedule", "NamedSchedule", "every", "after", "always", "never", "piecewise",
    # the predefined loops' moments
    "on_train_step", "on_test_step", "on_predict_step", "on_reset_step",
    "on_train_begin", "on_train_end", "on_epoch_begin", "on_epoch_end",
    "on_train_batch_begin", "on_train_batch_end", "on_test_begin", "on_test_end",
    "on_test_batch_begin", "on_test_batch_end", "on_predict_begin", "on_predict_end",
    "on_predict_batch_begin", "on_predict_batch_end",
    # steps
    "fuse_steps",
    # records
    "Logs", "logs", "History", "history",
    # what callbacks see and implement
    "LoopState", "StopKind", "LoopCallback", "LoopCallbackBase", "Callback", "inject",
    "ProcessFailedError",
    # callbacks (their classes are in ciclo.callbacks)
    "keras_bar", "tqdm_bar", "early_stopping", "terminate_on_nan", "inner_loop",
    "csv_logger", "tensorboard_logger", "writer_logger", "learning_rate_monitor",
    "throughput", "profiler", "goodput", "watchdog", "checkpoint", "rollback_on_nan",
    # checkpoints and data
    "restore", "restore_best", "Restored", "lazy_state", "stateful_dataset",
    # fine-tuning
    "load_weights", "weights_plan", "WeightsPlan",
    # states of the framework adapters
    "create_state", "create_flax_state", "create_nnx_state", "create_haiku_state",
    "create_equinox_state",
]
# fmt: on

__version__ = "0.1.0"

if not _typing.TYPE_CHECKING:  # old spellings warn for one release (_deprecated.py)
    __getattr__ = _deprecated_getattr(__name__)
