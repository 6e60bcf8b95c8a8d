"""The time ledger (``ciclo.goodput``) of the digits CNN through a preemption without warning:
a first process trains and is killed (SIGKILL) two thirds of the way, a second one resumes
from the last checkpoint and finishes; the ledger, kept in the checkpoints, continues, and
counts what the resume redid as ``lost``. Prints the final ledger and plots it.

    python examples/long_run_ledger.py --steps 300 --plot /tmp/ledger.png
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile

from _data import parse_args

import ciclo

BUCKETS = ("startup", "compile", "data", "step", "evaluation", "checkpoint", "callbacks", "lost")


class KillAt:
    """A preemption without warning: SIGKILL at a step (nothing is saved)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, state, batch, elapsed, loop_state) -> None:
        if elapsed.steps == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


def plot(history: ciclo.History, path: str) -> None:
    """The ledger's buckets, cumulated, against the steps: the width of each band is where
    the wall time went."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps, *values = history.collect("steps", *(f"goodput_{b}" for b in BUCKETS))
    goodput = history.collect("goodput")
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.stackplot(steps, values, labels=BUCKETS)
    left.set(xlabel="step", ylabel="seconds (cumulative)", title="Where the wall time went")
    left.legend(loc="upper left", fontsize=8)
    right.plot(steps, goodput, marker="o")
    right.set(xlabel="step", ylabel="step time / wall time", title="Goodput", ylim=(0, 1))
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    args = parse_args(__doc__, steps=300, directory="", plot="", child=-1)
    directory = args.directory or tempfile.mkdtemp(prefix="ciclo-ledger-")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import digits_cnn

    ledger = ciclo.goodput(steps=max(args.steps // 30, 1), summary=True)
    every = max(args.steps // 6, 1)
    if args.child >= 0:  # the first process: killed at step args.child
        digits_cnn.train(directory, args.steps, [ledger, KillAt(args.child)], every)
        return
    first = subprocess.run(
        [
            sys.executable,
            __file__,
            "--steps",
            str(args.steps),
            "--directory",
            directory,
            "--child",
            str(2 * args.steps // 3),
        ],
        check=False,
    )
    print(f"the first process ended with status {first.returncode} (killed: SIGKILL)")
    _, history, _ = digits_cnn.train(directory, args.steps, [ledger], every)
    report = ledger.report()
    print("  ".join(f"{b} {report[b]:.1f} s" for b in BUCKETS))
    print(
        f"goodput {report['goodput']:.2f} of {report['total']:.1f} s; this process's first "
        f"step {report['time_to_first_step']:.1f} s after its start"
    )
    if args.plot:
        plot(history, args.plot)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
