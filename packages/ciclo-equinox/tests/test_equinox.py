"""What is specific to Equinox: partitioning, eqx.nn.State, inference flags, vmap, keys, and
the errors for models and options that cannot work."""

from __future__ import annotations

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import ciclo
import ciclo_equinox
from ciclo_equinox import EquinoxState

LOSSES = {"loss": optax.softmax_cross_entropy_with_integer_labels}
X = np.random.default_rng(0).normal(size=(8, 3)).astype(np.float32)
Y = (X[:, 0] > 0).astype(np.int32)


def _close(a, b):
    return all(
        np.allclose(p, q)
        for p, q in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True)
    )


class Net(eqx.Module):
    """Per-example: batch norm (state) and dropout (key)."""

    layers: list
    norm: eqx.nn.BatchNorm
    dropout: eqx.nn.Dropout

    def __init__(self, key):
        k1, k2 = jax.random.split(key)
        # A list of layers, as Equinox models often hold them.
        self.layers = [eqx.nn.Linear(3, 8, key=k1), eqx.nn.Linear(8, 2, key=k2)]
        self.norm = eqx.nn.BatchNorm(8, axis_name="batch", momentum=0.5, mode="batch")
        self.dropout = eqx.nn.Dropout(0.5)

    def __call__(self, x, state, *, key):
        x, state = self.norm(self.layers[0](x), state)
        return self.layers[1](self.dropout(jax.nn.relu(x), key=key)), state


class Batched(eqx.Module):
    """A model that takes the whole batch (vmap=False) and holds an integer array."""

    weight: jax.Array
    scale: jax.Array

    def __call__(self, x):
        return (x @ self.weight) * self.scale


class Drop(eqx.Module):
    """Dropout alone (and a bias to train)."""

    dropout: eqx.nn.Dropout
    bias: jax.Array

    def __call__(self, x, *, key):
        return self.dropout(x + self.bias, key=key)


def batched():
    return Batched(jnp.zeros((3, 2)), jnp.array(2, jnp.int32))


def make_net():
    return eqx.nn.make_with_state(Net)(jax.random.key(0))


# --- building and running ------------------------------------------------------------------


def test_partition_params_frozen_and_static_skeleton():
    state = ciclo_equinox.create_state(batched(), optax.sgd(0.1), losses=LOSSES)
    assert isinstance(state, EquinoxState)
    assert state.model_state is None
    assert state.key_arg is None
    # Floating-point arrays are trained, other arrays kept apart, the rest is static.
    assert [x.shape for x in jax.tree_util.tree_leaves(state.params)] == [(3, 2)]
    assert [x.dtype for x in jax.tree_util.tree_leaves(state.frozen)] == [jnp.int32]
    _, trained = state.train_step((X, Y))
    assert not _close(trained.params, state.params)
    model = trained.model
    assert isinstance(model, Batched)
    assert int(model.scale) == 2
    np.testing.assert_allclose(model(X), trained.predict_step(X)[0].outputs.predictions)


def test_stateful_model_from_make_with_state():
    model, model_state = make_net()
    state = ciclo_equinox.create_state(
        model, optax.adam(1e-2), state=model_state, vmap=True, losses=LOSSES
    )
    assert state.key_arg == "key"
    assert isinstance(state.model_state, eqx.nn.State)
    logs, trained = state.train_step((X, Y))
    assert logs.losses.loss.shape == ()
    assert not _close(trained.model_state, state.model_state)  # statistics updated
    _, tested = trained.test_step((X, Y))
    assert _close(tested.model_state, trained.model_state)  # and frozen in evaluation
    # Evaluation runs in inference mode: the running statistics, no dropout, so the
    # prediction of an example does not depend on the batch and equals the model's own.
    preds = trained.predict_step(X)[0].outputs.predictions
    inference = eqx.nn.inference_mode(trained.model)
    one, _ = inference(X[0], trained.model_state, key=jax.random.key(5))
    np.testing.assert_allclose(preds[0], one, rtol=1e-5, atol=1e-6)


