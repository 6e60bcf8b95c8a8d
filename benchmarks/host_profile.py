"""Where the host's time goes per step, on the MLP 784-128-10 of ``loop_overhead.py``.

Each candidate is timed twice in the same runs (alternating, paired rounds): its wall time
per step and the main thread's CPU time per step (``time.thread_time``: the Python and the
dispatch the host runs; a wait for the device sleeps and is not counted). Wall minus CPU is
the time the main thread waited. Candidates: the hand-written loop, ``ciclo.loop`` +
history + ``keras_bar`` with its defaults and with ``max_steps_in_flight=0`` (no bound),
and manual iteration, each on NumPy batches (copied to the device at each call, as a user's
loader gives them) and on batches already on the device. Then ``cProfile`` of the loop's
run: the functions with the most own time, in µs per step (the profiler's own cost is in
them, so read them as shares, not as times).

    python benchmarks/host_profile.py              # JAX's default backend (a GPU if any)
    python benchmarks/host_profile.py --rounds 31
"""

from __future__ import annotations

import cProfile
import pstats
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
from _harness import NullFile, compare, emit, parse_args
from loop_overhead import HAND_WRITTEN, MANUAL, mlp_setup
from loop_overhead import candidates as overhead_candidates

import ciclo

BENCHMARK = "host time per step, MLP 784-128-10, batch 32"
LOOP = "ciclo.loop + history + keras_bar"


def candidates(state, dataset, step) -> dict[str, Callable[[], Any]]:
    """The hand loop and manual iteration of ``loop_overhead.py``, and the loop + bar."""

    def looped(**options):
        def run():
            bar = ciclo.keras_bar(len(dataset), file=NullFile())
            s, _, _ = ciclo.loop(state, dataset, {ciclo.every(1): [step, bar]}, **options)
            jax.block_until_ready(s)

        return run

    same = overhead_candidates(state, dataset, step)
    return {
        HAND_WRITTEN: same[HAND_WRITTEN],
        LOOP: looped(),
        f"{LOOP}, max_steps_in_flight=0": looped(max_steps_in_flight=0),
        MANUAL: same[MANUAL],
    }


def with_thread_time(runs: dict[str, Callable[[], Any]], spent: dict[str, list[float]]):
    """``runs`` whose every call also appends its main-thread CPU seconds to ``spent``."""

    def timed(label: str, run: Callable[[], Any]) -> Callable[[], Any]:
        def call():
            start = time.thread_time()
            run()
            spent[label].append(time.thread_time() - start)

        return call

    return {label: timed(label, run) for label, run in runs.items()}


def profile(run: Callable[[], Any], steps: int, top: int) -> list[str]:
    """The ``top`` functions of ``run`` by own time, in µs per step."""
    run()
    profiler = cProfile.Profile()
    profiler.enable()
    run()
    profiler.disable()
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    ranked = sorted(stats.items(), key=lambda item: -item[1][2])[:top]
    return [
        f"{own / steps * 1e6:8.2f} us/step own, {calls / steps:5.2f} calls/step  "
        f"{name} ({file.rsplit('/', 2)[-1] if '/' in file else file}:{line})"
        for (file, line, name), (_, calls, own, _, _) in ranked
    ]


def main() -> None:
    args = parse_args(__doc__ or "")
    steps = 50 if args.tiny else 2000
    state, dataset, step = mlp_setup(steps)
    resident = [jax.device_put(batch) for batch in dataset]
    rounds = 2 if args.tiny else args.rounds or 15
    rows = []
    for where, batches in (("NumPy batches", dataset), ("batches on the device", resident)):
        runs = candidates(state, batches, step)
        spent: dict[str, list[float]] = {label: [] for label in runs}
        timed = with_thread_time(runs, spent)
        for row in compare(
            f"{BENCHMARK}, {where}", timed, repeats=rounds, per=steps, unit="us", paired=True
        ):
            row["host_us"] = statistics.median(spent[row["candidate"]][-rounds:]) / steps * 1e6
            rows.append(row)
            print(
                f"{where:22s} {row['candidate']:54s} wall {row['median']:8.2f} us/step, "
                f"ratio {row['ratio']:.3f}, main thread CPU {row['host_us']:8.2f} us/step",
                flush=True,
            )
        print(f"cProfile of {LOOP}, {where}:")
        print("\n".join(profile(runs[LOOP], steps, 8 if args.tiny else 25)), flush=True)
    emit(rows, args.json)


if __name__ == "__main__":
    main()
