"""Losses and metrics that ask for ``params`` (or ``state``) by parameter name, in every
adapter: a weight-decay term's gradient is the hand-written L2 gradient."""

from __future__ import annotations

import equinox as eqx
import flax.linen as nn
import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import ciclo
import ciclo_equinox
import ciclo_flax
import ciclo_haiku

X = jnp.asarray(np.random.default_rng(0).normal(size=(8, 4)), jnp.float32)
Y = jnp.zeros(8, jnp.int32)
DECAY = 0.1


def l2(preds, targets, params):
    return 0.5 * DECAY * sum(jnp.sum(p**2) for p in jax.tree_util.tree_leaves(params))


def build(framework, losses, metrics=None, tx=None):
    tx = tx or optax.sgd(1.0)
    if framework == "linen":
        return ciclo_flax.create_state(nn.Dense(3), X[:1], tx, losses=losses, metrics=metrics)
    if framework == "nnx":
        model = nnx.Linear(4, 3, rngs=nnx.Rngs(0))
        return ciclo_flax.create_nnx_state(model, tx, losses=losses, metrics=metrics)
    if framework == "haiku":
        return ciclo_haiku.create_state(
            lambda x: hk.Linear(3)(x), X[:1], tx, losses=losses, metrics=metrics
        )
    model = eqx.nn.Linear(4, 3, key=jax.random.key(0))
    return ciclo_equinox.create_state(model, tx, losses=losses, metrics=metrics, vmap=True)


FRAMEWORKS = ["linen", "nnx", "haiku", "equinox"]


def leaves(tree):
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(tree)]


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_the_gradient_of_a_loss_taking_params_is_the_hand_written_l2_term(framework):
    state = build(framework, {"l2": l2})
    _, new = state.train_step((X, Y))
    # sgd(1.0): new = params - grad, and grad of 0.5 * c * |p|^2 is c * p.
    for before, after in zip(leaves(state.params), leaves(new.params), strict=True):
        np.testing.assert_allclose(after, before - DECAY * before, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_loss_taking_params_trains_beside_the_data_loss(framework):
    ce = optax.softmax_cross_entropy_with_integer_labels
    state = build(framework, {"loss": ce, "l2": l2}, tx=optax.adam(1e-2))
    _, history, _ = ciclo.loop(state, [(X, Y)] * 20, {ciclo.every(1): state.train_step})
    loss = history.collect("loss")
    assert loss[-1] < loss[0]
    assert history.collect("l2")[-1] < history.collect("l2")[0]
    # With sgd, regularized minus plain update is exactly the L2 gradient.
    state = build(framework, {"loss": ce, "l2": l2}, tx=optax.sgd(0.5))
    plain = build(framework, {"loss": ce}, tx=optax.sgd(0.5))
    _, a = state.train_step((X, Y))
    _, b = plain.train_step((X, Y))
    for p, u, v in zip(leaves(state.params), leaves(a.params), leaves(b.params), strict=True):
        np.testing.assert_allclose(u - v, -0.5 * DECAY * p, rtol=1e-4, atol=1e-6)


def test_losses_and_metrics_may_ask_for_the_state():
    seen = []

    def steps_metric(preds, targets, state):
        seen.append(type(state).__name__)
        return state.step.astype(jnp.float32)

    def weighted(preds, targets, params, state):
        return 0.0 * l2(preds, targets, params) + 0.0 * state.step

    state = build("linen", {"loss": weighted}, metrics={"steps": steps_metric})
    logs, state = state.train_step((X, Y))
    logs, state = state.train_step((X, Y))
    assert float(logs.metrics.steps) == 1.0
    assert set(seen) == {"FlaxState"}
    logs, _ = state.test_step((X, Y))
    assert float(logs.metrics.steps) == 2.0


def test_a_params_term_takes_no_sample_weights():
    # A scalar regularizer is one value for the batch: sample weights do not apply to it.
    state = build("linen", {"l2": l2})
    logs, _ = state.train_step((X, Y, jnp.ones(8)))
    np.testing.assert_allclose(float(logs.losses.l2), float(l2(None, None, state.params)))


def test_the_extras_a_function_asks_for():
    assert ciclo.adapters.requested_extras(l2) == ("params",)
    assert ciclo.adapters.requested_extras(optax.softmax_cross_entropy_with_integer_labels) == ()
    assert ciclo.adapters.requested_extras(lambda p, t, *, state: 0) == ("state",)