def test_model_built_directly_gets_its_state_like_make_with_state():
    made, made_state = make_net()
    direct = ciclo_equinox.create_state(
        Net(jax.random.key(0)), optax.adam(1e-2), vmap=True, losses=LOSSES
    )
    assert jax.tree_util.tree_structure(direct.model_state) == jax.tree_util.tree_structure(
        made_state
    )
    assert _close(direct.model_state, made_state)
    # Initial values are not kept in the model (nor trained as parameters).
    assert _close(direct.params, eqx.filter(made, eqx.is_inexact_array))


def test_two_models_built_alike_share_the_compiled_step():
    traces = []

    class Traced(Net):
        def __call__(self, x, state, *, key):
            traces.append(1)
            return super().__call__(x, state, key=key)

    tx = optax.sgd(0.1)  # optimizers compare by identity: share one, as with any state
    a, b = (
        ciclo_equinox.create_state(Traced(jax.random.key(i)), tx, vmap=True, losses=LOSSES)
        for i in (0, 1)
    )
    _, a = a.train_step((X, Y))
    count = len(traces)
    _, b = b.train_step((X, Y))
    _, a = a.train_step((X, Y))
    assert len(traces) == count


def test_inference_flags_follow_the_step():
    dropout = eqx.nn.Dropout(0.5, inference=True)  # set off by the user: train_step sets it on

    state = ciclo_equinox.create_state(
        Drop(dropout, jnp.zeros(3)), optax.sgd(0.1), losses={"l2": lambda p, t: (p - t) ** 2}
    )
    ones = jnp.ones((4, 3))
    preds = state.predict_step(ones)[0].outputs.predictions
    np.testing.assert_array_equal(preds, ones)  # inference: identity
    trained_logs, _ = state.train_step((ones, ones))
    assert float(trained_logs.losses.l2) > 0.0  # training: some units dropped, others doubled


def test_vmap_gives_each_example_its_own_key():
    state = ciclo_equinox.create_state(
        Drop(eqx.nn.Dropout(0.5), jnp.zeros(16)), optax.sgd(0.1), vmap=True, losses=LOSSES
    )
    preds, _ = state.apply(
        state.params, None, jnp.ones((4, 16)), training=True, key=jax.random.key(0)
    )
    masks = {tuple(np.asarray(row) > 0) for row in preds}
    assert len(masks) == 4


def test_filter_spec_freezes_arrays():
    model, model_state = make_net()
    spec = jax.tree_util.tree_map(lambda _: False, model)
    spec = eqx.tree_at(lambda m: m.layers[1], spec, replace=True)  # train the last layer only
    state = ciclo_equinox.create_state(
        model, optax.sgd(0.5), state=model_state, vmap=True, losses=LOSSES, filter_spec=spec
    )
    assert len(jax.tree_util.tree_leaves(state.params)) == 2
    _, trained = state.train_step((X, Y))
    assert _close(trained.model.layers[0], model.layers[0])
    assert not _close(trained.model.layers[1], model.layers[1])


def test_key_arg_names_the_keyword_or_none():
    class Noisy(eqx.Module):
        weight: jax.Array

        def __call__(self, x, rng=None):
            noise = 0.0 if rng is None else jax.random.normal(rng, x.shape)
            return (x + noise) @ self.weight

    model = Noisy(jnp.ones((3, 2)))
    assert ciclo_equinox.create_state(model, None, losses=LOSSES).key_arg is None  # auto: no `key`
    noisy = ciclo_equinox.create_state(model, None, losses=LOSSES, key_arg="rng")
    quiet = ciclo_equinox.create_state(model, None, losses=LOSSES, key_arg=None)
    noisy_preds = noisy.predict_step(X)[0].outputs.predictions
    np.testing.assert_allclose(quiet.predict_step(X)[0].outputs.predictions, X @ model.weight)
    assert not np.allclose(noisy_preds, X @ model.weight)


