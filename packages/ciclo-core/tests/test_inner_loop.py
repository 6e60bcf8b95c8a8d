"""inner_loop: aggregations over an inner loop's history, renaming, errors."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import ciclo
from ciclo._records._aggregate import Aggregator

# batches of 1, 3 and 2 samples whose step logs 'm' = 1, 2, 4 and 's' = 10, 20, 30
BATCHES = [np.zeros(1), np.zeros(3), np.zeros(2)]
M = [1.0, 2.0, 4.0]


def inner(state):
    def step(state, batch, elapsed):
        logs = ciclo.logs().add_metric("m", M[elapsed.steps])
        logs.add_stateful_metric("s", 10 * (elapsed.steps + 1))
        return logs, state + 1

    return ciclo.loop(state, BATCHES, {ciclo.every(1): step})


@pytest.mark.parametrize(
    ("aggregation", "expected"),
    [
        ("last", 4.0),
        ("first", 1.0),
        ("mean", (1 * 1 + 2 * 3 + 4 * 2) / 6),  # weighted by samples
        ("sum", 7.0),
        ("min", 1.0),
        ("max", 4.0),
        (lambda values: float(np.median(values)), 2.0),
    ],
)
def test_aggregations(aggregation, expected):
    logs, state = ciclo.inner_loop("probe", inner, aggregation)(0)
    assert logs.metrics.m_probe == pytest.approx(expected)
    assert state is None  # the outer state is left alone


def test_aggregation_per_collection_and_output_state():
    run = ciclo.inner_loop(
        "probe", inner, {"metrics": "mean", "stateful_metrics": None}, output_state=True
    )
    logs, state = run(0)
    assert set(logs) == {"metrics"}
    assert state == 3


def test_inner_loop_in_an_outer_loop_logs_renamed_entries():
    def train(state, batch):
        return ciclo.logs().add_loss("loss", float(state)), state + 1

    _, history, _ = ciclo.loop(
        0,
        [np.zeros(1)] * 4,
        {ciclo.every(1): train, ciclo.every(2): ciclo.inner_loop("probe", inner, "max")},
    )
    assert history.collect("steps", "loss", "m_probe") == ([0, 2], [0.0, 2.0], [4.0, 4.0])


def test_logs_from_test_loop_pass_through():
    def evaluate(state):
        return ciclo.test_loop(
            state, BATCHES, {ciclo.on_test_step: lambda: ciclo.logs().add_metric("one", 1.0)}
        )

    logs, _ = ciclo.inner_loop("valid", evaluate)(0)
    assert float(logs.metrics.one_valid) == 1.0


def test_device_aggregator_matches_host_aggregation():
    agg = Aggregator({"metrics": "mean", "losses": "sum", "stateful_metrics": "max"})
    for w, v in zip([1, 3, 2], M, strict=True):
        logs = ciclo.logs().add_metric("m", jnp.float32(v)).add_loss("l", jnp.float32(v))
        agg.add(logs.add_stateful_metric("s", jnp.float32(-v)), weight=w)
    out = agg.result()
    assert float(out.metrics.m) == pytest.approx(15 / 6)
    assert float(out.losses.l) == 7.0
    assert float(out.stateful_metrics.s) == -1.0


def test_bad_aggregations_and_results_are_clear_errors():
    with pytest.raises(ValueError, match=r"unknown aggregation 'average'.*'mean'"):
        ciclo.inner_loop("x", inner, "average")
    with pytest.raises(ValueError, match=r"unknown aggregation 'avg' for collection 'metrics'"):
        ciclo.inner_loop("x", inner, {"metrics": "avg"})
    with pytest.raises(TypeError, match=r"inner_loop\('x'\): the loop function returned int"):
        ciclo.inner_loop("x", lambda state: 3)(0)
    with pytest.raises(TypeError, match=r"inner_loop name must be a non-empty string"):
        ciclo.inner_loop("", inner)

    def text_loop(state):
        step = lambda: ciclo.logs().add_entry("notes", "text", "hello")  # noqa: E731
        return ciclo.loop(state, BATCHES, {ciclo.every(1): step})

    with pytest.raises(TypeError, match=r"cannot aggregate log entry notes.text with 'mean'"):
        ciclo.inner_loop("x", text_loop, "mean")(0)
    with pytest.raises(TypeError, match=r"cannot aggregate log entry notes.text with 'mean'"):
        Aggregator({"notes": "mean"}).add(ciclo.logs().add_entry("notes", "text", "hi"))
