"""Which process writes an output: ``process=`` is its index (default ``0``) or ``None`` (all)."""

from __future__ import annotations

import jax

#: The process that writes outputs unless a callback is told otherwise.
OUTPUT_PROCESS = 0


def check_output_process(process: int | None, owner: str) -> int | None:
    """Validates a callback's ``process=`` option; returns it.

    >>> check_output_process(0, "csv_logger")
    0
    """
    if process is None:
        return None
    if isinstance(process, bool) or not isinstance(process, int) or process < 0:
        raise TypeError(f"{owner}(process={process!r}): expected a process index >= 0, or None")
    return process


def writes_here(process: int | None) -> bool:
    """Whether this process writes an output whose ``process=`` option is ``process``.

    >>> writes_here(None), writes_here(0)
    (True, True)
    """
    return process is None or jax.process_index() == process
