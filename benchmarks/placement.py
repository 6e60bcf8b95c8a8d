"""Placing a batch under ``data-parallel``: the strategy's ``place_batch`` against a plain
``jax.device_put(batch, sharding)`` of the same host batch on the same data-parallel sharding.

The strategy also checks that every leaf divides over the devices and replicates scalars; it
does that once per batch structure (shapes), so per batch it should cost what
``device_put`` costs. Run on one device as on many (``XLA_FLAGS=
--xla_force_host_platform_device_count=8`` gives CPU devices).
Target: ``place_batch`` within 5% of ``jax.device_put`` per batch (ratio <= 1.05).
"""

from __future__ import annotations

import jax
import numpy as np
from _harness import compare, emit, parse_args
from jax.sharding import NamedSharding, PartitionSpec

import ciclo


def run(name: str, batch_size: int, features: int, batches: int, repeats: int) -> list[dict]:
    strategy = ciclo.managed.data_parallel()
    mesh = jax.make_mesh((jax.device_count(),), ("data",))
    sharding = NamedSharding(mesh, PartitionSpec("data"))
    rng = np.random.default_rng(0)
    host = [
        (
            rng.normal(size=(batch_size, features)).astype(np.float32),
            rng.integers(0, 10, batch_size).astype(np.int32),
        )
        for _ in range(batches)
    ]

    def device_put():
        jax.block_until_ready([jax.device_put(batch, sharding) for batch in host])

    def place_batch():
        jax.block_until_ready([strategy.place_batch(batch) for batch in host])

    return compare(
        name,
        {
            "jax.device_put(batch, sharding)": device_put,
            "data-parallel place_batch": place_batch,
        },
        repeats=repeats,
        per=batches,
        unit="us",
        target="ratio <= 1.05",
    )


def main() -> None:
    args = parse_args(__doc__ or "")
    tiny = " (tiny)" if args.tiny else ""
    batches, repeats = (5, 2) if args.tiny else (200, 31)
    devices = f"{jax.device_count()} devices"
    emit(run(f"batch placement 32x784, {devices}{tiny}", 32, 784, batches, repeats), args.json)


if __name__ == "__main__":
    main()
