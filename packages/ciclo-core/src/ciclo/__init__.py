"""ciclo: a functional training loop for JAX.

Thread one pytree ``state`` through a loop over a dataset; a dict maps *schedules* (when)
to *callbacks* (what). See https://github.com/ciclo-jax/ciclo for the guide.
"""

from . import adapters as adapters
from . import managed as managed
from ._callback import Callback as Callback
from ._callback import LoopCallback as LoopCallback
from ._callback import LoopCallbackBase as LoopCallbackBase
from ._callback import LoopState as LoopState
from ._discovery import create_equinox_state as create_equinox_state
from ._discovery import create_flax_state as create_flax_state
from ._discovery import create_haiku_state as create_haiku_state
from ._discovery import create_nnx_state as create_nnx_state
from ._discovery import create_state as create_state
from ._elapsed import Elapsed as Elapsed
from ._elapsed import Period as Period
from ._elapsed import at as at
from ._elapsed import elapse as elapse
from ._history import History as History
from ._history import history as history
from ._logs import Logs as Logs
from ._logs import logs as logs
from ._loop import loop as loop
from ._schedules import Schedule as Schedule
from ._schedules import after as after
from ._schedules import always as always
from ._schedules import every as every
from ._schedules import never as never
from ._schedules import piecewise as piecewise

__version__ = "0.1.0"
