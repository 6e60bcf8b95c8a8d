"""Mixed precision (``compute_dtype``, ``loss_scale``) and averaged weights (``ema``) of a
plain ``ManagedState``, under every strategy, fused and accumulated, and across a
checkpoint."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import ciclo

W_TRUE = np.array([1.0, -2.0, 0.5, 3.0], np.float32)


def batches(n: int, rows: int = 16, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x = rng.normal(size=(rows, 4)).astype(np.float32)
        out.append((x, x @ W_TRUE))
    return out


SEEN: list[tuple[str, str]] = []  # (params dtype, inputs dtype) of each trace


@ciclo.managed.train_step
def regression_step(state: Any, batch: Any) -> tuple[ciclo.Logs, Any]:
    x, y = batch
    SEEN.append((str(state.params["w"].dtype), str(x.dtype)))
    pred = x @ state.params["w"] + state.params["b"]
    loss = jnp.mean((pred - y.astype(pred.dtype)) ** 2)
    return ciclo.logs().add_loss("loss", loss).add_metric("pred", pred.mean()), state


def create(**options: Any) -> ciclo.managed.ManagedState:
    params = {"w": jnp.zeros(4), "b": jnp.zeros(())}
    return ciclo.managed.ManagedState.create(params=params, tx=optax.adam(0.1), **options)


def floating_dtypes(tree: Any) -> set[str]:
    return {str(x.dtype) for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.floating)}


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_the_step_computes_in_the_compute_dtype_and_keeps_float32_state(dtype):
    SEEN.clear()
    scale = "dynamic" if dtype == jnp.float16 else None
    state = create(compute_dtype=dtype, loss_scale=scale)
    logs, state = regression_step(state, batches(1)[0])
    assert [(jnp.dtype(dtype).name, jnp.dtype(dtype).name)] == SEEN
    assert floating_dtypes(state.params) == floating_dtypes(state.opt_state) == {"float32"}
    assert logs.losses.loss.dtype == logs.metrics.pred.dtype == jnp.float32


@pytest.mark.parametrize(("dtype", "scale"), [(jnp.bfloat16, None), (jnp.float16, "dynamic")])
def test_mixed_precision_training_is_close_to_float32_but_not_equal(dtype, scale):
    data = batches(60)
    reference, _, _ = ciclo.loop(create(), data, {ciclo.every(1): regression_step})
    mixed, history, _ = ciclo.loop(
        create(compute_dtype=dtype, loss_scale=scale), data, {ciclo.every(1): regression_step}
    )
    np.testing.assert_allclose(mixed.params["w"], reference.params["w"], atol=0.05)
    assert not np.array_equal(mixed.params["w"], reference.params["w"])  # it did compute lower
    assert history.collect("loss")[-1] < 0.05 * history.collect("loss")[0]


def test_a_step_that_changes_no_params_keeps_their_float32_values():
    @ciclo.managed.step
    def evaluate(state, batch):
        return ciclo.logs().add_metric("sum", (batch @ state.params["w"]).sum()), state

    params = {"w": jnp.full(4, 1.001), "b": jnp.zeros(())}
    state = create(compute_dtype=jnp.bfloat16).replace(params=params)
    logs, new = evaluate(state, np.ones((2, 4), np.float32))
    np.testing.assert_array_equal(new.params["w"], state.params["w"])  # no bfloat16 trip
    assert new.params["w"].dtype == jnp.float32
    assert logs.metrics.sum.dtype == jnp.float32


def hand_average(params_history: list[Any], decay: float) -> Any:
    average = params_history[0]
    for params in params_history[1:]:
        average = jax.tree.map(lambda a, p: decay * a + (1 - decay) * p, average, params)
    return average


STRATEGIES = ["jit", "data-parallel", "fsdp", "sharded", "pmap"]


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("options", [{"steps_per_call": 3}, {"accumulate_steps": 2}])
def test_ema_params_are_the_moving_average_of_every_update(strategy, options):
    data = batches(6)
    # The parameters after each update, step by step on one device.
    state = create(ema=0.8)
    history = [state.params]
    for batch in data:
        _, state = regression_step(state, batch)
        history.append(state.params)
    expected = hand_average(history, 0.8)

    state = create(ema=0.8).with_strategy(strategy, **options)
    state, _, _ = ciclo.loop(state, data, {ciclo.every(1): regression_step})
    for name in ("w", "b"):
        np.testing.assert_allclose(state.ema_params[name], expected[name], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(state.params[name], history[-1][name], rtol=1e-5, atol=1e-6)
    assert int(state.step) == 6


def test_the_average_is_placed_like_the_parameters():
    state = ciclo.managed.ManagedState.create(
        params={"w": jnp.zeros((64, 8))}, tx=optax.sgd(0.1), strategy="fsdp", ema=0.9
    )
    assert state.ema_params["w"].sharding.spec == state.params["w"].sharding.spec
    assert state.ema_params["w"].sharding.spec == jax.sharding.PartitionSpec("data")


def test_a_dynamic_loss_scale_skips_a_non_finite_step_and_halves():
    state = create(compute_dtype=jnp.float16, loss_scale="dynamic", ema=0.5)
    _, state = regression_step(state, batches(1)[0])
    x, y = batches(1, seed=1)[0]
    x[0, 0] = np.inf
    _, skipped = regression_step(state, (x, y))
    assert int(skipped.step) == int(state.step) + 1
    for field in ("params", "opt_state", "ema_params"):
        for a, b in zip(
            jax.tree.leaves(getattr(skipped, field)),
            jax.tree.leaves(getattr(state, field)),
            strict=True,
        ):
            np.testing.assert_array_equal(a, b, err_msg=field)
    assert float(skipped.loss_scale.scale) == float(state.loss_scale.scale) / 2
    assert int(skipped.loss_scale.finite_steps) == 0


def test_a_dynamic_loss_scale_grows_after_period_finite_steps():
    scale = ciclo.managed.LossScale.create("dynamic", period=3)
    state = create(loss_scale=scale)  # float32: 2**17 does not overflow
    state, _, _ = ciclo.loop(state, batches(7), {ciclo.every(1): regression_step})
    # 32768 -> x2 after steps 3 and 6; one finite step since
    assert float(state.loss_scale.scale) == 2.0**17
    assert int(state.loss_scale.finite_steps) == 1


def test_a_static_loss_scale_gives_the_unscaled_update():
    data = batches(3)
    plain, _, _ = ciclo.loop(create(), data, {ciclo.every(1): regression_step})
    scaled, _, _ = ciclo.loop(create(loss_scale=1024.0), data, {ciclo.every(1): regression_step})
    np.testing.assert_allclose(scaled.params["w"], plain.params["w"], rtol=1e-6)
    assert float(scaled.loss_scale.scale) == 1024.0


def test_ema_and_the_loss_scale_are_checkpointed_and_resumed_exactly(tmp_path):
    data = batches(8)
    options = {"compute_dtype": jnp.float16, "loss_scale": "dynamic", "ema": 0.7}

    def run(state, stop):
        return ciclo.loop(
            state,
            data,
            {ciclo.every(1): regression_step, ciclo.every(2): ciclo.checkpoint(tmp_path)},
            stop=stop,
            resume=tmp_path,
        )[0]

    uninterrupted, _, _ = ciclo.loop(create(**options), data, {ciclo.every(1): regression_step})
    run(create(**options), 5)  # saved at 2 and 4
    resumed = run(create(**options), None)
    for field in ("params", "ema_params", "loss_scale"):
        for a, b in zip(
            jax.tree.leaves(getattr(resumed, field)),
            jax.tree.leaves(getattr(uninterrupted, field)),
            strict=True,
        ):
            np.testing.assert_array_equal(a, b, err_msg=field)


def test_ema_state_puts_the_average_in_place_of_the_params():
    state = create(ema=0.5)
    _, state = regression_step(state, batches(1)[0])
    averaged = state.ema_state()
    np.testing.assert_array_equal(averaged.params["w"], state.ema_params["w"])
    assert create().ema_state() is None


def test_train_loop_evaluates_the_average_too():
    @ciclo.managed.step
    def test_step(state, batch):
        x, y = batch
        loss = jnp.mean((x @ state.params["w"] + state.params["b"] - y) ** 2)
        return ciclo.logs().add_loss("loss", loss), state

    state, history, _ = ciclo.train_loop(
        create(ema=0.9),
        batches(6),
        {ciclo.on_train_step: regression_step, ciclo.on_test_step: test_step},
        test_dataset=batches(2, seed=3),
        epoch_duration=3,
    )
    steps, test, test_ema = history.collect("steps", "loss_test", "loss_test_ema")
    assert steps == [2, 5]
    _, logs, _ = ciclo.test_loop(state.ema_state(), batches(2, seed=3), {"on_test_step": test_step})
    assert test_ema[-1] == pytest.approx(float(logs.entry_value("loss")), rel=1e-6)
    assert test_ema[-1] != test[-1]


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"compute_dtype": jnp.int32}, TypeError, r"compute_dtype=.*int32.* not a floating"),
        ({"compute_dtype": "half-ish"}, TypeError, r"compute_dtype='half-ish'"),
        ({"ema": 1.0}, ValueError, r"ema=1.0: give the decay .* in \[0, 1\)"),
        ({"ema": True}, ValueError, r"ema=True"),
        ({"loss_scale": "big"}, ValueError, r"loss_scale='big': give a number"),
        ({"loss_scale": -2.0}, ValueError, r"loss_scale=-2.0"),
        ({"compute_dtpye": jnp.bfloat16}, TypeError, r"did you mean 'compute_dtype'"),
    ],
)
def test_bad_options_name_the_option_and_the_fix(options, error, match):
    with pytest.raises(error, match=match):
        create(**options)
