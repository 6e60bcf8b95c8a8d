"""Sharded strategies: "fsdp" and mesh rules ("sharded") against "jit", where each array
lives, partitioning metadata, and errors that name the rule and the array."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

import ciclo
from ciclo.managed import ManagedState

DEVICES = jax.device_count()
# SGD, not Adam: Adam hides a wrongly scaled gradient; SGD's update is proportional to it.
TX = optax.sgd(0.05, momentum=0.9)
needs_8_devices = pytest.mark.skipif(
    DEVICES != 8,
    reason="needs 8 devices: XLA_FLAGS=--xla_force_host_platform_device_count=8 "
    "(the nox test session sets it)",
)
RULES = [
    ("dense1/kernel", P(None, "model")),
    ("dense1/bias", P("model")),
    ("dense2/kernel", P("model", None)),
]


def mesh_2x4():
    return jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto,) * 2)


def init_params(seed=0):
    rng = np.random.default_rng(seed)
    return {
        "dense1": {
            "kernel": jnp.asarray(rng.normal(size=(16, 32)) * 0.3, jnp.float32),
            "bias": jnp.zeros(32),
        },
        "dense2": {
            "kernel": jnp.asarray(rng.normal(size=(32, 8)) * 0.3, jnp.float32),
            "bias": jnp.zeros(8),
        },
        "scale": jnp.ones(()),  # divides by nothing: stays replicated
    }


def mlp(params, x):
    h = jnp.tanh(x @ params["dense1"]["kernel"] + params["dense1"]["bias"])
    return params["scale"] * (h @ params["dense2"]["kernel"] + params["dense2"]["bias"])


@ciclo.managed.train_step
def train_step(state, batch):
    x, y = batch
    loss = jnp.mean((mlp(state.params, x) - y) ** 2)
    return ciclo.logs().add_loss("loss", loss), state


def make_batches(steps=20, batch_size=16, seed=1):
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(16, 8)).astype(np.float32)
    batches = []
    for _ in range(steps):
        x = rng.normal(size=(batch_size, 16)).astype(np.float32)
        batches.append((x, np.sin(x @ w)))
    return batches


def make_state(strategy="jit", **options):
    state = ManagedState.create(params=init_params(), tx=TX, strategy="jit")
    return state.with_strategy(strategy, **options)


def train(state, batches):
    logs = None
    for batch in batches:
        logs, state = train_step(state, batch)
    return logs, state


def assert_trees_close(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=2e-5, atol=2e-6)


def bytes_per_device(tree):
    held = dict.fromkeys(jax.devices(), 0)
    for leaf in jax.tree.leaves(tree):
        for shard in leaf.addressable_shards:
            held[shard.device] += shard.data.nbytes
    return held


@pytest.fixture(scope="module")
def reference():
    """20 "jit" steps on one device."""
    logs, state = train(make_state("jit"), make_batches())
    return jax.device_get((logs, state.params, state.opt_state))


# --- equal to jit -------------------------------------------------------------------------
@needs_8_devices
@pytest.mark.parametrize(
    "strategy",
    [
        pytest.param(lambda: "fsdp", id="fsdp"),
        pytest.param(lambda: ciclo.managed.sharded(mesh_2x4(), RULES), id="mesh-2x4-rules"),
        pytest.param(lambda: ciclo.managed.fsdp(mesh_2x4(), RULES), id="mesh-2x4-rules-fsdp"),
    ],
)
def test_20_sharded_steps_equal_20_jit_steps(strategy, reference):
    ref_logs, ref_params, ref_opt_state = reference
    logs, state = train(make_state(strategy()), make_batches())
    assert int(state.step) == 20
    assert_trees_close(state.params, ref_params)
    assert_trees_close(state.opt_state, ref_opt_state)
    np.testing.assert_allclose(float(logs.losses.loss), float(ref_logs.losses.loss), rtol=1e-5)
    # Ordinary global arrays of the full shapes.
    assert state.params["dense1"]["kernel"].shape == (16, 32)


@needs_8_devices
def test_fsdp_holds_about_an_eighth_of_the_parameters_on_each_device():
    state = make_state("fsdp")
    _, state = train(state, make_batches(steps=2))  # still sharded after training steps
    total = sum(leaf.nbytes for leaf in jax.tree.leaves(state.params))
    held = bytes_per_device(state.params)
    scale = jax.tree.leaves(state.params["scale"])[0].nbytes  # the one replicated leaf
    assert set(held.values()) == {(total - scale) // 8 + scale}
    assert max(held.values()) <= 1.01 * total / 8
    # Each array along a dimension that divides by 8, replicated when none does.
    specs = jax.tree.map(lambda x: x.sharding.spec, state.params)
    assert specs == {
        "dense1": {"kernel": P(None, "data"), "bias": P("data")},
        "dense2": {"kernel": P("data"), "bias": P("data")},
        "scale": P(),
    }
    # The optimizer state (momentum) is sharded like the parameters.
    momentum = state.opt_state[0].trace
    assert jax.tree.map(lambda x: x.sharding.spec, momentum) == specs
    assert max(bytes_per_device(momentum).values()) <= 1.01 * total / 8


@needs_8_devices
def test_mesh_rules_place_parameters_moments_and_batch():
    strategy = ciclo.managed.sharded(mesh_2x4(), RULES)
    state = make_state(strategy)
    kernel = state.params["dense1"]["kernel"]
    assert kernel.sharding.spec == P(None, "model")
    assert {shard.data.shape for shard in kernel.addressable_shards} == {(16, 8)}
    assert state.opt_state[0].trace["dense2"]["kernel"].sharding.spec == P("model")
    assert state.params["dense2"]["bias"].sharding.is_fully_replicated  # no rule matches
    x, _ = strategy.place_batch(make_batches(steps=1)[0])
    assert x.sharding.spec == P("data")
    assert {shard.data.shape for shard in x.addressable_shards} == {(8, 16)}


@needs_8_devices
def test_fused_and_accumulated_fsdp_steps_equal_jit_steps():
    batches = make_batches(steps=8)
    _, ref = train(make_state("jit"), batches)
    fast = make_state("fsdp", steps_per_call=4, accumulate_steps=2)
    state, history, _ = ciclo.loop(fast, batches, {ciclo.every(1): train_step})
    assert_trees_close(state.params, ref.params)
    assert len(history.collect("loss")) == 8
    assert state.params["dense1"]["kernel"].sharding.spec == P(None, "data")


@needs_8_devices
def test_a_state_made_elsewhere_is_moved_back_onto_the_mesh():
    state = make_state("fsdp")
    state = state.replace(params=jax.device_put(state.params, jax.devices()[3]))
    _, state = train_step(state, make_batches(steps=1)[0])
    assert state.params["dense1"]["kernel"].sharding.spec == P(None, "data")


@needs_8_devices
def test_extra_fields_are_matched_by_their_own_name():
    table = jnp.zeros((8, 3))
    state = ManagedState.create(
        params=init_params(),
        tx=TX,
        extra={"table": table},  # table= alone is a close match of trainable=
        strategy=ciclo.managed.sharded(mesh_2x4(), [("^table$", P("model"))]),
    )
    assert state.table.sharding.spec == P("model")


# --- partition metadata -------------------------------------------------------------------
class Annotated:
    """A pytree node carrying axis names, like Flax's nn.Partitioned."""

    def __init__(self, value, names):
        self.value, self.names = value, names


