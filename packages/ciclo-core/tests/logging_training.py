"""A small run that writes a CSV file and a CLU-protocol writer's file, checkpointing every
``EVERY`` steps, for the tests that kill it and resume (test_writers.py).

    python logging_training.py DIRECTORY [--lockstep] [--resume]

With ``--lockstep`` it waits after each step for a line on its stdin (the test's go-ahead).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import ciclo

STEPS = 24
EVERY = 6  # checkpoint period; a CSV row every 2 steps, so rows follow each checkpoint


@jax.jit
def train_step(state: jax.Array, batch: jax.Array) -> Any:
    state = state * 0.9 + batch.sum()
    return ciclo.logs().add_loss("loss", state).add_metric("twice", 2 * state), state


class JsonLinesWriter:
    """A CLU-protocol metric writer that appends one JSON line per ``write_scalars``; with
    ``resume_at``, it drops the lines the interrupted run wrote after the checkpoint."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write_scalars(self, step: int, scalars: dict[str, float]) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps({"step": step, **scalars}) + "\n")

    def resume_at(self, step: int) -> None:
        lines = self.path.read_text().splitlines() if self.path.exists() else []
        kept = [line for line in lines if line.endswith("}") and json.loads(line)["step"] <= step]
        self.path.write_text("".join(line + "\n" for line in kept))

    def write_images(self, step: int, images: Any) -> None: ...

    def write_histograms(self, step: int, arrays: Any, num_buckets: Any = None) -> None: ...

    def write_hparams(self, hparams: Any) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


def run(directory: Path, *, lockstep: bool = False, resume: bool = False) -> Any:
    batches = [np.full((2,), i, np.float32) for i in range(STEPS)]

    def report(state: Any, batch: Any, elapsed: ciclo.Elapsed) -> None:
        print("step", elapsed.steps, flush=True)
        if lockstep:
            sys.stdin.readline()

    tasks = {
        ciclo.every(1): [train_step, report],
        ciclo.every(2): ciclo.csv_logger(directory / "log.csv"),
        # rows written in batches: the checkpoint at 12 holds row 12, written at 16
        ciclo.every(4): ciclo.writer_logger(JsonLinesWriter(directory / "rows.jsonl"), interval=0),
        ciclo.every(EVERY): ciclo.checkpoint(directory / "ckpt", keep=1, async_save=False),
    }
    return ciclo.loop(jnp.float32(0), batches, tasks, resume=directory / "ckpt" if resume else None)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("directory", type=Path)
    parser.add_argument("--lockstep", action="store_true")
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()
    run(args.directory, lockstep=args.lockstep, resume=args.resume)
