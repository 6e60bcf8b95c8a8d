"""``ciclo.load_weights`` / ``weights_plan`` on a plain ``ManagedState``: every source
format, the policies and their errors, the plan, placement on 8 simulated devices, and
``trainable=`` (frozen params unchanged, no optimizer state, ``with_trainable``)."""

from __future__ import annotations

import inspect
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from jax.sharding import PartitionSpec as P

import ciclo
from ciclo.managed import ManagedState


def params(seed: int = 0, head: int = 2) -> dict:
    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
    return {
        "body": {"dense": {"kernel": jax.random.normal(k1, (8, 16)), "bias": jnp.zeros(16)}},
        "layers": [{"kernel": jax.random.normal(k2, (16, 16))}],
        "head": {"kernel": jax.random.normal(k3, (16, head))},
    }


def make_state(seed: int = 0, head: int = 2, **options) -> ManagedState:
    return ManagedState.create(params=params(seed, head), tx=optax.adam(1e-2), **options)


def bits_equal(a, b) -> bool:
    return all(
        np.asarray(x).tobytes() == np.asarray(y).tobytes()
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


@ciclo.managed.train_step
def train_step(state, batch):
    x, y = batch
    p = state.params
    h = jnp.tanh(x @ p["body"]["dense"]["kernel"] + p["body"]["dense"]["bias"])
    h = jnp.tanh(h @ p["layers"][0]["kernel"])
    logs = ciclo.logs()
    logs.add_loss("loss", jnp.mean((h @ p["head"]["kernel"] - y) ** 2))
    return logs, state


BATCH = (jnp.ones((4, 8)), jnp.zeros((4, 2)))


# --- sources ---------------------------------------------------------------------------
def write_ciclo_checkpoint(directory, state, steps=3, batch=BATCH):
    tasks = {ciclo.every(1): [train_step, ciclo.checkpoint(directory)]}
    trained, _, _ = ciclo.loop(state, [batch] * steps, tasks)
    return trained


def write_safetensors(path, tree):
    from safetensors.numpy import save_file

    flat = {
        ciclo.managed.key_path(p): np.asarray(x)
        for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]
    }
    save_file(flat, str(path))


def write_msgpack(path, tree):
    serialization = pytest.importorskip("flax.serialization")
    path.write_bytes(serialization.msgpack_serialize(jax.tree.map(np.asarray, tree)))


def write_orbax(path, tree):
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(path, tree)
    checkpointer.wait_until_finished()


@pytest.mark.parametrize("kind", ["pytree", "state", "ciclo", "orbax", "safetensors", "msgpack"])
def test_each_source_loads_bit_for_bit(tmp_path, kind):
    trained_state = make_state(seed=1)
    source = trained_state.params
    if kind == "state":
        source = trained_state
    elif kind == "ciclo":
        trained_state = write_ciclo_checkpoint(tmp_path / "run", trained_state)
        source, kind = tmp_path / "run", "ciclo"
    elif kind == "orbax":
        write_orbax(tmp_path / "orbax", trained_state.params)
        source = tmp_path / "orbax"
    elif kind == "safetensors":
        write_safetensors(tmp_path / "w.safetensors", trained_state.params)
        source = str(tmp_path / "w.safetensors")
    elif kind == "msgpack":
        write_msgpack(tmp_path / "w.msgpack", trained_state.params)
        source = str(tmp_path / "w.msgpack")
    state = make_state(seed=0).replace(step=jnp.asarray(7, jnp.int32))
    loaded = ciclo.load_weights(state, source)
    assert bits_equal(loaded.params, trained_state.params)
    assert int(loaded.step) == 0
    # the optimizer state is new: tx.init of the loaded params
    assert bits_equal(loaded.opt_state, optax.adam(1e-2).init(trained_state.params))


