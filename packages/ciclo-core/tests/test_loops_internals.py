"""The predefined loops' parts: the one list of moments, the epoch clock (not dependent on
the order its schedules are asked in), and chunked aggregation (same results as one step
at a time)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import ciclo
from ciclo._loops._clock import EpochClock
from ciclo._loops._named import NAMED_SCHEDULES, moments, owner
from ciclo._records._aggregate import Aggregator


def test_every_moment_is_public_and_each_loop_runs_its_own_in_order():
    for name, schedule in NAMED_SCHEDULES.items():
        assert getattr(ciclo, name) is schedule
    assert moments("train") == (
        "on_train_begin",
        "on_reset_step",
        "on_epoch_begin",
        "on_train_batch_begin",
        "on_train_step",
        "on_train_batch_end",
        "on_epoch_end",
        "on_train_end",
    )
    assert moments("test")[:2] == ("on_reset_step", "on_test_begin")
    both = moments("train", "test")
    assert both.index("on_test_end") < both.index("on_epoch_end")
    assert owner("on_predict_step") == "predict_loop"
    with pytest.raises(ValueError, match=r"on_predict_step.*belongs to predict_loop"):
        ciclo.test_loop(None, [np.ones(2)], {ciclo.on_predict_step: lambda: None})


def _decisions(order, epoch=("samples", 5), tests=None):
    """Asks the clock's schedules in ``order`` at each step of a 9-batch run."""
    tests = tests if tests is not None else {"test": None, "valid": ("steps", 2)}
    clock = EpochClock(epoch, tests)
    loop_state = ciclo.LoopState(None, ciclo.history(), ciclo.Elapsed.create())
    clock.attach(loop_state)
    schedules = {
        "clock": clock.schedule,
        "begins": clock.begins(),
        "ends": clock.ends(),
        **{name: clock.test_due(name) for name in tests},
    }
    rows = []
    for elapsed, batch in ciclo.elapse([np.zeros(2)] * 9):
        loop_state.elapsed, loop_state.batch = elapsed, batch
        row = {name: schedules[name](elapsed) for name in order}
        rows.append({name: row[name] for name in sorted(row)})
    return rows


def test_epoch_clock_decides_once_per_step_whatever_schedule_is_asked_first():
    usual = _decisions(["clock", "begins", "valid", "test", "ends"])
    assert _decisions(["ends", "test", "valid", "begins", "clock"]) == usual
    assert _decisions(["valid", "clock", "ends", "begins", "test"]) == usual
    # Epochs of 5 samples with batches of 2: ends after the steps reaching 6, 10, 16.
    assert [i for i, row in enumerate(usual) if row["ends"]] == [2, 4, 7]
    assert [i for i, row in enumerate(usual) if row["begins"]] == [0, 3, 5, 8]
    assert [i for i, row in enumerate(usual) if row["valid"]] == [1, 3, 5, 7]
    assert [row["test"] for row in usual] == [row["ends"] for row in usual]
    assert not any(row["clock"] for row in usual)


def test_epoch_clock_state_resumes_where_it_was():
    clock = EpochClock(("steps", 3), {"test": None})
    clock.restore(first=False, ended=True)
    loop_state = ciclo.LoopState(None, ciclo.history(), ciclo.Elapsed.create(steps=3))
    clock.attach(loop_state)
    begins = clock.begins()
    loop_state.batch = np.zeros(1)
    assert begins(loop_state.elapsed)
    assert clock.schedule.state_dict()["first"] is False


def _aggregate(agg, steps):
    for logs, weight in steps:
        agg.add(logs, weight)
    return agg.result()


@pytest.mark.parametrize("count", [1, 2, 15, 16, 17, 40])
def test_chunked_aggregation_matches_one_step_at_a_time(count):
    rng = np.random.default_rng(count)
    values = rng.normal(size=count).astype(np.float32)
    weights = [int(w) for w in rng.integers(1, 9, size=count)]
    steps = [
        (
            ciclo.logs()
            .add_metric("m", jnp.float32(v))
            .add_loss("l", jnp.float32(v))
            .add_stateful_metric("s", jnp.float32(-v)),
            w,
        )
        for v, w in zip(values, weights, strict=True)
    ]
    spec = {"metrics": "mean", "losses": "sum", "stateful_metrics": "max"}
    out = _aggregate(Aggregator(spec), steps)
    mean = np.average(values, weights=weights)
    assert float(out.metrics.m) == pytest.approx(mean, rel=1e-5, abs=1e-6)
    assert float(out.losses.l) == pytest.approx(values.sum(), rel=1e-5, abs=1e-5)
    assert float(out.stateful_metrics.s) == pytest.approx((-values).max())
    assert out.metrics.m.dtype == jnp.float32
    # Float weights take the path of one compiled call per step (same values here).
    one_by_one = _aggregate(Aggregator(spec), [(logs, float(w)) for logs, w in steps])
    for collection, name in (("metrics", "m"), ("losses", "l"), ("stateful_metrics", "s")):
        assert float(out[collection][name]) == pytest.approx(
            float(one_by_one[collection][name]), rel=1e-6, abs=1e-7
        )


def test_chunked_aggregation_with_changing_entries_and_float_weights():
    steps = []
    for i in range(40):
        logs = ciclo.logs().add_metric("a", jnp.float32(i))
        if i % 7 == 3:
            logs.add_metric("b", jnp.float32(2 * i))
        steps.append((logs, 0.5 if i == 20 else 1))
    out = _aggregate(Aggregator({"metrics": "mean"}), steps)
    expected_a = np.average(np.arange(40.0), weights=[0.5 if i == 20 else 1 for i in range(40)])
    assert float(out.metrics.a) == pytest.approx(expected_a)
    assert float(out.metrics.b) == pytest.approx(np.mean([2 * i for i in range(40) if i % 7 == 3]))
