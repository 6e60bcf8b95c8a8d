"""A training script as a cluster launches it (docs/multihost.md, "Launching"): one
process of a 2-process job, joined with ``jax.distributed.initialize()`` and no arguments
under SLURM (JAX reads ``SLURM_*``), or from a torchrun-style environment (``MASTER_ADDR``,
``MASTER_PORT``, ``WORLD_SIZE``, ``RANK``). Prints one JSON line of what it trained.

Usage: ``python cluster_worker.py slurm|torchrun``.
"""

from __future__ import annotations

import json
import os
import sys

import jax

if sys.argv[1] == "slurm":
    jax.distributed.initialize()  # SLURM: JAX reads the job's SLURM_* variables
else:  # torchrun-style: the launcher's variables, given to JAX
    jax.distributed.initialize(
        coordinator_address=f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
        num_processes=int(os.environ["WORLD_SIZE"]),
        process_id=int(os.environ["RANK"]),
    )

import jax.numpy as jnp
import numpy as np
import optax

import ciclo


@ciclo.managed.train_step
def train_step(state, batch):
    x, y = batch
    return ciclo.logs().add_loss("loss", jnp.mean((x @ state.params["w"] - y) ** 2))


x = np.random.default_rng(0).normal(size=(8, 3)).astype(np.float32)  # a global batch of 8
y = x @ np.array([1.0, -2.0, 0.5], np.float32)
mine = slice(4 * jax.process_index(), 4 * (jax.process_index() + 1))  # this process's half
state = ciclo.managed.ManagedState.create(
    params={"w": jnp.zeros(3)}, tx=optax.sgd(0.1), strategy="data-parallel"
)
state, history, _ = ciclo.loop(state, [(x[mine], y[mine])] * 4, {ciclo.every(1): train_step})
print(
    json.dumps(
        {
            "process": jax.process_index(),
            "processes": jax.process_count(),
            "w": np.asarray(state.params["w"]).tolist(),
            "loss": history.collect("loss"),
        }
    ),
    flush=True,
)
jax.distributed.shutdown()
