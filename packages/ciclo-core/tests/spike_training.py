"""A run whose loss spikes at one batch, under ``rollback_on_nan(spike=10)`` with
``checkpoint(keep=2)`` every 5 steps and 1 ms steps, for ``test_nan_guards.py``: the spike
is noticed late, after later checkpoints were written. ``python spike_training.py DIRECTORY
LOOK_SECONDS`` prints the result as JSON.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import numpy as np

import ciclo

SPIKE, STEPS, TRUE_W = 20, 80, [1.0, -2.0, 0.5]


def run(directory: str, look_seconds: float = 0.1) -> dict[str, Any]:
    """The run's final ``w`` and its history's rollback rows; ``look_seconds`` between
    ``rollback_on_nan``'s looks at the history (a large one: noticed at the loop's end)."""
    import jax
    import jax.numpy as jnp

    from ciclo._checkpoint import _rollback

    _rollback.LOOK_SECONDS = look_seconds

    rng = np.random.default_rng(0)
    xs = rng.normal(size=(STEPS + 20, 8, 3)).astype(np.float32)
    ys = xs @ np.array(TRUE_W, np.float32) + 0.1 * rng.normal(size=(STEPS + 20, 8))
    ys[SPIKE] += 1000.0  # a finite spike: its update throws the weights far off

    @jax.jit
    def train_step(w: Any, batch: Any) -> Any:
        x, y = batch
        loss, grad = jax.value_and_grad(lambda w: jnp.mean((x @ w - y) ** 2))(w)
        return ciclo.logs().add_loss("loss", loss), w - 0.1 * grad

    ckpt = ciclo.checkpoint(directory, keep=2)
    rollback = ciclo.rollback_on_nan(ckpt, spike=10, verbose=False)
    tasks = {
        ciclo.every(1): [train_step, rollback, lambda: time.sleep(0.001)],
        ciclo.every(5): ckpt,
    }
    data = list(zip(xs, ys.astype(np.float32), strict=True))
    w, history, elapsed = ciclo.loop(jnp.zeros(3), data, tasks, stop=STEPS)
    logged = history.keys()
    faults = history.collect("fault_step") if "metrics.fault_step" in logged else []
    return {"w": np.asarray(w).tolist(), "steps": elapsed.steps, "fault_steps": faults}


if __name__ == "__main__":
    print(json.dumps(run(sys.argv[1], float(sys.argv[2]))))
