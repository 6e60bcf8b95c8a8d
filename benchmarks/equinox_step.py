"""ciclo-equinox's ``state.train_step`` against a hand-written ``eqx.filter_jit`` train step.

The same per-example Equinox MLP (batch norm over the vmapped batch axis, dropout with a key
per example), optimizer, loss and accuracy; the hand-written step derives its dropout key
from the step number inside the compiled step, as ciclo does. Candidates alternate in one
process; the leanest hand-written step (the model partitioned once, ``jax.jit`` over its
arrays) is shown for reference. Two sizes: an MNIST-sized MLP, and a tiny one whose step is
mostly dispatch, which shows the per-step overhead. Target: ``state.train_step`` within 5%
of the hand-written ``eqx.filter_jit`` step per step (ratio <= 1.05).
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from _harness import compare, emit, parse_args

import ciclo
import ciclo_equinox

CE = optax.softmax_cross_entropy_with_integer_labels


class MLP(eqx.Module):
    hidden: eqx.nn.Linear
    norm: eqx.nn.BatchNorm
    dropout: eqx.nn.Dropout
    out: eqx.nn.Linear

    def __init__(self, features: int, hidden: int, key: jax.Array) -> None:
        k1, k2 = jax.random.split(key)
        self.hidden = eqx.nn.Linear(features, hidden, key=k1)
        self.norm = eqx.nn.BatchNorm(hidden, axis_name="batch", mode="batch")
        self.dropout = eqx.nn.Dropout(0.2)
        self.out = eqx.nn.Linear(hidden, 10, key=k2)

    def __call__(
        self, x: jax.Array, state: eqx.nn.State, *, key: jax.Array
    ) -> tuple[jax.Array, eqx.nn.State]:
        x, state = self.norm(self.hidden(x), state)
        return self.out(self.dropout(jax.nn.relu(x), key=key)), state


def accuracy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    return logits.argmax(-1) == labels


def forward(model, model_state, x, keys):
    """The Equinox idiom: the per-example model vmapped over the batch, the state shared."""
    return jax.vmap(
        lambda x, state, key: model(x, state, key=key),
        axis_name="batch",
        in_axes=(0, None, 0),
        out_axes=(0, None),
    )(x, model_state, keys)


def hand_written_setup(model, model_state, tx):
    @eqx.filter_jit
    def train_step(model, model_state, opt_state, key, step, x, y):
        keys = jax.random.split(jax.random.fold_in(key, step), x.shape[0])

        def loss_fn(model):
            logits, new_state = forward(model, model_state, x, keys)
            return CE(logits, y).mean(), (logits, new_state)

        (loss, (logits, new_state)), grads = eqx.filter_value_and_grad(loss_fn, has_aux=True)(model)
        updates, opt_state = tx.update(grads, opt_state, eqx.filter(model, eqx.is_inexact_array))
        model = eqx.apply_updates(model, updates)
        return model, new_state, opt_state, key, step + 1, loss, jnp.mean(accuracy(logits, y))

    opt_state = tx.init(eqx.filter(model, eqx.is_inexact_array))
    return (model, model_state, opt_state, jax.random.key(1), jnp.zeros((), jnp.int32)), train_step


def arrays_jit_setup(model, model_state, tx):
    """The leanest hand-written step: the model partitioned once, ``jax.jit`` over arrays."""
    params, static = eqx.partition(model, eqx.is_inexact_array)

    @jax.jit
    def train_step(params, model_state, opt_state, key, step, x, y):
        keys = jax.random.split(jax.random.fold_in(key, step), x.shape[0])

        def loss_fn(params):
            model = eqx.combine(params, static)
            logits, new_state = forward(model, model_state, x, keys)
            return CE(logits, y).mean(), (logits, new_state)

        (loss, (logits, new_state)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, new_state, opt_state, key, step + 1, loss, jnp.mean(accuracy(logits, y))

    opt_state = tx.init(params)
    return (params, model_state, opt_state, jax.random.key(1), jnp.zeros((), jnp.int32)), train_step


def _flops(cost) -> float:
    cost = cost[0] if isinstance(cost, list) else cost
    return float(cost.get("flops", float("nan")))


def run(name: str, features: int, hidden: int, batch_size: int, steps: int, repeats: int):
    rng = np.random.default_rng(0)
    batches = [
        (
            rng.normal(size=(batch_size, features)).astype(np.float32),
            rng.integers(0, 10, batch_size).astype(np.int32),
        )
        for _ in range(16)
    ]
    dataset = [jax.device_put(batches[i % len(batches)]) for i in range(steps)]
    tx = optax.adam(1e-3)
    model, model_state = eqx.nn.make_with_state(MLP)(features, hidden, jax.random.key(0))

    initial, hand_step = hand_written_setup(model, model_state, tx)
    arrays_initial, arrays_step = arrays_jit_setup(model, model_state, tx)
    state = ciclo_equinox.create_state(
        model,
        tx,
        state=model_state,
        vmap=True,
        key=1,
        losses={"loss": CE},
        metrics={"accuracy": accuracy},
    )

    def hand_written():
        carry = initial
        for x, y in dataset:
            *carry, _, _ = hand_step(*carry, x, y)
        jax.block_until_ready(carry)

    def arrays_jit():
        carry = arrays_initial
        for x, y in dataset:
            *carry, _, _ = arrays_step(*carry, x, y)
        jax.block_until_ready(carry)

    def ciclo_train_step():
        s = state
        for batch in dataset:
            _, s = s.train_step(batch)
        jax.block_until_ready(s)

    def ciclo_loop():
        s, _, _ = ciclo.loop(state, dataset, {ciclo.every(1): state.train_step})
        jax.block_until_ready(s)

    x, y = dataset[0]
    hand_cost = hand_step.lower(*initial, x, y).compile().compiled.cost_analysis()
    compiled = type(state).train_step.compiled_for(state.strategy)
    ciclo_cost = compiled.lower(state, (x, y), None).compile().cost_analysis()  # no broadcasts
    print(
        f"{name}: compiled step flops, hand-written {_flops(hand_cost):.6g}, "
        f"state.train_step {_flops(ciclo_cost):.6g}"
    )
    return compare(
        name,
        {
            "hand-written eqx.filter_jit step": hand_written,
            "state.train_step": ciclo_train_step,
            "ciclo.loop(state.train_step)": ciclo_loop,
            "hand-written jax.jit step on arrays": arrays_jit,
        },
        repeats=repeats,
        per=steps,
        unit="us",
        target="ratio <= 1.05",
    )


def main() -> None:
    args = parse_args(__doc__ or "")
    tiny = " (tiny)" if args.tiny else ""
    steps, repeats = (10, 2) if args.tiny else (200, 15)
    emit(run(f"equinox MLP 784-256-10{tiny}", 784, 256, 128, steps, repeats), args.json)
    steps, repeats = (10, 2) if args.tiny else (1000, 15)
    emit(run(f"equinox MLP 16-32-10{tiny}", 16, 32, 32, steps, repeats), args.json)


if __name__ == "__main__":
    main()
