"""An Equinox CNN with batch norm and dropout trains to high accuracy with the same loop calls
that train the Flax models in ciclo-flax's tests: only the state differs."""

from __future__ import annotations

import equinox as eqx
import jax
import numpy as np
import optax

import ciclo
import ciclo_equinox
from ciclo.testing import accuracy, batches
from ciclo.testing import image_data as images

CE = optax.softmax_cross_entropy_with_integer_labels
CLASSES = 6


class CNN(eqx.Module):
    """The Flax tests' CNN, per example (HWC image in, logits out), the Equinox way."""

    conv: eqx.nn.Conv2d
    norm: eqx.nn.BatchNorm
    pool: eqx.nn.AvgPool2d
    dropout: eqx.nn.Dropout
    out: eqx.nn.Linear

    def __init__(self, key):
        k1, k2 = jax.random.split(key)
        self.conv = eqx.nn.Conv2d(1, 8, 3, padding=1, key=k1)
        self.norm = eqx.nn.BatchNorm(8, axis_name="batch", mode="batch")
        self.pool = eqx.nn.AvgPool2d(2, 2)
        self.dropout = eqx.nn.Dropout(0.3)
        self.out = eqx.nn.Linear(4 * 4 * 8, CLASSES, key=k2)

    def __call__(self, x, state, *, key):
        x, state = self.norm(self.conv(x.transpose(2, 0, 1)), state)
        x = self.pool(jax.nn.relu(x)).reshape(-1)
        return self.out(self.dropout(x, key=key)), state


def create():
    model, model_state = eqx.nn.make_with_state(CNN)(jax.random.key(0))
    options = {"losses": {"loss": CE}, "metrics": {"accuracy": accuracy}, "key": 0}
    return ciclo_equinox.create_state(
        model, optax.adam(1e-2), state=model_state, vmap=True, **options
    )


def test_equinox_cnn_trains_to_high_accuracy_with_the_loop_calls_of_the_flax_tests():
    x, y = images(1024, seed=1)
    x_test, y_test = images(512, seed=2)
    state = create()
    # The calls of ciclo-flax's test_linen_and_nnx_train_to_high_accuracy_with_the_same_loop_call.
    state, _, elapsed = ciclo.loop(
        state, batches(x, y, 32), {ciclo.every(1): type(state).train_step}
    )
    _, test_history, _ = ciclo.loop(
        state, batches(x_test, y_test, 64), {ciclo.every(1): type(state).test_step}
    )
    assert elapsed.steps == 32
    test_accuracy = float(np.mean(test_history.collect("accuracy")))
    assert test_accuracy >= 0.9, test_accuracy


def test_equinox_cnn_with_the_train_loop_call_of_the_flax_tests():
    x, y = images(1024, seed=3)
    x_test, y_test = images(512, seed=4)
    state = create()
    # The same call as ciclo-flax's test_linen_and_nnx_with_the_same_train_loop_call.
    state, history, elapsed = ciclo.train_loop(
        state,
        batches(x, y, 32),
        test_dataset=lambda: batches(x_test, y_test, 64),
        epoch_duration=16,
    )
    assert elapsed.steps == 32
    steps, accuracy_test = history.collect("steps", "accuracy_test")
    assert steps == [15, 31]  # evaluated after each epoch of 16 steps
    assert accuracy_test[-1] >= 0.9
