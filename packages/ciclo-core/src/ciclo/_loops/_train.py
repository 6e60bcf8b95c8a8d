"""``train_loop``: train a state, evaluating it after each epoch, with callbacks on named
schedules (``on_epoch_end``...) and ordinary ones."""

from __future__ import annotations

import difflib
import inspect
import time as _time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from .._checkpoint._lazy import LazyState
from .._checkpoint._resume import may_resume
from .._loop._arguments import is_empty
from .._loop._callback import LoopInterrupted, as_callback
from .._loop._state import LoopState
from .._loop._step import run_step
from .._processes._outputs import OUTPUT_PROCESS, writes_here
from .._records._history import History
from .._records._logs import Logs
from .._time._elapsed import Elapsed, Period
from .._time._periods import period_unit
from .._time._schedules import always
from ..callbacks._inner_loop import inner_loop
from ._clock import EpochClock
from ._epochs import PassEnds, Passes, epochs_dataset
from ._evaluation import EvaluationSet, dataset_label, evaluation_sets
from ._loop import loop
from ._named import NAMED_SCHEDULES, moments
from ._registry import Hook, Registry, check_no_hooks, loop_tasks
from ._test import evaluate_dataset

__all__ = ["train_loop"]

#: An evaluation running longer than this many seconds, and this many times the training
#: since the one before, is warned about (an endless test_dataset never returns).
EVALUATION_WARN_SECONDS, EVALUATION_WARN_FACTOR = 60.0, 10.0
_OVERDUE = (
    "train_loop: evaluating {where} at step {step} takes over {factor:g} times the {s:.3g} "
    "s of training before it; is it endless? Give test_duration=, or end it with "
    "ciclo.watchdog(evaluation_timeout=...)."
)
_EPOCHS_AND_EPOCH_DURATION = (
    "train_loop(epochs={epochs!r}, epoch_duration={epoch_duration!r}): give one (epochs: "
    "passes over train_dataset; epoch_duration: an epoch's length)."
)


