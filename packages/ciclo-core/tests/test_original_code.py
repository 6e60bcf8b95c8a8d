"""The original ciclo's code runs as written: what a step returns (flat-dict logs, NamedTuple
states, the full spec of managed steps) and the built-in callbacks called by hand."""

from __future__ import annotations

import dataclasses
import io
import os
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import ciclo


def ones(n: int, batch_size: int = 2) -> list[np.ndarray]:
    return [np.ones((batch_size, 1), np.float32)] * n


# --- what a step returns -------------------------------------------------------------------
class TrainingState(NamedTuple):
    """Shaped like the state of Haiku's MNIST example."""

    params: Any
    avg_params: Any
    opt_state: Any


def test_a_named_tuple_state_returned_by_a_jitted_step_stays_intact():
    params = {"linear": {"w": jnp.ones((1, 1)), "b": jnp.zeros(1)}}
    tx = optax.sgd(0.1)
    initial = TrainingState(params, params, tx.init(params))

    @jax.jit
    def update(state: TrainingState, batch: jax.Array) -> TrainingState:
        def loss_fn(p: Any) -> jax.Array:
            return jnp.mean((batch @ p["linear"]["w"] + p["linear"]["b"]) ** 2)

        grads = jax.grad(loss_fn)(state.params)
        updates, opt_state = tx.update(grads, state.opt_state)
        new = optax.apply_updates(state.params, updates)
        avg = jax.tree.map(lambda a, p: 0.5 * a + 0.5 * p, state.avg_params, new)
        return TrainingState(new, avg, opt_state)

    state, history, elapsed = ciclo.loop(initial, ones(3), {ciclo.every(1): update})
    assert elapsed.steps == 3
    assert type(state) is TrainingState
    assert jax.tree.structure(state) == jax.tree.structure(initial)
    expected = initial
    for batch in ones(3):
        expected = update(expected, batch)
    for got, want in zip(jax.tree.leaves(state), jax.tree.leaves(expected), strict=True):
        np.testing.assert_allclose(got, want)
    assert len(history) == 0  # nothing of the state was read as logs


def test_haiku_params_returned_alone_are_not_logs():
    params = {"linear": {"w": np.ones(2), "b": np.zeros(2)}}

    def update(state):
        return params

    with pytest.raises(
        TypeError,
        match=r"callback .*update returned a dict that is not logs: a dict with keys "
        r"\['linear'\].*return \(None, state\)",
    ):
        ciclo.loop(params, ones(2), {ciclo.every(1): update})


def test_haiku_params_as_the_state_of_a_tuple_are_the_state():
    params = {"linear": {"w": np.ones(2)}}
    state, history, _ = ciclo.loop(None, ones(2), {ciclo.every(1): lambda: (None, params)})
    assert state is params
    assert len(history) == 0


def test_a_flat_dict_in_the_logs_slot_is_metrics_shown_by_the_bar():
    out = io.StringIO()

    @jax.jit
    def train_step(state, batch):
        loss = jnp.mean(batch) * state
        logs = {"loss": loss, "accuracy": jnp.mean(batch > 0)}
        return logs, state * 0.5

    _, history, _ = ciclo.loop(
        jnp.array(1.0),
        ones(4),
        {ciclo.every(1): train_step, **ciclo.keras_bar(4, file=out, interval=0)},
    )
    assert history.collect("loss") == [1.0, 0.5, 0.25, 0.125]
    assert history.collect("metrics.accuracy") == [1.0] * 4
    last = out.getvalue().splitlines()[-1]
    assert last.startswith("4/4 [=====")
    assert "accuracy: 1.0000" in last
    assert "loss: 0.1250" in last


def test_a_flat_dict_in_a_three_tuple_and_outputs_reach_history():
    def step(state, batch):
        return {"pred": batch[:, 0]}, {"loss": 0.5}, state

    _, history, _ = ciclo.loop(0, ones(2), {ciclo.every(1): step})
    assert history.collect("loss") == [0.5, 0.5]
    np.testing.assert_array_equal(history.collect("pred")[0], np.ones(2))


@pytest.mark.parametrize(
    ("returned", "described"),
    [([ciclo.logs(), 1], r"list \[\{\}, 1\]"), ("done", "str 'done'")],
)
def test_a_list_or_a_string_returned_alone_is_an_error(returned, described):
    def step(state):
        return returned

    with pytest.raises(TypeError, match=rf"callback .*step returned a .*{described}"):
        ciclo.loop(0, ones(1), {ciclo.every(1): step})


def test_a_dict_mixing_nested_and_flat_values_in_the_logs_slot_is_an_error():
    with pytest.raises(TypeError, match=r"logs part of its tuple that is not logs"):
        ciclo.loop(0, ones(1), {ciclo.every(1): lambda: ({"a": 1.0, "b": {"c": 1}}, 0)})


