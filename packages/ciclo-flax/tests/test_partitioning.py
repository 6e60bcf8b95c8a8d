"""Flax models annotated with partitioning metadata train under ciclo's sharded strategies
with no rules given, placed by their annotations, and equal "jit" training."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

import ciclo
import ciclo_flax
from ciclo.managed import ManagedState

TX = optax.sgd(0.05, momentum=0.9)  # SGD: a wrongly scaled gradient would show
needs_8_devices = pytest.mark.skipif(
    jax.device_count() != 8,
    reason="needs 8 devices: XLA_FLAGS=--xla_force_host_platform_device_count=8",
)
LECUN = nn.initializers.lecun_normal()


def mesh_2x4():
    return jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto,) * 2)


def batches(steps=10, seed=0):
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(16, 8)).astype(np.float32)
    out = []
    for _ in range(steps):
        x = rng.normal(size=(16, 16)).astype(np.float32)
        out.append((x, np.sin(x @ w)))
    return out


def close(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=2e-5, atol=2e-6)


# --- Linen: nn.with_partitioning ----------------------------------------------------------
class LinenMLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.Dense(
            32,
            kernel_init=nn.with_partitioning(LECUN, (None, "model")),
            bias_init=nn.with_partitioning(nn.initializers.zeros, ("model",)),
        )(x)
        return nn.Dense(8, kernel_init=nn.with_partitioning(LECUN, ("model", None)))(jnp.tanh(x))


@ciclo.managed.train_step
def linen_step(state, batch):
    x, y = batch
    pred = LinenMLP().apply({"params": state.params}, x)
    return ciclo.logs().add_loss("loss", jnp.mean((pred - y) ** 2)), state


def linen_state(strategy):
    variables = LinenMLP().init(jax.random.key(0), jnp.zeros((1, 16)))
    return ManagedState.create(params=variables["params"], tx=TX, strategy=strategy)


def train(step, state, data):
    for batch in data:
        _, state = step(state, batch)
    return state


@needs_8_devices
@pytest.mark.parametrize("fsdp", [False, True], ids=["mesh", "mesh+fsdp"])
def test_a_linen_model_with_partitioning_metadata_trains_without_rules(fsdp):
    data = batches()
    ref = train(linen_step, linen_state("jit"), data)
    strategy = (ciclo.managed.fsdp if fsdp else ciclo.managed.sharded)(mesh_2x4())
    state = linen_state(strategy)
    kernel = state.params["Dense_0"]["kernel"]
    assert isinstance(kernel, nn.Partitioned)  # the annotation is kept
    expected = P("data", "model") if fsdp else P(None, "model")
    assert kernel.value.sharding.spec == expected
    assert {s.data.shape for s in kernel.value.addressable_shards} == (
        {(8, 8)} if fsdp else {(16, 8)}
    )
    # optax keeps the boxes, so the momentum is placed like its parameter.
    momentum = state.opt_state[0].trace["Dense_1"]["kernel"].value
    assert momentum.sharding.spec == (P("model", "data") if fsdp else P("model"))
    state = train(linen_step, state, data)
    assert state.params["Dense_0"]["kernel"].value.sharding.spec == expected
    assert state.params["Dense_0"]["bias"].value.sharding.spec == P("model")
    close(state.params, ref.params)


def test_logical_partitioning_goes_through_its_rules():
    rules = (("embed", None), ("mlp", "model"))
    boxed = nn.with_logical_partitioning(LECUN, ("embed", "mlp"), rules=rules)(
        jax.random.key(0), (16, 32)
    )
    mesh = jax.make_mesh((1, 1), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    specs = ciclo.managed.partition_specs({"kernel": boxed}, mesh=mesh)
    assert specs["kernel"].value == P(None, "model")


# --- NNX: sharding annotations on variables -----------------------------------------------
class NNXMLP(nnx.Module):
    def __init__(self, rngs):
        self.dense1 = nnx.Linear(
            16,
            32,
            kernel_init=nnx.with_partitioning(LECUN, (None, "model")),
            bias_init=nnx.with_partitioning(nnx.initializers.zeros_init(), ("model",)),
            rngs=rngs,
        )
        self.dense2 = nnx.Linear(
            32, 8, kernel_init=nnx.with_partitioning(LECUN, ("model", None)), rngs=rngs
        )

    def __call__(self, x):
        return self.dense2(jnp.tanh(self.dense1(x)))


def nnx_parts(mesh):
    with jax.set_mesh(mesh):  # NNX shards annotated variables when they are created
        model = NNXMLP(nnx.Rngs(0))
    graphdef, params = nnx.split(model, nnx.Param)
    return graphdef, params


@needs_8_devices
def test_an_nnx_model_with_sharding_annotations_trains_without_rules():
    mesh = mesh_2x4()
    graphdef, params = nnx_parts(mesh)

    @ciclo.managed.train_step
    def nnx_step(state, batch):
        x, y = batch
        pred = nnx.merge(graphdef, state.params)(x)
        return ciclo.logs().add_loss("loss", jnp.mean((pred - y) ** 2)), state

    data = batches()
    ref = train(nnx_step, ManagedState.create(params=params, tx=TX, strategy="jit"), data)
    state = ManagedState.create(params=params, tx=TX, strategy=ciclo.managed.sharded(mesh))
    kernel = state.params["dense1"]["kernel"]
    assert kernel[...].sharding.spec == P(None, "model")
    state = train(nnx_step, state, data)
    assert state.params["dense2"]["kernel"][...].sharding.spec == P("model")
    close(state.params, ref.params)


def test_the_readers_are_on_the_adapter_record_not_registered_on_import():
    from flax.core import meta

    from ciclo._plugins import _discovery

    assert set(ciclo_flax.adapter.partition_metadata) == {meta.Partitioned, nnx.Variable}
    assert not [t for t in _discovery.registered_extras() if t.__module__.startswith("flax")]


def test_core_finds_the_readers_through_the_entry_point(monkeypatch):
    from ciclo._plugins import _discovery

    # As in a process that never asked for the flax adapter: nothing loaded yet.
    monkeypatch.setattr(_discovery, "_LOADED", {})
    boxed = nn.Partitioned(jnp.zeros((8, 16)), names=(None, "data"))
    assert ciclo.managed.partition_specs({"k": boxed})["k"].value == P(None, "data")
    assert _discovery._LOADED["flax"] is ciclo_flax.adapter


# --- the adapter's states -----------------------------------------------------------------
CE = optax.softmax_cross_entropy_with_integer_labels


def labelled(steps=10):
    rng = np.random.default_rng(1)
    return [
        (rng.normal(size=(16, 16)).astype(np.float32), rng.integers(0, 8, 16).astype(np.int32))
        for _ in range(steps)
    ]


@needs_8_devices
def test_flax_state_of_an_annotated_linen_module_trains_under_the_mesh_strategy():
    def make(strategy):
        return ciclo_flax.create_state(
            LinenMLP(), jnp.zeros((1, 16)), TX, losses={"loss": CE}, strategy=strategy
        )

    ref, state = make("jit"), make(ciclo.managed.sharded(mesh_2x4()))
    assert state.params["Dense_1"]["kernel"].value.sharding.spec == P("model")
    state, history, _ = ciclo.loop(state, labelled(), {ciclo.every(1): state.train_step})
    ref, ref_history, _ = ciclo.loop(ref, labelled(), {ciclo.every(1): ref.train_step})
    assert state.params["Dense_0"]["kernel"].value.sharding.spec == P(None, "model")
    close(state.params, ref.params)
    np.testing.assert_allclose(history.collect("loss"), ref_history.collect("loss"), rtol=1e-5)


@needs_8_devices
def test_nnx_state_of_an_annotated_model_trains_under_the_mesh_strategy():
    mesh = mesh_2x4()
    with jax.set_mesh(mesh):
        model = NNXMLP(nnx.Rngs(0))
    ref = ciclo_flax.create_nnx_state(model, TX, losses={"loss": CE})
    state = ciclo_flax.create_nnx_state(
        model, TX, losses={"loss": CE}, strategy=ciclo.managed.sharded(mesh)
    )
    for batch in labelled():
        _, ref = ref.train_step(batch)
        _, state = state.train_step(batch)
    assert state.params["dense1"]["kernel"][...].sharding.spec == P(None, "model")
    assert state.params["dense2"]["kernel"][...].sharding.spec == P("model")
    close(state.params, ref.params)
