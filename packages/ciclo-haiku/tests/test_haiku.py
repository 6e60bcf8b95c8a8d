"""What is specific to Haiku: the model forms accepted, the ``is_training`` flag, Haiku state,
``hk.without_apply_rng``, initialized parameters, the core forwards, and the errors."""

from __future__ import annotations

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import ciclo
import ciclo_haiku
from ciclo._plugins import _discovery
from ciclo.adapters import AdapterNotInstalledError

CE = optax.softmax_cross_entropy_with_integer_labels
LOSSES = {"loss": CE}
TX = optax.sgd(0.1)


def data(n=8, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 4)).astype(np.float32), rng.integers(0, 3, n).astype(np.int32)


def with_batch_norm(x, is_training):
    x = hk.Linear(8)(x)
    x = hk.BatchNorm(True, True, decay_rate=0.9)(x, is_training)
    return hk.Linear(3)(jax.nn.relu(x))


def with_dropout(x, is_training: bool = False):
    x = jax.nn.relu(hk.Linear(8)(x))
    if is_training:
        x = hk.dropout(hk.next_rng_key(), 0.5, x)
    return hk.Linear(3)(x)


def linear(x):
    return hk.Linear(3)(x)


def leaves_differ(a, b):
    return any(
        not np.allclose(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


def test_function_with_is_training_gets_the_flag_and_batch_norm_state():
    x, y = data()
    state = ciclo_haiku.create_state(with_batch_norm, x[:2], TX, losses=LOSSES, key=0)
    assert isinstance(state, ciclo_haiku.HaikuState)
    assert state.training_arg == "is_training"
    assert state.with_state
    assert state.apply_rng
    assert any("batch_norm" in name for name in state.model_state)
    _, trained = state.train_step((x, y))
    assert leaves_differ(trained.model_state, state.model_state)
    _, tested = trained.test_step((x, y))
    chex_equal = jax.tree.map(np.array_equal, tested.model_state, trained.model_state)
    assert all(jax.tree.leaves(chex_equal))
    # Evaluation uses the moving averages: one example's prediction ignores the others.
    whole = trained.predict_step(x)[0].outputs.predictions
    alone = trained.predict_step(x[:1])[0].outputs.predictions
    np.testing.assert_allclose(whole[:1], alone, rtol=1e-5, atol=1e-6)


def test_is_training_switches_dropout_and_evaluation_is_deterministic():
    x, y = data(32)
    state = ciclo_haiku.create_state(with_dropout, x[:2], TX, losses=LOSSES, key=0)
    assert state.training_arg == "is_training"
    first = state.train_step((x, y))[0].losses.loss
    second = state.replace(step=state.step + 1).train_step((x, y))[0].losses.loss
    assert float(first) != float(second)
    assert float(state.train_step((x, y))[0].losses.loss) == float(first)
    evaluation = state.test_step((x, y))[0].losses.loss
    later = state.replace(step=state.step + 1).test_step((x, y))[0].losses.loss
    assert float(evaluation) == float(later)
    # Without dropout, the training loss at step 0 equals the evaluation loss.
    no_flag = ciclo_haiku.create_state(
        with_dropout, x[:2], TX, losses=LOSSES, key=0, training_arg=None
    )
    assert no_flag.training_arg is None
    np.testing.assert_allclose(
        no_flag.train_step((x, y))[0].losses.loss, no_flag.test_step((x, y))[0].losses.loss
    )


def test_function_without_is_training_gets_no_flag():
    x, y = data()
    state = ciclo_haiku.create_state(linear, x[:2], TX, losses=LOSSES)
    assert state.training_arg is None
    assert state.model_state == {}
    _, state = state.train_step((x, y))
    assert int(state.step) == 1


def test_training_arg_by_name():
    def forward(x, training=False):
        return hk.Linear(3)(x) * (2.0 if training else 1.0)

    x, y = data()
    state = ciclo_haiku.create_state(forward, x[:2], TX, losses=LOSSES, training_arg="training")
    assert state.training_arg == "training"
    train_loss = state.train_step((x, y))[0].losses.loss
    test_loss = state.test_step((x, y))[0].losses.loss
    assert float(train_loss) != float(test_loss)


@pytest.mark.parametrize(
    ("make", "with_state", "apply_rng"),
    [
        (lambda f: hk.transform(f), False, True),
        (lambda f: hk.without_apply_rng(hk.transform(f)), False, False),
        (lambda f: hk.transform_with_state(f), True, True),
        (lambda f: hk.without_apply_rng(hk.transform_with_state(f)), True, False),
    ],
    ids=["transform", "transform-no-rng", "with-state", "with-state-no-rng"],
)
def test_transformed_models(make, with_state, apply_rng):
    def forward(x, is_training):
        return hk.Linear(3)(x) + (0.0 if is_training else 1.0)

    x, y = data()
    transformed = make(forward)
    state = ciclo_haiku.create_state(transformed, x[:2], TX, losses=LOSSES, key=1)
    assert state.transformed is transformed
    assert (state.with_state, state.apply_rng) == (with_state, apply_rng)
    assert state.training_arg == "is_training"
    assert state.model_state == {}
    params = transformed.init(jax.random.split(jax.random.key(1))[0], x[:2], is_training=True)
    params = params[0] if with_state else params
    # create_state initialises under jit: the same numbers up to float32 rounding.
    np.testing.assert_allclose(state.params["linear"]["w"], params["linear"]["w"], rtol=1e-6)
    _, trained = state.train_step((x, y))
    assert leaves_differ(trained.params, state.params)
    out = trained.predict_step(x)[0].outputs.predictions
    expected = jnp.asarray(x) @ trained.params["linear"]["w"] + trained.params["linear"]["b"] + 1
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


def test_states_of_the_same_function_share_compiled_steps():
    traces = []

    def forward(x, is_training):
        traces.append(is_training)
        return hk.Linear(3)(x)

    x, y = data()
    a = ciclo_haiku.create_state(forward, x[:2], TX, losses=LOSSES, key=0)
    a.train_step((x, y))
    a.test_step((x, y))
    traced = len(traces)
    b = ciclo_haiku.create_state(forward, x[:2], TX, losses=LOSSES, key=1)
    _, b = b.train_step((x, y))
    b.test_step((x, y))
    assert len(traces) == traced, "a second state of the same function compiled again"
    assert b.transformed is a.transformed
    assert leaves_differ(a.params, b.params), "other key, same initialization"


def test_initialized_params_are_used():
    x, _ = data()
    transformed = hk.transform_with_state(with_batch_norm)
    params, model_state = transformed.init(jax.random.key(5), x[:2], is_training=True)
    state = ciclo_haiku.create_state(
        transformed, x[:2], TX, losses=LOSSES, params=params, model_state=model_state
    )
    np.testing.assert_array_equal(state.params["linear"]["w"], params["linear"]["w"])
    stateless = hk.transform(linear)
    params = stateless.init(jax.random.key(5), x[:2])
    state = ciclo_haiku.create_state(stateless, x[:2], TX, losses=LOSSES, params=params)
    np.testing.assert_array_equal(state.params["linear"]["w"], params["linear"]["w"])
    assert state.model_state == {}


def test_dict_inputs():
    def forward(inputs):
        return hk.Linear(3)(jnp.concatenate([inputs["a"], inputs["b"]], axis=-1))

    x, y = data()
    state = ciclo_haiku.create_state(
        forward, {"a": x[:2, :2], "b": x[:2, 2:]}, TX, losses=LOSSES, inputs_key=("a", "b")
    )
    logs, state = state.train_step({"a": x[:, :2], "b": x[:, 2:], "targets": y})
    assert logs.losses.loss.shape == ()


def test_core_forwards_build_haiku_states():
    x, y = data()
    state = ciclo.create_haiku_state(with_batch_norm, x[:2], TX, losses=LOSSES)
    assert isinstance(state, ciclo_haiku.HaikuState)
    transformed = hk.transform_with_state(with_batch_norm)
    picked = ciclo.create_state(transformed, x[:2], TX, losses=LOSSES)
    assert isinstance(picked, ciclo_haiku.HaikuState)
    assert ciclo.adapters.get_adapter("haiku") is ciclo_haiku.adapter
    assert ciclo.adapters.adapter_for(hk.transform(linear)) is ciclo_haiku.adapter
    _, trained = picked.train_step((x, y))
    assert int(trained.step) == 1


def test_without_ciclo_haiku_the_forward_names_the_pip_install(monkeypatch):
    real = _discovery._entry_points
    monkeypatch.setattr(
        _discovery, "_entry_points", lambda: [ep for ep in real() if ep.name != "haiku"]
    )
    monkeypatch.setattr(_discovery, "_LOADED", {})
    with pytest.raises(AdapterNotInstalledError, match=r"pip install ciclo-haiku"):
        ciclo.create_haiku_state(linear, data()[0], TX, losses=LOSSES)


def test_loop_trains_with_haiku_state():
    x, y = data(64)
    state = ciclo_haiku.create_state(with_batch_norm, x[:2], optax.adam(1e-2), losses=LOSSES)
    batches = [(x[i : i + 16], y[i : i + 16]) for i in range(0, 64, 16)] * 3
    state, history, elapsed = ciclo.loop(state, batches, {ciclo.every(1): state.train_step})
    losses = history.collect("loss")
    assert elapsed.steps == 12
    assert int(state.step) == 12
    assert float(losses[-1]) < float(losses[0])


# --- errors --------------------------------------------------------------------------------


def test_error_multi_transform():
    def f():
        def forward(x):
            return hk.Linear(3)(x)

        return forward, (forward,)

    multi = hk.multi_transform(f)
    with pytest.raises(TypeError, match=r"hk\.multi_transform result.*single function"):
        ciclo_haiku.create_state(multi, data()[0], TX, losses=LOSSES)


def test_error_module_class():
    with pytest.raises(TypeError, match=r"module class Linear.*lambda x: Linear\(\.\.\.\)\(x\)"):
        ciclo_haiku.create_state(hk.Linear, data()[0], TX, losses=LOSSES)


def test_error_not_callable():
    with pytest.raises(TypeError, match=r"needs a function using Haiku modules.*got dict"):
        ciclo_haiku.create_state({"w": 1}, data()[0], TX, losses=LOSSES)


def test_error_model_of_another_framework():
    class OtherModel:
        def init(self, rng, x): ...

        def apply(self, params, x): ...

    with pytest.raises(TypeError, match=r"OtherModel.*not an hk\.Transformed.*ciclo\.create_state"):
        ciclo_haiku.create_state(OtherModel(), data()[0], TX, losses=LOSSES)


def test_error_training_arg_not_taken():
    with pytest.raises(TypeError, match=r"training_arg='training'.*takes \['x'\]"):
        ciclo_haiku.create_state(linear, data()[0], TX, losses=LOSSES, training_arg="training")


def test_error_training_arg_type():
    with pytest.raises(TypeError, match=r"training_arg must be an argument name.*got True"):
        ciclo_haiku.create_state(linear, data()[0], TX, losses=LOSSES, training_arg=True)


def test_error_function_needs_more_arguments():
    def forward(x, y):
        return hk.Linear(3)(x + y)

    with pytest.raises(TypeError, match=r"calls the model function as f\(inputs\).*\(x, y\)"):
        ciclo_haiku.create_state(forward, data()[0], TX, losses=LOSSES)


def test_error_params_without_model_state():
    transformed = hk.transform_with_state(with_batch_norm)
    x = data()[0]
    params, _ = transformed.init(jax.random.key(0), x, is_training=True)
    with pytest.raises(ValueError, match=r"without model_state.*batch_norm.*params, model_state ="):
        ciclo_haiku.create_state(transformed, x, TX, losses=LOSSES, params=params)


def test_error_model_state_for_stateless_transform():
    transformed = hk.transform(linear)
    x = data()[0]
    params = transformed.init(jax.random.key(0), x)
    with pytest.raises(ValueError, match=r"hk\.Transformed, which has no Haiku state"):
        ciclo_haiku.create_state(
            transformed, x, TX, losses=LOSSES, params=params, model_state={"m": {"s": x}}
        )
