"""The time ledger and the watchdog on the digits CNN example (examples/digits_cnn.py), in a
process of its own so that the ledger counts from its start: the buckets add up to the wall
time the test measures around the process (within 5%), compilation is most of the first
step, evaluations and checkpoints land in their buckets, and the watchdog's defaults leave a
healthy run alone."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time

import pytest

EXAMPLES = pathlib.Path(__file__).parents[1] / "examples"
BUCKETS = ("startup", "compile", "data", "step", "evaluation", "checkpoint", "callbacks", "lost")
DRIVER = """
import json, sys, time
sys.path.insert(0, {examples!r})
import ciclo, digits_cnn
ledger = ciclo.goodput(summary=True)
_, history, elapsed = digits_cnn.train({directory!r}, 120, callbacks=[ledger, ciclo.watchdog()])
report = ledger.report()
print(json.dumps({{"report": report, "time": time.time(), "steps": elapsed.steps,
                  "logged": history.collect("goodput_total")}}), flush=True)
"""


@pytest.mark.slow
def test_the_ledger_of_the_digits_cnn_adds_up_to_its_wall_time(tmp_path):
    driver = DRIVER.format(examples=str(EXAMPLES), directory=str(tmp_path / "ckpt"))
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    started = time.time()
    out = subprocess.run(
        [sys.executable, "-c", driver], env=env, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    report, wall = result["report"], result["time"] - started
    print(json.dumps({"wall": wall, **report}, indent=1))
    assert result["steps"] == 120
    assert sum(report[b] for b in BUCKETS) == pytest.approx(report["total"], rel=1e-9)
    assert report["total"] == pytest.approx(wall, rel=0.05)
    assert report["first_step_compile"] > 0.5 * report["first_step"]
    assert report["compile"] > 0
    assert report["evaluation"] > 0
    assert report["checkpoint"] > 0
    assert report["startup"] > 0
    assert report["step"] > 0
    assert report["lost"] == 0
    assert len(result["logged"]) >= 3  # at each epoch's end
    assert "ciclo.goodput: " in out.stderr  # the summary line
    assert "watchdog" not in out.stderr
