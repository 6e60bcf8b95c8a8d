"""train_loop's evaluations at the edges of a run (issue 21): before training, at a final
epoch cut by ``stop``, an evaluation that never ran, late-bound factories, and the one rule
for an evaluation's step label."""

from __future__ import annotations

import csv
import functools

import numpy as np
import pytest

import ciclo


def train_step(state, batch):
    return ciclo.logs().add_loss("loss", (batch * state).mean()), state * 0.5


def eval_step(state, batch):
    return ciclo.logs().add_metric("score", (batch * state).mean())


STEPS = {ciclo.on_train_step: train_step, ciclo.on_test_step: eval_step}
DATA = [np.ones((2, 3))] * 6


def evaluate(**options):
    options.setdefault("test_dataset", lambda: [np.ones((2, 3))])
    return ciclo.train_loop(1.0, DATA, STEPS, **options)


def test_test_at_start_evaluates_the_untrained_state_first():
    seen = []
    tasks = {**STEPS, ciclo.on_train_begin: lambda: seen.append("train_begin")}
    tasks[ciclo.on_test_begin] = lambda: seen.append("test")
    _, history, _ = ciclo.train_loop(
        1.0,
        DATA,
        tasks,
        test_dataset=lambda: [np.ones((2, 3))],
        epoch_duration=3,
        test_at_start=True,
    )
    assert history.collect("steps", "score_test") == ([0, 2, 5], [1.0, 0.125, 0.015625])
    assert seen == ["train_begin", "test", "test", "test"]
    # Off by default.
    _, history, _ = evaluate(epoch_duration=3)
    assert history.collect("steps", "score_test")[0] == [2, 5]


def test_test_at_start_does_not_evaluate_again_on_resume(tmp_path):
    runs = []

    def counted():
        runs.append(1)
        return [np.ones((2, 3))]

    def run(crash_at=None):
        def crash(state, batch, elapsed):
            if elapsed.steps == crash_at:
                raise RuntimeError("crash")

        tasks = {**STEPS, ciclo.every(1): crash, ciclo.every(2): ciclo.checkpoint(tmp_path)}
        return ciclo.train_loop(
            1.0,
            DATA,
            tasks,
            test_dataset=counted,
            epoch_duration=3,
            test_at_start=True,
            resume=tmp_path,
        )

    with pytest.raises(RuntimeError, match="crash"):
        run(crash_at=4)
    assert len(runs) == 2  # at start, after step 2
    _, history, _ = run()
    assert len(runs) == 3  # after step 5 only
    assert history.collect("steps", "score_test")[0] == [0, 2, 5]


@pytest.mark.parametrize("stop", [5, ciclo.at(samples=10), None])
def test_test_at_end_evaluates_and_ends_a_last_epoch_cut_short(stop):
    ends = []
    tasks = {**STEPS, ciclo.on_epoch_end: lambda state, batch, elapsed: ends.append(elapsed.steps)}
    data = DATA[:5]  # stop=None: the dataset's end cuts the second epoch
    _, history, elapsed = ciclo.train_loop(
        1.0,
        data,
        tasks,
        test_dataset=lambda: [np.ones((2, 3))],
        epoch_duration=4,
        stop=stop,
        test_at_end=True,
    )
    assert elapsed.steps == 5
    # after step 3 (an epoch end), and at the end of the run (on_train_end's place: 5)
    assert history.collect("steps", "score_test")[0] == [3, 5]
    assert ends == [3, 5]


def test_without_test_at_end_a_last_epoch_cut_short_is_not_evaluated():
    _, history, _ = evaluate(epoch_duration=4, stop=5)
    assert history.collect("steps", "score_test")[0] == [3]


def test_test_at_end_does_nothing_when_the_last_step_ends_an_epoch():
    _, history, _ = evaluate(epoch_duration=3, test_at_end=True)
    assert history.collect("steps", "score_test")[0] == [2, 5]


def test_collecting_an_evaluation_that_never_ran_says_why():
    _, history, _ = evaluate(epoch_duration=10)
    with pytest.raises(
        KeyError,
        match=r"no key 'score_test'.*No evaluation of 'test' ran in train_loop: it runs after "
        r"each 10 steps of training \(epoch_duration\).*test_at_start=True",
    ):
        history.collect("score_test")
    _, history, _ = evaluate(
        test_dataset={"valid": lambda: [np.ones((2, 3))]}, test_every={"valid": 100}
    )
    with pytest.raises(KeyError, match=r"'valid' ran.*each 100 steps.*\(test_every\)"):
        history.collect("steps", "score_valid")
    # A typo of a metric that did run gets no such hint.
    _, history, _ = evaluate(epoch_duration=3)
    with pytest.raises(KeyError, match=r"has no key 'scor_test'; available keys") as error:
        history.collect("scor_test")
    assert "No evaluation" not in str(error.value)


def test_lambdas_made_in_a_loop_are_the_late_binding_trap():
    data = {"valid": [np.ones((2, 3))], "test": [np.zeros((2, 3))]}
    late = {name: lambda: data[name] for name in data}  # noqa: B023 (the trap itself)
    with pytest.raises(
        ValueError,
        match=r"test_dataset\['valid'\] and test_dataset\['test'\] are the same function of "
        r"the same values.*lambda name=name",
    ):
        evaluate(test_dataset=late)
    bound = {name: lambda name=name: data[name] for name in data}
    _, history, _ = evaluate(test_dataset=bound)
    assert history.collect("score_valid", "score_test") == ([0.015625], [0.0])
    partials = {name: functools.partial(data.__getitem__, name) for name in data}
    _, history, _ = evaluate(test_dataset=partials)
    assert history.collect("score_valid", "score_test") == ([0.015625], [0.0])
    # The same function given twice, without free variables, is allowed.
    same = lambda: [np.ones((2, 3))]  # noqa: E731
    evaluate(test_dataset={"a": same, "b": same})


def test_one_step_label_for_an_evaluation(tmp_path):
    """History, the CSV logger (as TensorBoard, the row's steps), a ciclo.loop callback
    and the checkpoint agree: the evaluation after the 4th step is labelled 3 (its row's
    ``elapsed.steps``), and the checkpoint saved then holds 4 steps (named 4)."""
    labels = []
    path = tmp_path / "log.csv"
    ckpt = ciclo.checkpoint(tmp_path / "ckpt", keep=None)
    tasks = {
        **STEPS,
        ciclo.on_epoch_end: [lambda state, batch, elapsed: labels.append(elapsed.steps), ckpt],
    }
    _, history, _ = ciclo.train_loop(
        1.0,
        DATA[:4],
        tasks,
        callbacks=[ciclo.csv_logger(path)],
        test_dataset=lambda: [np.ones((2, 3))],
        epoch_duration=4,
    )
    with path.open() as file:
        (row,) = csv.DictReader(file)
    assert history.collect("steps", "score_test")[0] == [3]
    assert labels == [3]
    assert int(row["steps"]) == 3
    assert ckpt.all_steps() == [4]
    # The same evaluation with ciclo.loop: a callback after the step, at the same schedule.
    seen = []

    def my_evaluation(state, batch, elapsed):
        seen.append(elapsed.steps)
        return ciclo.logs().add_metric("score_test", state)

    last_of_epoch = lambda elapsed: elapsed.steps % 4 == 3  # noqa: E731
    _, loop_history, _ = ciclo.loop(
        1.0, DATA[:4], {ciclo.every(1): train_step, last_of_epoch: my_evaluation}
    )
    assert seen == [3]
    assert loop_history.collect("steps", "score_test")[0] == [3]
