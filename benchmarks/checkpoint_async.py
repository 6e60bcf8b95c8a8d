"""How long a checkpoint of a ~50 MB state blocks the loop: `ciclo.checkpoint` with
`async_save=True` (the default) against a synchronous save (`async_save=False`), both inside
a real `ciclo.loop`.

The loop is blocked from the end of the step that asked for the checkpoint to the start of
the next step (measured by a callback stamping each step, minus a step without a save);
the async save then keeps writing in the background. Also reported: the whole write of the
async save (until it is on disk).

Target: an async save blocks the loop for a small fraction of a synchronous save
(ratio async / sync <= 0.3).
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from typing import Any

import jax
import jax.numpy as jnp
from _harness import emit, parse_args

import ciclo


def make_state(megabytes: float) -> dict[str, Any]:
    """A float32 state of ``megabytes`` in 8 arrays (like a model's parameters)."""
    per_array = int(megabytes * 1e6 / 4 / 8)
    keys = jax.random.split(jax.random.key(0), 8)
    state = {f"w{i}": jax.random.normal(k, (per_array,)) for i, k in enumerate(keys)}
    return jax.block_until_ready(state)


def blocked_by_save(state: dict[str, Any], *, async_save: bool) -> tuple[float, float]:
    """Runs a 3-step loop saving after step 1: ``(seconds the loop was blocked, seconds until
    the checkpoint was on disk)``."""
    stamps: list[float] = []
    directory = tempfile.mkdtemp(prefix="ciclo-bench-")
    try:
        ckpt = ciclo.checkpoint(directory, keep=1, async_save=async_save, save_on_end=False)
        tasks = {
            ciclo.every(1): lambda: stamps.append(time.perf_counter()),
            (lambda elapsed: elapsed.steps == 1): ckpt,
        }
        ciclo.loop(state, range(3), tasks, on_end=lambda: stamps.append(time.perf_counter()))
        # step 0 -> 1: a plain step; step 1 -> 2: the step that saved; on_end runs once
        # the loop waited for the write to finish
        step = stamps[1] - stamps[0]
        blocked = stamps[2] - stamps[1] - step
        return blocked, stamps[3] - stamps[1] - 2 * step
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def main() -> None:
    args = parse_args(__doc__ or "")
    megabytes = 1.0 if args.tiny else 50.0
    repeats = 2 if args.tiny else 7
    state = make_state(megabytes)
    blocked_by_save(state, async_save=True)  # warm-up: orbax import, first writes
    blocked_by_save(state, async_save=False)
    times: dict[str, list[float]] = {"sync": [], "async": [], "async write": []}
    for _ in range(repeats):  # alternate, so that machine load hits both alike
        blocked, _ = blocked_by_save(state, async_save=False)
        times["sync"].append(blocked)
        blocked, written = blocked_by_save(state, async_save=True)
        times["async"].append(blocked)
        times["async write"].append(written)
    sync = statistics.median(times["sync"])
    benchmark = f"checkpoint of a {megabytes:g} MB state"
    rows = []
    for label, key, target in (
        ("synchronous save: loop blocked", "sync", ""),
        ("async save: loop blocked", "async", "ratio <= 0.3"),
        ("async save: until on disk", "async write", ""),
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
                "ratio": median / sync,
                "overhead": (median - sync) * 1e3,
                "baseline": "synchronous save: loop blocked",
                "target": target,
            }
        )
    emit(rows, args.json)
    print(
        f"{benchmark}: an async save blocks the loop {rows[1]['ratio']:.3f}x as long as a sync one"
    )


if __name__ == "__main__":
    jnp.zeros(())  # initialise the backend before timing anything
    main()
