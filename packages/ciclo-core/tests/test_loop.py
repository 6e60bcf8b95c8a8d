"""``ciclo.loop``: the callback conventions of DESIGN §2 and the semantics of §3."""

from __future__ import annotations

import copy
import itertools
import signal

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ciclo


def ones(n: int, batch_size: int = 2) -> list[np.ndarray]:
    return [np.ones((batch_size, 1), np.float32)] * n


# --- continuing a loop ----------------------------------------------------------------------


def test_returned_elapsed_continues_without_double_counting(regression):
    batches = regression.batches(10, batch_size=3)
    log_every = ciclo.every(2)

    def mark(state, batch, elapsed):
        return {"marks": {"seen": elapsed.steps}}, None

    def run(state, dataset, history, elapsed):
        tasks = {ciclo.every(1): regression.step, log_every: mark}
        return ciclo.loop(state, dataset, tasks, history=history, elapsed=elapsed)

    state, history, elapsed = run(regression.initial_state(), batches[:5], None, None)
    assert (elapsed.steps, elapsed.samples) == (5, 15)
    state, history, elapsed = run(state, batches[5:], history, elapsed)

    log_every_once = ciclo.every(2)
    once_state, once_history, once_elapsed = ciclo.loop(
        regression.initial_state(),
        batches,
        {ciclo.every(1): regression.step, log_every_once: mark},
    )
    assert (elapsed.steps, elapsed.samples) == (once_elapsed.steps, once_elapsed.samples)
    assert (elapsed.steps, elapsed.samples) == (10, 30)
    assert history.collect("steps", "samples", "loss") == once_history.collect(
        "steps", "samples", "loss"
    )
    assert history.collect("steps") == list(range(10))
    assert history.collect("seen") == [0, 2, 4, 6, 8]
    np.testing.assert_array_equal(state["w"], once_state["w"])
    assert int(state["count"]) == 10


def test_continuing_with_a_stop_counts_from_the_returned_elapsed():
    _, _, elapsed = ciclo.loop(None, ones(100), stop=4)
    _, _, elapsed = ciclo.loop(None, ones(100), elapsed=elapsed, stop=6)
    assert (elapsed.steps, elapsed.samples) == (6, 12)


def test_callers_tasks_are_not_mutated():
    class Spread(ciclo.LoopCallbackBase):
        def __loop_callback__(self, loop_state):
            return None

    def a(state):
        return state + 1

    def b(state):
        return None

    every_one = ciclo.every(1)
    callbacks = [a, b]
    spread = Spread()
    tasks = {every_one: callbacks, ciclo.every(2): b, **spread}
    snapshot = dict(tasks)
    keys = list(tasks)

    state, _, _ = ciclo.loop(0, ones(4), tasks)
    state, _, _ = ciclo.loop(state, ones(4), tasks)  # a new count: step 0 fires again

    assert state == 8
    assert tasks == snapshot
    assert list(tasks) == keys
    assert tasks[every_one] is callbacks
    assert callbacks == [a, b]


# --- return values --------------------------------------------------------------------------


def test_a_returned_dict_of_logs_is_logs():
    def report(state, batch, elapsed):
        return {"metrics": {"step": elapsed.steps}}

    state, history, _ = ciclo.loop({"w": 1.0}, ones(3), {ciclo.every(1): report})
    assert state == {"w": 1.0}
    assert history.collect("step") == [0, 1, 2]


def test_logs_returned_alone_are_logs():
    state, history, _ = ciclo.loop(
        "s", ones(2), {ciclo.every(1): lambda: ciclo.logs().add_metric("one", 1)}
    )
    assert state == "s"
    assert history.collect("one") == [1, 1]


def test_an_empty_dict_returned_alone_is_empty_logs():
    state, history, _ = ciclo.loop({"w": 1}, ones(2), {ciclo.every(1): lambda: {}})
    assert state == {"w": 1}
    assert len(history) == 0


