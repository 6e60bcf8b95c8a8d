"""A small run logged to every tracker at once (W&B offline, MLflow on sqlite, TensorBoard,
CLU's default writer, CSV), checkpointing every ``EVERY`` steps. The same command starts
the run and continues it after a kill (``resume=`` the checkpoint directory): no tracker id
is passed by hand. For test_tracker_resume.py.

    python tracker_training.py DIRECTORY [--delay SECONDS] [--wandb-flush SECONDS]
                               [--pause-at STEP]

``--wandb-flush``: how often W&B's service writes its offline file (its
``x_transaction_log_flush_interval``, 15 s by default; 0: only when a buffer fills).
``--pause-at``: the run stops moving at that step (after printing it) until it is killed,
so a test kills it at a known step once the trackers' files hold what it waits for.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

import conftest  # noqa: F401  (clu's writers without TensorFlow)
import jax
import jax.numpy as jnp
import numpy as np
from clu import metric_writers

import ciclo

STEPS = 24
EVERY = 6  # checkpoint period: checkpoints 1, 7, 13, 19 (the count after steps 0, 6, 12, 18)
PAUSE = 600.0  # seconds at --pause-at: longer than any test waits before it kills the run


@jax.jit
def train_step(state: jax.Array, batch: jax.Array) -> Any:
    state = state * 0.9 + batch.sum()
    return ciclo.logs().add_loss("loss", state).add_metric("twice", 2 * state), state


def check(state: jax.Array, batch: Any) -> Any:
    """A metric logged every third step only (a key that some rows lack)."""
    return ciclo.logs().add_metric("check", state / 3)


def mlflow_uri(directory: Path) -> str:
    return f"sqlite:///{directory / 'mlflow.db'}"


def run(
    directory: Path,
    *,
    delay: float = 0.0,
    wandb_flush: float | None = None,
    pause_at: int | None = None,
) -> Any:
    import wandb

    batches = [np.full((2,), i, np.float32) for i in range(STEPS)]

    def report(state: Any, batch: Any, elapsed: ciclo.Elapsed) -> None:
        print("step", elapsed.steps, flush=True)
        time.sleep(PAUSE if elapsed.steps == pause_at else delay)

    flush = {} if wandb_flush is None else {"x_transaction_log_flush_interval": wandb_flush}
    settings = wandb.Settings(
        silent=True, console="off", x_disable_stats=True, x_disable_machine_info=True, **flush
    )
    wandb_writer = ciclo.callbacks.WandbWriter(
        mode="offline", dir=str(directory), project="ciclo-test", settings=settings
    )
    mlflow_writer = ciclo.callbacks.MLflowWriter(
        tracking_uri=mlflow_uri(directory), experiment_name="ciclo-test"
    )
    # what clu.metric_writers.create_default_writer(logdir) builds, with ciclo's TensorBoard
    # writer in place of TensorFlow's
    clu_writer = metric_writers.AsyncMultiWriter(
        [metric_writers.LoggingWriter(), ciclo.callbacks.TensorBoardWriter(directory / "clu")]
    )
    tasks = {
        ciclo.every(1): [train_step, report],
        ciclo.every(3): check,
        ciclo.every(2): ciclo.csv_logger(directory / "log.csv"),
        ciclo.every(1): [
            ciclo.writer_logger(wandb_writer, interval=0, close=True, hparams={"lr": 0.1}),
            ciclo.writer_logger(mlflow_writer, interval=0, close=True),
            ciclo.writer_logger(clu_writer, interval=0, close=True),
            ciclo.tensorboard_logger(directory / "tb", interval=0),
        ],
        ciclo.every(EVERY): ciclo.checkpoint(directory / "ckpt", keep=1, async_save=False),
    }
    return ciclo.loop(jnp.float32(0), batches, tasks, resume=directory / "ckpt")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("directory", type=Path)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--wandb-flush", type=float, default=None)
    parser.add_argument("--pause-at", type=int, default=None)
    args = parser.parse_args()
    os.environ.setdefault("WANDB_SILENT", "true")
    run(args.directory, delay=args.delay, wandb_flush=args.wandb_flush, pause_at=args.pause_at)
