"""A run on a Grain pipeline under the data-parallel strategy, checkpointed every ``EVERY``
steps and resumed from ``OUT_DIR/ckpt`` on whatever topology it runs on, for
``test_grain_topology.py``.

    python grain_topology_worker.py PIPELINE PROCESSES PROCESS_ID PORT OUT_DIR STOP

PIPELINE: ``elastic`` (``grain.experimental.ElasticIterator``: a global position) or
``per-process`` (a ``DataLoader`` sharded with ``ShardByJaxProcess``: a position per
process); STOP: a step count or ``none``. Writes ``OUT_DIR/result{PROCESS_ID}.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

RECORDS, GLOBAL_BATCH, EPOCHS, DIM, EVERY = 48, 8, 2, 3, 4
STEPS = RECORDS * EPOCHS // GLOBAL_BATCH


def features(index: Any) -> dict[str, Any]:
    import numpy as np

    x = np.random.default_rng(int(index)).normal(size=DIM).astype(np.float32)
    y = np.float32(x @ np.array([1.0, -2.0, 0.5], np.float32) + 0.3)
    return {"index": np.int32(index), "x": x, "y": y}


def pipeline(kind: str) -> Any:
    """This process's part of the same global batches of shuffled records, on any number of
    processes (made after ``jax.distributed`` is initialized)."""
    import grain

    shard = grain.sharding.ShardByJaxProcess(drop_remainder=True)
    if kind == "elastic":
        records = grain.MapDataset.range(RECORDS).shuffle(seed=3).repeat(EPOCHS).map(features)
        return grain.experimental.ElasticIterator(records, GLOBAL_BATCH, shard)

    class Features(grain.transforms.Map):
        def map(self, index: int) -> dict[str, Any]:
            return features(index)

    sampler = grain.samplers.IndexSampler(
        RECORDS, shard_options=shard, shuffle=True, seed=3, num_epochs=EPOCHS
    )
    return grain.DataLoader(
        data_source=grain.sources.RangeDataSource(0, RECORDS, 1),
        sampler=sampler,
        operations=[Features(), grain.transforms.Batch(GLOBAL_BATCH // shard.shard_count)],
        worker_count=0,
    )


def initial_state() -> Any:
    """A linear model's managed state, data-parallel over every device."""
    import jax.numpy as jnp
    import optax

    import ciclo

    return ciclo.managed.ManagedState.create(
        params={"w": jnp.zeros(DIM), "b": jnp.zeros(())},
        tx=optax.sgd(0.05, momentum=0.9),
        key=0,
        strategy="data-parallel",
    )


def train(kind: str, out: Path, stop: int | None) -> tuple[Any, Any, Any, Any]:
    """Trains a linear model data-parallel on every device, resuming from ``out / "ckpt"``;
    returns ``(state, history, elapsed, dataset)``."""
    import jax.numpy as jnp

    import ciclo

    @ciclo.managed.train_step
    def train_step(state, batch):
        x, y = batch["x"], batch["y"]
        pred = x @ state.params["w"] + state.params["b"]
        logs = ciclo.logs().add_loss("loss", jnp.mean((pred - y) ** 2))
        return logs.add_metric("index_sum", jnp.sum(batch["index"])), state

    state = initial_state()
    data = ciclo.stateful_dataset(pipeline(kind))
    ckpt = ciclo.checkpoint(out / "ckpt", keep=1, save_on_end=False)
    tasks = {ciclo.every(1): train_step, ciclo.every(EVERY): ckpt}
    return (*ciclo.loop(state, data, tasks, stop=stop, resume=ckpt), data)


def main(kind: str, processes: int, process: int, port: int, out: Path, stop: int | None):
    if processes > 1:
        from ciclo.testing import join_loopback

        join_loopback(process, processes, port)
    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    state, history, elapsed, data = train(kind, out, stop)
    params = multihost_utils.process_allgather(state.params, tiled=True)
    result = {
        "processes": jax.process_count(),
        "devices": jax.device_count(),
        "steps": elapsed.steps,
        "samples": elapsed.samples,
        "drawn": data.drawn,
        "position": data.iterator.get_state() if kind == "elastic" else None,
        "history_steps": [int(s) for s in history.collect("steps")],
        "loss": [float(v) for v in history.collect("loss")],
        "index_sum": [int(v) for v in history.collect("index_sum")],
        "w": np.asarray(params["w"]).tolist(),
        "b": float(params["b"]),
    }
    (out / f"result{process}.json").write_text(json.dumps(result))
    if processes > 1:
        jax.distributed.shutdown()


if __name__ == "__main__":
    kind, processes, process, port, out, stop = sys.argv[1:7]
    main(
        kind,
        int(processes),
        int(process),
        int(port),
        Path(out),
        None if stop == "none" else int(stop),
    )
