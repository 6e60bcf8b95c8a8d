"""train_loop / test_loop / predict_loop: named schedules, self-registration, order of
events, evaluation timing, sample-weighted evaluation, errors."""

from __future__ import annotations

import copy
import dataclasses
import functools
import io
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import ciclo
from ciclo._records import _host

# --- a tiny softmax classifier --------------------------------------------------------------
RNG = np.random.default_rng(0)
X = RNG.normal(size=(96, 4)).astype(np.float32)
Y = (X @ RNG.normal(size=(4, 3))).argmax(-1).astype(np.int32)
X_TEST, Y_TEST = X[80:], Y[80:]  # 16 samples
TX = optax.sgd(0.3)


def train_batches(batch_size=8):
    while True:
        for i in range(0, 80, batch_size):
            yield X[i : i + batch_size], Y[i : i + batch_size]


def eval_batches(sizes=(6, 6, 4)):
    start = 80
    for size in sizes:
        yield X[start : start + size], Y[start : start + size]
        start += size


def init_state():
    w = jnp.zeros((4, 3))
    return {"w": w, "opt": TX.init(w), "count": jnp.zeros((), jnp.int32)}


@jax.jit
def _metrics(w, x, y):
    logits = x @ w
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    return loss, (logits.argmax(-1) == y).mean()


@jax.jit
def train_step(state, batch):
    x, y = batch
    (loss, accuracy), grads = jax.value_and_grad(lambda w: _metrics(w, x, y), has_aux=True)(
        state["w"]
    )
    updates, opt = TX.update(grads, state["opt"], state["w"])
    logs = ciclo.logs().add_loss("loss", loss).add_metric("accuracy", accuracy)
    new = {"w": optax.apply_updates(state["w"], updates), "opt": opt, "count": state["count"] + 1}
    return logs, new


@jax.jit
def eval_step(state, batch):
    loss, accuracy = _metrics(state["w"], *batch)
    logs = ciclo.logs().add_loss("loss", loss).add_metric("accuracy", accuracy)
    # how many training steps the evaluated state has seen:
    return logs.add_stateful_metric("trained_steps", state["count"])


# --- Must show: a full train_loop --------------------------------------------------------------
def test_train_loop_evaluates_after_each_epoch_not_after_step_0():
    out = io.StringIO()
    stopper = ciclo.early_stopping("loss_test", patience=3, file=io.StringIO())
    state, history, elapsed = ciclo.train_loop(
        init_state(),
        train_batches(),
        {ciclo.on_train_step: train_step, ciclo.on_test_step: eval_step},
        callbacks=[ciclo.keras_bar(20, file=out), stopper],
        test_dataset=lambda: eval_batches(),
        epoch_duration=5,
        stop=20,
    )
    steps, loss, accuracy_test = history.collect("steps", "loss", "accuracy_test")
    # one row per evaluation, in the row of the step that completed each epoch
    assert steps == [4, 9, 14, 19]
    assert len(loss) == len(accuracy_test) == 4
    # the evaluated state had trained a whole epoch more each time (never 1 step)
    assert history.collect("trained_steps_test") == [5, 10, 15, 20]
    assert elapsed.steps == 20
    assert int(state["count"]) == 20
    # the evaluation's numbers are those of the evaluated state on the whole test set
    _, whole_accuracy = _metrics(state["w"], X_TEST, Y_TEST)
    assert accuracy_test[-1] == pytest.approx(float(whole_accuracy), abs=1e-6)
    assert stopper.checks == 4
    last = out.getvalue().splitlines()[-1]
    assert last.startswith("20/20 [==============================]")
    assert f"accuracy_test: {accuracy_test[-1]:.4f}" in last


