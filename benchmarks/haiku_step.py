"""ciclo-haiku's ``state.train_step`` against a hand-written jitted Haiku train step.

Both train the same Haiku model (an MLP with BatchNorm and Dropout, so Haiku state and a
per-step RNG key are part of the work), with the same optimizer, loss and accuracy metric, on
the same device-resident batches, dispatching every step without a sync and blocking once at
the end. Target: ``state.train_step`` within 5% of the hand-written step per step.
"""

from __future__ import annotations

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import optax
from _harness import compare, emit, parse_args

import ciclo_haiku

CE = optax.softmax_cross_entropy_with_integer_labels


def accuracy(logits, labels):
    return logits.argmax(-1) == labels


def forward(x, is_training):
    x = hk.Linear(512)(x)
    x = hk.BatchNorm(True, True, decay_rate=0.9)(x, is_training)
    x = jax.nn.relu(x)
    if is_training:
        x = hk.dropout(hk.next_rng_key(), 0.2, x)
    x = jax.nn.relu(hk.Linear(256)(x))
    return hk.Linear(10)(x)


def setup(steps: int, batch_size: int):
    rng = np.random.default_rng(0)
    distinct = [
        (
            rng.normal(size=(batch_size, 784)).astype(np.float32),
            rng.integers(0, 10, batch_size).astype(np.int32),
        )
        for _ in range(16)
    ]
    distinct = [jax.device_put(b) for b in distinct]
    batches = [distinct[i % len(distinct)] for i in range(steps)]
    model = hk.transform_with_state(forward)
    tx = optax.adam(1e-3)
    state = ciclo_haiku.create_state(
        model, batches[0][0], tx, losses={"loss": CE}, metrics={"accuracy": accuracy}, key=0
    )
    return model, tx, state, batches


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


def candidates(model, tx, state, batches):
    step = hand_written_step(model, tx)
    initial = (state.params, state.model_state, state.opt_state, state.key, state.step)

    def hand_written():
        s = initial
        for batch in batches:
            _, s = step(s, batch)
        jax.block_until_ready(s)

    def ciclo_train_step():
        s = state
        for batch in batches:
            _, s = s.train_step(batch)
        jax.block_until_ready(s)

    return {
        "hand-written jitted Haiku step": hand_written,
        "ciclo_haiku state.train_step": ciclo_train_step,
    }


def compiled_costs(model, tx, state, batch) -> dict[str, tuple[float, float]]:
    """XLA's cost analysis of both compiled steps: equal numbers mean the same device work,
    so any difference in time is host-side dispatch."""
    initial = (state.params, state.model_state, state.opt_state, state.key, state.step)
    compiled = {
        "hand-written": hand_written_step(model, tx).lower(initial, batch).compile(),
        "ciclo": type(state).train_step.compiled_for(state.strategy).lower(state, batch).compile(),
    }
    costs = {}
    for label, executable in compiled.items():
        analysis = executable.cost_analysis()
        analysis = analysis[0] if isinstance(analysis, list) else analysis
        costs[label] = (analysis.get("flops", 0.0), analysis.get("bytes accessed", 0.0))
    return costs


def main() -> None:
    args = parse_args(__doc__ or "")
    steps = 20 if args.tiny else 50
    repeats = 2 if args.tiny else 41
    batch_size = 32 if args.tiny else 128
    model, tx, state, batches = setup(steps, batch_size)
    rows = compare(
        "Haiku MLP+BN+dropout step" if not args.tiny else "Haiku step (tiny)",
        candidates(model, tx, state, batches),
        repeats=repeats,
        per=steps,
        unit="us",
        target="ratio <= 1.05",
    )
    emit(rows, args.json)
    print("compiled work (flops, bytes accessed):", compiled_costs(model, tx, state, batches[0]))
    print(f"device: {jax.devices()[0].device_kind}, batch {batch_size}, {steps} steps per run")


if __name__ == "__main__":
    main()
