"""ciclo-haiku's ``state.train_step`` against a hand-written jitted Haiku train step.

Both train the same Haiku model (an MLP with BatchNorm and Dropout, so Haiku state and a
per-step RNG key are part of the work), with the same optimizer, loss and accuracy metric, on
the same device-resident batches, dispatching every step without a sync and blocking once at
the end; the hand-written step derives its dropout key from the step number inside the
compiled step, as ciclo does. Candidates alternate in one process. Two sizes: an MNIST-sized
MLP, and a tiny one whose step is mostly dispatch, which shows the per-step overhead. XLA's
cost analysis of both compiled steps is printed too: equal numbers mean the same device work.
Target: ``state.train_step`` within 5% of the hand-written step per step (ratio <= 1.05):
the ratio is the median of the per-round ratios (paired: a round's load is shared).
"""

from __future__ import annotations

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import optax
from _harness import compare, emit, parse_args

import ciclo
import ciclo_haiku

CE = optax.softmax_cross_entropy_with_integer_labels


def accuracy(logits, labels):
    return logits.argmax(-1) == labels


def mlp(hidden: int):
    def forward(x, is_training):
        x = hk.Linear(hidden, with_bias=False)(x)
        x = hk.BatchNorm(True, True, decay_rate=0.9)(x, is_training)
        x = jax.nn.relu(x)
        if is_training:
            x = hk.dropout(hk.next_rng_key(), 0.2, x)
        return hk.Linear(10)(x)

    return hk.transform_with_state(forward)


def hand_written_step(model: hk.TransformedWithState, tx: optax.GradientTransformation):
    """What a Haiku user writes by hand: loss, gradients, optimizer, state and RNG threading."""

    @jax.jit
    def train_step(train_state, batch):
        params, model_state, opt_state, key, step = train_state
        x, y = batch
        rng = jax.random.fold_in(key, step)

        def loss_fn(p):
            logits, new_model_state = model.apply(p, model_state, rng, x, is_training=True)
            return CE(logits, y).mean(), (logits, new_model_state)

        (loss, (logits, new_model_state)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        logs = {"loss": loss, "accuracy": jnp.mean(accuracy(logits, y))}
        return logs, (params, new_model_state, opt_state, key, step + 1)

    return train_step


def compiled_costs(hand_step, initial, state, batch) -> dict[str, tuple[float, float]]:
    """XLA's cost analysis (flops, bytes accessed) of both compiled steps."""
    step = type(state).train_step.compiled_for(state.strategy)  # (state, batch, broadcasts)
    compiled = {
        "hand-written": hand_step.lower(initial, batch).compile(),
        "ciclo": step.lower(state, batch, None).compile(),
    }
    costs = {}
    for label, executable in compiled.items():
        analysis = executable.cost_analysis()
        analysis = analysis[0] if isinstance(analysis, list) else analysis
        costs[label] = (analysis.get("flops", 0.0), analysis.get("bytes accessed", 0.0))
    return costs


def run(name: str, features: int, hidden: int, batch_size: int, steps: int, repeats: int):
    rng = np.random.default_rng(0)
    distinct = [
        (
            rng.normal(size=(batch_size, features)).astype(np.float32),
            rng.integers(0, 10, batch_size).astype(np.int32),
        )
        for _ in range(16)
    ]
    dataset = [jax.device_put(distinct[i % len(distinct)]) for i in range(steps)]
    model = mlp(hidden)
    tx = optax.adam(1e-3)
    state = ciclo_haiku.create_state(
        model, dataset[0][0], tx, losses={"loss": CE}, metrics={"accuracy": accuracy}, key=0
    )
    hand_step = hand_written_step(model, tx)
    initial = (state.params, state.model_state, state.opt_state, state.key, state.step)

    def hand_written():
        s = initial
        for batch in dataset:
            _, s = hand_step(s, batch)
        jax.block_until_ready(s)

    def ciclo_train_step():
        s = state
        for batch in dataset:
            _, s = s.train_step(batch)
        jax.block_until_ready(s)

    def ciclo_loop():
        s, _, _ = ciclo.loop(state, dataset, {ciclo.every(1): state.train_step})
        jax.block_until_ready(s)

    rows = compare(
        name,
        {
            "hand-written jitted Haiku step": hand_written,
            "state.train_step": ciclo_train_step,
            "ciclo.loop(state.train_step)": ciclo_loop,
        },
        repeats=repeats,
        per=steps,
        unit="us",
        target="ratio <= 1.05",
        paired=True,
    )
    for row in rows:  # the target is the step's; the loop adds its records and its bound
        if row["candidate"] == "ciclo.loop(state.train_step)":
            row["target"] = ""
    print(f"  compiled (flops, bytes): {compiled_costs(hand_step, initial, state, dataset[0])}")
    return rows


def main() -> None:
    args = parse_args(__doc__ or "")
    tiny = " (tiny)" if args.tiny else ""
    steps, repeats = (10, 2) if args.tiny else (50, 41)
    emit(run(f"haiku MLP 784-512-10{tiny}", 784, 512, 128, steps, repeats), args.json)
    steps, repeats = (10, 2) if args.tiny else (500, 15)
    emit(run(f"haiku MLP 16-32-10{tiny}", 16, 32, 32, steps, repeats), args.json)


if __name__ == "__main__":
    main()
