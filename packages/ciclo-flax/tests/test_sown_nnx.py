"""Losses and metrics an NNX model sows (ciclo_flax.SownLoss / SownMetric) reach the logs,
sown losses add to the objective, and nothing sown stays in the state."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import ciclo
import ciclo_flax
from ciclo_flax import _sown

CE = optax.softmax_cross_entropy_with_integer_labels
SOWN = (ciclo_flax.SownLoss, ciclo_flax.SownMetric)


class Sowing(nnx.Module):
    """A linear classifier with batch norm that sows an L2 loss and two metrics."""

    def __init__(self, weight: float = 0.1, *, rngs: nnx.Rngs):
        self.weight = weight
        self.norm = nnx.BatchNorm(4, rngs=rngs)
        self.linear = nnx.Linear(4, 3, rngs=rngs)

    def __call__(self, x):
        y = self.linear(self.norm(x))
        self.sow(ciclo_flax.SownLoss, "l2", self.weight * jnp.sum(self.linear.kernel[...] ** 2))
        self.sow(ciclo_flax.SownMetric, "mean_output", jnp.mean(y))
        self.sow("metrics", "input_mean", jnp.mean(x))  # the Linen spelling, same type
        self.sow(nnx.Intermediate, "features", y)  # not a log: not kept
        return y


def data(n=64, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4)).astype(np.float32)
    return x, (x[:, 0] > 0).astype(np.int32)


def make(weight=0.1, **options):
    return ciclo_flax.create_nnx_state(
        Sowing(weight, rngs=nnx.Rngs(0)), optax.sgd(0.1), losses={"loss": CE}, key=0, **options
    )


def sown_leaves(tree):
    leaves = jax.tree_util.tree_leaves(tree, is_leaf=lambda v: isinstance(v, nnx.Variable))
    return [v for v in leaves if isinstance(v, SOWN)]


def test_sown_losses_and_metrics_reach_training_and_evaluation_history():
    x, y = data()
    batches = [(x[i : i + 16], y[i : i + 16]) for i in range(0, 64, 16)]
    state, history, _ = ciclo.train_loop(
        make(), batches, test_dataset=lambda: batches[:2], epoch_duration=4, stop=4
    )
    for name in ("l2", "mean_output", "input_mean"):
        assert len(history.collect(name)) == 4, name
        assert len(history.collect(f"{name}_test")) == 1, name
    plain, _, _ = ciclo.train_loop(make(0.0), batches, stop=4)
    norm = float(jnp.sum(state.params["linear"]["kernel"][...] ** 2))
    plain_norm = float(jnp.sum(plain.params["linear"]["kernel"][...] ** 2))
    assert norm < plain_norm  # the l2 term was differentiated


def test_the_sown_gradient_equals_the_hand_written_one():
    x, y = data(16)
    state = make(0.1)
    logs, new = state.train_step((x, y))
    params = state.params
    model = state.model
    mean, var = x.mean(0), x.var(0)
    scale, bias = model.norm.scale[...], model.norm.bias[...]
    normed = (x - mean) / jnp.sqrt(var + model.norm.epsilon) * scale + bias

    def objective(p):
        logits = normed @ p["linear"]["kernel"][...] + p["linear"]["bias"][...]
        ce = CE(logits, y).mean()
        return ce + 0.1 * jnp.sum(p["linear"]["kernel"][...] ** 2)

    grads = jax.grad(objective)(params)
    expected = params["linear"]["kernel"][...] - 0.1 * grads["linear"]["kernel"][...]
    np.testing.assert_allclose(new.params["linear"]["kernel"][...], expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        logs.losses.l2, 0.1 * jnp.sum(params["linear"]["kernel"][...] ** 2), rtol=1e-6
    )
    np.testing.assert_allclose(logs.metrics.input_mean, x.mean(), rtol=1e-6)


def test_the_state_and_its_checkpoints_hold_no_sown_values(tmp_path):
    x, y = data()
    batches = [(x[i : i + 16], y[i : i + 16]) for i in range(0, 64, 16)]
    initial = make()
    state, _, _ = ciclo.loop(
        initial,
        batches,
        {ciclo.every(1): type(initial).train_step, ciclo.every(4): ciclo.checkpoint(tmp_path)},
    )
    assert not sown_leaves(state.model_state)
    assert not sown_leaves(nnx.state(state.model))
    assert not hasattr(state.model, "features")  # nnx.Intermediate sows are not kept either
    assert jax.tree.structure(state.model_state) == jax.tree.structure(initial.model_state)
    restored, _, elapsed = ciclo.restore(tmp_path, make())  # a fresh state's structure
    assert elapsed.steps == 4
    np.testing.assert_array_equal(
        restored.params["linear"]["kernel"][...], state.params["linear"]["kernel"][...]
    )


def test_a_step_sees_only_its_own_sown_values_summed_losses_averaged_metrics():
    class Twice(nnx.Module):  # one layer called twice per step: two sows of each name
        def __init__(self, rngs):
            self.linear = nnx.Linear(4, 4, rngs=rngs)

        def __call__(self, x):
            for scale in (1.0, 3.0):
                self.sow(ciclo_flax.SownLoss, "aux", 0.0 * jnp.sum(x) + scale)
                self.sow(ciclo_flax.SownMetric, "input_mean", scale * jnp.mean(x))
            return self.linear(x)

    state = ciclo_flax.create_nnx_state(
        Twice(nnx.Rngs(0)), optax.sgd(0.1), losses={"loss": CE}, key=0
    )
    y = np.zeros(8, np.int32)
    for mean in (1.0, 5.0):  # the second step's logs are its own only
        logs, state = state.train_step((np.full((8, 4), mean, np.float32), y))
        assert float(logs.losses.aux) == 4.0  # 1 + 3, summed
        assert float(logs.metrics.input_mean) == pytest.approx(2 * mean)  # (1 + 3) / 2 * mean
    logs, _ = state.test_step((np.full((8, 4), 2.0, np.float32), y))
    assert float(logs.metrics.input_mean) == pytest.approx(4.0)
    assert not sown_leaves(state.model_state)


def test_the_same_name_sown_by_two_modules_is_logged_by_path():
    class Block(nnx.Module):
        def __init__(self, rngs):
            self.linear = nnx.Linear(4, 4, rngs=rngs)

        def __call__(self, x):
            self.sow(ciclo_flax.SownLoss, "l2", jnp.sum(self.linear.kernel[...] ** 2))
            return self.linear(x)

    class Stack(nnx.Module):
        def __init__(self, rngs):
            self.blocks = nnx.List([Block(rngs), Block(rngs)])

        def __call__(self, x):
            for block in self.blocks:
                x = block(x)
            return x

    state = ciclo_flax.create_nnx_state(
        Stack(nnx.Rngs(0)), optax.sgd(0.1), losses={"loss": CE}, key=0
    )
    logs, _ = state.train_step((np.ones((8, 4), np.float32), np.zeros(8, np.int32)))
    assert sorted(logs.losses) == ["blocks/0/l2", "blocks/1/l2", "loss"]


def test_a_sown_name_that_is_also_a_step_loss_or_metric_is_an_error():
    class Clash(nnx.Module):
        def __init__(self, name, rngs):
            self.name = name
            self.linear = nnx.Linear(4, 3, rngs=rngs)

        def __call__(self, x):
            self.sow(ciclo_flax.SownMetric, self.name, jnp.mean(x))
            return self.linear(x)

    batch = (np.ones((8, 4), np.float32), np.zeros(8, np.int32))
    for name, owner in (("loss", "losses"), ("accuracy", "metrics")):
        state = ciclo_flax.create_nnx_state(
            Clash(name, nnx.Rngs(0)),
            optax.sgd(0.1),
            losses={"loss": CE},
            metrics={"accuracy": lambda p, t: p.argmax(-1) == t},
        )
        message = f"recorded metrics '{name}'.*state's {owner} already has '{name}': rename"
        with pytest.raises(ValueError, match=message):
            state.train_step(batch)
        with pytest.raises(ValueError, match=message):
            state.test_step(batch)


def test_values_sown_by_a_call_outside_ciclo_are_dropped_and_the_model_kept():
    model = Sowing(rngs=nnx.Rngs(0))
    with pytest.warns(DeprecationWarning, match="sow"):  # Flax: sow outside nnx.capture
        model(np.ones((2, 4), np.float32))
    assert sown_leaves(nnx.state(model))
    state = ciclo_flax.create_nnx_state(model, optax.sgd(0.1), losses={"loss": CE})
    assert not sown_leaves(state.model_state)
    assert sown_leaves(nnx.state(model))  # the model passed in is not modified
    logs, state = state.train_step(data(16))
    assert "l2" in logs.losses
    assert not sown_leaves(state.model_state)


@pytest.mark.filterwarnings("ignore:Using 'Module.sow\\(\\)' outside:DeprecationWarning")
def test_without_nnx_capture_sown_values_are_popped_after_the_call(monkeypatch):
    # Eager: the step's Python runs at each call (no compiled step cached by another test).
    reference, _ = make(strategy="eager").train_step(data(16))
    monkeypatch.setattr(_sown, "_capture", None)  # Flax releases before nnx.capture
    state = make(strategy="eager")
    for _ in range(2):  # the popped values do not come back at the next step
        logs, state = state.train_step(data(16))
        assert sorted(logs.metrics) == ["input_mean", "mean_output"]
        assert jax.tree.structure(state.model_state) == jax.tree.structure(make().model_state)
    np.testing.assert_allclose(logs.metrics.input_mean, reference.metrics.input_mean, rtol=1e-6)
    assert not sown_leaves(state.model_state)


@pytest.mark.parametrize(
    ("strategy", "options"), [("data-parallel", {}), ("jit", {"steps_per_call": 2})]
)
def test_sown_values_are_the_same_under_data_parallel_and_fused_steps(strategy, options):
    x, y = data()
    batches = [(x[i : i + 16], y[i : i + 16]) for i in range(0, 64, 16)]

    def run(state):
        return ciclo.loop(state, batches, {ciclo.every(1): type(state).train_step})[:2]

    reference, expected = run(make())
    state, history = run(make().with_strategy(strategy, **options))
    for name in ("l2", "input_mean", "mean_output"):
        np.testing.assert_allclose(
            history.collect(name), expected.collect(name), rtol=1e-5, atol=1e-6
        )
    np.testing.assert_allclose(
        state.params["linear"]["kernel"][...],
        reference.params["linear"]["kernel"][...],
        rtol=1e-5,
        atol=1e-6,
    )


def test_a_type_registered_as_losses_before_ciclo_flax_is_recorded_too(monkeypatch):
    from flax.nnx import variablelib

    class EarlierLoss(nnx.Variable):  # e.g. another library registered "losses" first
        pass

    monkeypatch.setitem(variablelib.VariableTypeCache, "losses", EarlierLoss)

    class Model(nnx.Module):
        def __init__(self, rngs):
            self.linear = nnx.Linear(4, 3, rngs=rngs)

        def __call__(self, x):
            self.sow("losses", "aux", jnp.mean(x))  # resolves to EarlierLoss now
            self.sow(ciclo_flax.SownLoss, "l2", jnp.sum(self.linear.kernel[...] ** 2))
            return self.linear(x)

    state = ciclo_flax.create_nnx_state(
        Model(nnx.Rngs(0)), optax.sgd(0.1), losses={"loss": CE}, strategy="eager"
    )
    logs, state = state.train_step((np.full((8, 4), 2.0, np.float32), np.zeros(8, np.int32)))
    assert sorted(logs.losses) == ["aux", "l2", "loss"]
    assert float(logs.losses.aux) == 2.0
