"""Mixed precision and averaged weights through every adapter's ``create_state`` (Flax Linen,
Flax NNX, Haiku, Equinox), on scikit-learn's digits: bfloat16 training ends close to float32
training with float32 parameters, and ``ema_params`` is the moving average of the
parameters, also with fused steps and accumulation."""

from __future__ import annotations

from typing import Any

import equinox as eqx
import flax.linen as nn
import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from sklearn.datasets import load_digits

import ciclo
import ciclo_equinox
import ciclo_flax
import ciclo_haiku

FRAMEWORKS = ["linen", "nnx", "haiku", "equinox"]
CE = optax.softmax_cross_entropy_with_integer_labels


def digits() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    data = load_digits()
    order = np.random.default_rng(0).permutation(len(data.target))
    x = (data.data[order] / 16.0).astype(np.float32)
    y = data.target[order].astype(np.int32)
    return x[:1440], y[:1440], x[1440:1792], y[1440:1792]  # 352 = 44 x 8 devices


X, Y, X_TEST, Y_TEST = digits()
TRAIN = [(X[i : i + 48], Y[i : i + 48]) for i in range(0, 1440, 48)]  # 30 batches


class LinenMLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(10)(nn.relu(nn.Dense(32)(x)))


class NNXMLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.hidden, self.out = nnx.Linear(64, 32, rngs=rngs), nnx.Linear(32, 10, rngs=rngs)

    def __call__(self, x):
        return self.out(nnx.relu(self.hidden(x)))


def create(framework: str, **options: Any) -> Any:
    tx = optax.adam(1e-2)
    common = {
        "losses": {"loss": CE},
        "metrics": {"accuracy": lambda logits, labels: logits.argmax(-1) == labels},
        **options,
    }
    if framework == "linen":
        return ciclo_flax.create_state(LinenMLP(), X[:1], tx, **common)
    if framework == "nnx":
        return ciclo_flax.create_nnx_state(NNXMLP(nnx.Rngs(0)), tx, **common)
    if framework == "haiku":
        model = hk.transform(lambda x: hk.nets.MLP([32, 10])(x))
        return ciclo_haiku.create_state(model, X[:1], tx, **common)
    model = eqx.nn.MLP(64, 10, 32, 1, key=jax.random.key(0))
    return ciclo_equinox.create_state(model, tx, vmap=True, **common)


def floating(tree: Any) -> list[jax.Array]:
    return [x for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.floating)]


def test_accuracy(state: Any) -> float:
    _, logs, _ = ciclo.test_loop(state, [(X_TEST, Y_TEST)])
    return float(logs.entry_value("accuracy"))


test_accuracy.__test__ = False  # a helper, not a test


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_bfloat16_training_is_close_to_float32_with_float32_parameters(framework):
    data = TRAIN * 2
    reference, reference_history, _ = ciclo.train_loop(create(framework), data)
    fused = ciclo.managed.jit(steps_per_call=4)
    mixed = create(framework, compute_dtype=jnp.bfloat16, strategy=fused)
    logs, after_one = mixed.train_step(TRAIN[0])
    assert {str(x.dtype) for x in floating((after_one.params, after_one.opt_state))} == {"float32"}
    assert logs.losses.loss.dtype == logs.metrics.accuracy.dtype == jnp.float32
    _, predicted = ciclo.predict_loop(after_one, [X_TEST[:8]])[:2]
    assert predicted["predictions"][0].dtype == jnp.float32

    mixed, history, _ = ciclo.train_loop(mixed, data)
    assert {str(x.dtype) for x in floating(mixed.params)} == {"float32"}
    expected, got = test_accuracy(reference), test_accuracy(mixed)
    assert expected > 0.9
    assert abs(got - expected) < 0.04, (got, expected)
    assert history.collect("loss")[-1] == pytest.approx(
        reference_history.collect("loss")[-1], abs=0.1
    )
    # It did compute in bfloat16: the parameters differ from float32 training.
    assert any(
        not np.array_equal(a, b)
        for a, b in zip(floating(mixed.params), floating(reference.params), strict=True)
    )


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_ema_params_average_every_update_with_fused_steps_and_accumulation(framework):
    data = TRAIN[:6]
    state = create(framework, ema=0.8)
    average = state.params
    for batch in data:
        _, state = state.train_step(batch)
        average = jax.tree.map(lambda a, p: 0.8 * a + 0.2 * p, average, state.params)

    strategy = ciclo.managed.data_parallel(steps_per_call=3, accumulate_steps=2)
    fused = create(framework, ema=0.8, compute_dtype=None, strategy=strategy)
    fused, history, _ = ciclo.train_loop(
        fused, data, test_dataset=[(X_TEST, Y_TEST)], epoch_duration=3
    )
    for got, expected in zip(floating(fused.ema_params), floating(average), strict=True):
        np.testing.assert_allclose(got, expected, rtol=2e-5, atol=2e-6)
    steps, loss_test_ema = history.collect("steps", "loss_test_ema")
    assert steps == [2, 5]
    _, logs, _ = ciclo.test_loop(fused.ema_state(), [(X_TEST, Y_TEST)])
    assert loss_test_ema[-1] == pytest.approx(float(logs.entry_value("loss")), rel=1e-5)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_typo_in_a_precision_option_names_it(framework):
    with pytest.raises(TypeError, match=r"unknown keyword 'compute_dtpye'.*'compute_dtype'"):
        create(framework, compute_dtpye=jnp.bfloat16)
