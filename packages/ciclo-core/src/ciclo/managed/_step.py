"""Managed steps: ``train_step`` and ``step`` make a :class:`ManagedStep`, which runs a
step function under its state's strategy (compiled once per strategy and statics, see
``_compile.py``), as a function, a state's method, or a loop callback."""

from __future__ import annotations

import functools
from collections.abc import Hashable, Sequence
from typing import Any

import jax
import numpy as np

from .._loop._naming import count_positional
from .._loop._returns import NO_CHANGE, parse_return
from .._loop._state import LoopState
from .._records._logs import Logs
from ._auto import AutoFusion
from ._compile import StepFunction, fuse, run_group, step_body
from ._strategies import Strategy, identity

__all__ = ["ManagedStep", "step", "train_step"]


class ManagedStep:
    """A step that runs under its state's strategy; made by :func:`train_step` or :func:`step`.

    Call it as ``logs, state = my_step(state, batch)``, as a method
    (``state.train_step(batch)``) when defined in a :class:`ManagedState` subclass, or put it
    in a loop's tasks: as a loop callback it always runs on the loop's current state.

    Under a strategy with ``steps_per_call=K``, a loop runs up to K consecutive batches in
    one compiled call (see :func:`ciclo.loop` for how it groups them); :meth:`many` does the
    same for your own loops. Under ``accumulate_steps=N`` a train step splits each batch
    into N micro-batches and makes one optimizer update from their averaged gradients.

    Broadcasts and statics: a step function may take two more positional arguments,
    ``fn(state, batch, broadcasts, statics)``. ``broadcasts`` is a pytree of arrays that
    every device gets whole (a teacher's parameters, a lookup table, a loss weight);
    ``statics`` is a hashable value fixed at compile time (a mode string, a tuple of
    flags): Python may branch on it, and each distinct value compiles the step once (an
    equal value reuses the compiled step). Pass them in a call,
    ``my_step(state, batch, broadcasts, statics)``, or bind them for a loop with
    :meth:`bind`; both default to ``None``.
    """

    __name__: str
    __qualname__: str

    def __init__(
        self,
        fn: StepFunction,
        *,
        differentiate: bool,
        broadcasts: Any = None,
        statics: Hashable = None,
        compiled: dict[tuple[Strategy, bool | str, Hashable], StepFunction] | None = None,
    ) -> None:
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.differentiate = differentiate
        self.arity = max(2, count_positional(fn, 4) or 2)  # of (state, batch, broadcasts, statics)
        self.broadcasts = broadcasts
        self.statics = statics
        # Shared by the steps bind() makes: one compilation per strategy and statics.
        self._compiled = {} if compiled is None else compiled
        # This step's own calls without arguments, by strategy (see __call__).
        self._calls: dict[Strategy, StepFunction] = {}
        self._auto: dict[Strategy, AutoFusion] = {}  # under steps_per_call="auto"
        self._defined_in: type | None = None  # the class whose body holds it
        self._inherited: dict[type, ManagedStep] = {}  # as read from subclasses (__get__)

    def bind(self, broadcasts: Any = None, statics: Hashable = None) -> ManagedStep:
        """The same step with ``broadcasts`` and ``statics`` fixed: what a loop runs.

        The bound step shares this step's compiled versions; binding another ``statics``
        value compiles once more, an equal one does not. Arguments given in a call still
        take precedence.

        Example:
            >>> import ciclo, jax.numpy as jnp
            >>> @ciclo.managed.step
            ... def scaled(state, batch, broadcasts, statics):
            ...     value = batch.sum() * broadcasts["scale"]
            ...     return ciclo.logs().add_metric(statics, value), state
            >>> state = ciclo.managed.ManagedState.create(params={}, tx=None)
            >>> step = scaled.bind({"scale": jnp.array(2.0)}, statics="total")
            >>> logs, state = step(state, jnp.ones(3))
            >>> float(logs.metrics.total)
            6.0
        """
        self._check_args(broadcasts, statics)
        return ManagedStep(
            self.fn,
            differentiate=self.differentiate,
            broadcasts=broadcasts,
            statics=statics,
            compiled=self._compiled,
        )

    def _check_args(self, broadcasts: Any, statics: Any) -> None:
        given = [
            name
            for name, value, position in (("broadcasts", broadcasts, 3), ("statics", statics, 4))
            if value is not None and self.arity < position
        ]
        if given:
            takes = ("state", "batch", "broadcasts")[: self.arity]
            raise TypeError(
                _TAKES_FEWER.format(name=self.__name__, given=" and ".join(given), takes=takes)
            )
        if statics is not None:
            try:
                hash(statics)
            except TypeError:
                kind = type(statics).__name__
                raise TypeError(
                    _UNHASHABLE_STATICS.format(name=self.__name__, kind=kind, statics=statics)
                ) from None

    def _args(self, broadcasts: Any, statics: Any) -> tuple[Any, Any]:
        """The broadcasts and statics of a call: those given, else the bound ones."""
        if broadcasts is None:
            broadcasts = self.broadcasts
        if statics is None:
            statics = self.statics
        self._check_args(broadcasts, statics)
        return broadcasts, statics

    def _run(self, state: Any, batch: Any, broadcasts: Any, statics: Any) -> tuple[Logs, Any]:
        out = self.fn(state, batch, *(broadcasts, statics)[: self.arity - 2])
        if type(out) is tuple and len(out) == 2 and type(out[0]) is Logs and out[1] is not None:
            return out[0], out[1]  # the common (logs, state)
        logs, new_state = parse_return(out, f"managed step {self.__name__}", "managed step")
        return (Logs() if logs is None else logs), (state if new_state is NO_CHANGE else new_state)

    def compiled_for(
        self, strategy: Strategy, *, fused: bool | str = False, statics: Hashable = None
    ) -> StepFunction:
        """The step compiled for ``strategy`` and ``statics`` (cached), taking ``(state,
        batch, broadcasts)``; ``fused=True``: the version that takes a tuple of batches and
        returns stacked logs (see :meth:`many`); ``fused="last"``: the loop's, which returns
        ``((stacked logs, the last row's), state)``."""
        key = (strategy, fused, statics)
        compiled = self._compiled.get(key)
        if compiled is None:
            body = step_body(
                self._run,
                self.__name__,
                differentiate=self.differentiate,
                strategy=strategy,
                statics=statics,
            )
            if fused:
                body = fuse(body, last_row=fused == "last")
            compiled = self._compiled[key] = strategy.compile(body)
        return compiled

    def __call__(
        self, state: Any, batch: Any, broadcasts: Any = None, statics: Hashable = None
    ) -> tuple[Logs, Any]:
        if broadcasts is None and statics is None:
            # The per-step path: one lookup of the call prepared for this strategy.
            try:
                run = self._calls.get(state.strategy)
            except (AttributeError, TypeError):
                run = None
            if run is not None:
                return run(state, batch, None)
        strategy = self._strategy_of(state)
        if broadcasts is None and statics is None:
            run = self._calls[strategy] = self._prepared(strategy)
            return run(state, batch, None)
        broadcasts, statics = self._args(broadcasts, statics)
        return self.compiled_for(strategy, statics=statics)(
            state, strategy.place_batch(batch), strategy.place_broadcasts(broadcasts)
        )

    def _prepared(self, strategy: Strategy) -> StepFunction:
        """``(state, batch, None) -> (logs, state)`` with the bound broadcasts and statics:
        the compiled step itself when there is nothing to place (the per-step path then
        makes no Python call of ciclo's between the state and the jitted step: see
        benchmarks/haiku_step.py), else with only the placements that do something."""
        compiled = self.compiled_for(strategy, statics=self.statics)
        place_batch, place_broadcasts = strategy.place_batch, strategy.place_broadcasts
        broadcasts = self.broadcasts
        if broadcasts is not None:
            return lambda state, batch, _: compiled(
                state, place_batch(batch), place_broadcasts(broadcasts)
            )
        if place_batch is identity:
            return compiled
        return lambda state, batch, _: compiled(state, place_batch(batch), None)

    def many(
        self,
        state: Any,
        batches: Sequence[Any],
        broadcasts: Any = None,
        statics: Hashable = None,
    ) -> tuple[Logs, Any]:
        """Runs one step per batch in a single compiled call (``lax.scan``).

        Args:
            state: a :class:`ManagedState`.
            batches: batches of identical shapes.
            broadcasts, statics: as in a single call (the same for every batch).

        Returns:
            ``(logs, state)``: every log value stacked along a new first axis (one row per
            batch), and the state after the last batch.

        Example:
            >>> import ciclo, jax.numpy as jnp
            >>> state = ciclo.managed.ManagedState.create(params={}, tx=None)
            >>> @ciclo.managed.step
            ... def count(state, batch):
            ...     return ciclo.logs().add_metric("sum", batch.sum()), state
            >>> logs, state = count.many(state, [jnp.ones(2), 2 * jnp.ones(2)])
            >>> logs.metrics.sum.tolist()
            [2.0, 4.0]
        """
        strategy = self._strategy_of(state)
        broadcasts, statics = self._args(broadcasts, statics)
        batches = tuple(batches)
        if not batches:
            raise ValueError(f"{self.__name__}.many(state, batches) needs at least one batch.")
        first = _shapes(batches[0])
        for i, batch in enumerate(batches[1:], 1):
            if _shapes(batch) != first:
                raise ValueError(
                    _SHAPES_DIFFER.format(
                        name=self.__name__, i=i, shapes=_shapes(batch)[1], first=first[1]
                    )
                )
        placed = tuple(strategy.place_batch(batch) for batch in batches)
        return self.compiled_for(strategy, fused=True, statics=statics)(
            state, placed, strategy.place_broadcasts(broadcasts)
        )

    def lower(
        self, state: Any, batch: Any, broadcasts: Any = None, statics: Hashable = None
    ) -> Any:
        """The compiled call of one step on ``state`` and ``batch``, lowered and not run (a
        ``jax.stages.Lowered``, as ``jax.jit(f).lower`` gives): ``.compile().cost_analysis()``
        gives its FLOPs (see :func:`ciclo.callbacks.compiled_flops`).

        Example:
            >>> import ciclo, jax.numpy as jnp
            >>> @ciclo.managed.step
            ... def total(state, batch):
            ...     return ciclo.logs().add_metric("total", batch.sum()), state
            >>> state = ciclo.managed.ManagedState.create(params={}, tx=None)
            >>> type(total.lower(state, jnp.ones(3))).__name__
            'Lowered'
        """
        strategy = self._strategy_of(state)
        broadcasts, statics = self._args(broadcasts, statics)
        compiled = self.compiled_for(strategy, statics=statics)
        lower = getattr(compiled, "lower", None) or jax.jit(compiled).lower  # eager: not jitted
        return lower(state, strategy.place_batch(batch), strategy.place_broadcasts(broadcasts))

    def __loop_lower__(self, loop_state: LoopState) -> Any:
        return self.lower(loop_state.state, loop_state.batch)

    def _strategy_of(self, state: Any) -> Strategy:
        strategy = getattr(state, "strategy", None)
        if not isinstance(strategy, Strategy):
            raise TypeError(_NOT_A_STATE.format(name=self.__name__, kind=type(state).__name__))
        return strategy

    def __loop_callback__(self, loop_state: LoopState) -> tuple[Logs, Any]:
        if self._auto:  # steps_per_call="auto": the call's time is measured
            auto = self._auto.get(getattr(loop_state.state, "strategy", None))  # type: ignore[arg-type]
            if auto is not None:
                return auto.timed(self, loop_state.state, loop_state.batch)  # type: ignore[no-any-return]
        return self(loop_state.state, loop_state.batch)

    def __loop_end__(self, loop_state: LoopState, error: BaseException | None) -> None:
        if self._auto:  # steps_per_call="auto": the loop's end may close a measurement
            auto = self._auto.get(getattr(loop_state.state, "strategy", None))  # type: ignore[arg-type]
            if auto is not None:
                auto.loop_ended(loop_state, error)

    def __loop_steps_per_call__(self, loop_state: LoopState) -> int:
        strategy = getattr(loop_state.state, "strategy", None)
        if not isinstance(strategy, Strategy):
            return 1
        if strategy.steps_per_call == "auto":
            auto = self._auto.get(strategy)
            if auto is None:
                auto = self._auto[strategy] = AutoFusion()
            return auto.steps(loop_state)
        return strategy.steps_per_call

    def __loop_callback_many__(
        self, loop_state: LoopState, batches: Sequence[Any]
    ) -> tuple[Logs, Any, Logs]:
        """:meth:`many` for a loop's group (the group checked its batches' shapes)."""
        strategy = self._strategy_of(loop_state.state)
        run = self.compiled_for(strategy, fused="last", statics=self.statics)
        place, broadcasts = strategy.place_batch, strategy.place_broadcasts(self.broadcasts)

        def call(state: Any, part: tuple[Any, ...]) -> Any:
            return run(state, part if place is identity else tuple(map(place, part)), broadcasts)

        return run_group(call, loop_state.state, batches, self._auto.get(strategy))

    def __set_name__(self, owner: type, name: str) -> None:
        if self._defined_in is None:
            self._defined_in = owner

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            if owner is None or self._defined_in in (None, owner):
                return self
            return self._as_read_from(owner)
        return _BoundStep(self, instance)

    def _as_read_from(self, owner: type) -> ManagedStep:
        """This step as ``owner.train_step`` for a subclass ``owner``: the same step
        (sharing its compiled calls), named after ``owner`` in errors (``NNXState.train_step``,
        not the base class's name)."""
        step = self._inherited.get(owner)
        if step is None:
            step = ManagedStep(
                self.fn,
                differentiate=self.differentiate,
                broadcasts=self.broadcasts,
                statics=self.statics,
                compiled=self._compiled,
            )
            step.__qualname__ = f"{owner.__qualname__}.{self.__name__}"
            step._defined_in = owner
            self._inherited[owner] = step
        return step

    def __repr__(self) -> str:
        kind = "train_step" if self.differentiate else "step"
        return f"<ciclo.managed.{kind} {self.__name__}>"


