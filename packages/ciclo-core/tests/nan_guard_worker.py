"""One process of a 2-process run in ``test_nan_guards.py``.

Usage: ``python nan_guard_worker.py SCENARIO PROCESS_ID PORT``. A linear regression trained
data-parallel, each process feeding its half of every batch; process 1 does more host work
per step than process 0. Scenarios: ``timed_test`` (``train_loop`` with
``test_duration=ciclo.at(time=0.05)``: refused at once), ``nan`` (a NaN in process 1's half
of batch 10 under ``terminate_on_nan``; prints ``steps N`` at the end).
"""

from __future__ import annotations

import sys
import time


def main(scenario: str, process: int, port: int) -> None:
    from ciclo.testing import join_loopback

    join_loopback(process, 2, port)
    import jax.numpy as jnp
    import numpy as np
    import optax

    import ciclo

    rng = np.random.default_rng(0)
    xs = rng.normal(size=(40, 8, 3)).astype(np.float32)
    ys = (xs @ np.array([1.0, -2.0, 0.5], np.float32)).astype(np.float32)
    xs[10, 4:] = np.nan  # process 1's half of batch 10
    mine = slice(process * 4, (process + 1) * 4)
    batches = [(x[mine], y[mine]) for x, y in zip(xs, ys, strict=True)]

    @ciclo.managed.train_step
    def train_step(state, batch):
        x, y = batch
        return ciclo.logs().add_loss("loss", jnp.mean((x @ state.params["w"] - y) ** 2)), state

    @ciclo.managed.step
    def test_step(state, batch):  # a collective: both processes must run it together
        x, y = batch
        time.sleep(0.01 * process)  # unequal host work
        return ciclo.logs().add_metric("mse", jnp.mean((x @ state.params["w"] - y) ** 2))

    def slow_on_process_1():
        time.sleep(0.02 * process)

    state = ciclo.managed.ManagedState.create(
        params={"w": jnp.zeros(3)}, tx=optax.sgd(0.05), strategy="data-parallel"
    )
    if scenario == "timed_test":
        ciclo.train_loop(
            state,
            batches[:10],
            {ciclo.on_train_step: train_step, ciclo.on_test_step: test_step},
            test_dataset=lambda: batches * 100,
            test_duration=ciclo.at(time=0.05),
            epoch_duration=5,
        )
    elif scenario == "nan":
        guard = ciclo.terminate_on_nan(interval=0)
        tasks = {ciclo.every(1): [train_step, slow_on_process_1, guard]}
        _, _, elapsed = ciclo.loop(state, batches, tasks, agree_every=1)
        print(f"steps {elapsed.steps}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
