"""Training with evaluation: `ciclo.train_loop` with a `test_dataset` evaluated at each
epoch's end, against a hand-written loop doing the same work (the training steps, and at
each epoch's end an evaluation loop that accumulates the sample-weighted metric sums on
device). Neither fetches a value per step; both keep the evaluation results on device.

Target: ratio <= 1.05.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from _harness import compare, emit, parse_args
from loop_overhead import mlp_setup

import ciclo


def main() -> None:
    args = parse_args(__doc__ or "")
    steps, epoch, test_batches = (40, 20, 5) if args.tiny else (1000, 200, 50)
    repeats = 2 if args.tiny else 9
    state, dataset, train_step = mlp_setup(steps)
    test_set = dataset[:test_batches]

    @jax.jit
    def test_step(state, batch):
        x, y = batch
        p = state["params"]
        logits = jax.nn.relu(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]
        logs = ciclo.logs()
        logs.add_loss("loss", optax.softmax_cross_entropy_with_integer_labels(logits, y).mean())
        logs.add_metric("accuracy", jnp.mean(logits.argmax(-1) == y))
        return logs

    @jax.jit
    def accumulate(totals, logs, weight):
        return jax.tree.map(lambda t, v: t + v * weight, totals, logs)

    def evaluate(s):
        totals, count = None, 0
        for batch in test_set:
            logs = test_step(s, batch)
            n = batch[0].shape[0]
            totals = (
                jax.tree.map(lambda v, n=n: v * n, logs)
                if totals is None
                else accumulate(totals, logs, n)
            )
            count += n
        return jax.tree.map(lambda t: t / count, totals)

    def hand_written():
        s, results = state, []
        for i, batch in enumerate(dataset):
            _, s = train_step(s, batch)
            if (i + 1) % epoch == 0:
                results.append(evaluate(s))
        jax.block_until_ready((s, results))
        return results

    def with_train_loop():
        s, history, _ = ciclo.train_loop(
            state,
            dataset,
            {ciclo.on_train_step: train_step, ciclo.on_test_step: test_step},
            test_dataset=lambda: test_set,
            epoch_duration=epoch,
        )
        jax.block_until_ready(s)
        return history

    expected = [float(r["metrics"]["accuracy"]) for r in hand_written()]
    got = with_train_loop().collect("accuracy_test")
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    evaluated = steps // epoch * test_batches
    rows = compare(
        f"train + eval ({steps} + {evaluated} steps)",
        {
            "hand-written train + eval loop": hand_written,
            "ciclo.train_loop + eval": with_train_loop,
        },
        repeats=repeats,
        per=steps + evaluated,
        unit="us",
        target="ratio <= 1.05",
    )
    emit(rows, args.json)


if __name__ == "__main__":
    main()
