"""The alternative users would pick: Keras 3 `fit` on the JAX backend, same model, data and
optimizer (MLP 784->128->10, batch 32, SGD), with and without `steps_per_execution=10`,
against ciclo unfused and fused (`steps_per_call=10`, when available).

Target: ciclo ahead in both pairings (ratio ciclo / keras < 1).
"""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "jax")

import jax
import numpy as np
from _harness import compare, emit, parse_args
from loop_overhead import mlp_setup

import ciclo


def main() -> None:
    args = parse_args(__doc__ or "")
    import keras

    steps = 40 if args.tiny else 2000
    repeats = 2 if args.tiny else 5
    state, dataset, train_step = mlp_setup(steps)
    x = np.concatenate([b[0] for b in dataset])
    y = np.concatenate([b[1] for b in dataset])

    def keras_model(steps_per_execution: int):
        model = keras.Sequential(
            [
                keras.Input((784,)),
                keras.layers.Dense(128, activation="relu"),
                keras.layers.Dense(10),
            ]
        )
        model.compile(
            optimizer=keras.optimizers.SGD(0.01),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
            steps_per_execution=steps_per_execution,
        )
        return model

    models = {1: keras_model(1), 10: keras_model(10)}

    def keras_fit(k: int):
        def run():
            models[k].fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)

        return run

    def ciclo_loop():
        s, _, _ = ciclo.loop(state, dataset, {ciclo.every(1): train_step})
        jax.block_until_ready(s)

    rows = compare(
        "vs Keras fit (unfused)",
        {"keras fit": keras_fit(1), "ciclo.loop": ciclo_loop},
        repeats=repeats,
        per=steps,
        unit="us",
        target="ratio < 1",
    )
    emit(rows, args.json)
    fused = _fused_ciclo(state, dataset)
    if fused is not None:
        rows = compare(
            "vs Keras fit (10 steps/call)",
            {"keras fit, steps_per_execution=10": keras_fit(10), "ciclo, steps_per_call=10": fused},
            repeats=repeats,
            per=steps,
            unit="us",
            target="ratio < 1",
        )
        emit(rows, args.json)


def _fused_ciclo(state, dataset):
    """ciclo with 10 fused steps per call; None until the managed API offers it."""
    try:
        from fused_steps import fused_candidate
    except ImportError:
        return None
    return fused_candidate(dataset, steps_per_call=10)


if __name__ == "__main__":
    main()
