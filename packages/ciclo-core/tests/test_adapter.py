"""The adapter contract in core: batches, losses, metrics and the generic steps, exercised
with the reference adapter ``FunctionState`` (no framework needed)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import ciclo
from ciclo.adapters import BatchFormat, FunctionState, StatefulMetric, mean_metric, reduce_values

CE = optax.softmax_cross_entropy_with_integer_labels


def linear(params, model_state, x, *, training, key):
    """A linear model whose model_state counts training calls (like batch-norm statistics)."""
    count = model_state["count"] + 1 if training else model_state["count"]
    return x @ params["w"], {"count": count}


def accuracy(logits, labels):
    return logits.argmax(-1) == labels


def make_state(**kwargs):
    options = {
        "apply_fn": linear,
        "params": {"w": jnp.zeros((3, 2))},
        "model_state": {"count": jnp.zeros((), jnp.int32)},
        "tx": optax.sgd(0.1),
        "losses": {"loss": CE},
        "metrics": {"accuracy": accuracy},
    }
    options.update(kwargs)
    return FunctionState.create(**options)


X = jnp.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 1.0, 0.0]])
Y = jnp.array([0, 1, 1, 0])


# --- batches -------------------------------------------------------------------------------


def test_batch_format_unpacks_tuples_and_mappings():
    fmt = BatchFormat()
    assert fmt.unpack((1, 2), step="s") == (1, 2, None)
    assert fmt.unpack([1, 2, 3], step="s") == (1, 2, 3)
    assert fmt.unpack({"inputs": 1, "targets": 2}, step="s") == (1, 2, None)
    custom = BatchFormat(inputs_key=("image", "mask"), targets_key="label", sample_weight_key="w")
    assert custom.unpack({"image": 1, "mask": 0, "label": 2, "w": 3}, step="s") == (
        {"image": 1, "mask": 0},
        2,
        3,
    )


def test_batch_format_for_prediction_takes_inputs_alone():
    fmt = BatchFormat(inputs_key="x")
    assert fmt.unpack(7, step="s", targets=False) == (7, None, None)
    assert fmt.unpack((7, 8), step="s", targets=False) == (7, None, None)
    assert fmt.unpack({"x": 7}, step="s", targets=False) == (7, None, None)


def test_batch_format_errors_name_the_step_and_the_fix():
    fmt = BatchFormat()
    with pytest.raises(ValueError, match=r"train_step: a batch tuple must be .* got a tuple of 4"):
        fmt.unpack((1, 2, 3, 4), step="train_step")
    with pytest.raises(TypeError, match=r"test_step: cannot find inputs and targets .* int"):
        fmt.unpack(5, step="test_step")
    with pytest.raises(KeyError, match=r"has keys \['image', 'label'\] but not \['inputs', 'targ"):
        fmt.unpack({"image": 1, "label": 2}, step="train_step")


def test_mapping_batches_with_keys_chosen_at_create():
    state = make_state(inputs_key="image", targets_key="label")
    _, new = state.train_step({"image": X, "label": Y})
    assert int(new.step) == 1
    with pytest.raises(KeyError, match=r"inputs_key='image'"):
        state.train_step({"inputs": X, "targets": Y})


# --- reductions ----------------------------------------------------------------------------


def test_reduce_values_means_and_weighted_means():
    v = jnp.array([1.0, 2.0, 6.0])
    assert float(reduce_values(v, kind="loss", name="l")) == pytest.approx(3.0)
    assert float(reduce_values(jnp.float32(4.0), kind="loss", name="l")) == 4.0
    w = jnp.array([1.0, 1.0, 0.0])
    assert float(reduce_values(v, w, kind="loss", name="l")) == pytest.approx(1.5)
    assert float(reduce_values(v, 2 * w, kind="loss", name="l")) == pytest.approx(1.5)
    assert float(reduce_values(v, jnp.zeros(3), kind="loss", name="l")) == 0.0
    per_token = jnp.array([[1.0, 3.0], [5.0, 7.0]])  # trailing axes averaged first
    assert float(reduce_values(per_token, jnp.array([0.0, 1.0]), kind="loss", name="l")) == 6.0
    booleans = jnp.array([True, False, True, True])
    assert float(reduce_values(booleans, kind="metric", name="acc")) == 0.75


def test_reduce_values_errors():
    with pytest.raises(ValueError, match=r"loss 'l' returned a scalar, so the batch's sample"):
        reduce_values(jnp.float32(1.0), jnp.ones(3), kind="loss", name="l")
    with pytest.raises(ValueError, match=r"sample_weight has shape \(2,\).* shape \(3,\)"):
        reduce_values(jnp.ones(3), jnp.ones(2), kind="metric", name="m")


# --- steps ---------------------------------------------------------------------------------


def test_train_step_logs_losses_and_metrics_and_updates_model_state():
    state = make_state()
    logs, new = state.train_step((X, Y))
    assert float(logs.losses.loss) == pytest.approx(float(CE(X @ state.params["w"], Y).mean()))
    assert float(logs.metrics.accuracy) == 0.5  # all logits 0: argmax 0
    assert int(new.step) == 1
    assert int(new.model_state["count"]) == 1
    assert not np.allclose(new.params["w"], state.params["w"])


def test_eval_steps_freeze_the_model_state_and_params():
    state = make_state()
    _, state = state.train_step((X, Y))
    logs, after_test = state.test_step((X, Y))
    assert set(logs) == {"losses", "metrics"}
    out, after_predict = state.predict_step(X)
    assert out.outputs.predictions.shape == (4, 2)
    for after in (after_test, after_predict):
        assert int(after.model_state["count"]) == 1
        assert int(after.step) == 1
        np.testing.assert_array_equal(after.params["w"], state.params["w"])


def test_losses_are_summed_into_the_objective():
    one = make_state(losses={"a": CE})
    two = make_state(losses={"a": CE, "b": CE})
    _, after_one = one.train_step((X, Y))
    logs, after_two = two.train_step((X, Y))
    assert set(logs.losses) == {"a", "b"}
    np.testing.assert_allclose(after_two.params["w"], 2 * after_one.params["w"], rtol=1e-6)


def test_sample_weights_are_respected():
    state = make_state()
    weights = jnp.array([1.0, 1.0, 0.0, 0.0])
    logs_weighted, _ = state.test_step((X, Y, weights))
    logs_half, _ = state.test_step((X[:2], Y[:2]))
    assert float(logs_weighted.losses.loss) == pytest.approx(float(logs_half.losses.loss))
    _, trained_weighted = state.train_step((X, Y, weights))
    _, trained_half = state.train_step((X[:2], Y[:2]))
    np.testing.assert_allclose(trained_weighted.params["w"], trained_half.params["w"], rtol=1e-6)


def test_scalar_losses_work_without_weights_and_fail_clearly_with_them():
    state = make_state(losses={"loss": lambda p, t: CE(p, t).mean()})
    logs, _ = state.train_step((X, Y))
    assert logs.losses.loss.shape == ()
    with pytest.raises(ValueError, match="loss 'loss' returned a scalar"):
        state.train_step((X, Y, jnp.ones(4)))


def largest_logit():
    return StatefulMetric(
        init=lambda: jnp.full((), -jnp.inf),
        update=lambda m, preds, targets, w: jnp.maximum(m, preds.max()),
        merge=jnp.maximum,
        compute=lambda m: m,
    )


def test_stateful_metrics_accumulate_and_reset():
    state = make_state(params={"w": jnp.eye(3, 2)}, metrics={"max": largest_logit()})
    big = X.at[0, 0].set(5.0)
    logs, state = state.test_step((big, Y))
    assert float(logs.stateful_metrics.max) == 5.0
    logs, state = state.test_step((X, Y))
    assert float(logs.stateful_metrics.max) == 5.0  # remembers the earlier batch
    _, state = state.reset_step()
    logs, state = state.test_step((X, Y))
    assert float(logs.stateful_metrics.max) == 1.0


def test_mean_metric_is_the_exact_weighted_mean_over_batches():
    metric = mean_metric(accuracy)
    state = make_state(params={"w": jnp.eye(3, 2)}, metrics={"acc": metric})
    preds = X @ jnp.eye(3, 2)
    weights = jnp.array([1.0, 2.0, 0.0, 3.0])
    expected = float(jnp.sum(accuracy(preds, Y) * weights) / weights.sum())
    _, state = state.test_step((X[:1], Y[:1], weights[:1]))
    logs, state = state.test_step((X[1:], Y[1:], weights[1:]))
    assert float(logs.stateful_metrics.acc) == pytest.approx(expected)
    a = metric.update(metric.init(), preds[:1], Y[:1], weights[:1])
    b = metric.update(metric.init(), preds[1:], Y[1:], weights[1:])
    assert float(metric.compute(metric.merge(a, b))) == pytest.approx(expected)


def test_steps_work_as_loop_callbacks():
    state = make_state()
    batches = [(X, Y)] * 3
    state, history, _ = ciclo.loop(state, batches, {ciclo.every(1): state.train_step})
    assert int(state.step) == 3
    assert len(history.collect("loss")) == 3
    _, history, _ = ciclo.loop(state, batches, {ciclo.every(1): FunctionState.test_step})
    assert len(history.collect("accuracy")) == 3


def test_rng_key_differs_per_step_and_follows_the_seed():
    seen = []

    def noisy(params, model_state, x, *, training, key):
        seen.append(key)
        return x @ params["w"] + jax.random.normal(key, (x.shape[0], 2)), model_state

    state = make_state(apply_fn=noisy, key=3)
    logs_a, _ = state.test_step((X, Y))
    logs_b, _ = state.replace(step=state.step + 1).test_step((X, Y))
    logs_c, _ = make_state(apply_fn=noisy, key=3).test_step((X, Y))
    assert float(logs_a.losses.loss) != float(logs_b.losses.loss)
    assert float(logs_a.losses.loss) == float(logs_c.losses.loss)


# --- bad input -----------------------------------------------------------------------------


def test_create_validates_losses_and_metrics():
    with pytest.raises(TypeError, match=r"losses must be a dict \{name: fn\(preds, targets\)\}"):
        make_state(losses=CE)
    with pytest.raises(TypeError, match=r"metrics\['acc'\] must be fn\(preds, targets\) or a"):
        make_state(metrics={"acc": 1.0})
    with pytest.raises(ValueError, match="'loss' is both a loss and a metric"):
        make_state(metrics={"loss": accuracy})


def test_train_step_without_losses_says_how_to_add_them():
    state = make_state(losses=None)
    with pytest.raises(ValueError, match=r"train_step needs losses: .* losses=\{'loss'"):
        state.train_step((X, Y))
    logs, _ = state.test_step((X, Y))  # evaluation without losses is fine
    assert "losses" not in logs


def test_an_adapter_without_apply_is_a_clear_error():
    import dataclasses

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Unfinished(ciclo.adapters.AdapterState):
        pass

    state = Unfinished.create(params={}, tx=None, losses=None, strategy="eager")
    with pytest.raises(NotImplementedError, match=r"Unfinished must implement apply"):
        state.predict_step(X)


def test_static_holds_values_by_value_when_hashable_and_by_identity_otherwise():
    from ciclo.adapters import Static

    assert Static((1, 2)) == Static((1, 2))
    assert hash(Static((1, 2))) == hash((1, 2))
    items = [1, 2]
    assert Static(items) == Static(items)
    assert Static(items) != Static([1, 2])
    assert Static((1,)) != Static((2,))
    assert Static(1).__eq__(1) is NotImplemented


def test_states_built_alike_share_one_compiled_step():
    tx = optax.sgd(0.1)  # a new optimizer object is a new static field: compile again
    a, b = make_state(tx=tx), make_state(tx=tx)
    compiled = FunctionState.train_step.compiled_for(a.strategy)
    a.train_step((X, Y))
    size = compiled._cache_size()
    b.train_step((X, Y))  # equal static fields: no new compilation
    assert compiled._cache_size() == size


# --- logs the model records (apply's third item) -------------------------------------------


def recording(recorded):
    def apply_fn(params, model_state, x, *, training, key):
        preds, model_state = linear(params, model_state, x, training=training, key=key)
        return preds, model_state, recorded(params)

    return apply_fn


def test_recorded_losses_are_logged_and_differentiated():
    def l2(params):
        return {"losses": {"l2": jnp.sum((params["w"] - 1.0) ** 2)}}

    logs, new = make_state(apply_fn=recording(l2)).train_step((X, Y))
    plain_logs, plain = make_state().train_step((X, Y))
    assert float(logs.losses.l2) == 6.0
    assert "l2" not in plain_logs.losses
    # d/dw of sum((w - 1)^2) at w = 0 is -2: sgd(0.1) moves every weight up by 0.2 more.
    np.testing.assert_allclose(new.params["w"] - plain.params["w"], 0.2, rtol=1e-6)


@pytest.mark.parametrize("collection", ["losses", "metrics"])
def test_a_recorded_name_of_a_state_loss_is_an_error(collection):
    state = make_state(apply_fn=recording(lambda params: {collection: {"loss": 1.0}}))
    message = f"recorded {collection} 'loss'.*state's losses already has 'loss': rename"
    for step in (state.train_step, state.test_step):
        with pytest.raises(ValueError, match=message):
            step((X, Y))


# --- a loss or metric that fails -----------------------------------------------------------


def test_a_failing_loss_is_named_with_its_convention_the_shapes_and_a_hint():
    # optax.softmax_cross_entropy takes one-hot targets; these are integer labels
    state = make_state(losses={"loss": optax.softmax_cross_entropy})
    with pytest.raises(
        ValueError,
        match=r"^FunctionState\.train_step: loss 'loss' \(softmax_cross_entropy\) failed on "
        r"preds float32\[4, 2\] and targets int32\[4\]: ValueError: .*\n"
        r"Losses and metrics are called as fn\(preds, targets\), predictions first, and may "
        r"also take, by name, params .* and state .*: fn\(preds, targets, params\)\. "
        r"The targets are integer labels int32\[4\] and the preds have one more axis "
        r"float32\[4, 2\]: use a loss for integer labels "
        r"\(optax.softmax_cross_entropy_with_integer_labels\), or give one-hot targets "
        r"\(jax.nn.one_hot\(labels, 2\)\)\.",
    ):
        state.train_step((X, Y))


def test_a_metric_with_the_wrong_signature_is_named_in_the_test_step_of_the_concrete_class():
    def recall(targets, preds, threshold):
        return preds

    state = make_state(metrics={"recall": recall})
    with pytest.raises(
        TypeError,
        match=r"^FunctionState\.test_step: metric 'recall' \(.*recall\) failed on preds "
        r"float32\[4, 2\] and targets int32\[4\]: TypeError: .*missing 1 required positional "
        r"argument: 'threshold'\nLosses and metrics are called as fn\(preds, targets\)",
    ):
        state.test_step((X, Y))
    # one-hot targets given to a loss for integer labels
    with pytest.raises(
        (TypeError, ValueError), match=r"The targets have the preds' shape float32\[4, 2\]"
    ):
        make_state().train_step((X, jax.nn.one_hot(Y, 2)))


def test_a_failing_stateful_metric_is_named_with_its_convention():
    broken = StatefulMetric(
        init=lambda: jnp.zeros(()),
        update=lambda m, preds: m,  # forgets targets and sample_weight
        merge=jnp.add,
        compute=lambda m: m,
    )
    with pytest.raises(
        TypeError,
        match=r"metric 'broken' .* failed .*\nA StatefulMetric's update is called as "
        r"update\(metric_state, preds, targets, sample_weight\)",
    ):
        make_state(metrics={"broken": broken}).train_step((X, Y))


def test_an_error_in_a_loop_names_the_concrete_state_class():
    state = make_state(losses={"loss": optax.softmax_cross_entropy})
    assert type(state).train_step.__qualname__ == "FunctionState.train_step"
    assert type(state).train_step is type(state).train_step  # one object per class
    with pytest.raises(ValueError, match=r"^FunctionState\.train_step: loss 'loss'") as info:
        ciclo.train_loop(state, [(X, Y)] * 2)
    assert "(in ciclo callback FunctionState.train_step at step 0)" in info.value.__notes__
