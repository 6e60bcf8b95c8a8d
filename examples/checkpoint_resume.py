"""Checkpoints and exact resume: a training run is preempted (SIGTERM, as a cluster
scheduler sends it) half-way, the same command resumes it from its last checkpoint, and
the result equals an uninterrupted run, step for step. Then the best checkpoint (by test
accuracy) is restored.

    python examples/checkpoint_resume.py --steps 200
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile

import jax
import numpy as np
import optax
from _data import Batches, digits, eval_batches, parse_args
from flax_linen import MLP

import ciclo
import ciclo_flax

X_TRAIN, Y_TRAIN, X_TEST, Y_TEST = digits()
BATCH_SIZE = 64


def new_state():
    return ciclo_flax.create_state(
        MLP(),
        X_TRAIN[:1],
        optax.adam(1e-3),
        losses={"loss": optax.softmax_cross_entropy_with_integer_labels},
        metrics={"accuracy": lambda logits, labels: logits.argmax(-1) == labels},
        key=0,
    )


def train(directory: str, steps: int, preempt_at: int = -1):
    """The training command: starts a run in ``directory``, or continues the one there."""

    def preempt(state, batch, elapsed):  # stands in for the scheduler
        if elapsed.steps == preempt_at:
            os.kill(os.getpid(), signal.SIGTERM)

    return ciclo.train_loop(
        new_state(),
        Batches(X_TRAIN, Y_TRAIN, BATCH_SIZE),  # seekable: resumed at the next batch
        {ciclo.on_train_batch_end: preempt},
        test_dataset=lambda: eval_batches(X_TEST, Y_TEST),
        epoch_duration=max(steps // 8, 1),
        callbacks=[
            ciclo.checkpoint(directory, keep=2, monitor="accuracy_test", mode="max"),
            ciclo.early_stopping("loss_test", patience=3),  # its state is checkpointed too
        ],
        stop=steps,
        resume=directory,  # the same command starts and continues a run
    )


def main() -> None:
    args = parse_args(__doc__, steps=200, directory="", preempt_at=-1)
    if args.directory:  # the training process the "scheduler" below starts
        train(args.directory, args.steps, args.preempt_at)
        return
    with tempfile.TemporaryDirectory() as tmp:
        run = os.path.join(tmp, "run")
        command = [sys.executable, __file__, "--steps", str(args.steps), "--directory", run]
        half = args.steps // 2
        first = subprocess.run([*command, "--preempt-at", str(half)], check=False)
        saved = ciclo.checkpoint(run).all_steps()
        print(f"preempted at step {half}: exit status {first.returncode}, checkpoints {saved}")
        assert first.returncode == 128 + signal.SIGTERM

        state, history, elapsed = train(run, args.steps)  # the same command: resumes
        reference, reference_history, _ = train(os.path.join(tmp, "reference"), args.steps)
        same_loss = history.collect("loss") == reference_history.collect("loss")
        same_params = all(
            np.array_equal(a, b)
            for a, b in zip(
                jax.tree.leaves((state.params, state.model_state, state.opt_state)),
                jax.tree.leaves((reference.params, reference.model_state, reference.opt_state)),
                strict=True,
            )
        )
        print(
            f"resumed to step {elapsed.steps}: history and parameters equal to an "
            f"uninterrupted run: {same_loss and same_params}"
        )
        assert same_loss
        assert same_params

        best = ciclo.restore_best(run, new_state())
        print(
            f"best checkpoint: step {best.elapsed.steps}, test accuracy "
            f"{best.history.collect('accuracy_test')[-1]:.4f}"
        )


if __name__ == "__main__":
    main()
