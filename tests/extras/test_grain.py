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
