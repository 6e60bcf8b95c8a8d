"""ciclo adapter for haiku (in progress)."""

__version__ = "0.1.0"
