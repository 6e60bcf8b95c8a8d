"""Predefined loops on top of :func:`ciclo.loop`: ``train_loop``, ``test_loop`` and
``predict_loop``, and the named schedules they run.

Where callbacks come from, for each named schedule, in this order:

1. ``tasks`` entries under it (``{ciclo.on_epoch_end: [...]}`` or ``{"on_epoch_end": ...}``);
2. the objects of ``callbacks=[...]``, in list order, through their method of that name;
3. for the step schedules (``on_train_step``, ``on_test_step``, ``on_predict_step``,
   ``on_reset_step``): the state's own method (``train_step``, ...), only when neither
   ``tasks`` nor ``callbacks`` gives anything for it. Giving ``on_train_step`` callbacks
   thus *replaces* the state's ``train_step`` instead of running a second training step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._loop._callback import callback_name, positional_arity
from .._loop._engine import loop
from .._loop._hooks import LoopCallback, LoopCallbackBase, named_hooks
from .._loop._in_flight import InFlight
from .._loop._state import LoopState
from .._records._history import History
from .._records._logs import Logs
from .._time._elapsed import Elapsed, Period
from .._time._schedules import Schedule, always, every
from .._time._units import period_unit
from ..callbacks._inner_loop import AggregationSpec, Aggregator, inner_loop
from ._named import NAMED_SCHEDULES, STATE_METHODS, NamedSchedule, named_schedule

__all__ = [
    "train_loop",
    "test_loop",
    "predict_loop",
    "TRAIN_SCHEDULES",
    "TEST_SCHEDULES",
    "PREDICT_SCHEDULES",
]

TRAIN_SCHEDULES = (
    "on_train_begin",
    "on_reset_step",
    "on_epoch_begin",
    "on_train_batch_begin",
    "on_train_step",
    "on_train_batch_end",
    "on_epoch_end",
    "on_train_end",
)
TEST_SCHEDULES = (
    "on_test_begin",
    "on_reset_step",
    "on_test_batch_begin",
    "on_test_step",
    "on_test_batch_end",
    "on_test_end",
)
PREDICT_SCHEDULES = (
    "on_predict_begin",
    "on_reset_step",
    "on_predict_batch_begin",
    "on_predict_step",
    "on_predict_batch_end",
    "on_predict_end",
)
_OWNER = {
    **{n: "predict_loop" for n in PREDICT_SCHEDULES},
    **{n: "test_loop (or train_loop's evaluation)" for n in TEST_SCHEDULES},
    **{n: "train_loop" for n in TRAIN_SCHEDULES},
    "on_reset_step": "every loop",
}

#: The aggregation of test_loop: sample-weighted means of losses and metrics, the last
#: value of stateful metrics and of other collections, no outputs.
TEST_AGGREGATION: dict[str, Any] = {
    "losses": "mean",
    "metrics": "mean",
    "stateful_metrics": "last",
    "outputs": None,
}


class _Hook:
    """An internal loop callback: ``fn(loop_state)``, named for error messages."""

    def __init__(self, name: str, fn: Callable[[LoopState], Any]) -> None:
        self.fn = fn
        self.__qualname__ = name

    def __loop_callback__(self, loop_state: LoopState) -> Any:
        return self.fn(loop_state)


class _StateMethod:
    """Calls the *current* state's method (``state.train_step(batch)``): the state is
    replaced at every step, so the method is looked up on each call."""

    def __init__(self, method: str) -> None:
        self.method = method
        self.__qualname__ = f"state.{method}"
        self._arity: dict[type, int] = {}

    def __loop_callback__(self, loop_state: LoopState) -> Any:
        state = loop_state.state
        bound = getattr(state, self.method)
        arity = self._arity.get(type(state))
        if arity is None:
            arity = self._arity[type(state)] = positional_arity(bound)
            if arity > 3:
                raise TypeError(
                    f"state.{self.method} takes {arity} arguments besides the state; a loop "
                    f"passes at most (batch, elapsed, loop_state)."
                )
        return bound(*(loop_state.batch, loop_state.elapsed, loop_state)[:arity])


def _state_hook(state: Any, method: str) -> Any:
    """The callback for the state's own step method. A managed step (a class attribute
    with ``__loop_callback__``) already runs on the loop's current state and can fuse
    steps, so it is registered as it is; a plain method is looked up on each call."""
    attribute = getattr(type(state), method, None)
    if isinstance(attribute, LoopCallback):
        return attribute
    return _StateMethod(method)


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, list | tuple):
        return list(value)
    return [value]


def _overrides_default_schedule(obj: Any) -> bool:
    return (
        isinstance(obj, LoopCallbackBase)
        and type(obj).default_schedule is not LoopCallbackBase.default_schedule
    )


_STEP_SLOT = object()  # where the step schedule's callbacks go among ordinary tasks


class _Registry:
    """The callbacks of one predefined loop, sorted by named schedule.

    Attributes:
        named: named schedule -> callbacks (tasks first, then callback objects, then the
            state's method for step schedules).
        step_phase: ``(schedule, callbacks)`` of the step, in ``tasks`` order: the ordinary
            schedules, with the step schedule's callbacks at its position in ``tasks``
            (first when ``tasks`` does not name it).
    """

    def __init__(
        self,
        loop_name: str,
        names: Sequence[str],
        step_name: str,
        state: Any,
        tasks: Mapping[Any, Any] | None,
        callbacks: Sequence[Any] | None,
    ) -> None:
        self.loop_name, self.names, self.step_name = loop_name, names, step_name
        self.named: dict[str, list[Any]] = {n: [] for n in names}
        self.step_phase: list[tuple[Any, Any]] = []
        self._add_tasks(tasks)
        self._add_objects(callbacks)
        for schedule_name, method in STATE_METHODS.items():
            if (
                schedule_name in self.named
                and not self.named[schedule_name]
                and callable(getattr(state, method, None))
            ):
                self.named[schedule_name].append(_state_hook(state, method))
        if self.named[step_name] and not any(s is _STEP_SLOT for s, _ in self.step_phase):
            self.step_phase.insert(0, (_STEP_SLOT, None))

    def _named(self, key: NamedSchedule | str) -> str:
        name = named_schedule(key).name
        if name not in self.named:
            raise ValueError(
                f"{NAMED_SCHEDULES[name]!r} is not a moment of {self.loop_name}: it belongs to "
                f"{_OWNER[name]}. {self.loop_name} runs {', '.join(self.names)}."
            )
        return name

    def _add_tasks(self, tasks: Mapping[Any, Any] | None) -> None:
        if tasks is None:
            return
        if not isinstance(tasks, Mapping):
            raise TypeError(
                f"{self.loop_name}: tasks must be a dict {{schedule: callback or [callbacks]}}, "
                f"got {type(tasks).__name__}. Example: {{ciclo.on_epoch_end: report}}."
            )
        for key, callbacks in tasks.items():
            if isinstance(key, NamedSchedule | str):
                name = self._named(key)
                if name == self.step_name and not self.named[name]:
                    self.step_phase.append((_STEP_SLOT, None))
                self.named[name].extend(_as_list(callbacks))
            else:
                self.step_phase.append((key, callbacks))

    def _add_objects(self, callbacks: Sequence[Any] | None) -> None:
        if callbacks is None:
            return
        if not isinstance(callbacks, list | tuple):
            raise TypeError(
                f"{self.loop_name}: callbacks must be a list of callback objects, got "
                f"{type(callbacks).__name__}. Example: callbacks=[ciclo.keras_bar(1000)]."
            )
        for obj in callbacks:
            hooks = named_hooks(obj, NAMED_SCHEDULES)
            used = [n for n in hooks if n in self.named]
            for name in used:
                self.named[name].append(getattr(obj, name))
            if used:
                continue
            if _overrides_default_schedule(obj):
                self.step_phase.append((obj.default_schedule(), obj))
                continue
            has = f"its hooks are {', '.join(hooks)}" if hooks else "it has no hook method"
            raise TypeError(
                f"callback {callback_name(obj)} has no hook that {self.loop_name} calls ({has}). "
                f"An object in callbacks=[...] needs a method named after a schedule of "
                f"{self.loop_name} ({', '.join(self.names)}), e.g. "
                f"`def on_epoch_end(self, state, batch, elapsed, loop_state): ...`, or a "
                f"default_schedule() (a ciclo.LoopCallbackBase). Functions and other objects go "
                f"in tasks under a schedule: tasks={{ciclo.every(100): callback}}."
            )

    def step_tasks(self) -> list[tuple[Any, list[Any]]]:
        """The step phase with the step schedule's callbacks in place."""
        return [
            (always(), self.named[self.step_name]) if s is _STEP_SLOT else (s, c)
            for s, c in self.step_phase
        ]

    def require_step(self, method: str) -> None:
        if not self.step_phase:
            raise ValueError(
                f"{self.loop_name} has no {method}: give tasks={{ciclo.{self.step_name}: "
                f"{method}}} (a function taking the first 0-4 of (state, batch, elapsed, "
                f"loop_state)), or a state with a `{method}` method."
            )


def _loop_tasks(*pairs: tuple[Any, list[Any]]) -> dict[Any, Any]:
    """A tasks dict for ``loop`` from ``(schedule, callbacks)`` pairs; empty ones skipped.

    Internal steps use fresh ``always()`` keys, so user schedules keep their place and
    their identity (for resuming)."""
    out: dict[Any, Any] = {}
    for schedule, callbacks in pairs:
        if isinstance(schedule, _EpochClock):  # asked every step, runs nothing
            out[schedule] = []
            continue
        if callbacks is None or (isinstance(callbacks, list) and not callbacks):
            continue
        if schedule in out:  # the same schedule object twice: run both, in order
            out[schedule] = [*_as_list(out[schedule]), *_as_list(callbacks)]
        else:
            out[schedule] = callbacks
    return out


class _Flag(Schedule):
    """Fires when the train loop's clock says so for the current step."""

    def __init__(self, get: Callable[[], bool], label: str, *inner: Schedule) -> None:
        self.get, self.label, self.inner = get, label, inner

    def __call__(self, elapsed: Elapsed) -> bool:
        return self.get()

    def children(self) -> tuple[Schedule, ...]:
        return self.inner

    def __repr__(self) -> str:
        return f"train_loop.{self.label}"


class _EpochClock(Schedule):
    """Asked first in every training step (a schedule that never fires), it decides from
    the count *after* the step whether the step ends an epoch and which evaluations
    follow it; an epoch begins at the first step of the loop (when the count is on an
    epoch boundary, e.g. 0) and at the step after one ended. An evaluation set without a
    duration of its own follows epoch ends. Being a schedule rather than a callback, it does
    not split a fused group of steps."""

    def __init__(
        self, epoch: tuple[str, float] | None, tests: Mapping[str, tuple[str, float] | None]
    ) -> None:
        self.epoch = epoch
        self.epoch_schedule = every(**{epoch[0]: epoch[1]}) if epoch else None  # type: ignore[arg-type]
        self.test_schedules = {
            name: every(**{test[0]: test[1]}) if test else None  # type: ignore[arg-type]
            for name, test in tests.items()
        }
        self.begins = self.ends = False
        self.due = dict.fromkeys(tests, False)
        self.first = True
        self.loop_state: LoopState | None = None
        self.bind = _Hook("train_loop clock", self._bind)

    def _bind(self, loop_state: LoopState) -> None:
        self.loop_state = loop_state

    def __call__(self, elapsed: Elapsed) -> bool:
        assert self.loop_state is not None, "the clock is bound in on_start"
        self.tick(elapsed, self.loop_state.elapsed_after_step())
        return False

    def tick(self, before: Elapsed, after: Elapsed) -> None:
        if self.first:
            if self.epoch is None:
                self.begins = True
            else:
                unit, amount = self.epoch
                self.begins = getattr(before, unit) % amount == 0
            # Show the schedules where this loop starts, so that a boundary crossed by the
            # first step counts (a continued run may start mid-epoch).
            for schedule in self._schedules():
                schedule(before)
            self.first = False
        else:
            self.begins = self.ends
        self.ends = self.epoch_schedule(after) if self.epoch_schedule else False
        for name, test in self.test_schedules.items():
            self.due[name] = test(after) if test else self.ends

    def _schedules(self) -> tuple[Schedule, ...]:
        candidates = (self.epoch_schedule, *self.test_schedules.values())
        return tuple(s for s in candidates if s is not None)

    def children(self) -> tuple[Schedule, ...]:
        return self._schedules()

    def state_dict(self) -> dict[str, Any]:
        # A resumed run needs to know whether the last step ended an epoch (the next one
        # then begins one): the count alone does not say it for epochs in samples or time.
        return {**super().state_dict(), "first": self.first, "ends": self.ends}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.first, self.ends = bool(state["first"]), bool(state["ends"])

    def __repr__(self) -> str:
        return "train_loop.clock"

    def flag(self, attribute: str) -> _Flag:
        inner = self.epoch_schedule if attribute == "ends" else None
        return _Flag(lambda: bool(getattr(self, attribute)), attribute, *([inner] if inner else []))

    def test_flag(self, name: str) -> _Flag:
        inner = self.test_schedules[name]
        return _Flag(lambda: self.due[name], f"test_due[{name!r}]", *([inner] if inner else []))


def _evaluation_sets(
    test_dataset: Any, test_duration: Any, test_name: str
) -> dict[str, tuple[Callable[[], Iterable[Any]], tuple[str, float] | None]]:
    """``{name: (factory, (unit, amount) or None)}`` from train_loop's arguments."""
    if test_dataset is None:
        if test_duration is not None:
            raise ValueError("test_duration needs a test_dataset (a function returning one).")
        return {}
    if isinstance(test_dataset, Mapping):
        factories = dict(test_dataset)
        if not factories:
            raise ValueError(
                "test_dataset is an empty dict; give {name: function returning a dataset}, "
                "e.g. {'valid': make_valid, 'test': make_test}, or None."
            )
        if test_name != "test":
            raise TypeError(
                f"test_name={test_name!r} names a single test_dataset; with a dict of "
                f"evaluation sets the keys are the names ({', '.join(map(repr, factories))})."
            )
    else:
        factories = {test_name: test_dataset}
    for name, factory in factories.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"test_dataset names must be non-empty strings, got {name!r}.")
        if not callable(factory):
            where = (
                "test_dataset"
                if len(factories) == 1 and name == test_name
                else (f"test_dataset[{name!r}]")
            )
            raise TypeError(
                f"{where} must be a zero-argument function returning a fresh dataset "
                f"(it is called at each evaluation), got {type(factory).__name__}. "
                f"Example: {where}=lambda: make_batches(x_test, y_test)."
            )
    if isinstance(test_duration, Mapping):
        unknown = [name for name in test_duration if name not in factories]
        if unknown:
            raise ValueError(
                f"test_duration names {unknown}, which test_dataset does not have; its "
                f"evaluation sets are {list(factories)}."
            )
        durations = dict(test_duration)
    else:
        durations = dict.fromkeys(factories, test_duration)
    return {
        name: (
            factory,
            None
            if durations.get(name) is None
            else period_unit(durations[name], f"test_duration for {name!r}"),
        )
        for name, factory in factories.items()
    }


