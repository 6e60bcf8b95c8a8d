"""The adapter contract: build framework adapters (and find the installed ones).

An adapter is a subclass of :class:`AdapterState` implementing one hook, ``apply``, a
``create_state(...)`` factory, and an :class:`Adapter` record registered under the
``ciclo.adapters`` entry-point group. What calling a model takes in every framework (the
training flag of its ``__call__``, per-stream RNG keys, checked ``create_state`` options) is
here too: :func:`detect_training_arg`, :func:`training_kwargs`, :func:`stream_keys`,
:func:`check_options`. See ``docs/adapters.md`` for the guide.

Example:
    >>> import ciclo
    >>> ciclo.adapters.BatchFormat().unpack((1, 2), step="train_step")
    Batch(inputs=1, targets=2, sample_weight=None)
"""

from .._checkpoint._in_place import register_restore_in_place as register_restore_in_place
from .._plugins._discovery import ENTRY_POINT_GROUP as ENTRY_POINT_GROUP
from .._plugins._discovery import AdapterLoadError as AdapterLoadError
from .._plugins._discovery import AdapterNotInstalledError as AdapterNotInstalledError
from .._plugins._discovery import adapter_for as adapter_for
from .._plugins._discovery import get_adapter as get_adapter
from .._plugins._discovery import installed_adapters as installed_adapters
from .._plugins._discovery import register_adapter as register_adapter
from .._plugins._record import Adapter as Adapter
from ..managed._static import Static as Static
from ._adapter import BATCH_OPTIONS as BATCH_OPTIONS
from ._adapter import STATE_OPTIONS as STATE_OPTIONS
from ._adapter import STATIC as STATIC
from ._adapter import AdapterState as AdapterState
from ._adapter import Batch as Batch
from ._adapter import BatchFormat as BatchFormat
from ._adapter import FunctionState as FunctionState
from ._adapter import StatefulMetric as StatefulMetric
from ._adapter import as_key as as_key
from ._adapter import check_options as check_options
from ._adapter import is_stateful_metric as is_stateful_metric
from ._adapter import mean_metric as mean_metric
from ._adapter import reduce_values as reduce_values
from ._training import AUTO as AUTO
from ._training import EXTRAS as EXTRAS
from ._training import INVERTED_FLAGS as INVERTED_FLAGS
from ._training import TRAINING_FLAGS as TRAINING_FLAGS
from ._training import detect_rng_arg as detect_rng_arg
from ._training import detect_training_arg as detect_training_arg
from ._training import find_argument as find_argument
from ._training import requested_extras as requested_extras
from ._training import stream_keys as stream_keys
from ._training import training_kwargs as training_kwargs
