"""The managed API: ``ManagedState``, managed steps and strategies.

Example:
    >>> import ciclo
    >>> {"eager", "jit", "data-parallel", "pmap", "fsdp", "sharded"} <= set(
    ...     ciclo.managed.strategy_names()
    ... )
    True
"""

from ..managed._sharding import fsdp as fsdp
from ..managed._sharding import key_path as key_path
from ..managed._sharding import partition_specs as partition_specs
from ..managed._sharding import register_partition_metadata as register_partition_metadata
from ..managed._sharding import sharded as sharded
from ..managed._state import ManagedState as ManagedState
from ..managed._state import ManagedStep as ManagedStep
from ..managed._state import step as step
from ..managed._state import train_step as train_step
from ..managed._strategies import Strategy as Strategy
from ..managed._strategies import data_parallel as data_parallel
from ..managed._strategies import eager as eager
from ..managed._strategies import get_strategy as get_strategy
from ..managed._strategies import jit as jit
from ..managed._strategies import pmap as pmap
from ..managed._strategies import register_strategy as register_strategy
from ..managed._strategies import strategy_names as strategy_names
