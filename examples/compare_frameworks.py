"""The same MLP in Flax Linen, Flax NNX, Haiku and Equinox, trained on scikit-learn's digits
by the very same ``ciclo.train_loop`` call: only the state differs. Prints a table.

    python examples/compare_frameworks.py --steps 300
"""

from __future__ import annotations

import equinox as eqx
import equinox_mlp
import flax_linen
import flax_nnx
import haiku_mlp
import jax
import optax
from _data import Batches, digits, eval_batches, parse_args
from flax import nnx

import ciclo
import ciclo_equinox
import ciclo_flax
import ciclo_haiku

COMMON = {
    "losses": {"loss": optax.softmax_cross_entropy_with_integer_labels},
    "metrics": {"accuracy": lambda logits, labels: logits.argmax(-1) == labels},
    "key": 0,
}


def states(sample):
    """One state per framework, each holding the same architecture (64-128-10, batch norm,
    dropout) written in that framework (the models of the per-framework examples)."""
    tx = optax.adam(1e-3)
    yield "Flax Linen", ciclo_flax.create_state(flax_linen.MLP(128), sample, tx, **COMMON)
    yield "Flax NNX", ciclo_flax.create_nnx_state(flax_nnx.MLP(128, rngs=nnx.Rngs(0)), tx, **COMMON)
    yield "Haiku", ciclo_haiku.create_state(haiku_mlp.mlp, sample, tx, **COMMON)
    model, model_state = eqx.nn.make_with_state(equinox_mlp.MLP)(128, jax.random.key(0))
    yield "Equinox", ciclo_equinox.create_state(model, tx, state=model_state, vmap=True, **COMMON)


def main() -> None:
    args = parse_args(__doc__, steps=300, batch_size=64)
    x_train, y_train, x_test, y_test = digits()
    epoch = min(len(x_train) // args.batch_size, args.steps)
    rows = []
    for name, state in states(x_train[:1]):
        # The very same call for every framework:
        state, history, elapsed = ciclo.train_loop(
            state,
            Batches(x_train, y_train, args.batch_size),
            test_dataset=lambda: eval_batches(x_test, y_test),
            epoch_duration=epoch,
            stop=args.steps,
        )
        steps, times = history.collect("steps", "time")
        per_step = (times[-1] - times[1]) / max(steps[-1] - steps[1], 1)  # after compiling
        parameters = sum(leaf.size for leaf in jax.tree.leaves(state.params))
        accuracy, loss = history.collect("accuracy_test", "loss_test")
        rows.append((name, parameters, accuracy[-1], loss[-1], per_step * 1e3, elapsed.time))
        print(f"{name}: done in {elapsed.time:.1f}s", flush=True)

    print(f"\n{args.steps} steps of batch {args.batch_size} on digits, the same train_loop call:\n")
    print("| framework  | parameters | test accuracy | test loss | ms/step | total s |")
    print("|------------|-----------:|--------------:|----------:|--------:|--------:|")
    for name, parameters, accuracy, loss, ms, total in rows:
        print(f"| {name:<10} | {parameters:>10,} | {accuracy:>13.4f} | {loss:>9.4f} | "
              f"{ms:>7.2f} | {total:>7.1f} |")  # fmt: skip


if __name__ == "__main__":
    main()
