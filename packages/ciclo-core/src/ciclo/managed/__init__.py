"""The managed API: ``ManagedState``, managed steps and strategies.

Example:
    >>> import ciclo
    >>> {"eager", "jit", "data-parallel", "pmap", "fsdp", "sharded"} <= set(
    ...     ciclo.managed.strategy_names()
    ... )
    True
"""

from ._precision import LossScale
from ._sharding import fsdp, key_path, partition_specs, register_partition_metadata, sharded
from ._state import ManagedState
from ._step import ManagedStep, step, train_step
from ._strategies import (
    Strategy,
    data_parallel,
    eager,
    get_strategy,
    jit,
    pmap,
    register_strategy,
    strategy_names,
)

# fmt: off
__all__ = [
    "ManagedState", "train_step", "step", "ManagedStep", "LossScale",
    "Strategy", "eager", "jit", "data_parallel", "pmap", "get_strategy", "register_strategy",
    "strategy_names", "fsdp", "sharded", "partition_specs", "key_path",
    "register_partition_metadata",
]
# fmt: on
