"""One step label for a moment of a run, in every output (docs/checkpointing.md, "Step
labels"): the history, the CSV, a metric writer, TensorBoard, early stopping's messages and
``best_step`` use the ``elapsed.steps`` of the moment; a checkpoint and a bar's counter give
the number of steps done, the label + 1."""

from __future__ import annotations

import csv
import io
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ciclo

from .test_loggers import read_events
from .test_writers import Recorder

LOSSES_TEST = [1.0, 0.5, 0.7, 0.8, 0.9]  # best at the 2nd evaluation, stopped at the 4th


@jax.jit
def train_step(state, batch):
    return ciclo.logs().add_loss("loss", state), state + 1.0


def test_every_output_labels_an_evaluation_alike(tmp_path):
    pytest.importorskip("tensorboardX", reason="the optional extra ciclo-core[tensorboard]")
    remaining = list(LOSSES_TEST)
    printed, bar_out, writer = io.StringIO(), io.StringIO(), Recorder()
    stopper = ciclo.early_stopping("loss_test", patience=2, file=printed)
    checkpoint = ciclo.checkpoint(tmp_path / "ckpt", monitor="loss_test", keep=None)
    _, history, elapsed = ciclo.train_loop(
        jnp.float32(0),
        [np.zeros(1)] * 20,
        {
            ciclo.on_train_step: train_step,
            ciclo.on_test_step: lambda: ciclo.logs().add_loss("loss", remaining.pop(0)),
        },
        callbacks=[
            stopper,
            checkpoint,
            ciclo.csv_logger(tmp_path / "log.csv"),
            ciclo.writer_logger(writer, interval=0),
            ciclo.tensorboard_logger(tmp_path / "tb", interval=0),
            ciclo.keras_bar(20, dynamic=False, plain_interval=0, interval=0, file=bar_out),
        ],
        test_dataset=lambda: [np.zeros(1)],
        epoch_duration=4,
    )
    assert elapsed.steps == 16  # stopped after the 4th evaluation, the 16th step

    # The label of each evaluation: the row of the training step it follows.
    labels, values = history.collect("steps", "loss_test")
    assert labels == [3, 7, 11, 15]
    assert values == pytest.approx(LOSSES_TEST[:4])
    best = labels[1]
    with open(tmp_path / "log.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["steps"]) for r in rows if r["loss_test"]] == labels
    assert [s for s, row in writer.rows if "losses/loss_test" in row] == labels
    events = read_events(tmp_path / "tb")
    assert [step for tag, step, _ in events if tag == "losses/loss_test"] == labels
    assert (stopper.best_step, stopper.stopped_step) == (best, labels[-1])
    assert printed.getvalue().startswith(
        f"early_stopping at step {labels[-1]}: loss_test has not improved by more than 0 "
        f"for 2 evaluations (last 0.8, best 0.5 at step {best})."
    )

    # Counts: a checkpoint holds label + 1 steps and is named after them.
    assert checkpoint.all_steps() == [label + 1 for label in labels]
    _, restored_history, restored_elapsed = ciclo.restore_best(checkpoint, jnp.float32(0))
    assert restored_elapsed.steps == best + 1
    assert restored_history.collect("steps")[-1] == best
    # The bar shows each evaluation from the line of its epoch's end on: its counter is
    # the number of steps done, label + 1.
    shown = re.findall(r"^ *(\d+)/20 .* - loss_test: (\S+)$", bar_out.getvalue(), re.M)
    first_shown = {}
    for counter, value in shown:
        first_shown.setdefault(float(value), int(counter))
    assert list(first_shown.values()) == [label + 1 for label in labels]
