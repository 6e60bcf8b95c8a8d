"""early_stopping and terminate_on_nan."""

from __future__ import annotations

import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ciclo
from ciclo._records import _host


def run(values, stop=None, epoch_duration=1, test_every=None, **options):
    """Trains an int counter; evaluation k reports ``values[k]`` as ``loss_test``."""
    remaining = list(values)
    out = io.StringIO()
    stopper = ciclo.early_stopping("loss_test", file=out, **options)
    state, _, elapsed = ciclo.train_loop(
        0,
        [np.zeros(1)] * (stop or len(values) * epoch_duration),
        {
            ciclo.on_train_step: lambda state: (None, state + 1),
            ciclo.on_test_step: lambda: ciclo.logs().add_loss("loss", remaining.pop(0)),
        },
        callbacks=[stopper],
        test_dataset=lambda: [np.zeros(1)],
        epoch_duration=epoch_duration,
        test_every=test_every,
    )
    return state, elapsed, stopper, out.getvalue()


def test_patience_is_counted_in_evaluations():
    _, elapsed, stopper, printed = run([1.0, 0.9, 0.95, 0.92, 0.91, 0.5], patience=3)
    assert elapsed.steps == 5
    assert stopper.stopped_step == 4  # labels: the evaluation after the 5th step is step 4
    assert stopper.best == pytest.approx(0.9)
    assert stopper.best_step == 1
    assert printed.startswith(
        "early_stopping at step 4: loss_test has not improved by more than 0 for 3 evaluations"
        " (last 0.91, best 0.9 at step 1)."
    )


def test_min_delta_is_honoured():
    values = [1.0, 0.95, 0.91, 0.88, 0.86, 0.5]
    _, elapsed, _, _ = run(values, patience=2)
    assert elapsed.steps == 6  # every value improves a little: no stop
    _, elapsed, stopper, _ = run(values, patience=2, min_delta=0.1)
    assert elapsed.steps == 3
    assert stopper.best == 1.0  # 0.95 and 0.91 are not 0.1 better
    # relative: 5% of the best; 0.96 is not enough, 0.94 is, then 0.93 and 0.92 are not
    _, elapsed, stopper, _ = run(
        [1.0, 0.96, 0.94, 0.93, 0.92, 0.5], patience=2, min_delta=0.05, min_delta_mode="rel"
    )
    assert elapsed.steps == 5
    assert stopper.best_step == 2


def test_restore_best_weights_at_the_end_of_training():
    state, elapsed, stopper, printed = run(
        [3.0, 1.0, 2.0, 2.5], patience=2, restore_best_weights=True
    )
    assert elapsed.steps == 4
    assert stopper.stopped_step == 3
    assert state == 2  # the state evaluated at the best check, after 2 steps (label 1)
    assert "restoring the state of step 1 (loss_test = 1)" in printed
    # not triggered: the best state is still restored at the end
    state, elapsed, stopper, _ = run([3.0, 1.0, 2.0], patience=10, restore_best_weights=True)
    assert elapsed.steps == 3
    assert stopper.stopped_step is None
    assert state == 2
    # without restore_best_weights the last state stays
    state, _, _, _ = run([3.0, 1.0, 2.0], patience=10)
    assert state == 3


def test_best_weights_survive_donated_buffers():
    @jax.jit
    def make(x):
        return x + 1

    stopper = ciclo.early_stopping("m", 5, mode="max", restore_best_weights=True, verbose=False)
    step = jax.jit(
        lambda s: (ciclo.logs().add_metric("m", -s["x"].sum()), {"x": s["x"] + 1}), donate_argnums=0
    )
    state, _, _ = ciclo.train_loop(
        {"x": make(jnp.zeros(3))},
        [np.zeros(1)] * 3,
        {ciclo.on_train_step: step},
        callbacks=[stopper],
        epoch_duration=1,
    )
    np.testing.assert_array_equal(state["x"], [2.0, 2.0, 2.0])  # checked after step 1


def test_mode_max_baseline_and_start_from():
    # the baseline 0.5 is never beaten: better values do not reset patience
    _, elapsed, stopper, printed = run([0.1, 0.2, 0.3, 0.4], patience=2, baseline=0.5, mode="max")
    assert elapsed.steps == 2
    assert "baseline 0.5" in printed
    assert stopper.best == pytest.approx(0.2)
    _, elapsed, _, _ = run([0.1, 0.6, 0.6, 0.6, 0.6], patience=2, baseline=0.5, mode="max")
    assert elapsed.steps == 4  # patience starts over at 0.6, the first value above the baseline
    # start_from ignores the first checks (a warm-up)
    _, elapsed, stopper, _ = run([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], patience=1, start_from=3)
    assert stopper.checks == 2
    assert elapsed.steps == 4
    stopper = ciclo.early_stopping("accuracy", 1, mode="max")
    assert stopper.improves(0.9, 0.8)
    assert not stopper.improves(0.8, 0.9)


def test_patience_as_a_period():
    _, elapsed, stopper, printed = run(
        [1.0, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0], patience=ciclo.at(steps=3)
    )
    assert elapsed.steps == 5
    assert "for 3 steps" in printed  # 3 steps since step 1
    assert stopper.stopped_step == 4


def test_checks_without_a_new_value_are_skipped():
    _, elapsed, stopper, _ = run([1.0, 2.0, 3.0], patience=2, stop=6, test_every=2)
    assert stopper.stopped_step == 5  # the 2nd evaluation without improvement, not 2nd epoch
    assert stopper.checks == 3
    assert elapsed.steps == 6  # epochs end at 1..6, evaluations at 2,4,6


