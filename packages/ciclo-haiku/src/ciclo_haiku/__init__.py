"""ciclo adapter for Haiku: a function using Haiku modules (or an ``hk.Transformed`` /
``hk.TransformedWithState``) as a ciclo state with ``train_step``, ``test_step``,
``predict_step`` and ``reset_step`` (:func:`create_state`).

Example:
    >>> import ciclo_haiku
    >>> ciclo_haiku.adapter.name
    'haiku'
"""

from ._adapter import adapter as adapter
from ._state import HaikuState as HaikuState
from ._state import create_state as create_state

__all__ = ["HaikuState", "adapter", "create_state"]

__version__ = "0.1.0"
