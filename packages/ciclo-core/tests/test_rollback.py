"""``ciclo.rollback_on_nan``: a poison batch is rolled back past, recorded in the history,
and a run killed after the rollback resumes to the same run (one process and two)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

import ciclo
from ciclo._checkpoint import _rollback
from ciclo.testing import free_port, run_on_loopback

sys.path.insert(0, str(Path(__file__).parent))
import rollback_training as training
from multihost_loop_worker import Positioned

TIMEOUT = 240  # seconds, for a subprocess or a 2-process job

#: checkpoints hold 1, 6, 11, ... steps (every(5) fires at steps 0, 5, 10: the save counts
#: the step); the poison batch is step 13, so the run goes back to checkpoint 11 and skips
#: the batches 11, 12 and 13.
ROLLBACK = [11, 1, 3, 11, training.POISON]  # steps, rollbacks, skipped, from, fault step
SKIPPED = [11, 12, 13]


@pytest.fixture(scope="module")
def rolled_back(tmp_path_factory):
    directory = tmp_path_factory.mktemp("rolled_back")
    return directory, training.fingerprint(*training.run(str(directory)))


def test_a_poison_batch_never_reaches_an_applied_update_and_params_end_finite(rolled_back):
    _, run = rolled_back
    assert all(math.isfinite(w) for w in run["w"])
    assert run["steps"] == training.STEPS
    seen = run["seen"]
    assert [seen[i] for i in SKIPPED] == [0, 0, 0]  # the poison batch (13) among them
    assert seen[: SKIPPED[0]] == [1] * SKIPPED[0]
    # The same as training on the data without the skipped batches: nothing of the
    # abandoned steps is left in the state.
    data = [b for i, b in enumerate(training.batches()) if i not in SKIPPED]
    state, todo = training.tasks(str(rolled_back[0] / "clean"))
    clean, _, _ = ciclo.loop(state, data, {ciclo.every(1): next(iter(todo.values()))[0]}, stop=30)
    assert np.asarray(clean["w"]).tolist() == run["w"]


def test_the_history_records_the_rollback(rolled_back):
    directory, run = rolled_back
    assert run["rollbacks"] == [ROLLBACK]
    steps = [step for step, _ in run["losses"]]
    assert steps == list(range(training.STEPS))  # one row per applied step, no NaN left
    assert all(math.isfinite(loss) for _, loss in run["losses"])
    # The checkpoint of the abandoned steps is set aside, never deleted.
    assert "16.rolled-back" in os.listdir(directory)


def test_later_checkpoints_hold_the_skipped_batches_and_the_rollback(rolled_back):
    directory, _ = rolled_back
    meta = json.loads((directory / "21" / "meta" / "metadata").read_text())
    # 21 steps applied, 3 batches skipped: the dataset is at batch 24.
    assert meta["data"] == {"position": 24, "state": None, "skipped": 3}
    before = json.loads((directory / "11" / "meta" / "metadata").read_text())
    assert before["data"] == {"position": 11, "state": None}  # no rollback yet: no field
    restored = ciclo.restore(directory, training.tasks(str(directory / "x"))[0], step=21)
    assert restored.history.collect("rollbacks") == [1]


def test_a_nan_noticed_mid_run_stops_the_engine_there_and_rolls_back(
    rolled_back, tmp_path, monkeypatch
):
    # It looks at every step, and the history fetches every 16 steps: the NaN of step 13,
    # fetched after step 15, is seen at step 16, and the engine stops after it.
    monkeypatch.setattr(_rollback, "LOOK_SECONDS", 0.0)
    drawn = []
    state, todo = training.tasks(str(tmp_path))
    next(iter(todo.values())).append(lambda s, b, elapsed: drawn.append(elapsed.steps))
    run = ciclo.loop(
        state, training.batches(), todo, stop=30, history=ciclo.history(fetch_interval=0.0)
    )
    assert drawn == [*range(17), *range(11, 30)]
    assert training.fingerprint(*run) == rolled_back[1]


def test_the_rollback_does_not_depend_on_when_the_nan_is_noticed(rolled_back, tmp_path):
    # The default history fetches every 0.5 s: this short run notices the NaN only when its
    # steps are over, and still rolls back to the same checkpoint and skips the same batches.
    late = training.fingerprint(*training.run(str(tmp_path), fetch_interval=60.0))
    assert late == rolled_back[1]


def test_a_stateful_dataset_is_moved_past_the_skipped_batches(rolled_back, tmp_path):
    dataset = Positioned(training.batches(), process=0, seen={})
    run = training.fingerprint(*training.run(str(tmp_path), data=dataset))
    assert run == rolled_back[1]
    assert dataset.position == training.STEPS + len(SKIPPED)


class Killed:
    """``rollback_training.py`` in a subprocess that SIGKILLs itself at a step."""

    def __init__(self, directory: Path, die_at: int) -> None:
        self.process = subprocess.run(
            [sys.executable, training.__file__, str(directory), "--die-at", str(die_at)],
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )


@pytest.mark.slow
def test_a_sigkill_after_the_rollback_then_resume_ends_as_the_uninterrupted_run(
    rolled_back, tmp_path
):
    killed = Killed(tmp_path, die_at=23)  # checkpoints 16 and 21 hold the rollback
    assert killed.process.returncode == -9, killed.process.stderr[-3000:]
    assert killed.process.stdout.splitlines()[-1] == "step 22 rolled_back 1"  # then died
    steps = sorted(int(p) for p in os.listdir(tmp_path) if p.isdigit())
    assert steps[-1] == 21
    resumed = training.fingerprint(*training.run(str(tmp_path), resume=True))
    assert resumed == rolled_back[1]


def test_after_max_rollbacks_the_next_fault_stops_training(tmp_path, capsys, monkeypatch):
    # Batch 20 is step 17 once batches 11-13 are skipped. The rollback looks at every step
    # (not every 0.1 s), so a fast machine too notices it before the stop.
    monkeypatch.setattr(_rollback, "LOOK_SECONDS", 0.0)
    data = training.batches(poison=(training.POISON, 20))
    with pytest.warns(
        RuntimeWarning, match=r"the state of step \d+ holds NaN or inf"
    ):  # the final save
        _, history, elapsed = training.run(str(tmp_path), data=data, max_rollbacks=1)
    assert history.collect("rollbacks") == [1]
    assert 17 < elapsed.steps < training.STEPS, elapsed.steps
    assert not math.isfinite(history.collect("loss")[-1])
    # The run ended as terminate_on_nan ends one: a resume returns it, finished.
    resumed = training.run(str(tmp_path), data=data, resume=True, max_rollbacks=1)
    assert resumed[2].steps == elapsed.steps
    err = capsys.readouterr().err
    assert f"already ended after {elapsed.steps} steps (the NaN guard" in err


def test_max_rollbacks_0_stops_at_the_first_fault(tmp_path):
    stops = []
    state, todo = training.tasks(str(tmp_path), max_rollbacks=0)
    with pytest.warns(
        RuntimeWarning, match=r"the state of step \d+ holds NaN or inf"
    ):  # the final save
        ciclo.loop(
            state, training.batches(), todo, stop=30, on_end=lambda s, b, e, ls: stops.append(ls)
        )
    assert stops[0].ending["reason"] == "nan"
    assert stops[0].stop_reason.startswith(
        "rollback_on_nan: loss is nan at step 13, after 0 rollbacks"
    )


def test_with_no_finite_checkpoint_before_the_fault_training_stops(tmp_path):
    data = training.batches(poison=(0,))
    reasons = []
    state, todo = training.tasks(str(tmp_path))
    on_end = lambda s, b, e, loop_state: reasons.append(loop_state.stop_reason)  # noqa: E731
    with pytest.warns(
        RuntimeWarning, match=r"the state of step \d+ holds NaN or inf"
    ):  # the final save
        ciclo.loop(state, data, todo, stop=10, on_end=on_end)
    assert "no finite checkpoint" in reasons[0]
    assert "at step 0" in reasons[0]


def test_spike_rolls_back_a_finite_loss_far_above_its_running_median(tmp_path):
    data = training.batches(poison=())
    data[22]["y"] = data[22]["y"] * 1000.0  # a finite spike
    plain = training.run(str(tmp_path / "plain"), data=data)[1]
    with pytest.raises(KeyError):
        plain.collect("rollbacks")  # without spike=, a finite value is no fault
    _, history, _ = training.run(str(tmp_path / "spike"), data=data, spike=20.0)
    assert history.collect("steps", "rollbacks", "fault_step") == ([21], [1], [22])
    assert max(history.collect("loss")) < 1000.0


# --- bad arguments -------------------------------------------------------------------------
@pytest.fixture
def ckpt(tmp_path):
    return ciclo.checkpoint(tmp_path / "ckpt")


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"monitor": ""}, TypeError, r"monitor=''\): monitor must be the name of a log entry"),
        ({"spike": 1.0}, ValueError, r"spike=1.0\): spike must be a number > 1"),
        ({"spike": float("nan")}, ValueError, r"spike=nan\): spike must be a number > 1"),
        ({"spike": True}, ValueError, r"spike=True\): spike must be a number > 1"),
        ({"max_rollbacks": -1}, ValueError, r"max_rollbacks=-1\): expected an int >= 0"),
        ({"max_rollbacks": 2.0}, ValueError, r"max_rollbacks=2.0\): expected an int >= 0"),
    ],
)
def test_bad_arguments_are_named(ckpt, kwargs, error, match):
    with pytest.raises(error, match=match):
        ciclo.rollback_on_nan(ckpt, **kwargs)


def test_a_checkpoint_that_is_not_one_is_named():
    with pytest.raises(TypeError, match=r"checkpoint=3\): give the ciclo.checkpoint"):
        ciclo.rollback_on_nan(3)


def _step(state, batch):
    return ciclo.logs().add_loss("loss", jnp.mean(batch) * state), state


def test_a_checkpoint_missing_from_the_tasks_is_an_error(ckpt, tmp_path):
    rollback = ciclo.rollback_on_nan(tmp_path / "elsewhere")
    tasks = {ciclo.every(1): [_step, rollback], ciclo.every(5): ckpt}
    with pytest.raises(ValueError, match=r"no ciclo.checkpoint of this loop writes .*elsewhere"):
        ciclo.loop(jnp.ones(()), [np.ones(2)] * 3, tasks)


def test_a_one_shot_iterator_is_an_error(ckpt):
    tasks = {ciclo.every(1): [_step, ciclo.rollback_on_nan(ckpt)], ciclo.every(5): ckpt}
    with pytest.raises(TypeError, match=r"one-shot iterator \(generator\)"):
        ciclo.loop(jnp.ones(()), (np.ones(2) for _ in range(3)), tasks)


def test_a_monitor_not_logged_is_named_with_the_entries(ckpt):
    rollback = ciclo.rollback_on_nan(ckpt, monitor="los")
    tasks = {ciclo.every(1): [_step, rollback], ciclo.every(5): ckpt}
    with pytest.raises(
        KeyError, match=r"monitor='los'\) at step 0: no log entry 'los'; entries: .*losses.loss"
    ):
        ciclo.loop(jnp.ones(()), [np.ones(2)] * 3, tasks)


def test_a_run_without_faults_is_unchanged(ckpt):
    rollback = ciclo.rollback_on_nan(ckpt.directory)  # the directory finds the checkpoint
    tasks = {ciclo.every(1): [_step, rollback], ciclo.every(2): ckpt}
    _, history, elapsed = ciclo.loop(jnp.ones(()), [np.ones(2)] * 5, tasks)
    assert elapsed.steps == 5
    assert history.collect("loss") == [1.0] * 5
    with pytest.raises(KeyError, match="no key 'rollbacks'"):
        history.collect("rollbacks")


# --- two processes -------------------------------------------------------------------------
# Each process kills itself (SIGKILL, -9) at the step `--die-at` names, once both have
# reached it. When process 0 (which runs JAX's coordination service) is gone first, process
# 1's coordination client may abort it (SIGABRT, -6) in the moment before its own kill: seen
# twice under a load of 15.
_FINISHED = ((0,), (0,))
_KILLED = ((-9,), (-9, -6))


def _job(directory: Path, *extra: str, expected: tuple[tuple[int, ...], ...] = _FINISHED) -> None:
    port = free_port()
    command = [sys.executable, training.__file__, str(directory), "--port", str(port), *extra]
    run = run_on_loopback(
        [[*command, "--process", str(i)] for i in range(2)],
        devices_per_process=2,
        timeout=TIMEOUT,
    )
    for i, (code, output, allowed) in enumerate(zip(run.codes, run.outputs, expected, strict=True)):
        assert code in allowed, f"process {i} exited {code}, not {allowed}:\n{output[-3000:]}"


def _results(directory: Path) -> list[dict]:
    return [json.loads((directory / f"result{i}.json").read_text()) for i in range(2)]


@pytest.mark.slow
def test_two_processes_roll_back_at_one_step_and_resume_after_a_sigkill_to_the_same_run(
    tmp_path,
):
    # The poison is in process 1's half of batch 13: the global loss is NaN on both.
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    whole.mkdir(), killed.mkdir()
    _job(whole)
    first, second = _results(whole)
    assert first == second  # the same rollback, at the same step, on both processes
    assert first["rollbacks"] == [ROLLBACK]
    # Process 0 noticed the NaN of step 13 when its history fetched (after step 15); the
    # processes stopped at one agreed step soon after (agree_every=2: within 3 steps).
    (stopped,) = first["stopped_after"]
    assert 16 <= stopped <= 19
    assert first["steps"] == training.STEPS
    assert all(math.isfinite(v) for v in [*first["w"], first["b"], *first["losses"]])
    _job(killed, "--die-at", "23", expected=_KILLED)
    assert not (killed / "result0.json").exists()
    _job(killed)  # the same command resumes it
    for resumed in _results(killed):
        assert resumed["stopped_after"] == []  # resumed after the rollback
        assert resumed["rollbacks"] == first["rollbacks"]
        assert resumed["losses"] == first["losses"]
        np.testing.assert_allclose(resumed["w"], first["w"], rtol=1e-6)
        np.testing.assert_allclose(resumed["b"], first["b"], rtol=1e-6)


def test_in_train_loop_the_skipped_batches_are_counted_when_the_data_ends_first(tmp_path):
    state, todo = training.tasks(str(tmp_path))
    step, rollback, _ = next(iter(todo.values()))
    ckpt = todo[list(todo)[1]]
    data = training.batches()[:30]
    # epochs=1 stops after 30 steps; three batches are skipped, so the data ends first.
    with pytest.warns(RuntimeWarning, match=r"after 30 batches \(step 27, 3 of them skipped"):
        final, history, _ = ciclo.train_loop(
            state,
            data,
            {ciclo.on_train_step: step, ciclo.every(5): ckpt},
            callbacks=[rollback],
            epochs=1,
        )
    assert history.collect("steps", "rollbacks", "fault_step") == ([11], [1], [13])
    assert np.asarray(final["seen"]).tolist()[:30] == [1] * 11 + [0] * 3 + [1] * 16
