"""The walk of one batch through ciclo: which of its functions run, in order, for one step of
``ciclo.loop(state, dataset, {ciclo.every(1): train_step, **ciclo.keras_bar(total)})``
with a ``ManagedState`` under the ``jit`` strategy, traced (``sys.setprofile``) at a step in
the middle of the run, and how many of ciclo's files it crosses. docs/architecture.md's
"The path of one batch" is written from this trace.

    python benchmarks/batch_walk.py          # prints the trace and the count
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
import optax

import ciclo

ROOT = Path(ciclo.__file__).parent
TRACED_STEP = 50


def walk() -> list[tuple[str, str]]:
    """``(module file, function)`` of each call into ciclo during step ``TRACED_STEP``."""
    calls: list[tuple[str, str]] = []
    tracing = False

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and tracing:
            path = Path(frame.f_code.co_filename)
            if ROOT in path.parents:
                calls.append((str(path.relative_to(ROOT)), frame.f_code.co_qualname))

    def start(state: Any, batch: Any, elapsed: ciclo.Elapsed) -> None:
        nonlocal tracing
        tracing = elapsed.steps == TRACED_STEP - 1  # from the end of the step before

    @ciclo.managed.train_step
    def train_step(state: Any, batch: Any) -> Any:
        x, y = batch
        loss = jnp.mean((x @ state.params["w"] - y) ** 2)
        return ciclo.logs().add_loss("loss", loss), state

    state = ciclo.managed.ManagedState.create(
        params={"w": jnp.zeros(4)}, tx=optax.sgd(0.1), strategy="jit"
    )
    batches = [(np.ones((8, 4), np.float32), np.ones(8, np.float32))] * (2 * TRACED_STEP)
    bar = ciclo.keras_bar(total=len(batches), file=open("/dev/null", "w"))  # noqa: SIM115
    sys.setprofile(profile)
    try:
        ciclo.loop(state, batches, {ciclo.every(1): [start, train_step], **bar})
    finally:
        sys.setprofile(None)
    # from the first call after `start` of step TRACED_STEP - 1 ended to `start` of the next
    ends = [i for i, (_, name) in enumerate(calls) if name.endswith("start")]
    return calls[: ends[1]] if len(ends) > 1 else calls


def main() -> None:
    calls = walk()
    files = sorted({path for path, _ in calls})
    for path, name in calls:
        print(f"{path:32s} {name}")
    print(f"\n{len(calls)} calls into ciclo, in {len(files)} files: {', '.join(files)}")


if __name__ == "__main__":
    main()