@pytest.mark.parametrize("name", ["elapsed", "batch", "loop_state"])
def test_a_one_argument_callback_named_like_a_later_argument_is_an_error(name):
    namespace: dict[str, Any] = {}
    exec(f"def report({name}):\n    return None", namespace)
    wanted = ("state", "batch", "elapsed", "loop_state")
    fix = ", ".join(wanted[: wanted.index(name) + 1])
    with pytest.raises(
        TypeError,
        match=rf"callback report\({name}\) takes one argument named '{name}'.*gets the state"
        rf".*def report\({fix}\)",
    ):
        ciclo.loop(0, ones(1), {ciclo.every(1): namespace["report"]})


def test_a_one_argument_callback_named_otherwise_gets_the_state():
    state, _, _ = ciclo.loop(1, ones(2), {ciclo.every(1): lambda params: params + 1})
    assert state == 3


# --- managed steps: the full spec ----------------------------------------------------------
def _linear_state() -> ciclo.managed.ManagedState:
    return ciclo.managed.ManagedState.create(
        params={"w": jnp.zeros((1,))}, tx=optax.sgd(0.1), strategy="jit"
    )


def test_a_managed_train_step_returning_outputs_logs_state():
    @ciclo.managed.train_step
    def train_step(state, batch):
        preds = batch @ state.params["w"]
        loss = jnp.mean((preds - 1.0) ** 2)
        return {"preds": preds}, ciclo.logs().add_loss("loss", loss), state

    state, history, _ = ciclo.loop(_linear_state(), ones(3), {ciclo.every(1): train_step})
    assert int(state.step) == 3
    losses = history.collect("loss")
    assert losses[0] == pytest.approx(1.0)
    assert losses[2] < losses[0]  # the gradients were applied
    np.testing.assert_allclose(history.collect("preds")[0], np.zeros(2))


def test_a_managed_train_step_with_flat_dict_logs_says_they_are_metrics():
    @ciclo.managed.train_step
    def train_step(state, batch):
        return {"loss": jnp.mean(batch @ state.params["w"])}, state

    with pytest.raises(ValueError, match=r"logged no loss.*flat dict .* read as metrics"):
        train_step(_linear_state(), ones(1)[0])


def test_a_managed_step_returning_none_leaves_the_state():
    calls = []

    @ciclo.managed.step
    def observe(state, batch):
        calls.append(1)  # traced once
        return None

    state = _linear_state()
    logs, new_state = observe(state, ones(1)[0])
    assert logs == {}
    assert new_state.params is not None
    final, history, _ = ciclo.loop(state, ones(3), {ciclo.every(1): observe})
    assert int(final.step) == 0
    assert len(history) == 0


def test_a_managed_step_returning_a_state_alone():
    @ciclo.managed.step
    def count(state, batch):
        return state.replace(step=state.step + 1)

    final, _, _ = ciclo.loop(_linear_state(), ones(2), {ciclo.every(1): count})
    assert int(final.step) == 2


def test_a_managed_step_returning_a_four_tuple_is_named():
    @ciclo.managed.step
    def four(state, batch):
        return None, None, None, state

    with pytest.raises(TypeError, match=r"managed step four returned a tuple of 4 items"):
        four(_linear_state(), ones(1)[0])


# --- the built-in callbacks, called by hand ---------------------------------------------------
def test_the_manual_iteration_of_the_original_readme(tmp_path):
    os.chdir(tmp_path)  # a relative checkpoint path
    total_steps = 6
    out = io.StringIO()

    @jax.jit
    def train_step(state, batch):
        logs = ciclo.logs().add_loss("loss", jnp.mean(batch)).add_metric("accuracy", 0.5)
        return logs, state + 1

    state = jnp.array(0.0)
    dataset = ones(100)
    call_checkpoint = ciclo.every(steps=4)
    checkpoint = ciclo.checkpoint("logdir/my-model")
    keras_bar = ciclo.keras_bar(total=total_steps, file=out, dynamic=False)
    history = ciclo.history()
    for elapsed, batch in ciclo.elapse(dataset, stop=ciclo.at(total_steps)):
        logs = ciclo.logs()
        logs.updates, state = train_step(state, batch)
        if call_checkpoint(elapsed):
            checkpoint(elapsed, state)  # saves state at elapsed
        keras_bar(elapsed, logs)  # one bar update
        history.commit(elapsed, logs)

    assert float(state) == total_steps
    # fired at steps 0 and 4: each checkpoint holds the steps its state has done
    assert checkpoint.all_steps() == [1, 5]
    assert os.path.isdir(tmp_path / "logdir" / "my-model" / "5")
    restored = ciclo.restore("logdir/my-model", jnp.array(0.0))
    assert float(restored.state) == 5.0
    lines = out.getvalue().splitlines()
    assert lines[-1].startswith(f"{total_steps}/{total_steps} [==============================]")
    assert "accuracy: 0.5000" in lines[-1]
    assert history.collect("steps") == list(range(total_steps))


