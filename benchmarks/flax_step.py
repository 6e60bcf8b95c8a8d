"""Per-step time of ciclo-flax's ``state.train_step`` against a hand-written ``jax.jit`` Flax
train step doing the same work (forward with batch norm and dropout, cross-entropy,
accuracy, optax update, batch statistics), for Linen and NNX.

Runs alternate in one process (ciclo, hand-written, ciclo, ...) on the same batches, and
the median per-step times are compared; the ratio ciclo / hand-written should be <= 1.05.

    python benchmarks/flax_step.py            # a CNN on 28x28 images, batch 64
    python benchmarks/flax_step.py --tiny     # a tiny MLP: dispatch overhead dominates
    python benchmarks/flax_step.py --json benchmarks/out/flax_step.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from _harness import paired_ratio
from flax import nnx

import ciclo_flax

CE = optax.softmax_cross_entropy_with_integer_labels
CLASSES = 10
CLOCK = time.perf_counter


def accuracy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    return logits.argmax(-1) == labels


# --- models --------------------------------------------------------------------------------


class LinenCNN(nn.Module):
    width: int = 16

    @nn.compact
    def __call__(self, x: jax.Array, training: bool) -> jax.Array:
        x = nn.Conv(self.width, (3, 3))(x)
        x = nn.BatchNorm(use_running_average=not training)(x)
        x = nn.max_pool(nn.relu(x), (2, 2), (2, 2))
        x = nn.Conv(2 * self.width, (3, 3))(x)
        x = nn.BatchNorm(use_running_average=not training)(x)
        x = nn.max_pool(nn.relu(x), (2, 2), (2, 2)).reshape(x.shape[0], -1)
        x = nn.Dropout(0.5, deterministic=not training)(nn.relu(nn.Dense(128)(x)))
        return nn.Dense(CLASSES)(x)


class LinenMLP(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array, training: bool) -> jax.Array:
        x = nn.Dense(32)(x.reshape(x.shape[0], -1))
        x = nn.BatchNorm(use_running_average=not training)(x)
        x = nn.Dropout(0.5, deterministic=not training)(nn.relu(x))
        return nn.Dense(CLASSES)(x)


class NNXCNN(nnx.Module):
    def __init__(self, channels: int, side: int, width: int, rngs: nnx.Rngs) -> None:
        self.conv1 = nnx.Conv(channels, width, (3, 3), rngs=rngs)
        self.norm1 = nnx.BatchNorm(width, rngs=rngs)
        self.conv2 = nnx.Conv(width, 2 * width, (3, 3), rngs=rngs)
        self.norm2 = nnx.BatchNorm(2 * width, rngs=rngs)
        self.dense = nnx.Linear((side // 4) ** 2 * 2 * width, 128, rngs=rngs)
        self.dropout = nnx.Dropout(0.5, rngs=rngs)
        self.out = nnx.Linear(128, CLASSES, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = nnx.max_pool(nnx.relu(self.norm1(self.conv1(x))), (2, 2), (2, 2))
        x = nnx.max_pool(nnx.relu(self.norm2(self.conv2(x))), (2, 2), (2, 2))
        x = self.dropout(nnx.relu(self.dense(x.reshape(x.shape[0], -1))))
        return self.out(x)


class NNXMLP(nnx.Module):
    def __init__(self, features: int, rngs: nnx.Rngs) -> None:
        self.linear = nnx.Linear(features, 32, rngs=rngs)
        self.norm = nnx.BatchNorm(32, rngs=rngs)
        self.dropout = nnx.Dropout(0.5, rngs=rngs)
        self.out = nnx.Linear(32, CLASSES, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = self.norm(self.linear(x.reshape(x.shape[0], -1)))
        return self.out(self.dropout(nnx.relu(x)))


# --- hand-written steps --------------------------------------------------------------------


def linen_hand_step(module: nn.Module, tx: optax.GradientTransformation) -> Any:
    """The usual hand-written Linen step: a dict state threaded through ``jax.jit``."""

    @jax.jit
    def step(state: dict[str, Any], batch: tuple[jax.Array, jax.Array]) -> Any:
        x, y = batch
        dropout_key = jax.random.fold_in(state["key"], state["step"])

        def loss_fn(params: Any) -> Any:
            logits, updates = module.apply(
                {"params": params, "batch_stats": state["batch_stats"]},
                x,
                training=True,
                rngs={"dropout": dropout_key},
                mutable=["batch_stats"],
            )
            return CE(logits, y).mean(), (logits, updates["batch_stats"])

        (loss, (logits, batch_stats)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            state["params"]
        )
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        new_state = {
            "params": optax.apply_updates(state["params"], updates),
            "batch_stats": batch_stats,
            "opt_state": opt_state,
            "key": state["key"],
            "step": state["step"] + 1,
        }
        return {"loss": loss, "accuracy": accuracy(logits, y).mean()}, new_state

    return step


def nnx_hand_step(graphdef: Any, tx: optax.GradientTransformation) -> Any:
    """The fast hand-written NNX step: functional split/merge inside ``jax.jit``."""

    @jax.jit
    def step(state: dict[str, Any], batch: tuple[jax.Array, jax.Array]) -> Any:
        x, y = batch

        def loss_fn(params: Any) -> Any:
            model = nnx.merge(graphdef, params, state["rest"], copy=True)
            nnx.reseed(model, default=jax.random.fold_in(state["key"], state["step"]))
            model.train()
            logits = model(x)
            _, _, rest = nnx.split(model, nnx.Param, ...)
            return CE(logits, y).mean(), (logits, rest)

        (loss, (logits, rest)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["params"])
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        new_state = {
            "params": optax.apply_updates(state["params"], updates),
            "rest": rest,
            "opt_state": opt_state,
            "key": state["key"],
            "step": state["step"] + 1,
        }
        return {"loss": loss, "accuracy": accuracy(logits, y).mean()}, new_state

    return step


# --- timing --------------------------------------------------------------------------------


def run(step: Any, state: Any, batches: list[Any]) -> tuple[float, Any]:
    """Seconds per step over ``batches`` (dispatch runs ahead; one wait at the end)."""
    start = CLOCK()
    for batch in batches:
        logs, state = step(state, batch)
    jax.block_until_ready((logs, state))
    return (CLOCK() - start) / len(batches), state


def compare(name: str, ciclo_state: Any, hand_step: Any, hand_state: Any, args: Any) -> dict:
    rng = np.random.default_rng(0)
    shape = (args.batch_size, args.side, args.side, 1)
    batches = [
        (
            jnp.asarray(rng.normal(size=shape).astype(np.float32)),
            jnp.asarray(rng.integers(0, CLASSES, args.batch_size).astype(np.int32)),
        )
        for _ in range(args.steps)
    ]

    def ciclo_step(state: Any, batch: Any) -> Any:
        return state.train_step(batch)

    for _ in range(2):  # compile and warm up both
        _, ciclo_state = run(ciclo_step, ciclo_state, batches[:3])
        _, hand_state = run(hand_step, hand_state, batches[:3])
    times: dict[str, list[float]] = {"ciclo": [], "hand": []}
    for round_ in range(args.rounds):
        # Alternate which goes first, so drifts in machine load hit both alike.
        order = ("ciclo", "hand") if round_ % 2 == 0 else ("hand", "ciclo")
        for who in order:
            if who == "ciclo":
                seconds, ciclo_state = run(ciclo_step, ciclo_state, batches)
            else:
                seconds, hand_state = run(hand_step, hand_state, batches)
            times[who].append(seconds)
    ciclo_ms = 1e3 * statistics.median(times["ciclo"])
    hand_ms = 1e3 * statistics.median(times["hand"])
    # Paired: each round's ciclo run against the hand-written run next to it.
    ratio = paired_ratio(times["ciclo"], times["hand"])
    # The fastest run of each: the least disturbed by other load on the machine.
    best_ratio = min(times["ciclo"]) / min(times["hand"])
    result = {
        "model": name,
        "ciclo_ms_per_step": round(ciclo_ms, 4),
        "hand_ms_per_step": round(hand_ms, 4),
        "ratio": round(ratio, 4),
        "best_ratio": round(best_ratio, 4),
        "target": 1.05,
    }
    print(
        f"{name:<18} ciclo {ciclo_ms:9.4f} ms/step   hand-written jax.jit {hand_ms:9.4f} ms/step"
        f"   ratio {ratio:6.3f} (median of paired rounds), {best_ratio:6.3f} (fastest runs);"
        f" target <= 1.05"
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="a tiny MLP on 8x8 inputs")
    parser.add_argument("--api", nargs="+", default=["linen", "nnx"], choices=["linen", "nnx"])
    parser.add_argument("--steps", type=int, default=None, help="steps per timed run")
    parser.add_argument("--rounds", type=int, default=None, help="alternating runs of each")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument(
        "--cpu-time",
        action="store_true",
        help="time with the process's CPU time instead of wall time (steadier on a busy "
        "machine; counts every thread, so only for CPU runs)",
    )
    args = parser.parse_args()
    if args.cpu_time:
        global CLOCK
        CLOCK = time.process_time
    args.side = 8 if args.tiny else 28
    args.batch_size = 32 if args.tiny else 64
    args.steps = args.steps or (100 if args.tiny else 10)
    args.rounds = args.rounds or (30 if args.tiny else 10)
    print(
        f"jax {jax.__version__} on {jax.devices()[0].platform}; "
        f"{'tiny MLP' if args.tiny else 'CNN'}, batch {args.batch_size}, "
        f"{args.steps} steps x {args.rounds} alternating rounds, "
        f"{'CPU' if args.cpu_time else 'wall'} time"
    )

    tx = optax.adam(1e-3)
    options = {"losses": {"loss": CE}, "metrics": {"accuracy": accuracy}, "key": 0}
    sample = jnp.zeros((1, args.side, args.side, 1))
    results = []
    if "linen" in args.api:
        module = LinenMLP() if args.tiny else LinenCNN()
        state = ciclo_flax.create_state(module, sample, tx, **options)
        hand_state = {
            "params": state.params,
            "batch_stats": state.model_state["batch_stats"],
            "opt_state": tx.init(state.params),
            "key": state.key,
            "step": jnp.zeros((), jnp.int32),
        }
        name = f"linen {'mlp' if args.tiny else 'cnn'}"
        results.append(compare(name, state, linen_hand_step(module, tx), hand_state, args))
    if "nnx" in args.api:
        rngs = nnx.Rngs(0)
        model = NNXMLP(args.side**2, rngs) if args.tiny else NNXCNN(1, args.side, 16, rngs)
        state = ciclo_flax.create_nnx_state(model, tx, **options)
        graphdef, params, rest = nnx.split(model, nnx.Param, ...)
        hand_state = {
            "params": params,
            "rest": rest,
            "opt_state": tx.init(params),
            "key": state.key,
            "step": jnp.zeros((), jnp.int32),
        }
        name = f"nnx {'mlp' if args.tiny else 'cnn'}"
        results.append(compare(name, state, nnx_hand_step(graphdef, tx), hand_state, args))
    if args.json:  # rows in the shared format of benchmarks/run.py (JSON lines, appended)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        with args.json.open("a") as f:
            for r in results:
                for candidate, ms, ratio, target in (
                    ("hand-written jax.jit step", r["hand_ms_per_step"], 1.0, ""),
                    ("state.train_step", r["ciclo_ms_per_step"], r["ratio"], "ratio <= 1.05"),
                ):
                    row = {
                        "benchmark": f"flax adapter step ({r['model']})",
                        "candidate": candidate,
                        "median": ms,
                        "min": ms,
                        "max": ms,
                        "unit": "ms/step",
                        "ratio": ratio,
                        "target": target,
                    }
                    f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
