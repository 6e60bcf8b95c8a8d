"""One process of the 2-process data-parallel run in ``test_strategies_multihost.py``.

Usage: ``python multihost_worker.py PROCESS_ID PORT DATA.npz OUT.npz``. Each process feeds
its half of every batch; the results (params, history) are written to ``OUT.npz``.
"""

from __future__ import annotations

import sys


def main(process_id: int, port: int, data_path: str, out_path: str) -> None:
    from ciclo.testing import join_loopback

    join_loopback(process_id, 2, port)
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    import ciclo

    @ciclo.managed.train_step
    def train_step(state, batch):
        x, y = batch
        pred = x @ state.params["w"] + state.params["b"]
        logs = ciclo.logs().add_loss("loss", jnp.mean((pred - y) ** 2))
        logs.add_metric("y_mean", jnp.mean(y))
        return logs, state

    data = np.load(data_path)
    xs, ys = data["x"], data["y"]
    half = xs.shape[1] // 2
    mine = slice(process_id * half, (process_id + 1) * half)
    local_batches = [(x[mine], y[mine]) for x, y in zip(xs, ys, strict=True)]

    state = ciclo.managed.ManagedState.create(
        params={"w": jnp.zeros(xs.shape[-1]), "b": jnp.zeros(())},
        tx=optax.sgd(0.05, momentum=0.9),
        key=0,
        strategy="data-parallel",
    )
    state, history, _ = ciclo.loop(state, local_batches, {ciclo.every(1): train_step})
    np.savez(
        out_path,
        w=np.asarray(state.params["w"]),
        b=np.asarray(state.params["b"]),
        loss=np.asarray(history.collect("loss")),
        y_mean=np.asarray(history.collect("y_mean")),
        devices=jax.device_count(),
        processes=jax.process_count(),
    )
    jax.distributed.shutdown()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])
