"""train_loop with several evaluation sets: ``test_dataset={"valid": ..., "test": ...}``."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import ciclo


@jax.jit
def train_step(state, batch):
    return ciclo.logs().add_loss("loss", (batch * state).mean()), state * 0.5


@jax.jit
def eval_step(state, batch):
    return ciclo.logs().add_metric("score", (batch * state).mean())


STEPS = {ciclo.on_train_step: train_step, ciclo.on_test_step: eval_step}
SETS = {
    # A small last batch: the score must be sample-weighted, as test_loop does.
    "valid": lambda: [np.ones((4, 1)), 3 * np.ones((2, 1))],
    "test": lambda: [2 * np.ones((3, 1))],
}


def direct(state, name):
    _, logs, _ = ciclo.test_loop(state, SETS[name](), {ciclo.on_test_step: eval_step})
    return float(logs.metrics.score)


def test_two_evaluation_sets_are_separate_columns_equal_to_direct_evaluations():
    _, history, _ = ciclo.train_loop(
        1.0, [np.ones((2, 1))] * 6, STEPS, test_dataset=SETS, epoch_duration=3
    )
    steps, valid, test = history.collect("steps", "score_valid", "score_test")
    assert steps == [2, 5]
    states = [0.5**3, 0.5**6]  # the state after each epoch's 3 steps
    assert valid == [pytest.approx(direct(s, "valid")) for s in states]
    assert test == [pytest.approx(direct(s, "test")) for s in states]
    assert valid[0] == pytest.approx(0.125 * (4 + 6) / 6)  # sample-weighted
    assert history.collect("loss") == [pytest.approx(0.5**k) for k in range(6)]


def test_re_iterable_datasets_are_evaluated_anew_like_factories():
    """Lists (and other re-iterables) stand for factories: each evaluation iterates them
    from the start, so no set is used up and no lambda is late-bound."""
    data = {name: make() for name, make in SETS.items()}
    _, history, _ = ciclo.train_loop(
        1.0, [np.ones((2, 1))] * 6, STEPS, test_dataset=data, epoch_duration=3
    )
    _, expected, _ = ciclo.train_loop(
        1.0, [np.ones((2, 1))] * 6, STEPS, test_dataset=SETS, epoch_duration=3
    )
    for key in ("score_valid", "score_test"):
        assert history.collect(key) == expected.collect(key)
        assert len(history.collect(key)) == 2
    _, single, _ = ciclo.train_loop(
        1.0, [np.ones((2, 1))] * 6, STEPS, test_dataset=data["test"], epoch_duration=3
    )
    assert single.collect("score_test") == expected.collect("score_test")


def test_each_set_can_be_evaluated_on_its_own_period():
    _, history, _ = ciclo.train_loop(
        1.0,
        [np.ones((2, 1))] * 8,
        STEPS,
        test_dataset=SETS,
        epoch_duration=4,
        test_every={"valid": 2},
    )
    assert history.collect("steps", "score_valid")[0] == [1, 3, 5, 7]
    assert history.collect("steps", "score_test")[0] == [3, 7]  # at epoch ends


def test_one_period_applies_to_every_set_and_no_epoch_evaluates_at_the_end():
    _, history, _ = ciclo.train_loop(
        1.0, [np.ones((2, 1))] * 4, STEPS, test_dataset=SETS, test_every=2
    )
    assert history.collect("steps", "score_valid")[0] == [1, 3]
    assert history.collect("steps", "score_test")[0] == [1, 3]
    _, history, _ = ciclo.train_loop(1.0, [np.ones((2, 1))] * 4, STEPS, test_dataset=SETS)
    assert history.collect("steps", "score_valid", "score_test")[0] == [4]


def test_test_callbacks_run_for_every_set_and_epoch_end_sees_both():
    seen = {"begin": 0, "epoch_end": []}

    def on_test_begin():
        seen["begin"] += 1

    def on_epoch_end(state, batch, elapsed, loop_state):
        seen["epoch_end"].append(sorted(loop_state.logs.metrics))

    ciclo.train_loop(
        1.0,
        [np.ones((2, 1))] * 2,
        {**STEPS, ciclo.on_test_begin: on_test_begin, ciclo.on_epoch_end: on_epoch_end},
        test_dataset=SETS,
        epoch_duration=2,
    )
    assert seen == {"begin": 2, "epoch_end": [["score_test", "score_valid"]]}


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        (
            {"test_dataset": {"valid": iter([np.ones(1)])}},
            TypeError,
            r"test_dataset\['valid'\] is an iterator \(list_iterator\).*zero-argument function",
        ),
        (
            {"test_dataset": SETS, "test_every": {"tets": 2}},
            ValueError,
            r"test_every names \['tets'\].*evaluation sets are \['valid', 'test'\]",
        ),
        (
            {"test_dataset": SETS, "test_name": "eval"},
            TypeError,
            r"test_name='eval' names a single test_dataset.*'valid', 'test'",
        ),
        ({"test_dataset": {}}, ValueError, r"test_dataset is an empty dict"),
        (
            {"test_dataset": SETS, "test_every": {"valid": 0}},
            ValueError,
            r"test_every for 'valid' must be a positive amount",
        ),
    ],
)
def test_bad_evaluation_sets_are_clear_errors(options, error, match):
    with pytest.raises(error, match=match):
        ciclo.train_loop(1.0, [np.ones((2, 1))], STEPS, **options)