def test_order_of_events_within_steps():
    events = []

    def record(name):
        def callback(state, batch, elapsed, loop_state):
            events.append((name, elapsed.steps))

        callback.__qualname__ = name
        return callback

    names = [
        "on_train_begin",
        "on_epoch_begin",
        "on_reset_step",
        "on_train_batch_begin",
        "on_train_batch_end",
        "on_test_begin",
        "on_test_batch_begin",
        "on_test_batch_end",
        "on_test_end",
        "on_epoch_end",
        "on_train_end",
    ]
    tasks = {getattr(ciclo, n): record(n) for n in names}
    tasks[ciclo.on_train_step] = record("train_step")
    tasks[ciclo.every(1)] = record("every(1)")  # ordinary: after the step (tasks order)
    tasks[ciclo.on_test_step] = record("eval_step")
    ciclo.train_loop(
        None,
        [np.zeros((2, 1))] * 4,
        tasks,
        test_dataset=lambda: [np.zeros((3, 1))] * 2,
        epoch_duration=2,
    )
    train_step_events = [
        ("on_train_batch_begin", None),
        ("train_step", None),
        ("every(1)", None),
        ("on_train_batch_end", None),
    ]
    evaluation = [
        ("on_reset_step", 0),
        ("on_test_begin", 0),
        *[
            (name, i)
            for i in range(2)
            for name in ("on_test_batch_begin", "eval_step", "on_test_batch_end")
        ],
        ("on_test_end", 2),
    ]

    def step(i, begins, ends):
        out = [("on_reset_step", i), ("on_epoch_begin", i)] if begins else []
        out += [(name, i) for name, _ in train_step_events]
        if ends:
            out += [*evaluation, ("on_epoch_end", i)]
        return out

    expected = [
        ("on_train_begin", 0),
        *step(0, True, False),
        *step(1, False, True),
        *step(2, True, False),
        *step(3, False, True),
        ("on_train_end", 4),
    ]
    assert events == expected


def test_epoch_boundaries_count_samples_and_continue_across_calls():
    events = []
    tasks = {
        ciclo.on_train_step: lambda: None,
        ciclo.on_epoch_begin: lambda state, batch, elapsed: events.append(("begin", elapsed)),
        ciclo.on_epoch_end: lambda state, batch, elapsed: events.append(("end", elapsed)),
    }
    batches = [np.zeros((n, 1)) for n in (3, 4, 3, 5, 2, 4)]  # samples after: 3 7 10 15 17 21
    _, _, elapsed = ciclo.train_loop(None, batches[:3], tasks, epoch_duration=ciclo.at(samples=6))
    assert [(k, e.steps) for k, e in events] == [("begin", 0), ("end", 1), ("begin", 2)]
    events.clear()
    # a second call continues the count: its first step (samples 10 -> 15) is mid-epoch
    ciclo.train_loop(None, batches[3:], tasks, epoch_duration=ciclo.at(samples=6), elapsed=elapsed)
    assert [(k, e.steps) for k, e in events] == [("end", 3), ("begin", 4), ("end", 5)]


def test_without_epoch_duration_the_run_is_one_epoch():
    events = []
    tasks = {
        ciclo.on_train_step: lambda: None,
        ciclo.on_test_step: lambda: ciclo.logs().add_metric("one", 1.0),
        ciclo.on_epoch_begin: lambda state, batch, elapsed: events.append(("begin", elapsed.steps)),
        ciclo.on_epoch_end: lambda state, batch, elapsed: events.append(("end", elapsed.steps)),
    }
    _, history, _ = ciclo.train_loop(
        None, [np.zeros(2)] * 3, tasks, test_dataset=lambda: [np.zeros(2)]
    )
    assert events == [("begin", 0), ("end", 3)]
    assert history.collect("steps", "one_test") == ([3], [1.0])


def test_test_every_evaluates_on_its_own_period():
    tasks = {
        ciclo.on_train_step: lambda: None,
        ciclo.on_test_step: lambda state, batch, elapsed, loop_state: ciclo.logs().add_metric(
            "x", 1.0
        ),
    }
    _, history, _ = ciclo.train_loop(
        None,
        [np.zeros(1)] * 9,
        tasks,
        test_dataset=lambda: [np.zeros(1)],
        epoch_duration=6,
        test_every=3,
        test_name="valid",
    )
    assert history.collect("steps", "x_valid")[0] == [2, 5, 8]


def test_evaluation_does_not_change_the_training_state():
    def bump(state):
        return None, state + 100  # an evaluation step that (wrongly) changes the state

    state, _, _ = ciclo.train_loop(
        0,
        [np.zeros(1)] * 4,
        {ciclo.on_train_step: lambda state: (None, state + 1), ciclo.on_test_step: bump},
        test_dataset=lambda: [np.zeros(1)],
        epoch_duration=2,
    )
    assert state == 4


