"""History: columnar, exact, fetched from device lazily and in batches."""

from __future__ import annotations

import copy
import pickle

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ciclo
import ciclo._records._host


def at_step(i: int, batch_size: int = 2) -> ciclo.Elapsed:
    return ciclo.Elapsed(steps=i, samples=batch_size * i, time=0.25 * i, date=100.0 + i)


@pytest.fixture
def to_host_calls(monkeypatch):
    """Counts the device->host transfers: a column's backlog sent as one stack, or a tree
    of values fetched."""
    calls = []
    host = ciclo._records._host
    real_send, real_to_host = host.send_stacked, host.to_host

    def sending(values):
        chunks = real_send(values)
        if chunks is not None:
            calls.append(values)
        return chunks

    def fetching(tree):
        if jax.tree_util.tree_leaves(tree):
            calls.append(tree)
        return real_to_host(tree)

    monkeypatch.setattr(host, "send_stacked", sending)
    monkeypatch.setattr(host, "to_host", fetching)
    return calls


def test_float32_device_scalars_round_trip_exactly():
    values = np.random.default_rng(0).normal(size=50).astype(np.float32)
    values[:3] = [0.1, 1 / 3, np.float32(np.pi)]  # not representable in float32
    history = ciclo.history()
    for i, value in enumerate(values):
        history.commit(at_step(i), ciclo.logs().add_metric("x", jnp.asarray(value)))

    collected = history.collect("x")
    assert collected == [float(v) for v in values]
    assert all(type(v) is float for v in collected)
    assert np.array_equal(np.asarray(collected, np.float32), values)
    assert collected.dtype == np.float32  # as logged, though kept as Python floats


def test_elapsed_fields_and_types():
    history = ciclo.history()
    for i in range(3):
        history.commit(at_step(i), ciclo.logs().add_metric("n", jnp.int32(i)))
    steps, samples, time, date, n = history.collect("steps", "samples", "time", "date", "n")
    assert steps == [0, 1, 2]
    assert samples == [0, 2, 4]
    assert time == [0.0, 0.25, 0.5]
    assert date == [100.0, 101.0, 102.0]
    assert n == [0, 1, 2]
    assert all(type(v) is int for v in n)
    assert history.collect("elapsed.steps") == steps
    assert (steps.dtype, time.dtype, n.dtype) == (np.int64, np.float64, np.int32)


@pytest.mark.parametrize(
    ("first", "then", "dtype"),
    [
        (jnp.float32(1), jnp.float32(2), np.float32),
        (jnp.float32(1), 2.0, np.float64),  # a Python float widens the column
        (jnp.int32(1), jnp.float32(2), np.float64),
        (jnp.int32(1), 2, np.int64),
        ("a", "b", object),
    ],
)
def test_collect_says_the_dtype_values_were_logged_in(first, then, dtype):
    history = ciclo.history()
    history.commit(at_step(0), {"metrics": {"m": first}})
    history.fetch()  # stored, then the second value joins the column
    history.commit(at_step(1), {"metrics": {"m": then}})
    collected = history.collect("m")
    assert collected == [np.asarray(first).item(), np.asarray(then).item()]
    assert collected.dtype == dtype
    restored = ciclo.history()
    restored.load_state_dict(history.state_dict())
    assert (restored.collect("m"), restored.collect("m").dtype) == (collected, dtype)


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_collected_values_keep_their_dtype_through_pickle_and_copy(protocol):
    history = ciclo.history()
    history.commit(at_step(0), ciclo.logs().add_loss("loss", jnp.float32(0.5)))
    collected = history.collect("loss")
    for copied in (pickle.loads(pickle.dumps(collected, protocol)), copy.deepcopy(collected)):
        assert (copied, copied.dtype) == ([0.5], np.float32)


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_copied_history_grows_apart_from_the_original(how):
    import copy
    import pickle

    history = ciclo.history()
    elapsed = ciclo.Elapsed.create()
    history.commit(elapsed, ciclo.logs().add_metric("m", jnp.float32(1.0)))
    copied = copy.deepcopy(history) if how == "deepcopy" else pickle.loads(pickle.dumps(history))
    copied.commit(elapsed.update(batch_size=2), ciclo.logs().add_metric("m", 2.0))
    history.commit(elapsed.update(batch_size=3), ciclo.logs().add_metric("m", 3.0))
    assert copied.collect("samples", "m") == ([0, 2], [1.0, 2.0])
    assert history.collect("samples", "m") == ([0, 3], [1.0, 3.0])


