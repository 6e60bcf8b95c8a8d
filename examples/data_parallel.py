"""Data parallelism on 8 simulated CPU devices: the Flax MLP of ``flax_linen.py`` trained
with ``strategy="data-parallel"`` (``jax.jit`` with ``NamedSharding`` over a ``Mesh``)
gives what ``"jit"`` on one device gives; fused steps (``steps_per_call``) and gradient
accumulation too. On a machine with accelerators, drop the two environment lines.

    python examples/data_parallel.py --steps 200
"""

from __future__ import annotations

import os

# Before JAX is imported: 8 CPU devices stand in for 8 accelerators.
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ["JAX_PLATFORMS"] = "cpu"

import time

import jax
import numpy as np
import optax
from _data import Batches, digits, eval_batches, parse_args
from flax_linen import MLP

import ciclo
import ciclo_flax

STRATEGIES = [
    ("jit", {}),
    ("data-parallel", {}),
    ("data-parallel", {"steps_per_call": 8}),
    # Two micro-batches of 32 per update: the same gradients for per-example losses, but
    # batch norm normalizes each micro-batch by its own statistics, so the losses differ.
    ("data-parallel", {"accumulate_steps": 2}),
]


def main() -> None:
    args = parse_args(__doc__, steps=200, batch_size=64)
    print(f"{jax.device_count()} devices: {jax.devices()[0].platform}")
    x_train, y_train, x_test, y_test = digits()
    state = ciclo_flax.create_state(
        MLP(),
        x_train[:1],
        optax.sgd(0.1, momentum=0.9),
        losses={"loss": optax.softmax_cross_entropy_with_integer_labels},
        metrics={"accuracy": lambda logits, labels: logits.argmax(-1) == labels},
        key=0,
    )
    epoch = min(len(x_train) // args.batch_size, args.steps)
    reference = None
    for name, options in STRATEGIES:
        start = time.perf_counter()
        trained, history, _ = ciclo.train_loop(
            state.with_strategy(name, **options),  # the same state, placed for the strategy
            Batches(x_train, y_train, args.batch_size),  # batches of 64 split over 8 devices
            test_dataset=lambda: eval_batches(x_test, y_test),
            epoch_duration=epoch,
            stop=args.steps,
        )
        loss = np.array(history.collect("loss"))
        reference = loss if reference is None else reference
        print(
            f"{name:13s} {options!s:26s} test accuracy "
            f"{history.collect('accuracy_test')[-1]:.4f}  max |loss - jit loss| "
            f"{np.abs(loss - reference).max():.1e}  {time.perf_counter() - start:5.1f}s"
        )
    kernel = trained.params["Dense_0"]["kernel"]
    devices = len(kernel.devices())
    print(f"params are global arrays, replicated: {kernel.sharding.spec} on {devices} devices")


if __name__ == "__main__":
    main()