jax.tree_util.register_pytree_with_keys(
    Annotated,
    lambda node: (((jax.tree_util.GetAttrKey("value"), node.value),), node.names),
    lambda names, children: Annotated(children[0], names),
)
ciclo.managed.register_partition_metadata(Annotated, lambda node: P(*node.names))


def annotated_params():
    params = init_params()
    params["dense1"]["kernel"] = Annotated(params["dense1"]["kernel"], (None, "model"))
    params["dense2"]["kernel"] = Annotated(params["dense2"]["kernel"], ("model", None))
    return params


def unbox(params):
    return jax.tree.map(
        lambda x: x.value if isinstance(x, Annotated) else x,
        params,
        is_leaf=lambda x: isinstance(x, Annotated),
    )


@ciclo.managed.train_step
def annotated_step(state, batch):
    x, y = batch
    loss = jnp.mean((mlp(unbox(state.params), x) - y) ** 2)
    return ciclo.logs().add_loss("loss", loss), state


@needs_8_devices
def test_partition_metadata_places_arrays_without_rules(reference):
    _, ref_params, _ = reference
    state = ManagedState.create(
        params=annotated_params(), tx=TX, strategy=ciclo.managed.sharded(mesh_2x4())
    )
    kernel = state.params["dense1"]["kernel"].value
    assert kernel.sharding.spec == P(None, "model")
    # optax keeps the annotation on the moments, so they follow the parameters.
    assert state.opt_state[0].trace["dense2"]["kernel"].value.sharding.spec == P("model")
    for batch in make_batches():
        _, state = annotated_step(state, batch)
    assert state.params["dense1"]["kernel"].value.sharding.spec == P(None, "model")
    assert_trees_close(unbox(state.params), ref_params)