def test_early_stopping_by_hand_returns_stop_and_state():
    stopper = ciclo.early_stopping("loss", patience=2, verbose=False)
    stops = []
    for step, loss in enumerate([1.0, 0.5, 0.6, 0.7, 0.8]):
        stop, state = stopper(step, "state", {"losses": {"loss": loss}})
        stops.append(stop)
        assert state == "state"
    assert stops == [False, False, False, True, True]
    assert stopper.best == 0.5


def test_terminate_on_nan_and_tqdm_by_hand(tmp_path):
    nan = ciclo.terminate_on_nan(interval=0, verbose=False)
    assert nan(ciclo.Elapsed.create(), ciclo.logs().add_loss("loss", 1.0)) is False
    assert nan(ciclo.Elapsed.create(), {"losses": {"loss": float("nan")}}) is True

    out = io.StringIO()
    bar = ciclo.tqdm_bar(ciclo.at(samples=6), file=out, interval=0)
    for elapsed, batch in ciclo.elapse(ones(3)):
        bar(elapsed, batch)  # the original's tqdm_bar(elapsed, batch): counts samples
    assert bar.finished
    assert "6/6" in out.getvalue()


def test_loggers_by_hand(tmp_path):
    csv = ciclo.csv_logger(tmp_path / "log.csv")
    for elapsed, _ in ciclo.elapse(ones(2)):
        csv(elapsed, {"loss": 0.25})  # a flat dict, as a step returns it
    lines = (tmp_path / "log.csv").read_text().splitlines()
    assert lines[0] == "steps,samples,time,loss"
    assert [line.split(",")[0] for line in lines[1:]] == ["0", "1"]

    pytest.importorskip("tensorboardX")
    board = ciclo.tensorboard_logger(tmp_path / "tb")
    for elapsed, _ in ciclo.elapse(ones(2)):
        board(elapsed, ciclo.logs().add_loss("loss", 0.5))
    board.close()
    assert any(name.startswith("events.") for name in os.listdir(tmp_path / "tb"))


def test_inner_loop_by_hand_takes_the_state():
    evaluate = ciclo.inner_loop(
        "test", lambda state: ciclo.loop(state, ones(2), {ciclo.every(1): lambda: {"x": 1.0}})
    )
    with pytest.raises(TypeError, match="not logs"):
        evaluate(0)  # a dict alone is not logs, as in loop
    evaluate = ciclo.inner_loop(
        "test",
        lambda state: ciclo.loop(state, ones(2), {ciclo.every(1): lambda: ({"x": 1.0}, None)}),
    )
    logs, _ = evaluate(0)
    assert logs == {"metrics": {"x_test": 1.0}}


def test_a_call_by_hand_names_its_arguments():
    bar = ciclo.keras_bar(3, file=io.StringIO())
    with pytest.raises(TypeError, match=r"KerasBar called by hand takes \(elapsed, logs\)"):
        bar(ciclo.Elapsed.create(), ciclo.logs(), "extra")
    with pytest.raises(TypeError, match=r"takes an Elapsed first"):
        bar("zero", ciclo.logs())
    with pytest.raises(TypeError, match=r"unknown argument 'state'"):
        bar(ciclo.Elapsed.create(), state=1)


# --- issue 20: the original's names beyond its documents ----------------------------------
def test_the_original_names_exist():
    with pytest.warns(DeprecationWarning, match=r"use ciclo\.inner_loop"):
        assert ciclo.callbacks.inner_loop is ciclo.inner_loop
    assert ciclo.Period.create(steps=5) == ciclo.at(5)
    assert ciclo.Period.create(samples=64, time=10.0) == ciclo.at(samples=64, time=10.0)
    with pytest.raises(ValueError, match="at\\(\\) needs a period"):
        ciclo.Period.create()
    assert ciclo.inject(lambda state, batch: (state, batch))(1, 2, 3, 4) == (1, 2)
    assert ciclo.inject(lambda: "none")(1, 2, 3, 4) == "none"


@pytest.mark.parametrize(
    ("name", "base"), [("jit_donate", "jit"), ("data_parallel_donate", "data_parallel")]
)
def test_the_original_donating_strategy_names(name, base):
    assert ciclo.managed.get_strategy(name) is ciclo.managed.get_strategy(base, donate=True)
    fused = ciclo.managed.get_strategy(name, steps_per_call=4)
    assert fused is ciclo.managed.get_strategy(base, donate=True, steps_per_call=4)


