"""A tiny training run for the checkpoint tests: imported by them, and run as a script in
a subprocess that the tests kill.

    python checkpoint_training.py DIRECTORY [--dataset list|generator|stateful]
        [--lockstep] [--hang-on-save STEP]

The run has everything exact resume must carry over: an RNG key in the state, batches of
varying size (so sample-based schedules cross boundaries between steps), a schedule on
samples, a stateful callback whose logs depend on its state, and a checkpoint every
``EVERY`` steps. With ``--lockstep`` the script waits after each step for a line on its
stdin, so that the test that drives it decides where it is killed (no race with a sleep).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import ciclo

STEPS = 16
EVERY = 4


def make_batch(i: int) -> tuple[np.ndarray, np.ndarray]:
    """``(x, size)``: ``size`` (2 to 4) real rows of ``x``, padded to 4 rows so that one
    compiled step serves every batch."""
    size = 2 + i % 3
    x = np.zeros((4, 4), np.float32)
    x[:size] = np.random.default_rng(i).normal(size=(size, 4))
    return x, np.int32(size)


def batch_size(batch: tuple[np.ndarray, np.ndarray]) -> int:
    return int(batch[1])


def batches() -> Iterator[Any]:
    for i in range(STEPS):
        yield make_batch(i)


class StatefulBatches:
    """A dataset following the ``state_dict``/``load_state_dict`` protocol."""

    def __init__(self) -> None:
        self.position = 0

    def __iter__(self) -> Iterator[Any]:
        while self.position < STEPS:
            self.position += 1
            yield make_batch(self.position - 1)

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = state["position"]


def dataset(kind: str) -> Any:
    if kind == "list":
        return [make_batch(i) for i in range(STEPS)]
    if kind == "generator":
        return batches()
    return StatefulBatches()


def init_state() -> dict[str, Any]:
    return {"w": jnp.ones(4), "key": jax.random.key(0), "count": jnp.zeros((), jnp.int32)}


@jax.jit
def train_step(state: dict[str, Any], batch: Any) -> Any:
    x, size = batch
    key, noise_key = jax.random.split(state["key"])

    def loss_fn(w: jax.Array) -> jax.Array:
        rows = jnp.arange(4) < size
        return jnp.sum(jnp.where(rows, (x @ w - 1.0) ** 2, 0.0)) / size

    loss, grad = jax.value_and_grad(loss_fn)(state["w"])
    w = state["w"] - 0.1 * grad + 0.01 * jax.random.normal(noise_key, (4,))
    logs = ciclo.logs().add_loss("loss", loss)
    return logs, {"w": w, "key": key, "count": state["count"] + 1}


class SampleCounter:
    """A stateful callback: logs how many samples it has seen when it fires."""

    def __init__(self) -> None:
        self.seen = 0
        self.calls = 0

    def __call__(self, state: Any, batch: Any) -> Any:
        self.seen += batch_size(batch)
        self.calls += 1
        return ciclo.logs().add_entry("counter", "seen", self.seen * 100 + self.calls)

    def state_dict(self) -> dict[str, int]:
        return {"seen": self.seen, "calls": self.calls}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.seen, self.calls = state["seen"], state["calls"]


def run(
    directory: str,
    *,
    data: str = "list",
    resume: bool = False,
    stop: int = STEPS,
    lockstep: bool = False,
    verbose: bool = False,
) -> tuple[Any, ciclo.History, ciclo.Elapsed]:
    def report(state: Any, batch: Any, elapsed: ciclo.Elapsed) -> None:
        if verbose:
            print(f"step {elapsed.steps}", flush=True)
        if lockstep:
            sys.stdin.readline()  # the test's go-ahead (or end of input: go on)

    tasks = {
        ciclo.every(1): [train_step, report],
        ciclo.every(samples=7): SampleCounter(),
        ciclo.every(EVERY): ciclo.checkpoint(directory, keep=2),
    }
    return ciclo.loop(
        init_state(),
        dataset(data),
        tasks,
        stop=stop,
        batch_size_fn=batch_size,
        resume=directory if resume else None,
    )


def fingerprint(state: Any, history: ciclo.History, elapsed: ciclo.Elapsed) -> dict[str, Any]:
    """What must be identical between an interrupted-and-resumed run and a straight one:
    the state's bytes, every history value but wall-clock times, and the counts."""
    rows = history.state_dict()
    columns = {
        key: (column["start"], _plain(column["rows"]), _plain(column["values"]))
        for key, column in rows["columns"].items()
    }
    return {
        "w": np.asarray(state["w"]).tobytes(),
        "key": np.asarray(jax.random.key_data(state["key"])).tobytes(),
        "count": int(state["count"]),
        "rows": rows["num_rows"],
        "steps": _plain(rows["elapsed"]["steps"]),
        "samples": _plain(rows["elapsed"]["samples"]),
        "columns": columns,
        "elapsed": (elapsed.steps, elapsed.samples),
    }


@functools.cache
def reference() -> dict[str, Any]:
    """The fingerprint of an uninterrupted run (computed once per process)."""
    with tempfile.TemporaryDirectory() as directory:
        return fingerprint(*run(directory))


def _plain(values: Any) -> Any:
    return None if values is None else np.asarray(values).tobytes()


def hang_on_save(step: int, marker: str) -> None:
    """Makes the background write of checkpoint ``step`` hang just before it is committed
    (its files written to a temporary directory, not yet renamed), after creating
    ``marker``: the test then kills the process in the middle of that write."""
    from orbax.checkpoint._src.path import atomicity

    finalize = atomicity.AtomicRenameTemporaryPath.finalize

    async def hanging(self: Any) -> None:
        if self.get_final().name == str(step):
            with open(marker, "w") as f:
                f.write(str(self.get()))
            await asyncio.sleep(3600)
        await finalize(self)

    atomicity.AtomicRenameTemporaryPath.finalize = hanging  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("directory")
    parser.add_argument("--dataset", default="list")
    parser.add_argument("--lockstep", action="store_true")
    parser.add_argument("--hang-on-save", type=int, default=None)
    args = parser.parse_args()
    if args.hang_on_save is not None:
        hang_on_save(args.hang_on_save, os.path.join(args.directory + ".hanging"))
    run(args.directory, data=args.dataset, lockstep=args.lockstep, verbose=True)
    print("done", flush=True)


if __name__ == "__main__":
    main()
