"""Exact resume after the process is killed: the training of checkpoint_training.py runs in
a subprocess (checkpoints every ``EVERY`` steps) that the test kills; resuming in this
process must give what an uninterrupted run gives, bit for bit."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import ciclo

sys.path.insert(0, str(Path(__file__).parent))
import checkpoint_training as training

pytestmark = pytest.mark.slow


class Run:
    """``checkpoint_training.py`` in a subprocess, its steps read from its stdout; with
    ``--lockstep`` it goes on to each next step only when :meth:`wait_for_step` lets it."""

    def __init__(self, directory: Path, *args: str) -> None:
        self.stderr = directory.with_suffix(".stderr")
        with open(self.stderr, "w") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, training.__file__, str(directory), *args],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )

    def wait_for_step(self, step: int) -> int:
        """Lets the run go on until it reports ``step`` (where it then waits)."""
        assert self.process.stdout is not None
        assert self.process.stdin is not None
        for line in self.process.stdout:
            if line.startswith("step ") and int(line.split()[1]) >= step:
                return int(line.split()[1])
            if line.startswith("step "):
                self.process.stdin.write("\n")
                self.process.stdin.flush()
        self.process.communicate()
        raise AssertionError(f"the run ended before step {step}: {self.stderr.read_text()}")

    def end(self, sig: signal.Signals) -> int:
        self.process.send_signal(sig)
        self.process.communicate(timeout=120)  # closes stdin (go on), drains stdout
        return self.process.returncode


def committed_steps(directory: Path) -> list[int]:
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


def resume_and_compare(directory: Path, data: str, why: str) -> None:
    resumed = training.fingerprint(*training.run(str(directory), data=data, resume=True))
    expected = training.reference()
    differing = [key for key in expected if resumed[key] != expected[key]]
    assert not differing, f"{why}: the resumed run differs in {differing}"


def test_sigkill_at_a_random_step_then_resume_is_bit_identical(tmp_path: Path) -> None:
    kill_at = random.randrange(training.EVERY + 1, training.STEPS - 1)
    directory = tmp_path / "run"
    run = Run(directory, "--dataset", "generator", "--lockstep")
    reached = run.wait_for_step(kill_at)
    assert run.end(signal.SIGKILL) == -signal.SIGKILL
    assert committed_steps(directory), "no checkpoint was written before the kill"
    resume_and_compare(directory, "generator", f"killed at step {reached}")


def test_sigterm_saves_exits_143_and_resume_is_bit_identical(tmp_path: Path) -> None:
    stop_at = random.randrange(1, training.STEPS - 2)
    directory = tmp_path / "run"
    run = Run(directory, "--dataset", "list", "--lockstep")
    reached = run.wait_for_step(stop_at)
    assert run.end(signal.SIGTERM) == 128 + signal.SIGTERM
    message = run.stderr.read_text()
    found = re.search(r"ciclo: stopped by SIGTERM \(checkpoint (\d+) saved in .*\) after", message)
    assert found, message
    saved = int(found.group(1))
    assert saved > reached
    assert committed_steps(directory)[-1] == saved
    resume_and_compare(directory, "list", f"stopped at step {reached}")


def test_a_kill_during_a_checkpoint_write_leaves_the_previous_one(tmp_path: Path) -> None:
    directory = tmp_path / "run"
    hang = 2 * training.EVERY + 1  # the third checkpoint: 1, EVERY + 1, 2 * EVERY + 1
    marker = Path(f"{directory}.hanging")
    run = Run(directory, "--dataset", "stateful", "--hang-on-save", str(hang))
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert run.process.poll() is None, run.stderr.read_text()
        assert time.monotonic() < deadline, "the write never started"
        time.sleep(0.05)
    assert run.end(signal.SIGKILL) == -signal.SIGKILL
    partial = Path(marker.read_text())
    assert partial.exists()
    assert partial.parent == directory
    assert committed_steps(directory) == [1, training.EVERY + 1]

    restored = ciclo.restore(directory, training.init_state())
    assert restored.elapsed.steps == training.EVERY + 1
    resume_and_compare(directory, "stateful", "killed while writing a checkpoint")
    assert not partial.exists()  # the interrupted write was cleaned up
    assert os.listdir(directory)
