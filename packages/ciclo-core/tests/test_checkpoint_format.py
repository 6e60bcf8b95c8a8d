"""The on-disk checkpoint format (documented in ciclo/_checkpoint/_format.py) stays readable:
the items and meta fields a checkpoint holds, and a checkpoint's meta written by hand in the
version-1 layout restores."""

from __future__ import annotations

import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

import ciclo
from ciclo._checkpoint._items import ITEMS


def _run(directory: Path) -> ciclo.callbacks.Checkpoint:
    stopper = ciclo.early_stopping("loss", patience=10, restore_best_weights=True, verbose=False)

    def step(state, batch):
        return ciclo.logs().add_loss("loss", -state["w"].sum()), {"w": state["w"] + batch}

    ckpt = ciclo.checkpoint(directory, keep=None, async_save=False)
    tasks = {ciclo.every(1): [step, stopper.on_epoch_end], ciclo.every(2): ckpt}
    ciclo.loop({"w": jnp.zeros(2)}, [np.ones(2, np.float32)] * 3, tasks)
    return ckpt


def test_a_checkpoint_holds_the_documented_items_and_meta_fields(tmp_path: Path) -> None:
    ckpt = _run(tmp_path)
    assert ckpt.all_steps() == [1, 3]
    items = {p.name for p in (tmp_path / "3").iterdir() if p.is_dir()}
    assert {"meta", "state", "arrays", "copies"} <= items
    manager = ocp.CheckpointManager(tmp_path, options=ocp.CheckpointManagerOptions(create=False))
    meta = manager.restore(3, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
    assert list(meta) == [
        "format",
        "state_leaves",
        *(item.key for item in ITEMS),  # each item declares its field
    ]
    assert {item.key for item in ITEMS} == {
        "elapsed",
        "initial_elapsed",
        "data",
        "ledger",
        "schedules",
        "callbacks",
        "history",
        "logs",
        "end",
    }
    assert meta["ledger"] is None  # no ciclo.goodput() in this loop
    assert meta["format"] == 1
    assert meta["elapsed"]["steps"] == 3
    assert meta["data"] == {"position": 3, "state": None}
    assert meta["end"] == {"reason": "data", "step": 3, "message": None}  # the run's end
    assert meta["state_leaves"] == [["['w']", "jax", [2], "float32", True]]
    assert meta["callbacks"][0]["name"] == "EarlyStopping"
    best = meta["callbacks"][0]["state"]["best_weights"]
    assert set(best) == {"__ciclo_state__", "leaves"}
    # plain orbax reads the state item, in the state's own structure
    state = manager.restore(3, args=ocp.args.Composite(state=ocp.args.StandardRestore()))["state"]
    np.testing.assert_array_equal(state["w"], [3.0, 3.0])
    manager.close()


def test_a_checkpoint_of_another_format_is_refused(tmp_path: Path) -> None:
    _run(tmp_path)
    meta_dir = tmp_path / "3" / "meta"
    meta_file = meta_dir / "metadata"
    meta = json.loads(meta_file.read_text())
    meta["format"] = 2
    meta_file.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"checkpoint 3 in .* format 2, expected 1"):
        ciclo.restore(tmp_path, {"w": jnp.zeros(2)})
    _state, history, elapsed = ciclo.restore(tmp_path, {"w": jnp.zeros(2)}, step=1)
    assert elapsed.steps == 1
    assert history.collect("steps") == [0]