def test_plural_log_methods():
    logs = (
        ciclo.logs()
        .add_losses(loss=1.0, l2=0.1)
        .add_metrics(accuracy=0.9)
        .add_stateful_metrics(f1=0.5)
        .add_outputs(preds=2)
        .add_entries("custom", x=3)
    )
    assert logs == {
        "losses": {"loss": 1.0, "l2": 0.1},
        "metrics": {"accuracy": 0.9},
        "stateful_metrics": {"f1": 0.5},
        "outputs": {"preds": 2},
        "custom": {"x": 3},
    }


def test_elapsed_compares_with_a_period_by_any_field():
    elapsed = ciclo.Elapsed.create(steps=10, samples=320)
    assert elapsed <= ciclo.at(10)
    assert not elapsed <= ciclo.at(9)
    assert elapsed <= ciclo.at(9, samples=400)  # any field
    assert elapsed > ciclo.at(9)
    assert not elapsed > ciclo.at(10)
    assert elapsed == ciclo.at(10)
    assert elapsed == ciclo.at(3, samples=320)
    assert elapsed != ciclo.at(11)
    assert ciclo.at(10) == elapsed
    assert elapsed >= ciclo.at(10)
    assert not elapsed < ciclo.at(10)
    same = ciclo.Elapsed(steps=10, samples=320, time=elapsed.time, date=elapsed.date)
    assert elapsed == same
    assert hash(elapsed) == hash(same)


@pytest.mark.parametrize(
    ("aggregation", "expected"),
    [
        ("last", 3.0),
        ("first", 1.0),
        ("mean", 2.0),
        ("sum", 6.0),
        ("min", 1.0),
        ("max", 3.0),
        (lambda values: float(np.median(values)), 2.0),
        ({"metrics": "sum"}, 6.0),
    ],
)
def test_inner_loop_aggregates_the_originals_list_history(aggregation, expected):
    rows = [{"metrics": {"m": v}, "elapsed": {"steps": i}} for i, v in enumerate([1.0, 2.0, 3.0])]
    evaluate = ciclo.inner_loop("probe", lambda state: (state, rows, None), aggregation)
    logs, _ = evaluate(0)
    assert float(logs.metrics.m_probe) == pytest.approx(expected)


def test_a_function_given_to_managed_state_create_stays_static():
    class Model:
        def apply(self, params, x):
            return x @ params["w"]

    model = Model()
    state = ciclo.managed.ManagedState.create(
        params={"w": jnp.ones((2,))}, tx=optax.sgd(0.1), apply_fn=model.apply
    )
    assert state.apply_fn == model.apply

    @ciclo.managed.train_step
    def train_step(state, batch):
        loss = jnp.mean(state.apply_fn(state.params, batch) ** 2)
        return ciclo.logs().add_loss("loss", loss), state

    state, history, _ = ciclo.loop(state, [jnp.ones((4, 2))] * 3, {ciclo.every(1): train_step})
    assert int(state.step) == 3
    assert state.apply_fn == model.apply
    assert history.collect("loss")[-1] < history.collect("loss")[0]
    replaced = state.replace(apply_fn=lambda params, x: x.sum())
    assert float(replaced.apply_fn(None, jnp.ones(2))) == 2.0


class UndecoratedState(ciclo.managed.ManagedState):
    """Declared as in the original ciclo: no dataclass decorator, a static field marked the
    flax way (``struct.field(pytree_node=False)``)."""

    ema_params: Any
    config: int = dataclasses.field(default=0, metadata={"pytree_node": False})

    @classmethod
    def create(cls, *, apply_fn, params, tx, **kwargs):
        ema = jax.tree.map(jnp.copy, params)
        return super().create(apply_fn=apply_fn, params=params, tx=tx, ema_params=ema, **kwargs)


def test_fields_of_an_undecorated_subclass_are_checked_like_the_built_in_ones():
    state = UndecoratedState.create(
        apply_fn=lambda p, x: x, params={"w": jnp.ones(2)}, tx=optax.sgd(0.1), config=3
    )
    assert {f.name for f in dataclasses.fields(state)} >= {"ema_params", "config"}
    np.testing.assert_array_equal(state.ema_params["w"], np.ones(2))
    assert not any(isinstance(leaf, int) for leaf in jax.tree.leaves(state))  # config: static
    assert state.config == 3
    with pytest.raises(TypeError, match=r"unknown keyword 'confgi'; did you mean 'config'"):
        UndecoratedState.create(
            apply_fn=None, params={"w": jnp.ones(2)}, tx=optax.sgd(0.1), confgi=3
        )
    with pytest.raises(TypeError, match=r"unknown field 'ema_parmas'.*did you mean 'ema_params'"):
        state.replace(ema_parmas=1)