class Counting(eqx.Module):
    """A batched model whose state counts its calls (with eqx.nn.State.set)."""

    weight: jax.Array
    calls: eqx.nn.StateIndex

    def __init__(self):
        self.weight = jnp.zeros((3, 2))
        self.calls = eqx.nn.StateIndex(jnp.zeros((), jnp.int32))

    def __call__(self, x, state):
        return x @ self.weight, state.set(self.calls, state.get(self.calls) + 1)


def test_eager_strategy_keeps_the_state_usable():
    # eqx.nn.State.set invalidates the State it is called on; the state kept by ciclo
    # must survive steps run eagerly.
    state = ciclo_equinox.create_state(Counting(), optax.sgd(0.1), losses=LOSSES, strategy="eager")
    _, trained = state.train_step((X, Y))
    _, tested = trained.test_step((X, Y))
    _, again = state.train_step((X, Y))  # would fail had the first step invalidated it
    calls = state.model.calls
    assert [int(s.model_state.get(calls)) for s in (state, trained, tested, again)] == [0, 1, 1, 1]
    _, jitted = state.with_strategy("jit").train_step((X, Y))
    assert _close(jitted.params, trained.params)


def test_core_forwards_build_an_equinox_state():
    model, model_state = make_net()
    kwargs = {"state": model_state, "vmap": True, "losses": LOSSES}
    by_name = ciclo.create_equinox_state(model, optax.sgd(0.1), **kwargs)
    by_type = ciclo.create_state(model, optax.sgd(0.1), **kwargs)
    assert type(by_name) is type(by_type) is EquinoxState
    assert ciclo.adapters.adapter_for(model) is ciclo_equinox.adapter
    state, history, _ = ciclo.loop(by_type, [(X, Y)] * 3, {ciclo.every(1): by_type.train_step})
    assert int(state.step) == 3
    assert len(history.collect("loss")) == 3


def test_unhashable_non_array_values_work_and_compile_once():
    @dataclasses.dataclass
    class Config:  # a mutable dataclass: unhashable
        scale: float = 2.0

    class WithConfig(eqx.Module):
        weight: jax.Array
        config: Config

        def __call__(self, x):
            return x @ self.weight * self.config.scale

    state = ciclo_equinox.create_state(
        WithConfig(jnp.zeros((3, 2)), Config()), optax.sgd(0.1), losses=LOSSES
    )
    _, state = state.train_step((X, Y))
    compiled = type(state).train_step.compiled_for(state.strategy)
    size = compiled._cache_size()
    _, state = state.train_step((X, Y))
    assert compiled._cache_size() == size
    assert state.model.config.scale == 2.0


# --- errors --------------------------------------------------------------------------------


def test_error_for_a_model_that_is_not_an_equinox_module():
    with pytest.raises(TypeError, match=r"needs an equinox.Module, got .*function.*eqx.Module"):
        ciclo_equinox.create_state(lambda x: x, optax.sgd(0.1), losses=LOSSES)


def test_error_for_the_tuple_of_make_with_state():
    with pytest.raises(TypeError, match=r"\(model, state\) tuple.*state=model_state"):
        ciclo_equinox.create_state(make_net(), optax.sgd(0.1), losses=LOSSES)
    with pytest.raises(TypeError, match=r"\(model, state\) tuple.*state=model_state"):
        ciclo.create_state(make_net(), optax.sgd(0.1), losses=LOSSES)


def test_error_for_a_state_given_as_tx():
    model, model_state = make_net()
    with pytest.raises(TypeError, match=r"eqx.nn.State as tx.*by keyword"):
        ciclo_equinox.create_state(model, model_state, losses=LOSSES)


def test_error_for_a_state_of_the_wrong_type():
    model, _ = make_net()
    with pytest.raises(TypeError, match=r"state must be an eqx.nn.State .* got dict"):
        ciclo_equinox.create_state(model, optax.sgd(0.1), state={}, losses=LOSSES)


