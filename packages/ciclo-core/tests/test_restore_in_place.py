"""Objects restored in place on resume (``ciclo.adapters.register_restore_in_place``): a
step that captures a mutable object sees the restored values."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import ciclo
from ciclo._loop._hooks import restore_in_place


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
