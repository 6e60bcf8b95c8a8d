"""Loop overhead against the hand-written loop, on a trivial step and on a small MLP.

Targets (issue 15), on a trivial jitted step (``x + 1`` with one metric), in µs per step
over a hand-written ``for`` loop calling the same step (no per-step syncs), timed in the
same process in alternation:

- ``ciclo.loop`` + history: <= 4 µs
- the same + ``goodput`` (the time ledger, issue 29): at most 0.5 µs more
- the same + ``keras_bar``: <= 6 µs (also with ``running_mean=True``)
- the same + a task under a time schedule (``every(time=1)``, planned like a step
  schedule): at most 0.5 µs more than ``ciclo.loop`` + history
- ``ciclo.train_loop`` + history over 4 epochs of a list, and of unknown length (a generator
  function, whose passes end the epochs): at most 1 µs more than ``ciclo.loop`` + history
- manual iteration (``ciclo.elapse`` + ``history.commit``): <= 2 µs

and over the floor with the API's ``Elapsed`` and schedule (the row below; issue 39, item
4): ``ciclo.loop`` + history <= that floor + 1.5 µs, manual iteration <= that floor + 0.5 µs
("over the floor": the median of the per-round differences; ``--rounds`` sets the rounds).

and on the MLP 784 -> 128 -> 10, batch 32: ``ciclo.loop`` + history + bar within 3% of the
hand-written loop (ratio <= 1.03; the median of the per-round ratios to the hand-written run
of the same round, whose own step time on a shared 2-core machine drifts by 20% and more).

On the trivial step, each row's ``overhead`` is the median of the per-round differences to
the hand-written run of the same round, which is steadier on a shared machine than the
difference of two medians.

The row "hand-written loop keeping a row per step ..." has no target: it is what any loop
that records what manual iteration records pays, written by hand with JAX's cheapest
calls (a ``(step, time)`` tuple per step, each logged value kept on device and moved to
the host 256 at a time by one stacking call): the floor under manual iteration's overhead.
The row after it adds what manual iteration's public API asks for at each step and
nothing else: an ``Elapsed`` made per step (as cheaply as ``ciclo.elapse`` makes it) and
the user's ``schedule(elapsed)``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from _harness import NullFile, alternate, compare, emit, parse_args

import ciclo

try:  # how ciclo.elapse makes each step's Elapsed (without __init__'s checks)
    from ciclo._time._elapsed import Elapsed, _new, _set_date, _set_samples, _set_steps, _set_time

    def _next_elapsed(elapsed: Elapsed, size: int, now: float) -> Elapsed:
        counted = _new(Elapsed)
        _set_steps(counted, elapsed.steps + 1)
        _set_samples(counted, elapsed.samples + size)
        _set_time(counted, elapsed.time + (now - elapsed.date))
        _set_date(counted, now)
        return counted
except ImportError:  # an earlier ciclo (run.py --before)
    _next_elapsed = None

HAND_WRITTEN = "hand-written for loop"
LOOP = "ciclo.loop + history"
LOOP_BAR = "ciclo.loop + history + keras_bar"
LOOP_GOODPUT = "ciclo.loop + history + goodput"
LOOP_BAR_MEAN = "ciclo.loop + history + keras_bar(running_mean=True)"
LOOP_TIMED = "ciclo.loop + history + a task every(time=1)"
TRAIN_EPOCHS = "ciclo.train_loop + history, 4 epochs over a list"
TRAIN_PASSES = "ciclo.train_loop + history, 4 epochs over a generator function"
MANUAL = "manual iteration (elapse + history.commit)"
RECORDS_BY_HAND = "hand-written loop keeping a row per step and its logs, fetched 256 at a time"
RECORDS_WITH_API = "the same, with an Elapsed made per step and the schedule called"
OVERHEAD_TARGETS = {
    LOOP: "overhead <= 4 us/step",
    LOOP_BAR: "overhead <= 6 us/step",
    LOOP_GOODPUT: "overhead <= that of ciclo.loop + history + 0.5 us/step",
    LOOP_BAR_MEAN: "overhead <= 6 us/step",
    LOOP_TIMED: "overhead <= that of ciclo.loop + history + 0.5 us/step",
    TRAIN_EPOCHS: "overhead <= that of ciclo.loop + history + 1 us/step",
    TRAIN_PASSES: "overhead <= that of ciclo.loop + history + 1 us/step",
    MANUAL: "overhead <= 2 us/step",
}
FLOOR_TARGETS = {LOOP: "over_floor <= 1.5 us/step", MANUAL: "over_floor <= 0.5 us/step"}


@jax.jit
def trivial_step(state, batch):
    """The trivial step: ``x + 1``, with one metric."""
    return ciclo.logs().add_metric("x", state), state + 1


def mlp_setup(steps: int):
    rng = np.random.default_rng(0)
    batches = [
        (rng.normal(size=(32, 784)).astype(np.float32), rng.integers(0, 10, 32).astype(np.int32))
        for _ in range(64)
    ]
    dataset = [batches[i % len(batches)] for i in range(steps)]
    k1, k2 = jax.random.split(jax.random.key(0))
    params = {
        "w1": jax.random.normal(k1, (784, 128)) * 0.05,
        "b1": jnp.zeros(128),
        "w2": jax.random.normal(k2, (128, 10)) * 0.05,
        "b2": jnp.zeros(10),
    }
    tx = optax.sgd(0.01)

    @jax.jit
    def train_step(state, batch):
        x, y = batch

        def loss_fn(p):
            h = jax.nn.relu(x @ p["w1"] + p["b1"])
            logits = h @ p["w2"] + p["b2"]
            loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
            return loss, logits

        (loss, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["params"])
        updates, opt_state = tx.update(grads, state["opt_state"])
        logs = ciclo.logs()
        logs.add_loss("loss", loss)
        logs.add_metric("accuracy", jnp.mean(logits.argmax(-1) == y))
        return logs, {
            "params": optax.apply_updates(state["params"], updates),
            "opt_state": opt_state,
        }

    state = {"params": params, "opt_state": tx.init(params)}
    return state, dataset, train_step


def candidates(state, dataset, train_step) -> dict[str, Callable[[], Any]]:
    def hand_written():
        s = state
        for batch in dataset:
            _, s = train_step(s, batch)
        jax.block_until_ready(s)

    def with_loop():
        s, _, _ = ciclo.loop(state, dataset, {ciclo.every(1): train_step})
        jax.block_until_ready(s)

    def with_loop_and_goodput():
        ledger = ciclo.goodput(since="now")  # an entry every 1000 steps
        s, _, _ = ciclo.loop(state, dataset, {ciclo.every(1): train_step, **ledger})
        jax.block_until_ready(s)

    def with_loop_and_time_task():
        tasks = {ciclo.every(1): train_step, ciclo.every(time=1): lambda: None}
        s, _, _ = ciclo.loop(state, dataset, tasks)
        jax.block_until_ready(s)

    quarter = len(dataset) // 4

    def with_train_loop_over_a_list():
        tasks = {ciclo.every(1): train_step}
        s, _, _ = ciclo.train_loop(state, dataset[: 4 * quarter : 4], tasks, epochs=4)
        jax.block_until_ready(s)

    def with_train_loop_over_passes():  # epochs of unknown length: each pass's end ends one
        def one_pass():
            start = next(starts)
            yield from dataset[start : start + quarter]

        starts = iter(range(0, 4 * quarter, quarter))
        s, _, _ = ciclo.train_loop(state, one_pass, {ciclo.every(1): train_step}, epochs=4)
        jax.block_until_ready(s)

    def with_loop_and_bar():
        bar = ciclo.keras_bar(len(dataset), file=_NULL)
        s, _, _ = ciclo.loop(state, dataset, {ciclo.every(1): [train_step, bar]})
        jax.block_until_ready(s)

    def with_loop_and_mean_bar():
        bar = ciclo.keras_bar(len(dataset), file=_NULL, running_mean=True)
        s, _, _ = ciclo.loop(state, dataset, {ciclo.every(1): [train_step, bar]})
        jax.block_until_ready(s)

    stack = jax.jit(lambda *arrays: jnp.stack(arrays))

    def records_by_hand():
        s, rows, kept, fetched = state, [], [], []
        for batch in dataset:
            logs, s = train_step(s, batch)
            rows.append((len(rows), time.time()))
            kept.append([value for values in logs.values() for value in values.values()])
            if len(kept) == 256:
                fetched.extend(np.asarray(stack(*column)) for column in zip(*kept, strict=True))
                kept = []
        jax.block_until_ready(s)

    def records_with_api():
        s, rows, kept, fetched = state, [], [], []
        schedule, elapsed, clock = ciclo.every(1), ciclo.Elapsed.create(), time.time
        for batch in dataset:
            if schedule(elapsed):
                logs, s = train_step(s, batch)
                rows.append(elapsed)
                kept.append([value for values in logs.values() for value in values.values()])
                if len(kept) == 256:
                    fetched.extend(np.asarray(stack(*column)) for column in zip(*kept, strict=True))
                    kept = []
            elapsed = _next_elapsed(elapsed, len(batch), clock())
        jax.block_until_ready(s)

    def manual_iteration():
        s, history = state, ciclo.history()
        schedule = ciclo.every(1)
        for elapsed, batch in ciclo.elapse(dataset):
            if schedule(elapsed):
                logs, s = train_step(s, batch)
                history.commit(elapsed, logs)
        jax.block_until_ready(s)

    runs = {
        HAND_WRITTEN: hand_written,
        LOOP: with_loop,
        LOOP_GOODPUT: with_loop_and_goodput,
        LOOP_TIMED: with_loop_and_time_task,
        TRAIN_EPOCHS: with_train_loop_over_a_list,
        TRAIN_PASSES: with_train_loop_over_passes,
        LOOP_BAR: with_loop_and_bar,
        LOOP_BAR_MEAN: with_loop_and_mean_bar,
        MANUAL: manual_iteration,
        RECORDS_BY_HAND: records_by_hand,
        RECORDS_WITH_API: records_with_api,
    }
    if not hasattr(ciclo, "goodput"):  # an earlier ciclo (run.py --before)
        del runs[LOOP_GOODPUT]
    if _next_elapsed is None:
        del runs[RECORDS_WITH_API]
    return runs


def overhead_rows(
    benchmark: str, runs: dict[str, Callable[[], Any]], *, repeats: int, steps: int
) -> list[dict[str, Any]]:
    """Rows as :func:`_harness.compare` makes them (µs per step, ratio), whose ``overhead``
    is the median of the per-round differences to the hand-written run of the same round."""
    times = alternate(runs, repeats)  # one warm-up run each (compiles, caches), then rounds
    scale = 1e6 / steps
    baseline, floor = times[HAND_WRITTEN], times.get(RECORDS_WITH_API)

    def over(reference: list[float] | None, values: list[float]) -> float | None:
        """The median of the per-round differences to ``reference``'s run, in us/step."""
        if reference is None:
            return None
        return statistics.median((t - r) * scale for t, r in zip(values, reference, strict=True))

    rows = []
    for label, values in times.items():
        differences = [(t - b) * scale for t, b in zip(values, baseline, strict=True)]
        rows.append(
            {
                "benchmark": benchmark,
                "candidate": label,
                "median": statistics.median(values) * scale,
                "min": min(values) * scale,
                "max": max(values) * scale,
                "unit": "us/step",
                "ratio": statistics.median(values) / statistics.median(baseline),
                "overhead": statistics.median(differences),
                "overhead_min_max": [min(differences), max(differences)],
                "baseline": HAND_WRITTEN,
                "target": OVERHEAD_TARGETS.get(label, ""),
                # item 4 of issue 39: over the floor with the API's Elapsed and schedule
                "over_floor": over(floor, values),
                "floor_target": FLOOR_TARGETS.get(label, ""),
                # the targets "that of ciclo.loop + history + ...", paired the same way
                "over_loop": over(times.get(LOOP), values),
            }
        )
    return rows