@pytest.mark.parametrize(
    ("returned", "expected"),
    [
        (0, 0),
        (0.0, 0.0),
        ((None, {}), {}),
        ((None, []), []),
        (({"metrics": {}}, 0), 0),
        ((None, None, 0), 0),
        ((None, ()), ()),
    ],
)
def test_a_falsy_state_is_kept(returned, expected):
    state, _, _ = ciclo.loop("initial", ones(1), {ciclo.every(1): lambda: returned})
    assert state == expected
    assert type(state) is type(expected)


@pytest.mark.parametrize("returned", [None, (None, None), (None, None, None), (ciclo.logs(), None)])
def test_none_means_no_change(returned):
    state, _, _ = ciclo.loop("initial", ones(1), {ciclo.every(1): lambda: returned})
    assert state == "initial"


def test_outputs_logs_state_tuples():
    def with_named_outputs(state, batch):
        return {"pred": batch.sum()}, ciclo.logs().add_loss("loss", 1.0), state + 1

    def with_plain_outputs(state, batch):
        return batch[:, 0], None, state + 1

    state, history, _ = ciclo.loop(
        0, ones(2), {ciclo.every(1): [with_named_outputs, with_plain_outputs]}
    )
    assert state == 4
    assert history.collect("pred") == [2.0, 2.0]
    assert history.collect("loss") == [1.0, 1.0]
    assert [o.tolist() for o in history.collect("outputs.outputs")] == [[1.0, 1.0]] * 2


def test_state_returned_alone_can_be_an_array_or_object():
    class Model:
        def __init__(self, n):
            self.n = n

    state, _, _ = ciclo.loop(Model(0), ones(3), {ciclo.every(1): lambda s: Model(s.n + 1)})
    assert state.n == 3
    state, _, _ = ciclo.loop(jnp.zeros(2), ones(3), {ciclo.every(1): jax.jit(lambda s: s + 1)})
    np.testing.assert_array_equal(state, [3.0, 3.0])


# --- hooks, logs, loop state ----------------------------------------------------------------


def test_on_start_and_on_end_logs_reach_history():
    def start(state, batch, elapsed):
        assert batch is None
        return ciclo.logs().add_metric("started", elapsed.steps), state + 100

    def end(state, batch, elapsed):
        return {"metrics": {"final": state}}

    def step(state):
        return ciclo.logs().add_loss("loss", float(state)), state + 1

    state, history, elapsed = ciclo.loop(
        0, ones(3), {ciclo.every(1): step}, on_start=[start], on_end=end
    )
    assert state == 103
    assert history.collect("steps", "started") == ([0], [0])
    assert history.collect("steps", "final") == ([3], [103])
    assert history.collect("steps", "loss") == ([0, 1, 2], [100.0, 101.0, 102.0])
    assert len(history) == 5
    assert elapsed.steps == 3


def test_logs_of_a_step_merge_across_callbacks_and_accumulate():
    seen = []

    def first(state, batch, elapsed):
        return ciclo.logs().add_metric("a", elapsed.steps)

    def second(state, batch, elapsed, loop_state):
        seen.append(dict(loop_state.logs.metrics))
        return ciclo.logs().add_metric("b", 10 * elapsed.steps)

    def end(state, batch, elapsed, loop_state):
        seen.append(loop_state.accumulated_logs)

    _, history, _ = ciclo.loop(
        None, ones(3), {ciclo.every(1): first, ciclo.every(2): second}, on_end=end
    )
    assert seen[:2] == [{"a": 0}, {"a": 2}]
    assert seen[2] == {"metrics": {"a": 2, "b": 20}}
    assert history.collect("steps", "a", "b") == ([0, 2], [0, 2], [0, 20])
    assert len(history) == 3  # one row per step that logged


