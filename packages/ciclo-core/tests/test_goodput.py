"""``ciclo.goodput``: the time ledger's buckets add up to the wall time, each phase lands in
its bucket, the ledger is saved with checkpoints and continues after a resume, and the work
a SIGKILL makes a resume redo is counted as ``lost``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ciclo
from ciclo._time._phases import Phases
from ciclo.testing import free_port, run_on_loopback

WORKER = Path(__file__).with_name("long_run_worker.py")
BUCKETS = ("startup", "compile", "data", "step", "evaluation", "checkpoint", "callbacks", "lost")


def check_sums(report: dict) -> None:
    assert set(BUCKETS) <= set(report)
    assert sum(report[b] for b in BUCKETS) == pytest.approx(report["total"], rel=1e-9)
    assert all(report[b] >= 0 for b in BUCKETS), report
    assert report["goodput"] == pytest.approx(report["step"] / report["total"])


def test_the_buckets_add_up_to_the_wall_time_since_the_ledger_began():
    before = time.perf_counter()
    ledger = ciclo.goodput(since="now")
    start = time.perf_counter()
    time.sleep(0.2)  # start-up: before the first step

    def step(state, batch):
        time.sleep(0.01)
        return state + 1

    def slow_data():
        for _ in range(10):
            time.sleep(0.02)
            yield np.ones(1)

    ciclo.loop(0, slow_data(), {ciclo.every(1): step, **ledger})
    end = time.perf_counter()
    report = ledger.report()
    after = time.perf_counter()
    check_sums(report)
    # The ledger's total is the wall time from its creation to the report, read on the same
    # clock between these marks: exactly within them, however loaded the machine (a fixed
    # tolerance fails when the process is descheduled long between two of them).
    bounds = (end - start, after - before)
    assert bounds[0] <= report["total"] <= bounds[1], (report["total"], bounds)
    assert report["startup"] >= 0.2
    assert report["step"] >= 10 * 0.01
    assert report["data"] >= 9 * 0.02  # the first batch is start-up
    assert report["lost"] == 0.0


def test_evaluation_checkpoint_and_step_end_work_land_in_their_buckets(tmp_path):
    ledger = ciclo.goodput(since="now")

    def evaluate(state):
        time.sleep(0.3)
        return ciclo.loop(state, [np.ones(1)] * 2, {ciclo.every(1): lambda s, b: s})

    tasks = {
        ciclo.every(1): lambda state, batch: state + 1,
        ciclo.every(5): ciclo.inner_loop("test", evaluate),
        ciclo.every(4): ciclo.checkpoint(tmp_path / "ckpt", async_save=False),
        **ledger,
    }
    ciclo.loop(jnp.zeros(3), [np.ones(1)] * 10, tasks)
    report = ledger.report()
    check_sums(report)
    assert report["evaluation"] >= 2 * 0.3  # at steps 0 and 5; the inner loops' steps too
    assert report["checkpoint"] > 0
    assert report["step"] < report["evaluation"]


def test_compilation_moves_out_of_the_first_step_into_compile():
    ledger = ciclo.goodput(since="now")

    @jax.jit
    def step(state, batch):
        for i in range(60):  # a program that takes a while to compile
            state = jnp.sin(state * (i + 1)) + batch.sum()
        return state

    ciclo.loop(jnp.zeros(64), [np.ones(2, np.float32)] * 5, {ciclo.every(1): step, **ledger})
    report = ledger.report()
    check_sums(report)
    assert report["first_step_compile"] > 0.5 * report["first_step"]
    assert report["compile"] >= report["first_step_compile"]
    assert report["time_to_first_step"] >= report["first_step"]


def test_the_ledger_is_logged_at_its_schedule_and_in_train_loop_callbacks():
    ledger = ciclo.goodput(since="now")

    def step(state, batch):
        time.sleep(0.02)
        return ciclo.logs().add_loss("loss", 1.0), state

    _, history, _ = ciclo.train_loop(
        0, [np.ones(1)] * 12, {ciclo.on_train_step: step}, epoch_duration=3, callbacks=[ledger]
    )
    assert history.collect("steps", "goodput")[0] == [2, 5, 8, 11]  # at each epoch's end
    rows = history.collect("steps", "goodput_total", "goodput_step")
    assert all(total >= step_seconds > 0 for _, total, step_seconds in zip(*rows, strict=True))
    assert history.collect("goodput_total") == sorted(history.collect("goodput_total"))
    spread = ciclo.goodput(steps=4, since="now")
    _, history, _ = ciclo.loop(0, [np.ones(1)] * 10, {ciclo.every(1): step, **spread})
    assert history.collect("steps", "goodput")[0] == [0, 4, 8]


def test_the_summary_line_is_printed_when_asked(capsys):
    ledger = ciclo.goodput(summary=True, since="now")
    ciclo.loop(0, [np.ones(1)] * 3, {ciclo.every(1): lambda s, b: s, **ledger})
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("ciclo.goodput: ")
    assert "in steps" in line
    assert "compile" in line
    assert "lost 0.0 s" in line


def test_the_loop_owns_its_record_of_phases_and_has_none_without_a_ledger():
    seen = []
    record = lambda s, b, e, loop_state: seen.append(loop_state.phases)  # noqa: E731
    ciclo.loop(0, [np.ones(1)] * 2, {ciclo.every(1): record})
    assert seen == [None, None]

    def inner(state):  # a loop inside a callback, without a ledger: no record of its own
        return ciclo.loop(state, [np.ones(1)], {ciclo.every(1): record})

    seen.clear()
    ledger = ciclo.goodput(since="now")
    tasks = {ciclo.every(1): [record, ciclo.inner_loop("x", inner)], **ledger}
    ciclo.loop(0, [np.ones(1)] * 2, tasks)
    outer = seen[0]
    assert isinstance(outer, Phases)
    assert seen == [outer, None, outer, None]
    assert outer.current()[0] == "callbacks"  # the loop is over
    assert ledger.report()["evaluation"] > 0  # the inner loops, marked on the outer record


def test_the_ledger_is_saved_with_checkpoints_and_continues_after_a_resume(tmp_path):
    def tasks(ledger):
        return {
            ciclo.every(1): lambda state, batch: (time.sleep(0.01), state + 1)[1],
            ciclo.every(5): ciclo.checkpoint(tmp_path / "ckpt", keep=1),
            **ledger,
        }

    first = ciclo.goodput(since="now")
    ciclo.loop(jnp.zeros(()), [np.ones(1)] * 10, tasks(first), resume=tmp_path / "ckpt")
    before = first.report()
    second = ciclo.goodput(since="now")
    ciclo.loop(jnp.zeros(()), [np.ones(1)] * 20, tasks(second), resume=tmp_path / "ckpt")
    after = second.report()
    check_sums(after)
    assert after["step"] >= before["step"] + 10 * 0.01
    assert after["startup"] >= before["startup"]
    assert after["lost"] == pytest.approx(0.0, abs=0.15)  # the first run ended normally


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match=r"goodput\(steps=0\): expected an int >= 1"):
        ciclo.goodput(steps=0)
    with pytest.raises(ValueError, match=r"goodput\(steps=1.5\)"):
        ciclo.goodput(steps=1.5)
    with pytest.raises(TypeError, match=r"goodput\(summary='yes'\): expected True or False"):
        ciclo.goodput(summary="yes")
    with pytest.raises(ValueError, match=r"goodput\(since='start'\): expected 'process'"):
        ciclo.goodput(since="start")
    ledger = ciclo.goodput(since="now")
    with pytest.raises(ValueError, match="a ledger of another format"):
        ledger.load_state_dict({"steps": 3})


# --- a SIGKILL and a resume ---------------------------------------------------------------
def _run_until(command: list[str], env: dict, step: int, timeout: float) -> tuple[list, float]:
    """Starts the worker, reads its step records until ``step``, SIGKILLs it at once."""
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
    records, deadline = [], time.monotonic() + timeout
    try:
        for line in proc.stdout:
            record = json.loads(line)
            records.append(record)
            if record.get("step") == step:
                killed = time.time()
                os.kill(proc.pid, signal.SIGKILL)
                break
            assert time.monotonic() < deadline, "the worker is too slow"
        else:
            pytest.fail(f"the worker ended before step {step}")
    finally:
        proc.kill()
        proc.wait(timeout=30)
        proc.stdout.close()
    return records, killed


@pytest.mark.slow
def test_after_a_sigkill_the_resume_counts_the_redone_work_as_lost(tmp_path):
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    # Each process's start-up lasts over 0.5 s however fast the machine imports JAX (a fast
    # machine's imports alone take about that): it sleeps 0.5 s more before its loop.
    options = {"steps": 40, "sleep": 0.1, "checkpoint_every": 12, "startup_sleep": 0.5}
    command = [sys.executable, str(WORKER), "ledger", str(tmp_path), json.dumps(options)]
    # Checkpoint 25 is taken at the end of step 24; steps 25..35 are done again.
    records, killed = _run_until(command, env, step=35, timeout=120)
    measured = killed - next(r["time"] for r in records if r.get("step") == 25)
    out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    resumed = [r["step"] for r in lines if "step" in r and "time" in r]
    assert resumed[0] == 25  # it resumed from checkpoint 25
    report = next(r["report"] for r in lines if "report" in r)
    check_sums(report)
    print(f"lost {report['lost']:.3f} s; the redone steps measured {measured:.3f} s")
    assert report["lost"] == pytest.approx(measured, rel=0.2), (report, measured)
    # The ledger continues the checkpoint's: two processes' start-ups, all 40 steps.
    assert report["step"] >= 40 * 0.1 - 0.2
    own_startup = report["time_to_first_step"] - report["first_step"]
    assert report["startup"] > own_startup + 0.5  # the killed process's (jax, its sleep...)


@pytest.mark.slow
def test_with_two_processes_the_slowest_process_and_its_ratio_are_logged_alike(tmp_path):
    port = free_port()
    options = {"steps": 60, "sleeps": [0.0, 0.03], "ledger_steps": 10}
    command = [sys.executable, str(WORKER), "ledger", str(tmp_path), json.dumps(options)]
    commands = [[*command, str(i), str(port)] for i in range(2)]
    run = run_on_loopback(commands, devices_per_process=1, timeout=150)
    for i in range(2):
        assert run.codes[i] == 0, run.outputs[i][-3000:]
    found = [
        next(json.loads(line) for line in out.splitlines() if line.startswith('{"straggler"'))
        for out in run.outputs
    ]
    assert found[0] == found[1]  # read from the same rounds: the same values everywhere
    assert found[0]["slowest"][-1] == 1.0
    assert found[0]["straggler"][-1] > 1.3  # process 1 spends more in steps than the median
