"""The launch recipes of docs/multihost.md, run as a cluster would run them: 2 processes
on loopback, joined by ``jax.distributed.initialize()`` with no arguments under a
SLURM-like environment (JAX's own detection), or from a torchrun-style environment."""

from __future__ import annotations

import json
import random
import socket
import sys
from pathlib import Path

import pytest

from ciclo.testing import free_port, run_on_loopback

WORKER = str(Path(__file__).with_name("cluster_worker.py"))
TIMEOUT = 120.0  # a hang fails the test, it never blocks
GLOO = {"JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo"}


def slurm_job_id() -> int:
    """A job id whose coordinator port (JAX: the id modulo 4096, from 61440) is free."""
    for _ in range(100):
        job = random.randrange(4096)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", 61440 + job))
            except OSError:
                continue
        return job
    pytest.skip("no free port in SLURM's range")


def trained(run) -> list[dict]:
    assert run.codes == [0, 0], "\n".join(o[-3000:] for o in run.outputs)
    rows = [json.loads(out.strip().splitlines()[-1]) for out in run.outputs]
    assert [r["process"] for r in rows] == [0, 1]
    assert all(r["processes"] == 2 for r in rows)
    assert rows[0]["w"] == rows[1]["w"]  # one model, trained on both halves
    assert rows[0]["loss"] == rows[1]["loss"]
    assert len(rows[0]["loss"]) == 4
    assert rows[0]["loss"] == sorted(rows[0]["loss"], reverse=True)
    return rows


def test_slurm_jax_distributed_initialize_with_no_arguments():
    job = {
        "SLURM_JOB_ID": str(slurm_job_id()),
        "SLURM_STEP_NODELIST": "127.0.0.1",  # the first node runs the coordinator
        "SLURM_NTASKS": "2",
    }
    commands = [
        ["env", f"SLURM_PROCID={i}", f"SLURM_LOCALID={i}", sys.executable, WORKER, "slurm"]
        for i in range(2)
    ]
    trained(run_on_loopback(commands, env={**GLOO, **job}, timeout=TIMEOUT))


def test_a_torchrun_style_environment():
    job = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2"}
    commands = [["env", f"RANK={i}", sys.executable, WORKER, "torchrun"] for i in range(2)]
    trained(run_on_loopback(commands, env={**GLOO, **job}, timeout=TIMEOUT))