# --- self-registration -------------------------------------------------------------------------
@functools.partial(
    jax.tree_util.register_dataclass, data_fields=["value", "metric"], meta_fields=[]
)
@dataclasses.dataclass(frozen=True)
class MethodState:
    value: jax.Array
    metric: jax.Array

    @jax.jit
    def train_step(self, batch):
        new = dataclasses.replace(self, value=self.value + batch.sum(), metric=self.metric + 1)
        return ciclo.logs().add_stateful_metric("seen", new.metric), new

    @jax.jit
    def test_step(self, batch):
        new = dataclasses.replace(self, metric=self.metric + 1)
        return ciclo.logs().add_metric("value", self.value).add_stateful_metric(
            "seen", new.metric
        ), new

    def reset_step(self):
        return None, dataclasses.replace(self, metric=jnp.zeros((), jnp.int32))

    def predict_step(self, batch, elapsed):
        return {"doubled": batch * 2, "step": jnp.full(len(batch), elapsed.steps)}, None, None


def method_state():
    return MethodState(jnp.zeros(()), jnp.zeros((), jnp.int32))


def test_state_methods_register_under_their_schedules():
    state, history, _ = ciclo.train_loop(
        method_state(),
        [jnp.ones(2)] * 6,
        test_dataset=lambda: [jnp.ones(2)] * 2,
        epoch_duration=3,
    )
    assert float(state.value) == 12.0
    # reset_step runs at each epoch begin: the train metric counts within the epoch
    assert history.collect("stateful_metrics.seen") == [1, 2, 3, 1, 2, 3]
    # ... and before each evaluation, whose state is dropped afterwards
    assert history.collect("seen_test") == [2, 2]
    assert history.collect("value_test") == [6.0, 12.0]

    _, outputs, _ = ciclo.predict_loop(state, [jnp.ones(2), jnp.ones(1)], concatenate=True)
    np.testing.assert_array_equal(outputs["doubled"], [2.0, 2.0, 2.0])
    np.testing.assert_array_equal(outputs["step"], [0, 0, 1])


def test_tasks_on_train_step_replace_the_state_method():
    calls = []

    def my_step(state, batch):
        calls.append(1)
        return None, state

    state, _, _ = ciclo.train_loop(
        method_state(), [jnp.ones(2)] * 3, {ciclo.on_train_step: my_step}
    )
    assert len(calls) == 3
    assert float(state.value) == 0.0  # state.train_step did not run


def test_callback_objects_register_their_hook_methods():
    class Recorder:
        def __init__(self):
            self.events = []

        def on_train_begin(self):
            self.events.append("begin")

        def on_epoch_end(self, state, batch, elapsed, loop_state):
            self.events.append(("epoch_end", elapsed.steps, loop_state.logs.entry_value("x")))

        def on_train_end(self, state):
            self.events.append(("end", state))

        def on_predict_step(self):  # not a moment of train_loop: ignored there
            raise AssertionError

    recorder = Recorder()
    ciclo.train_loop(
        0,
        [np.zeros(1)] * 4,
        {ciclo.on_train_step: lambda state: (ciclo.logs().add_metric("x", 1.0), state + 1)},
        callbacks=[recorder],
        epoch_duration=2,
    )
    assert recorder.events == ["begin", ("epoch_end", 1, 1.0), ("epoch_end", 3, 1.0), ("end", 4)]


def test_loop_callback_with_default_schedule_runs_under_it():
    class EveryOther(ciclo.LoopCallbackBase):
        def __init__(self):
            self.steps = []

        def default_schedule(self):
            return ciclo.every(2)

        def __loop_callback__(self, loop_state):
            self.steps.append(loop_state.elapsed.steps)

    cb = EveryOther()
    ciclo.train_loop(None, [np.zeros(1)] * 5, {ciclo.on_train_step: lambda: None}, callbacks=[cb])
    assert cb.steps == [0, 2, 4]


def test_named_and_ordinary_schedules_mix_in_tasks():
    seen = []
    tasks = {
        ciclo.on_train_step: lambda state: (ciclo.logs().add_loss("loss", state), state + 1),
        ciclo.every(3): lambda state, batch, elapsed, loop_state: seen.append(
            (elapsed.steps, loop_state.logs.losses.loss)
        ),
        "on_train_end": lambda state: seen.append(("end", state)),
    }
    ciclo.train_loop(0, [np.zeros(1)] * 7, tasks)
    assert seen == [(0, 0), (3, 3), (6, 6), ("end", 7)]


