"""Where the loop's time over a hand-written loop goes, part by part: the hand-written loop
with one of ciclo's per-step parts added at a time (keeping every step's logs alive, the
in-flight bound waiting at each step or every few steps, ``ciclo.elapse``,
``History.commit``), then ``ciclo.loop`` with 0, 1, 2 and 8 steps in flight (a wait every
``max_steps_in_flight`` steps); on the trivial step and on the MLP of ``loop_overhead.py``.
On an accelerator, this is what tells a host sync from Python work.

    python benchmarks/overhead_parts.py            # 5000 trivial steps, 2000 MLP steps
    python benchmarks/overhead_parts.py --tiny
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from _harness import compare, emit, parse_args
from loop_overhead import mlp_setup, trivial_step

import ciclo
from ciclo._loop._in_flight import InFlight

HAND_WRITTEN = "hand-written for loop"


def candidates(state: Any, dataset: list, step: Callable) -> dict[str, Callable[[], Any]]:
    def hand_written() -> None:
        s = state
        for batch in dataset:
            _, s = step(s, batch)
        jax.block_until_ready(s)

    def keeping_logs() -> None:
        s, kept = state, []
        for batch in dataset:
            logs, s = step(s, batch)
            kept.append(logs)
        jax.block_until_ready(s)

    def bounded(limit: int) -> Callable[[], None]:
        def run() -> None:
            s, in_flight = state, InFlight(limit)
            for batch in dataset:
                logs, s = step(s, batch)
                in_flight.push_tree(logs, s)
            jax.block_until_ready(s)

        return run

    def elapsing(commit: bool) -> Callable[[], None]:
        def run() -> None:
            s, history = state, ciclo.history()
            for elapsed, batch in ciclo.elapse(dataset):
                logs, s = step(s, batch)
                if commit:
                    history.commit(elapsed, logs)
            jax.block_until_ready(s)

        return run

    def looping(limit: int) -> Callable[[], None]:
        def run() -> None:
            s, _, _ = ciclo.loop(state, dataset, {ciclo.every(1): step}, max_steps_in_flight=limit)
            jax.block_until_ready(s)

        return run

    return {
        HAND_WRITTEN: hand_written,
        "+ every step's logs kept alive": keeping_logs,
        "+ InFlight(1), a wait each step": bounded(1),
        "+ InFlight(2), a wait every 2 steps": bounded(2),
        "+ InFlight(8), a wait every 8 steps (the default)": bounded(8),
        "+ ciclo.elapse": elapsing(commit=False),
        "+ ciclo.elapse + History.commit": elapsing(commit=True),
        "ciclo.loop, max_steps_in_flight=0": looping(0),
        "ciclo.loop, max_steps_in_flight=1": looping(1),
        "ciclo.loop, max_steps_in_flight=2": looping(2),
        "ciclo.loop, max_steps_in_flight=8": looping(8),
    }


def main() -> None:
    args = parse_args(__doc__ or "")

    steps = 50 if args.tiny else 5000
    trivial_data = [np.zeros((1,), np.float32)] * steps
    repeats = 2 if args.tiny else 9
    rows = compare(
        f"overhead parts, trivial step ({jax.default_backend()})",
        candidates(jnp.zeros(()), trivial_data, trivial_step),
        repeats=repeats,
        per=steps,
        unit="us",
    )
    steps = 50 if args.tiny else 2000
    rows += compare(
        f"overhead parts, MLP 784-128-10 ({jax.default_backend()})",
        candidates(*mlp_setup(steps)),
        repeats=2 if args.tiny else 7,
        per=steps,
        unit="us",
    )
    emit(rows, args.json)


if __name__ == "__main__":
    main()
