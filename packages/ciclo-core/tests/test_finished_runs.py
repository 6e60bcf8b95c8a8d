"""A finished run stays finished (issue 27, item 3): a checkpoint records why and where
its run ended, and ``resume=`` on a finished run returns at once, writing nothing, unless
it is asked for more."""

from __future__ import annotations

import json
import os
import signal

import jax
import numpy as np
import pytest

import ciclo

BATCHES = [np.full((2, 1), float(i), np.float32) for i in range(4)]
STATE = np.zeros(1, np.float32)


@jax.jit
def train_step(state, batch):
    return ciclo.logs().add_loss("loss", state.sum()), state * 0.5 + batch.mean()


@jax.jit
def eval_step(state, batch):
    return ciclo.logs().add_loss("loss", state.sum() + batch.mean())  # rises over epochs


TASKS = {ciclo.on_train_step: train_step, ciclo.on_test_step: eval_step}


def ending(directory):
    """The ``end`` field of the newest checkpoint in ``directory`` (read as JSON)."""
    newest = max(int(p) for p in os.listdir(directory) if p.isdigit())
    with open(os.path.join(directory, str(newest), "meta", "metadata")) as f:
        return json.load(f).get("end")


def on_disk(directory):
    """Every file under ``directory`` with its bytes."""
    found = {}
    for root, _, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                found[os.path.relpath(path, directory)] = f.read()
    return found


def train(directory, *, epochs=2, callbacks=(), **options):
    ckpt = ciclo.checkpoint(directory / "ckpt", async_save=False)
    csv = ciclo.csv_logger(directory / "log.csv")
    return ciclo.train_loop(
        STATE,
        BATCHES,
        TASKS,
        callbacks=[csv, *callbacks, ckpt],
        test_dataset=lambda: BATCHES[:2],
        epochs=epochs,
        resume=ckpt,
        **options,
    )


def test_rerunning_a_finished_run_changes_nothing_on_disk(tmp_path, capsys):
    state, history, elapsed = train(tmp_path)
    assert elapsed.steps == 8
    assert ending(tmp_path / "ckpt") == {"reason": "stop", "step": 8, "message": None}
    before = on_disk(tmp_path)
    assert "log.csv" in before
    capsys.readouterr()

    again, again_history, again_elapsed = train(tmp_path)  # a retrying scheduler

    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "already ended after 8 steps (its stop was reached)" in err
    assert on_disk(tmp_path) == before  # the directory listing and every file's bytes
    np.testing.assert_array_equal(again, state)
    assert again_elapsed.steps == elapsed.steps
    assert again_elapsed.samples == elapsed.samples
    for key in ("steps", "loss", "loss_test"):
        assert again_history.collect(key) == history.collect(key)


def test_more_epochs_continue_a_finished_run_from_its_final_state(tmp_path):
    train(tmp_path, epochs=2)
    state, history, elapsed = train(tmp_path, epochs=3)
    reference, reference_history, _ = train(tmp_path / "reference", epochs=3)
    assert elapsed.steps == 12
    np.testing.assert_array_equal(state, reference)
    assert history.collect("steps", "loss") == reference_history.collect("steps", "loss")
    assert ending(tmp_path / "ckpt")["step"] == 12


def test_a_larger_stop_continues_a_loop_whose_stop_was_reached(tmp_path, capsys):
    ckpt = ciclo.checkpoint(tmp_path, async_save=False)
    tasks = {ciclo.every(1): train_step, ciclo.every(100): ckpt}
    data = BATCHES * 3
    _, _, elapsed = ciclo.loop(STATE, data, tasks, stop=4, resume=ckpt)
    assert ending(tmp_path) == {"reason": "stop", "step": 4, "message": None}
    _, _, elapsed = ciclo.loop(STATE, data, tasks, stop=4, resume=ckpt)
    assert elapsed.steps == 4
    assert "already ended after 4 steps" in capsys.readouterr().err
    state, history, elapsed = ciclo.loop(STATE, data, tasks, stop=10, resume=ckpt)
    assert elapsed.steps == 10
    reference, reference_history, _ = ciclo.loop(STATE, data, {ciclo.every(1): train_step}, stop=10)
    np.testing.assert_array_equal(state, reference)
    assert history.collect("loss") == reference_history.collect("loss")