# --- test_loop and predict_loop ------------------------------------------------------------------
def test_weighted_test_metrics_equal_the_whole_set_at_once():
    state = init_state()
    state["w"] = jnp.asarray(RNG.normal(size=(4, 3)), jnp.float32)
    calls = []
    original = _host.to_host

    def counting(tree):
        calls.append(1)
        return original(tree)

    _host.to_host = counting
    try:
        _, logs, elapsed = ciclo.test_loop(
            state, eval_batches((7, 7, 2)), {ciclo.on_test_step: eval_step}
        )
    finally:
        _host.to_host = original
    assert calls == []  # aggregated on device: nothing fetched
    assert elapsed.steps == 3
    assert elapsed.samples == 16
    whole_loss, whole_accuracy = _metrics(state["w"], X_TEST, Y_TEST)
    assert float(logs.metrics.accuracy) == pytest.approx(float(whole_accuracy), abs=1e-6)
    assert float(logs.losses.loss) == pytest.approx(float(whole_loss), rel=1e-5)
    # the unweighted mean of batch means would differ: the small batch is not over-weighted
    per_batch = [_metrics(state["w"], *b) for b in eval_batches((7, 7, 2))]
    assert float(np.mean([float(a) for _, a in per_batch])) != pytest.approx(
        float(whole_accuracy), abs=1e-3
    )


def test_test_loop_aggregation_and_on_test_end_logs():
    seen = {}

    def step(state, batch, elapsed):
        logs = (
            ciclo.logs()
            .add_metric("m", float(elapsed.steps))
            .add_stateful_metric("s", elapsed.steps)
        )
        return batch, logs, None  # outputs are dropped

    def on_end(state, batch, elapsed, loop_state):
        seen.update(jax.device_get(loop_state.logs))

    batches = [np.zeros(1), np.zeros(3)]
    _, logs, _ = ciclo.test_loop(
        None, batches, {ciclo.on_test_step: step, ciclo.on_test_end: on_end}
    )
    assert float(logs.metrics.m) == pytest.approx(0.75)  # (0*1 + 1*3) / 4
    assert logs.stateful_metrics.s == 1
    assert "outputs" not in logs
    assert seen["metrics"]["m"] == pytest.approx(0.75)
    _, logs, _ = ciclo.test_loop(
        None, batches, {ciclo.on_test_step: step}, aggregation={"metrics": "max"}
    )
    assert float(logs.metrics.m) == 1.0


def test_predict_loop_collects_outputs():
    def step(state, batch):
        return batch + 1, ciclo.logs().add_metric("ignored", 0.0), None

    batches = [np.zeros((2, 3)), np.zeros((1, 3))]
    _, outputs, elapsed = ciclo.predict_loop(None, batches, {ciclo.on_predict_step: step})
    assert [o.shape for o in outputs["outputs"]] == [(2, 3), (1, 3)]
    _, outputs, _ = ciclo.predict_loop(
        None, batches, {ciclo.on_predict_step: step}, concatenate=True
    )
    assert outputs["outputs"].shape == (3, 3)
    assert elapsed.samples == 3


# --- errors and the caller's tasks ------------------------------------------------------------
def test_unknown_named_schedules_are_clear_errors():
    step = {ciclo.on_train_step: lambda: None}
    with pytest.raises(ValueError, match=r"unknown named schedule 'on_epoch_ned'.*'on_epoch_end'"):
        ciclo.train_loop(None, [1], {**step, "on_epoch_ned": print})
    with pytest.raises(ValueError, match=r"ciclo.on_predict_step is not a moment of train_loop"):
        ciclo.train_loop(None, [1], {**step, ciclo.on_predict_step: print})
    with pytest.raises(ValueError, match=r"ciclo.on_epoch_end is not a moment of test_loop"):
        ciclo.test_loop(None, [1], {ciclo.on_test_step: print, ciclo.on_epoch_end: print})
    with pytest.raises(TypeError, match=r"ciclo.on_epoch_end is a named schedule.*train_loop"):
        ciclo.loop(None, [1], {ciclo.on_epoch_end: print})


def test_callbacks_without_a_matching_hook_are_clear_errors():
    class OnlyLoopCallback(ciclo.LoopCallbackBase):
        def __loop_callback__(self, loop_state):
            pass

    step = {ciclo.on_train_step: lambda: None}
    with pytest.raises(TypeError, match=r"callback .*OnlyLoopCallback has no hook that train_loop"):
        ciclo.train_loop(None, [1], step, callbacks=[OnlyLoopCallback()])
    with pytest.raises(TypeError, match=r"callback print has no hook .*tasks=\{ciclo.every"):
        ciclo.train_loop(None, [1], step, callbacks=[print])
    with pytest.raises(TypeError, match=r"csv_logger|CSVLogger has no hook that test_loop"):
        ciclo.test_loop(
            None, [1], {ciclo.on_test_step: print}, callbacks=[ciclo.csv_logger("x.csv")]
        )


