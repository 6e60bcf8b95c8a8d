"""The managed API on a pure-JAX MLP: a ``ManagedState`` with its own ``train_step`` and
``test_step``; ciclo differentiates the losses, applies the optimizer and runs the steps
under a strategy (``--strategy eager|jit|data-parallel|pmap``, ``--steps-per-call``).

    python examples/managed_pure_jax.py --steps 300 --strategy jit --steps-per-call 10
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax
from _data import Batches, digits, eval_batches, parse_args

import ciclo


def init_mlp(key, sizes):
    keys = jax.random.split(key, len(sizes) - 1)
    return [
        {"w": jax.random.normal(k, (m, n)) * jnp.sqrt(2.0 / m), "b": jnp.zeros(n)}
        for k, m, n in zip(keys, sizes[:-1], sizes[1:], strict=True)
    ]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Classifier(ciclo.managed.ManagedState):
    dropout: float = dataclasses.field(default=0.2, metadata={"static": True})

    def logits(self, x, *, training):
        for i, layer in enumerate(self.params[:-1]):
            x = jax.nn.relu(x @ layer["w"] + layer["b"])
            if training:  # a different key at every step, reproducible from the seed
                keep = jax.random.bernoulli(self.step_key("dropout", i), 1 - self.dropout, x.shape)
                x = jnp.where(keep, x / (1 - self.dropout), 0.0)
        return x @ self.params[-1]["w"] + self.params[-1]["b"]

    def evaluate(self, batch, *, training):
        x, y = batch
        logits = self.logits(x, training=training)
        logs = ciclo.logs()
        logs.add_loss("loss", optax.softmax_cross_entropy_with_integer_labels(logits, y).mean())
        logs.add_metric("accuracy", jnp.mean(logits.argmax(-1) == y))
        return logs

    @ciclo.managed.train_step
    def train_step(self, batch):
        return self.evaluate(batch, training=True), self

    @ciclo.managed.step
    def test_step(self, batch):
        return self.evaluate(batch, training=False), self


def main() -> None:
    args = parse_args(__doc__, steps=300, batch_size=64, strategy="jit", steps_per_call=1)
    x_train, y_train, x_test, y_test = digits()
    state = Classifier.create(
        params=init_mlp(jax.random.key(0), [64, 128, 10]),
        tx=optax.adam(3e-3),
        key=0,
    ).with_strategy(
        args.strategy,
        **({"steps_per_call": args.steps_per_call} if args.steps_per_call > 1 else {}),
    )
    epoch = min(len(x_train) // args.batch_size, args.steps)
    state, history, _ = ciclo.train_loop(
        state,  # its train_step and test_step register themselves
        Batches(x_train, y_train, args.batch_size),
        test_dataset=lambda: eval_batches(x_test, y_test),
        epoch_duration=epoch,
        callbacks=[ciclo.keras_bar(total=args.steps)],
        stop=args.steps,
    )
    print(
        f"managed pure JAX ({state.strategy.name}, steps_per_call="
        f"{state.strategy.steps_per_call}): {int(state.step)} optimizer steps, "
        f"test accuracy {history.collect('accuracy_test')[-1]:.4f}"
    )


if __name__ == "__main__":
    main()