def test_a_ciclo_checkpoint_step_and_its_averaged_weights(tmp_path):
    state = make_state(seed=1, ema=0.9)
    states = []
    tasks = {
        ciclo.every(1): [train_step, lambda state: states.append(state)],
        ciclo.every(2): ciclo.checkpoint(tmp_path / "run", keep=None),
    }
    ciclo.loop(state, [BATCH] * 4, tasks)
    target = make_state(seed=0, ema=0.9)
    loaded = ciclo.load_weights(target, tmp_path / "run", step=3)
    assert bits_equal(loaded.params, states[2].params)
    assert bits_equal(loaded.ema_params, states[2].params)  # the average starts from them
    averaged = ciclo.load_weights(target, tmp_path / "run", use="ema_params")
    assert bits_equal(averaged.params, states[-1].ema_params)
    with pytest.raises(FileNotFoundError, match=r"no step 2 .* steps: \[1, 3, 4\]"):
        ciclo.load_weights(target, tmp_path / "run", step=2)
    with pytest.raises(ValueError, match="holds no 'ema_params' arrays"):
        ciclo.load_weights(make_state(), make_state(1), use="ema_params")


def test_an_nnx_state_saved_by_orbax_names_without_its_value_box(tmp_path):
    nnx = pytest.importorskip("flax.nnx")
    model = nnx.Linear(8, 16, rngs=nnx.Rngs(3))
    write_orbax(tmp_path / "nnx", nnx.state(model))
    state = ManagedState.create(
        params={"kernel": jnp.zeros((8, 16)), "bias": jnp.ones(16)}, tx=optax.sgd(0.1)
    )
    loaded = ciclo.load_weights(state, tmp_path / "nnx")
    assert bits_equal(loaded.params["kernel"], model.kernel[...])
    assert bits_equal(loaded.params["bias"], model.bias[...])


# --- names, policies, the plan ------------------------------------------------------------
def test_a_missing_weight_is_an_error_never_zeros():
    source = params(1)
    del source["head"]
    with pytest.raises(
        ValueError, match=r"1 missing in the source: head/kernel\. .*missing='keep'"
    ):
        ciclo.load_weights(make_state(), source)
    # with "keep" the head keeps its initialization (not zeros) and the plan says so
    state = make_state()
    loaded = ciclo.load_weights(state, source, missing="keep")
    assert bits_equal(loaded.params["head"], state.params["head"])
    assert np.abs(np.asarray(loaded.params["head"]["kernel"])).min() > 0
    plan = ciclo.weights_plan(state, source, missing="keep")
    assert plan.kept == ["head/kernel"]
    assert len(plan.loaded) == 3


def test_unexpected_and_mismatched_name_every_path():
    source = params(1, head=10)
    source["extra"] = {"w": jnp.ones(3), "v": jnp.ones(2)}
    with pytest.raises(
        ValueError, match=r"2 unexpected .*: extra/v, extra/w\. .*unexpected='keep'"
    ):
        ciclo.load_weights(make_state(), source)
    with pytest.raises(
        ValueError, match=r"1 mismatched .*head/kernel: state \(16, 2\) float32, source \(16, 10\)"
    ):
        ciclo.load_weights(make_state(), source, unexpected="ignore")
    plan = ciclo.weights_plan(make_state(), source, unexpected="ignore", mismatched="keep")
    assert plan.kept == ["head/kernel"]
    assert plan.ignored == ["extra/v", "extra/w", "head/kernel"]
    text = str(plan)
    assert text.splitlines()[0] == (
        "weights plan: 3 loaded, 1 kept, 3 ignored, 1 mismatched, 0 cast"
    )
    assert "mismatched head/kernel: state (16, 2) float32, source (16, 10) float32" in text


def test_dtypes_widen_as_a_cast_and_narrowing_is_a_mismatch():
    half = jax.tree.map(lambda x: x.astype(jnp.float16), params(1))
    plan = ciclo.weights_plan(make_state(), half)
    assert plan.cast[0] == "body/dense/bias: float16 -> float32"
    assert len(plan.cast) == 4
    loaded = ciclo.load_weights(make_state(), half)
    assert bits_equal(loaded.params, jax.tree.map(lambda x: x.astype(jnp.float32), half))
    state16 = ManagedState.create(params=half, tx=None)
    with pytest.raises(ValueError, match=r"4 mismatched .*float16, source .* float32"):
        ciclo.weights_plan(state16, params(1))