def test_callbacks_take_zero_to_four_arguments():
    got = {}
    batch = np.full((2, 1), 7.0, np.float32)

    def zero():
        got[0] = ()

    def one(state):
        got[1] = (state,)

    def two(state, batch):
        got[2] = (state, batch)

    def three(state, batch, elapsed):
        got[3] = (state, batch, elapsed)

    def four(state, batch, elapsed, loop_state):
        got[4] = (state, batch, elapsed, loop_state)

    def defaults(state, batch=None, elapsed=None, loop_state=None, extra="kept"):
        got["defaults"] = (state, batch is not None, elapsed is not None, extra)

    def star(*args):
        got["star"] = len(args)

    lambda_two = lambda s, b: got.update({"lambda": (s, b)})  # noqa: E731

    ciclo.loop(
        "S",
        [batch],
        {ciclo.every(1): [zero, one, two, three, four, defaults, star, lambda_two]},
        metadata={"name": "train"},
    )
    assert got[0] == ()
    assert got[1] == ("S",)
    assert got[2][0] == "S"
    assert got[2][1] is batch
    assert got[3][2].steps == 0
    state, b, elapsed, loop_state = got[4]
    assert (state, b, elapsed.steps) == ("S", batch, 0)
    assert isinstance(loop_state, ciclo.LoopState)
    assert loop_state.metadata == {"name": "train"}
    assert got["defaults"] == ("S", True, True, "kept")
    assert got["star"] == 4
    assert got["lambda"][0] == "S"


def test_methods_and_callable_objects_are_callbacks():
    class Trainer:
        def __init__(self):
            self.steps = []

        def record(self, state, batch, elapsed):
            self.steps.append(elapsed.steps)

        def __call__(self, state):
            return state + 1

    trainer = Trainer()
    state, _, _ = ciclo.loop(0, ones(3), {ciclo.every(1): [trainer.record, trainer]})
    assert trainer.steps == [0, 1, 2]
    assert state == 3


def test_loop_callback_objects_get_the_loop_state():
    class Doubler:
        def __init__(self):
            self.seen = []

        def __loop_callback__(self, loop_state):
            self.seen.append((loop_state.elapsed.steps, loop_state.batch.shape))
            logs = ciclo.logs().add_metric("doubled", 2 * loop_state.state)
            return logs, 2 * loop_state.state

    doubler = Doubler()
    assert isinstance(doubler, ciclo.LoopCallback)
    state, history, _ = ciclo.loop(1, ones(3), {ciclo.every(1): doubler})
    assert state == 8
    assert doubler.seen == [(0, (2, 1)), (1, (2, 1)), (2, (2, 1))]
    assert history.collect("doubled") == [2, 4, 8]


# --- stopping -------------------------------------------------------------------------------


def test_stop_in_steps_and_in_samples():
    drawn = []

    def endless():
        for i in itertools.count():
            drawn.append(i)
            yield np.ones((3, 1))

    _, _, elapsed = ciclo.loop(None, endless(), stop=5)
    assert (elapsed.steps, elapsed.samples, len(drawn)) == (5, 15, 5)
    drawn.clear()
    _, _, elapsed = ciclo.loop(None, endless(), stop=ciclo.at(samples=10))
    assert (elapsed.steps, elapsed.samples, len(drawn)) == (4, 12, 4)


def test_stop_defaults_to_the_end_of_the_dataset():
    _, _, elapsed = ciclo.loop(None, ones(7))
    assert elapsed.steps == 7


def test_loop_state_stop_iteration_ends_after_the_current_step():
    ran = []

    def step(state, batch, elapsed, loop_state):
        if elapsed.steps == 2:
            loop_state.stop_iteration = True
            loop_state.stop_reason = "converged"
        return state + 1

    def later(state, batch, elapsed):
        ran.append(elapsed.steps)

    def end(state, batch, elapsed, loop_state):
        ran.append(("end", state, elapsed.steps, loop_state.stop_reason))

    state, _, elapsed = ciclo.loop(0, ones(10), {ciclo.every(1): [step, later]}, on_end=end)
    assert state == 3
    assert elapsed.steps == 3
    assert ran == [0, 1, 2, ("end", 3, 3, "converged")]


def test_sigint_stops_gracefully_after_the_current_step():
    handler_before = signal.getsignal(signal.SIGINT)
    ran = []

    def step(state, batch, elapsed):
        if elapsed.steps == 3:
            signal.raise_signal(signal.SIGINT)
        return state + 1

    def later(state, batch, elapsed):
        ran.append(elapsed.steps)

    def end(state, batch, elapsed, loop_state):
        ran.append(("end", elapsed.steps, loop_state.stop_iteration, loop_state.stop_reason))
        return ciclo.logs().add_metric("final_state", state)

    endless = itertools.repeat(np.ones((2, 1)))
    state, history, elapsed = ciclo.loop(
        0, endless, {ciclo.every(1): [step, later]}, on_end=end, stop=100
    )
    assert state == 4  # the interrupted step finished
    assert elapsed.steps == 4
    assert ran == [0, 1, 2, 3, ("end", 4, True, "stopped by SIGINT")]
    assert history.collect("final_state") == [4]
    assert signal.getsignal(signal.SIGINT) is handler_before


