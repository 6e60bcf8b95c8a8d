"""What a reduced-precision managed step logs: float32 values, widened inside the compiled
step; a hand-written loss is computed in the compute dtype unless its input is widened."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import optax
import pytest

import ciclo


def make_step(widen: bool):
    @ciclo.managed.train_step
    def train_step(state, batch):
        x, labels = batch
        logits = x @ state.params["w"]  # bfloat16 under compute_dtype
        if widen:  # the docs' recipe: the loss in float32
            logits = logits.astype(jnp.float32)
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
        return ciclo.logs().add_loss("loss", loss).add_metric("logit", logits[0, 0]), state

    return train_step


def state():
    w = jnp.asarray(np.random.default_rng(0).normal(size=(16, 10)), jnp.float32)
    return ciclo.managed.ManagedState.create(
        params={"w": w}, tx=optax.sgd(0.01), compute_dtype=jnp.bfloat16
    )


BATCHES = [
    (np.random.default_rng(i).normal(size=(8, 16)).astype(np.float32), np.arange(8) % 10)
    for i in range(4)
]


def is_bfloat16(value: float) -> bool:
    return float(np.float32(value).astype(jnp.bfloat16)) == value


@pytest.mark.parametrize("fused", [False, True], ids=["one-step", "fused"])
def test_a_bfloat16_step_logs_float32_values(fused):
    step = make_step(widen=False)
    if fused:
        logs, _ = step.many(state(), BATCHES[:2])
    else:
        logs, _ = step(state(), BATCHES[0])
    assert logs.losses.loss.dtype == jnp.float32
    assert logs.metrics.logit.dtype == jnp.float32


def test_a_hand_written_loss_is_computed_in_bfloat16_unless_widened():
    _, history, _ = ciclo.loop(state(), BATCHES, {ciclo.every(1): make_step(widen=False)})
    assert all(is_bfloat16(v) for v in history.collect("loss"))  # bfloat16's digits
    _, history, _ = ciclo.loop(state(), BATCHES, {ciclo.every(1): make_step(widen=True)})
    losses = history.collect("loss")
    assert not any(is_bfloat16(v) for v in losses)  # float32's digits
    assert all(float(np.float32(v)) == v for v in losses)


@pytest.mark.parametrize("steps_per_call", [1, 2])
def test_the_history_says_a_bfloat16_step_logged_float32(steps_per_call):
    start = state().with_strategy("jit", steps_per_call=steps_per_call)
    _, history, _ = ciclo.loop(start, BATCHES, {ciclo.every(1): make_step(widen=False)})
    assert history.collect("loss").dtype == np.float32
    assert history.collect("logit").dtype == np.float32
    restored = ciclo.history()  # as a checkpoint keeps it
    restored.load_state_dict(history.state_dict())
    assert restored.collect("loss").dtype == np.float32
    assert restored.collect("loss") == history.collect("loss")
