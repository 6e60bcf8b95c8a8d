"""ciclo adapter for flax (in progress)."""

__version__ = "0.1.0"
