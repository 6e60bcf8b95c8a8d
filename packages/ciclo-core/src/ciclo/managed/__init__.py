"""The managed API: ``ManagedState``, managed steps and strategies.

Example:
    >>> import ciclo
    >>> {"eager", "jit", "data-parallel", "pmap", "fsdp", "sharded"} <= set(
    ...     ciclo.managed.strategy_names()
    ... )
    True
"""

from ._precision import LossScale as LossScale
from ._sharding import fsdp as fsdp
from ._sharding import key_path as key_path
from ._sharding import partition_specs as partition_specs
from ._sharding import register_partition_metadata as register_partition_metadata
from ._sharding import sharded as sharded
from ._state import ManagedState as ManagedState
from ._step import ManagedStep as ManagedStep
from ._step import step as step
from ._step import train_step as train_step
from ._strategies import Strategy as Strategy
from ._strategies import data_parallel as data_parallel
from ._strategies import eager as eager
from ._strategies import get_strategy as get_strategy
from ._strategies import jit as jit
from ._strategies import pmap as pmap
from ._strategies import register_strategy as register_strategy
from ._strategies import strategy_names as strategy_names
