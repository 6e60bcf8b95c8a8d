"""Bad input gets a clear error that names the culprit and says how to fix it."""

from __future__ import annotations

import numpy as np
import pytest

import ciclo

ONE_BATCH = [np.zeros((2, 1), np.float32)]


def run_one_step(callback, state=None):
    return ciclo.loop(state, ONE_BATCH, {ciclo.every(1): callback})


# --- callbacks ------------------------------------------------------------------------------


def test_a_callback_needing_more_than_four_positional_arguments():
    def too_many(state, batch, elapsed, loop_state, extra):
        return None

    with pytest.raises(
        TypeError,
        match=r"callback .*too_many\(state, batch, elapsed, loop_state, extra\) needs 5 "
        r"positional arguments.*at most 4: the first 0-4 of \(state, batch, elapsed, loop_state\)",
    ):
        run_one_step(too_many)


def test_too_many_required_arguments_are_caught_with_star_args_too():
    def too_many(a, b, c, d, e, *rest):
        return None

    with pytest.raises(TypeError, match=r"too_many.*needs 5 positional arguments"):
        run_one_step(too_many)


def test_a_callback_needing_keyword_only_arguments():
    def configured(state, *, learning_rate):
        return None

    with pytest.raises(
        TypeError, match=r"configured.*keyword-only arguments \['learning_rate'\].*partial"
    ):
        run_one_step(configured)


def test_a_callback_returning_a_four_tuple():
    def four(state):
        return None, None, None, state

    with pytest.raises(
        TypeError,
        match=r"callback .*four returned a tuple of 4 items; a callback returns \(logs, state\), "
        r"\(outputs, logs, state\)",
    ):
        run_one_step(four, state=0)


@pytest.mark.parametrize(
    ("returned", "described"),
    [
        ((3.0, "state"), "float 3.0"),
        ((np.float32(1.5), "state"), r"float32 .*1\.5"),
        ((None, [1, 2], "state"), "list"),
        (({"accuracy": 0.5, "nested": {"a": 1}}, "state"), r"a dict with keys \['accuracy'"),
    ],
)
def test_a_non_logs_where_logs_are_expected(returned, described):
    def step(state):
        return returned

    with pytest.raises(
        TypeError,
        match=rf"callback .*step returned the logs part of its tuple that is not logs: "
        rf"{described}.*\{{collection: \{{name: value\}}\}}",
    ):
        run_one_step(step)


def test_a_dict_not_shaped_like_logs_is_never_taken_as_the_state():
    def returns_state_dict(state):
        return {"w": np.ones(3), "step": 1}

    with pytest.raises(
        TypeError,
        match=r"returns_state_dict returned a dict that is not logs: a dict with keys "
        r"\['w', 'step'\].*return \(None, state\)",
    ):
        run_one_step(returns_state_dict, state={"w": np.zeros(3), "step": 0})


def test_a_non_callable_callback():
    with pytest.raises(TypeError, match=r"42 is not a callback.*__loop_callback__"):
        run_one_step(42)


def test_a_callback_raising_gets_a_note_naming_it_and_the_step():
    def explode(state, batch, elapsed):
        if elapsed.steps == 2:
            raise ValueError("boom")

    with pytest.raises(ValueError, match="boom") as info:
        ciclo.loop(None, ONE_BATCH * 5, {ciclo.every(1): explode})
    assert info.value.__notes__ == [
        "(in ciclo callback "
        "test_a_callback_raising_gets_a_note_naming_it_and_the_step.<locals>.explode at step 2)"
    ]


def test_a_hook_raising_gets_a_note_too():
    def end():
        raise RuntimeError("bad end")

    with pytest.raises(RuntimeError, match="bad end") as info:
        ciclo.loop(None, ONE_BATCH * 3, on_end=end)
    assert info.value.__notes__[0].endswith("end at step 3)")


# --- tasks and schedules --------------------------------------------------------------------


