"""Multi-host data parallelism: 2 processes on 127.0.0.1, each feeding half of every batch,
end with the same params as one process fed the whole batches."""

from __future__ import annotations

import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import optax
import pytest

import ciclo
from ciclo.testing import free_port, run_on_loopback

WORKER = Path(__file__).with_name("multihost_worker.py")
TIMEOUT = 180  # seconds, for both processes together


def run_processes(data_path: Path, tmp_path: Path) -> list[dict[str, np.ndarray]]:
    port = free_port()
    outs = [tmp_path / f"out{i}.npz" for i in range(2)]
    # 2 devices per process: 4 in all, each holding a quarter of every batch.
    codes, logs, _ = run_on_loopback(
        [[sys.executable, str(WORKER), str(i), str(port), str(data_path), str(outs[i])]
         for i in range(2)],
        devices_per_process=2,
        timeout=TIMEOUT,
    )  # fmt: skip
    for i, code in enumerate(codes):
        assert code == 0, f"process {i} failed:\n{logs[i][-3000:]}"
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
