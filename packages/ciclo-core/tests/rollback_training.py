"""A run with a poison batch under ``rollback_on_nan``, for ``test_rollback.py``: in the
test's process, as a script the test kills (``python rollback_training.py DIRECTORY
[--die-at STEP]``, one line ``step N`` per step on stdout), and as one process of a
2-process job (``python rollback_training.py DIRECTORY --process I --port P``, writing
``result{I}.json`` into DIRECTORY).

A linear regression; batch ``POISON`` holds NaN inputs, so its loss and its update are
NaN. The state counts, per batch, how many updates it took part in (``seen``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import numpy as np

BATCHES, BATCH, DIM = 40, 8, 3
POISON = 13
EVERY = 5  # steps between checkpoints
STEPS = 30  # the run's stop: rollbacks skip batches, so it ends before the data does
FETCH_EVERY = 16  # commits between the history's fetches (fetch_interval=0): a NaN is late


def batches(
    process: int = 0, count: int = 1, *, poison: tuple[int, ...] = (POISON,)
) -> list[dict[str, np.ndarray]]:
    """The batches of process ``process`` of ``count`` (its part of every batch), with NaN
    inputs in the batches ``poison``."""
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(BATCHES, BATCH, DIM)).astype(np.float32)
    ys = (xs @ np.array([1.0, -2.0, 0.5], np.float32) + 0.3).astype(np.float32)
    for index in poison:
        xs[index, BATCH // 2 :] = np.nan  # in the second half: process 1's part of it
    part = BATCH // count
    mine = slice(process * part, (process + 1) * part)
    ids = np.arange(BATCHES, dtype=np.int32)
    return [
        {"x": x[mine], "y": y[mine], "id": np.full((part,), i, np.int32)}
        for x, y, i in zip(xs, ys, ids, strict=True)
    ]


def tasks(
    directory: str,
    *,
    managed: bool = False,
    die_at: int | None = None,
    report: bool = False,
    **rollback: Any,
) -> tuple[Any, dict]:
    """The initial state and the tasks of the run (``managed``: a data-parallel managed
    state, for several processes; ``rollback``: options of ``rollback_on_nan``)."""
    import jax
    import jax.numpy as jnp
    import optax
    from jax.experimental import multihost_utils

    import ciclo

    if managed:

        @ciclo.managed.train_step
        def train_step(state: Any, batch: Any) -> Any:
            pred = batch["x"] @ state.params["w"] + state.params["b"]
            return ciclo.logs().add_loss("loss", jnp.mean((pred - batch["y"]) ** 2)), state

        state = ciclo.managed.ManagedState.create(
            params={"w": jnp.zeros(DIM), "b": jnp.zeros(())},
            tx=optax.sgd(0.05),
            strategy="data-parallel",
        )
        step: Any = train_step
    else:

        @jax.jit
        def plain_step(state: Any, batch: Any) -> Any:
            def loss_fn(w: jax.Array) -> jax.Array:
                return jnp.mean((batch["x"] @ w - batch["y"]) ** 2)

            loss, grad = jax.value_and_grad(loss_fn)(state["w"])
            seen = state["seen"].at[batch["id"][0]].add(1)
            return ciclo.logs().add_loss("loss", loss), {
                "w": state["w"] - 0.05 * grad,
                "seen": seen,
            }

        state = {"w": jnp.zeros(DIM), "seen": jnp.zeros(BATCHES, jnp.int32)}
        step = plain_step
    ckpt = ciclo.checkpoint(directory, keep=None, async_save=False)
    rollback = ciclo.rollback_on_nan(ckpt, verbose=False, **rollback)

    def report(state: Any, batch: Any, elapsed: Any, loop_state: Any) -> None:
        rolled_back = loop_state.skipped_batches > 0
        if die_at is not None and rolled_back and elapsed.steps == die_at:
            # Every process reaches this step before any dies: else one behind would wait on
            # the collectives of the dead and end by the fault path, not by its own kill.
            multihost_utils.sync_global_devices(f"die at {die_at}")
            os.kill(os.getpid(), signal.SIGKILL)
        if report:
            print(f"step {elapsed.steps} rolled_back {int(rolled_back)}", flush=True)

    return state, {ciclo.every(1): [step, rollback, report], ciclo.every(EVERY): ckpt}


def run(
    directory: str,
    *,
    resume: bool = False,
    data: Any = None,
    fetch_interval: float = 0.0,
    **options: Any,
) -> Any:
    """Runs (or resumes) the run in ``directory``; returns ``(state, history, elapsed)``."""
    import ciclo

    state, todo = tasks(directory, **options)
    return ciclo.loop(
        state,
        batches() if data is None else data,
        todo,
        stop=STEPS,
        history=ciclo.history(fetch_interval=fetch_interval),
        resume=directory if resume else None,
    )


def fingerprint(state: Any, history: Any, elapsed: Any) -> dict[str, Any]:
    """What two runs must share to be the same run."""
    steps, losses = history.collect("steps", "loss")
    record = history.collect("steps", "rollbacks", "skipped_batches", "skipped_from", "fault_step")
    return {
        "w": np.asarray(state["w"]).tolist(),
        "seen": np.asarray(state["seen"]).tolist(),
        "steps": elapsed.steps,
        "samples": elapsed.samples,
        "losses": list(zip(steps, losses, strict=True)),
        "rollbacks": [list(r) for r in zip(*record, strict=True)],
    }


def _process_main(directory: str, process: int, port: int, die_at: int | None) -> None:
    """One process of a 2-process job: data-parallel, each process its half of each batch."""
    from ciclo.testing import join_loopback

    join_loopback(process, 2, port)
    import ciclo
    from ciclo._checkpoint import _rollback

    # It looks at the history at every step; only process 0's history fetches often, so
    # process 0 notices the NaN mid-run and process 1 follows the agreed stop.
    _rollback.LOOK_SECONDS = 0.0
    state, todo = tasks(os.path.join(directory, "ckpt"), managed=True, die_at=die_at)
    drawn: list[int] = []
    next(iter(todo.values())).append(lambda s, b, elapsed: drawn.append(elapsed.steps))
    state, history, elapsed = ciclo.loop(
        state,
        batches(process, 2),
        todo,
        stop=STEPS,
        history=ciclo.history(fetch_interval=0.0 if process == 0 else 60.0),
        resume=os.path.join(directory, "ckpt"),
        agree_every=2,  # a requested stop takes effect within 3 steps
    )
    back = [i for i in range(1, len(drawn)) if drawn[i] < drawn[i - 1]]
    record = history.collect("steps", "rollbacks", "skipped_batches", "skipped_from", "fault_step")
    result = {
        "w": np.asarray(state.params["w"]).tolist(),
        "b": float(state.params["b"]),
        "steps": elapsed.steps,
        "losses": history.collect("loss"),
        "rollbacks": [list(r) for r in zip(*record, strict=True)],
        "stopped_after": [drawn[i - 1] for i in back],  # the step the engine stopped after
    }
    Path(directory, f"result{process}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("directory")
    parser.add_argument("--die-at", type=int)
    parser.add_argument("--process", type=int)
    parser.add_argument("--port", type=int)
    args = parser.parse_args()
    if args.process is not None:
        _process_main(args.directory, args.process, args.port, args.die_at)
        sys.exit(0)
    run(args.directory, resume=True, die_at=args.die_at, report=True)