def _check_no_hooks(loop_name: str, loop_kwargs: Mapping[str, Any]) -> None:
    for key, named in (("on_start", "begin"), ("on_end", "end")):
        if key in loop_kwargs:
            prefix = loop_name.split("_")[0]
            raise TypeError(
                f"{loop_name} takes no {key}=; use tasks={{ciclo.on_{prefix}_{named}: ...}}."
            )


def train_loop(
    state: Any,
    train_dataset: Iterable[Any],
    tasks: Mapping[Any, Any] | None = None,
    *,
    callbacks: Sequence[Any] | None = None,
    test_dataset: Callable[[], Iterable[Any]]
    | Mapping[str, Callable[[], Iterable[Any]]]
    | None = None,
    epoch_duration: int | Period | None = None,
    test_duration: int | Period | Mapping[str, int | Period | None] | None = None,
    test_name: str = "test",
    stop: int | Period | None = None,
    batch_size_fn: Callable[[Any], int] | None = None,
    history: History | None = None,
    elapsed: Elapsed | None = None,
    metadata: Any = None,
    **loop_kwargs: Any,
) -> tuple[Any, History, Elapsed]:
    """Trains ``state`` on ``train_dataset``, evaluating on ``test_dataset`` after each
    epoch, with callbacks on named schedules (``on_epoch_end``, ...) and ordinary ones.

    Order of events (``elapsed`` is the count before the step, as in :func:`ciclo.loop`)::

        on_train_begin                        once, before the first step
        each step:
          on_reset_step, on_epoch_begin       at the first step of each epoch
          on_train_batch_begin
          on_train_step and ordinary          in tasks order (the step first when tasks
            schedules (ciclo.every(...))      does not name on_train_step)
          on_train_batch_end
          evaluation                          when this step completes a test_duration
                                              (default: an epoch); on a fresh
                                              test_dataset(): on_reset_step, on_test_begin,
                                              [on_test_batch_begin, on_test_step,
                                              on_test_batch_end] per batch, on_test_end
          on_epoch_end                        when this step completes an epoch
        on_train_end                          once, after the last step

    An epoch ends after the step whose count *after* the step crosses a multiple of
    ``epoch_duration`` (steps 0..9 are epoch 1 for ``epoch_duration=10``): evaluation never
    runs after step 0. Without ``epoch_duration`` the whole run is one epoch, evaluated and
    ended in ``on_train_end``'s place. A last epoch cut short by ``stop`` is not evaluated.

    The evaluation's metrics (sample-weighted over the evaluation set, see
    :func:`test_loop`) are renamed ``<name>_<test_name>`` (``accuracy_test``) and join the
    logs of the step that completed the epoch, so ``history.collect("steps", "loss",
    "accuracy_test")`` gives one row per evaluation, and ``on_epoch_end`` callbacks (early
    stopping, checkpoints) see them in ``loop_state.logs``. Evaluation never changes the
    training state (the state the evaluation returns is dropped).

    Several evaluation sets: ``test_dataset={"valid": make_valid, "test": make_test}``
    evaluates each (in dict order, with the same test step and ``on_test_*`` callbacks),
    giving ``accuracy_valid``, ``accuracy_test``...; ``test_duration={"valid": 100}`` gives
    a set its own period (sets it does not name are evaluated at each epoch's end), and a
    single ``test_duration`` applies to every set.

    Args:
        state: the state; its ``train_step``, ``test_step`` and ``reset_step`` methods (if
            any) run under ``on_train_step``, ``on_test_step`` and ``on_reset_step`` unless
            ``tasks`` or ``callbacks`` give callbacks for those schedules.
        train_dataset: an iterable of batches.
        tasks: ``{schedule: callback or [callbacks]}``; a schedule is a named schedule
            (``ciclo.on_epoch_end`` or ``"on_epoch_end"``) or an ordinary one
            (``ciclo.every(100)``), which runs with the training step.
        callbacks: objects whose methods named after schedules (``on_epoch_end``,
            ``on_train_batch_end``, ``on_test_step``...) register themselves, e.g.
            ``[ciclo.keras_bar(1000), ciclo.early_stopping("loss_test", patience=3)]``.
        test_dataset: a zero-argument function returning a fresh evaluation dataset,
            called at each evaluation (``lambda: batches(x_test, y_test)``), or a dict
            ``{name: function}`` of several evaluation sets.
        epoch_duration: an epoch's length: an int (steps) or ``ciclo.at(samples=...)`` /
            ``ciclo.at(time=...)``.
        test_duration: evaluate every this much training instead of every epoch; a dict
            ``{name: duration}`` sets it per evaluation set.
        test_name: the suffix of evaluation entries of a single ``test_dataset`` (with a
            dict, its keys).
        stop: when to stop (an int or a ``ciclo.at(...)``); by default the dataset's end.
        batch_size_fn: ``batch -> int`` to count samples (leading dimension by default).
        history, elapsed, metadata: as in :func:`ciclo.loop`.
        **loop_kwargs: passed on to :func:`ciclo.loop` (``max_steps_in_flight``,
            ``stop_signals``, ...).

    Returns:
        ``(state, history, elapsed)`` like :func:`ciclo.loop`.

    Example:
        >>> import ciclo, jax, numpy as np
        >>> @jax.jit
        ... def train_step(state, batch):
        ...     return ciclo.logs().add_loss("loss", (batch * state).mean()), state * 0.5
        >>> @jax.jit
        ... def test_step(state, batch):
        ...     return ciclo.logs().add_metric("score", (batch * state).mean())
        >>> state, history, elapsed = ciclo.train_loop(
        ...     1.0,
        ...     [np.ones((2, 3))] * 6,
        ...     {ciclo.on_train_step: train_step, ciclo.on_test_step: test_step},
        ...     test_dataset=lambda: [np.ones((2, 3))],
        ...     epoch_duration=3,
        ... )
        >>> history.collect("steps", "score_test")
        ([2, 5], [0.125, 0.015625])
    """
    _check_no_hooks("train_loop", loop_kwargs)
    registry = _Registry(
        "train_loop",
        TRAIN_SCHEDULES + TEST_SCHEDULES,
        "on_train_step",
        state,
        tasks,
        callbacks,
    )
    registry.require_step("train_step")
    named = registry.named
    epoch = None if epoch_duration is None else period_unit(epoch_duration, "epoch_duration")
    sets = _evaluation_sets(test_dataset, test_duration, test_name)
    clock = _EpochClock(epoch, {name: duration for name, (_, duration) in sets.items()})

    if sets and not named["on_test_step"]:
        raise ValueError(
            "train_loop got a test_dataset but no test step: give tasks="
            "{ciclo.on_test_step: test_step}, or a state with a `test_step` method."
        )
    test_tasks = {NAMED_SCHEDULES[n]: named[n] for n in TEST_SCHEDULES if named[n]}

    def evaluation(name: str, make_dataset: Callable[[], Iterable[Any]]) -> Any:
        def run_test(state: Any) -> tuple[Any, Logs, Elapsed]:
            return test_loop(
                state,
                make_dataset(),
                test_tasks,
                batch_size_fn=batch_size_fn,
                metadata=metadata,
                stop_signals=(),  # a Ctrl-C during evaluation stops the training loop
            )

        return inner_loop(name, run_test)

    evaluations = {name: evaluation(name, factory) for name, (factory, _) in sets.items()}
    loop_tasks = _loop_tasks(
        (clock, []),
        (clock.flag("begins"), named["on_reset_step"] + named["on_epoch_begin"]),
        (always(), named["on_train_batch_begin"]),
        *registry.step_tasks(),
        (always(), named["on_train_batch_end"]),
        *((clock.test_flag(name), [callback]) for name, callback in evaluations.items()),
        (clock.flag("ends"), named["on_epoch_end"]),
    )
    on_end: list[Any] = []
    if epoch is None:  # the whole run is one epoch: it ends with the loop
        on_end += [evaluations[name] for name, (_, duration) in sets.items() if not duration]
        on_end += named["on_epoch_end"]
    on_end += named["on_train_end"]
    return loop(
        state,
        train_dataset,
        loop_tasks,
        stop=stop,
        on_start=[clock.bind, *named["on_train_begin"]],
        on_end=on_end,
        history=history,
        elapsed=elapsed,
        batch_size_fn=batch_size_fn,
        metadata=metadata,
        **loop_kwargs,
    )


