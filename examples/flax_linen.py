"""A Flax Linen MLP (batch norm, dropout) on scikit-learn's digits with ``ciclo.train_loop``:
a progress bar, an evaluation after each epoch, early stopping and a CSV log.

    python examples/flax_linen.py --steps 300
"""

from __future__ import annotations

import flax.linen as nn
import optax
from _data import Batches, digits, eval_batches, parse_args

import ciclo
import ciclo_flax


class MLP(nn.Module):
    hidden: int = 128

    @nn.compact
    def __call__(self, x, training: bool):
        x = nn.Dense(self.hidden)(x)
        x = nn.BatchNorm(use_running_average=not training, momentum=0.9)(x)
        x = nn.Dropout(0.2, deterministic=not training)(nn.relu(x))
        return nn.Dense(10)(x)


def main() -> None:
    args = parse_args(__doc__, steps=300, batch_size=64, csv="")
    x_train, y_train, x_test, y_test = digits()
    state = ciclo_flax.create_state(
        MLP(),
        x_train[:1],
        optax.adam(1e-3),
        losses={"loss": optax.softmax_cross_entropy_with_integer_labels},
        metrics={"accuracy": lambda logits, labels: logits.argmax(-1) == labels},
        key=0,
    )
    callbacks = [
        ciclo.keras_bar(total=args.steps),
        ciclo.early_stopping("loss_test", patience=3, restore_best_weights=True),
    ]
    if args.csv:
        callbacks.append(ciclo.csv_logger(args.csv))
    epoch = len(x_train) // args.batch_size
    state, _, elapsed = ciclo.train_loop(
        state,
        Batches(x_train, y_train, args.batch_size),
        test_dataset=lambda: eval_batches(x_test, y_test),
        epoch_duration=min(epoch, args.steps),
        callbacks=callbacks,
        stop=args.steps,
    )
    _, logs, _ = ciclo.test_loop(state, eval_batches(x_test, y_test))
    print(
        f"Flax Linen: {elapsed.steps} steps, test accuracy {float(logs.metrics.accuracy):.4f}, "
        f"batch-norm statistics in state.model_state: {list(state.model_state)}"
    )


if __name__ == "__main__":
    main()
