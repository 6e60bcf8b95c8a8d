"""Grain pipelines resume exactly through their own iterator state: a run on a Grain
DataLoader, killed mid-epoch and resumed, ends bit-identical, with the iterator state in the
checkpoint and no batch drawn twice."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("grain")

import ciclo

sys.path.insert(0, str(Path(__file__).parent))
import grain_training as training


def test_a_grain_loader_killed_mid_epoch_and_resumed_ends_bit_identical(tmp_path):
    reference = training.run(tmp_path / "reference")
    assert reference[3] == training.STEPS
    killed = tmp_path / "killed"
    process = subprocess.Popen(
        [sys.executable, training.__file__, str(killed), "--delay", "0.1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        kill_at = 12  # mid-epoch 2 (epochs of 8 batches), after the checkpoint at step 10
        assert process.stdout is not None
        for line in process.stdout:
            if int(line.split()[1]) >= kill_at:
                break
        process.send_signal(signal.SIGKILL)
        process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == -signal.SIGKILL
    (saved,) = [p for p in (killed / "ckpt").iterdir() if p.name.isdigit()]
    meta = "".join(p.read_text(errors="ignore") for p in saved.rglob("*") if p.is_file())
    assert "last_seen_indices" in meta, "the checkpoint does not hold Grain's iterator state"
    consumed = int(saved.name)  # a checkpoint is named by its elapsed.steps
    assert 8 < consumed < 16, "the checkpoint is not mid-epoch 2"

    state, history, elapsed, drawn = training.run(killed, resume=True)
    assert drawn == training.STEPS - consumed  # no batch replayed: each drawn once in all
    assert elapsed.steps == training.STEPS
    for key in ("w", "order"):
        np.testing.assert_array_equal(np.asarray(state[key]), np.asarray(reference[0][key]))
    assert history.collect("loss") == reference[1].collect("loss")


def test_stateful_dataset_needs_an_iterator_with_state():
    with pytest.raises(TypeError, match=r"stateful_dataset: int is not iterable"):
        ciclo.stateful_dataset(3)
    with pytest.raises(TypeError, match=r"has no get_state\(\)/set_state\(\)"):
        next(ciclo.stateful_dataset([1, 2]))


def test_epochs_over_a_grain_map_dataset_are_passes_resumed_by_index(tmp_path):
    """train_loop(epochs=N) over a Grain MapDataset: N passes, evaluated at each end, and a
    run killed mid-epoch resumes by index (issue 27)."""
    import grain
    import jax

    batches = [np.full((2, 1), float(i), np.float32) for i in range(4)]
    dataset = grain.MapDataset.source(batches)

    @jax.jit
    def train_step(state, batch):
        return ciclo.logs().add_loss("loss", state.sum()), state * 0.5 + batch.mean()

    def eval_step(state, batch):
        return ciclo.logs().add_metric("score", state.sum())

    def run(data, stop_at=None, resume=None):
        def crash(state, batch, elapsed):
            if elapsed.steps == stop_at:
                raise RuntimeError("killed")

        tasks = {ciclo.on_train_step: [train_step, crash], ciclo.on_test_step: eval_step}
        ckpt = ciclo.checkpoint(tmp_path / "ckpt", async_save=False, save_on_end=False)
        return ciclo.train_loop(
            np.zeros(1, np.float32),
            data,
            {**tasks, ciclo.every(3): ckpt},
            test_dataset=lambda: batches[:1],
            epochs=3,
            resume=resume and ckpt,
        )

    state, history, elapsed = ciclo.train_loop(
        np.zeros(1, np.float32),
        dataset,
        {ciclo.on_train_step: train_step, ciclo.on_test_step: eval_step},
        test_dataset=lambda: batches[:1],
        epochs=3,
    )
    expected = np.zeros(1, np.float32)
    for batch in batches * 3:
        expected = expected * 0.5 + batch.mean()
    np.testing.assert_allclose(state, expected)
    assert elapsed.steps == 12
    assert history.collect("steps", "score_test")[0] == [3, 7, 11]

    with pytest.raises(RuntimeError, match="killed"):
        run(dataset, stop_at=8)  # after the checkpoint of step 7, mid-epoch 2
    resumed, resumed_history, _ = run(dataset, resume=True)
    np.testing.assert_array_equal(resumed, state)
    assert resumed_history.collect("loss") == history.collect("loss")


def test_a_grain_map_dataset_seeks_through_its_iterator_state_and_replays_unwrapped(
    tmp_path, capsys
):
    """Wrapped in stateful_dataset, a resumed Grain pipeline restarts at the saved position:
    no record before it goes through the pipeline again. Given as it is, it is replayed, and
    the line that says so names the fix."""
    import grain

    read: list[int] = []

    class Record(grain.transforms.Map):
        def map(self, index):
            read.append(int(index))
            return np.full(2, index, np.float32)

    def pipeline():
        return grain.MapDataset.range(12).map(Record())

    def run(dataset, name, crash):
        def step(state, batch, elapsed):
            if crash and elapsed.steps == 8:
                raise RuntimeError("killed")
            return state * 2 + float(np.asarray(batch).sum())

        ckpt = ciclo.checkpoint(tmp_path / name, async_save=False, compilation_cache=False)
        tasks = {ciclo.every(1): step, ciclo.every(3): ckpt}  # saves 1, 4, 7
        return ciclo.loop(np.float64(0.0), dataset, tasks, resume=ckpt)

    expected = run(pipeline(), "reference", crash=False)[0]
    for name, wrap in (("seek", ciclo.stateful_dataset), ("replay", lambda d: d)):
        with pytest.raises(RuntimeError, match="killed"):
            run(wrap(pipeline()), name, crash=True)
        read.clear()
        capsys.readouterr()
        state, _, elapsed = run(wrap(pipeline()), name, crash=False)
        assert (elapsed.steps, state) == (12, expected)
        replayed = [line for line in capsys.readouterr().err.splitlines() if "replay" in line]
        if name == "seek":
            assert min(read) == 7  # the 7 consumed records were not read again
            assert replayed == []
        else:
            assert min(read) == 0
            assert replayed == [
                "ciclo: reaching the checkpoint's data position by replaying 7 batches: a "
                "MapMapDataset cannot seek (wrap it in ciclo.stateful_dataset to resume from "
                "its iterator's state)."
            ]