def test_a_second_sigint_interrupts_at_once():
    def step(state, batch, elapsed):
        if elapsed.steps == 1:
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)
        return state + 1

    handler_before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        ciclo.loop(0, ones(10), {ciclo.every(1): step})
    assert signal.getsignal(signal.SIGINT) is handler_before


def test_no_stop_signals_leaves_handlers_alone():
    handler_before = signal.getsignal(signal.SIGINT)
    seen = []
    ciclo.loop(
        None,
        ones(1),
        {ciclo.every(1): lambda: seen.append(signal.getsignal(signal.SIGINT))},
        stop_signals=(),
    )
    assert seen == [handler_before]


# --- dispatch ---------------------------------------------------------------------------------


@pytest.mark.parametrize("max_steps_in_flight", [0, 1, 2])
def test_steps_in_flight_with_non_scalar_and_zero_logs(max_steps_in_flight):
    # The first log leaf is a vector (and the next one zero): bounding the steps in flight
    # must never truth-test them.
    @jax.jit
    def step(state, batch):
        logs = ciclo.logs().add_entry("a_vector", "v", batch[:, 0] * state)
        logs.add_loss("zero", jnp.float32(0.0))
        return logs, state + 1.0

    state, history, _ = ciclo.loop(
        jnp.float32(0.0),
        ones(5),
        {ciclo.every(1): step},
        max_steps_in_flight=max_steps_in_flight,
    )
    assert float(state) == 5.0
    assert [v.tolist() for v in history.collect("v")] == [[float(i)] * 2 for i in range(5)]


@pytest.mark.parametrize("backend", ["cpu", "gpu", "tpu"])
def test_steps_in_flight_default_to_8_marked_every_8_steps_on_every_backend(monkeypatch, backend):
    from ciclo._loop import _engine

    made = []

    class Recorded(_engine.InFlight):
        def __init__(self, limit):
            super().__init__(limit)
            made.append(limit)

    monkeypatch.setattr(_engine, "InFlight", Recorded)
    monkeypatch.setattr(jax, "default_backend", lambda: backend)
    step = jax.jit(lambda state, batch: (ciclo.logs().add_loss("l", state), state + 1.0))
    ciclo.loop(jnp.zeros(()), ones(3), {ciclo.every(1): step})
    ciclo.loop(jnp.zeros(()), ones(3), {ciclo.every(1): step}, max_steps_in_flight=3)
    assert made == [8, 3]


@pytest.mark.parametrize(("limit", "kept"), [(1, [4]), (2, [3])])
def test_in_flight_keeps_the_marks_it_has_not_waited_for_yet(limit, kept):
    from ciclo._loop._in_flight import InFlight

    in_flight = InFlight(limit)
    arrays = [jnp.full((), float(i)) for i in range(5)]
    for array in arrays:
        in_flight.push_tree(array)
    # Each limit-th step is marked and waits for the mark before it: the mark left is the
    # last one, not waited for yet.
    assert [int(mark) for mark in in_flight.marks] == kept
    assert all(mark is arrays[i] for mark, i in zip(in_flight.marks, kept, strict=True))


def test_donated_state_buffers_do_not_break_the_in_flight_bound():
    step = jax.jit(lambda state, batch: state + batch.sum(), donate_argnums=0)
    state, _, _ = ciclo.loop(jnp.zeros(()), ones(6), {ciclo.every(1): step}, max_steps_in_flight=1)
    assert float(state) == 12.0


def test_callers_state_is_not_copied_or_changed():
    state = {"w": [1, 2]}
    snapshot = copy.deepcopy(state)
    out, _, _ = ciclo.loop(state, ones(2), {ciclo.every(1): lambda s: None})
    assert out is state
    assert state == snapshot
