"""Multi-host data parallelism: 2 processes on 127.0.0.1, each feeding half of every batch,
end with the same params as one process fed the whole batches."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import optax
import pytest

import ciclo

WORKER = Path(__file__).with_name("multihost_worker.py")
TIMEOUT = 180  # seconds, for both processes together


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_processes(data_path: Path, tmp_path: Path) -> list[dict[str, np.ndarray]]:
    port = free_port()
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        # 2 devices per process: 4 in all, each holding a quarter of every batch.
        "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
    }
    outs = [tmp_path / f"out{i}.npz" for i in range(2)]
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(i), str(port), str(data_path), str(outs[i])],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    logs = []
    try:
        for proc in procs:
            logs.append(proc.communicate(timeout=TIMEOUT)[0])
    except subprocess.TimeoutExpired:
        for proc in procs:
            proc.kill()
        pytest.fail(f"the 2-process run did not finish in {TIMEOUT}s")
    for i, proc in enumerate(procs):
        assert proc.returncode == 0, f"process {i} failed:\n{logs[i][-3000:]}"
    return [dict(np.load(out)) for out in outs]


@pytest.mark.slow
def test_two_processes_feeding_half_batches_equal_one_process_fed_whole_batches(tmp_path):
    rng = np.random.default_rng(0)
    steps, batch_size = 6, 16
    xs = rng.normal(size=(steps, batch_size, 3)).astype(np.float32)
    ys = (xs @ np.array([1.0, -2.0, 0.5], np.float32) + 0.3).astype(np.float32)
    data_path = tmp_path / "data.npz"
    np.savez(data_path, x=xs, y=ys)

    results = run_processes(data_path, tmp_path)

    @ciclo.managed.train_step
    def train_step(state, batch):
        x, y = batch
        pred = x @ state.params["w"] + state.params["b"]
        return ciclo.logs().add_loss("loss", jnp.mean((pred - y) ** 2)), state

    state = ciclo.managed.ManagedState.create(
        params={"w": jnp.zeros(3), "b": jnp.zeros(())},
        tx=optax.sgd(0.05, momentum=0.9),
        strategy="jit",
    )
    state, history, _ = ciclo.loop(
        state, list(zip(xs, ys, strict=True)), {ciclo.every(1): train_step}
    )

    for result in results:
        assert int(result["processes"]) == 2
        assert int(result["devices"]) == 4
        np.testing.assert_allclose(result["w"], np.asarray(state.params["w"]), rtol=1e-5)
        np.testing.assert_allclose(result["b"], np.asarray(state.params["b"]), rtol=1e-5)
        # Logs are global: the loss and the mean of y over the whole batch, on both.
        np.testing.assert_allclose(result["loss"], history.collect("loss"), rtol=1e-5)
        np.testing.assert_allclose(result["y_mean"], ys.mean(axis=1), rtol=1e-5)