def _run_batches(
    registry: _Registry,
    prefix: str,
    state: Any,
    dataset: Iterable[Any],
    after_step: Callable[[LoopState], None],
    on_end: list[Any],
    **loop_options: Any,
) -> tuple[Any, History, Elapsed]:
    """The loop of test_loop / predict_loop: ``on_reset_step``, ``on_<prefix>_begin``; per
    batch ``on_<prefix>_batch_begin``, the step phase, ``on_<prefix>_batch_end`` and
    ``after_step`` (which bounds the steps in flight itself); then ``on_end``."""
    named = registry.named
    tasks = _loop_tasks(
        (always(), named[f"on_{prefix}_batch_begin"]),
        *registry.step_tasks(),
        (always(), named[f"on_{prefix}_batch_end"]),
        (always(), [_Hook(registry.loop_name, after_step)]),
    )
    on_start = named["on_reset_step"] + named[f"on_{prefix}_begin"]
    return loop(
        state,
        dataset,
        tasks,
        on_start=on_start,
        on_end=on_end,
        max_steps_in_flight=0,
        **loop_options,
    )


def test_loop(
    state: Any,
    dataset: Iterable[Any],
    tasks: Mapping[Any, Any] | None = None,
    *,
    callbacks: Sequence[Any] | None = None,
    aggregation: AggregationSpec | None = None,
    stop: int | Period | None = None,
    batch_size_fn: Callable[[Any], int] | None = None,
    metadata: Any = None,
    **loop_kwargs: Any,
) -> tuple[Any, Logs, Elapsed]:
    """Evaluates ``state`` on ``dataset`` and returns the metrics aggregated over it.

    Losses and metrics are averaged weighted by the samples of each batch, so they equal
    the metric computed on the whole set at once (a small last batch is not over-weighted);
    stateful metrics keep their last value; outputs are dropped. Aggregation runs on device
    (nothing is fetched per batch); the returned logs hold device values.

    Order: ``on_reset_step``, ``on_test_begin``; per batch ``on_test_batch_begin``,
    ``on_test_step`` with the ordinary schedules of ``tasks`` (in tasks order),
    ``on_test_batch_end``; then ``on_test_end``, whose callbacks see the aggregated logs in
    ``loop_state.logs``.

    Args:
        state: the state; its ``test_step`` / ``reset_step`` methods run unless ``tasks`` or
            ``callbacks`` give callbacks for ``on_test_step`` / ``on_reset_step``.
        dataset: an iterable of batches.
        tasks: ``{schedule: callbacks}``, named (``ciclo.on_test_step``) or ordinary.
        callbacks: objects with hook methods named after test schedules.
        aggregation: overrides per collection, merged into the default
            ``{"losses": "mean", "metrics": "mean", "stateful_metrics": "last",
            "outputs": None}`` (see :func:`ciclo.inner_loop` for the methods).
        stop: evaluate only this much of the dataset.
        batch_size_fn: ``batch -> int``, the weight of a batch (leading dimension by default).
        metadata: as in :func:`ciclo.loop`.
        **loop_kwargs: passed on to :func:`ciclo.loop`.

    Returns:
        ``(state, logs, elapsed)``: the state after the last step, the aggregated logs, and
        the count of evaluation steps and samples.

    Example:
        >>> import ciclo, numpy as np
        >>> def test_step(state, batch):
        ...     return ciclo.logs().add_metric("mean", batch.mean())
        >>> _, logs, elapsed = ciclo.test_loop(
        ...     None, [np.ones(4), np.zeros(2)], {ciclo.on_test_step: test_step}
        ... )
        >>> round(float(logs.metrics.mean), 4), elapsed.samples
        (0.6667, 6)
    """
    _check_no_hooks("test_loop", loop_kwargs)
    registry = _Registry("test_loop", TEST_SCHEDULES, "on_test_step", state, tasks, callbacks)
    registry.require_step("test_step")
    if aggregation is None or isinstance(aggregation, Mapping):
        aggregator = Aggregator({**TEST_AGGREGATION, **(aggregation or {})})
    else:
        aggregator = Aggregator(aggregation)
    in_flight = InFlight(loop_kwargs.pop("max_steps_in_flight", 2))
    result: list[Logs] = []

    def accumulate(loop_state: LoopState) -> None:
        aggregator.add(loop_state.logs, loop_state.batch_size_fn(loop_state.batch))
        in_flight.push_tree(loop_state.logs, loop_state.state)
        loop_state.logs = Logs()  # aggregated: the per-batch logs go no further

    state, _, elapsed = _run_batches(
        registry,
        "test",
        state,
        dataset,
        accumulate,
        [
            _Hook("test_loop aggregation", lambda _: aggregator.result()),
            *registry.named["on_test_end"],
            _Hook("test_loop result", lambda loop_state: result.append(loop_state.logs.copy())),
        ],
        stop=stop,
        batch_size_fn=batch_size_fn,
        metadata=metadata,
        **loop_kwargs,
    )
    return state, result[0], elapsed


