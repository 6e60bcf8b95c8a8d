"""A third-party adapter, written as its author would: ``pico``, a tiny hand-rolled
framework (layers with ``init`` and ``apply``), gets a ciclo adapter of about 50 lines,
trains on scikit-learn's digits with ``ciclo.train_loop``, and then runs the adapter
conformance suite ``ciclo.testing`` on itself (with pytest). docs/adapters.md builds the
same adapter step by step.

    python examples/custom_adapter.py --steps 300
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import jax
import jax.numpy as jnp
import optax
from _data import Batches, digits, eval_batches, parse_args

import ciclo
import ciclo.testing

# --- pico: the framework (a layer is init(key, x) -> (params, state) and apply) ------------


@dataclasses.dataclass(frozen=True)
class Dense:
    features: int

    def init(self, key, x):
        w = jax.random.normal(key, (x.shape[-1], self.features)) * jnp.sqrt(2.0 / x.shape[-1])
        return {"w": w, "b": jnp.zeros(self.features)}, {}

    def apply(self, params, state, x, *, training, key):
        return x @ params["w"] + params["b"], state


@dataclasses.dataclass(frozen=True)
class BatchNormReluDropout:
    rate: float
    momentum: float = 0.9

    def init(self, key, x):
        ones, zeros = jnp.ones(x.shape[-1]), jnp.zeros(x.shape[-1])
        return {"scale": ones, "bias": zeros}, {"mean": zeros, "var": ones}

    def apply(self, params, state, x, *, training, key):
        mean, var = (x.mean(0), x.var(0)) if training else (state["mean"], state["var"])
        if training:
            m = self.momentum
            state = {k: m * state[k] + (1 - m) * v for k, v in (("mean", mean), ("var", var))}
        x = jax.nn.relu((x - mean) / jnp.sqrt(var + 1e-5) * params["scale"] + params["bias"])
        if training:
            keep = jax.random.bernoulli(key, 1.0 - self.rate, x.shape)
            x = jnp.where(keep, x / (1.0 - self.rate), 0.0)
        return x, state


@dataclasses.dataclass(frozen=True)
class Sequential:
    layers: tuple

    def init(self, key, x):
        params, state = [], []
        keys = jax.random.split(key, len(self.layers))
        for layer, layer_key in zip(self.layers, keys, strict=True):
            p, s = layer.init(layer_key, x)
            x, _ = layer.apply(p, s, x, training=False, key=None)
            params.append(p)
            state.append(s)
        return params, state

    def apply(self, params, state, x, *, training, key):
        n = len(self.layers)
        keys = [None] * n if key is None else jax.random.split(key, n)
        new_state = []
        for layer, p, s, k in zip(self.layers, params, state, keys, strict=True):
            x, s = layer.apply(p, s, x, training=training, key=k)
            new_state.append(s)
        return x, new_state


# --- ciclo_pico: the adapter ---------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class PicoState(ciclo.adapters.AdapterState):
    """A pico model as a ciclo state: ``train_step``, ``test_step``, ``predict_step``."""

    model: Any = dataclasses.field(default=None, metadata=ciclo.adapters.STATIC)

    def apply(self, params, model_state, inputs, *, training, key):
        return self.model.apply(params, model_state, inputs, training=training, key=key)


def create_state(model, inputs, tx, *, losses, metrics=None, key=None, strategy="jit", **options):
    """Builds a :class:`PicoState` for a pico ``Sequential``, initialized on ``inputs``.

    Args:
        model: a pico ``Sequential``.
        inputs: sample inputs (a batch's inputs) to initialize the parameters with.
        tx, losses, metrics, key, strategy, **options: as for every ciclo adapter.
    """
    if not isinstance(model, Sequential):
        raise TypeError(
            f"create_state(model, ...): model must be a pico Sequential, got "
            f"{type(model).__name__}. Example: create_state(Sequential((Dense(10),)), x[:1], tx)."
        )
    init_key, key = jax.random.split(ciclo.adapters.as_key(key))
    params, model_state = jax.jit(model.init)(init_key, inputs)
    return PicoState.create(
        params=params, model_state=model_state, tx=tx, losses=losses, metrics=metrics,
        key=key, strategy=strategy, model=model, **options,
    )  # fmt: skip


# A package registers this record under the "ciclo.adapters" entry-point group; a script
# registers it in its process.
adapter = ciclo.adapters.register_adapter(
    ciclo.adapters.Adapter(
        name="pico",
        distribution="ciclo-pico",
        handles=lambda model: isinstance(model, Sequential),
        create_state=create_state,
    )
)


# --- its conformance test ------------------------------------------------------------------


def mlp(hidden: int, classes: int, rate: float) -> Sequential:
    return Sequential((Dense(hidden), BatchNormReluDropout(rate), Dense(classes)))


class TestPicoConformance(ciclo.testing.AdapterConformance):
    adapter = "pico"

    def make_model(self):
        return mlp(32, ciclo.testing.CLASSES, 0.5)

    def create_state(self, model, **kwargs):
        return create_state(model, ciclo.testing.sample_inputs(), **kwargs)


def main() -> None:
    args = parse_args(__doc__, steps=300, batch_size=64, conformance=1)
    x_train, y_train, x_test, y_test = digits()
    state = ciclo.create_state(  # finds the pico adapter from the model's type
        mlp(128, 10, 0.2),
        x_train[:1],
        optax.adam(1e-3),
        losses={"loss": optax.softmax_cross_entropy_with_integer_labels},
        metrics={"accuracy": lambda logits, labels: logits.argmax(-1) == labels},
    )
    state, history, _ = ciclo.train_loop(
        state,
        Batches(x_train, y_train, args.batch_size),
        test_dataset=lambda: eval_batches(x_test, y_test),
        epoch_duration=min(len(x_train) // args.batch_size, args.steps),
        callbacks=[ciclo.keras_bar(total=args.steps)],
        stop=args.steps,
    )
    print(f"pico: test accuracy {history.collect('accuracy_test')[-1]:.4f}")
    if args.conformance:
        import pytest

        print("the conformance suite on the pico adapter:")
        sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", __file__]))


if __name__ == "__main__":
    main()
