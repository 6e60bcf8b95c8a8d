"""How long a checkpoint blocks a real training run: a 10 MB state (a linear model's
weights trained by a jitted SGD step) under `ciclo.train_loop` with
`tasks={ciclo.every(N): ckpt}`, saved asynchronously (the default) and synchronously,
against the time to copy the same state to host memory (`jax.device_get`), which an async
save cannot avoid.

The loop is blocked for a save by the time the step that saved takes over the median
step (each step is stamped after its state is ready, so compute is not counted).

Target: an async save blocks the loop no longer than the copy of the state to the host
(ratio to the copy <= 1.0; issue 21 measured 60-175 ms per 4-10 MB save). Saves every 50
steps of a batch of 256, so that each write ends before the next save starts.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from _harness import emit, parse_args

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


def run(state: dict[str, Any], steps: int, every: int, async_save: bool | None) -> list[float]:
    """Trains for ``steps`` steps saving every ``every`` (no checkpoint when ``async_save``
    is None); returns how long each save blocked the loop."""
    outputs = state["w"].shape[1]
    rng = np.random.default_rng(0)
    batch = (
        rng.normal(size=(256, FEATURES)).astype(np.float32),
        rng.normal(size=(256, outputs)).astype(np.float32),
    )
    stamps: list[float] = []

    def stamp(state: Any, batch: Any) -> None:
        jax.block_until_ready(state)
        stamps.append(time.perf_counter())

    directory = tempfile.mkdtemp(prefix="ciclo-bench-")
    tasks: dict[Any, Any] = {ciclo.on_train_step: train_step, ciclo.every(1): stamp}
    if async_save is not None:
        ckpt = ciclo.checkpoint(directory, keep=2, async_save=async_save, save_on_end=False)
        tasks[ciclo.every(every)] = ckpt
    try:
        ciclo.train_loop(state, [batch] * steps, tasks, stop=steps)
        if async_save is not None:
            ckpt.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    intervals = np.diff(stamps)
    normal = float(np.median(intervals))
    # a save at the end of step k (k = 0, every, ...) is in intervals[k]; step 0 also
    # compiles and opens orbax's manager, so it is left out
    return [float(intervals[k]) - normal for k in range(every, len(intervals), every)]


def copy_to_host(state: dict[str, Any], repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        fresh = jax.block_until_ready(jax.tree.map(lambda x: x + 0, state))
        start = time.perf_counter()
        jax.device_get(fresh)
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    args = parse_args(__doc__ or "")
    megabytes = 1.0 if args.tiny else 10.0
    steps, every = (24, 8) if args.tiny else (200, 50)
    state = make_state(megabytes)
    run(state, 2 * every, every, async_save=True)  # warm-up: compile, orbax import
    times: dict[str, list[float]] = {"copy": [], "async": [], "sync": []}
    for _ in range(1 if args.tiny else 3):  # alternate, so that load hits all alike
        times["copy"] += copy_to_host(state, 5)
        times["async"] += run(state, steps, every, async_save=True)
        times["sync"] += run(state, steps, every, async_save=False)
    copy = statistics.median(times["copy"])
    benchmark = f"checkpoint in training, {megabytes:g} MB state"
    rows = []
    for label, key, target in (
        ("copy of the state to host", "copy", ""),
        ("async save: loop blocked", "async", "ratio <= 1.0"),
        ("synchronous save: loop blocked", "sync", ""),
    ):
        values = times[key]
        median = statistics.median(values)
        rows.append(
            {
                "benchmark": benchmark,
                "candidate": label,
                "median": median * 1e3,
                "min": min(values) * 1e3,
                "max": max(values) * 1e3,
                "unit": "ms",
                "ratio": median / copy,
                "overhead": (median - copy) * 1e3,
                "baseline": "copy of the state to host",
                "target": target,
            }
        )
    emit(rows, args.json)


if __name__ == "__main__":
    jnp.zeros(())  # initialise the backend before timing anything
    main()