_NULL = NullFile()


def main() -> None:
    args = parse_args(__doc__ or "")

    steps = 50 if args.tiny else 5000
    rows = overhead_rows(
        "trivial step (x + 1)" if not args.tiny else "trivial step (tiny)",
        candidates(jnp.zeros(()), [np.zeros((1,), np.float32)] * steps, trivial_step),
        repeats=2 if args.tiny else args.rounds or 15,
        steps=steps,
    )
    emit(rows, args.json)
    for row in rows:
        if row["over_floor"] is not None:
            print(f"{row['candidate']:<44} over the floor {row['over_floor']:+7.3f} us/step")
    for row in rows:
        if "that of ciclo.loop" in row["target"]:
            print(f"{row['candidate']:<44} over ciclo.loop {row['over_loop']:+7.3f} us/step")

    steps = 50 if args.tiny else 2000
    state, dataset, train_step = mlp_setup(steps)
    rows = compare(
        "MLP 784-128-10, batch 32" if not args.tiny else "MLP (tiny)",
        candidates(state, dataset, train_step),
        repeats=2 if args.tiny else args.rounds or 15,
        per=steps,
        unit="us",
        paired=True,
    )
    for row in rows:
        if row["candidate"] in (LOOP_BAR, LOOP_BAR_MEAN):
            row["target"] = "ratio <= 1.03"
    emit(rows, args.json)


if __name__ == "__main__":
    main()