@pytest.mark.parametrize("kind", ["no logs", "host values", "device values"])
def test_the_rows_a_commit_keeps_join_the_elapsed_columns_every_256_rows(kind):
    history, elapsed = ciclo.history(), ciclo.Elapsed.create()
    for i in range(1000):
        value = float(i) if kind == "host values" else jnp.float32(i)
        history.commit(elapsed, None if kind == "no logs" else ciclo.logs().add_metric("m", value))
        elapsed = elapsed.update(batch_size=2)
        assert len(history._rows) <= 256  # a long run holds no more Elapsed objects than that
    assert history.collect("steps") == list(range(1000))
    assert history.collect("samples") == list(range(0, 2000, 2))
    assert history[-1]["elapsed"]["steps"] == 999


@pytest.mark.parametrize("big", [2**63, np.uint64(2**64 - 1)])
def test_integers_past_int64_are_kept_exact(big):
    history = ciclo.history()
    elapsed = ciclo.Elapsed.create()
    history.commit(elapsed, ciclo.logs().add_metric("n", big))
    history.commit(elapsed, ciclo.logs().add_metric("n", 5))
    history.commit(elapsed, ciclo.logs().add_metric("n", 0.5))
    assert history.collect("n") == [int(big), 5, 0.5]


def test_sparse_columns_collect_on_rows_where_all_keys_exist():
    history = ciclo.history()
    for i in range(10):
        logs = ciclo.logs().add_loss("loss", jnp.float32(i / 2))
        if i % 3 == 0:
            logs.add_metric("accuracy", jnp.float32(i / 10))
        history.commit(at_step(i), logs)

    assert history.collect("steps", "loss") == (list(range(10)), [i / 2 for i in range(10)])
    steps, loss, accuracy = history.collect("steps", "loss", "accuracy")
    assert steps == [0, 3, 6, 9]
    assert loss == [0.0, 1.5, 3.0, 4.5]
    assert accuracy == [float(np.float32(i / 10)) for i in steps]
    assert history.collect("accuracy") == accuracy


def test_columns_starting_late_and_with_gaps():
    history = ciclo.history()
    history.commit(at_step(0), ciclo.logs().add_metric("a", 0))
    history.commit(at_step(1), ciclo.logs().add_metric("a", 1).add_metric("b", 10))
    history.commit(at_step(2), ciclo.logs().add_metric("b", 20))
    history.commit(at_step(3), ciclo.logs().add_metric("a", 3).add_metric("b", 30))
    assert history.collect("steps", "b") == ([1, 2, 3], [10, 20, 30])
    assert history.collect("a", "b") == ([1, 3], [10, 30])
    assert history.collect("steps", "a") == ([0, 1, 3], [0, 1, 3])


def test_mixed_and_non_scalar_values():
    history = ciclo.history()
    history.commit(at_step(0), ciclo.logs().add_metric("m", 1).add_output("y", jnp.arange(2)))
    history.commit(at_step(1), ciclo.logs().add_metric("m", 2.5).add_output("y", jnp.arange(3)))
    history.commit(at_step(2), {"metrics": {"m": True}, "text": {"note": "hi"}})
    assert history.collect("m") == [1, 2.5, True]
    ys = history.collect("y")
    assert [y.tolist() for y in ys] == [[0, 1], [0, 1, 2]]
    assert all(isinstance(y, np.ndarray) for y in ys)
    assert history.collect("note") == ["hi"]


def test_nested_device_values_are_fetched_too():
    history = ciclo.history()
    history.commit(at_step(0), {"outputs": {"pair": {"a": jnp.float32(1.5), "b": jnp.ones(2)}}})
    (pair,) = history.collect("pair")
    assert pair["a"] == 1.5
    assert isinstance(pair["b"], np.ndarray)


def test_rows_len_iter_and_last_logs():
    history = ciclo.history()
    history.commit(at_step(0), ciclo.logs().add_loss("loss", jnp.float32(2.0)))
    history.commit(at_step(1), ciclo.logs().add_metric("accuracy", 0.5))
    history.commit(at_step(2), None)
    assert len(history) == 3
    assert history[0] == {
        "elapsed": {"steps": 0, "samples": 0, "time": 0.0, "date": 100.0},
        "losses": {"loss": 2.0},
    }
    assert history[1]["metrics"] == {"accuracy": 0.5}
    assert "losses" not in history[1]
    assert history[-1] == {"elapsed": {"steps": 2, "samples": 4, "time": 0.5, "date": 102.0}}
    assert [row["elapsed"]["steps"] for row in history] == [0, 1, 2]
    with pytest.raises(IndexError, match="history row 3 out of range"):
        history[3]
    last = ciclo.history()
    assert last.last_logs() == {}
    last.commit(at_step(0), ciclo.logs().add_metric("accuracy", jnp.float32(0.25)))
    assert last.last_logs() == {"metrics": {"accuracy": 0.25}}
    assert last.last_logs().metrics.accuracy == 0.25
    assert sorted(history.keys()) == [
        "elapsed.date",
        "elapsed.samples",
        "elapsed.steps",
        "elapsed.time",
        "losses.loss",
        "metrics.accuracy",
    ]


