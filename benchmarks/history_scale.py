"""History at scale: commit N steps of 3 scalar metrics, then collect.

Target: 1,000,000 steps stay under 100 MB and `collect` takes under 1 s. Reports how commit
time and memory grow from 10k to 1M steps. Values are committed as device scalars (as a
jitted step returns them), so the batched fetch path is what is measured.
"""

from __future__ import annotations

import gc
import json
import time
import tracemalloc

import jax.numpy as jnp
import numpy as np
from _harness import parse_args

import ciclo


def measure(steps: int, device_values: int = 2048) -> dict[str, float]:
    # A pool of device scalars reused across rows: creating 3M device arrays would measure
    # JAX's allocator, not the history.
    pool = [jnp.float32(i) for i in range(device_values)]
    gc.collect()
    tracemalloc.start()
    history = ciclo.history()
    elapsed = ciclo.Elapsed.create()
    start = time.perf_counter()
    for i in range(steps):
        logs = ciclo.logs()
        logs.add_loss("loss", pool[i % device_values])
        logs.add_metric("accuracy", pool[(i + 1) % device_values])
        logs.add_metric("lr", pool[(i + 2) % device_values])
        history.commit(elapsed, logs)
        elapsed = elapsed.update(32)
    history.fetch()
    commit_s = time.perf_counter() - start
    _, peak = tracemalloc.get_traced_memory()
    current = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    start = time.perf_counter()
    steps_out, loss, _accuracy = history.collect("steps", "loss", "accuracy")
    collect_s = time.perf_counter() - start
    assert len(loss) == steps
    assert steps_out[-1] == steps - 1
    assert np.isclose(loss[5], float(pool[5 % device_values]))
    return {
        "steps": steps,
        "commit_us_per_step": commit_s / steps * 1e6,
        "memory_mb": current / 1e6,
        "peak_mb": peak / 1e6,
        "collect_s": collect_s,
    }


def main() -> None:
    args = parse_args(__doc__ or "")
    sizes = [1_000, 10_000] if args.tiny else [10_000, 100_000, 1_000_000]
    for steps in sizes:
        row = measure(steps)
        row["benchmark"] = "history at scale"
        print(
            f"history {steps:>9,d} steps: commit {row['commit_us_per_step']:.2f} us/step, "
            f"memory {row['memory_mb']:.1f} MB (peak {row['peak_mb']:.1f}), "
            f"collect {row['collect_s']:.3f} s"
        )
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
