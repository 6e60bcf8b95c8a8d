"""Python function calls per step of the per-step path (cProfile), on a trivial jitted step:
a hand-written ``for`` loop, ``ciclo.loop`` + history, ``ciclo.train_loop`` (epochs of
1000 steps) and manual iteration (``ciclo.elapse`` + ``history.commit``). Counts, not
times, so a busy machine does not move them; the ``ratio`` column is the count over the
hand-written loop's.

Before issue 26 (the engine of ciclo 0.1): 42.2 calls per step for ``ciclo.loop`` +
history, 20.1 for manual iteration, 2.1 for the hand-written loop.
"""

from __future__ import annotations

import cProfile
import pstats
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from _harness import emit, parse_args

import ciclo


def calls_per_step(fn: Callable[[int], Any], steps: int) -> float:
    fn(steps)  # compiles everything the run uses (the history's fetches too)
    profile = cProfile.Profile()
    profile.enable()
    fn(steps)
    profile.disable()
    stats = pstats.Stats(profile)
    return sum(entry[1] for entry in stats.stats.values()) / steps  # type: ignore[attr-defined]


def main() -> None:
    args = parse_args(__doc__ or "")

    @jax.jit
    def trivial(state, batch):
        return ciclo.logs().add_metric("x", state), state + 1

    def hand_written(steps: int) -> None:
        s = jnp.zeros(())
        for batch in [np.zeros((1,), np.float32)] * steps:
            _, s = trivial(s, batch)
        jax.block_until_ready(s)

    def with_loop(steps: int) -> None:
        data = [np.zeros((1,), np.float32)] * steps
        s, _, _ = ciclo.loop(jnp.zeros(()), data, {ciclo.every(1): trivial})
        jax.block_until_ready(s)

    def with_train_loop(steps: int) -> None:
        data = [np.zeros((1,), np.float32)] * steps
        tasks = {ciclo.on_train_step: trivial}
        s, _, _ = ciclo.train_loop(jnp.zeros(()), data, tasks, epoch_duration=1000)
        jax.block_until_ready(s)

    def manual_iteration(steps: int) -> None:
        s, history, schedule = jnp.zeros(()), ciclo.history(), ciclo.every(1)
        for elapsed, batch in ciclo.elapse([np.zeros((1,), np.float32)] * steps):
            if schedule(elapsed):
                logs, s = trivial(s, batch)
                history.commit(elapsed, logs)
        jax.block_until_ready(s)

    steps = 200 if args.tiny else 5000
    counts = {
        "hand-written for loop": calls_per_step(hand_written, steps),
        "ciclo.loop + history": calls_per_step(with_loop, steps),
        "ciclo.train_loop, epochs of 1000 steps": calls_per_step(with_train_loop, steps),
        "manual iteration (elapse + history.commit)": calls_per_step(manual_iteration, steps),
    }
    baseline = counts["hand-written for loop"]
    rows = [
        {
            "benchmark": "Python calls per step (trivial step)",
            "candidate": label,
            "median": count,
            "min": count,
            "max": count,
            "unit": "calls/step",
            "ratio": count / baseline,
            "overhead": count - baseline,
            "baseline": "hand-written for loop",
            "target": "",
        }
        for label, count in counts.items()
    ]
    emit(rows, args.json)


if __name__ == "__main__":
    main()