def test_empty_history():
    history = ciclo.history()
    assert len(history) == 0
    assert history.collect("steps") == []
    assert history.collect("steps", "samples") == ([], [])
    assert list(history) == []


def test_commit_many_with_stacked_logs():
    def body(w, x):
        loss = (w * x - 1.0) ** 2
        return w - 0.1 * x, ciclo.logs().add_loss("loss", loss).add_metric("w", w)

    _, stacked = jax.lax.scan(body, jnp.float32(0.5), jnp.arange(1.0, 6.0, dtype=jnp.float32))
    expected = jax.device_get(stacked)

    history = ciclo.history()
    history.commit(at_step(0), ciclo.logs().add_loss("loss", jnp.float32(9.0)))
    history.commit_many([at_step(i) for i in range(1, 6)], stacked)
    history.commit(at_step(6), ciclo.logs().add_loss("loss", jnp.float32(7.0)))

    assert len(history) == 7
    steps, loss = history.collect("steps", "loss")
    assert steps == list(range(7))
    assert loss == [9.0, *(float(v) for v in expected.losses.loss), 7.0]
    assert history.collect("steps", "w") == (
        [1, 2, 3, 4, 5],
        [float(v) for v in expected.metrics.w],
    )
    assert history[3]["elapsed"]["samples"] == 6


def test_commit_many_rejects_values_not_stacked_per_row():
    history = ciclo.history()
    with pytest.raises(ValueError, match=r"'losses.loss' has shape \(3,\).*\(2 rows\)"):
        history.commit_many([at_step(0), at_step(1)], {"losses": {"loss": jnp.zeros(3)}})
    with pytest.raises(ValueError, match=r"'metrics.m' has shape \(\)"):
        history.commit_many([at_step(0)], {"metrics": {"m": 1.0}})
    assert len(history) == 0


def test_commits_stay_on_device_until_read(to_host_calls):
    history = ciclo.history(fetch_interval=3600.0)
    for i in range(100):
        history.commit(at_step(i), ciclo.logs().add_loss("loss", jnp.float32(i)))
    assert to_host_calls == []
    assert len(history) == 100
    assert history.collect("loss") == [float(i) for i in range(100)]
    assert len(to_host_calls) == 1
    history.collect("steps", "loss")
    history[5]
    assert len(to_host_calls) == 1


def test_pending_values_are_fetched_in_bounded_batches(to_host_calls):
    history = ciclo.history(fetch_interval=3600.0, max_pending=10)
    for i in range(100):
        history.commit(at_step(i), ciclo.logs().add_loss("loss", jnp.float32(i)))
    assert len(to_host_calls) == 10
    assert history.collect("steps", "loss") == (list(range(100)), [float(i) for i in range(100)])


def test_a_batch_sent_lands_once_computed_without_waiting_for_a_read(monkeypatch):
    history = ciclo.history(fetch_interval=3600.0, max_pending=32)
    lands = []
    real_land = ciclo._records._host.land_stacked
    monkeypatch.setattr(
        ciclo._records._host, "land_stacked", lambda chunks: lands.append(1) or real_land(chunks)
    )
    for i in range(32):
        history.commit(at_step(i), ciclo.logs().add_loss("loss", jnp.float32(i)))
    assert lands == []  # sent at the 32nd commit, not waited for
    assert history.latest_since(0)["losses"]["loss"] == 31.0  # seen while on its way
    for i in range(32, 48):  # the 48th commit looks, and the device is long done
        history.commit(at_step(i), ciclo.logs().add_loss("loss", jnp.float32(i)))
    assert lands == [1]
    _, _, columns = history.numeric_since(0, ["losses.loss"], fetch=False)
    assert columns["losses.loss"][1].tolist() == [float(i) for i in range(32)]
    assert history.collect("loss") == [float(i) for i in range(48)]


def test_host_values_are_stored_without_a_fetch(to_host_calls):
    history = ciclo.history()
    for i in range(5):
        history.commit(at_step(i), ciclo.logs().add_loss("loss", float(i)))
    assert history.collect("loss") == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert to_host_calls == []


def test_rows_keep_their_order_when_host_and_device_commits_mix():
    history = ciclo.history(fetch_interval=3600.0)
    for i in range(6):
        value = jnp.float32(i) if i % 2 else float(i)
        history.commit(at_step(i), ciclo.logs().add_loss("loss", value))
    assert history.collect("steps", "loss") == (list(range(6)), [float(i) for i in range(6)])