class _BoundStep:
    """``state.train_step``: callable with a batch; as a loop callback it uses the loop's
    current state, not the one it was read from."""

    __slots__ = ("instance", "step")

    def __init__(self, step: ManagedStep, instance: Any) -> None:
        self.step, self.instance = step, instance

    @property
    def __name__(self) -> str:  # type: ignore[override]
        return self.step.__name__

    def __getattr__(self, name: str) -> Any:
        # Computed when asked (error messages), not at every `state.train_step`.
        if name == "__qualname__":
            return f"{type(self.instance).__name__}.{self.step.__name__}"
        raise AttributeError(name)

    def __call__(
        self, batch: Any = None, broadcasts: Any = None, statics: Hashable = None
    ) -> tuple[Logs, Any]:
        if broadcasts is None and statics is None:  # the per-step path (see ManagedStep)
            instance = self.instance
            try:
                run = self.step._calls.get(instance.strategy)
            except (AttributeError, TypeError):
                run = None
            if run is not None:
                return run(instance, batch, None)
        return self.step(self.instance, batch, broadcasts, statics)

    def many(
        self, batches: Sequence[Any], broadcasts: Any = None, statics: Hashable = None
    ) -> tuple[Logs, Any]:
        """:meth:`ManagedStep.many` on this state."""
        return self.step.many(self.instance, batches, broadcasts, statics)

    def bind(self, broadcasts: Any = None, statics: Hashable = None) -> _BoundStep:
        """:meth:`ManagedStep.bind`, still a method of this state (a loop callback that runs
        on the loop's current state)."""
        return _BoundStep(self.step.bind(broadcasts, statics), self.instance)

    def __loop_callback__(self, loop_state: LoopState) -> tuple[Logs, Any]:
        return self.step.__loop_callback__(loop_state)

    def __loop_end__(self, loop_state: LoopState, error: BaseException | None) -> None:
        self.step.__loop_end__(loop_state, error)

    def __loop_steps_per_call__(self, loop_state: LoopState) -> int:
        return self.step.__loop_steps_per_call__(loop_state)

    def __loop_callback_many__(
        self, loop_state: LoopState, batches: Sequence[Any]
    ) -> tuple[Logs, Any, Logs]:
        return self.step.__loop_callback_many__(loop_state, batches)

    def __loop_lower__(self, loop_state: LoopState) -> Any:
        return self.step.lower(loop_state.state, loop_state.batch)


