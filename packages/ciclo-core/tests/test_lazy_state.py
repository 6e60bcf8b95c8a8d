"""``ciclo.lazy_state``: a resume restores into the initial state's traced shapes (nothing of
it is compiled or run) and ends exactly as a resume into the built state; a fresh start
builds it; every kind of leaf and every placement comes back as the built state has it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import ciclo
from ciclo.managed import ManagedState

needs_8_devices = pytest.mark.skipif(
    jax.device_count() != 8, reason="needs 8 devices (the nox test session sets XLA_FLAGS)"
)


@jax.jit
def _init(key: jax.Array) -> dict[str, jax.Array]:
    k1, k2 = jax.random.split(key)
    return {"w": jax.random.normal(k1, (4, 3)), "b": jax.random.normal(k2, (3,)) * 0.1}


@ciclo.managed.train_step
def train_step(state: Any, batch: Any) -> tuple[ciclo.Logs, Any]:
    x, y = batch
    pred = x @ state.params["w"] + state.params["b"]
    return ciclo.logs().add_loss("loss", jnp.mean((pred - y) ** 2)), state


def batches(n: int = 12) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [
        (rng.normal(size=(8, 4)).astype(np.float32), rng.normal(size=(8, 3)).astype(np.float32))
        for _ in range(n)
    ]


class Factory:
    """``new_state()``, recording whether each call built arrays or was traced."""

    def __init__(self, strategy: Any = "jit") -> None:
        self.strategy = strategy
        self.calls: list[str] = []

    def __call__(self) -> ManagedState:
        params = _init(jax.random.key(0))
        self.calls.append("traced" if isinstance(params["w"], jax.core.Tracer) else "built")
        return ManagedState.create(params=params, tx=optax.adam(1e-2), strategy=self.strategy)


def run(state: Any, directory: Path, stop: int) -> tuple[Any, ciclo.History, ciclo.Elapsed]:
    checkpoint = ciclo.checkpoint(directory, keep=2)
    return ciclo.loop(
        state,
        batches(),
        {ciclo.every(1): train_step, ciclo.every(3): checkpoint},
        stop=stop,
        resume=directory,
    )


def assert_same_run(a: tuple[Any, ...], b: tuple[Any, ...], logged: str = "loss") -> None:
    (state_a, history_a, elapsed_a), (state_b, history_b, elapsed_b) = a, b
    assert (elapsed_a.steps, elapsed_a.samples) == (elapsed_b.steps, elapsed_b.samples)
    assert history_a.collect(logged) == history_b.collect(logged)
    leaves_a, leaves_b = jax.tree.leaves(state_a), jax.tree.leaves(state_b)
    assert len(leaves_a) == len(leaves_b)
    for x, y in zip(leaves_a, leaves_b, strict=True):
        assert type(x) is type(y)
        assert getattr(x, "dtype", None) == getattr(y, "dtype", None)
        if isinstance(x, jax.Array):
            assert x.sharding == y.sharding
            assert x.committed == y.committed
            if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
                x, y = jax.random.key_data(x), jax.random.key_data(y)
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_a_resume_only_traces_the_lazy_state_and_ends_as_a_resume_into_the_built_one(
    tmp_path: Path,
) -> None:
    eager, lazy = Factory(), Factory()
    run(eager(), tmp_path / "eager", 7)
    run(ciclo.lazy_state(lazy), tmp_path / "lazy", 7)  # a fresh start: built
    assert lazy.calls == ["built"]
    resumed_eager = run(eager(), tmp_path / "eager", 12)
    resumed_lazy = run(ciclo.lazy_state(lazy), tmp_path / "lazy", 12)
    assert lazy.calls == ["built", "traced"]  # the resume ran nothing of it
    assert_same_run(resumed_lazy, resumed_eager)
    assert resumed_lazy[2].steps == 12
    assert int(resumed_lazy[0].step) == 12


def test_a_lazy_state_without_a_checkpoint_or_resume_is_built_once(tmp_path: Path) -> None:
    factory = Factory()
    state, _, elapsed = ciclo.loop(
        ciclo.lazy_state(factory), batches(3), {ciclo.every(1): train_step}
    )
    assert factory.calls == ["built"]
    assert elapsed.steps == 3
    assert int(state.step) == 3
    state, _, _ = run(ciclo.lazy_state(factory), tmp_path / "empty", 2)  # no checkpoint yet
    assert factory.calls == ["built", "built"]
    assert int(state.step) == 2


def apply_fn(params: Any, model_state: Any, x: Any, *, training: bool, key: Any) -> Any:
    return x @ params["w"] + params["b"], model_state


class AdapterFactory(Factory):
    """An adapter state, whose ``train_step`` method ``train_loop`` finds on its class."""

    def __call__(self) -> ManagedState:
        params = _init(jax.random.key(0))
        self.calls.append("traced" if isinstance(params["w"], jax.core.Tracer) else "built")
        return ciclo.adapters.FunctionState.create(
            apply_fn=apply_fn,
            params=params,
            tx=optax.adam(1e-2),
            losses={"loss": lambda pred, y: jnp.mean((pred - y) ** 2)},
        )


def test_train_loop_takes_a_lazy_state_and_finds_its_methods_before_building_it(
    tmp_path: Path,
) -> None:
    factory = AdapterFactory()

    def train(stop: int) -> tuple[Any, ciclo.History, ciclo.Elapsed]:
        checkpoint = ciclo.checkpoint(tmp_path, keep=2)
        return ciclo.train_loop(
            ciclo.lazy_state(factory),
            batches(),
            {ciclo.every(4): checkpoint},
            stop=stop,
            resume=checkpoint,
        )

    train(8)
    state, history, elapsed = train(12)
    assert factory.calls == ["built", "traced"]
    assert elapsed.steps == 12
    assert int(state.step) == 12
    reference = ciclo.train_loop(AdapterFactory()(), batches(), stop=12)
    np.testing.assert_array_equal(history.collect("loss"), reference[1].collect("loss"))


def test_a_finished_run_resumed_lazily_returns_its_final_state(tmp_path: Path) -> None:
    factory = Factory()
    done = run(ciclo.lazy_state(factory), tmp_path, 6)
    again = run(ciclo.lazy_state(factory), tmp_path, 6)
    assert factory.calls == ["built", "traced"]
    assert_same_run(again, done)


def test_every_kind_of_leaf_comes_back_as_the_built_state_holds_it(tmp_path: Path) -> None:
    def new_state() -> dict[str, Any]:
        return {
            "array": jnp.arange(3.0),
            "numpy": np.linspace(0, 1, 4),  # float64: kept on the host, not cast
            "scalar": np.int64(7),
            "count": 0,
            "rate": 0.5,
            "flag": True,
            "key": jax.random.key(3),
            "empty": jnp.zeros((0, 2)),
            "none": None,
        }

    def step(state: dict[str, Any], batch: Any) -> tuple[None, dict[str, Any]]:
        # keeps each leaf's kind
        return None, {**state, "array": state["array"] + batch, "count": state["count"] + 1}

    def go(state: Any, directory: Path, stop: int) -> Any:
        tasks = {ciclo.every(1): step, ciclo.every(2): ciclo.checkpoint(directory)}
        return ciclo.loop(state, [1.0] * 10, tasks, stop=stop, resume=directory)

    go(new_state(), tmp_path / "eager", 4)
    go(ciclo.lazy_state(new_state), tmp_path / "lazy", 4)
    eager = go(new_state(), tmp_path / "eager", 6)
    lazy = go(ciclo.lazy_state(new_state), tmp_path / "lazy", 6)
    assert lazy[0]["count"] == 6
    assert lazy[0]["none"] is None
    for name in ("count", "rate", "flag"):
        assert type(lazy[0][name]) is type(eager[0][name])
    assert lazy[0]["numpy"].dtype == np.float64
    assert_same_run(lazy, eager, logged="elapsed.steps")


@needs_8_devices
@pytest.mark.parametrize("strategy", ["data-parallel", "fsdp"])
def test_a_sharded_state_is_restored_on_the_shardings_the_built_one_has(
    tmp_path: Path, strategy: str
) -> None:
    eager, lazy = Factory(strategy), Factory(strategy)
    run(eager(), tmp_path / "eager", 7)
    run(ciclo.lazy_state(lazy), tmp_path / "lazy", 7)
    resumed_eager = run(eager(), tmp_path / "eager", 12)
    resumed_lazy = run(ciclo.lazy_state(lazy), tmp_path / "lazy", 12)
    assert lazy.calls == ["built", "traced"]
    assert_same_run(resumed_lazy, resumed_eager)  # shardings included


@needs_8_devices
def test_shapes_take_each_arrays_sharding_from_the_traced_program() -> None:
    mesh = jax.make_mesh((8,), ("d",), axis_types=(AxisType.Auto,))
    split, whole = NamedSharding(mesh, P("d")), NamedSharding(mesh, P())

    def new_state() -> dict[str, Any]:
        x = jax.device_put(jnp.ones(8), split)
        key = jax.random.key(0)
        key = jax.random.wrap_key_data(jax.device_put(jax.random.key_data(key), whole))
        return {
            "split": x,
            "twice": x * 2,  # where its input is
            "key": key,
            "one_device": jax.device_put(jnp.ones(2), jax.devices()[3]),
            "jitted": jax.jit(lambda v: v + 1, out_shardings=whole)(x),
            "default": jnp.ones(2),
        }

    shapes = ciclo.lazy_state(new_state).shapes()
    built = new_state()
    for name in ("split", "twice", "key", "one_device", "jitted"):
        assert shapes[name].sharding == built[name].sharding, name
    assert shapes["default"].sharding is None
    assert not built["default"].committed


def test_a_value_instead_of_a_function_is_an_error_naming_the_fix() -> None:
    fix = r"lazy_state\(new_state\), not lazy_state\(new_state\(\)\)"
    with pytest.raises(TypeError, match=fix):
        ciclo.lazy_state({"w": jnp.zeros(3)})  # type: ignore[arg-type]


@needs_8_devices
def test_an_array_on_a_mesh_the_program_does_not_name_is_an_error_naming_the_fix() -> None:
    mesh = jax.make_mesh((8,), ("d",))

    def new_state() -> dict[str, Any]:
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            return {"w": jnp.zeros((8, 2), out_sharding=P("d"))}

    with pytest.raises(
        ValueError,
        match=r"the array \['w'\] is sharded over "
        r"AbstractMesh.*jax.set_mesh\(mesh\)",
    ):
        ciclo.lazy_state(new_state).shapes()
    with jax.set_mesh(mesh):  # the fix it names: the concrete mesh around the loop
        shapes = ciclo.lazy_state(new_state).shapes()
    assert shapes["w"].sharding == NamedSharding(mesh, P("d", None))


def test_restore_reads_a_checkpoint_into_a_lazy_state_without_building_it(
    tmp_path: Path,
) -> None:
    factory = Factory()
    trained = run(factory(), tmp_path, 6)
    restored = ciclo.restore(tmp_path, ciclo.lazy_state(factory))
    assert factory.calls == ["built", "traced"]
    assert restored.elapsed.steps == 6
    assert_same_run(tuple(restored), trained)


def test_a_state_with_a_leaf_that_is_not_an_array_is_an_error_naming_the_fix() -> None:
    def new_state() -> dict[str, Any]:
        return {"w": jnp.zeros(3), "name": "run-1"}

    with pytest.raises(TypeError, match="not a valid JAX type") as info:
        ciclo.lazy_state(new_state).shapes()
    assert any("a pytree of arrays and numbers" in note for note in info.value.__notes__)
    assert any("give the built state" in note for note in info.value.__notes__)


@ciclo.managed.step
def evaluation_step(state: Any, batch: Any) -> tuple[ciclo.Logs, Any]:
    x, y = batch
    pred = x @ state.params["w"] + state.params["b"]
    return ciclo.logs().add_metric("mse", jnp.mean((pred - y) ** 2)), state


def test_evaluate_checkpoints_restores_each_checkpoint_into_a_lazy_state(tmp_path: Path) -> None:
    factory = Factory()
    run(factory(), tmp_path, 7)

    def evaluate(state: Any) -> ciclo.History:
        tasks = {ciclo.on_test_step: evaluation_step}
        return ciclo.evaluate_checkpoints(tmp_path, state, lambda: batches(2), tasks)

    lazy = evaluate(ciclo.lazy_state(factory))
    eager = evaluate(Factory()())
    assert factory.calls == ["built", "traced"]  # traced once for every checkpoint
    assert lazy.collect("steps", "mse") == eager.collect("steps", "mse")
    assert lazy.collect("steps") == [4, 7]  # keep=2


def test_a_function_that_takes_arguments_is_an_error_at_once() -> None:
    def new_state(seed):
        return {"w": jnp.zeros(3) + seed}

    with pytest.raises(
        TypeError,
        match=r"got <function .*new_state.*: pass lazy_state\(new_state\), .* Bind its arguments",
    ):
        ciclo.lazy_state(new_state)  # type: ignore[arg-type]
    assert ciclo.lazy_state(lambda seed=0: new_state(seed)).build()["w"].shape == (3,)
