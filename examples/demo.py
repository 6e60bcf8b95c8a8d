"""The README demo: a softmax-regression / MLP classifier on scikit-learn's digits,
trained with ``ciclo.loop`` and a hand-written ``jax.jit`` step (no framework needed).

    python examples/demo.py --steps 600
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
import optax
from sklearn.datasets import load_digits

import ciclo


def batches(x: np.ndarray, y: np.ndarray, batch_size: int, seed: int):
    """An endless stream of shuffled batches."""
    rng = np.random.default_rng(seed)
    while True:
        order = rng.permutation(len(x))
        for i in range(0, len(x) - batch_size + 1, batch_size):
            idx = order[i : i + batch_size]
            yield x[idx], y[idx]


def init_params(key: jax.Array, sizes: list[int]) -> list[dict[str, jax.Array]]:
    keys = jax.random.split(key, len(sizes) - 1)
    return [
        {"w": jax.random.normal(k, (m, n)) * jnp.sqrt(2.0 / m), "b": jnp.zeros(n)}
        for k, m, n in zip(keys, sizes[:-1], sizes[1:], strict=True)
    ]


def forward(params: list[dict[str, jax.Array]], x: jax.Array) -> jax.Array:
    for layer in params[:-1]:
        x = jax.nn.relu(x @ layer["w"] + layer["b"])
    return x @ params[-1]["w"] + params[-1]["b"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int32)
    split = int(0.8 * len(x))
    x_train, y_train, x_test, y_test = x[:split], y[:split], x[split:], y[split:]

    tx = optax.adam(1e-2)
    params = init_params(jax.random.key(0), [64, 64, 10])
    state = {"params": params, "opt_state": tx.init(params)}

    @jax.jit
    def train_step(state, batch):
        inputs, labels = batch

        def loss_fn(params):
            logits = forward(params, inputs)
            loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
            return loss, logits

        (loss, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["params"])
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        logs = ciclo.logs()
        logs.add_loss("loss", loss)
        logs.add_metric("accuracy", jnp.mean(logits.argmax(-1) == labels))
        return logs, {"params": params, "opt_state": opt_state}

    def report(state, batch, elapsed, loop_state):
        logs = jax.device_get(loop_state.logs)  # one transfer per report, not per step
        print(
            f"step {elapsed.steps:5d}  samples {elapsed.samples:6d}  "
            f"loss {logs.losses.loss:.4f}  accuracy {logs.metrics.accuracy:.4f}"
        )

    state, history, elapsed = ciclo.loop(
        state,
        batches(x_train, y_train, args.batch_size, seed=0),
        {
            ciclo.every(1): train_step,
            ciclo.every(100): report,
        },
        stop=args.steps,
    )
    test_accuracy = float(jnp.mean(forward(state["params"], x_test).argmax(-1) == y_test))
    loss = history.collect("loss")
    print(
        f"trained {elapsed.steps} steps ({elapsed.samples} samples) in {elapsed.time:.1f}s; "
        f"final train loss {np.mean(loss[-20:]):.4f}; test accuracy {test_accuracy:.4f}"
    )


if __name__ == "__main__":
    main()
