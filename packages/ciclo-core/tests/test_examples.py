"""The examples of DESIGN §2, as a user writes them: a plain-dict state, a ``jax.jit`` step,
manual iteration, ``loop`` with a list of callbacks per schedule, ``**`` spreading and
``history.collect("steps", "loss", "accuracy")``. Every number is checked against the same
jitted step run in a plain Python loop."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

import ciclo


def test_manual_iteration_with_schedules_called_by_hand(regression):
    batches = regression.batches(12)
    states, ref_logs = regression.run_by_hand(batches[:10])

    state = regression.initial_state()
    history = ciclo.history()
    log_every = ciclo.every(2)
    evaluate_every = ciclo.every(samples=16)
    evaluated_at = []
    for elapsed, batch in ciclo.elapse(batches, stop=ciclo.at(samples=40)):
        logs, state = regression.step(state, batch)
        if log_every(elapsed):
            history.commit(elapsed, logs)
        if evaluate_every(elapsed):
            evaluated_at.append(elapsed.samples)

    steps, loss, accuracy = history.collect("steps", "loss", "accuracy")
    assert steps == [0, 2, 4, 6, 8]
    assert loss == [float(ref_logs[i].losses.loss) for i in steps]
    assert accuracy == [float(ref_logs[i].metrics.accuracy) for i in steps]
    assert history.collect("samples") == [4 * i for i in steps]
    assert evaluated_at == [0, 16, 32]
    # 40 samples of 4: ten steps, and the state is the one after the tenth.
    np.testing.assert_array_equal(state["w"], states[10]["w"])
    assert int(state["count"]) == 10


def test_loop_with_a_list_of_callbacks_per_schedule(regression):
    batches = regression.batches(10)
    states, ref_logs = regression.run_by_hand(batches)
    seen = []

    def record(state, batch, elapsed):
        seen.append((elapsed.steps, int(batch["x"].shape[0])))

    def evaluate(state):
        return ciclo.logs().add_metric("w_norm", jnp.linalg.norm(state["w"]))

    state, history, elapsed = ciclo.loop(
        regression.initial_state(),
        batches,
        {ciclo.every(1): [regression.step, record], ciclo.every(5): evaluate},
    )

    assert seen == [(i, 4) for i in range(10)]
    assert (elapsed.steps, elapsed.samples) == (10, 40)
    np.testing.assert_array_equal(state["w"], states[10]["w"])
    steps, loss, accuracy = history.collect("steps", "loss", "accuracy")
    assert steps == list(range(10))
    assert loss == [float(logs.losses.loss) for logs in ref_logs]
    assert accuracy == [float(logs.metrics.accuracy) for logs in ref_logs]
    # `evaluate` runs after the train step of the same step, so it sees the updated state.
    steps, w_norm = history.collect("steps", "w_norm")
    assert steps == [0, 5]
    assert w_norm == [float(jnp.linalg.norm(states[i + 1]["w"])) for i in steps]


class StepRecorder(ciclo.LoopCallbackBase):
    """A callback object with its own default schedule, spread into tasks with ``**``."""

    def __init__(self) -> None:
        self.steps: list[int] = []

    def default_schedule(self):
        return ciclo.every(3)

    def __loop_callback__(self, loop_state):
        self.steps.append(loop_state.elapsed.steps)
        return ciclo.logs().add_metric("seen_loss", loop_state.logs.losses.loss)


def test_spreading_a_callback_object_with_double_star(regression):
    batches = regression.batches(10)
    _, ref_logs = regression.run_by_hand(batches)
    recorder = StepRecorder()

    tasks = {ciclo.every(1): regression.step, **recorder}
    _, history, _ = ciclo.loop(regression.initial_state(), batches, tasks)

    assert len(tasks) == 2
    assert recorder.steps == [0, 3, 6, 9]
    # It ran after the train step of its step and saw that step's logs.
    steps, seen = history.collect("steps", "seen_loss")
    assert steps == [0, 3, 6, 9]
    assert seen == [float(ref_logs[i].losses.loss) for i in steps]


def test_callback_object_default_schedule_is_always():
    class Counter(ciclo.LoopCallbackBase):
        calls = 0

        def __loop_callback__(self, loop_state):
            Counter.calls += 1

    ciclo.loop(None, range(7), {**Counter()})
    assert Counter.calls == 7


def test_collect_returns_one_list_per_key(regression):
    batches = regression.batches(4)
    _, ref_logs = regression.run_by_hand(batches)
    _, history, _ = ciclo.loop(
        regression.initial_state(), batches, {ciclo.every(1): regression.step}
    )

    collected = history.collect("steps", "loss", "accuracy")
    assert isinstance(collected, tuple)
    assert len(collected) == 3
    assert collected[0] == [0, 1, 2, 3]
    assert history.collect("loss") == [float(logs.losses.loss) for logs in ref_logs]
    assert history.collect("losses.loss") == history.collect("loss")
