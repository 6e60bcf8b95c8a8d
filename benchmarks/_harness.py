"""Shared benchmark harness: alternate candidates in one process, report medians and ratios.

Each benchmark script builds a few zero-argument callables that do the same work (a
hand-written JAX baseline first) and hands them to :func:`compare`, which runs them in
alternation, in an order shuffled each round (so drift in machine load, and whatever one
run leaves the next, hits all of them alike) and returns one row per
candidate with the median, min and max time and the ratio to the baseline. Scripts that
time parts of a loop instead (how long a checkpoint blocks it) stamp its steps with
:class:`StepStamps` and make the rows with :func:`summarize`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any


def parse_args(description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--tiny", action="store_true", help="a few iterations, for CI")
    parser.add_argument("--json", help="append result rows to this JSON-lines file")
    parser.add_argument(
        "--rounds", type=int, help="rounds, for a script that times in rounds (default: its own)"
    )
    return parser.parse_args()


def alternate(
    candidates: dict[str, Callable[[], Any]], repeats: int, *, warmup: int = 1
) -> dict[str, list[float]]:
    """``{label: [seconds of each round]}``: every candidate run ``warmup`` times (its
    compiles), then once a round for ``repeats`` rounds, in an order shuffled each round.

    A fixed order would run each candidate after the same neighbour every round, and pay
    for its garbage, its cache footprint, its leftover device work. The shuffle is seeded,
    so every process of a multi-process benchmark runs the same order.
    """
    for _ in range(warmup):
        for fn in candidates.values():
            fn()
    times: dict[str, list[float]] = {label: [] for label in candidates}
    order = list(candidates.items())
    rng = random.Random(0)
    for _ in range(repeats):
        rng.shuffle(order)
        for label, fn in order:
            start = time.perf_counter()
            fn()
            times[label].append(time.perf_counter() - start)
    return times


class NullFile:
    """A file that drops what is written: a bar's ``file=`` when only its cost is timed."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def compare(
    benchmark: str,
    candidates: dict[str, Callable[[], Any]],
    *,
    repeats: int = 7,
    warmup: int = 1,
    per: int = 1,
    unit: str = "ms",
    target: str = "",
    paired: bool = False,
) -> list[dict[str, Any]]:
    """Times each candidate ``repeats`` times, alternating; the first is the baseline.

    Args:
        benchmark: the benchmark's name (a row group in RESULTS.md).
        candidates: ``{label: fn}``; each ``fn()`` does the whole measured work and blocks
            until it is done.
        per: divide times by this (e.g. the number of steps) to report per-step times.
        unit: ``"ms"`` or ``"us"`` for the reported times.
        target: the target as text, e.g. ``"ratio <= 1.05"``.
        paired: each row's ``ratio`` and ``overhead`` are the medians of the per-round
            ratios and differences to the baseline's run of the same round, which cancel
            a shared machine's load drifting between rounds (else: of the medians).
    """
    times = alternate(candidates, repeats, warmup=warmup)
    baseline_label = next(iter(candidates))
    targets = {label: target for label in candidates if label != baseline_label}
    rows = summarize(benchmark, times, baseline=baseline_label, targets=targets, unit=unit, per=per)
    if paired:
        scale = {"ms": 1e3, "us": 1e6}[unit] / per
        base = times[baseline_label]
        for row in rows:
            values = times[row["candidate"]]
            row["ratio"] = paired_ratio(values, base)
            row["overhead"] = statistics.median(
                (t - b) * scale for t, b in zip(values, base, strict=True)
            )
            row["paired"] = True
    return rows


def paired_ratio(times: Sequence[float], base: Sequence[float]) -> float:
    """The median of the per-round ratios ``times / base`` (runs of the same round paired,
    which cancels a shared machine's load drifting between rounds).

    >>> paired_ratio([2.0, 3.0, 10.0], [1.0, 2.0, 4.0])
    2.0
    """
    return statistics.median(t / b for t, b in zip(times, base, strict=True))


def summarize(
    benchmark: str,
    times: dict[str, list[float]],
    *,
    baseline: str,
    targets: dict[str, str] | None = None,
    unit: str = "ms",
    per: int = 1,
) -> list[dict[str, Any]]:
    """One row per label of ``times`` (seconds): median, min, max, and the ratio of the
    median to the median of ``baseline`` (one of the labels).

    Args:
        targets: ``{label: target as text}``, e.g. ``{"async save": "ratio <= 1.0"}``.
        unit, per: as for :func:`compare`.
    """
    scale = {"ms": 1e3, "us": 1e6}[unit] / per
    reference = statistics.median(times[baseline])
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
                "ratio": median / reference,
                "overhead": (median - reference) * scale,
                "baseline": baseline,
                "target": (targets or {}).get(label, ""),
            }
        )
    return rows


class StepStamps:
    """A loop callback that stamps the end of each step, once the state it is given is
    computed (``{ciclo.every(1): stamps}``, before the callback timed), so that the time
    a step's end-of-step work (a checkpoint's save) blocks the loop can be told from the
    step's own compute.

    ``times[k + 1] - times[k]`` spans the end of step ``k`` (what ran at its end) and the
    work of step ``k + 1``.
    """

    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, state: Any) -> None:
        import jax

        jax.block_until_ready(state)
        self.times.append(time.perf_counter())

    def blocked(self, steps: Sequence[int]) -> list[float]:
        """How much longer than the median of the other intervals the interval after each
        of ``steps`` took: how long the work at those steps' ends blocked the loop."""
        intervals = [b - a for a, b in zip(self.times, self.times[1:], strict=False)]
        normal = statistics.median(d for k, d in enumerate(intervals) if k not in set(steps))
        return [intervals[k] - normal for k in steps]


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
        "device": jax.devices()[0].device_kind,
    }
    for module in ("flax", "haiku", "equinox", "optax", "orbax.checkpoint", "keras"):
        try:
            mod = __import__(module, fromlist=["__version__"])
            info[module] = getattr(mod, "__version__", "?")
        except ImportError:
            pass
    return info
