"""The adapter contract: build framework adapters (and find the installed ones).

An adapter is a subclass of :class:`AdapterState` implementing one hook, ``apply``, a
``create_state(...)`` factory, and an :class:`Adapter` record registered under the
``ciclo.adapters`` entry-point group. See ``docs/adapters.md`` for the guide.

Example:
    >>> import ciclo
    >>> ciclo.adapters.BatchFormat().unpack((1, 2), step="train_step")
    Batch(inputs=1, targets=2, sample_weight=None)
"""

from ..adapters._adapter import STATIC as STATIC
from ..adapters._adapter import Adapter as Adapter
from ..adapters._adapter import AdapterState as AdapterState
from ..adapters._adapter import Batch as Batch
from ..adapters._adapter import BatchFormat as BatchFormat
from ..adapters._adapter import FunctionState as FunctionState
from ..adapters._adapter import StatefulMetric as StatefulMetric
from ..adapters._adapter import Static as Static
from ..adapters._adapter import as_key as as_key
from ..adapters._adapter import is_stateful_metric as is_stateful_metric
from ..adapters._adapter import mean_metric as mean_metric
from ..adapters._adapter import reduce_values as reduce_values
from ..adapters._discovery import ENTRY_POINT_GROUP as ENTRY_POINT_GROUP
from ..adapters._discovery import AdapterLoadError as AdapterLoadError
from ..adapters._discovery import AdapterNotInstalledError as AdapterNotInstalledError
from ..adapters._discovery import adapter_for as adapter_for
from ..adapters._discovery import get_adapter as get_adapter
from ..adapters._discovery import installed_adapters as installed_adapters
from ..adapters._discovery import register_adapter as register_adapter
