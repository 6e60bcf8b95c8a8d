"""Two processes, 2 CPU devices on loopback (``jax.distributed``, gloo): every process
takes each decision of the loop at the same step, and a fault ends the job, never hangs it."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import numpy as np
import pytest

from ciclo.testing import free_port, run_on_loopback

WORKER = Path(__file__).with_name("multihost_loop_worker.py")
TIMEOUT = 150  # seconds, for both processes together

pytestmark = pytest.mark.slow


def run_pair(scenario: str, out: Path, **options) -> tuple[list[int], list[str], float]:
    """Runs both processes; returns their exit statuses, outputs, and the seconds taken."""
    out.mkdir(exist_ok=True)
    port = free_port()
    command = [sys.executable, str(WORKER), scenario]
    return run_on_loopback(
        [[*command, str(i), str(port), str(out), json.dumps(options)] for i in range(2)],
        devices_per_process=2,
        timeout=TIMEOUT,
    )


def results(out: Path) -> list[dict]:
    return [json.loads((out / f"result{i}.json").read_text()) for i in range(2)]


def check_ok(codes: list[int], outputs: list[str]) -> None:
    for i, code in enumerate(codes):
        assert code == 0, f"process {i} exited {code}:\n{outputs[i][-3000:]}"


@pytest.mark.parametrize("agree_every", [None, 3], ids=["default", "every-3-steps"])
def test_a_time_schedule_fires_at_the_same_steps_on_both_processes(tmp_path, agree_every):
    # process 1 sleeps 4 ms a step, so its clock alone would fire at other steps
    # 30 ms more a step on both: the 40 steps take over 1.2 s, several time-based
    # evaluations (and several default agreement rounds, 0.1-0.5 s apart), however fast the
    # machine and however slow its rounds
    options: dict = {"step_sleep": 0.03}
    if agree_every is not None:
        options["agree_every"] = agree_every
    codes, outputs, _ = run_pair("time", tmp_path, **options)
    check_ok(codes, outputs)
    first, second = results(tmp_path)
    assert len(first["eval_steps"]) >= 2
    assert first["eval_steps"] == second["eval_steps"]
    assert first["w"] == second["w"]
    assert first["b"] == second["b"]
    assert first["samples"] == second["samples"] == 40 * 8  # both halves of every batch


def test_test_every_in_time_evaluates_at_the_same_steps(tmp_path):
    codes, outputs, _ = run_pair("test_every", tmp_path, step_sleep=0.03)  # over 1.2 s
    check_ok(codes, outputs)
    first, second = results(tmp_path)
    assert len(first["eval_steps"]) >= 2
    assert first["eval_steps"] == second["eval_steps"]
    assert first["w"] == second["w"]


def test_terminate_on_nan_stops_both_processes_at_the_same_step(tmp_path):
    # terminate_on_nan looks every 0.5 s, and its stop is agreed one to two rounds later
    # (rounds up to 0.5 s apart): the NaN of step 5 (0.3 s in) is seen by 1 s and agreed by
    # 2 s, before the 40 steps (over 2.4 s) end, however fast the machine.
    codes, outputs, _ = run_pair("nan", tmp_path, nan_at=5, step_sleep=0.06)
    check_ok(codes, outputs)
    first, second = results(tmp_path)
    assert first["steps"] == second["steps"] < 40
    assert "NaN" in first["reason"] or "nan" in first["reason"].lower()
    assert first["reason"] == second["reason"]


def test_a_stop_requested_on_one_process_stops_both_at_one_later_step(tmp_path):
    # agree_every=4: rounds at steps 0, 4, 8, 12, ...; the request of step 9 is published
    # at round 12 and read by both at round 16, before its batch is drawn.
    codes, outputs, _ = run_pair("request", tmp_path, agree_every=4)
    check_ok(codes, outputs)
    first, second = results(tmp_path)
    assert first["steps"] == second["steps"] == 16
    assert first["reason"] == second["reason"] == "asked on process 1 (on process 1)"
    assert first["w"] == second["w"]


def test_a_raise_on_one_process_ends_both_with_an_error(tmp_path):
    codes, outputs, seconds = run_pair("raise", tmp_path)
    assert codes[0] != 0
    assert codes[1] != 0
    assert "boom on purpose" in outputs[1]
    assert "process 1 failed: ValueError: boom on purpose" in outputs[0]
    assert seconds < 60


@pytest.mark.parametrize("raiser", [1, 0])
def test_a_raise_with_a_checkpoint_ends_each_process_with_its_own_error_not_sigabrt(
    tmp_path, raiser
):
    # Issue 28: with a checkpoint saving at every step, the other process is in a collective
    # of the save when the raise comes; the one that raised used to end with SIGABRT and a
    # C++ trace from JAX's coordination service (its shutdown waited for a dead process).
    codes, outputs, seconds = run_pair("raise", tmp_path, checkpoint=1, raiser=raiser)
    other = 1 - raiser
    assert codes == [1, 1], outputs
    assert "ValueError: boom on purpose" in outputs[raiser]
    assert f"process {raiser} failed: ValueError: boom on purpose" in outputs[other]
    for output in outputs:
        assert "Check failure stack trace" not in output
        assert "Terminating process" not in output
    assert seconds < 60


def test_a_killed_process_ends_the_other_within_the_fault_timeout(tmp_path):
    codes, outputs, seconds = run_pair("kill", tmp_path, fault_timeout=8)
    assert codes[1] == -signal.SIGKILL
    assert codes[0] != 0
    assert "process 1 gave no sign of life for 8 s" in outputs[0] or (
        "process 1 did not reach step" in outputs[0]
    )
    assert seconds < 40  # JAX's own heartbeat would take 100 s


@pytest.mark.parametrize("stateful", [False, True], ids=["replayed", "stateful-dataset"])
def test_sigterm_to_one_process_stops_both_at_one_step_with_a_checkpoint(tmp_path, stateful):
    plain = tmp_path / "plain"
    codes, outputs, _ = run_pair("sigterm", plain, stateful=stateful)
    check_ok(codes, outputs)
    uninterrupted = results(plain)[0]

    run = tmp_path / "run"
    # JAX's preemption sync point picks a step about 0.1-0.5 s after the notice: 50 ms steps
    codes, outputs, seconds = run_pair(
        "sigterm", run, interrupt=True, step_sleep=0.05, stateful=stateful
    )
    assert codes == [128 + signal.SIGTERM] * 2, outputs
    assert seconds < 60
    first, second = results(run)
    assert first["steps"] == second["steps"] < 40
    assert "SIGTERM" in first["reason"]
    assert first["reason"] == second["reason"]
    saved = sorted(int(p.name) for p in (run / "ckpt").iterdir() if p.name.isdigit())
    assert saved[-1] == first["steps"]  # the save at the stop (every(1000) also saved step 1)

    codes, outputs, _ = run_pair("sigterm", run, stateful=stateful)  # both resume
    check_ok(codes, outputs)
    # process 0 wrote the compilation cache next to the checkpoints, and loads from it (on
    # CPU the keys of the other process differ; JAX makes them alike on GPU only)
    assert results(run)[0]["cache"].get("cache_hits", 0) > 0
    assert list((run / "ckpt" / "compilation_cache").iterdir())
    for process, resumed in enumerate(results(run)):
        if stateful:  # each process continues its own data position
            assert resumed["loaded"] == {"process": process, "position": first["steps"]}
        assert resumed["steps"] == 40
        np.testing.assert_allclose(resumed["w"], uninterrupted["w"], rtol=1e-6)
        np.testing.assert_allclose(resumed["b"], uninterrupted["b"], rtol=1e-6)


def test_outputs_are_written_once_by_process_0(tmp_path):
    codes, outputs, _ = run_pair("outputs", tmp_path)
    check_ok(codes, outputs)
    assert "40/40 [" in outputs[0]
    assert "/40 [" not in outputs[1]
    rows = (tmp_path / "log.csv").read_text().splitlines()
    assert [row.split(",")[0] for row in rows[1:]] == [str(step) for step in range(40)]
    assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 1
