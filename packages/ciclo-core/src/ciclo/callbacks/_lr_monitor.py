"""``learning_rate_monitor``: the current learning rate, logged into the history."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from .._loop._base import LoopCallbackBase
from .._loop._state import LoopState
from .._records._logs import Logs
from .._time._elapsed import Elapsed
from .._time._schedules import Schedule, every

__all__ = ["LearningRateMonitor", "learning_rate_monitor", "injected_hyperparam"]


def _has_hyperparams(node: Any) -> bool:
    return isinstance(getattr(node, "hyperparams", None), dict)


def injected_hyperparam(state: Any, name: str = "learning_rate") -> Any:
    """Hyperparameter ``name`` of the first ``optax.inject_hyperparams`` state in ``state``.

    Example:
        >>> import optax, jax.numpy as jnp
        >>> opt = optax.inject_hyperparams(optax.sgd)(learning_rate=0.1)
        >>> round(float(injected_hyperparam(opt.init(jnp.zeros(2)))), 6)
        0.1
    """
    for node in jax.tree_util.tree_leaves(state, is_leaf=_has_hyperparams):
        if _has_hyperparams(node) and name in node.hyperparams:
            return node.hyperparams[name]
    return None


_NO_LR = "learning_rate_monitor: no optax.inject_hyperparams state with {!r}; pass a schedule."


class LearningRateMonitor(LoopCallbackBase):
    """Logs the current learning rate as the metric ``learning_rate``.

    Args:
        schedule: an optax schedule, evaluated at the step count; else the value is read from
            the state's ``optax.inject_hyperparams`` state (on device).
        steps: log every ``steps`` steps.
        name: the hyperparameter to read, and the metric's name.

    Example:
        >>> import ciclo, optax, numpy as np
        >>> lr = optax.linear_schedule(1.0, 0.0, transition_steps=4)
        >>> step = lambda state, batch: state
        >>> _, history, _ = ciclo.loop(None, [np.ones(1)] * 4, {ciclo.every(1): step,
        ...                            **ciclo.learning_rate_monitor(lr)})
        >>> [float(v) for v in history.collect("learning_rate")]
        [1.0, 0.75, 0.5, 0.25]
    """

    def __init__(
        self,
        schedule: Callable[[Any], Any] | None = None,
        *,
        steps: int = 1,
        name: str = "learning_rate",
    ) -> None:
        if schedule is not None and not callable(schedule):
            raise TypeError(f"learning_rate_monitor(schedule={schedule!r}): expected a schedule")
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise TypeError(f"learning_rate_monitor(steps={steps!r}): expected an int >= 1")
        self.schedule, self.steps, self.name = schedule, steps, name
        self._last: int | None = None

    def default_schedule(self) -> Schedule:
        """Spread with ``**`` into ``tasks``: every ``steps`` steps."""
        return every(self.steps)

    def read(self, loop_state: LoopState) -> Any:
        """The learning rate at this step (on device when read from the state)."""
        if self.schedule is not None:
            return self.schedule(loop_state.elapsed.steps)
        value = injected_hyperparam(loop_state.state, self.name)
        if value is None:
            raise ValueError(_NO_LR.format(self.name))
        return value

    def __loop_callback__(self, loop_state: LoopState) -> Logs:
        return Logs().add_metric(self.name, self.read(loop_state))

    def on_train_batch_end(
        self, state: Any, batch: Any, elapsed: Elapsed, loop_state: LoopState
    ) -> Logs | None:
        if self._last is not None and elapsed.steps - self._last < self.steps:
            return None
        self._last = elapsed.steps
        return self.__loop_callback__(loop_state)


learning_rate_monitor = LearningRateMonitor
"""Another name of :class:`LearningRateMonitor` (the same class)."""
