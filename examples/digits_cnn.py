"""A small Flax Linen CNN on scikit-learn's digits (8x8 images), checkpointed and resumable:
the run that the long-run tools (the time ledger, the watchdog, restarts) are shown on.

    python examples/digits_cnn.py --steps 300 --directory /tmp/digits_cnn

Run the same command again after an interruption and it continues from its last checkpoint.
"""

from __future__ import annotations

import flax.linen as nn
import optax
from _data import Batches, digits, eval_batches, parse_args

import ciclo
import ciclo_flax

X_TRAIN, Y_TRAIN, X_TEST, Y_TEST = digits()
BATCH_SIZE = 64


class CNN(nn.Module):
    @nn.compact
    def __call__(self, x, training: bool = False):
        x = x.reshape((-1, 8, 8, 1))
        x = nn.relu(nn.Conv(16, (3, 3))(x))
        x = nn.relu(nn.Conv(32, (3, 3), strides=2)(x))
        x = x.reshape((x.shape[0], -1))
        return nn.Dense(10)(nn.relu(nn.Dense(64)(x)))


def new_state():
    """The model, its optimizer, its loss and its accuracy, ready for ``ciclo.train_loop``."""
    return ciclo_flax.create_state(
        CNN(),
        X_TRAIN[:1],
        optax.adam(1e-3),
        losses={"loss": optax.softmax_cross_entropy_with_integer_labels},
        metrics={"accuracy": lambda logits, labels: logits.argmax(-1) == labels},
        key=0,
    )


def train(directory: str, steps: int, callbacks: list | None = None, checkpoint_every: int = 50):
    """Trains for ``steps`` steps, checkpointing into ``directory`` and resuming from it."""
    checkpoint = ciclo.checkpoint(directory, keep=2)
    return ciclo.train_loop(
        ciclo.lazy_state(new_state),  # a resume restores into its shapes: nothing built twice
        Batches(X_TRAIN, Y_TRAIN, BATCH_SIZE),  # seekable: resumed at the next batch
        {ciclo.every(checkpoint_every): checkpoint},
        test_dataset=lambda: eval_batches(X_TEST, Y_TEST),
        epoch_duration=max(steps // 4, 1),
        callbacks=callbacks or [],
        stop=steps,
        resume=checkpoint,
    )


def main() -> None:
    args = parse_args(__doc__, steps=300, directory="/tmp/digits_cnn")
    _, history, elapsed = train(args.directory, args.steps)
    print(
        f"digits CNN: {elapsed.steps} steps, "
        f"test accuracy {history.collect('accuracy_test')[-1]:.4f}"
    )


if __name__ == "__main__":
    main()