def test_transform_renames_by_regex_or_function():
    published = {
        "encoder.dense.weight": np.ones((8, 16), np.float32),
        "encoder.dense.b": np.zeros(16, np.float32),
        "encoder.block0.weight": np.ones((16, 16), np.float32),
        "pooler.weight": np.ones(3, np.float32),
    }
    rules = {r"^encoder\.dense\.": "body/dense/", r"^encoder\.block(\d+)\.": r"layers/\1/",
             r"weight$": "kernel", r"/b$": "/bias"}  # fmt: skip
    loaded = ciclo.load_weights(
        make_state(), published, transform=rules, missing="keep", unexpected="ignore"
    )
    assert float(loaded.params["layers"][0]["kernel"].sum()) == 256.0
    plan = ciclo.weights_plan(
        make_state(),
        published,
        transform=lambda name: None if name.startswith("pooler") else rules and name,
        missing="keep",
        unexpected="ignore",
    )
    assert "pooler.weight" in plan.ignored
    with pytest.raises(ValueError, match="maps 'a', 'b' to 'head/kernel'"):
        ciclo.weights_plan(make_state(), {"a": 1.0, "b": 2.0}, transform=lambda n: "head/kernel")


def test_bad_arguments_name_the_culprit(tmp_path):
    with pytest.raises(ValueError, match=r"missing='zero'\): use one of"):
        ciclo.load_weights(make_state(), params(), missing="zero")
    with pytest.raises(TypeError, match="needs a ciclo state"):
        ciclo.load_weights({"w": jnp.ones(2)}, params())
    with pytest.raises(FileNotFoundError, match="no such file or directory"):
        ciclo.load_weights(make_state(), tmp_path / "nothing.safetensors")
    (tmp_path / "w.txt").write_text("")
    with pytest.raises(ValueError, match="no ciclo or Orbax checkpoint directory"):
        ciclo.load_weights(make_state(), tmp_path / "w.txt")


def test_weights_plan_takes_load_weights_arguments_and_names_itself():
    # the same signature, read from load_weights, for help() and Sphinx
    plan_signature = inspect.signature(ciclo.weights_plan)
    assert plan_signature.parameters == inspect.signature(ciclo.load_weights).parameters
    assert plan_signature.return_annotation is ciclo.WeightsPlan
    by_name = ciclo.weights_plan(state=make_state(), source=params(), transform=None)
    assert by_name == ciclo.weights_plan(make_state(), params())
    assert by_name.loaded
    with pytest.raises(TypeError, match=r"weights_plan\(\) got an unexpected keyword .*'missng'"):
        ciclo.weights_plan(make_state(), params(), missng="keep")
    with pytest.raises(TypeError, match=r"weights_plan\(\) missing a required argument: 'source'"):
        ciclo.weights_plan(make_state())
    with pytest.raises(ValueError, match=r"load_weights\(unexpected='drop'\): use one of"):
        ciclo.weights_plan(make_state(), params(), unexpected="drop")


@pytest.mark.parametrize(
    ("module", "suffix"), [("flax", "msgpack"), ("safetensors", "safetensors")]
)
def test_a_reader_not_installed_says_what_to_install(tmp_path, monkeypatch, module, suffix):
    monkeypatch.setitem(sys.modules, module, None)  # import fails as if not installed
    (tmp_path / f"w.{suffix}").write_bytes(b"")
    with pytest.raises(ImportError, match=rf"w\.{suffix}' needs .*pip install"):
        ciclo.load_weights(make_state(), tmp_path / f"w.{suffix}")


