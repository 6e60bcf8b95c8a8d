"""One process of a run in ``test_topology.py``: a small two-layer model with dropout
trained on a list of global batches, each process feeding its part, checkpointed every
``EVERY`` steps and resumed from ``OUT_DIR/<strategy>`` on whatever topology it runs on;
once per strategy, so that one start of the processes serves them all.

Usage: ``python topology_worker.py STRATEGIES PROCESSES PROCESS_ID PORT OUT_DIR STOP [lazy]``,
with STRATEGIES a comma-separated list of ``sharded`` (a 2 x 2 ``("data", "model")`` mesh
and rules), ``fsdp`` and ``data-parallel``, STOP a step count or ``none``, and ``lazy`` to
give the state as ``ciclo.lazy_state``. Writes ``OUT_DIR/result{PROCESS_ID}.json``:
``{strategy: result}``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

STEPS, BATCH, DIM, HIDDEN, EVERY = 12, 8, 4, 8, 4


def train(
    strategy_name: str, batches: list[Any], directory: Path, stop: int | None, lazy: bool
) -> dict:
    """Trains under ``strategy_name``, resuming from ``directory``; returns what it ended
    with."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from jax.experimental import multihost_utils
    from jax.sharding import AxisType
    from jax.sharding import PartitionSpec as P

    import ciclo

    if strategy_name == "sharded":
        mesh = jax.make_mesh((2, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
        rules = [
            ("dense1/kernel", P(None, "model")),  # column-parallel
            ("dense1/bias", P("model")),
            ("dense2/kernel", P("model", None)),  # row-parallel
        ]
        strategy = ciclo.managed.sharded(mesh, rules)
    else:  # every device on "data"
        strategy = ciclo.managed.fsdp() if strategy_name == "fsdp" else "data-parallel"
    init = np.random.default_rng(1)
    params = {
        "dense1": {
            "kernel": jnp.asarray(init.normal(size=(DIM, HIDDEN)) * 0.5, jnp.float32),
            "bias": jnp.zeros(HIDDEN),
        },
        "dense2": {
            "kernel": jnp.asarray(init.normal(size=(HIDDEN, 1)) * 0.5, jnp.float32),
            "bias": jnp.zeros(1),
        },
    }

    @ciclo.managed.train_step
    def train_step(state, batch):
        x, y = batch
        p = state.params
        hidden = jnp.tanh(x @ p["dense1"]["kernel"] + p["dense1"]["bias"])
        # dropout: the same mask of the global batch on any topology (the step's key)
        keep = jax.random.bernoulli(state.step_key("dropout"), 0.75, hidden.shape)
        hidden = jnp.where(keep, hidden / 0.75, 0.0)
        pred = (hidden @ p["dense2"]["kernel"] + p["dense2"]["bias"])[:, 0]
        return ciclo.logs().add_loss("loss", jnp.mean((pred - y) ** 2)), state

    built = []

    def new_state():
        built.append(not isinstance(params["dense1"]["bias"] + 0, jax.core.Tracer))
        return ciclo.managed.ManagedState.create(
            params=params, tx=optax.adam(0.05), key=0, strategy=strategy
        )

    ckpt = ciclo.checkpoint(directory, keep=1, save_on_end=False)
    state, history, elapsed = ciclo.loop(
        ciclo.lazy_state(new_state) if lazy else new_state(),
        batches,
        {ciclo.every(1): train_step, ciclo.every(EVERY): ckpt},
        stop=stop,
        resume=ckpt,
    )
    gathered = multihost_utils.process_allgather(state.params, tiled=True)
    kernel = state.params["dense1"]["kernel"]
    moment = state.opt_state[0].mu["dense1"]["kernel"]
    return {
        "processes": jax.process_count(),
        "devices": jax.device_count(),
        "steps": elapsed.steps,
        "history_steps": [int(s) for s in history.collect("steps")],
        "loss": [float(v) for v in history.collect("loss")],
        "params": jax.tree.map(lambda a: np.asarray(a).tolist(), gathered),
        "kernel_spec": str(kernel.sharding.spec),
        "moment_spec": str(moment.sharding.spec),
        "built": built,  # per call of new_state: run (True) or only traced (False)
    }


def main(
    strategies: str,
    processes: int,
    process: int,
    port: int,
    out: Path,
    stop: int | None,
    lazy: bool,
) -> None:
    if processes > 1:
        from ciclo.testing import join_loopback

        join_loopback(process, processes, port)
    import jax
    import numpy as np

    rng = np.random.default_rng(0)
    xs = rng.normal(size=(STEPS, BATCH, DIM)).astype(np.float32)
    ys = np.sin(xs @ rng.normal(size=DIM)).astype(np.float32)
    part = BATCH // processes
    mine = slice(process * part, (process + 1) * part)
    batches = [(x[mine], y[mine]) for x, y in zip(xs, ys, strict=True)]  # a list: by index
    results = {name: train(name, batches, out / name, stop, lazy) for name in strategies.split(",")}
    (out / f"result{process}.json").write_text(json.dumps(results))
    if processes > 1:
        jax.distributed.shutdown()


if __name__ == "__main__":
    strategies, processes, process, port, out, stop = sys.argv[1:7]
    lazy = sys.argv[7:8] == ["lazy"]
    main(
        strategies,
        int(processes),
        int(process),
        int(port),
        Path(out),
        None if stop == "none" else int(stop),
        lazy,
    )