def test_missing_steps_and_bad_arguments_are_clear_errors():
    with pytest.raises(ValueError, match=r"train_loop has no train_step.*on_train_step"):
        ciclo.train_loop(None, [1])
    with pytest.raises(ValueError, match=r"test_loop has no test_step"):
        ciclo.test_loop(None, [1])
    with pytest.raises(ValueError, match=r"predict_loop has no predict_step"):
        ciclo.predict_loop(None, [1], {ciclo.on_predict_batch_end: print})
    step = {ciclo.on_train_step: lambda: None}
    with pytest.raises(TypeError, match=r"test_dataset must be a dataset or a function.*lambda"):
        ciclo.train_loop(None, [1], {**step, ciclo.on_test_step: print}, test_dataset=3)
    with pytest.raises(ValueError, match=r"test_dataset but no test step"):
        ciclo.train_loop(None, [1], step, test_dataset=lambda: [1])
    with pytest.raises(ValueError, match=r"test_duration needs a test_dataset"):
        ciclo.train_loop(None, [1], step, test_duration=2)
    with pytest.raises(ValueError, match=r"epoch_duration must be a positive amount in one unit"):
        ciclo.train_loop(None, [1], step, epoch_duration=ciclo.at(steps=2, samples=3))
    with pytest.raises(TypeError, match=r"epoch_duration must be an int"):
        ciclo.train_loop(None, [1], step, epoch_duration="2")
    with pytest.raises(TypeError, match=r"train_loop takes no on_start=.*on_train_begin"):
        ciclo.train_loop(None, [1], step, on_start=print)


def test_loop_options_are_forwarded_to_loop():
    step = {ciclo.on_train_step: lambda: None}
    _, _, elapsed = ciclo.train_loop(None, [1] * 3, step, max_steps_in_flight=0, stop_signals=())
    assert elapsed.steps == 3
    with pytest.raises(TypeError, match="resume_from"):  # an option loop() does not have
        ciclo.train_loop(None, [1], step, resume_from="x")


def test_the_callers_tasks_are_never_changed():
    train = {
        ciclo.on_train_step: [lambda: None],
        "on_epoch_end": lambda: None,
        ciclo.every(2): [lambda: None],
        ciclo.on_test_step: [lambda: ciclo.logs().add_metric("a", 1.0)],
    }
    snapshot = {k: copy.copy(v) for k, v in train.items()}
    ciclo.train_loop(
        None,
        [1] * 4,
        train,
        test_dataset=lambda: [1],
        epoch_duration=2,
        callbacks=[ciclo.early_stopping("a_test", 1, verbose=False)],
    )
    test = {ciclo.on_test_step: [lambda: None]}
    predict = {ciclo.on_predict_step: [lambda: (1, None, None)]}
    test_snapshot, predict_snapshot = (
        copy.copy(test[ciclo.on_test_step]),
        copy.copy(predict[ciclo.on_predict_step]),
    )
    ciclo.test_loop(None, [1], test)
    ciclo.predict_loop(None, [1], predict)
    assert list(train) == list(snapshot)
    assert all(train[k] == snapshot[k] for k in train)
    assert test == {ciclo.on_test_step: test_snapshot}
    assert predict == {ciclo.on_predict_step: predict_snapshot}


def test_error_in_a_hook_names_it():
    def broken(state):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom") as info:
        ciclo.train_loop(
            None,
            [1] * 3,
            {ciclo.on_train_step: lambda: None, ciclo.on_epoch_end: broken},
            epoch_duration=2,
        )
    assert any(re.search(r"callback .*broken at step 1", n) for n in info.value.__notes__)


def test_steps_in_flight_never_ask_an_array_for_its_truth_value():
    # The in-flight bound takes a step's first array as its marker; it must not call
    # bool() on it (a device sync, and an error for arrays of several elements).
    @jax.jit
    def step(state, batch):
        return ciclo.logs().add_metric("per_class", jnp.zeros(3) + state), state + 1

    state, history, _ = ciclo.loop(jnp.int32(0), [np.zeros(1)] * 5, {ciclo.every(1): step})
    assert int(state) == 5
    assert history.collect("per_class")[-1].tolist() == [4.0, 4.0, 4.0]
