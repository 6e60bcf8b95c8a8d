"""keras_bar / tqdm_bar with running_mean=True: Keras' values (training entries averaged
over the epoch, evaluation and stateful entries as they are), read without a sync per step."""

from __future__ import annotations

import io

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import ciclo


@jax.jit
def train_step(state, batch):
    loss = jnp.mean(batch) + 0.5 * state  # differs at each step
    logs = ciclo.logs().add_loss("loss", loss).add_stateful_metric("seen", state)
    return logs, state + 1.0


@jax.jit
def eval_step(state, batch):
    return ciclo.logs().add_metric("accuracy", state / 100.0)


def batches(n, size=4):
    return [np.full((size, 2), float(i % 3), np.float32) for i in range(n)]


def line_values(line):
    """``{name: value}`` of a Keras line: ``... - loss: 1.5000 - seen: 3.0000``."""
    parts = [p.split(": ") for p in line.split(" - ") if ": " in p and not p.startswith("ETA")]
    return {name: float(value) for name, value in parts}


def every_line(**options):
    return ciclo.keras_bar(
        12, interval=0, plain_interval=0, dynamic=False, file=io.StringIO(), **options
    )


def run_train_loop(bar):
    _, history, _ = ciclo.train_loop(
        jnp.float32(0.0),
        batches(12),
        {ciclo.on_train_step: train_step, ciclo.on_test_step: eval_step},
        callbacks=[bar],
        test_dataset=lambda: batches(1),
        epoch_duration=4,
    )
    return history, bar.file.getvalue().splitlines()


def test_training_entries_show_the_mean_since_the_epoch_began():
    history, lines = run_train_loop(every_line(running_mean=True))
    losses = np.asarray(history.collect("loss"))
    # one line per step, plus one more at each epoch end (with the evaluation)
    per_step = {}
    for line in lines:
        per_step.setdefault(int(line.split("/")[0]), []).append(line_values(line))
    assert sorted(per_step) == list(range(1, 13))
    for count, shown in per_step.items():
        step = count - 1
        epoch_start = step - step % 4  # the mean starts again at each epoch's first step
        expected = np.mean(losses[epoch_start : step + 1])
        for values in shown:
            assert values["loss"] == pytest.approx(expected, abs=1e-4), (count, values)
            assert values["seen"] == pytest.approx(step)  # a stateful metric: as it is
    assert per_step[5][0]["loss"] == pytest.approx(losses[4], abs=1e-4)  # reset
    # the evaluation's value is shown as it is: the last one
    accuracy_test = history.collect("accuracy_test")
    assert per_step[8][-1]["accuracy_test"] == pytest.approx(accuracy_test[1], abs=1e-4)
    assert line_values(lines[-1])["accuracy_test"] == pytest.approx(accuracy_test[-1], abs=1e-4)
    assert line_values(lines[-1])["loss"] == pytest.approx(np.mean(losses[8:]), abs=1e-4)


def test_without_the_option_the_bar_shows_the_latest_values():
    history, lines = run_train_loop(every_line())
    losses = history.collect("loss")
    for line in lines:
        step = int(line.split("/")[0]) - 1
        assert line_values(line)["loss"] == pytest.approx(losses[step], abs=1e-4)
    assert every_line().running_mean is False
    assert not hasattr(every_line(), "on_epoch_begin")  # nothing more runs at an epoch start


def test_the_mean_is_weighted_by_samples():
    data = [*batches(5, size=4), np.full((1, 2), 7.0, np.float32)]  # a small last batch
    bar = ciclo.keras_bar(
        6, interval=1e9, plain_interval=1e9, file=io.StringIO(), running_mean=True
    )
    _, history, _ = ciclo.train_loop(
        jnp.float32(0.0), data, {ciclo.on_train_step: train_step}, callbacks=[bar]
    )
    expected = np.average(history.collect("loss"), weights=[4, 4, 4, 4, 4, 1])
    assert expected != pytest.approx(np.mean(history.collect("loss")), abs=1e-3)
    assert line_values(bar.file.getvalue().splitlines()[-1])["loss"] == pytest.approx(
        expected, abs=1e-4
    )


@pytest.mark.parametrize("steps_per_call", [1, 4])
def test_in_loop_the_mean_runs_over_the_loop_between_rare_redraws(steps_per_call):
    """Two lines only (the first and the last): every step in between is counted, from the
    history, fused steps included."""
    tx = optax.sgd(0.1)

    @ciclo.managed.train_step
    def step(state, batch):
        loss = jnp.mean((batch @ state.params["w"] - 1.0) ** 2)
        return ciclo.logs().add_loss("loss", loss).add_metric("w", state.params["w"][0]), state

    state = ciclo.managed.ManagedState.create(params={"w": jnp.zeros(2)}, tx=tx)
    state = state.with_strategy("jit", steps_per_call=steps_per_call)
    out = io.StringIO()
    bar = ciclo.keras_bar(20, interval=1e9, plain_interval=1e9, file=out, running_mean=True)
    _, history, _ = ciclo.loop(state, batches(20), {ciclo.every(1): step, **bar})
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    final = line_values(lines[-1])
    assert final["loss"] == pytest.approx(np.mean(history.collect("loss")), abs=1e-4)
    assert final["w"] == pytest.approx(np.mean(history.collect("w")), abs=1e-4)
    assert final["w"] != pytest.approx(history.collect("w")[-1], abs=1e-3)  # not the last


