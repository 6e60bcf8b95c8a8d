"""How fast a run restarts: the time to the first step of `examples/digits_cnn.py` (a small
Flax Linen CNN under `ciclo.train_loop`, checkpointed) in a fresh process, from the moment
the process is launched to the moment the first step's state is computed, for

- a cold start (an empty directory: everything is compiled, and written to the compilation
  cache that `ciclo.checkpoint` keeps next to the checkpoints);
- a cold start without the cache (`JAX_ENABLE_COMPILATION_CACHE=false`): what writing the
  cache costs a cold start;
- a resume without the cache: the checkpoint is restored, everything compiled again;
- a resume (the default): the checkpoint is restored and every program loaded from the
  cache.

Each run is a fresh Python process (imports included: they are the same in all four; an
untimed run first reads and byte-compiles their files); the candidates alternate within each
round, so drift in the machine's load hits all alike.
The compilation time is the sum of JAX's own `backend_compile_duration` events up to the
first step (with the cache it is the time to load the programs); the cache hits are JAX's
`cache_hits` events.

Targets (issues 29, 41): a resume's time to the first step <= 0.5x a cold start's (ratio
<= 0.5), and its compiling up to the first step as ``ciclo.goodput`` counts it (JAX's
tracing, lowering and compile events) <= 0.5x a cold start's.
The same times counted from the end of the example's imports (JAX, Flax, optax, ciclo,
and the digits read from scikit-learn's file: about 0.9 s in every run here) are reported
too: what ciclo's restart itself costs (orbax, imported by the restore, is counted in it).

The runs use the CPU unless ``JAX_PLATFORMS`` names another platform
(``JAX_PLATFORMS=cuda`` on a GPU machine).

    python restart.py [--tiny] [--rounds 7] [--json rows.jsonl]
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
#: What ``ciclo.goodput`` counts as compiling: tracing, lowering and XLA (or a cache read).
LEDGER_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    COMPILE_EVENT,
)


def child(directory: str, steps: int, launched: float) -> None:
    """One run of the example in this (fresh) process; prints what it measured as JSON."""
    import jax

    compiled: list[float] = []  # compilation (or cache loading) seconds, up to the first step
    ledger: list[float] = []  # tracing, lowering and compilation: the ledger's compile bucket
    hits: list[str] = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, seconds, **_: compiled.append(seconds) if event == COMPILE_EVENT else None
    )
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, seconds, **_: ledger.append(seconds) if event in LEDGER_EVENTS else None
    )
    jax.monitoring.register_event_listener(
        lambda event, **_: hits.append(event) if event.endswith("/cache_hits") else None
    )
    sys.path.insert(0, str(EXAMPLES))
    import digits_cnn  # JAX, Flax, optax, ciclo, the digits: the same in all four

    imported = time.time()
    first: dict[str, float] = {}

    class FirstStep:
        def on_train_step(self, state, batch, elapsed):
            if not first:
                jax.block_until_ready(state)
                first.update(
                    seconds=time.time() - launched,
                    after_imports=time.time() - imported,
                    compile=sum(compiled),
                    ledger_compile=sum(ledger),
                    hits=len(hits),
                    step=elapsed.steps,
                )

    _, _, elapsed = digits_cnn.train(directory, steps, callbacks=[FirstStep()])
    print(json.dumps({**first, "steps": elapsed.steps}), flush=True)


def launch(directory: Path, steps: int, cache: bool) -> dict[str, float]:
    env = {**os.environ}
    env.setdefault("JAX_PLATFORMS", "cpu")
    # Imports read byte-compiled files, as an installed package's are: the untimed first
    # run writes what is missing (PYTHONDONTWRITEBYTECODE would have every run compile
    # the files changed since the last install).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if not cache:
        env["JAX_ENABLE_COMPILATION_CACHE"] = "false"
    launched = time.time()
    done = subprocess.run(
        [sys.executable, __file__, "--child", str(directory), str(steps), repr(launched)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=600,
    )
    if done.returncode:
        sys.exit(f"restart.py: a run failed:\n{done.stderr[-4000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if result["steps"] != steps:
        sys.exit(f"restart.py: a run ended at step {result['steps']}, not {steps}")
    return result


def main() -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    from _harness import emit, parse_args, summarize

    args = parse_args(__doc__)
    rounds, first, more = (1, 20, 5) if args.tiny else (args.rounds or 7, 60, 20)
    labels = ["cold start", "cold start, no cache", "resume, no cache", "resume"]
    if args.tiny:  # the two that matter, once: bench_tiny stays short
        labels = ["cold start", "resume"]
    results: dict[str, list[dict[str, float]]] = {label: [] for label in labels}
    load_before = os.getloadavg()
    if not args.tiny:  # an untimed run first: the imports' files read and byte-compiled
        with tempfile.TemporaryDirectory(prefix="ciclo-restart-") as work:
            launch(Path(work), 2, cache=False)
    for _ in range(rounds):
        work = Path(tempfile.mkdtemp(prefix="ciclo-restart-"))
        try:
            run, plain = work / "run", work / "plain"
            results["cold start"].append(launch(run, first, cache=True))
            if "cold start, no cache" in results:
                results["cold start, no cache"].append(launch(plain, first, cache=False))
                # the checkpoint of the cold start, at `first` steps, resumed without the cache
                results["resume, no cache"].append(launch(plain, first + more, cache=False))
            results["resume"].append(launch(run, first + more, cache=True))
        finally:
            shutil.rmtree(work, ignore_errors=True)
    times = {label: [r["seconds"] for r in runs] for label, runs in results.items()}
    rows = summarize(
        "restart: time to first step",
        times,
        baseline="cold start",
        targets={"resume": "ratio <= 0.5"},
        unit="ms",
    )
    after = {label: [r["after_imports"] for r in runs] for label, runs in results.items()}
    rows += summarize(
        "restart: from the imports to the first step",
        after,
        baseline="cold start",
        targets={},
        unit="ms",
    )
    ledger = {label: [r["ledger_compile"] for r in runs] for label, runs in results.items()}
    rows += summarize(
        "restart: compiling up to the first step (tracing, lowering, XLA: the ledger's bucket)",
        ledger,
        baseline="cold start",
        targets={"resume": "ratio <= 0.5"},
        unit="ms",
    )
    resumed = results["resume"]
    assert all(r["step"] == first for r in resumed), "a resume did not start at its checkpoint"
    other = {
        "benchmark": "restart.py",
        "what": "digits_cnn.py in fresh processes, time to the first step (medians, s)",
        "platform": os.environ.get("JAX_PLATFORMS", "cpu"),
        **{
            label: f"{statistics.median(times[label]):.2f} s, compile "
            f"{statistics.median(r['compile'] for r in runs):.2f} s, "
            f"{statistics.median(r['hits'] for r in runs):.0f} cache hits"
            for label, runs in results.items()
        },
        "rounds": rounds,
        "load average before": ", ".join(f"{x:.2f}" for x in load_before),
        "load average after": ", ".join(f"{x:.2f}" for x in os.getloadavg()),
    }
    emit(rows, args.json)
    print(json.dumps(other))
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps(other) + "\n")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
    else:
        main()
