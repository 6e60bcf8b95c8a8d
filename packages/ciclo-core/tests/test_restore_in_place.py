"""Objects restored in place on resume (``ciclo.adapters.register_restore_in_place``): a
step that captures a mutable object sees the restored values."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import ciclo
from ciclo._checkpoint._in_place import restore_in_place


class Box:
    """A mutable pytree node, as an NNX module is."""

    def __init__(self, value):
        self.value = value


jax.tree_util.register_pytree_node(
    Box, lambda box: ((box.value,), None), lambda _, children: Box(children[0])
)


def copy_into(original, restored):
    original.value = np.asarray(restored.value)


ciclo.adapters.register_restore_in_place(Box, copy_into)


def run(directory, crash_at=None):
    box = Box(np.zeros(2))

    def step(state, batch, elapsed):  # mutates the captured box, returns no state
        if elapsed.steps == crash_at:
            raise RuntimeError("crash")
        box.value = box.value + batch

    tasks = {ciclo.every(1): step, ciclo.every(2): ciclo.checkpoint(directory)}
    state, _, elapsed = ciclo.loop(
        {"box": box, "count": 0}, [np.ones(2)] * 6, tasks, resume=directory
    )
    return box, state, elapsed


def test_a_captured_object_is_restored_in_place_on_resume(tmp_path):
    with pytest.raises(RuntimeError, match="crash"):
        run(tmp_path, crash_at=4)
    box, state, elapsed = run(tmp_path)
    assert state["box"] is box
    assert elapsed.steps == 6
    np.testing.assert_array_equal(box.value, [6.0, 6.0])  # 4 restored + 2 more


def test_restore_in_place_keeps_the_original_objects():
    original, new = Box(np.zeros(1)), Box(np.ones(1))
    state = restore_in_place([original, 3], [new, 4])
    assert state[0] is original
    assert state[1] == 4
    np.testing.assert_array_equal(original.value, [1.0])


def test_registration_errors():
    with pytest.raises(TypeError, match=r"node_type must be a class, got 'Box'"):
        ciclo.adapters.register_restore_in_place("Box", copy_into)
    with pytest.raises(TypeError, match=r"restore_into must be a function \(original, restored\)"):
        ciclo.adapters.register_restore_in_place(Box, None)


class Cell:
    """A mutable pytree node of a framework whose adapter declares its in-place restore."""

    def __init__(self, value):
        self.value = value


jax.tree_util.register_pytree_node(
    Cell, lambda cell: ((cell.value,), None), lambda _, children: Cell(children[0])
)


@pytest.fixture
def cell_adapter(monkeypatch):
    """An adapter registered in this process whose record restores ``Cell`` in place."""
    from ciclo._plugins import _discovery

    monkeypatch.setattr(_discovery, "_REGISTERED", {})
    monkeypatch.setattr(_discovery, "_LOADED", {})
    adapter = ciclo.adapters.Adapter(
        name="cells",
        distribution="ciclo-cells",
        handles=lambda model: isinstance(model, Cell),
        create_state=lambda model: model,
        restore_in_place={Cell: copy_into},
    )
    return ciclo.adapters.register_adapter(adapter)


def test_an_adapter_record_declares_what_is_restored_in_place(cell_adapter):
    original, new = Cell(np.zeros(1)), Cell(np.ones(1))
    state = restore_in_place({"cell": original}, {"cell": new})
    assert state["cell"] is original
    np.testing.assert_array_equal(original.value, [1.0])


def test_a_broken_adapter_is_a_warning_on_resume(monkeypatch):
    from ciclo._plugins import _discovery

    class Broken:  # an installed adapter of a framework that is imported (numpy)
        name, value, dist = "numpy", "broken_adapter:adapter", None

        def load(self):
            raise ImportError("no module named broken_adapter")

    monkeypatch.setattr(_discovery, "_entry_points", lambda: [Broken()])
    monkeypatch.setattr(_discovery, "_LOADED", {})
    monkeypatch.setattr(_discovery, "_REGISTERED", {})
    original, new = Box(np.zeros(1)), Box(np.ones(1))
    with pytest.warns(RuntimeWarning, match=r"adapter 'numpy' failed to load .* replaced on"):
        state = restore_in_place([original], [new])
    assert state[0] is original  # what loaded still restores in place