def test_a_run_whose_data_ran_out_stays_finished_until_there_is_more(tmp_path, capsys):
    ckpt = ciclo.checkpoint(tmp_path, async_save=False)
    tasks = {ciclo.every(1): train_step, ciclo.every(100): ckpt}
    with pytest.warns(RuntimeWarning, match=r"dataset ended after 4 batches.*stop=10"):
        ciclo.loop(STATE, BATCHES, tasks, stop=10, resume=ckpt)
    assert ending(tmp_path) == {"reason": "data", "step": 4, "message": None}
    before = on_disk(tmp_path)
    _, _, elapsed = ciclo.loop(STATE, BATCHES, tasks, stop=10, resume=ckpt)  # no warning
    assert elapsed.steps == 4
    assert on_disk(tmp_path) == before
    assert "already ended after 4 steps (its data ran out)" in capsys.readouterr().err
    # Without stop too: the same data has no batch left.
    ciclo.loop(STATE, BATCHES, tasks, resume=ckpt)
    assert on_disk(tmp_path) == before
    # More data continues it.
    _, history, elapsed = ciclo.loop(STATE, BATCHES * 2, tasks, stop=6, resume=ckpt)
    assert elapsed.steps == 6
    assert len(history.collect("loss")) == 6
    assert ending(tmp_path) == {"reason": "stop", "step": 6, "message": None}


def test_an_early_stopped_run_continues_only_when_asked(tmp_path, capsys):
    # The evaluation loss rises after the first epoch: patience 1 stops after epoch 2.
    stopper = ciclo.early_stopping("loss_test", patience=1, verbose=False)
    state, history, elapsed = train(tmp_path, epochs=6, callbacks=[stopper])
    assert elapsed.steps == 8
    end = ending(tmp_path / "ckpt")
    assert end["reason"] == "early_stopping"
    assert end["step"] == 8
    assert end["step"] == elapsed.steps  # the count of steps, the final checkpoint's name
    assert end["message"].startswith("early_stopping at step 7")  # the evaluation's label
    before = on_disk(tmp_path)
    capsys.readouterr()

    best_step = stopper.best_step
    stopper = ciclo.early_stopping("loss_test", patience=1, verbose=False)
    again, again_history, again_elapsed = train(tmp_path, epochs=6, callbacks=[stopper])
    assert stopper.best_step == best_step is not None  # restored from the checkpoint
    err = capsys.readouterr().err
    assert "already ended after 8 steps (early stopping ended it)" in err
    assert "To train on, give resume_stopped=True." in err
    assert on_disk(tmp_path) == before
    assert again_elapsed.steps == 8
    assert again_history.collect("loss_test") == history.collect("loss_test")
    np.testing.assert_array_equal(again, state)

    # Asked explicitly, with a larger patience: it trains on.
    stopper = ciclo.early_stopping("loss_test", patience=3, verbose=False)
    _, history, elapsed = train(tmp_path, epochs=6, callbacks=[stopper], resume_stopped=True)
    assert elapsed.steps > 8
    assert len(history.collect("loss_test")) == elapsed.steps // 4


