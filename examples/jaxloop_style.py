"""A jaxloop-style experiment written with ciclo: model, datasets, train and eval steps,
inner loops, an outer loop with eval specs, summary and checkpoint actions, a partitioner,
and a standalone evaluation of the saved checkpoints. See docs/from-jaxloop.md.

    python examples/jaxloop_style.py --steps 400
    python examples/jaxloop_style.py --steps 400 --partitioner mesh   # on several devices

Data: scikit-learn's digits (shipped with scikit-learn, no download).
"""

from __future__ import annotations

import argparse
import itertools
import pathlib
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import AxisType
from sklearn.datasets import load_digits

import ciclo


# --- 1. model (jaxloop: an nn.Module; its partitioning annotations drive the "mesh" partitioner)
class MLP(nn.Module):
    hidden: int = 64
    classes: int = 10

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        init = nn.initializers.lecun_normal()
        x = nn.Dense(self.hidden, kernel_init=nn.with_partitioning(init, (None, "model")))(x)
        x = nn.relu(x)
        return nn.Dense(self.classes, kernel_init=nn.with_partitioning(init, ("model", None)))(x)


MODEL = MLP()


# --- 2. datasets (jaxloop: an iterator for training, one EvalSpec.dataset per eval loop)
def load(seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = x[order], y[order]
    return {
        "train": (x[:1077], y[:1077]),
        "valid": (x[1077:1437], y[1077:1437]),
        "test": (x[1437:], y[1437:]),
    }


def train_batches(data: tuple[np.ndarray, np.ndarray], batch_size: int) -> Iterator[Any]:
    """An endless stream of shuffled batches."""
    x, y = data
    rng = np.random.default_rng(0)
    while True:
        order = rng.permutation(len(x))
        for i in range(0, len(x) - batch_size + 1, batch_size):
            yield x[order[i : i + batch_size]], y[order[i : i + batch_size]]


def eval_spec(
    data: tuple[np.ndarray, np.ndarray], batch_size: int, num_steps: int | None
) -> Callable[[], Iterable[Any]]:
    """jaxloop's EvalSpec(dataset, num_steps): a function giving a fresh dataset."""
    x, y = data
    batches = [(x[i : i + batch_size], y[i : i + batch_size]) for i in range(0, len(x), batch_size)]
    return lambda: itertools.islice(batches, num_steps)


# --- 3. steps (jaxloop: Step.run for training and for evaluation)
def loss_and_accuracy(state: Any, batch: Any) -> tuple[jax.Array, jax.Array]:
    x, y = batch
    logits = MODEL.apply({"params": state.params}, x)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    return loss, jnp.mean(logits.argmax(-1) == y)


@ciclo.managed.train_step
def train_step(state: Any, batch: Any) -> Any:
    loss, accuracy = loss_and_accuracy(state, batch)  # ciclo differentiates the losses
    return ciclo.logs().add_loss("loss", loss).add_metric("accuracy", accuracy), state


@ciclo.managed.step
def eval_step(state: Any, batch: Any) -> Any:
    loss, accuracy = loss_and_accuracy(state, batch)
    return ciclo.logs().add_metric("loss", loss).add_metric("accuracy", accuracy), state


# --- 4. partitioner (jaxloop: Single-device / DataParallel / SPMD partitioners)
def strategy(name: str) -> Any:
    if name == "single":
        return "jit"
    if name == "data":
        return "data-parallel"
    if name == "fsdp":
        return "fsdp"
    # Model parallelism from the model's nn.with_partitioning annotations: no rules needed.
    devices = jax.device_count()
    model_axis = 2 if devices % 2 == 0 else 1
    mesh = jax.make_mesh(
        (devices // model_axis, model_axis), ("data", "model"), axis_types=(AxisType.Auto,) * 2
    )
    return ciclo.managed.sharded(mesh)


def create_state(partitioner: str, learning_rate: float) -> Any:
    params = MODEL.init(jax.random.key(0), jnp.zeros((1, 64)))["params"]
    return ciclo.managed.ManagedState.create(
        params=params, tx=optax.adam(learning_rate), strategy=strategy(partitioner)
    )


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=400, help="total training steps")
    parser.add_argument("--inner-steps", type=int, default=50, help="steps per inner loop")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--eval-steps", type=int, default=None, help="batches per eval loop")
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument(
        "--partitioner", choices=["single", "data", "fsdp", "mesh"], default="single"
    )
    parser.add_argument("--workdir", type=pathlib.Path, default=None)
    args = parser.parse_args(argv)
    workdir = args.workdir or pathlib.Path(tempfile.mkdtemp(prefix="ciclo-jaxloop-"))

    data = load()
    eval_specs = {
        name: eval_spec(data[name], batch_size=40, num_steps=args.eval_steps)
        for name in ("valid", "test")
    }

    # --- 5. actions (jaxloop: SummaryAction, CheckpointAction; here, callbacks)
    summary = ciclo.csv_logger(workdir / "summary.csv")  # ciclo.tensorboard_logger(...) too
    checkpoint = ciclo.checkpoint(workdir / "checkpoints", keep=None)

    def report(state: Any, batch: Any, elapsed: ciclo.Elapsed, loop_state: Any) -> None:
        logs = jax.device_get(loop_state.logs)  # one transfer per inner loop
        evaluated = "  ".join(
            f"{name} {float(value):.4f}" for name, value in sorted(logs.metrics.items())
        )
        print(f"step {elapsed.steps + 1:5d}  loss {float(logs.losses.loss):.4f}  {evaluated}")

    # --- 6. inner loops and the outer loop with eval specs
    # jaxloop's inner TrainLoop of `train_loop_steps` is an epoch here; each EvalSpec is a
    # named evaluation set with its own interval (eval_loop_interval, in inner loops).
    state, history, elapsed = ciclo.train_loop(
        create_state(args.partitioner, args.learning_rate),
        train_batches(data["train"], args.batch_size),
        {
            ciclo.on_train_step: train_step,
            ciclo.on_test_step: eval_step,
            ciclo.on_epoch_end: report,
        },
        callbacks=[summary, checkpoint],
        test_dataset=eval_specs,
        epoch_duration=args.inner_steps,
        test_every={"test": 2 * args.inner_steps},  # "valid": every inner loop
        stop=args.steps,
    )

    # --- 7. standalone evaluation of the saved checkpoints (jaxloop: an OuterLoop without
    # a train loop, iterating checkpoints; add follow=True to run it beside training).
    evaluated = ciclo.evaluate_checkpoints(
        checkpoint,
        create_state(args.partitioner, args.learning_rate),
        {"test": eval_specs["test"]},
        {ciclo.on_test_step: eval_step},
    )
    steps, accuracy = evaluated.collect("steps", "accuracy_test")
    print("checkpoints:", ", ".join(f"{s}: {a:.3f}" for s, a in zip(steps, accuracy, strict=True)))
    print(
        f"trained {elapsed.steps} steps in {elapsed.time:.1f}s with the {args.partitioner!r} "
        f"partitioner; final test accuracy {accuracy[-1]:.4f}; summaries in {workdir}"
    )
    return {"state": state, "history": history, "evaluated": evaluated, "workdir": workdir}


if __name__ == "__main__":
    main()
