"""train_loop(epochs=N), test_every= / test_duration=, the warning of a dataset that ends
before stop, and the Keras habits named at once (issue 27, items 1, 2 and 6)."""

from __future__ import annotations

import io
import itertools

import jax
import numpy as np
import pytest

import ciclo

BATCHES = [np.full((2, 1), float(i), np.float32) for i in range(4)]


@jax.jit
def train_step(state, batch):
    logs = ciclo.logs().add_loss("loss", state.sum())
    return logs, state * 0.5 + batch.mean()


@jax.jit
def eval_step(state, batch):
    return ciclo.logs().add_metric("score", (state * batch.mean()).sum())


TASKS = {ciclo.on_train_step: train_step, ciclo.on_test_step: eval_step}
STATE = np.zeros(1, np.float32)


def run(data, **options):
    return ciclo.train_loop(STATE, data, TASKS, test_dataset=lambda: BATCHES[:1], **options)


def by_hand(epochs):
    """The same training, written out: ``epochs`` passes over BATCHES."""
    state, losses = STATE, []
    for batch in BATCHES * epochs:
        logs, state = train_step(state, batch)
        losses.append(float(logs.losses.loss))
    return state, losses


# --- epochs ----------------------------------------------------------------------------------
def test_epochs_over_a_list_make_n_passes_and_evaluate_at_each_end():
    state, history, elapsed = run(BATCHES, epochs=3)
    expected_state, expected_losses = by_hand(3)
    assert elapsed.steps == 12
    np.testing.assert_allclose(state, expected_state)
    assert history.collect("loss") == pytest.approx(expected_losses)
    assert history.collect("steps", "score_test")[0] == [3, 7, 11]


def test_epochs_over_a_factory_call_it_once_per_epoch():
    calls = []

    def make():
        calls.append(len(calls))
        return list(BATCHES)

    _, history, elapsed = run(make, epochs=3)
    assert calls == [0, 1, 2]
    assert elapsed.steps == 12
    assert history.collect("steps", "score_test")[0] == [3, 7, 11]


def test_epochs_of_unknown_length_end_where_each_pass_ends():
    def make():  # a generator: no len(), the end of each pass tells
        yield from BATCHES[:3]

    _, history, elapsed = run(make, epochs=2)
    assert elapsed.steps == 6
    assert history.collect("steps", "score_test")[0] == [2, 5]
    epochs = []
    ciclo.train_loop(
        STATE,
        make,
        {
            **TASKS,
            ciclo.on_epoch_begin: lambda s, b, elapsed: epochs.append(("begin", elapsed.steps)),
            ciclo.on_epoch_end: lambda s, b, elapsed: epochs.append(("end", elapsed.steps)),
        },
        epochs=2,
    )
    assert epochs == [("begin", 0), ("end", 2), ("begin", 3), ("end", 5)]


def test_epochs_with_a_known_length_give_the_loop_its_planned_total_as_stop(tmp_path):
    ckpt = ciclo.checkpoint(tmp_path, async_save=False)
    _, _, elapsed = run(BATCHES, epochs=2, callbacks=[ckpt])
    assert elapsed.steps == 8
    # The run ended by reaching its stop (2 x 4 steps), not by running out of data.
    assert _ending(tmp_path)["reason"] == "stop"


def test_a_bar_without_a_total_reads_the_planned_total_of_the_epochs():
    for data in (BATCHES, lambda: list(BATCHES)):  # a list; a factory of a dataset with len
        bar = ciclo.keras_bar(file=io.StringIO())
        run(data, epochs=3, callbacks=[bar])
        assert bar.total == 12


def test_one_epoch_over_a_generator_is_one_pass():
    _, history, elapsed = run((b for b in BATCHES), epochs=1)
    assert elapsed.steps == 4
    assert history.collect("steps", "score_test")[0] == [3]


def crash_once_at(step):
    """A callback that raises at ``step``, once (a run killed there)."""
    crashed = []

    def crash(state, batch, elapsed):
        if elapsed.steps == step and not crashed:
            crashed.append(step)
            raise RuntimeError("killed")

    return crash


