"""ciclo adapter for Equinox: an ``eqx.Module`` (with its ``eqx.nn.State``) as a ciclo state
with ``train_step``, ``test_step``, ``predict_step`` and ``reset_step``.

Example:
    >>> import ciclo_equinox
    >>> ciclo_equinox.adapter.name
    'equinox'
"""

from ._adapter import adapter
from ._state import EquinoxState, create_state

__all__ = ["EquinoxState", "adapter", "create_state"]

__version__ = "0.1.0"
