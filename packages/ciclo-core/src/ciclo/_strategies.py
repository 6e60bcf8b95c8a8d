"""Strategies: *where and how* a managed step runs (eagerly, jitted, over several devices).

A strategy is a small bundle of functions, like an optax transformation:

- ``place_state(state) -> state``: put the state where the strategy wants it (once, when the
  state gets the strategy).
- ``place_batch(batch) -> batch``: put a batch where the compiled step wants it (every step).
- ``compile(fn) -> fn``: turn ``fn(state, batch) -> (logs, state)`` into the callable to run.

Strategies are looked up by name (``"eager"``, ``"jit"``, ``"data-parallel"`` ...);
:func:`register_strategy` adds a name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax

__all__ = [
    "Strategy",
    "eager",
    "jit",
    "register_strategy",
    "get_strategy",
    "strategy_names",
]

StepFn = Callable[..., Any]


class Strategy(NamedTuple):
    """How a managed step runs. Build one with a factory (:func:`jit`, :func:`eager`, ...)
    or write your own and :func:`register_strategy` it.

    Attributes:
        name: the name it is known by.
        place_state: ``state -> state``, called when a state takes this strategy.
        place_batch: ``batch -> batch``, called on every batch before the step.
        compile: ``fn -> fn``, called once per step function.
    """

    name: str
    place_state: Callable[[Any], Any]
    place_batch: Callable[[Any], Any]
    compile: Callable[[StepFn], StepFn]


def _identity(value: Any) -> Any:
    return value


def eager() -> Strategy:
    """Runs steps as plain Python (no compilation): for debugging with ``print``/``pdb``.

    Example:
        >>> import ciclo
        >>> ciclo.managed.eager().name
        'eager'
    """
    return Strategy("eager", _identity, _identity, _identity)


def jit(*, donate: bool = False) -> Strategy:
    """Compiles steps with ``jax.jit`` on the default device.

    Args:
        donate: donate the input state's buffers to the output (saves memory; the state
            passed in must not be used afterwards).

    Example:
        >>> import ciclo
        >>> ciclo.managed.jit(donate=True).name
        'jit'
    """

    def compile_step(fn: StepFn) -> StepFn:
        return jax.jit(fn, donate_argnums=(0,) if donate else ())

    return Strategy("jit", _identity, _identity, compile_step)


_REGISTRY: dict[str, Callable[[], Strategy]] = {}
_INSTANCES: dict[str, Strategy] = {}


def register_strategy(name: str, factory: Callable[[], Strategy]) -> None:
    """Makes ``factory()`` available as ``strategy=name``.

    Example:
        >>> import ciclo
        >>> ciclo.managed.register_strategy("jit-donate", lambda: ciclo.managed.jit(donate=True))
        >>> ciclo.managed.get_strategy("jit-donate").name
        'jit'
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"a strategy name must be a non-empty string, got {name!r}.")
    if not callable(factory):
        raise TypeError(
            f"register_strategy({name!r}, factory): factory must be a callable returning a "
            f"ciclo.managed.Strategy, got {factory!r}."
        )
    _REGISTRY[name] = factory
    _INSTANCES.pop(name, None)


def strategy_names() -> list[str]:
    """The registered strategy names."""
    return sorted(_REGISTRY)


def get_strategy(strategy: str | Strategy) -> Strategy:
    """The :class:`Strategy` for a name (one shared instance per name) or the strategy itself."""
    if isinstance(strategy, Strategy):
        return strategy
    if not isinstance(strategy, str):
        raise TypeError(
            f"strategy must be a name such as 'jit' or a ciclo.managed.Strategy, got {strategy!r}."
        )
    name = strategy
    if name not in _INSTANCES:
        if name not in _REGISTRY:
            raise ValueError(
                f"unknown strategy {name!r}; known strategies: {strategy_names()}. "
                f"Add your own with ciclo.managed.register_strategy(name, factory)."
            )
        made = _REGISTRY[name]()
        if not isinstance(made, Strategy):
            raise TypeError(
                f"the factory registered for strategy {name!r} returned {made!r}, not a "
                f"ciclo.managed.Strategy."
            )
        _INSTANCES[name] = made
    return _INSTANCES[name]


register_strategy("eager", eager)
register_strategy("jit", jit)