def test_tasks_must_be_a_dict_of_schedules():
    with pytest.raises(TypeError, match=r"tasks must be a dict .*got list"):
        ciclo.loop(None, ONE_BATCH, [lambda: None])
    with pytest.raises(TypeError, match=r"tasks key 'on_train_step' is a name.*train_loop"):
        ciclo.loop(None, ONE_BATCH, {"on_train_step": lambda: None})
    with pytest.raises(TypeError, match=r"a schedule must be a function Elapsed -> bool, got 3\."):
        ciclo.loop(None, ONE_BATCH, {3: lambda: None})
    with pytest.raises(TypeError, match=r"a schedule must be .*got 'x'"):
        ciclo.every(2) & "x"


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (
            lambda: ciclo.every(),
            r"every\(\) needs exactly one period: steps, samples or time, got none",
        ),
        (
            lambda: ciclo.every(2, samples=10),
            r"every\(\) needs exactly one period.*got \{'steps': 2, 'samples': 10\}",
        ),
        (lambda: ciclo.every(-1), r"every\(\): steps must be positive, got -1"),
        (lambda: ciclo.every(samples=-64), r"every\(\): samples must be positive, got -64"),
        (lambda: ciclo.every(time=-0.5), r"every\(\): time must be positive, got -0.5"),
        (lambda: ciclo.every(0), r"every\(\): steps must be positive, got 0"),
        (lambda: ciclo.after(), r"after\(\) needs exactly one period"),
        (lambda: ciclo.after(-3), r"after\(\): steps must be non-negative, got -3"),
        (lambda: ciclo.after(5).every(), r"after\(\).every\(\) needs exactly one period"),
        (lambda: ciclo.after(5).every(-2), r"after\(\).every\(\): steps must be positive"),
        (lambda: ciclo.at(), r"at\(\) needs a period: give steps, samples, time or date"),
        (lambda: ciclo.at(-1), r"at\(\): steps must be non-negative, got -1"),
        (lambda: ciclo.at(samples=-10), r"at\(\): samples must be non-negative, got -10"),
        (lambda: ciclo.at(time=-1.0), r"at\(\): time must be non-negative"),
        (lambda: ciclo.piecewise({}), r"piecewise\(\) needs at least one"),
        (
            lambda: ciclo.piecewise({10: ciclo.always(), 0: ciclo.never()}),
            r"piecewise\(\) starts must be increasing, got \[10, 0\]",
        ),
        (
            lambda: ciclo.after(samples=10).every(steps=2),
            r"after\(samples=...\).every\(\) must count in the same unit, got steps",
        ),
    ],
)
def test_bad_periods(make, match):
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: ciclo.every("10"), r"every\(\): steps must be a number, got '10' \(str\)"),
        (lambda: ciclo.every(True), r"every\(\): steps must be a number, got True \(bool\)"),
        (lambda: ciclo.at(time="1h"), r"at\(\): time must be a number, got '1h'"),
    ],
)
def test_periods_of_the_wrong_type(make, match):
    with pytest.raises(TypeError, match=match):
        make()


# --- datasets and stop ----------------------------------------------------------------------


@pytest.mark.parametrize("dataset", [42, None, np.float32(1.0)])
def test_a_non_iterable_dataset(dataset):
    name = type(dataset).__name__
    with pytest.raises(TypeError, match=rf"the dataset must be iterable .*got {name}"):
        ciclo.loop(None, dataset, {})
    with pytest.raises(TypeError, match=rf"the dataset must be iterable .*got {name}"):
        ciclo.elapse(dataset)


def test_a_dataset_factory_passed_uncalled_says_to_call_it():
    def make_dataset():
        yield from ONE_BATCH

    with pytest.raises(TypeError, match=r"got function\. For a factory, call it"):
        ciclo.loop(None, make_dataset)


@pytest.mark.parametrize("stop", [1.5, "100", True, [10], {"steps": 3}])
def test_a_stop_of_the_wrong_type(stop):
    match = (
        rf"stop must be an int \(steps\) or a ciclo.at\(...\) Period, got .*"
        rf"\({type(stop).__name__}\)\. Example: stop=1000"
    )
    with pytest.raises(TypeError, match=match):
        ciclo.loop(None, ONE_BATCH, stop=stop)
    with pytest.raises(TypeError, match=match):
        ciclo.elapse(ONE_BATCH, stop=stop)


# --- logs and history -----------------------------------------------------------------------


def test_reading_logs_updates():
    logs = ciclo.logs().add_loss("loss", 1.0)
    with pytest.raises(
        AttributeError, match=r"Logs.updates is write-only: `logs.updates = other` merges"
    ):
        _ = logs.updates
    assert not hasattr(logs, "updates")


def test_a_logs_collection_that_is_not_a_mapping():
    with pytest.raises(TypeError, match=r"Logs collection 'metrics' must be a mapping.*float"):
        ciclo.Logs({"metrics": 0.5})


def _history_with_ambiguous_loss():
    history = ciclo.history()
    elapsed = ciclo.Elapsed.create()
    history.commit(elapsed, ciclo.logs().add_loss("loss", 1.0).add_metric("loss", 2.0))
    history.commit(elapsed, ciclo.logs().add_metric("accuracy", 0.5))
    return history


def test_an_unknown_key_in_collect_lists_the_available_keys():
    history = _history_with_ambiguous_loss()
    with pytest.raises(
        KeyError,
        match=r"history has no key 'acc'; available keys: \['elapsed.date', .*"
        r"'losses.loss', 'metrics.accuracy', 'metrics.loss'\]",
    ):
        history.collect("steps", "acc")


def test_an_ambiguous_key_in_collect_lists_the_candidates():
    history = _history_with_ambiguous_loss()
    with pytest.raises(
        KeyError,
        match=r"history key 'loss' is ambiguous; it could be any of "
        r"\['losses.loss', 'metrics.loss'\]\. Ask for one of them by its full name",
    ):
        history.collect("steps", "loss")
    assert history.collect("metrics.loss") == [2.0]


def test_an_elapsed_name_shadowed_by_a_log_entry_is_ambiguous():
    history = ciclo.history()
    history.commit(ciclo.Elapsed.create(), ciclo.logs().add_metric("steps", 7))
    with pytest.raises(KeyError, match=r"\['elapsed.steps', 'metrics.steps'\]"):
        history.collect("steps")
    assert history.collect("elapsed.steps", "metrics.steps") == ([0], [7])


def test_collect_needs_a_key():
    with pytest.raises(ValueError, match=r"collect\(\) needs at least one key"):
        ciclo.history().collect()
