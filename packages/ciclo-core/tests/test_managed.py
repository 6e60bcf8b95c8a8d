"""Managed steps: errors that teach, gradient accumulation, fused steps in the loop."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import ciclo
from ciclo.managed import ManagedState

DEVICES = jax.device_count()
# One optimizer for every state (it is a static part of the state: a new one recompiles).
# SGD, not Adam: Adam hides a wrongly scaled gradient (e.g. summed instead of averaged
# over devices); SGD's update is proportional to it.
TX = optax.sgd(0.05, momentum=0.9)


@ciclo.managed.train_step
def regression_step(state, batch):
    x, y = batch
    pred = x @ state.params["w"] + state.params["b"]
    logs = ciclo.logs()
    logs.add_loss("loss", jnp.mean((pred - y) ** 2))
    logs.add_metric("mae", jnp.mean(jnp.abs(pred - y)))
    # A state change besides params: count the examples seen.
    return logs, state.replace(seen=state.seen + x.shape[0])


def make_state(strategy="jit", **options):
    params = {"w": jnp.zeros(4), "b": jnp.zeros(())}
    state = ManagedState.create(params=params, tx=TX, seen=jnp.zeros((), jnp.int32), strategy="jit")
    return state.with_strategy(strategy, **options)


def make_batches(steps=20, batch_size=16, seed=0):
    rng = np.random.default_rng(seed)
    w_true = rng.normal(size=4).astype(np.float32)
    batches = []
    for _ in range(steps):
        x = rng.normal(size=(batch_size, 4)).astype(np.float32)
        y = x @ w_true + 0.1 * rng.normal(size=batch_size).astype(np.float32)
        batches.append((x, y))
    return batches


def assert_trees_close(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6)


# --- errors that say what to add ----------------------------------------------------------
def test_train_step_without_a_loss_says_what_to_add():
    @ciclo.managed.train_step
    def no_loss(state, batch):
        return ciclo.logs().add_metric("mae", batch.mean()), state

    with pytest.raises(ValueError, match=r"no_loss logged no loss.*add_loss\('loss', loss\)"):
        no_loss(make_state(), jnp.ones(4))


def test_train_step_with_a_non_scalar_loss_says_how_to_reduce_it():
    @ciclo.managed.train_step
    def vector_loss(state, batch):
        return ciclo.logs().add_loss("mse", (batch * state.params["w"]) ** 2), state

    with pytest.raises(
        ValueError, match=r"loss 'mse' has shape \(4,\).*add_loss\('mse', per_example_loss.mean"
    ):
        vector_loss(make_state(), jnp.ones(4))


def test_managed_step_that_does_not_return_logs_is_named():
    @ciclo.managed.step
    def returns_array(state, batch):
        return batch.sum(), state

    with pytest.raises(TypeError, match=r"returns_array must return \(logs, state\)"):
        returns_array(make_state(), jnp.ones(4))


def test_managed_step_on_a_plain_state_says_how_to_make_one():
    with pytest.raises(TypeError, match=r"needs a ciclo.managed.ManagedState.*create\("):
        regression_step({"w": jnp.zeros(4)}, make_batches(steps=1)[0])


# --- gradient accumulation ----------------------------------------------------------------
@pytest.mark.parametrize(
    ("strategy", "parts"),
    [
        ("jit", 4),
        pytest.param(
            "data-parallel", 2, marks=pytest.mark.skipif(DEVICES < 2, reason="one device")
        ),
        pytest.param("pmap", 2, marks=pytest.mark.skipif(DEVICES < 2, reason="one device")),
    ],
)
def test_accumulation_matches_the_large_batch_step(strategy, parts):
    # N micro-batches of 16 // N rows make the same update as one step on all 16 rows.
    batches = make_batches(steps=3, batch_size=16)
    big, small = make_state("jit"), make_state(strategy, accumulate_steps=parts)
    for batch in batches:
        big_logs, big = regression_step(big, batch)
        small_logs, small = regression_step(small, batch)
    assert_trees_close(small.params, big.params)
    assert_trees_close(small.opt_state, big.opt_state)
    np.testing.assert_allclose(float(small_logs.losses.loss), float(big_logs.losses.loss), 1e-5)
    np.testing.assert_allclose(float(small_logs.metrics.mae), float(big_logs.metrics.mae), 1e-5)
    # One optimizer update per batch; other state changes run once per micro-batch (under
    # pmap, on each device's part of the batch: the state keeps the first device's).
    assert int(small.step) == 3
    assert int(big.seen) == 48
    assert int(small.seen) == (48 // DEVICES if strategy == "pmap" else 48)


def test_accumulation_differs_from_separate_small_steps():
    # Guards the test above: N separate updates on the micro-batches are not the same.
    batch = make_batches(steps=1, batch_size=16)[0]
    _, accumulated = regression_step(make_state("jit", accumulate_steps=4), batch)
    state = make_state("jit")
    for i in range(4):
        _, state = regression_step(state, (batch[0][i::4], batch[1][i::4]))
    assert not np.allclose(np.asarray(state.params["w"]), np.asarray(accumulated.params["w"]))


def test_accumulation_puts_outputs_back_in_batch_order():
    @ciclo.managed.train_step
    def with_outputs(state, batch):
        x, y = batch
        pred = x @ state.params["w"]
        logs = ciclo.logs().add_loss("loss", jnp.mean((pred - y) ** 2)).add_output("pred", y)
        return logs, state

    batch = make_batches(steps=1, batch_size=8)[0]
    logs, _ = with_outputs(make_state("jit", accumulate_steps=4), batch)
    np.testing.assert_array_equal(np.asarray(logs.outputs.pred), batch[1])


def test_accumulation_needs_a_divisible_batch():
    batch = make_batches(steps=1, batch_size=10)[0]
    with pytest.raises(ValueError, match=r"accumulate_steps=4 .* has 10 rows.*divisible by 4"):
        regression_step(make_state("jit", accumulate_steps=4), batch)


# --- fused steps in the loop --------------------------------------------------------------
class Spy:
    """Records how the loop calls a managed step: the sizes of its fused groups."""

    def __init__(self, monkeypatch):
        self.groups = []
        many = ciclo.managed.ManagedStep.__loop_callback_many__  # the loop's many()

        def spy(step, loop_state, batches):
            self.groups.append(len(batches))
            return many(step, loop_state, batches)

        monkeypatch.setattr(ciclo.managed.ManagedStep, "__loop_callback_many__", spy)


def train_tasks():
    return {ciclo.every(1): regression_step}  # a fresh schedule per loop: they keep state


def run_loop(steps_per_call, batches, extra_tasks=None, before=False):
    """20 steps of training, and a callback on every(steps=3) that records what it sees."""
    seen = []

    def every_third(state, batch, elapsed, loop_state):
        logs = loop_state.logs
        loss = logs.losses.loss if "losses" in logs else None
        seen.append((elapsed.steps, int(state.step), None if loss is None else float(loss)))
        return ciclo.logs().add_metric("state_step", state.step), None

    train = {ciclo.every(1): regression_step}
    third = {ciclo.every(steps=3): every_third}
    tasks = {**third, **train} if before else {**train, **third}
    tasks.update(extra_tasks or {})
    state = make_state("jit", steps_per_call=steps_per_call)
    state, history, elapsed = ciclo.loop(state, batches, tasks)
    return state, history, elapsed, seen


def history_rows(history):
    rows = []
    for row in history:
        elapsed = row.pop("elapsed")
        rows.append(((elapsed["steps"], elapsed["samples"]), row))
    return rows


def assert_same_history(a, b):
    rows_a, rows_b = history_rows(a), history_rows(b)
    assert [r[0] for r in rows_a] == [r[0] for r in rows_b]
    for (_, logs_a), (_, logs_b) in zip(rows_a, rows_b, strict=True):
        assert logs_a.keys() == logs_b.keys()
        for collection in logs_a:
            assert logs_a[collection].keys() == logs_b[collection].keys()
            for name, value in logs_a[collection].items():
                np.testing.assert_allclose(value, logs_b[collection][name], rtol=1e-5)


@pytest.mark.parametrize("before", [False, True], ids=["callback-after", "callback-before"])
def test_steps_per_call_8_equals_steps_per_call_1(monkeypatch, before):
    batches = make_batches(steps=20)
    state_1, history_1, elapsed_1, seen_1 = run_loop(1, batches, before=before)
    spy = Spy(monkeypatch)
    state_8, history_8, elapsed_8, seen_8 = run_loop(8, batches, before=before)

    assert_trees_close(state_8.params, state_1.params)
    assert_trees_close(state_8.opt_state, state_1.opt_state)
    assert elapsed_8.steps == elapsed_1.steps == 20
    assert_same_history(history_8, history_1)
    # every(steps=3) fires on the same steps, on the same state, seeing the same logs.
    assert [s[0] for s in seen_8] == [s[0] for s in seen_1] == [0, 3, 6, 9, 12, 15, 18]
    assert [s[1] for s in seen_8] == [s[1] for s in seen_1]
    np.testing.assert_allclose(
        [np.nan if s[2] is None else s[2] for s in seen_8],
        [np.nan if s[2] is None else s[2] for s in seen_1],
        rtol=1e-5,
    )
    # The rule: a callback after the fused step ends a group at its step (groups 0 | 1-3 |
    # 4-6 ...); one before it starts a group there (0-2 | 3-5 ...). Groups of one are plain
    # calls, so the spy sees only the fused ones.
    if before:
        assert spy.groups == [3, 3, 3, 3, 3, 3, 2]
        assert [s[1] for s in seen_1] == [0, 3, 6, 9, 12, 15, 18]
    else:
        assert spy.groups == [3, 3, 3, 3, 3, 3]
        assert [s[1] for s in seen_1] == [1, 4, 7, 10, 13, 16, 19]


def test_steps_per_call_fills_whole_groups_when_nothing_else_fires(monkeypatch):
    batches = make_batches(steps=20)
    state_1, history_1, _ = ciclo.loop(make_state("jit"), batches, train_tasks())
    spy = Spy(monkeypatch)
    state_8, history_8, elapsed = ciclo.loop(
        make_state("jit", steps_per_call=8), batches, train_tasks()
    )
    assert spy.groups == [8, 8, 4]
    assert elapsed.steps == 20
    assert_trees_close(state_8.params, state_1.params)
    assert_same_history(history_8, history_1)
    assert history_8.collect("steps") == list(range(20))


def test_a_smaller_last_batch_runs_on_its_own(monkeypatch):
    batches = make_batches(steps=5, batch_size=16)
    batches.append(make_batches(steps=1, batch_size=8, seed=1)[0])
    state_1, history_1, _ = ciclo.loop(make_state("jit"), batches, train_tasks())
    spy = Spy(monkeypatch)
    state_4, history_4, elapsed = ciclo.loop(
        make_state("jit", steps_per_call=4), batches, train_tasks()
    )
    assert spy.groups == [4]  # steps 0-3 fused; 4 alone (the next batch differs); 5 alone
    assert elapsed.samples == 5 * 16 + 8
    assert_trees_close(state_4.params, state_1.params)
    assert_same_history(history_4, history_1)


def test_a_stop_requested_before_the_fused_step_ends_the_loop_on_the_same_step():
    def stop_at_5(state, batch, elapsed, loop_state):
        if elapsed.steps == 5:
            loop_state.stop_iteration = True

    batches = make_batches(steps=20)
    results = []
    for k in (1, 8):
        tasks = {ciclo.every(1): [stop_at_5, regression_step]}
        state, history, elapsed = ciclo.loop(make_state("jit", steps_per_call=k), batches, tasks)
        results.append((int(state.step), elapsed.steps, len(history)))
    assert results[0] == results[1] == (6, 6, 6)


def test_fused_logs_reach_accumulated_logs_and_on_end():
    seen = {}

    def on_end(state, batch, elapsed, loop_state):
        seen["loss"] = float(loop_state.accumulated_logs.losses.loss)

    batches = make_batches(steps=8)
    _, history, _ = ciclo.loop(
        make_state("jit", steps_per_call=8),
        batches,
        {ciclo.every(1): regression_step},
        on_end=on_end,
    )
    assert seen["loss"] == pytest.approx(history.collect("loss")[-1])


def test_bound_step_fuses_too(monkeypatch):
    import dataclasses

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class State(ManagedState):
        train_step = regression_step

    state = State.create(
        params={"w": jnp.zeros(4), "b": jnp.zeros(())},
        tx=TX,
        seen=jnp.zeros((), jnp.int32),
        strategy=ciclo.managed.jit(steps_per_call=4),
    )
    spy = Spy(monkeypatch)
    state, _, _ = ciclo.loop(state, make_batches(steps=8), {ciclo.every(1): state.train_step})
    assert spy.groups == [4, 4]
    assert int(state.step) == 8


def test_many_runs_steps_in_one_call_and_checks_shapes():
    batches = make_batches(steps=3)
    state = make_state("jit")
    logs, fused = regression_step.many(state, batches)
    assert logs.losses.loss.shape == (3,)
    for batch in batches:
        _, state = regression_step(state, batch)
    assert_trees_close(fused.params, state.params)
    uneven = [batches[0], make_batches(steps=1, batch_size=8)[0]]
    with pytest.raises(ValueError, match=r"batch 1 has shapes .*same shapes"):
        regression_step.many(state, uneven)


@ciclo.managed.step
def regression_eval(state, batch):
    x, y = batch
    pred = x @ state.params["w"] + state.params["b"]
    return ciclo.logs().add_metric("mse", jnp.mean((pred - y) ** 2)), state


def run_train_loop(steps_per_call, batches, output):
    state = make_state("jit", steps_per_call=steps_per_call)
    return ciclo.train_loop(
        state,
        batches,
        {ciclo.on_train_step: regression_step, ciclo.on_test_step: regression_eval},
        callbacks=[ciclo.keras_bar(len(batches), file=output)],
        test_dataset=lambda: batches[:4],
        epoch_duration=7,
    )


def test_train_loop_fuses_steps_between_evaluations_with_a_progress_bar(monkeypatch):
    """A bar fires on every step but is an observer: it does not cut fused groups; the
    train_loop clock is a schedule, so evaluation still follows exactly each epoch."""
    import io

    batches = make_batches(steps=20)
    state_1, history_1, _ = run_train_loop(1, batches, io.StringIO())
    spy = Spy(monkeypatch)
    output = io.StringIO()
    state_8, history_8, _ = run_train_loop(8, batches, output)

    assert_trees_close(state_8.params, state_1.params)
    assert_same_history(history_8, history_1)
    assert history_8.collect("steps", "mse_test")[0] == [6, 13]
    # Each evaluation (not an observer) ends a group at its epoch's last step.
    assert spy.groups == [7, 7, 6]
    assert "20/20" in output.getvalue()


def test_an_unhashable_static_field_is_an_error_naming_it():
    import dataclasses

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Configured(ManagedState):
        layers: list = dataclasses.field(default_factory=list, metadata={"static": True})

    state = Configured.create(params={"w": jnp.zeros(2)}, tx=None, layers=[8, 8])
    with pytest.raises(TypeError, match=r"static field 'layers' holds an unhashable list"):
        jax.tree_util.tree_flatten(state)


def test_states_with_equal_static_fields_share_their_static_part():
    # A compiled step compares its arguments' static parts with those it was compiled for:
    # the same object compares without a Python call.
    tx = optax.sgd(0.1)
    a = ManagedState.create(params={"w": jnp.zeros(2)}, tx=tx)
    b = ManagedState.create(params={"w": jnp.ones(2)}, tx=tx)
    other = ManagedState.create(params={"w": jnp.ones(2)}, tx=optax.sgd(0.1))
    static = jax.tree_util.tree_structure(a).node_data()[1]
    assert jax.tree_util.tree_structure(b).node_data()[1] is static
    assert jax.tree_util.tree_structure(other).node_data()[1] is not static
