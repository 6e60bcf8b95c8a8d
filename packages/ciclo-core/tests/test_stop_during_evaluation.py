"""A stop signal during an evaluation inside train_loop (issue 28): the evaluation ends at
its next batch, is not recorded, the training checkpoint is saved, the process exits with
143 and a one-line message, and the resumed run evaluates again at the same moment, so its
history equals an uninterrupted run's. Each run is a subprocess with a timeout."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import jax.numpy as jnp
import pytest

import ciclo

WORKER = textwrap.dedent(
    """
    import itertools, json, sys
    import jax.numpy as jnp, numpy as np
    import ciclo

    directory, evaluation = sys.argv[1], sys.argv[2]  # "long", "endless" or "quick"

    def train_step(state, batch):
        return ciclo.logs().add_loss("loss", jnp.sum(state * batch)), state + batch

    def test_step(state, batch):
        if evaluation != "quick":
            print("eval", int(batch[0]), flush=True)
            sys.stdin.readline()  # the test's go-ahead (end of input: go on)
        return ciclo.logs().add_metric("score", jnp.sum(state * batch))

    def test_dataset():
        batches = itertools.count(1) if evaluation == "endless" else range(1, 31)
        return (np.full((2,), i, np.float32) for i in batches)

    state, history, elapsed = ciclo.train_loop(
        jnp.zeros(2),
        [np.full((2,), i, np.float32) for i in range(12)],
        {ciclo.on_train_step: train_step, ciclo.on_test_step: test_step},
        callbacks=[ciclo.checkpoint(directory), ciclo.early_stopping("score_test", 5)],
        test_dataset=test_dataset,
        epoch_duration=4,
        resume=directory,
    )
    columns = [history.collect("steps", "loss"), history.collect("steps", "score_test")]
    print("history", json.dumps(columns))
    """
)


def _start(directory: Path, evaluation: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", WORKER, str(directory), evaluation],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )


def _history(directory: Path) -> list[object]:
    run = _start(directory, "quick")
    out, err = run.communicate(timeout=120)
    assert run.returncode == 0, err
    line = next(line for line in out.splitlines() if line.startswith("history "))
    return json.loads(line.removeprefix("history "))  # type: ignore[no-any-return]


def _stop_during_evaluation(directory: Path, evaluation: str, number: int) -> tuple[int, str]:
    """Sends SIGTERM at the 3rd batch of evaluation ``number`` (the worker waits after each
    evaluation batch for the test's go-ahead); returns the evaluation batches run after the
    signal, and the process's stderr."""
    run = _start(directory, evaluation)
    try:
        assert run.stdout is not None
        assert run.stdin is not None
        evaluations = 0
        for line in run.stdout:
            if line.startswith("eval "):
                batch = int(line.split()[1])
                evaluations += batch == 1
                if evaluations == number and batch == 3:
                    break
                run.stdin.write("\n")
                run.stdin.flush()
        run.send_signal(signal.SIGTERM)
        # closes stdin: the worker goes on (an endless evaluation must end too)
        out, err = run.communicate(timeout=60)
    finally:
        run.kill()
    assert run.returncode == 128 + signal.SIGTERM, err
    return sum(line.startswith("eval ") for line in out.splitlines()), err


@pytest.mark.slow
def test_a_stop_during_a_long_evaluation_ends_it_and_the_resumed_history_is_exact(
    tmp_path: Path,
) -> None:
    after, err = _stop_during_evaluation(tmp_path / "run", "long", number=2)
    assert after <= 1  # the batch in progress ends; at most one more starts
    message = [line for line in err.splitlines() if line.startswith("ciclo: ")]
    assert message == [
        "ciclo: stopped by SIGTERM; inner_loop('test') at step 7 ended at its next batch and "
        "is not recorded; a resumed run evaluates again at this step "
        f"(checkpoint 8 saved in {tmp_path / 'run'}) after 8 steps; exiting with status 143."
    ]
    _, history, elapsed = ciclo.restore(tmp_path / "run", jnp.zeros(2))
    assert elapsed.steps == 8
    assert history.collect("steps", "score_test")[0] == [3]  # the cut one is not recorded
    assert _history(tmp_path / "run") == _history(tmp_path / "straight")


@pytest.mark.slow
def test_a_stop_during_an_endless_evaluation_ends_it_and_saves(tmp_path: Path) -> None:
    after, err = _stop_during_evaluation(tmp_path / "run", "endless", number=1)
    assert after <= 1
    assert "stopped by SIGTERM; inner_loop('test') at step 3 ended at its next batch" in err
    _, history, elapsed = ciclo.restore(tmp_path / "run", jnp.zeros(2))
    assert elapsed.steps == 4
    with pytest.raises(KeyError):
        history.collect("score_test")
