"""A two-phase fine-tuning run for tests/test_fine_tuning_adapters.py: a Flax Linen MLP
loads pretrained weights but for its new head, trains the head alone (checkpoints in
``<directory>/frozen``), then everything (``<directory>/unfrozen``), each phase resumed
from its checkpoints; prints ``step <phase> <n>`` per step and ``final <name> <sha256>``
per parameter at the end."""

from __future__ import annotations

import hashlib
import sys
import time
from pathlib import Path

import flax.linen as nn
import jax
import numpy as np
import optax

import ciclo
import ciclo_flax


class MLP(nn.Module):
    classes: int

    @nn.compact
    def __call__(self, x):
        return nn.Dense(self.classes, name="head")(nn.relu(nn.Dense(32, name="body")(x)))


def batches(n: int, classes: int) -> list:
    rng = np.random.default_rng(classes)
    return [
        (
            rng.normal(size=(16, 12)).astype(np.float32),
            rng.integers(0, classes, 16).astype(np.int32),
        )
        for _ in range(n)
    ]


def create(classes: int, **options):
    loss = optax.softmax_cross_entropy_with_integer_labels
    inputs = np.zeros((1, 12), np.float32)
    return ciclo_flax.create_state(
        MLP(classes), inputs, optax.adam(1e-2), losses={"loss": loss}, **options
    )


def main(directory: Path) -> None:
    pretrained, _, _ = ciclo.train_loop(create(5, key=1), batches(4, 5))
    state = create(10, trainable="^head/")
    state = ciclo.load_weights(state, pretrained, mismatched="keep")
    for phase in ("frozen", "unfrozen"):
        if phase == "unfrozen":
            state = state.with_trainable(None)

        def report(elapsed: ciclo.Elapsed, phase: str = phase) -> None:
            print(f"step {phase} {elapsed.steps}", flush=True)
            time.sleep(0.05)

        tasks = {
            ciclo.every(1): [state.train_step, lambda state, batch, elapsed: report(elapsed)],
            ciclo.every(2): ciclo.checkpoint(directory / phase, async_save=False),
        }
        state, _, _ = ciclo.loop(state, batches(10, 10), tasks, resume=directory / phase)
    for path, value in jax.tree_util.tree_flatten_with_path(state.params)[0]:
        digest = hashlib.sha256(np.asarray(value).tobytes()).hexdigest()
        print(f"final {ciclo.managed.key_path(path)} {digest}", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
