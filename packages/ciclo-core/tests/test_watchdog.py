"""``ciclo.watchdog``: a stuck phase ends the job with status 124, every thread's stack and
the event in the writers; a slow first compilation and a long evaluation do not trip the
step's deadline; with 2 processes, a stuck one ends both, named. Each run is a subprocess
with a timeout (an expired watchdog ends its process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import ciclo
from ciclo.testing import free_port, run_on_loopback

WORKER = Path(__file__).with_name("long_run_worker.py")
TIMEOUT = 120  # seconds, for one run


def run_worker(out: Path, **options) -> subprocess.CompletedProcess:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    command = [sys.executable, str(WORKER), "watchdog", str(out), json.dumps(options)]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=TIMEOUT)


def step_times(stdout: str) -> dict[int, float]:
    records = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    return {r["step"]: r["time"] for r in records if "time" in r}


@pytest.mark.slow
def test_a_callback_that_blocks_forever_ends_the_process_with_124_and_its_stack(tmp_path):
    out = run_worker(tmp_path, steps=20, block_at=4, watchdog={"step_timeout": 3})
    ended = time.time()
    assert out.returncode == 124, out.stderr[-3000:]
    blocked = step_times(out.stdout)[4]
    assert ended - blocked < 3 + 5
    assert "made no progress for" in out.stderr
    assert "in the phase 'step' at step 4" in out.stderr
    assert "step_timeout=3 s" in out.stderr
    assert "block_forever" in out.stderr  # the stack names the blocking function
    assert "Thread" in out.stderr  # faulthandler's dump of every thread
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert {"step": 4, "watchdog/expired": 3.0} in events


@pytest.mark.slow
def test_a_slow_first_compilation_and_a_long_evaluation_do_not_trip_it(tmp_path):
    out = run_worker(
        tmp_path,
        steps=8,
        first_sleep=2.5,  # the first step, as long as a slow compilation
        evaluate_every=5,
        evaluation_sleep=2.5,  # at steps 0 and 5
        watchdog={"step_timeout": 1, "first_step_timeout": 30, "evaluation_timeout": 30},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "watchdog" not in out.stderr
    assert max(step_times(out.stdout)) == 7


@pytest.mark.slow
def test_a_long_evaluation_trips_its_own_deadline(tmp_path):
    out = run_worker(
        tmp_path,
        steps=8,
        evaluate_every=5,
        evaluation_sleep=60,
        watchdog={"step_timeout": 30, "evaluation_timeout": 1.5},
    )
    assert out.returncode == 124, out.stderr[-3000:]
    assert "in the phase 'evaluation' at step 0" in out.stderr
    assert "evaluation_timeout=1.5 s" in out.stderr


@pytest.mark.slow
def test_a_hung_checkpoint_write_trips_the_checkpoint_deadline(tmp_path):
    # The first save's write hangs in the background; the next save waits for it.
    out = run_worker(
        tmp_path,
        steps=20,
        checkpoint_every=5,
        hang_writes=True,
        watchdog={"step_timeout": 30, "checkpoint_timeout": 2},
    )
    assert out.returncode == 124, out.stderr[-3000:]
    assert "in the phase 'checkpoint' at step 5" in out.stderr
    assert "checkpoint_timeout=2 s" in out.stderr
    assert "block_forever" in out.stderr  # the writer thread's stack


@pytest.mark.slow
@pytest.mark.parametrize("stuck", [1, 0])  # process 0 also holds the coordination service
def test_with_two_processes_a_stuck_one_ends_both_within_fault_timeout_named(tmp_path, stuck):
    port = free_port()
    other = 1 - stuck
    options = {
        "steps": 400,
        "sleep": 0.02,
        "block_at": 10,
        "stuck": stuck,
        "fault_timeout": 10,
        "watchdog": {"step_timeout": 2, "data_timeout": 60},
    }
    commands = [
        [
            sys.executable,
            str(WORKER),
            "watchdog",
            str(tmp_path / str(i)),
            json.dumps(options),
            str(i),
            str(port),
        ]
        for i in range(2)
    ]
    for i in range(2):
        (tmp_path / str(i)).mkdir()
    run = run_on_loopback(commands, devices_per_process=1, timeout=TIMEOUT)
    ended, codes, outputs = time.time(), run.codes, run.outputs
    assert codes[stuck] == 124, outputs[stuck][-3000:]
    assert f"process {stuck} made no progress" in outputs[stuck]
    assert codes[other] not in (0, 124), outputs[other][-3000:]
    assert f"process {stuck} failed: WatchdogExpired: its watchdog ended it" in outputs[other]
    blocked = step_times(outputs[stuck])[10]
    assert ended - blocked < 2 + 10  # the deadline, then within fault_timeout


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match=r"watchdog\(step_timeout=-1\): expected seconds"):
        ciclo.watchdog(step_timeout=-1)
    with pytest.raises(ValueError, match=r"watchdog\(data_timeout=0\)"):
        ciclo.watchdog(data_timeout=0)
    with pytest.raises(ValueError, match=r"watchdog\(first_step_timeout='1'\)"):
        ciclo.watchdog(first_step_timeout="1")
    with pytest.raises(TypeError, match=r"watchdog\(step_timout=...\): no such deadline \(did "):
        ciclo.watchdog(step_timout=5)
    with pytest.raises(TypeError, match=r"watchdog\(eval_timeout=...\).*evaluation_timeout="):
        ciclo.watchdog(eval_timeout=5)


def test_a_healthy_run_is_not_disturbed_and_the_thread_ends_with_the_loop():
    dog = ciclo.watchdog(step_timeout=0.5, first_step_timeout=60)

    def step(state, batch):
        time.sleep(0.01)
        return state + 1

    state, _, _ = ciclo.loop(0, [np.ones(1)] * 20, {ciclo.every(1): step, **dog})
    assert state == 20
    assert dog._monitor is None
    assert not [t for t in threading.enumerate() if "deadlines" in t.name]


def test_a_resumed_run_may_add_or_leave_out_a_watchdog(tmp_path):
    # A checkpoint holds nothing of a watchdog: an operator adds one to a run that hung.
    def step(state, batch):
        return state + 1

    tasks = {ciclo.every(1): step, ciclo.every(2): ciclo.checkpoint(tmp_path, async_save=False)}
    watched = {**tasks, **ciclo.watchdog(step_timeout=60)}
    data = [np.ones(1)] * 9
    ciclo.loop(0, data, tasks, stop=4, stop_signals=())
    state, _, elapsed = ciclo.loop(0, data, watched, stop=6, resume=tmp_path, stop_signals=())
    assert (state, elapsed.steps) == (6, 6)  # added
    state, _, elapsed = ciclo.loop(0, data, tasks, resume=tmp_path, stop_signals=())
    assert (state, elapsed.steps) == (9, 9)  # left out again
