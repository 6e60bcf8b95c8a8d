"""A managed training under ``steps_per_call="auto"`` with K forced to 8 (so that groups
are known), checkpointed every 10 steps: run as a script, it kills itself (SIGKILL) when the
loop draws ``kill_at``, a step inside a fused group (test_auto_fusion.py resumes it)."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

import ciclo
from ciclo.managed import ManagedState, _auto

STEPS, EVERY, K = 30, 10, 8


def force_k(k: int = K) -> None:
    """Makes every auto-fused step run groups of up to ``k`` (no timing involved)."""
    _auto.AutoFusion.steps = lambda self, loop_state: k  # type: ignore[method-assign]


@ciclo.managed.train_step
def train_step(state: Any, batch: Any) -> Any:
    x, y = batch
    loss = jnp.mean((x @ state.params["w"] - y) ** 2)
    return ciclo.logs().add_loss("loss", loss), state


def batches(kill_at: int | None = None) -> Iterator[Any]:
    rng = np.random.default_rng(0)
    for i in range(STEPS):
        if i == kill_at:
            time.sleep(1.0)  # the checkpoint of step 10 is written by then
            print(f"killed at {i}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        yield rng.normal(size=(8, 4)).astype(np.float32), rng.normal(size=8).astype(np.float32)


def run(directory: str, *, kill_at: int | None = None, resume: bool = False) -> Any:
    state = ManagedState.create(
        params={"w": jnp.zeros(4)},
        tx=optax.adam(0.1),
        strategy=ciclo.managed.jit(steps_per_call="auto"),
    )
    tasks = {ciclo.every(1): train_step, ciclo.every(EVERY): ciclo.checkpoint(directory, keep=2)}
    data = list(batches()) if resume else batches(kill_at)
    return ciclo.loop(state, data, tasks, stop=STEPS, resume=directory if resume else None)


def fingerprint(state: Any, history: ciclo.History, elapsed: ciclo.Elapsed) -> dict[str, Any]:
    return {
        "w": np.asarray(state.params["w"]).tobytes(),
        "opt": [np.asarray(x).tobytes() for x in jax.tree.leaves(state.opt_state)],
        "step": int(state.step),
        "steps": history.collect("steps"),
        "loss": np.asarray(history.collect("loss")).tobytes(),
        "elapsed": (elapsed.steps, elapsed.samples),
    }


if __name__ == "__main__":
    force_k()
    run(sys.argv[1], kill_at=int(sys.argv[2]))
