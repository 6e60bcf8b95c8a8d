"""The cost of the agreement between processes: 2 processes on loopback (``jax.distributed``,
gloo, 1 CPU device each) train a small linear model data-parallel (a cross-process gradient
all-reduce each step), with a hand-written ``for`` loop and with ``ciclo.loop``, whose
processes publish one small record through JAX's coordination service at each round of
agreement and read the others' of the round before (rounds about 0.1 s apart by default,
or every ``agree_every`` steps). The loop also runs a time-based schedule, which is what
needs the agreement. µs per step; the ratio and the overhead are the medians of those to
the hand-written loop of the same round (paired: a round's load is shared). Process 0
reports; both run the same candidates in the same order.

Target (issue 26): the default agreement with a time-based schedule, ratio <= 1.05.

The single-process overhead (no agreement at all) is ``loop_overhead.py``.
"""

from __future__ import annotations

import json
import sys


def _worker(process: int, port: int, tiny: bool, json_path: str | None) -> None:
    from ciclo.testing import join_loopback

    join_loopback(process, 2, port)
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from _harness import compare, emit

    import ciclo

    steps = 20 if tiny else 300
    rng = np.random.default_rng(process)
    batches = [
        (rng.normal(size=(16, 8)).astype(np.float32), rng.normal(size=16).astype(np.float32))
        for _ in range(steps)
    ]

    @ciclo.managed.train_step
    def train_step(state, batch):
        x, y = batch
        loss = jnp.mean((x @ state.params["w"] - y) ** 2)
        return ciclo.logs().add_loss("loss", loss), state

    state = ciclo.managed.ManagedState.create(
        params={"w": jnp.zeros(8)}, tx=optax.sgd(0.01), strategy="data-parallel"
    )

    def hand_written():
        s = state
        for batch in batches:
            _, s = train_step(s, batch)
        jax.block_until_ready(s.params)

    ticks = []

    def tick(state, batch, elapsed):  # a time-based callback: what the processes agree on
        ticks.append(elapsed.steps)

    def with_ciclo(every):
        def run():
            tasks = {ciclo.every(1): train_step, ciclo.every(time=0.05): tick}
            # None: the default, also on an earlier ciclo (run.py --before), whose default
            # was agree_every=1
            options = {} if every is None else {"agree_every": every}
            s, _, _ = ciclo.loop(state, batches, tasks, **options)
            jax.block_until_ready(s.params)

        return run

    default = "ciclo.loop + every(time=0.05), default agreement"
    rows = compare(
        "2 processes, linear model",
        {
            "hand-written for loop": hand_written,
            default: with_ciclo(None),
            "ciclo.loop + every(time=0.05), agree_every=1": with_ciclo(1),
            "ciclo.loop + every(time=0.05), agree_every=10": with_ciclo(10),
        },
        repeats=1 if tiny else 15,
        per=steps,
        unit="us",
        target="the cost of the agreement",
        paired=True,
    )
    for row in rows:
        if row["candidate"] == default:
            row["target"] = "ratio <= 1.05"
    if process == 0:
        emit(rows, json_path)
    jax.distributed.shutdown()


def main() -> None:
    from _harness import parse_args

    args = parse_args(__doc__ or "")
    from ciclo.testing import free_port, run_on_loopback

    port = free_port()
    options = json.dumps({"tiny": args.tiny, "json": args.json})
    command = [sys.executable, __file__, "--worker"]
    run = run_on_loopback([[*command, str(i), str(port), options] for i in range(2)], timeout=600)
    print(run.outputs[0], end="")
    if any(run.codes):
        sys.exit(f"a worker failed: exit statuses {run.codes}\n{run.outputs[1][-3000:]}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        options = json.loads(sys.argv[4])
        _worker(int(sys.argv[2]), int(sys.argv[3]), options["tiny"], options["json"])
    else:
        main()