def test_an_evaluation_after_the_bar_in_loop_shows_its_last_value():
    evaluate = ciclo.inner_loop(
        "test", lambda state: ciclo.test_loop(state, batches(2), {ciclo.on_test_step: eval_step})
    )
    bar = every_line(running_mean=True)
    _, history, _ = ciclo.loop(
        jnp.float32(0.0),
        batches(12),
        {ciclo.every(1): train_step, **bar, ciclo.every(4): evaluate},
    )
    final = line_values(bar.file.getvalue().splitlines()[-1])
    assert final["accuracy_test"] == pytest.approx(history.collect("accuracy_test")[-1])
    assert final["loss"] == pytest.approx(np.mean(history.collect("loss")), abs=1e-4)


def test_a_second_loop_on_the_same_history_starts_its_own_mean():
    history = ciclo.history()
    ciclo.loop(jnp.float32(10.0), batches(5), {ciclo.every(1): train_step}, history=history)
    bar = every_line(running_mean=True)
    ciclo.loop(jnp.float32(0.0), batches(12), {ciclo.every(1): train_step, **bar}, history=history)
    final = line_values(bar.file.getvalue().splitlines()[-1])
    assert final["loss"] == pytest.approx(np.mean(history.collect("loss")[5:]), abs=1e-4)


def test_tqdm_bar_shows_the_running_mean():
    out = io.StringIO()
    _, history, _ = ciclo.train_loop(
        jnp.float32(0.0),
        batches(12),
        {ciclo.on_train_step: train_step},
        callbacks=[ciclo.tqdm_bar(12, file=out, ncols=200, running_mean=True)],
        epoch_duration=6,
    )
    expected = np.mean(history.collect("loss")[6:])
    assert f"loss={expected:.4f}" in out.getvalue().split("\r")[-1]


def test_by_hand_calls_keep_their_values_for_the_mean():
    out = io.StringIO()
    bar = ciclo.keras_bar(6, interval=1e9, plain_interval=1e9, file=out, running_mean=True)
    values = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0]
    for elapsed, value in zip(ciclo.elapse(range(6)), values, strict=True):
        bar(elapsed[0], ciclo.logs().add_loss("loss", jnp.float32(value)))
    assert line_values(out.getvalue().splitlines()[-1])["loss"] == pytest.approx(np.mean(values))
    attributes = set(vars(bar))
    bar(ciclo.Elapsed.create(steps=6), ciclo.logs().add_loss("loss", jnp.float32(1.0)))
    assert set(vars(bar)) == attributes  # ciclo keeps its by-hand loop elsewhere


def test_no_fetch_per_step(count_fetches):
    history = ciclo.history(fetch_interval=1e9)  # the history fetches only when read
    bar = ciclo.keras_bar(
        60, interval=1e9, plain_interval=1e9, file=io.StringIO(), running_mean=True
    )
    ciclo.loop(jnp.float32(0.0), batches(60), {ciclo.every(1): train_step, **bar}, history=history)
    assert len(count_fetches) <= 4  # the first line and the final one (bar and history), not 60


@pytest.mark.parametrize("make", [ciclo.keras_bar, ciclo.tqdm_bar])
def test_a_bad_running_mean_is_a_clear_error(make):
    with pytest.raises(TypeError, match=r"running_mean must be True or False, got 'yes'"):
        make(10, running_mean="yes")


def test_fused_steps_in_train_loop_start_the_mean_at_each_epoch():
    tx = optax.sgd(0.1)

    @ciclo.managed.train_step
    def step(state, batch):
        loss = jnp.mean((batch @ state.params["w"] - 1.0) ** 2)
        return ciclo.logs().add_loss("loss", loss), state

    state = ciclo.managed.ManagedState.create(params={"w": jnp.zeros(2)}, tx=tx)
    state = state.with_strategy("jit", steps_per_call=4)
    out = io.StringIO()
    bar = ciclo.keras_bar(18, interval=1e9, plain_interval=1e9, file=out, running_mean=True)
    _, history, _ = ciclo.train_loop(
        state, batches(18), {ciclo.on_train_step: step}, callbacks=[bar], epoch_duration=6
    )
    losses = np.asarray(history.collect("loss"))
    lines = {int(line.split("/")[0]): line_values(line) for line in out.getvalue().splitlines()}
    for count in (6, 12, 18):  # each epoch's end, then the final line
        expected = np.mean(losses[count - 6 : count])
        assert lines[count]["loss"] == pytest.approx(expected, abs=1e-4), count