test_loop.__test__ = False  # type: ignore[attr-defined]  # not a pytest test when imported


def _concatenate(name: str, values: list[Any]) -> Any:
    def concat(*leaves: Any) -> Any:
        xp = np if all(isinstance(x, np.ndarray | np.generic) for x in leaves) else jnp
        if all(np.ndim(x) == 0 for x in leaves):
            return xp.stack(leaves)
        try:
            return xp.concatenate(leaves, axis=0)
        except (TypeError, ValueError) as error:
            raise ValueError(
                f"predict_loop cannot concatenate output {name!r} along the batch axis: "
                f"{error}. Pass concatenate=False to get one value per batch."
            ) from None

    return jax.tree.map(concat, *values)


def predict_loop(
    state: Any,
    dataset: Iterable[Any],
    tasks: Mapping[Any, Any] | None = None,
    *,
    callbacks: Sequence[Any] | None = None,
    concatenate: bool = False,
    stop: int | Period | None = None,
    batch_size_fn: Callable[[Any], int] | None = None,
    metadata: Any = None,
    **loop_kwargs: Any,
) -> tuple[Any, dict[str, Any], Elapsed]:
    """Runs the prediction step over ``dataset`` and collects its outputs.

    A prediction step returns ``(outputs, logs, state)`` (or logs with an ``outputs``
    collection); a non-dict ``outputs`` is collected under the name ``"outputs"``.
    Outputs stay on device; nothing is fetched per batch.

    Order: ``on_reset_step``, ``on_predict_begin``; per batch ``on_predict_batch_begin``,
    ``on_predict_step`` with the ordinary schedules of ``tasks``, ``on_predict_batch_end``;
    then ``on_predict_end``.

    Args:
        state: the state; its ``predict_step`` method runs unless ``tasks`` or
            ``callbacks`` give callbacks for ``on_predict_step``.
        dataset: an iterable of batches.
        tasks, callbacks: as in :func:`test_loop`, with the predict schedules.
        concatenate: concatenate each output along the batch axis (0-d outputs are
            stacked); by default each output is a list with one value per batch.
        stop, batch_size_fn, metadata, **loop_kwargs: as in :func:`ciclo.loop`.

    Returns:
        ``(state, outputs, elapsed)`` with ``outputs`` a dict ``{name: values}``.

    Example:
        >>> import ciclo, numpy as np
        >>> def predict_step(state, batch):
        ...     return batch * 2, None, None
        >>> _, outputs, _ = ciclo.predict_loop(
        ...     None, [np.ones(2), np.ones(3)], {ciclo.on_predict_step: predict_step},
        ...     concatenate=True,
        ... )
        >>> outputs["outputs"]
        array([2., 2., 2., 2., 2.])
    """
    _check_no_hooks("predict_loop", loop_kwargs)
    registry = _Registry(
        "predict_loop", PREDICT_SCHEDULES, "on_predict_step", state, tasks, callbacks
    )
    registry.require_step("predict_step")
    in_flight = InFlight(loop_kwargs.pop("max_steps_in_flight", 2))
    collected: dict[str, list[Any]] = {}

    def collect(loop_state: LoopState) -> None:
        outputs = loop_state.logs.get("outputs", {})
        for name, value in outputs.items():
            collected.setdefault(name, []).append(value)
        in_flight.push_tree(outputs, loop_state.logs, loop_state.state)
        loop_state.logs = Logs()

    state, _, elapsed = _run_batches(
        registry,
        "predict",
        state,
        dataset,
        collect,
        registry.named["on_predict_end"],
        stop=stop,
        batch_size_fn=batch_size_fn,
        metadata=metadata,
        **loop_kwargs,
    )
    if concatenate:
        return state, {k: _concatenate(k, v) for k, v in collected.items()}, elapsed
    return state, collected, elapsed
