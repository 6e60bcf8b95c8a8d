"""Losses and metrics a Linen module sows reach the logs; sown losses add to the objective."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import ciclo
import ciclo_flax


class Sowing(nn.Module):
    weight: float = 0.1

    @nn.compact
    def __call__(self, x):
        dense = nn.Dense(3)
        y = dense(x)
        l2 = self.weight * jnp.sum(dense.variables["params"]["kernel"] ** 2)
        self.sow("losses", "l2", l2)
        self.put_variable("metrics", "mean_output", jnp.mean(y))
        return y


def data(n=64):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 4)).astype(np.float32)
    return x, (x[:, 0] > 0).astype(np.int32)


def make(weight):
    x, _ = data()
    return ciclo_flax.create_state(
        Sowing(weight),
        x[:1],
        optax.sgd(0.1),
        losses={"loss": optax.softmax_cross_entropy_with_integer_labels},
        key=0,
    )


def test_a_sown_loss_reaches_history_and_changes_the_gradients():
    x, y = data()
    batches = [(x[i : i + 16], y[i : i + 16]) for i in range(0, 64, 16)]
    state, history, _ = ciclo.train_loop(
        make(0.1), batches, test_dataset=lambda: batches[:2], epoch_duration=4, stop=4
    )
    assert len(history.collect("l2")) == 4
    assert len(history.collect("mean_output")) == 4
    assert history.collect("l2_test")  # writable in evaluation too
    plain, _, _ = ciclo.train_loop(make(0.0), batches, stop=4)
    norm = float(jnp.sum(state.params["Dense_0"]["kernel"] ** 2))
    plain_norm = float(jnp.sum(plain.params["Dense_0"]["kernel"] ** 2))
    assert norm < plain_norm  # the l2 term was differentiated
    assert "losses" not in state.model_state


def test_the_sown_gradient_equals_the_hand_written_one():
    x, y = data(16)
    state = make(0.1)
    logs, new = state.train_step((x, y))
    params = state.params

    def objective(p):
        logits = x @ p["Dense_0"]["kernel"] + p["Dense_0"]["bias"]
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
        return ce + 0.1 * jnp.sum(p["Dense_0"]["kernel"] ** 2)

    expected = jax.tree.map(lambda p, g: p - 0.1 * g, params, jax.grad(objective)(params))
    np.testing.assert_allclose(
        new.params["Dense_0"]["kernel"], expected["Dense_0"]["kernel"], rtol=1e-5, atol=1e-6
    )
    assert float(logs.losses.l2) > 0


def test_a_sown_name_that_is_also_a_step_loss_is_an_error():
    class Clash(nn.Module):
        @nn.compact
        def __call__(self, x):
            self.sow("losses", "loss", jnp.mean(x))
            return nn.Dense(3)(x)

    x, y = data(16)
    state = ciclo_flax.create_state(
        Clash(), x[:1], optax.sgd(0.1), losses={"loss": lambda p, t: jnp.mean(p)}
    )
    with pytest.raises(ValueError, match=r"recorded losses 'loss'.*state's losses already has"):
        state.train_step((x, y))
