"""A Flax NNX model (batch norm, dropout) on scikit-learn's digits with ``ciclo.train_loop``;
the trained NNX model comes back as ``state.model``.

    python examples/flax_nnx.py --steps 300
"""

from __future__ import annotations

import jax.numpy as jnp
import optax
from _data import Batches, digits, eval_batches, parse_args
from flax import nnx

import ciclo
import ciclo_flax


class MLP(nnx.Module):
    def __init__(self, hidden: int, *, rngs: nnx.Rngs) -> None:
        self.hidden = nnx.Linear(64, hidden, rngs=rngs)
        self.norm = nnx.BatchNorm(hidden, momentum=0.9, rngs=rngs)
        self.dropout = nnx.Dropout(0.2, rngs=rngs)
        self.out = nnx.Linear(hidden, 10, rngs=rngs)

    def __call__(self, x):
        return self.out(self.dropout(nnx.relu(self.norm(self.hidden(x)))))


def main() -> None:
    args = parse_args(__doc__, steps=300, batch_size=64)
    x_train, y_train, x_test, y_test = digits()
    state = ciclo_flax.create_nnx_state(
        MLP(128, rngs=nnx.Rngs(0)),
        optax.adam(1e-3),
        losses={"loss": optax.softmax_cross_entropy_with_integer_labels},
        metrics={"accuracy": lambda logits, labels: logits.argmax(-1) == labels},
        key=0,
    )
    epoch = len(x_train) // args.batch_size
    state, _, elapsed = ciclo.train_loop(
        state,
        Batches(x_train, y_train, args.batch_size),
        test_dataset=lambda: eval_batches(x_test, y_test),
        epoch_duration=min(epoch, args.steps),
        callbacks=[ciclo.tqdm_bar(total=args.steps)],
        stop=args.steps,
    )
    model = state.model  # the trained nnx.Module, usable on its own
    model.eval()
    accuracy = float(jnp.mean(model(x_test).argmax(-1) == y_test))
    print(f"Flax NNX: {elapsed.steps} steps, test accuracy {accuracy:.4f} (state.model)")


if __name__ == "__main__":
    main()
