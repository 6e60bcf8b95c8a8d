"""A checkpointed run in a fresh process that reports what JAX's persistent compilation cache
did, from JAX's own monitoring events (test_compilation_cache.py runs it twice: a start and a
resume).

    python compilation_cache_run.py DIRECTORY STEPS [--no-cache]

Prints one JSON line: ``{"requests", "hits", "writes", "steps", "cache"}``: the compilations
that asked the cache, those it answered, the entries written, the steps the run ended at and
the checkpoint's ``compilation_cache``.
"""

from __future__ import annotations

import json
import sys
from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np

import ciclo

EVENTS = {
    "/jax/compilation_cache/compile_requests_use_cache": "requests",
    "/jax/compilation_cache/cache_hits": "hits",
    "/jax/compilation_cache/cache_misses": "writes",  # recorded as an entry is written
}


def main(directory: str, steps: int, cache: bool) -> None:
    counts: Counter[str] = Counter()
    jax.monitoring.register_event_listener(
        lambda event, **_: counts.update([EVENTS[event]] if event in EVENTS else [])
    )
    ckpt = ciclo.checkpoint(directory, keep=1, async_save=False, compilation_cache=cache)
    state = {"w": jnp.zeros((8, 8)), "b": jnp.arange(8.0)}  # eager ops: compiled too

    @jax.jit
    def train_step(state, batch):
        loss, grads = jax.value_and_grad(lambda s: jnp.mean((batch @ s["w"] + s["b"]) ** 2))(state)
        new = jax.tree.map(lambda p, g: p - 0.1 * g, state, grads)
        return ciclo.logs().add_loss("loss", loss), new

    batches = [np.full((4, 8), i / 10, np.float32) for i in range(steps)]
    _, _, elapsed = ciclo.loop(
        state, batches, {ciclo.every(1): train_step, ciclo.every(5): ckpt}, resume=ckpt
    )
    print(json.dumps({**counts, "steps": elapsed.steps, "cache": ckpt.compilation_cache}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), "--no-cache" not in sys.argv)
