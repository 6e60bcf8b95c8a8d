"""The adapter contract: build framework adapters (and find the installed ones).

An adapter is a subclass of :class:`AdapterState` implementing one hook, ``apply``, a
``create_state(...)`` factory, and an :class:`Adapter` record registered under the
``ciclo.adapters`` entry-point group. What calling a model takes in every framework (the
training flag of its ``__call__``, per-stream RNG keys, checked ``create_state`` options) is
here too: :func:`detect_training_arg`, :func:`training_kwargs`, :func:`stream_keys`,
:class:`AdapterOptions`, :func:`check_options`. See ``docs/adapters.md`` for the guide.

Example:
    >>> import ciclo
    >>> ciclo.adapters.BatchFormat().unpack((1, 2), step="train_step")
    Batch(inputs=1, targets=2, sample_weight=None)
"""

import typing as _typing

from .._deprecated import deprecated_getattr as _deprecated_getattr
from .._plugins._discovery import (
    AdapterLoadError,
    AdapterNotInstalledError,
    adapter_for,
    get_adapter,
    installed_adapters,
    register_adapter,
    register_restore_in_place,
)
from .._plugins._record import Adapter
from ..managed._static import Static
from ._adapter import STATIC, AdapterOptions, AdapterState, FunctionState, as_key, check_options
from ._batch import Batch, BatchFormat
from ._functions import StatefulMetric, mean_metric, reduce_values
from ._training import (
    AUTO,
    detect_rng_arg,
    detect_training_arg,
    find_argument,
    requested_extras,
    stream_keys,
    training_kwargs,
)

# fmt: off
__all__ = [
    # the contract
    "AdapterState", "FunctionState", "Static", "STATIC", "AUTO", "AdapterOptions",
    "check_options",
    "Batch", "BatchFormat", "StatefulMetric", "mean_metric", "reduce_values", "as_key",
    # what calling a model takes
    "detect_training_arg", "training_kwargs", "detect_rng_arg", "find_argument",
    "stream_keys", "requested_extras",
    # the record and the discovery
    "Adapter", "register_adapter", "get_adapter", "adapter_for", "installed_adapters",
    "AdapterLoadError", "AdapterNotInstalledError", "register_restore_in_place",
]
# fmt: on

if not _typing.TYPE_CHECKING:  # old spellings warn for one release (ciclo/_deprecated.py)
    __getattr__ = _deprecated_getattr(__name__)
