"""ciclo adapter for Flax: Linen modules (:func:`create_state`) and NNX models
(:func:`create_nnx_state`) as ciclo states with ``train_step``, ``test_step``,
``predict_step`` and ``reset_step``; :class:`SownLoss` and :class:`SownMetric`, the
types of the losses and metrics an NNX model records with ``self.sow``.

Example:
    >>> import ciclo_flax
    >>> ciclo_flax.adapter.name
    'flax'
"""

from ._adapter import adapter
from ._linen import FlaxState, create_state
from ._nnx import NNXState, create_nnx_state
from ._sown import SownLoss, SownMetric

__all__ = [
    "FlaxState",
    "NNXState",
    "SownLoss",
    "SownMetric",
    "adapter",
    "create_nnx_state",
    "create_state",
]

__version__ = "0.1.0"
