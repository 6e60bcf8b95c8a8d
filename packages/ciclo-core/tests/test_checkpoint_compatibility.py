"""Checkpoints written by an earlier version (``main`` at 1a364e5, format 1, before the
checkpoint items of issue 40) resume on the current code: ``fixtures/main_checkpoints``,
written by ``fixtures/make_main_checkpoints.py``."""

from __future__ import annotations

import os
import shutil
import sys

import jax
import numpy as np
import pytest

import ciclo

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "fixtures"))
import make_main_checkpoints as made


@pytest.fixture
def written(tmp_path):
    shutil.copytree(made.HERE, tmp_path / "old")
    return tmp_path / "old"


def same(a, b):
    """Bitwise equal states (keys by their data)."""
    a, b = (jax.tree.map(lambda x: jax.random.key_data(x) if _is_key(x) else x, t) for t in (a, b))
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        assert np.asarray(x).tobytes() == np.asarray(y).tobytes()


def _is_key(x):
    return hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def fresh(tmp_path, dataset, **options):
    """The same run, uninterrupted, on this code."""
    tasks, stopper = made.tasks(tmp_path / "fresh", **options)
    return ciclo.loop(made.initial_state(), dataset, tasks), stopper


def test_a_finished_run_of_main_stays_finished(written, tmp_path, capsys):
    before = sorted(os.listdir(written / "finished"))
    tasks, _stopper = made.tasks(written / "finished")
    state, history, elapsed = ciclo.loop(
        made.initial_state(), made.BATCHES[:7], tasks, resume=written / "finished"
    )
    assert "already ended after 7 steps" in capsys.readouterr().err
    assert sorted(os.listdir(written / "finished")) == before  # nothing written
    (expected, expected_history, _), _ = fresh(tmp_path, made.BATCHES[:7])
    same(state, expected)
    assert elapsed.steps == 7
    assert state["n"] == 7
    assert history.collect("loss") == expected_history.collect("loss")
    restored = ciclo.restore(written / "finished", made.initial_state())
    same(restored.state, expected)


def test_an_unfinished_run_of_main_continues_exactly(written, tmp_path):
    tasks, stopper = made.tasks(written / "unfinished", ledger=True)
    ledger = next(c for c in tasks.values() if isinstance(c, ciclo.callbacks.Goodput))
    state, history, elapsed = ciclo.loop(
        made.initial_state(), made.Batches(made.BATCHES), tasks, resume=written / "unfinished"
    )
    (expected, expected_history, _), expected_stopper = fresh(
        tmp_path, made.Batches(made.BATCHES), ledger=True
    )
    assert elapsed.steps == 10
    same(state, expected)
    assert history.collect("loss") == expected_history.collect("loss")
    assert (stopper.best_step, stopper.best) == (expected_stopper.best_step, expected_stopper.best)
    same(stopper.best_weights, expected_stopper.best_weights)
    assert sum(ledger._base.values()) > 0  # the ledger of the interrupted run carried on
    assert max(ciclo.checkpoint(written / "unfinished").all_steps()) == 10