# --- placement ----------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["pytree", "orbax", "safetensors", "ciclo"])
@pytest.mark.parametrize("layout", ["fsdp", "tensor-parallel"])
def test_loaded_arrays_land_on_the_state_shardings(tmp_path, kind, layout):
    assert jax.device_count() == 8
    if layout == "fsdp":
        strategy = ciclo.managed.fsdp()
    else:
        mesh = jax.make_mesh(
            (2, 4), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2
        )
        strategy = ciclo.managed.sharded(mesh, [("kernel", P(None, "model"))])
    trained = make_state(seed=1, head=8)
    source = trained.params
    if kind == "orbax":
        write_orbax(tmp_path / "orbax", trained.params)
        source = tmp_path / "orbax"
    elif kind == "safetensors":
        write_safetensors(tmp_path / "w.safetensors", trained.params)
        source = tmp_path / "w.safetensors"
    elif kind == "ciclo":
        trained = write_ciclo_checkpoint(
            tmp_path / "run", trained, steps=1, batch=(jnp.ones((8, 8)), jnp.zeros((8, 8)))
        )
        source = tmp_path / "run"
    state = make_state(seed=0, head=8, strategy=strategy)
    sharded = [x.sharding for x in jax.tree.leaves(state.params)]
    assert any(not s.is_fully_replicated for s in sharded)
    loaded = ciclo.load_weights(state, source)
    assert [x.sharding for x in jax.tree.leaves(loaded.params)] == sharded
    assert bits_equal(loaded.params, trained.params)
    logs, _ = train_step(loaded, (jnp.ones((8, 8)), jnp.zeros((8, 8))))  # and it trains as it is
    assert np.isfinite(float(logs["losses"]["loss"]))


# --- trainable ----------------------------------------------------------------------------
def test_frozen_params_get_no_update_and_no_optimizer_state():
    state = make_state(trainable="^head/")
    moments = [x.size for x in jax.tree.leaves(state.opt_state)]
    full = [x.size for x in jax.tree.leaves(make_state().opt_state)]
    assert sum(moments) == 1 + 2 * 16 * 2  # adam's count, mu and nu of head/kernel only
    assert sum(full) == 1 + 2 * sum(x.size for x in jax.tree.leaves(params()))
    trained = state
    for _ in range(3):
        _, trained = train_step(trained, BATCH)
    assert bits_equal(trained.params["body"], state.params["body"])
    assert bits_equal(trained.params["layers"], state.params["layers"])
    assert not bits_equal(trained.params["head"], state.params["head"])
    # then everything trains, with a new optimizer state of every param
    unfrozen = trained.with_trainable(None)
    assert [x.size for x in jax.tree.leaves(unfrozen.opt_state)] == full
    assert int(unfrozen.step) == 3
    _, after = train_step(unfrozen, BATCH)
    assert not bits_equal(after.params["body"], trained.params["body"])


def test_the_frozen_part_is_not_differentiated(monkeypatch):
    differentiated = []
    grad = jax.grad

    def spy(fun, *args, **kwargs):
        gradient = grad(fun, *args, **kwargs)

        def wrapped(part, *rest):
            differentiated.append(jax.tree.map(jnp.shape, part))
            return gradient(part, *rest)

        return wrapped

    monkeypatch.setattr(jax, "grad", spy)
    train_step(make_state(trainable=lambda name: name.startswith("head")), BATCH)
    assert differentiated == [[(16, 2)]]  # head/kernel alone, the rest are constants


def test_trainable_errors_name_the_filter():
    with pytest.raises(ValueError, match=r"trainable='\^nothing' selects no parameter"):
        make_state(trainable="^nothing")
    with pytest.raises(TypeError, match=r"trainable=3: give a regex"):
        make_state(trainable=3)


def test_load_weights_keeps_trainable_and_rebuilds_its_optimizer_state():
    state = make_state(trainable="^head/")
    loaded = ciclo.load_weights(state, params(1))
    assert loaded.trainable == "^head/"
    assert bits_equal(loaded.opt_state, state.opt_state)  # init of the head's moments


def test_a_sharded_state_trains_its_head_alone():
    state = make_state(head=8, strategy="fsdp", trainable="^head/")
    adam = state.opt_state.inner_states["train"].inner_state[0]
    kernel = state.params["head"]["kernel"]
    assert (
        adam.mu["head"]["kernel"].sharding == adam.nu["head"]["kernel"].sharding == kernel.sharding
    )
    _, trained = train_step(state, (jnp.ones((8, 8)), jnp.zeros((8, 8))))
    assert bits_equal(trained.params["body"], state.params["body"])
    assert not bits_equal(trained.params["head"], state.params["head"])
    shardings = [x.sharding for x in jax.tree.leaves(state.params)]
    assert [x.sharding for x in jax.tree.leaves(trained.params)] == shardings
