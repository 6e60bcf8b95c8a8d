"""ciclo adapter for Haiku: a function using Haiku modules (or an ``hk.Transformed`` /
``hk.TransformedWithState``) as a ciclo state with ``train_step``, ``test_step``,
``predict_step`` and ``reset_step`` (:func:`create_state`).

Example:
    >>> import ciclo, ciclo_haiku  # found by its entry point, as every adapter is
    >>> ciclo.adapters.get_adapter("haiku") is ciclo_haiku.adapter
    True
"""

from ._adapter import adapter
from ._state import HaikuState, create_state

__all__ = ["HaikuState", "adapter", "create_state"]

__version__ = "0.1.0"
