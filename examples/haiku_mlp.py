"""A Haiku MLP (batch norm, dropout) on scikit-learn's digits with ``ciclo.train_loop``.

python examples/haiku_mlp.py --steps 300
"""

from __future__ import annotations

import haiku as hk
import jax
import optax
from _data import Batches, digits, eval_batches, parse_args

import ciclo
import ciclo_haiku


def mlp(x, is_training: bool):
    x = hk.Linear(128)(x)
    x = hk.BatchNorm(create_scale=True, create_offset=True, decay_rate=0.9)(x, is_training)
    x = jax.nn.relu(x)
    if is_training:
        x = hk.dropout(hk.next_rng_key(), 0.2, x)  # a new key at every step
    return hk.Linear(10)(x)


def main() -> None:
    args = parse_args(__doc__, steps=300, batch_size=64)
    x_train, y_train, x_test, y_test = digits()
    state = ciclo_haiku.create_state(
        mlp,
        x_train[:1],
        optax.adam(1e-3),
        losses={"loss": optax.softmax_cross_entropy_with_integer_labels},
        metrics={"accuracy": lambda logits, labels: logits.argmax(-1) == labels},
        key=0,
    )
    epoch = len(x_train) // args.batch_size
    state, history, elapsed = ciclo.train_loop(
        state,
        Batches(x_train, y_train, args.batch_size),
        test_dataset=lambda: eval_batches(x_test, y_test),
        epoch_duration=min(epoch, args.steps),
        callbacks=[ciclo.keras_bar(total=args.steps)],
        stop=args.steps,
    )
    print(
        f"Haiku: {elapsed.steps} steps, test accuracy {history.collect('accuracy_test')[-1]:.4f}, "
        f"Haiku state (moving averages): {sorted(state.model_state)}"
    )


if __name__ == "__main__":
    main()
