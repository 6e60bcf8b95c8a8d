"""Evaluation: `ciclo.test_loop` against a hand-written evaluation loop that accumulates the
sample-weighted metric sums on device and fetches once at the end.

Target: ratio <= 1.05 (the median of the per-round ratios: this step's time drifts by 20%
and more on a shared 2-core machine, which pairing each round's two runs cancels).
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
    batches = 40 if args.tiny else 1000
    repeats = 2 if args.tiny else args.rounds or 21
    state, dataset, _ = mlp_setup(batches)
    params = state["params"]

    @jax.jit
    def test_step(params, batch):
        x, y = batch
        h = jax.nn.relu(x @ params["w1"] + params["b1"])
        logits = h @ params["w2"] + params["b2"]
        logs = ciclo.logs()
        logs.add_loss("loss", optax.softmax_cross_entropy_with_integer_labels(logits, y).mean())
        logs.add_metric("accuracy", jnp.mean(logits.argmax(-1) == y))
        return logs, params

    @jax.jit
    def accumulate(totals, logs, weight):
        return jax.tree.map(lambda t, v: t + v * weight, totals, logs)

    def hand_written():
        totals, count = None, 0
        for batch in dataset:
            logs, _ = test_step(params, batch)
            n = batch[0].shape[0]
            totals = (
                jax.tree.map(lambda v, n=n: v * n, logs)
                if totals is None
                else accumulate(totals, logs, n)
            )
            count += n
        return jax.device_get(jax.tree.map(lambda t: t / count, totals))

    def with_test_loop():
        _, logs, _ = ciclo.test_loop(params, dataset, {ciclo.on_test_step: test_step})
        return jax.device_get(logs)

    expected, got = hand_written(), with_test_loop()
    np.testing.assert_allclose(got["metrics"]["accuracy"], expected["metrics"]["accuracy"])
    rows = compare(
        "evaluation (test_loop)",
        {"hand-written eval loop": hand_written, "ciclo.test_loop": with_test_loop},
        repeats=repeats,
        per=batches,
        unit="us",
        target="ratio <= 1.05",
        paired=True,
    )
    emit(rows, args.json)


if __name__ == "__main__":
    main()
