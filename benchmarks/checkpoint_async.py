"""How long a checkpoint of a ~50 MB state blocks the loop: `ciclo.checkpoint` with
`async_save=True` (the default) against a synchronous save (`async_save=False`), both inside
a real `ciclo.loop`.

The loop is blocked from the end of the step that asked for the checkpoint to the start of
the next step (measured by a callback stamping each step, minus a step without a save:
`_harness.StepStamps`, shared with `checkpoint_in_training.py`); the async save then keeps
writing in the background. Also reported: the whole write of the async save (until it is
on disk).

Target: an async save blocks the loop for a small fraction of a synchronous save
(ratio async / sync <= 0.3).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from typing import Any

import jax
import jax.numpy as jnp
from _harness import StepStamps, emit, parse_args, summarize

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
    stamps = StepStamps()
    ended: list[float] = []
    directory = tempfile.mkdtemp(prefix="ciclo-bench-")
    try:
        ckpt = ciclo.checkpoint(directory, keep=1, async_save=async_save, save_on_end=False)
        tasks = {ciclo.every(1): stamps, (lambda elapsed: elapsed.steps == 1): ckpt}
        ciclo.loop(state, range(3), tasks, on_end=lambda: ended.append(time.perf_counter()))
        # step 0 -> 1: a plain step; step 1 -> 2: the step that saved; on_end runs once
        # the loop waited for the write to finish
        (blocked,) = stamps.blocked([1])
        step = stamps.times[1] - stamps.times[0]
        return blocked, ended[0] - stamps.times[1] - 2 * step
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
    labels = {
        "sync": "synchronous save: loop blocked",
        "async": "async save: loop blocked",
        "async write": "async save: until on disk",
    }
    benchmark = f"checkpoint of a {megabytes:g} MB state"
    rows = summarize(
        benchmark,
        {labels[key]: values for key, values in times.items()},
        baseline=labels["sync"],
        targets={labels["async"]: "ratio <= 0.3"},
    )
    emit(rows, args.json)
    print(
        f"{benchmark}: an async save blocks the loop {rows[1]['ratio']:.3f}x as long as a sync one"
    )


if __name__ == "__main__":
    jnp.zeros(())  # initialise the backend before timing anything
    main()
