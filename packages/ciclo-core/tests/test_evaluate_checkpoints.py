"""ciclo.evaluate_checkpoints: one history row per checkpoint, in step order, each equal to
a direct evaluation of that checkpoint; following a directory a trainer writes to."""

from __future__ import annotations

import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ciclo


@jax.jit
def eval_step(state, batch):
    pred = batch["x"] @ state["w"]
    return ciclo.logs().add_metric("mse", jnp.mean((pred - batch["y"]) ** 2))


TASKS = {ciclo.on_test_step: eval_step}


def eval_sets(regression):
    valid = regression.batches(3, batch_size=4, seed=7)
    valid[-1] = {k: v[:1] for k, v in valid[-1].items()}  # a small last batch
    test = regression.batches(2, batch_size=4, seed=8)
    return {"valid": lambda: valid, "test": lambda: test}


def train(regression, directory, steps=6, every=2, pause=0.0, marker=None):
    ckpt = ciclo.checkpoint(directory, keep=None, save_on_end=False)

    def slow(state):
        time.sleep(pause)

    tasks = {ciclo.every(1): [regression.step, slow], ciclo.every(every): ckpt}
    ciclo.loop(regression.initial_state(), regression.batches(steps), tasks)
    ckpt.close()
    if marker is not None:
        (directory / marker).touch()
    return ckpt


def direct(regression, directory, step, dataset):
    restored = ciclo.restore(directory, regression.initial_state(), step=step)
    _, logs, _ = ciclo.test_loop(restored.state, dataset(), TASKS)
    return float(logs.metrics.mse)


def test_one_row_per_checkpoint_in_order_each_equal_to_a_direct_evaluation(regression, tmp_path):
    saved = train(regression, tmp_path).all_steps()
    assert len(saved) == 3
    sets = eval_sets(regression)
    history = ciclo.evaluate_checkpoints(tmp_path, regression.initial_state(), sets["valid"], TASKS)
    steps, mse = history.collect("steps", "mse")
    assert steps == saved
    assert mse == [pytest.approx(direct(regression, tmp_path, s, sets["valid"])) for s in saved]
    assert len(set(mse)) == 3  # the checkpoints differ


def test_several_evaluation_sets_are_separate_columns(regression, tmp_path):
    saved = train(regression, tmp_path).all_steps()
    sets = eval_sets(regression)
    history = ciclo.evaluate_checkpoints(tmp_path, regression.initial_state(), sets, TASKS)
    steps, valid, test = history.collect("steps", "mse_valid", "mse_test")
    assert steps == saved
    for step, v, t in zip(steps, valid, test, strict=True):
        assert v == pytest.approx(direct(regression, tmp_path, step, sets["valid"]))
        assert t == pytest.approx(direct(regression, tmp_path, step, sets["test"]))


def test_follow_evaluates_checkpoints_as_a_trainer_writes_them(regression, tmp_path):
    directory = tmp_path / "run"  # does not exist yet when the evaluator starts
    trainer = threading.Thread(
        target=train, args=(regression, directory), kwargs={"pause": 0.05, "marker": "FINISHED"}
    )
    sets = eval_sets(regression)
    trainer.start()
    try:
        history = ciclo.evaluate_checkpoints(
            directory,
            regression.initial_state(),
            sets["test"],
            TASKS,
            follow=True,
            final_marker="FINISHED",
            poll_interval=0.02,
            timeout=120,  # a safety net only: the marker ends it
        )
    finally:
        trainer.join()
    saved = ciclo.checkpoint(directory).all_steps()
    steps, mse = history.collect("steps", "mse")
    assert steps == saved == [1, 3, 5]  # saved after the steps where every(2) fires
    assert mse == [pytest.approx(direct(regression, directory, s, sets["test"])) for s in saved]


def test_follow_stops_after_the_timeout_without_new_checkpoints(regression, tmp_path):
    saved = train(regression, tmp_path).all_steps()

    def follow(directory):
        return ciclo.evaluate_checkpoints(
            directory,
            regression.initial_state(),
            eval_sets(regression)["test"],
            TASKS,
            follow=True,
            timeout=0.05,
            poll_interval=0.01,
        )

    assert follow(tmp_path).collect("steps") == saved
    assert len(follow(tmp_path / "nothing-yet")) == 0


def test_final_step_and_a_restarted_evaluator_continue_without_repeating(regression, tmp_path):
    saved = train(regression, tmp_path, steps=8).all_steps()
    assert saved == [1, 3, 5, 7]
    test_set = eval_sets(regression)["test"]
    state = regression.initial_state()
    history = ciclo.evaluate_checkpoints(tmp_path, state, test_set, TASKS, final_step=2)
    assert history.collect("steps") == [1, 3]
    calls = []

    def counting():
        calls.append(1)
        return test_set()

    history = ciclo.evaluate_checkpoints(tmp_path, state, counting, TASKS, history=history)
    assert history.collect("steps") == saved
    assert len(calls) == 2  # only checkpoints 5 and 7 were evaluated again


def test_evaluation_callbacks_see_each_checkpoint(regression, tmp_path):
    train(regression, tmp_path)
    seen = []

    def report(state, batch, elapsed, loop_state):
        seen.append(round(float(loop_state.logs.metrics.mse), 6))

    history = ciclo.evaluate_checkpoints(
        tmp_path,
        regression.initial_state(),
        eval_sets(regression)["test"],
        {**TASKS, ciclo.on_test_end: report},
    )
    assert seen == [round(v, 6) for v in history.collect("mse")]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"dataset": 3}, TypeError, r"dataset must be a dataset or a function returning one"),
        ({"dataset": {"valid": iter([1])}}, TypeError, r"dataset\['valid'\] is an iterator"),
        ({"dataset": {}}, ValueError, r"dataset is an empty dict"),
        ({"poll_interval": 0}, ValueError, r"poll_interval=0\) must be > 0"),
    ],
)
def test_bad_arguments_are_clear_errors(regression, tmp_path, kwargs, error, match):
    options = {"dataset": lambda: [], **kwargs}
    with pytest.raises(error, match=match):
        ciclo.evaluate_checkpoints(tmp_path, regression.initial_state(), **options)


def test_a_directory_without_checkpoints_is_an_error_unless_following(regression, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"does not exist"):
        ciclo.evaluate_checkpoints(tmp_path / "missing", regression.initial_state(), list)
    with pytest.raises(FileNotFoundError, match=r"holds no checkpoint"):
        ciclo.evaluate_checkpoints(tmp_path, regression.initial_state(), list)


def test_sharded_state_template_restores_and_evaluates_sharded(regression, tmp_path):
    if jax.device_count() < 2:
        pytest.skip("needs several devices")
    train(regression, tmp_path)
    sharding = jax.sharding.NamedSharding(
        jax.make_mesh((jax.device_count(),), ("data",)), jax.sharding.PartitionSpec()
    )
    template = jax.device_put(regression.initial_state(), sharding)
    history = ciclo.evaluate_checkpoints(tmp_path, template, eval_sets(regression)["test"], TASKS)
    plain = ciclo.evaluate_checkpoints(
        tmp_path, regression.initial_state(), eval_sets(regression)["test"], TASKS
    )
    np.testing.assert_allclose(history.collect("mse"), plain.collect("mse"), rtol=1e-6)
