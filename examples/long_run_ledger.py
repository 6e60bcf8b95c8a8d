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

import digits_cnn
from _data import Batches, eval_batches, parse_args

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


def train(directory: str, steps: int, ledger: ciclo.callbacks.Goodput, callbacks: list):
    """``digits_cnn.train`` with the ledger in the tasks, logged 30 times over the run."""
    checkpoint = ciclo.checkpoint(directory, keep=2)
    return ciclo.train_loop(
        digits_cnn.new_state(),
        Batches(digits_cnn.X_TRAIN, digits_cnn.Y_TRAIN, digits_cnn.BATCH_SIZE),
        {ciclo.every(max(steps // 6, 1)): checkpoint, ciclo.every(max(steps // 30, 1)): ledger},
        test_dataset=lambda: eval_batches(digits_cnn.X_TEST, digits_cnn.Y_TEST),
        epoch_duration=max(steps // 4, 1),
        callbacks=callbacks,
        stop=steps,
        resume=checkpoint,
    )


def main() -> None:
    args = parse_args(__doc__, steps=300, directory="", plot="", process="")
    directory = args.directory or tempfile.mkdtemp(prefix="ciclo-ledger-")
    if not args.process:  # each run is a process of its own, as after a real preemption
        command = [sys.executable, __file__, "--steps", str(args.steps), "--directory", directory]
        first = subprocess.run([*command, "--process", "first"], check=False)
        print(f"the first process ended with status {first.returncode} (-9: SIGKILL)")
        subprocess.run([*command, "--process", "resumed", "--plot", args.plot], check=True)
        return
    ledger = ciclo.goodput(summary=True)
    # Both processes have the same tasks (a resume needs them); the first is killed.
    kill_at = 2 * args.steps // 3 if args.process == "first" else -1
    _, history, _ = train(directory, args.steps, ledger, [KillAt(kill_at)])
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