def train_loop(
    state: Any,
    train_dataset: Iterable[Any],
    tasks: Mapping[Any, Any] | None = None,
    *,
    callbacks: Sequence[Any] | None = None,
    test_dataset: Callable[[], Iterable[Any]]
    | Iterable[Any]
    | Mapping[str, Callable[[], Iterable[Any]] | Iterable[Any]]
    | None = None,
    epochs: int | None = None,
    epoch_duration: int | Period | None = None,
    test_every: int | Period | Mapping[str, int | Period | None] | None = None,
    test_duration: int | Period | Mapping[str, int | Period | None] | None = None,
    test_name: str = "test",
    test_at_start: bool = False,
    test_at_end: bool = False,
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
          evaluation                          when this step completes a test_every
                                              (default: an epoch); on a fresh
                                              test_dataset(): on_reset_step, on_test_begin,
                                              [on_test_batch_begin, on_test_step,
                                              on_test_batch_end] per batch, on_test_end
          on_epoch_end                        when this step completes an epoch
        on_train_end                          once, after the last step

    An epoch ends after the step whose count *after* the step crosses a multiple of
    ``epoch_duration`` (steps 0..9 are epoch 1 for ``epoch_duration=10``): evaluation never
    runs after step 0. Without ``epoch_duration`` the whole run is one epoch, evaluated and
    ended in ``on_train_end``'s place. A last epoch cut short (by ``stop``, the dataset's
    end or a stopping callback) is neither evaluated nor ended, unless ``test_at_end=True``:
    then it is, in ``on_train_end``'s place (off by default, so that a run stopped and
    resumed later equals one that never stopped). ``test_at_start=True`` also evaluates
    every set before the first step (after ``on_train_begin``; not again on resume).

    Step labels: an evaluation is labelled with the ``elapsed.steps`` of the moment it runs,
    as every callback is: the row of the training step it follows (the count *before* that
    step: 7 for the evaluation after the 8th step), and the loop's count in ``on_start`` /
    ``on_end`` (0 for ``test_at_start``, the number of steps for a run without epochs or
    a cut epoch evaluated by ``test_at_end``).
    History, the CSV and TensorBoard loggers and ``ciclo.loop`` callbacks all use it; a
    checkpoint saved at that step holds one step more, and is named after that count (8).

    The evaluation's metrics (sample-weighted over the evaluation set, see
    :func:`test_loop`) are renamed ``<name>_<test_name>`` (``accuracy_test``) and join the
    logs of the step that completed the epoch, so ``history.collect("steps", "loss",
    "accuracy_test")`` gives one row per evaluation, and ``on_epoch_end`` callbacks (early
    stopping, checkpoints) see them in ``loop_state.logs``. Evaluation never changes the
    training state (the state the evaluation returns is dropped).

    Averaged weights: with a managed state created with ``ema=decay``, each evaluation
    also runs on ``state.ema_state()`` (the averaged parameters), its entries renamed
    ``<name>_<test_name>_ema`` (``loss_test_ema``).

    Several evaluation sets: ``test_dataset={"valid": make_valid, "test": make_test}``
    evaluates each (in dict order, with the same test step and ``on_test_*`` callbacks),
    giving ``accuracy_valid``, ``accuracy_test``...; ``test_every={"valid": 100}`` gives
    a set its own period (sets it does not name are evaluated at each epoch's end), and a
    single ``test_every`` applies to every set; ``test_duration`` likewise.

    Epochs: ``epochs=N`` makes N passes over ``train_dataset``, a re-iterable dataset (a
    list of batches, a Grain ``MapDataset``: iterated anew for each epoch) or a
    zero-argument function returning a fresh one (called for each epoch). An epoch is one
    pass: its length is ``len(train_dataset)`` when it has one (the loop then knows its
    planned total, ``stop = N * len``, which progress bars read), otherwise the end of
    each pass. Without ``epochs``, ``epoch_duration`` cuts one pass over the data into
    epochs.

    Args:
        state: the state; its ``train_step``, ``test_step`` and ``reset_step`` methods (if
            any) run under ``on_train_step``, ``on_test_step`` and ``on_reset_step`` unless
            ``tasks`` or ``callbacks`` give callbacks for those schedules. Or
            ``ciclo.lazy_state(fn)``, as in :func:`ciclo.loop`.
        train_dataset: an iterable of batches; with ``epochs``, a re-iterable one or a
            zero-argument function returning one.
        tasks: ``{schedule: callback or [callbacks]}``; a schedule is a named schedule
            (``ciclo.on_epoch_end`` or ``"on_epoch_end"``) or an ordinary one
            (``ciclo.every(100)``), which runs with the training step.
        callbacks: objects whose methods named after schedules (``on_epoch_end``,
            ``on_train_batch_end``, ``on_test_step``...) register themselves, e.g.
            ``[ciclo.keras_bar(1000), ciclo.early_stopping("loss_test", patience=3)]``.
        test_dataset: a zero-argument function returning a fresh evaluation dataset,
            called at each evaluation (``lambda: batches(x_test, y_test)``), or a
            re-iterable dataset (a list of batches: iterated anew at each evaluation; not
            an iterator), or a dict ``{name: function or dataset}`` of several sets.
        epochs: how many passes over ``train_dataset`` (instead of ``epoch_duration`` and
            ``stop``); evaluation runs at the end of each.
        epoch_duration: an epoch's length: an int (steps) or ``ciclo.at(samples=...)`` /
            ``ciclo.at(time=...)``.
        test_every: evaluate every this much training (an int, steps, or a
            ``ciclo.at(...)``) instead of every epoch; a dict ``{name: period}`` sets it
            per evaluation set.
        test_duration: how long each evaluation runs (an int, steps, or a
            ``ciclo.at(...)``; the original ciclo's meaning), by default the whole
            evaluation set; a dict ``{name: duration}`` sets it per set. Needed for an
            endless evaluation dataset.
        test_name: the suffix of evaluation entries of a single ``test_dataset`` (with a
            dict, its keys).
        test_at_start: evaluate before training too (the untrained model's metrics, in the
            row of ``on_start``).
        test_at_end: evaluate and end a last epoch cut short (by ``stop``, the dataset's
            end or a stopping callback), after the last step.
        stop: when to stop (an int or a ``ciclo.at(...)``); by default the dataset's end
            (with ``epochs``, the end of the last epoch).
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
    check_no_hooks("train_loop", loop_kwargs)
    _check_keywords(loop_kwargs)
    _check_tasks(tasks)
    if epochs is not None:
        if epoch_duration is not None:
            raise ValueError(
                _EPOCHS_AND_EPOCH_DURATION.format(epochs=epochs, epoch_duration=epoch_duration)
            )
        if stop is not None:
            raise ValueError(f"train_loop(epochs={epochs!r}, stop={stop!r}): give one.")
        train_dataset, length = epochs_dataset(train_dataset, epochs)
        if length is not None:
            epoch_duration = length
            stop = (0 if elapsed is None else elapsed.steps) + epochs * length
    if isinstance(state, LazyState) and not may_resume(loop_kwargs.get("resume")):
        state = state.build()  # nothing to resume from
    # A lazy state resumed is known by its shapes until the loop restores it.
    known = state.shapes() if isinstance(state, LazyState) else state
    registry = Registry(
        "train_loop", moments("train", "test"), "on_train_step", known, tasks, callbacks
    )
    registry.require_step("train_step")
    named = registry.named
    epoch: tuple[str, float] | PassEnds | None = (
        None if epoch_duration is None else period_unit(epoch_duration, "epoch_duration")
    )
    if epoch is None and isinstance(train_dataset, Passes):
        epoch = PassEnds(train_dataset)
    sets = evaluation_sets(test_dataset, test_every, test_duration, test_name)
    clock = EpochClock(epoch, {name: evaluation.every for name, evaluation in sets.items()})

    if sets and not named["on_test_step"]:
        raise ValueError(
            "train_loop got a test_dataset but no test step: give tasks="
            "{ciclo.on_test_step: test_step}, or a state with a `test_step` method."
        )
    # Wrapped once, not at each evaluation (reading a callback's signature costs).
    test_tasks = {
        NAMED_SCHEDULES[n]: [as_callback(c) for c in named[n]] for n in moments("test") if named[n]
    }

    runs = dict.fromkeys(sets, 0)  # evaluations run by this loop, per set
    trained_since = [_time.monotonic()]  # when the training since the last evaluation began

    def start_counting(loop_state: LoopState) -> None:
        loop_state.evaluated = not sets
        trained_since[0] = _time.monotonic()

    def overdue_warning(name: str) -> Callable[[], None]:
        """Warns once when this evaluation runs far longer than the training before it."""
        start = _time.monotonic()
        trained = start - trained_since[0]
        limit = max(EVALUATION_WARN_SECONDS, EVALUATION_WARN_FACTOR * trained)
        step = clock.loop_state.elapsed.steps

        def check() -> None:
            nonlocal limit
            if _time.monotonic() - start > limit:
                limit = float("inf")
                if writes_here(OUTPUT_PROCESS):
                    where = dataset_label(test_dataset, name)
                    text = _OVERDUE.format(
                        where=where, step=step, s=trained, factor=EVALUATION_WARN_FACTOR
                    )
                    warnings.warn(text, RuntimeWarning, stacklevel=1)

        return check

    def evaluation(name: str, evaluation_set: EvaluationSet) -> Any:
        def run_test(state: Any) -> tuple[Any, Logs, Elapsed]:
            try:
                result = evaluate_dataset(
                    state,
                    evaluation_set.factory(),
                    test_tasks,
                    dataset_label(test_dataset, name),
                    stop=evaluation_set.duration,
                    batch_size_fn=batch_size_fn,
                    metadata=metadata,
                    stop_signals=(),  # a Ctrl-C during evaluation stops the training loop
                    after_batch=overdue_warning(name),
                )
            except LoopInterrupted as cut:  # a resumed run evaluates again
                clock.cut(name)
                then = f"{cut.then}; a resumed run evaluates again at this step"
                raise LoopInterrupted(cut.reason, then) from None
            runs[name] += 1
            trained_since[0] = _time.monotonic()
            if all(runs.values()):  # monitors of evaluation entries are now strict
                clock.loop_state.evaluated = True
            return result

        plain = inner_loop(name, run_test)
        if not averaged:
            return plain
        # The state keeps averaged weights: each evaluation runs on them too (`_ema`).
        on_average = inner_loop(f"{name}_ema", lambda state: run_test(state.ema_state()))

        def both(state: Any) -> tuple[Logs, Any]:
            logs, _ = plain(state)
            return logs.merge(on_average(state)[0]), None

        both.__qualname__ = both.__name__ = f"evaluation({name!r}, with averaged weights)"
        return both

    averaged = _keeps_average(known)
    evaluations = {name: evaluation(name, evaluation_set) for name, evaluation_set in sets.items()}
    train_tasks = {
        clock.schedule: [],  # first, so its state comes first in checkpoints
        **loop_tasks(
            (clock.begins(), named["on_reset_step"] + named["on_epoch_begin"]),
            (always(), named["on_train_batch_begin"]),
            *registry.step_tasks(),
            (always(), named["on_train_batch_end"]),
            *((clock.test_due(name), [callback]) for name, callback in evaluations.items()),
            (clock.ends(), named["on_epoch_end"]),
        ),
    }
    start: list[Any] = [
        clock.bind,
        Hook("train_loop evaluations", start_counting),
        *named["on_train_begin"],
    ]
    if test_at_start and evaluations:
        start.append(Hook("train_loop test_at_start", _evaluate_at_start(evaluations)))
    epoch_end = [as_callback(c) for c in named["on_epoch_end"]]
    start.append(Hook("train_loop owed", _run_owed(clock, evaluations, epoch_end)))
    on_end: list[Any] = []
    if test_at_end and epoch is not None:  # a last epoch cut short ends here
        last = [evaluations[name] for name, one in sets.items() if not one.every]
        on_end += [_if_cut(clock, callback) for callback in last + named["on_epoch_end"]]
    if epoch is None:  # the whole run is one epoch: it ends with the loop
        on_end += [evaluations[name] for name, one in sets.items() if not one.every]
        on_end += named["on_epoch_end"]
    on_end += named["on_train_end"]
    if is_empty(train_dataset):  # after the other arguments' checks
        raise ValueError("train_loop(train_dataset=...) is empty: give a dataset of batches.")
    history = History() if history is None else history
    if sets:
        history.hint_missing(_why_not_evaluated(sets, runs, epoch, stop))
    loop_kwargs |= {"on_start": start, "on_end": on_end, "history": history, "elapsed": elapsed}
    loop_kwargs |= {"batch_size_fn": batch_size_fn, "metadata": metadata}
    return loop(state, train_dataset, train_tasks, stop=stop, **loop_kwargs)


def _keeps_average(state: Any) -> bool:
    """Whether ``state`` keeps averaged weights (a managed state created with ``ema=``): its
    ``ema_state()`` returns the state to evaluate them on."""
    ema_state = getattr(state, "ema_state", None)
    return callable(ema_state) and ema_state() is not None


def _if_cut(clock: EpochClock, callback: Any) -> Hook:
    """``callback`` in ``on_end``, run only when the last step did not end an epoch."""
    wrapped = as_callback(callback)

    def run(loop_state: LoopState) -> Any:
        if clock.first or clock.ended or clock.owed:  # no step, the epoch ended, or cut
            return None
        return wrapped(loop_state)

    return Hook(f"train_loop test_at_end: {wrapped.name}", run)


def _evaluate_at_start(
    evaluations: Mapping[str, Callable[[Any], tuple[Logs, Any]]],
) -> Callable[[LoopState], Logs | None]:
    """The ``on_start`` hook of ``test_at_start=True``: every set evaluated on the state
    before training (skipped on resume: the checkpoint's history holds those rows)."""

    def evaluate(loop_state: LoopState) -> Logs | None:
        if loop_state.resumed:
            return None
        logs = Logs()
        for run in evaluations.values():
            logs.merge(run(loop_state.state)[0])
        return logs

    return evaluate


def _run_owed(
    clock: EpochClock,
    evaluations: Mapping[str, Callable[[Any], tuple[Logs, Any]]],
    epoch_end: list[Any],
) -> Callable[[LoopState], None]:
    """The ``on_start`` hook of a resumed run whose last step a stop cut during an
    evaluation: runs what that step owed (the evaluations, then ``on_epoch_end`` if it
    ended an epoch) on the restored state, as of that step, and adds their logs to its row
    of history, as an uninterrupted run would have."""

    def run_owed(loop_state: LoopState) -> None:
        tests, ended = clock.take_owed()
        if not loop_state.resumed or not (tests or ended):
            return
        history = loop_state.history
        row = history[-1]
        after, at = loop_state.elapsed, Elapsed(**row.pop("elapsed"))
        loop_state.elapsed, loop_state.logs = at, Logs(row)
        try:
            owed = Logs()
            for name in tests:
                if name in evaluations:  # (a set this run still has)
                    owed.merge(evaluations[name](loop_state.state)[0])
            loop_state.logs.merge(owed)
            if ended:
                run_step(loop_state, epoch_end)
                for collection, entries in loop_state.logs.items():
                    for entry, value in entries.items():
                        if entry not in row.get(collection, {}):
                            owed.setdefault(collection, {})[entry] = value
            history.add_to_last_row(owed)
            loop_state.remember(owed)
        finally:
            loop_state.elapsed, loop_state.logs = after, Logs()

    return run_owed


def _why_not_evaluated(
    sets: Mapping[str, EvaluationSet],
    runs: Mapping[str, int],
    epoch: tuple[str, float] | PassEnds | None,
    stop: int | Period | None,
) -> Callable[[str], str | None]:
    """Says, for a history key of an evaluation set that never ran, why it did not."""

    def why(key: str) -> str | None:
        for name, evaluation_set in sets.items():
            if not key.endswith((f"_{name}", f"_{name}_ema")) or runs[name]:
                continue
            period = evaluation_set.every or epoch
            if period is None:
                when = "at the end of the run"
            elif isinstance(period, PassEnds):
                when = "at the end of each epoch (a pass over train_dataset)"
            else:
                when = f"after each {period[1]:g} {period[0]} of training" + (
                    " (test_every)" if evaluation_set.every else " (epoch_duration)"
                )
            return (
                f"No evaluation of {name!r} ran in train_loop: it runs {when}, and the run "
                f"(stop={stop!r}) ended before the first one; a last epoch cut short is not "
                f"evaluated by default. Give a shorter epoch_duration or test_every, or "
                f"test_at_end=True (evaluate a last epoch cut short), or test_at_start=True."
            )
        return None

    return why


def _check_keywords(loop_kwargs: Mapping[str, Any]) -> None:
    """Names a keyword that neither train_loop nor :func:`ciclo.loop` takes as
    train_loop's, with the closest one it takes.

    Example:
        >>> _check_keywords({"epoch": 3})
        Traceback (most recent call last):
        ...
        TypeError: train_loop() got an unexpected keyword argument 'epoch'. Did you mean 'epochs'?
    """
    passed_on = set(inspect.signature(loop).parameters) - {"state", "dataset", "tasks"}
    passed_on -= {"on_start", "on_end"}
    for key in loop_kwargs:
        if key in passed_on:
            continue
        known = [*inspect.signature(train_loop).parameters, *passed_on]
        known.remove("loop_kwargs")
        close = difflib.get_close_matches(key, known, n=1)
        hint = f" Keras' {key}= is {_KERAS[key]}." if key in _KERAS else ""
        hint = hint or (f" Did you mean {close[0]!r}?" if close else "")
        raise TypeError(f"train_loop() got an unexpected keyword argument {key!r}.{hint}")


#: Keras' ``fit`` keywords, and what ciclo takes for each.
_KERAS = {
    "validation_data": "test_dataset= (batches, or a function returning them)",
    "validation_freq": "test_every=",
    "validation_steps": "test_duration=",
    "steps_per_epoch": "epoch_duration=",
    "batch_size": "the size of the batches you give in train_dataset",
    "shuffle": "a function returning each epoch's batches (docs/loops.md)",
    "verbose": "a bar: callbacks=[ciclo.keras_bar()] (none by default)",
    "initial_epoch": "resume= (a checkpoint directory)",
}


_ARRAY_AS_TASKS = (
    "train_loop(state, x, y): the third argument is tasks (a dict {{schedule: callbacks}}), got "
    "an array of shape {shape}, as in Keras' fit(x, y). ciclo trains on a dataset of batches: "
    "give train_dataset=[(x[i : i + 64], y[i : i + 64]) for i in range(0, len(x), 64)] (or a "
    "function returning batches), with epochs=..."
)


def _check_tasks(tasks: Any) -> None:
    """Names ``train_loop(state, x, y)``, Keras' ``fit(x, y)``: ``y`` lands in ``tasks``."""
    if tasks is None or isinstance(tasks, Mapping):
        return
    if hasattr(tasks, "shape") and hasattr(tasks, "dtype"):
        raise TypeError(_ARRAY_AS_TASKS.format(shape=tuple(tasks.shape)))
