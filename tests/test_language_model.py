"""examples/language_model.py in a short configuration: killed with SIGKILL after its first
checkpoint and run again with the same command, it ends with the same parameters (and
averaged parameters) as a run that was never interrupted."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).parents[1] / "examples" / "language_model.py"
#: A tiny model (1 block of width 64), 12 steps, a checkpoint every 4.
SHORT = [
    "--steps", "12", "--layers", "1", "--width", "64", "--heads", "4", "--batch-size", "8",
    "--accumulate", "2", "--checkpoint-every", "4", "--eval-every", "6", "--generate", "4",
]  # fmt: skip
ENV = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}


def command(directory: Path, params: Path) -> list[str]:
    return [
        sys.executable, str(EXAMPLE), *SHORT,
        "--checkpoint-dir", str(directory), "--save-params", str(params),
    ]  # fmt: skip


def run_to_the_end(directory: Path, params: Path) -> str:
    result = subprocess.run(
        command(directory, params), env=ENV, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def saved_steps(directory: Path) -> list[int]:
    if not directory.exists():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


def test_sigkill_then_the_same_command_ends_with_the_parameters_of_an_uninterrupted_run(
    tmp_path: Path,
) -> None:
    uninterrupted = tmp_path / "uninterrupted.npz"
    output = run_to_the_end(tmp_path / "uninterrupted", uninterrupted)
    assert output.strip().splitlines()[-1].startswith("eval perplexity: ")

    directory, resumed = tmp_path / "killed", tmp_path / "resumed.npz"
    with open(tmp_path / "killed.stderr", "w") as stderr:
        process = subprocess.Popen(
            command(directory, resumed), env=ENV, stdout=subprocess.DEVNULL, stderr=stderr
        )
    try:
        deadline = time.monotonic() + 240
        while not saved_steps(directory) and process.poll() is None:
            assert time.monotonic() < deadline, "no checkpoint within 240 s"
            time.sleep(0.2)
        assert process.poll() is None, "the run ended before it could be killed"
        process.send_signal(signal.SIGKILL)
        assert process.wait(timeout=60) == -signal.SIGKILL
    finally:
        if process.poll() is None:
            process.kill()
    killed_at = saved_steps(directory)
    assert killed_at, "no checkpoint before the kill"
    assert killed_at[-1] < 12, killed_at
    assert not resumed.exists()

    summary = re.search(
        r"(\d+) steps in \d+ s \(resumed at step (\d+) of 12\)",
        run_to_the_end(directory, resumed),
    )
    assert summary, "the summary counts the steps this process ran"
    assert int(summary[1]) + int(summary[2]) == 12
    assert int(summary[2]) in killed_at
    expected, got = np.load(uninterrupted), np.load(resumed)
    assert len(expected.files) == len(got.files) > 0
    for name in expected.files:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
