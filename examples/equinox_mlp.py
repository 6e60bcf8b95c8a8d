"""An Equinox MLP (batch norm, dropout) on scikit-learn's digits with ``ciclo.train_loop``;
the trained model and its ``eqx.nn.State`` come back as ``state.model``.

    python examples/equinox_mlp.py --steps 300
"""

from __future__ import annotations

import equinox as eqx
import jax
import optax
from _data import Batches, digits, eval_batches, parse_args

import ciclo
import ciclo_equinox


class MLP(eqx.Module):
    """A per-example model: ``vmap=True`` maps it over the batch (axis name "batch")."""

    hidden: eqx.nn.Linear
    norm: eqx.nn.BatchNorm
    dropout: eqx.nn.Dropout
    out: eqx.nn.Linear

    def __init__(self, hidden: int, key: jax.Array) -> None:
        k1, k2 = jax.random.split(key)
        self.hidden = eqx.nn.Linear(64, hidden, key=k1)
        self.norm = eqx.nn.BatchNorm(hidden, axis_name="batch", momentum=0.9, mode="batch")
        self.dropout = eqx.nn.Dropout(0.2)
        self.out = eqx.nn.Linear(hidden, 10, key=k2)

    def __call__(self, x, state, *, key):
        x, state = self.norm(self.hidden(x), state)
        return self.out(self.dropout(jax.nn.relu(x), key=key)), state


def main() -> None:
    args = parse_args(__doc__, steps=300, batch_size=64)
    x_train, y_train, x_test, y_test = digits()
    model, model_state = eqx.nn.make_with_state(MLP)(128, jax.random.key(0))
    state = ciclo_equinox.create_state(
        model,
        optax.adam(1e-3),
        state=model_state,
        vmap=True,
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
    trained = state.model  # the trained eqx.Module (its state: state.model_state)
    print(
        f"Equinox: {elapsed.steps} steps, test accuracy "
        f"{history.collect('accuracy_test')[-1]:.4f}, trained {type(trained).__name__}"
    )


if __name__ == "__main__":
    main()
