"""One process of a 2-process run in ``test_multihost_agreement.py``.

Usage: ``python multihost_loop_worker.py SCENARIO PROCESS_ID PORT OUT_DIR [OPTIONS_JSON]``.
Each process feeds its half of every batch of a linear regression trained data-parallel, and
writes what it saw to ``OUT_DIR/result{PROCESS_ID}.json`` from ``on_end``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

STEPS, BATCH, DIM = 40, 8, 3


class Positioned:
    """A dataset with its own position (``state_dict``/``load_state_dict``), per process."""

    def __init__(self, batches, process, seen):
        self.batches, self.process, self.seen, self.position = batches, process, seen, 0

    def __iter__(self):
        return self

    def __next__(self):
        if self.position >= len(self.batches):
            raise StopIteration
        self.position += 1
        return self.batches[self.position - 1]

    def state_dict(self):
        return {"process": self.process, "position": self.position}

    def load_state_dict(self, state):
        self.seen["loaded"] = dict(state)
        self.position = state["position"]


def main(scenario: str, process: int, port: int, out_dir: str, options: dict) -> None:
    from ciclo.testing import join_loopback

    join_loopback(process, 2, port)
    from collections import Counter

    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    import ciclo

    cache: Counter[str] = Counter()  # what JAX's persistent compilation cache did
    jax.monitoring.register_event_listener(
        lambda event, **_: cache.update([event.rpartition("/")[2]] if "cache/" in event else [])
    )
    out = Path(out_dir)
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(STEPS, BATCH, DIM)).astype(np.float32)
    ys = (xs @ np.array([1.0, -2.0, 0.5], np.float32) + 0.3).astype(np.float32)
    if "nan_at" in options:  # a NaN in process 1's half of one batch
        xs[options["nan_at"], BATCH // 2 :] = np.nan
    half = BATCH // 2
    mine = slice(process * half, (process + 1) * half)
    batches = [(x[mine], y[mine]) for x, y in zip(xs, ys, strict=True)]

    @ciclo.managed.train_step
    def train_step(state, batch):
        x, y = batch
        pred = x @ state.params["w"] + state.params["b"]
        return ciclo.logs().add_loss("loss", jnp.mean((pred - y) ** 2)), state

    @ciclo.managed.step
    def eval_step(state, batch):  # a collective: both processes must run it together
        x, y = batch
        pred = x @ state.params["w"] + state.params["b"]
        return ciclo.logs().add_metric("eval_loss", jnp.mean((pred - y) ** 2)), state

    state = ciclo.managed.ManagedState.create(
        params={"w": jnp.zeros(DIM), "b": jnp.zeros(())},
        tx=optax.sgd(0.05, momentum=0.9),
        key=0,
        strategy="data-parallel",
    )
    seen: dict = {"eval_steps": []}

    def slow_on_process_1(state, batch, elapsed, loop_state):
        if process == 1:  # process 1's clock runs ahead of process 0's steps
            time.sleep(0.004)
        time.sleep(options.get("step_sleep", 0.0))

    def record_eval(state, batch, elapsed, loop_state):
        seen["eval_steps"].append(elapsed.steps)

    def finish(state, batch, elapsed, loop_state):
        result = {
            "steps": elapsed.steps,
            "samples": elapsed.samples,
            "reason": loop_state.stop_reason,
            "w": np.asarray(state.params["w"]).tolist(),
            "b": float(state.params["b"]),
            "cache": dict(cache),
            **seen,
        }
        (out / f"result{process}.json").write_text(json.dumps(result))

    each_step: list = [train_step, slow_on_process_1]
    tasks: dict = {ciclo.every(1): each_step}
    kwargs: dict = {"on_end": finish, "stop": options.get("stop")}
    if "agree_every" in options:
        kwargs["agree_every"] = options["agree_every"]
    if scenario == "time":
        tasks[ciclo.every(time=0.05)] = [eval_step, record_eval]
    elif scenario == "nan":
        each_step.append(ciclo.terminate_on_nan())
    elif scenario == "request":  # a stop that only process 1 asks for

        def stop_on_1(state, batch, elapsed, loop_state):
            if process == 1 and elapsed.steps == 9:
                loop_state.request_stop("asked on process 1")

        each_step.append(stop_on_1)
    elif scenario == "raise":

        def boom(state, batch, elapsed, loop_state):
            if process == options.get("raiser", 1) and elapsed.steps == 5:
                raise ValueError("boom on purpose")

        each_step.append(boom)
        if options.get("checkpoint"):  # saves in the background when the raise comes
            tasks[ciclo.every(options["checkpoint"])] = ciclo.checkpoint(out / "ckpt", keep=2)
    elif scenario == "kill":

        def die(state, batch, elapsed, loop_state):
            if process == 1 and elapsed.steps == 5:
                os.kill(os.getpid(), signal.SIGKILL)

        each_step.append(die)
        kwargs["fault_timeout"] = options["fault_timeout"]
    elif scenario == "sigterm":
        checkpoint = ciclo.checkpoint(out / "ckpt", keep=2)
        if options.get("interrupt"):

            def preempt(state, batch, elapsed, loop_state):
                if process == 1 and elapsed.steps == 7:
                    os.kill(os.getpid(), signal.SIGTERM)

            each_step.append(preempt)
        tasks[ciclo.every(1000)] = checkpoint
        kwargs["resume"] = checkpoint
        if options.get("stateful"):
            batches = Positioned(batches, process, seen)
    elif scenario == "outputs":
        tasks.update(ciclo.keras_bar(STEPS, file=sys.stdout, plain_interval=0.0))
        tasks[ciclo.every(1)] = [ciclo.csv_logger(out / "log.csv"), ciclo.tensorboard_logger(out)]
    elif scenario == "test_every":
        test = [(x[mine], y[mine]) for x, y in zip(xs[:2], ys[:2], strict=True)]

        def test_step(state, batch):
            return eval_step(state, batch)[0]

        def record_test(state, batch, elapsed, loop_state):
            seen["eval_steps"].append(elapsed.steps)

        ciclo.train_loop(
            state,
            batches,
            {
                ciclo.on_train_step: [train_step, slow_on_process_1],
                ciclo.on_test_step: test_step,
                ciclo.on_test_end: record_test,
                ciclo.on_train_end: finish,
            },
            test_dataset=lambda: test,
            test_every=ciclo.at(time=0.05),
        )
        return
    ciclo.loop(state, batches, tasks, **kwargs)


if __name__ == "__main__":
    options = json.loads(sys.argv[5]) if len(sys.argv) > 5 else {}
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], options)