def test_a_run_ended_by_the_nan_guard_stays_finished(tmp_path, capsys):
    @jax.jit
    def diverging(state, batch):
        new = state * 0.5 + batch.mean()
        new = jax.numpy.where(batch.mean() == 2.0, jax.numpy.nan, new)
        return ciclo.logs().add_loss("loss", new.sum()), new

    ckpt = ciclo.checkpoint(tmp_path, async_save=False)
    guard = ciclo.terminate_on_nan(interval=0, verbose=False)
    tasks = {ciclo.every(1): [diverging, guard], ciclo.every(100): ckpt}
    with pytest.warns(RuntimeWarning, match="the state of step 3 holds NaN or inf"):
        state, _, elapsed = ciclo.loop(STATE, BATCHES * 2, tasks, resume=ckpt)
    assert elapsed.steps == 3
    assert ending(tmp_path)["reason"] == "nan"
    before = on_disk(tmp_path)
    capsys.readouterr()
    again, _, again_elapsed = ciclo.loop(STATE, BATCHES * 2, tasks, resume=ckpt)
    assert "already ended after 3 steps (the NaN guard" in capsys.readouterr().err
    assert again_elapsed.steps == 3
    assert np.isnan(again).all()  # the final state, as it ended
    assert np.isnan(state).all()
    assert on_disk(tmp_path) == before


def test_a_run_stopped_by_a_signal_is_not_finished(tmp_path):
    def interrupt(state, batch, elapsed):
        if elapsed.steps == 2:
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C: the loop stops after this step

    ckpt = ciclo.checkpoint(tmp_path, async_save=False)
    tasks = {ciclo.every(1): [train_step, interrupt], ciclo.every(100): ckpt}
    _, _, elapsed = ciclo.loop(STATE, BATCHES, tasks, resume=ckpt)
    assert elapsed.steps == 3
    assert ending(tmp_path) is None  # interrupted, not ended
    _, _, elapsed = ciclo.loop(STATE, BATCHES, tasks, resume=ckpt)  # it goes on
    assert elapsed.steps == 4
    assert ending(tmp_path) == {"reason": "data", "step": 4, "message": None}


def test_a_last_step_saved_by_its_schedule_records_the_ending_without_a_save_on_end(tmp_path):
    ckpt = ciclo.checkpoint(tmp_path, async_save=True, save_on_end=False)
    tasks = {ciclo.every(1): train_step, ciclo.every(2): ckpt}
    ciclo.loop(STATE, BATCHES, tasks, stop=4, resume=ckpt)  # saves 1 and 3, not 4
    assert ending(tmp_path) is None  # the last step was not saved: it resumes from 3
    ckpt = ciclo.checkpoint(tmp_path / "each", async_save=True, save_on_end=False)
    tasks = {ciclo.every(1): [train_step, ckpt]}
    ciclo.loop(STATE, BATCHES, tasks, stop=4, resume=ckpt)  # saves 1, 2, 3 and 4
    assert ending(tmp_path / "each") == {"reason": "stop", "step": 4, "message": None}


def test_a_checkpoint_without_an_ending_resumes_as_before(tmp_path, capsys):
    """Checkpoints written before the ``end`` field (ciclo 0.1) resume as runs that have
    not ended."""
    ckpt = ciclo.checkpoint(tmp_path, async_save=False)
    tasks = {ciclo.every(1): train_step, ciclo.every(100): ckpt}
    ciclo.loop(STATE, BATCHES, tasks, stop=4, resume=ckpt)
    meta_file = tmp_path / "4" / "meta" / "metadata"
    meta = json.loads(meta_file.read_text())
    del meta["end"]
    meta_file.write_text(json.dumps(meta))
    capsys.readouterr()
    _, history, elapsed = ciclo.loop(STATE, BATCHES * 2, tasks, stop=6, resume=ckpt)
    assert elapsed.steps == 6
    assert len(history.collect("loss")) == 6
    assert "already ended" not in capsys.readouterr().err
    # Resumed at a stop already reached, it runs no step and says nothing of an ending.
    meta = json.loads((tmp_path / "6" / "meta" / "metadata").read_text())
    del meta["end"]
    (tmp_path / "6" / "meta" / "metadata").write_text(json.dumps(meta))
    _, _, elapsed = ciclo.loop(STATE, BATCHES * 2, tasks, stop=6, resume=ckpt)
    assert elapsed.steps == 6
    assert "already ended" not in capsys.readouterr().err