def test_rules_take_precedence_over_metadata_and_paths_end_at_the_annotated_node():
    mesh = jax.make_mesh((1, 1), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    params = {"dense1": {"kernel": annotated_params()["dense1"]["kernel"]}}
    specs = ciclo.managed.partition_specs(params, [("kernel$", P("data"))], mesh=mesh)
    assert specs["dense1"]["kernel"].value == P("data")
    specs = ciclo.managed.partition_specs(params, mesh=mesh)
    assert specs["dense1"]["kernel"].value == P(None, "model")


# --- specs and errors ---------------------------------------------------------------------
def test_partition_specs_reads_rules_in_order_dicts_and_functions():
    mesh = jax.make_mesh((1, 1), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    params = init_params()
    first = ciclo.managed.partition_specs(
        params, [("kernel", P("model")), ("dense1/kernel", P(None, "model"))], mesh=mesh
    )
    assert first["dense1"]["kernel"] == P("model")
    as_dict = ciclo.managed.partition_specs(params, {"dense2/bias": P("model")}, mesh=mesh)
    assert as_dict["dense2"]["bias"] == P("model")
    assert as_dict["dense1"]["kernel"] == P()
    seen = []

    def rule(path, leaf):
        seen.append((path, leaf.shape))
        return P("data") if path == "dense2/kernel" else None

    by_fn = ciclo.managed.partition_specs(params, rule, mesh=mesh)
    assert by_fn["dense2"]["kernel"] == P("data")
    assert ("dense1/kernel", (16, 32)) in seen


def test_fsdp_splits_the_largest_dividing_dimension():
    mesh = jax.make_mesh((1,), ("data",), axis_types=(AxisType.Auto,))
    tree = {"a": jnp.zeros((4, 16)), "b": jnp.zeros((16, 16)), "key": jax.random.key(0)}
    specs = ciclo.managed.partition_specs(tree, mesh=mesh, fsdp_axis="data")
    assert specs == {"a": P(None, "data"), "b": P("data"), "key": P()}


@needs_8_devices
@pytest.mark.parametrize(
    ("rule", "problem"),
    [
        (("dense2/bias", P("data", None)), r"has 2 entries but the array has 1 dimensions"),
        (("dense1/kernel", P("tensor")), r"names axis 'tensor', but the mesh has axes"),
        (("dense2/kernel", P(None, ("data", "model"), None)), r"has 3 entries"),
    ],
)
def test_a_rule_that_does_not_fit_names_the_rule_and_the_array(rule, problem):
    pattern, _ = rule
    with pytest.raises(ValueError, match=rf"sharded: rule '{pattern}' gives params/{pattern}"):
        make_state(ciclo.managed.sharded(mesh_2x4(), [rule]))
    with pytest.raises(ValueError, match=problem):
        make_state(ciclo.managed.sharded(mesh_2x4(), [rule]))


@needs_8_devices
def test_a_dimension_that_does_not_divide_is_an_error():
    strategy = ciclo.managed.sharded(mesh_2x4(), [("odd", P(("data", "model")))])
    with pytest.raises(ValueError, match=r"splits dimension 0 \(size 6\) over 8 devices"):
        ManagedState.create(params={"odd": jnp.zeros((6, 4))}, tx=None, strategy=strategy)


def test_scalars_and_rng_keys_are_always_replicated():
    mesh = jax.make_mesh((1, 1), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    tree = {"scale": jnp.ones(()), "keys": jax.random.split(jax.random.key(0), 4)}
    specs = ciclo.managed.partition_specs(tree, [(".*", P("model"))], mesh=mesh)
    assert specs == {"scale": P(), "keys": P()}


def test_optimizer_state_that_a_rule_does_not_fit_is_replicated():
    mesh = jax.make_mesh((1, 1), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    tree = {"params": {"m": jnp.zeros((3, 4))}, "opt_state": {"m": jnp.zeros(3)}}
    specs = ciclo.managed.partition_specs(tree, [("m$", P(None, "model"))], mesh=mesh)
    assert specs == {"params": {"m": P(None, "model")}, "opt_state": {"m": P()}}


@pytest.mark.parametrize(
    ("rules", "error", "match"),
    [
        ([("kernel", ("model",))], TypeError, r"rule 'kernel' maps to \('model',\), not a Part"),
        ([("kernel",)], TypeError, r"rule 0 is \('kernel',\); a rule is a pair"),
        ([("kernel[", P())], ValueError, r"rule 'kernel\[' is not a valid regex"),
    ],
)
def test_malformed_rules_are_rejected_when_the_strategy_is_made(rules, error, match):
    with pytest.raises(error, match=match):
        ciclo.managed.sharded(rules=rules)


def test_register_partition_metadata_checks_its_arguments():
    with pytest.raises(TypeError, match=r"node_type must be a class"):
        ciclo.managed.register_partition_metadata("Partitioned", lambda n: None)
    with pytest.raises(TypeError, match=r"spec_of must be a function"):
        ciclo.managed.register_partition_metadata(Annotated, None)


def test_a_mesh_without_the_data_axis_is_rejected():
    mesh = jax.make_mesh((1,), ("model",), axis_types=(AxisType.Auto,))
    with pytest.raises(ValueError, match=r"fsdp\(axis='data'\): the mesh has axes \('model',\)"):
        ciclo.managed.fsdp(mesh)


def test_names_are_registered():
    assert {"fsdp", "sharded"} <= set(ciclo.managed.strategy_names())
    assert ciclo.managed.get_strategy("fsdp").name == "fsdp"


def test_a_broken_adapter_is_a_warning_and_its_metadata_is_ignored(monkeypatch):
    from ciclo._plugins import _discovery

    class Broken:  # an installed adapter of a framework that is imported (numpy)
        name, value, dist = "numpy", "broken_adapter:adapter", None

        def load(self):
            raise ImportError("no module named broken_adapter")

    monkeypatch.setattr(_discovery, "_entry_points", lambda: [Broken()])
    monkeypatch.setattr(_discovery, "_LOADED", {})
    monkeypatch.setattr(_discovery, "_REGISTERED", {})
    with pytest.warns(RuntimeWarning, match=r"adapter 'numpy' failed to load .*broken_adapter"):
        specs = ciclo.managed.partition_specs({"w": jnp.zeros(8)}, fsdp_axis="data")
    assert specs == {"w": P("data")}


def test_partition_metadata_comes_from_the_adapter_record(monkeypatch):
    from ciclo._plugins import _discovery

    class Boxed:  # a framework's annotated node, known only to its adapter's record
        def __init__(self, value):
            self.value = value

    jax.tree_util.register_pytree_node(
        Boxed, lambda b: ((b.value,), None), lambda _, children: Boxed(children[0])
    )
    adapter = ciclo.adapters.Adapter(
        name="numpy",  # a framework that is imported
        distribution="ciclo-numpy",
        handles=lambda model: False,
        create_state=lambda model: None,
        partition_metadata={Boxed: lambda node: P(None, "data")},
    )

    class Installed:
        name, value, dist = "numpy", "ciclo_numpy:adapter", None

        def load(self):
            return adapter

    monkeypatch.setattr(_discovery, "_entry_points", lambda: [Installed()])
    monkeypatch.setattr(_discovery, "_LOADED", {})
    monkeypatch.setattr(_discovery, "_REGISTERED", {})
    specs = ciclo.managed.partition_specs({"w": Boxed(jnp.zeros((4, 8)))})
    assert specs["w"].value == P(None, "data")


def test_a_rules_function_must_return_partition_specs():
    with pytest.raises(TypeError, match=r"the rules function gives dense1/bias \('model',\), not"):
        ciclo.managed.partition_specs(init_params(), lambda path, leaf: ("model",))
