"""How long a checkpoint blocks a real training run: a 10 MB state (a linear model's
weights trained by a jitted SGD step) under `ciclo.train_loop` with
`tasks={ciclo.every(N): ckpt}`, saved asynchronously (the default) and synchronously,
against the time to copy the same state into new host memory, which an async save cannot
avoid: `jax.device_get`, and a copy of what it returns (on a CPU backend `jax.device_get`
shares the device buffer instead of copying it, and a snapshot must not share it: the next
step may donate or overwrite it).

The loop is blocked for a save by the time the step that saved takes over the median
step (each step is stamped after its state is ready, so compute is not counted: see
`_harness.StepStamps`, shared with `checkpoint_async.py`). An async save's write shares
the CPU (and Python's GIL) with the loop: on a machine with few cores, part of the time
measured is that share, taken from the step after the save.

Target: an async save blocks the loop no longer than the copy of the state to the host
(ratio to the copy <= 1.0; issue 21 measured 60-175 ms per 4-10 MB save). Saves every 50
steps of a batch of 256, so that each write ends before the next save starts.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from _harness import StepStamps, emit, parse_args, summarize

import ciclo

FEATURES = 1024


def make_state(megabytes: float) -> dict[str, Any]:
    outputs = max(1, int(megabytes * 1e6 / 4 / FEATURES))
    return {"w": jnp.zeros((FEATURES, outputs)), "step": jnp.zeros((), jnp.int32)}


@jax.jit
def train_step(state: dict[str, Any], batch: Any) -> Any:
    x, y = batch

    def loss_fn(w: jax.Array) -> jax.Array:
        return jnp.mean((x @ w - y) ** 2)

    loss, grad = jax.value_and_grad(loss_fn)(state["w"])
    new = {"w": state["w"] - 1e-3 * grad, "step": state["step"] + 1}
    return ciclo.logs().add_loss("loss", loss), new


def run(state: dict[str, Any], steps: int, every: int, async_save: bool) -> list[float]:
    """Trains for ``steps`` steps saving every ``every``; returns how long each save
    blocked the loop."""
    outputs = state["w"].shape[1]
    rng = np.random.default_rng(0)
    batch = (
        rng.normal(size=(256, FEATURES)).astype(np.float32),
        rng.normal(size=(256, outputs)).astype(np.float32),
    )
    stamps = StepStamps()
    directory = tempfile.mkdtemp(prefix="ciclo-bench-")
    ckpt = ciclo.checkpoint(directory, keep=2, async_save=async_save, save_on_end=False)
    tasks = {ciclo.on_train_step: train_step, ciclo.every(1): stamps, ciclo.every(every): ckpt}
    try:
        ciclo.train_loop(state, [batch] * steps, tasks, stop=steps)
        ckpt.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    # a save at the end of step k (k = 0, every, ...) is in the interval after step k; step
    # 0 also compiles and opens orbax's manager, so it is left out
    return stamps.blocked(range(every, steps - 1, every))


def copy_to_host(state: dict[str, Any], repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        fresh = jax.block_until_ready(jax.tree.map(lambda x: x + 0, state))
        start = time.perf_counter()
        jax.tree.map(np.array, jax.device_get(fresh))  # np.array copies
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    args = parse_args(__doc__ or "")
    megabytes = 1.0 if args.tiny else 10.0
    steps, every = (24, 8) if args.tiny else (200, 50)
    state = make_state(megabytes)
    run(state, 2 * every, every, async_save=True)  # warm-up: compile, orbax import
    times: dict[str, list[float]] = {"copy": [], "async": [], "sync": []}
    for _ in range(1 if args.tiny else 4):  # alternate, so that load hits all alike
        times["copy"] += copy_to_host(state, 5)
        times["async"] += run(state, steps, every, async_save=True)
        times["sync"] += run(state, steps, every, async_save=False)
    labels = {
        "copy": "copy of the state to new host memory",
        "async": "async save: loop blocked",
        "sync": "synchronous save: loop blocked",
    }
    rows = summarize(
        f"checkpoint in training, {megabytes:g} MB state",
        {labels[key]: values for key, values in times.items()},
        baseline=labels["copy"],
        targets={labels["async"]: "ratio <= 1.0"},
    )
    emit(rows, args.json)


if __name__ == "__main__":
    jnp.zeros(())  # initialise the backend before timing anything
    main()
