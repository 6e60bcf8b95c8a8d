"""Fused steps: `steps_per_call=10` against `steps_per_call=1` and the hand-written loop.

Targets: on the small MLP, fused >= 1.25x faster than unfused and faster than the
hand-written unfused loop (ratio <= 0.85); on a trivial step, >= 3x faster than unfused.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from _harness import compare, emit, parse_args
from loop_overhead import mlp_setup

import ciclo
from ciclo.managed import ManagedState

TX = optax.sgd(0.01)


@ciclo.managed.train_step
def mlp_step(state, batch):
    x, y = batch
    p = state.params
    h = jax.nn.relu(x @ p["w1"] + p["b1"])
    logits = h @ p["w2"] + p["b2"]
    logs = ciclo.logs()
    logs.add_loss("loss", optax.softmax_cross_entropy_with_integer_labels(logits, y).mean())
    logs.add_metric("accuracy", jnp.mean(logits.argmax(-1) == y))
    return logs, state


@ciclo.managed.train_step
def trivial_step(state, batch):
    # A "model" whose whole step is x + 1 (a zero loss keeps the optimizer trivial).
    logs = ciclo.logs().add_loss("loss", jnp.zeros(()) * state.params["x"])
    return logs, state.replace(counter=state.counter + 1)


def fused_candidate(dataset, steps_per_call: int, step=mlp_step, params=None):
    """A zero-argument function running `ciclo.loop` over `dataset` with fused steps."""
    if params is None:
        params, _, _ = mlp_setup(1)
        params = params["params"]
    extra = {"counter": jnp.zeros((), jnp.int32)} if step is trivial_step else {}
    state = ManagedState.create(
        params=params, tx=TX, strategy=ciclo.managed.jit(steps_per_call=steps_per_call), **extra
    )

    def run():
        s, history, _ = ciclo.loop(state, dataset, {ciclo.every(1): step})
        jax.block_until_ready(s)
        history.fetch()

    return run


def main() -> None:
    args = parse_args(__doc__ or "")
    steps = 60 if args.tiny else 2000
    repeats = 2 if args.tiny else 7
    state, dataset, train_step = mlp_setup(steps)

    def hand_written():
        s = state
        for batch in dataset:
            _, s = train_step(s, batch)
        jax.block_until_ready(s)

    rows = compare(
        "fused steps, small MLP",
        {
            "hand-written for loop (unfused)": hand_written,
            "ciclo steps_per_call=1": fused_candidate(dataset, 1),
            "ciclo steps_per_call=10": fused_candidate(dataset, 10),
        },
        repeats=repeats,
        per=steps,
        unit="us",
        target="10 vs 1: >= 1.25x; vs hand-written <= 0.85",
    )
    emit(rows, args.json)

    trivial_data = [np.zeros((1,), np.float32)] * steps
    params = {"x": jnp.zeros(())}
    rows = compare(
        "fused steps, trivial step",
        {
            "ciclo steps_per_call=1": fused_candidate(trivial_data, 1, trivial_step, params),
            "ciclo steps_per_call=10": fused_candidate(trivial_data, 10, trivial_step, params),
        },
        repeats=repeats,
        per=steps,
        unit="us",
        target="10 vs 1: >= 3x",
    )
    emit(rows, args.json)


if __name__ == "__main__":
    main()
