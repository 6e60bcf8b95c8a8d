"""A training under ``steps_per_call="auto"`` with K forced to 8 (so that groups are
known), checkpointed every 10 steps: a managed step, or (``plain``) a hand-written
``jax.jit`` step under ``ciclo.fuse_steps``. Run as a script, it kills itself (SIGKILL) when
the loop draws ``kill_at``, a step inside a fused group (test_auto_fusion.py resumes it)."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
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


@jax.jit
def plain_step(state: Any, batch: Any) -> Any:
    x, y = batch
    loss, grads = jax.value_and_grad(lambda w: jnp.mean((x @ w - y) ** 2))(state["w"])
    updates, opt_state = optax.adam(0.1).update(grads, state["opt"], state["w"])
    state = {"w": optax.apply_updates(state["w"], updates), "opt": opt_state}
    return ciclo.logs().add_loss("loss", loss), state


def batches(kill_at: int | None = None, directory: str = "") -> Iterator[Any]:
    rng = np.random.default_rng(0)
    for i in range(STEPS):
        if i == kill_at:  # once a checkpoint is committed (a step-named folder), or 60 s
            deadline = time.monotonic() + 60
            folder = Path(directory)
            while time.monotonic() < deadline and not (
                folder.is_dir() and any(p.name.isdigit() for p in folder.iterdir())
            ):
                time.sleep(0.02)
            print(f"killed at {i}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        yield rng.normal(size=(8, 4)).astype(np.float32), rng.normal(size=8).astype(np.float32)


def run(
    directory: str, *, kill_at: int | None = None, resume: bool = False, plain: bool = False
) -> Any:
    if plain:
        state: Any = {"w": jnp.zeros(4), "opt": optax.adam(0.1).init(jnp.zeros(4))}
        step: Any = ciclo.fuse_steps(plain_step, "auto")
    else:
        state = ManagedState.create(
            params={"w": jnp.zeros(4)},
            tx=optax.adam(0.1),
            strategy=ciclo.managed.jit(steps_per_call="auto"),
        )
        step = train_step
    tasks = {ciclo.every(1): step, ciclo.every(EVERY): ciclo.checkpoint(directory, keep=2)}
    data = list(batches()) if resume else batches(kill_at, directory)
    return ciclo.loop(state, data, tasks, stop=STEPS, resume=directory if resume else None)


def fingerprint(state: Any, history: ciclo.History, elapsed: ciclo.Elapsed) -> dict[str, Any]:
    if isinstance(state, dict):  # the plain step's
        w, opt, step = state["w"], state["opt"], None
    else:
        w, opt, step = state.params["w"], state.opt_state, int(state.step)
    return {
        "w": np.asarray(w).tobytes(),
        "opt": [np.asarray(x).tobytes() for x in jax.tree.leaves(opt)],
        "step": step,
        "steps": history.collect("steps"),
        "loss": np.asarray(history.collect("loss")).tobytes(),
        "elapsed": (elapsed.steps, elapsed.samples),
    }


if __name__ == "__main__":
    force_k()
    run(sys.argv[1], kill_at=int(sys.argv[2]), plain=sys.argv[3:] == ["plain"])