def test_exact_resume_in_the_middle_of_an_epoch(tmp_path):
    """A run killed mid-epoch (an error at step 6 of 3 x 4) and resumed equals one run."""
    reference, reference_history, _ = run(BATCHES, epochs=3)

    for data in (BATCHES, lambda: iter(BATCHES)):  # by index, and by replay
        directory = tmp_path / ("list" if isinstance(data, list) else "factory")

        crash = crash_once_at(6)
        ckpt = ciclo.checkpoint(directory, async_save=False, save_on_end=False)
        tasks = {**TASKS, ciclo.every(5): ckpt, ciclo.every(1): crash}
        with pytest.raises(RuntimeError, match="killed"):
            ciclo.train_loop(STATE, data, tasks, test_dataset=lambda: BATCHES[:1], epochs=3)
        assert ckpt.all_steps() == [1, 6]  # the last one mid-epoch 2
        state, history, elapsed = ciclo.train_loop(
            STATE, data, tasks, test_dataset=lambda: BATCHES[:1], epochs=3, resume=ckpt
        )
        assert elapsed.steps == 12
        np.testing.assert_array_equal(state, reference)
        assert history.collect("steps", "loss") == reference_history.collect("steps", "loss")
        assert history.collect("steps", "score_test") == reference_history.collect(
            "steps", "score_test"
        )


# --- test_every and test_duration ----------------------------------------------------------
def endless():
    """An endless dataset, as the original ciclo's tests used: only a duration ends it."""
    return itertools.repeat(BATCHES[1])


def test_the_original_ciclo_scenario_ends_and_evaluates_two_steps_each_time():
    # The original ciclo's test_create_flax_state: train_loop(..., test_dataset=endless,
    # epoch_duration=3, test_duration=2, stop=12).
    evaluated = []

    def count(state, batch, elapsed):
        evaluated.append(elapsed.steps)

    _, history, elapsed = ciclo.train_loop(
        STATE,
        endless(),
        {**TASKS, ciclo.on_test_end: count},
        test_dataset=endless,
        epoch_duration=3,
        test_duration=2,
        stop=12,
    )
    assert elapsed.steps == 12
    assert history.collect("steps", "score_test")[0] == [2, 5, 8, 11]
    assert evaluated == [2, 2, 2, 2]  # each evaluation ran 2 steps of the endless set


class Endless:
    """An endless re-iterable dataset (a ``tf.data`` ``repeat()`` as the original used)."""

    def __iter__(self):
        return itertools.repeat(BATCHES[2])


def test_an_endless_reiterable_test_dataset_with_test_duration_ends():
    evaluated = []
    _, history, elapsed = ciclo.train_loop(
        STATE,
        Endless(),
        {**TASKS, ciclo.on_test_end: lambda s, b, elapsed: evaluated.append(elapsed.steps)},
        test_dataset=Endless(),
        epoch_duration=3,
        test_duration=2,
        stop=12,
    )
    assert elapsed.steps == 12
    assert history.collect("steps", "score_test")[0] == [2, 5, 8, 11]
    assert evaluated == [2, 2, 2, 2]


def test_test_duration_per_set_and_in_samples():
    evaluated = []
    _, history, _ = ciclo.train_loop(
        STATE,
        BATCHES,
        {**TASKS, ciclo.on_test_end: lambda s, b, elapsed: evaluated.append(elapsed.steps)},
        test_dataset={"valid": endless, "test": lambda: BATCHES},
        test_every=2,
        test_duration={"valid": ciclo.at(samples=6)},  # 3 batches of 2; "test": all of it
    )
    assert history.collect("steps", "score_valid")[0] == [1, 3]
    assert evaluated == [3, 4, 3, 4]


def test_test_duration_longer_than_the_set_evaluates_all_of_it_without_a_warning():
    _, history, _ = run(BATCHES, epoch_duration=2, test_duration=100)
    assert history.collect("steps", "score_test")[0] == [1, 3]


# --- a dataset that ends before stop --------------------------------------------------------
def test_loop_warns_once_when_the_dataset_ends_before_stop():
    tasks = {ciclo.every(1): train_step}
    with pytest.warns(RuntimeWarning, match=r"dataset ended after 4 batches.*before stop=10") as w:
        _, _, elapsed = ciclo.loop(STATE, BATCHES, tasks, stop=10)
    assert elapsed.steps == 4
    assert len(w) == 1
    with pytest.warns(RuntimeWarning, match=r"after 4 batches.*stop=ciclo.at\(samples=100\)"):
        ciclo.loop(STATE, BATCHES, tasks, stop=ciclo.at(samples=100))


def test_train_loop_warns_when_the_dataset_ends_before_stop():
    with pytest.warns(RuntimeWarning, match=r"dataset ended after 4 batches \(step 4\).*stop=8"):
        run(BATCHES, epoch_duration=2, stop=8)


def test_no_warning_when_stop_is_reached_or_absent():
    ciclo.loop(STATE, BATCHES, {ciclo.every(1): train_step}, stop=4)
    ciclo.loop(STATE, BATCHES, {ciclo.every(1): train_step})
    run(BATCHES, epochs=2)


def _ending(directory):
    import orbax.checkpoint as ocp

    manager = ocp.CheckpointManager(str(directory))
    step = max(manager.all_steps())
    meta = manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
    manager.close()
    return meta["meta"]["end"]
