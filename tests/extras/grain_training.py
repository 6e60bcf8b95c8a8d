"""A run on a Grain ``DataLoader`` (3 shuffled epochs of 8 batches), checkpointing every
``EVERY`` steps, for the test that kills it mid-epoch and resumes (test_grain.py).

    python grain_training.py DIRECTORY [--delay SECONDS]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import grain
import jax
import jax.numpy as jnp
import numpy as np

import ciclo

RECORDS, BATCH, EPOCHS = 64, 8, 3
STEPS = RECORDS // BATCH * EPOCHS
EVERY = 5


class Features(grain.transforms.Map):
    def map(self, index: int) -> dict[str, np.ndarray]:
        x = np.random.default_rng(int(index)).normal(size=4).astype(np.float32)
        return {"index": np.int32(index), "x": x}


def loader() -> grain.DataLoader:
    sampler = grain.samplers.IndexSampler(
        RECORDS, shard_options=grain.sharding.NoSharding(), shuffle=True, seed=7,
        num_epochs=EPOCHS,
    )  # fmt: skip
    return grain.DataLoader(
        data_source=grain.sources.RangeDataSource(0, RECORDS, 1),
        sampler=sampler,
        operations=[Features(), grain.transforms.Batch(BATCH)],
        worker_count=0,
    )


@jax.jit
def train_step(state: dict[str, jax.Array], batch: dict[str, Any]) -> Any:
    w = state["w"] - 0.1 * jnp.mean(batch["x"], axis=0) * state["w"]
    order = state["order"] * 31 + jnp.sum(batch["index"] * jnp.arange(1, BATCH + 1))
    return ciclo.logs().add_loss("loss", jnp.sum(w**2)), {"w": w, "order": order}


def run(directory: Path, *, delay: float = 0.0, resume: bool = False) -> Any:
    data = ciclo.stateful_dataset(loader())

    def report(state: Any, batch: Any, elapsed: ciclo.Elapsed) -> None:
        print("step", elapsed.steps, flush=True)
        time.sleep(delay)

    tasks = {
        ciclo.every(1): [train_step, report],
        ciclo.every(EVERY): ciclo.checkpoint(directory / "ckpt", keep=1, async_save=False),
    }
    init = {"w": jnp.ones(4), "order": jnp.zeros((), jnp.int32)}
    state, history, elapsed = ciclo.loop(
        init, data, tasks, resume=directory / "ckpt" if resume else None
    )
    return state, history, elapsed, data.drawn


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("directory", type=Path)
    parser.add_argument("--delay", type=float, default=0.0)
    args = parser.parse_args()
    run(args.directory, delay=args.delay)