def _shapes(batch: Any) -> tuple[Any, list[tuple[int, ...]]]:
    leaves, treedef = jax.tree_util.tree_flatten(batch)
    return treedef, [tuple(np.shape(leaf)) for leaf in leaves]


def train_step(fn: StepFunction) -> ManagedStep:
    """Decorates ``fn(state, batch) -> (logs, state)``: ciclo differentiates the sum of
    ``logs.losses`` w.r.t. ``state.params``, applies the optimizer (other changes ``fn``
    makes to the state are kept) and runs it under ``state.strategy``.

    Example:
        >>> import ciclo, jax.numpy as jnp, optax
        >>> @ciclo.managed.train_step
        ... def train_step(state, batch):
        ...     x, y = batch
        ...     loss = jnp.mean((x @ state.params["w"] - y) ** 2)
        ...     return ciclo.logs().add_loss("loss", loss), state
        >>> state = ciclo.managed.ManagedState.create(params={"w": jnp.zeros(2)}, tx=optax.sgd(0.1))
        >>> logs, state = train_step(state, (jnp.ones((4, 2)), jnp.ones(4)))
        >>> int(state.step)
        1
    """
    _check_step_function(fn, "train_step")
    return ManagedStep(fn, differentiate=True)


def step(fn: StepFunction) -> ManagedStep:
    """Decorates ``fn(state, batch) -> (logs, state)`` to run under ``state.strategy``
    without gradients (evaluation, prediction, metric updates).

    Example:
        >>> import ciclo, jax.numpy as jnp, optax
        >>> @ciclo.managed.step
        ... def test_step(state, batch):
        ...     return ciclo.logs().add_metric("mean", batch.mean()), state
        >>> state = ciclo.managed.ManagedState.create(params={}, tx=None)
        >>> logs, _ = test_step(state, jnp.ones(4))
        >>> float(logs.metrics.mean)
        1.0
    """
    _check_step_function(fn, "step")
    return ManagedStep(fn, differentiate=False)


