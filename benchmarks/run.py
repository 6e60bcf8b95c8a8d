"""Runs every benchmark script (each in its own process) and writes benchmarks/RESULTS.md.

python benchmarks/run.py            # full size: writes RESULTS.md
python benchmarks/run.py --tiny     # a few iterations of each, to keep them from rotting
python benchmarks/run.py --before ../ciclo-0.1   # also the engine's benchmarks on a checkout
                                                 # of an earlier ciclo, in the same run
python benchmarks/run.py --only language_model.py   # replaces only that script's rows
python benchmarks/run.py --results gpu.md           # writes another file (another machine)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).parent
SCRIPTS = [
    "loop_overhead.py",
    "overhead_parts.py",
    "step_profile.py",
    "host_profile.py",
    "fused_steps.py",
    "keras_fit.py",
    "history_scale.py",
    "eval_loop.py",
    "train_eval_loop.py",
    "flax_step.py",
    "haiku_step.py",
    "equinox_step.py",
    "checkpoint_async.py",
    "checkpoint_in_training.py",
    "restart.py",
    "placement.py",
    "multihost_agreement.py",
    "language_model.py",
    "matrix.py",  # writes its own section of RESULTS.md (kept by the rewrite below)
]


#: The benchmarks of the engine's per-step path, also run on an earlier ciclo with --before.
BEFORE_SCRIPTS = ["loop_overhead.py", "step_profile.py", "multihost_agreement.py"]  # core only


def _table(rows: list[dict]) -> list[str]:
    lines = [
        "| benchmark | candidate | median | min-max | ratio | overhead | target |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        if "candidate" not in r:
            continue
        lines.append(
            f"| {r['benchmark']} | {r['candidate']} | {r['median']:.2f} {r['unit']} | "
            f"{r['min']:.2f}-{r['max']:.2f} | {r['ratio']:.3f} | {_overhead(r)} | "
            f"{r.get('target', '')} |"
        )
    return lines


def _overhead(row: dict) -> str:
    """The time over the baseline, per step (blank for the baseline itself)."""
    if row["candidate"] == row.get("baseline") or "overhead" not in row:
        return ""
    return f"{row['overhead']:+.2f} {row['unit']}"


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f}, {five:.2f}, {fifteen:.2f} (1, 5, 15 min)"


def gpu_section(path: Path) -> list[str]:
    """RESULTS.md's section of a GPU's results, ``path`` (a results file that ``run.py
    --results`` wrote on a GPU machine): its machine, its table (each benchmark named with
    "(GPU)", so that a rerun of the CPU rows with --only leaves it) and its other
    measurements."""
    if not path.exists():
        return []
    lines = ["## On a GPU", "", f"From `{path.name}` (`run.py --results` on the GPU machine).", ""]
    for line in path.read_text().splitlines():
        if line.startswith("## ") and not line.startswith(("## Timings", "## Other")):
            break  # notes, if any: this file's own
        if line.startswith("| ") and not line.startswith("| benchmark |"):
            first, rest = line[2:].split(" | ", 1)
            line = f"| {first} (GPU) | {rest}"
        if line.startswith(("- ", "|")):
            lines.append(line)
        elif line.startswith("## ") and lines[-1] != "":
            lines.append("")
    return [*lines, ""]


def _other(row: dict) -> str:
    return "- " + ", ".join(f"{k}: {v}" for k, v in row.items())


def _merge(text: str, rows: list[dict], note: str) -> str:
    """RESULTS.md with the rows of the benchmarks in ``rows`` replaced (or added at the end
    of their section), the others kept, and ``note`` added to the list at the top."""
    names = {r["benchmark"] for r in rows}
    timings = _table([r for r in rows if "candidate" in r])[2:]
    others = [_other(r) for r in rows if "candidate" not in r]
    lines: list[str] = []
    section = ""
    for line in text.splitlines():
        if line.startswith("## "):
            section = line
        cells = line.split(" | ")
        if line.startswith("| ") and cells[0][2:] in names:
            continue  # a row of a benchmark rerun now
        if line.startswith(f"- {note.split(' rerun alone')[0]} rerun alone"):
            continue  # the note of an earlier rerun of the same scripts
        if section.startswith("## Other") and any(f"benchmark: {n}" in line for n in names):
            continue
        if line.startswith("## Timings") and lines[-2:-1] and lines[-2].startswith("- "):
            lines.insert(len(lines) - 1, f"- {note}")
        if line.startswith("## ") and lines and lines[-1] == "":
            if timings and lines[-2].startswith("|"):  # the end of the timings table
                lines[-1:] = [*timings, ""]
                timings = []
            if others and lines[-2].startswith("- ") and "Other" in lines_section(lines):
                lines[-1:] = [*others, ""]
                others = []
        lines.append(line)
    if others:  # no section after "Other measurements"
        lines += ["", *others]
    return "\n".join(lines) + "\n"


def _matrix_section(results: Path) -> list[str]:
    """The section ``matrix.py`` wrote into ``results`` (empty if none)."""
    text = results.read_text().splitlines() if results.exists() else []
    start = next((i for i, line in enumerate(text) if line.startswith("## The matrix")), None)
    if start is None:
        return []
    end = next((i for i in range(start + 1, len(text)) if text[i].startswith("## ")), len(text))
    while end > start and not text[end - 1]:
        end -= 1
    return text[start:end]


def lines_section(lines: list[str]) -> str:
    """The heading of the section the last of ``lines`` is in."""
    return next((line for line in reversed(lines) if line.startswith("## ")), "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--only", nargs="*", help="run only these scripts")
    parser.add_argument(
        "--before",
        help="a checkout of an earlier ciclo: the engine's benchmarks (BEFORE_SCRIPTS) also run "
        "on its ciclo-core, in the same run, their rows marked '(before)'",
    )
    parser.add_argument(
        "--results",
        default=str(HERE / "RESULTS.md"),
        help="the results file to write (another one for another machine, e.g. a GPU's)",
    )
    args = parser.parse_args()
    scripts = [s for s in SCRIPTS if (HERE / s).exists() and (not args.only or s in args.only)]
    failures = []
    load_before = _load()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rows.jsonl"
        for script in scripts:
            cmd = [sys.executable, str(HERE / script), "--json", str(out)]
            if args.tiny:
                cmd.append("--tiny")
            print(f"== {script}", flush=True)
            start = time.perf_counter()
            result = subprocess.run(cmd, cwd=HERE, check=False)
            print(f"   ({time.perf_counter() - start:.1f} s)", flush=True)
            if result.returncode:
                failures.append(script)
        if args.before:
            before = Path(args.before).resolve()
            for script in [s for s in BEFORE_SCRIPTS if s in scripts]:
                print(f"== {script} (before: {before})", flush=True)
                result = subprocess.run(
                    [sys.executable, str(HERE / script), "--json", str(out) + ".before"],
                    cwd=HERE,
                    check=False,
                    env={**os.environ, "PYTHONPATH": str(before / "packages/ciclo-core/src")},
                )
                if result.returncode:
                    failures.append(f"{script} (before)")
        rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
        earlier = Path(str(out) + ".before")
        if earlier.exists():
            for line in earlier.read_text().splitlines():
                row = json.loads(line)
                if row.get("candidate") != row.get("baseline"):
                    row["candidate"] += " (before)"
                    row["target"] = ""
                    rows.append(row)
            first: dict[str, int] = {}
            for i, row in enumerate(rows):
                first.setdefault(row.get("benchmark", ""), i)
            rows.sort(key=lambda r: first[r.get("benchmark", "")])  # stable: after, before
    if failures:
        sys.exit(f"benchmarks failed: {failures}")
    if args.tiny:
        print(f"{len(rows)} rows from {len(scripts)} benchmark scripts (tiny: RESULTS.md kept)")
        return
    results = Path(args.results)
    if args.only and results.exists():
        note = (
            f"{', '.join(scripts)} rerun alone: load average {load_before} before, {_load()} after"
        )
        results.write_text(_merge(results.read_text(), rows, note))
        print(f"updated the rows of {scripts} in {results}")
        return
    sys.path.insert(0, str(HERE))
    from _harness import machine_info

    info = machine_info()
    info["load average before"] = load_before
    info["load average after"] = _load()
    matrix = _matrix_section(results)
    lines = ["# Benchmark results", "", "Written by `nox -s bench` (`benchmarks/run.py`).", ""]
    lines += [f"- {k}: {v}" for k, v in info.items()]
    lines += ["", "## Timings (medians of alternating runs in one process)", ""]
    lines += _table(rows)
    other = [r for r in rows if "candidate" not in r]
    if other:
        lines += ["", "## Other measurements", ""]
        for r in other:
            lines.append("- " + ", ".join(f"{k}: {v}" for k, v in r.items()))
    if matrix:
        lines += ["", *matrix]
    gpu = gpu_section(HERE / "RESULTS_gpu.md")
    if gpu:
        lines += ["", *gpu[:-1]]
    notes = HERE / "NOTES.md"
    if notes.exists() and results == HERE / "RESULTS.md":  # another machine's: no notes
        lines += ["", notes.read_text().strip()]
    results.write_text("\n".join(lines) + "\n")
    print(f"wrote {results}")


if __name__ == "__main__":
    main()
