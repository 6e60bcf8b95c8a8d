"""ciclo-flax: Linen and NNX states trained by the same loop, factories, flags, errors."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import ciclo
import ciclo_flax
from ciclo._plugins import _discovery
from ciclo.adapters import AdapterNotInstalledError
from ciclo.testing import accuracy, batches
from ciclo.testing import image_data as images

CE = optax.softmax_cross_entropy_with_integer_labels
CLASSES = 6


class LinenCNN(nn.Module):
    @nn.compact
    def __call__(self, x, training: bool):
        x = nn.Conv(8, (3, 3))(x)
        x = nn.BatchNorm(use_running_average=not training)(x)
        x = nn.avg_pool(nn.relu(x), (2, 2), (2, 2)).reshape(x.shape[0], -1)
        x = nn.Dropout(0.3, deterministic=not training)(x)
        return nn.Dense(CLASSES)(x)


class NNXCNN(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.conv = nnx.Conv(1, 8, (3, 3), rngs=rngs)
        self.norm = nnx.BatchNorm(8, rngs=rngs)
        self.dropout = nnx.Dropout(0.3, rngs=rngs)
        self.out = nnx.Linear(4 * 4 * 8, CLASSES, rngs=rngs)

    def __call__(self, x):
        x = nnx.relu(self.norm(self.conv(x)))
        x = nnx.avg_pool(x, (2, 2), (2, 2)).reshape(x.shape[0], -1)
        return self.out(self.dropout(x))


def test_linen_and_nnx_train_to_high_accuracy_with_the_same_loop_call():
    x, y = images(1024, seed=1)
    x_test, y_test = images(512, seed=2)
    options = {"losses": {"loss": CE}, "metrics": {"accuracy": accuracy}, "key": 0}
    states = {
        "linen": ciclo_flax.create_state(LinenCNN(), x[:1], optax.adam(1e-2), **options),
        "nnx": ciclo_flax.create_nnx_state(NNXCNN(nnx.Rngs(0)), optax.adam(1e-2), **options),
    }
    results = {}
    for name, state in states.items():
        # The same calls for both: only the state differs.
        state, _, elapsed = ciclo.loop(
            state, batches(x, y, 32), {ciclo.every(1): type(state).train_step}
        )
        _, test_history, _ = ciclo.loop(
            state, batches(x_test, y_test, 64), {ciclo.every(1): type(state).test_step}
        )
        assert elapsed.steps == 32
        results[name] = float(np.mean(test_history.collect("accuracy")))
    assert results["linen"] >= 0.9, results
    assert results["nnx"] >= 0.9, results


def test_linen_and_nnx_with_the_same_train_loop_call():
    x, y = images(1024, seed=3)
    x_test, y_test = images(512, seed=4)
    options = {"losses": {"loss": CE}, "metrics": {"accuracy": accuracy}, "key": 0}
    for state in (
        ciclo_flax.create_state(LinenCNN(), x[:1], optax.adam(1e-2), **options),
        ciclo_flax.create_nnx_state(NNXCNN(nnx.Rngs(0)), optax.adam(1e-2), **options),
    ):
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


# --- discovery -----------------------------------------------------------------------------


def test_without_ciclo_flax_the_forwards_name_the_pip_install(monkeypatch):
    real = _discovery._entry_points
    monkeypatch.setattr(
        _discovery, "_entry_points", lambda: [ep for ep in real() if ep.name != "flax"]
    )
    monkeypatch.setattr(_discovery, "_LOADED", {})
    with pytest.raises(AdapterNotInstalledError, match=r"pip install ciclo-flax"):
        ciclo.create_flax_state(LinenCNN(), np.zeros((1, 8, 8, 1)), optax.adam(1e-3), losses={})
    with pytest.raises(AdapterNotInstalledError, match=r"pip install ciclo-flax"):
        ciclo.create_nnx_state(NNXCNN(nnx.Rngs(0)), optax.adam(1e-3), losses={})


def test_forwards_and_create_state_build_flax_states():
    inputs = np.zeros((1, 8, 8, 1), np.float32)
    linen = ciclo.create_flax_state(LinenCNN(), inputs, optax.adam(1e-3), losses={"loss": CE})
    assert isinstance(linen, ciclo_flax.FlaxState)
    new = ciclo.create_nnx_state(NNXCNN(nnx.Rngs(0)), optax.adam(1e-3), losses={"loss": CE})
    assert isinstance(new, ciclo_flax.NNXState)
    assert isinstance(
        ciclo.create_state(LinenCNN(), inputs, None, losses=None), ciclo_flax.FlaxState
    )
    assert isinstance(
        ciclo.create_state(NNXCNN(nnx.Rngs(0)), None, losses=None), ciclo_flax.NNXState
    )
    assert ciclo.adapters.get_adapter("flax") is ciclo_flax.adapter


# --- Linen specifics -----------------------------------------------------------------------

X = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
Y = np.arange(8, dtype=np.int32) % 2


class Flagged(nn.Module):
    """Counts training calls in a 'seen' collection."""

    @nn.compact
    def __call__(self, x, train: bool = False):
        seen = self.variable("seen", "train", lambda: jnp.zeros((), jnp.int32))
        if train and not self.is_initializing():
            seen.value = seen.value * 10 + (2 if train else 1)
        return nn.Dense(2)(x)


def test_the_train_flag_is_detected_and_other_collections_are_mutable_in_training():
    state = ciclo_flax.create_state(Flagged(), X, optax.sgd(0.1), losses={"loss": CE})
    assert state.training_arg == "train"
    assert set(state.model_state) == {"seen"}
    _, state = state.train_step((X, Y))
    assert int(state.model_state["seen"]["train"]) == 2
    _, state = state.test_step((X, Y))
    assert int(state.model_state["seen"]["train"]) == 2
    _, state = state.train_step((X, Y))
    assert int(state.model_state["seen"]["train"]) == 22


class Deterministic(nn.Module):
    @nn.compact
    def __call__(self, x, *, deterministic: bool):
        return nn.Dropout(0.9, deterministic=deterministic)(nn.Dense(2)(x))


class NoFlag(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(2)(x)


def test_deterministic_gets_the_opposite_of_training_and_modules_may_take_no_flag():
    state = ciclo_flax.create_state(Deterministic(), X, optax.sgd(0.1), losses={"loss": CE})
    assert state.training_arg == "deterministic"
    train_preds = state.module.apply(
        state.variables, X, deterministic=False, rngs={"dropout": jax.random.key(0)}
    )
    assert (train_preds == 0).mean() > 0.5  # sanity: dropout of 0.9 zeroes most
    out, _ = state.predict_step(X)
    assert (out.outputs.predictions != 0).all()  # evaluation: deterministic=True
    assert ciclo_flax.create_state(NoFlag(), X, None, losses=None).training_arg is None


def test_bad_training_arg_and_ambiguous_flags_are_clear_errors():
    with pytest.raises(TypeError, match=r"training_arg='mode', but NoFlag.__call__ takes no"):
        ciclo_flax.create_state(NoFlag(), X, None, losses=None, training_arg="mode")

    class TwoFlags(nn.Module):
        @nn.compact
        def __call__(self, x, train: bool = False, deterministic: bool = True):
            return nn.Dense(2)(x)

    with pytest.raises(TypeError, match=r"several training flags \['train', 'deterministic'\]"):
        ciclo_flax.create_state(TwoFlags(), X, None, losses=None)
    state = ciclo_flax.create_state(TwoFlags(), X, None, losses=None, training_arg=None)
    assert state.training_arg is None


def test_factories_reject_the_other_flax_api():
    with pytest.raises(TypeError, match=r"For a flax.nnx module use ciclo_flax.create_nnx_state"):
        ciclo_flax.create_state(nnx.Linear(4, 2, rngs=nnx.Rngs(0)), X, None, losses=None)
    with pytest.raises(TypeError, match=r"For a flax.linen module use ciclo_flax.create_state\("):
        ciclo_flax.create_nnx_state(NoFlag(), None, losses=None)


class ListMLP(nn.Module):
    features: list  # a list attribute makes the module unhashable

    @nn.compact
    def __call__(self, x):
        for f in self.features:
            x = nn.Dense(f)(x)
        return x


def test_unhashable_modules_work_and_compile_once():
    state = ciclo_flax.create_state(ListMLP([8, 2]), X, optax.sgd(0.1), losses={"loss": CE})
    _, state = state.train_step((X, Y))
    cache = type(state).train_step.compiled_for(state.strategy)
    size = cache._cache_size()
    _, state = state.train_step((X, Y))
    assert cache._cache_size() == size
    assert state.module.features == [8, 2]


def test_given_variables_are_used_instead_of_init():
    module = NoFlag()
    variables = module.init(jax.random.key(7), X)
    state = ciclo_flax.create_state(module, X, None, losses=None, variables=variables)
    np.testing.assert_array_equal(
        state.params["Dense_0"]["kernel"], variables["params"]["Dense_0"]["kernel"]
    )
    with pytest.raises(ValueError, match=r"NoFlag has no 'params' collection"):
        ciclo_flax.create_state(module, X, None, losses=None, variables={"batch_stats": {}})


class Noisy(nn.Module):
    @nn.compact
    def __call__(self, x, training: bool):
        if training:
            x = x + jax.random.normal(self.make_rng("noise"), x.shape)
        return nn.Dense(2)(x)


def test_extra_rng_streams_get_per_step_keys():
    state = ciclo_flax.create_state(
        Noisy(), X, optax.sgd(0.1), losses={"loss": CE}, rng_streams=("noise",)
    )
    first, _ = state.train_step((X, Y))
    again, _ = state.train_step((X, Y))
    later, _ = state.replace(step=state.step + 1).train_step((X, Y))
    assert float(first.losses.loss) == float(again.losses.loss)
    assert float(first.losses.loss) != float(later.losses.loss)


# --- NNX specifics -------------------------------------------------------------------------


def test_nnx_model_is_left_alone_and_the_trained_model_comes_back():
    model = NNXCNN(nnx.Rngs(0))
    kernel = np.asarray(model.out.kernel[...])
    state = ciclo_flax.create_nnx_state(model, optax.adam(1e-2), losses={"loss": CE})
    x, y = images(32, seed=5)
    _, state = state.train_step((x, y))
    np.testing.assert_array_equal(model.out.kernel[...], kernel)  # not modified
    assert not model.dropout.deterministic
    trained = state.model
    assert isinstance(trained, NNXCNN)
    np.testing.assert_array_equal(trained.out.kernel[...], state.params["out"]["kernel"][...])
    trained.eval()
    logits = trained(x)
    out, _ = state.predict_step(x)
    np.testing.assert_allclose(out.outputs.predictions, logits, rtol=1e-5, atol=1e-6)


def test_nnx_wrt_selects_the_trained_variables():
    class Frozen(nnx.Module):
        def __init__(self, rngs):
            self.encoder = nnx.Linear(4, 4, rngs=rngs)
            self.head = nnx.Linear(4, 2, rngs=rngs)

        def __call__(self, x):
            return self.head(self.encoder(x))

    only_head = nnx.All(nnx.Param, nnx.PathContains("head"))
    state = ciclo_flax.create_nnx_state(
        Frozen(nnx.Rngs(0)), optax.sgd(0.5), losses={"loss": CE}, wrt=only_head
    )
    _, trained = state.train_step((X, Y))
    assert "encoder" not in trained.params
    np.testing.assert_array_equal(
        trained.model.encoder.kernel[...], state.model.encoder.kernel[...]
    )
    assert not np.allclose(trained.model.head.kernel[...], state.model.head.kernel[...])
    with pytest.raises(ValueError, match=r"Frozen has no variables matching wrt="):
        ciclo_flax.create_nnx_state(Frozen(nnx.Rngs(0)), None, losses=None, wrt=nnx.BatchStat)


def test_nnx_call_flags_are_passed():
    class Flag(nnx.Module):
        def __init__(self, rngs):
            self.linear = nnx.Linear(4, 2, rngs=rngs)

        def __call__(self, x, *, training: bool):
            return self.linear(x) * (2.0 if training else 1.0)

    state = ciclo_flax.create_nnx_state(Flag(nnx.Rngs(0)), optax.sgd(0.1), losses={"loss": CE})
    assert state.training_arg == "training"
    out, _ = state.predict_step(X)
    np.testing.assert_allclose(out.outputs.predictions, state.model(X, training=False), rtol=1e-6)


@pytest.mark.parametrize("api", ["linen", "nnx"])
def test_eager_strategy_computes_what_jit_does(api):
    def make(strategy):
        if api == "linen":
            return ciclo_flax.create_state(
                Deterministic(), X, optax.sgd(0.1), losses={"loss": CE}, strategy=strategy
            )
        model = nnx.Sequential(
            nnx.Linear(4, 8, rngs=nnx.Rngs(0)), nnx.Dropout(0.5, rngs=nnx.Rngs(1))
        )
        return ciclo_flax.create_nnx_state(
            model, optax.sgd(0.1), losses={"loss": CE}, strategy=strategy
        )

    eager_logs, eager = make("eager").train_step((X, Y))
    jit_logs, jitted = make("jit").train_step((X, Y))
    assert eager.strategy.name == "eager"
    np.testing.assert_allclose(eager_logs.losses.loss, jit_logs.losses.loss, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(eager.params), jax.tree.leaves(jitted.params), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_throughput_reads_the_flops_of_an_nnx_states_bound_and_unbound_train_step():
    x, y = images(64, seed=1)
    state = ciclo_flax.create_nnx_state(NNXCNN(nnx.Rngs(0)), optax.adam(1e-3), losses={"loss": CE})
    data = list(batches(x, y, 16))
    flops = []
    for form in (state.train_step, type(state).train_step):
        meter = ciclo.throughput(2, flops_per_step=form)
        _, history, _ = ciclo.loop(state, data, {ciclo.every(1): state.train_step, **meter})
        logged = history.collect("flops_per_second")[-1] / history.collect("steps_per_second")[-1]
        flops.append(logged)
    assert flops[0] > 0
    assert flops[0] == pytest.approx(flops[1])


def test_the_original_create_flax_state_scenario_ends_and_evaluates_two_steps_each_time():
    """The original ciclo's ``test_create_flax_state``: an endless dataset, evaluated on an
    endless test set for ``test_duration=2`` steps at each epoch's end, stops at 12."""
    import itertools

    class Linear(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(2)(x)

    def endless():
        return itertools.repeat((X[:4], Y[:4]))

    state = ciclo.create_flax_state(
        Linear(), X[:1], optax.adam(1e-2), losses={"loss": CE}, metrics={"accuracy": accuracy}
    )
    evaluated = []
    state, history, elapsed = ciclo.train_loop(
        state,
        endless(),
        {ciclo.on_test_end: lambda state, batch, elapsed: evaluated.append(elapsed.steps)},
        test_dataset=endless,
        epoch_duration=3,
        test_duration=2,
        stop=12,
    )
    assert elapsed.steps == 12
    assert history.collect("steps", "loss_test")[0] == [2, 5, 8, 11]
    assert evaluated == [2, 2, 2, 2]
