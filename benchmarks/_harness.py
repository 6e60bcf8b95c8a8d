"""Shared benchmark harness: alternate candidates in one process, report medians and ratios.

Each benchmark script builds a few zero-argument callables that do the same work (a
hand-written JAX baseline first) and hands them to :func:`compare`, which runs them in
alternation (so drift in machine load hits all of them alike) and returns one row per
candidate with the median, min and max time and the ratio to the baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any


def parse_args(description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--tiny", action="store_true", help="a few iterations, for CI")
    parser.add_argument("--json", help="append result rows to this JSON-lines file")
    return parser.parse_args()


def compare(
    benchmark: str,
    candidates: dict[str, Callable[[], Any]],
    *,
    repeats: int = 7,
    warmup: int = 1,
    per: int = 1,
    unit: str = "ms",
    target: str = "",
) -> list[dict[str, Any]]:
    """Times each candidate ``repeats`` times, alternating; the first is the baseline.

    Args:
        benchmark: the benchmark's name (a row group in RESULTS.md).
        candidates: ``{label: fn}``; each ``fn()`` does the whole measured work and blocks
            until it is done.
        per: divide times by this (e.g. the number of steps) to report per-step times.
        unit: ``"ms"`` or ``"us"`` for the reported times.
        target: the target as text, e.g. ``"ratio <= 1.05"``.
    """
    for _ in range(warmup):
        for fn in candidates.values():
            fn()
    times: dict[str, list[float]] = {label: [] for label in candidates}
    for _ in range(repeats):
        for label, fn in candidates.items():
            start = time.perf_counter()
            fn()
            times[label].append(time.perf_counter() - start)
    scale = {"ms": 1e3, "us": 1e6}[unit] / per
    baseline_label = next(iter(candidates))
    baseline = statistics.median(times[baseline_label])
    rows = []
    for label, values in times.items():
        median = statistics.median(values)
        rows.append(
            {
                "benchmark": benchmark,
                "candidate": label,
                "median": median * scale,
                "min": min(values) * scale,
                "max": max(values) * scale,
                "unit": unit + ("/step" if per > 1 else ""),
                "ratio": median / baseline,
                "overhead": (median - baseline) * scale,
                "baseline": baseline_label,
                "target": target if label != baseline_label else "",
            }
        )
    return rows


def emit(rows: list[dict[str, Any]], json_path: str | None) -> None:
    """Prints rows and appends them to ``json_path`` (JSON lines) when given."""
    for row in rows:
        print(
            f"{row['benchmark']:<28} {row['candidate']:<34} median {row['median']:9.3f} "
            f"{row['unit']:<8} ratio {row['ratio']:.3f}"
        )
    if json_path:
        with open(json_path, "a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")


def machine_info() -> dict[str, str]:
    import jax

    info = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": str(os.cpu_count()),
        "jax": jax.__version__,
        "backend": jax.default_backend(),
    }
    for module in ("flax", "haiku", "equinox", "optax", "orbax.checkpoint", "keras"):
        try:
            mod = __import__(module, fromlist=["__version__"])
            info[module] = getattr(mod, "__version__", "?")
        except ImportError:
            pass
    return info
