"""ciclo adapter for flax (in progress)."""

from ._partitioning import register as _register_partition_metadata

_register_partition_metadata()

__version__ = "0.1.0"
