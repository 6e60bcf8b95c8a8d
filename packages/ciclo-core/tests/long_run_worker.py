"""One process of the long-run tests (``test_goodput.py``, ``test_watchdog.py``).

Usage: ``python long_run_worker.py SCENARIO OUT_DIR [OPTIONS_JSON] [PROCESS_ID PORT]``; with a
process id and a port, the process joins a 2-process job on loopback first. Lines printed
to stdout are JSON records the tests read (``{"step": n, "time": t}``, ``{"report": ...}``).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path


def emit(**record) -> None:
    print(json.dumps(record), flush=True)


class FileWriter:
    """A metric writer appending each scalar row to a JSON-lines file."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write_scalars(self, step, scalars) -> None:
        with open(self.path, "a") as file:
            file.write(json.dumps({"step": int(step), **{k: float(v) for k, v in scalars.items()}}))
            file.write("\n")

    def flush(self) -> None:
        pass


def block_forever() -> None:
    """A callback's work that never returns (the watchdog names it in the stack)."""
    threading.Event().wait()


def main(scenario: str, out: Path, options: dict, process: int | None, port: int | None) -> None:
    if process is not None:
        from ciclo.testing import join_loopback

        join_loopback(process, 2, port)
    import jax
    import numpy as np

    import ciclo

    steps = options.get("steps", 40)
    sleep = options.get("sleep", 0.0)
    if process is not None:
        sleep = options.get("sleeps", [sleep, sleep])[process]
    data = [np.ones((2,), np.float32)] * steps

    @jax.jit
    def train_step(state, batch):
        return ciclo.logs().add_metric("x", state), state + batch.sum()

    def pace(state, batch, elapsed):
        if elapsed.steps == 0:
            time.sleep(options.get("first_sleep", 0.0))  # a slow first compilation
        time.sleep(sleep)
        emit(step=elapsed.steps, time=time.time())
        if elapsed.steps == options.get("block_at", -1) and process in (None, options.get("stuck")):
            block_forever()

    def evaluate(state):
        time.sleep(options.get("evaluation_sleep", 0.0))
        return ciclo.loop(state, [np.ones(1)] * 2, {ciclo.every(1): lambda s, b: s})

    per_step = [train_step, pace]
    tasks: dict = {ciclo.every(1): per_step}
    if "evaluate_every" in options:
        tasks[ciclo.every(options["evaluate_every"])] = ciclo.inner_loop("test", evaluate)
    ledger = ciclo.goodput(steps=options.get("ledger_steps", 1000))
    tasks.update(ledger)
    if "checkpoint_every" in options:
        tasks[ciclo.every(options["checkpoint_every"])] = ciclo.checkpoint(out / "ckpt", keep=2)
    if options.get("hang_writes"):  # a checkpoint write that never returns (a hung disk)
        from ciclo._checkpoint import _format

        _format.write = lambda *args, **kwargs: block_forever()
    if "watchdog" in options:
        tasks.update(ciclo.watchdog(**options["watchdog"]))
        per_step.append(ciclo.writer_logger(FileWriter(out / "events.jsonl")))
    resume = out / "ckpt" if "checkpoint_every" in options else None
    time.sleep(options.get("startup_sleep", 0.0))  # a longer start-up than the imports alone
    _, history, elapsed = ciclo.loop(
        jax.numpy.zeros(()),
        data,
        tasks,
        resume=resume,
        fault_timeout=options.get("fault_timeout", 60.0),
    )
    emit(report=ledger.report(), steps=elapsed.steps, history=history.collect("goodput"))
    if process is not None:
        emit(
            straggler=history.collect("goodput_straggler"),
            slowest=history.collect("goodput_slowest_process"),
        )


if __name__ == "__main__":
    args = sys.argv[1:]
    main(
        args[0],
        Path(args[1]),
        json.loads(args[2]) if len(args) > 2 else {},
        int(args[3]) if len(args) > 3 else None,
        int(args[4]) if len(args) > 4 else None,
    )