def test_state_dict_round_trip():
    _, _, stopper, _ = run([1.0, 0.5, 0.7], patience=5, restore_best_weights=True)
    saved = stopper.state_dict()
    assert saved == {
        "best": pytest.approx(0.5),
        "best_step": 1,
        "wait": 1,
        "wait_since": saved["wait_since"],
        "checks": 3,
        "stopped_step": None,
        "seen": True,
        "best_weights": 2,
    }
    assert saved["wait_since"]["steps"] == 2
    other = ciclo.early_stopping("loss_test", 5)
    other.load_state_dict(saved)
    assert other.state_dict() == saved


def test_bad_arguments_are_clear_errors():
    with pytest.raises(KeyError, match=r"monitor 'loss_tst' is not in .*Did you mean 'loss_test'"):
        ciclo.train_loop(
            0,
            [1] * 2,
            {
                ciclo.on_train_step: lambda: None,
                ciclo.on_test_step: lambda: ciclo.logs().add_loss("loss", 1.0),
            },
            callbacks=[ciclo.early_stopping("loss_tst", 2)],
            test_dataset=lambda: [1],
            epoch_duration=1,
        )
    with pytest.raises(ValueError, match=r"mode must be 'min'.*or 'max'"):
        ciclo.early_stopping("loss", 2, mode="best")
    with pytest.raises(
        KeyError, match=r"monitor 'los' is not in the logs; entries: \['losses.loss'\]"
    ):
        ciclo.train_loop(
            0,
            [1] * 2,
            {ciclo.on_train_step: lambda: ciclo.logs().add_loss("loss", 1.0)},
            callbacks=[ciclo.early_stopping("los", 2)],
            epoch_duration=1,
        )
    stopper = ciclo.early_stopping("loss", 2)
    with pytest.raises(KeyError, match=r"monitor 'loss' is not in the logs"):
        ciclo.loop(0, [1], {ciclo.every(1): stopper})  # under a schedule: the value must be there
    with pytest.raises(TypeError, match=r"patience must be a number of evaluations"):
        ciclo.early_stopping("loss", 2.5)
    with pytest.raises(ValueError, match=r"min_delta_mode must be 'abs'"):
        ciclo.early_stopping("loss", 2, min_delta_mode="percent")


@jax.jit
def nan_step(state, batch):
    loss = jnp.where(state >= 3, jnp.nan, 1.0)
    return ciclo.logs().add_loss("loss", loss), state + 1


def test_terminate_on_nan_stops_the_loop():
    out = io.StringIO()
    state, _, elapsed = ciclo.train_loop(
        jnp.int32(0),
        [np.zeros(1)] * 10,
        {ciclo.on_train_step: nan_step},
        callbacks=[ciclo.terminate_on_nan(interval=0, file=out)],
    )
    assert elapsed.steps == 4
    assert int(state) == 4
    assert (
        out.getvalue()
        == "terminate_on_nan: NaN or inf in losses.loss at step 3; training stopped after "
        "step 3.\n"
    )


def test_terminate_on_nan_does_not_fetch_every_step(monkeypatch):
    calls = []
    original = _host.to_host
    monkeypatch.setattr(_host, "to_host", lambda tree: calls.append(1) or original(tree))
    history = ciclo.history(fetch_interval=1e9)
    stopper = ciclo.terminate_on_nan(interval=1e9, file=io.StringIO())
    ciclo.loop(
        jnp.int32(0), [np.zeros(1)] * 30, {ciclo.every(1): [nan_step, stopper]}, history=history
    )
    assert len(calls) == 1  # one check in 30 steps (the first); the loop was not stopped
    assert len(history) == 30


def test_a_preempted_run_says_it_is_saved_and_resumes_not_that_it_restores(tmp_path):
    import signal

    def step(state, batch, elapsed):
        if elapsed.steps == 4:
            signal.raise_signal(signal.SIGTERM)  # a preemption notice during step 4
        return None, state + 1

    values = iter([3.0, 1.0, 2.0, 2.5, 2.6, 2.7])
    out = io.StringIO()
    stopper = ciclo.early_stopping("loss_test", 10, restore_best_weights=True, file=out)
    checkpoint = ciclo.checkpoint(tmp_path)
    with pytest.raises(SystemExit, match="143"):
        ciclo.train_loop(
            0,
            [np.zeros(1)] * 6,
            {
                ciclo.on_train_step: step,
                ciclo.on_test_step: lambda: ciclo.logs().add_loss("loss", next(values)),
            },
            callbacks=[stopper, checkpoint],
            test_dataset=lambda: [np.zeros(1)],
            epoch_duration=1,
        )
    printed = out.getvalue()
    assert "restoring" not in printed
    # Issue 28: the evaluation due after step 4 (the preemption notice came during it) ends
    # after its first batch and is not recorded; a resumed run evaluates again there.
    assert printed == (
        "early_stopping: stopped by SIGTERM; inner_loop('test') at step 4 ended at its next "
        "batch and is not recorded; a resumed run evaluates again at this step "
        f"(checkpoint 5 saved in {checkpoint.directory}). "
        "The run is interrupted, not finished: it keeps its current state (resume= "
        "continues it from a checkpoint); the best state so far, of step 1 (loss_test = 1), "
        "is restored when training ends.\n"
    )
    assert ciclo.restore(checkpoint, 0).state == 5  # the current state, not the best (2)
