"""Loop overhead on a small model and on a trivial step, against the hand-written loop.

Targets: `ciclo.loop` (with history, and a keras bar when available) within 5% of a plain
`for` loop calling the same jitted step without per-step syncs; the same for the
manual-iteration style; at most 20 µs per step of overhead on a trivial `x + 1` step.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from _harness import compare, emit, parse_args

import ciclo


def mlp_setup(steps: int):
    rng = np.random.default_rng(0)
    batches = [
        (rng.normal(size=(32, 784)).astype(np.float32), rng.integers(0, 10, 32).astype(np.int32))
        for _ in range(64)
    ]
    dataset = [batches[i % len(batches)] for i in range(steps)]
    k1, k2 = jax.random.split(jax.random.key(0))
    params = {
        "w1": jax.random.normal(k1, (784, 128)) * 0.05,
        "b1": jnp.zeros(128),
        "w2": jax.random.normal(k2, (128, 10)) * 0.05,
        "b2": jnp.zeros(10),
    }
    tx = optax.sgd(0.01)

    @jax.jit
    def train_step(state, batch):
        x, y = batch

        def loss_fn(p):
            h = jax.nn.relu(x @ p["w1"] + p["b1"])
            logits = h @ p["w2"] + p["b2"]
            loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
            return loss, logits

        (loss, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["params"])
        updates, opt_state = tx.update(grads, state["opt_state"])
        logs = ciclo.logs()
        logs.add_loss("loss", loss)
        logs.add_metric("accuracy", jnp.mean(logits.argmax(-1) == y))
        return logs, {
            "params": optax.apply_updates(state["params"], updates),
            "opt_state": opt_state,
        }

    state = {"params": params, "opt_state": tx.init(params)}
    return state, dataset, train_step


def candidates(state, dataset, train_step, keras_bar: bool):
    def hand_written():
        s = state
        for batch in dataset:
            _, s = train_step(s, batch)
        jax.block_until_ready(s)

    def with_loop():
        tasks = {ciclo.every(1): train_step}
        if keras_bar and hasattr(ciclo, "keras_bar"):
            tasks = {ciclo.every(1): [train_step, ciclo.keras_bar(len(dataset), file=_NULL)]}
        s, _, _ = ciclo.loop(state, dataset, tasks)
        jax.block_until_ready(s)

    def manual_iteration():
        s, history = state, ciclo.history()
        schedule = ciclo.every(1)
        for elapsed, batch in ciclo.elapse(dataset):
            if schedule(elapsed):
                logs, s = train_step(s, batch)
                history.commit(elapsed, logs)
        jax.block_until_ready(s)

    out = {"hand-written for loop": hand_written, "ciclo.loop + history": with_loop}
    if keras_bar and hasattr(ciclo, "keras_bar"):
        out["ciclo.loop + history + keras_bar"] = with_loop
    out["manual iteration (elapse + history)"] = manual_iteration
    return out


class _Null:
    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


_NULL = _Null()


def main() -> None:
    args = parse_args(__doc__ or "")
    steps = 50 if args.tiny else 2000
    repeats = 2 if args.tiny else 9
    state, dataset, train_step = mlp_setup(steps)
    rows = compare(
        "small MLP, 2,000 steps" if not args.tiny else "small MLP (tiny)",
        candidates(state, dataset, train_step, keras_bar=True),
        repeats=repeats,
        per=steps,
        unit="us",
        target="ratio <= 1.05",
    )
    emit(rows, args.json)

    @jax.jit
    def trivial(state, batch):
        return ciclo.logs().add_metric("x", state), state + 1

    dataset = [np.zeros((1,), np.float32)] * steps
    rows = compare(
        "trivial step (x + 1)",
        candidates(jnp.zeros(()), dataset, trivial, keras_bar=False),
        repeats=repeats,
        per=steps,
        unit="us",
        target="overhead <= 20 us/step",
    )
    emit(rows, args.json)


if __name__ == "__main__":
    main()