def test_error_for_a_stateful_model_without_its_state():
    model, _ = make_net()  # its initial state was moved out by make_with_state
    with pytest.raises(ValueError, match=r"Net has stateful layers .* no state was given"):
        ciclo_equinox.create_state(model, optax.sgd(0.1), losses=LOSSES)


def test_errors_for_filter_specs_that_cannot_train():
    with pytest.raises(ValueError, match=r"no arrays selected by filter_spec.*nothing to train"):
        ciclo_equinox.create_state(
            batched(), optax.sgd(0.1), losses=LOSSES, filter_spec=lambda _: False
        )
    with pytest.raises(TypeError, match=r"not floating point.*\.scale"):
        ciclo_equinox.create_state(
            batched(), optax.sgd(0.1), losses=LOSSES, filter_spec=eqx.is_array
        )
    with pytest.raises(TypeError, match=r"filter_spec must be a function"):
        ciclo_equinox.create_state(batched(), optax.sgd(0.1), losses=LOSSES, filter_spec="all")


def test_error_for_batch_norm_without_vmap():
    class Normed(eqx.Module):
        norm: eqx.nn.BatchNorm
        linear: eqx.nn.Linear

        def __init__(self):
            self.norm = eqx.nn.BatchNorm(3, axis_name="batch", mode="batch")
            self.linear = eqx.nn.Linear(3, 2, key=jax.random.key(0))

        def __call__(self, x, state):
            x, state = self.norm(x, state)
            return self.linear(x), state

    state = ciclo_equinox.create_state(Normed(), optax.sgd(0.1), losses=LOSSES)
    with pytest.raises(
        NameError, match=r"per-example model; use create_state\(\.\.\., vmap=True\)"
    ):
        state.train_step((X, Y))
    other_axis = ciclo_equinox.create_state(
        Normed(), optax.sgd(0.1), losses=LOSSES, vmap=True, axis_name="examples"
    )
    with pytest.raises(NameError, match=r"axis name its layers use \(now 'examples'\)"):
        other_axis.train_step((X, Y))


def test_error_for_a_stateful_model_that_returns_no_state():
    class Forgetful(Net):
        def __call__(self, x, state, *, key):
            return super().__call__(x, state, key=key)[0]

    state = ciclo_equinox.create_state(
        Forgetful(jax.random.key(0)), optax.sgd(0.1), vmap=True, losses=LOSSES
    )
    with pytest.raises(
        TypeError, match=r"must return \(output, new_state\) .* returned an array of shape \(2,\)"
    ):
        state.train_step((X, Y))


def test_error_for_a_model_state_that_is_not_shared_by_the_batch():
    class Counter(eqx.Module):
        linear: eqx.nn.Linear
        total: eqx.nn.StateIndex

        def __init__(self):
            self.linear = eqx.nn.Linear(3, 2, key=jax.random.key(0))
            self.total = eqx.nn.StateIndex(jnp.zeros(()))

        def __call__(self, x, state):
            return self.linear(x), state.set(self.total, state.get(self.total) + x.sum())

    state = ciclo_equinox.create_state(Counter(), optax.sgd(0.1), vmap=True, losses=LOSSES)
    with pytest.raises(ValueError, match=r"differs between the examples of a batch"):
        state.train_step((X, Y))


def test_errors_for_bad_options():
    with pytest.raises(TypeError, match=r"key_arg='rng', but Batched.__call__ takes no argument"):
        ciclo_equinox.create_state(batched(), optax.sgd(0.1), losses=LOSSES, key_arg="rng")
    with pytest.raises(TypeError, match=r"vmap must be True or False, got 'batch'"):
        ciclo_equinox.create_state(batched(), optax.sgd(0.1), losses=LOSSES, vmap="batch")
    state = ciclo_equinox.create_state(batched(), optax.sgd(0.1), losses=LOSSES, vmap=True)
    with pytest.raises(ValueError, match=r"leading \(batch\) axis of the inputs, but"):
        state.predict_step(jnp.float32(1.0))