def _check_step_function(fn: Any, decorator: str) -> None:
    if not callable(fn):
        raise TypeError(_NOT_A_FUNCTION.format(decorator=decorator, fn=fn, kind=type(fn).__name__))


_TAKES_FEWER = (
    "managed step {name} was given {given}, but it takes only {takes}. Define it as "
    "def {name}(state, batch, broadcasts, statics): ..."
)
_UNHASHABLE_STATICS = (
    "managed step {name}: statics must be hashable (it is static under jit), got {kind} "
    "{statics!r}. Use a tuple, a string, a number or a frozen dataclass; put arrays in "
    "broadcasts."
)
_SHAPES_DIFFER = (
    "{name}.many: batch {i} has shapes {shapes}, but batch 0 has {first}; fused steps need "
    "batches of the same shapes (drop or pad the incomplete last batch)."
)
_NOT_A_STATE = (
    "managed step {name} needs a ciclo.managed.ManagedState (with a strategy), got {kind}. "
    "Create one with ciclo.managed.ManagedState.create(params=..., tx=...)."
)
_NOT_A_FUNCTION = (
    "ciclo.managed.{decorator}({fn!r}): expected the step function to decorate, got {kind}. "
    "Use it as a decorator: @ciclo.managed.{decorator} above def {decorator}(state, batch): ..."
)
