"""Strategies: names, data-parallel and pmap against jit, batch placement errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import ciclo
from ciclo.managed import ManagedState

DEVICES = jax.device_count()
# One optimizer for every state (it is a static part of the state: a new one recompiles).
# SGD, not Adam: Adam hides a wrongly scaled gradient (e.g. summed instead of averaged
# over devices); SGD's update is proportional to it.
TX = optax.sgd(0.05, momentum=0.9)
needs_devices = pytest.mark.skipif(
    DEVICES < 2,
    reason="needs several devices: XLA_FLAGS=--xla_force_host_platform_device_count=8 "
    "(the nox test session sets it)",
)


@ciclo.managed.train_step
def regression_step(state, batch):
    x, y = batch
    pred = x @ state.params["w"] + state.params["b"]
    logs = ciclo.logs()
    logs.add_loss("loss", jnp.mean((pred - y) ** 2))
    logs.add_metric("mae", jnp.mean(jnp.abs(pred - y)))
    return logs, state


@ciclo.managed.step
def predict_step(state, batch):
    x, _ = batch
    return ciclo.logs().add_output("pred", x @ state.params["w"]), state


def make_state(strategy, **options):
    params = {"w": jnp.zeros(4), "b": jnp.zeros(())}
    state = ManagedState.create(params=params, tx=TX, strategy="jit")
    return state.with_strategy(strategy, **options)


def make_batches(steps=20, batch_size=16, seed=0):
    rng = np.random.default_rng(seed)
    w_true = rng.normal(size=4).astype(np.float32)
    batches = []
    for _ in range(steps):
        x = rng.normal(size=(batch_size, 4)).astype(np.float32)
        y = x @ w_true + 0.1 * rng.normal(size=batch_size).astype(np.float32)
        batches.append((x, y))
    return batches


def train(state, batches):
    logs = None
    for batch in batches:
        logs, state = regression_step(state, batch)
    return logs, state


def assert_params_close(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6)


# --- names --------------------------------------------------------------------------------
def test_builtin_strategy_names():
    builtin = ["data-parallel", "data_parallel", "eager", "jit", "pmap"]
    names = ciclo.managed.strategy_names()
    assert [name for name in names if name in builtin] == builtin  # sorted, all there


def test_alias_shares_one_instance_and_options_are_cached():
    assert ciclo.managed.get_strategy("data_parallel") is ciclo.managed.get_strategy(
        "data-parallel"
    )
    fused = ciclo.managed.get_strategy("jit", steps_per_call=4)
    assert fused is ciclo.managed.get_strategy("jit", steps_per_call=4)
    assert fused.steps_per_call == 4
    assert ciclo.managed.get_strategy("jit").steps_per_call == 1


def test_unknown_strategy_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown strategy 'tpu-magic'.*'data-parallel'.*'pmap'"):
        ManagedState.create(params={}, tx=None, strategy="tpu-magic")


def test_unknown_option_names_the_strategy():
    with pytest.raises(TypeError, match=r"strategy 'eager' does not take the options"):
        ciclo.managed.get_strategy("eager", steps_per_call=2)


@pytest.mark.parametrize("option", ["steps_per_call", "accumulate_steps"])
@pytest.mark.parametrize("value", [0, -1, 2.0, True])
def test_bad_counts_are_rejected(option, value):
    with pytest.raises(ValueError, match=rf"{option}=\.\.\.\) must be a positive int"):
        ciclo.managed.jit(**{option: value})


def test_options_on_a_strategy_object_are_refused():
    with pytest.raises(TypeError, match=r"only apply to a strategy given by name"):
        ciclo.managed.get_strategy(ciclo.managed.jit(), steps_per_call=2)


def test_registered_strategy_is_usable_by_name():
    calls = []

    def counting():
        def compile_step(fn):
            def run(state, batch, broadcasts):
                calls.append(1)
                return jax.jit(fn)(state, batch, broadcasts)

            return run

        return ciclo.managed.Strategy("counting", lambda s: s, lambda b: b, compile_step)

    ciclo.managed.register_strategy("counting-test", counting)
    state = make_state("counting-test")
    _, state = regression_step(state, make_batches(steps=1)[0])
    assert state.strategy.name == "counting"
    assert calls == [1]
    assert int(state.step) == 1


# --- data-parallel and pmap equal jit -----------------------------------------------------
@needs_devices
@pytest.mark.parametrize("strategy", ["data-parallel", "pmap"])
def test_20_parallel_steps_equal_20_jit_steps(strategy):
    batches = make_batches()
    ref_logs, ref = train(make_state("jit"), batches)
    logs, state = train(make_state(strategy), batches)
    assert_params_close(state.params, ref.params)
    assert_params_close(state.opt_state, ref.opt_state)
    np.testing.assert_allclose(float(logs.losses.loss), float(ref_logs.losses.loss), rtol=1e-5)
    np.testing.assert_allclose(float(logs.metrics.mae), float(ref_logs.metrics.mae), rtol=1e-5)
    # Ordinary global arrays: no device axis, full shapes, on every device.
    assert int(state.step) == 20
    w = state.params["w"]
    assert isinstance(w, jax.Array)
    assert w.shape == (4,)
    assert w.sharding.is_fully_replicated
    assert len(w.sharding.device_set) == DEVICES


@needs_devices
def test_data_parallel_shards_the_batch_and_replicates_the_state():
    state = make_state("data-parallel")
    x, _ = state.strategy.place_batch(make_batches(steps=1)[0])
    assert x.shape == (16, 4)
    assert x.sharding.spec == jax.sharding.PartitionSpec("data")
    assert {shard.data.shape for shard in x.addressable_shards} == {(16 // DEVICES, 4)}
    assert all(leaf.sharding.is_fully_replicated for leaf in jax.tree.leaves(state))


@needs_devices
def test_data_parallel_moves_a_state_made_elsewhere_back_in():
    state = make_state("data-parallel")
    # A callback that builds new params on one device must not break the next step.
    state = state.replace(params=jax.device_put(state.params, jax.devices()[1]))
    _, state = regression_step(state, make_batches(steps=1)[0])
    assert state.params["w"].sharding.is_fully_replicated
    assert len(state.params["w"].sharding.device_set) == DEVICES


@needs_devices
@pytest.mark.parametrize("strategy", ["data-parallel", "pmap"])
def test_outputs_come_back_as_the_whole_batch_in_order(strategy):
    batch = make_batches(steps=1)[0]
    state = make_state("jit").replace(params={"w": jnp.arange(4.0), "b": jnp.zeros(())})
    expected, _ = predict_step(state, batch)
    logs, _ = predict_step(state.with_strategy(strategy), batch)
    assert logs.outputs.pred.shape == (16,)
    np.testing.assert_allclose(np.asarray(logs.outputs.pred), np.asarray(expected.outputs.pred))


@needs_devices
def test_pmap_steps_may_use_the_axis_name():
    @ciclo.managed.step
    def global_mean(state, batch):
        x, _ = batch
        local = x.mean()
        return ciclo.logs().add_metric("mean", jax.lax.pmean(local, "batch")), state

    batch = make_batches(steps=1)[0]
    logs, _ = global_mean(make_state("pmap"), batch)
    np.testing.assert_allclose(float(logs.metrics.mean), batch[0].mean(), rtol=1e-6)


@needs_devices
@pytest.mark.parametrize("strategy", ["data-parallel", "pmap"])
def test_batch_not_divisible_by_devices_is_a_clear_error_during_training(strategy):
    batches = make_batches(steps=2, batch_size=30)
    with pytest.raises(ValueError, match=r"has 30 rows.*8 devices.*multiple of 8.*drop") as info:
        ciclo.loop(make_state(strategy), batches, {ciclo.every(1): regression_step})
    assert "regression_step at step 0" in "".join(getattr(info.value, "__notes__", []))


@needs_devices
def test_data_parallel_with_a_user_mesh_and_axis_name():
    mesh = jax.make_mesh(
        (DEVICES // 2, 2), ("batch", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2
    )
    strategy = ciclo.managed.data_parallel(mesh=mesh, axis="batch")
    batches = make_batches(steps=3)
    _, ref = train(make_state("jit"), batches)
    _, state = train(make_state("jit").with_strategy(strategy), batches)
    assert_params_close(state.params, ref.params)
    x, _ = strategy.place_batch(batches[0])
    assert {shard.data.shape for shard in x.addressable_shards} == {(16 // (DEVICES // 2), 4)}


def test_data_parallel_rejects_a_mesh_without_the_axis():
    mesh = jax.make_mesh((1,), ("model",), axis_types=(jax.sharding.AxisType.Auto,))
    with pytest.raises(ValueError, match=r"the mesh has axes \('model',\).*axis='model'"):
        ciclo.managed.data_parallel(mesh=mesh)


@needs_devices
@pytest.mark.parametrize("strategy", ["data-parallel", "pmap"])
def test_fused_and_accumulated_parallel_steps_equal_jit_steps(strategy):
    batches = make_batches(steps=8)
    _, ref = train(make_state("jit"), batches)
    fast = make_state(strategy, steps_per_call=4, accumulate_steps=2)
    state, history, _ = ciclo.loop(fast, batches, {ciclo.every(1): regression_step})
    assert_params_close(state.params, ref.params)
    assert len(history.collect("loss")) == 8
    assert state.params["w"].shape == (4,)


def test_a_batch_that_does_not_divide_over_the_devices_points_to_padding():
    state = make_state("data-parallel")
    (batch,) = make_batches(steps=1, batch_size=100)
    with pytest.raises(
        ValueError,
        match=r"data-parallel: batch leaf \[0\] has 100 rows .* does not divide evenly over 8 "
        r"devices\. Use a batch size that is a multiple of 8, or pad the incomplete last batch "
        r"to full size with rows of sample_weight 0 and count its real rows with "
        r"batch_size_fn .* see 'Evaluation sets that do not divide over the devices' in "
        r"docs/sharding\.md\.",
    ):
        regression_step(state, batch)
