"""A Haiku CNN with BatchNorm and Dropout trains to high accuracy with the same loop calls as
the Flax models in ciclo-flax's tests (packages/ciclo-flax/tests/test_flax.py): only the state
differs."""

from __future__ import annotations

import haiku as hk
import jax
import numpy as np
import optax

import ciclo
import ciclo_haiku
from ciclo.testing import accuracy, batches
from ciclo.testing import image_data as images

CE = optax.softmax_cross_entropy_with_integer_labels
CLASSES = 6


def cnn(x, is_training):
    """The Flax tests' CNN in Haiku: conv, batch norm, relu, pool, dropout, dense."""
    x = hk.Conv2D(8, (3, 3))(x)
    x = hk.BatchNorm(True, True, decay_rate=0.99)(x, is_training)
    x = hk.avg_pool(jax.nn.relu(x), (2, 2), (2, 2), "VALID").reshape(x.shape[0], -1)
    if is_training:
        x = hk.dropout(hk.next_rng_key(), 0.3, x)
    return hk.Linear(CLASSES)(x)


def test_haiku_trains_to_high_accuracy_with_the_flax_loop_call():
    x, y = images(1024, seed=1)
    x_test, y_test = images(512, seed=2)
    options = {"losses": {"loss": CE}, "metrics": {"accuracy": accuracy}, "key": 0}
    state = ciclo_haiku.create_state(cnn, x[:1], optax.adam(1e-2), **options)
    assert state.model_state, "batch norm statistics"
    # The calls of ciclo-flax's test, unchanged.
    state, _, elapsed = ciclo.loop(
        state, batches(x, y, 32), {ciclo.every(1): type(state).train_step}
    )
    _, test_history, _ = ciclo.loop(
        state, batches(x_test, y_test, 64), {ciclo.every(1): type(state).test_step}
    )
    assert elapsed.steps == 32
    assert float(np.mean(test_history.collect("accuracy"))) >= 0.9


def test_haiku_with_the_flax_train_loop_call():
    x, y = images(1024, seed=3)
    x_test, y_test = images(512, seed=4)
    options = {"losses": {"loss": CE}, "metrics": {"accuracy": accuracy}, "key": 0}
    state = ciclo_haiku.create_state(cnn, x[:1], optax.adam(1e-2), **options)
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
