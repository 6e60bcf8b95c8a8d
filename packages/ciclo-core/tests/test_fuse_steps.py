"""``ciclo.fuse_steps``: a hand-written ``jax.jit`` step run several batches per call, with
the loop seeing every step as unfused (the resume after a kill inside a group:
test_auto_fusion.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ciclo


@jax.jit
def regression_step(state, batch):
    x, y = batch
    loss, grad = jax.value_and_grad(lambda w: jnp.mean((x @ w - y) ** 2))(state["w"])
    logs = ciclo.logs().add_loss("loss", loss).add_metric("w0", state["w"][0])
    return logs, {"w": state["w"] - 0.1 * grad, "count": state["count"] + 1}


def batches(steps=20, seed=0):
    rng = np.random.default_rng(seed)
    return [
        (rng.normal(size=(8, 3)).astype(np.float32), rng.normal(size=8).astype(np.float32))
        for _ in range(steps)
    ]


def start():
    return {"w": jnp.zeros(3), "count": jnp.zeros((), jnp.int32)}


class Seen:
    """A callback recording the state's count and the step at which it fired."""

    def __init__(self):
        self.rows = []

    def __call__(self, state, batch, elapsed):
        self.rows.append((elapsed.steps, int(state["count"])))


@pytest.mark.parametrize("k", [1, 4, 8])
def test_a_fused_step_gives_the_unfused_loop_s_state_history_and_schedules(k):
    data = batches()
    seen, seen_fused = Seen(), Seen()
    tasks = {ciclo.every(1): regression_step, ciclo.every(3): seen}
    state, history, elapsed = ciclo.loop(start(), data, tasks)
    fused = ciclo.fuse_steps(regression_step, k)
    tasks = {ciclo.every(1): fused, ciclo.every(3): seen_fused}
    state_f, history_f, elapsed_f = ciclo.loop(start(), data, tasks)
    np.testing.assert_allclose(state_f["w"], state["w"], rtol=1e-6)
    assert int(state_f["count"]) == 20
    assert elapsed_f.steps == elapsed.steps == 20
    assert history_f.collect("steps") == history.collect("steps") == list(range(20))
    np.testing.assert_allclose(history_f.collect("loss"), history.collect("loss"), rtol=1e-6)
    assert history_f.collect("w0") == pytest.approx(history.collect("w0"), rel=1e-6, abs=1e-7)
    assert seen_fused.rows == seen.rows  # every(3) saw each third step's state, fused or not


def test_a_fixed_k_runs_groups_of_k_in_one_compiled_call(monkeypatch):
    fused = ciclo.fuse_steps(regression_step, 4)
    sizes = []
    call = fused._fused

    def counted(state, part):
        sizes.append(len(part))
        return call(state, part)

    monkeypatch.setattr(fused, "_fused", counted)
    ciclo.loop(start(), batches(10), {ciclo.every(1): fused})
    assert sizes == [4, 4, 2]


def test_a_step_returning_a_flat_dict_of_metrics_is_fused_as_unfused():
    @jax.jit
    def step(state, batch):
        return {"total": state + batch.sum()}, state + 1

    data = [np.ones(2, np.float32)] * 6
    _, history, _ = ciclo.loop(0.0, data, {ciclo.every(1): step})
    state, fused, _ = ciclo.loop(0.0, data, {ciclo.every(1): ciclo.fuse_steps(step, 3)})
    assert float(state) == 6.0
    assert fused.collect("total") == history.collect("total") == [2.0, 3.0, 4.0, 5.0, 6.0, 7.0]


def test_auto_fuses_a_step_whose_dispatch_is_its_whole_time():
    @jax.jit
    def step(state, batch):
        return ciclo.logs().add_metric("x", state), state + 1

    fused = ciclo.fuse_steps(step)  # "auto"
    data = [np.zeros(1, np.float32)] * 2000
    for _ in range(20):  # each new K compiles once; a few loops let it climb
        state, history, _ = ciclo.loop(0.0, data, {ciclo.every(1): fused})
        assert float(state) == 2000.0
        assert len(history.collect("x")) == 2000
        if fused._auto.k > 1:
            break
    assert fused._auto.k > 1


def test_called_directly_it_runs_one_step():
    fused = ciclo.fuse_steps(regression_step)
    logs, state = fused(start(), batches(1)[0])
    assert int(state["count"]) == 1
    assert "loss" in logs["losses"]
    assert "regression_step" in repr(fused)


@pytest.mark.parametrize("value", [0, -1, 2.0, True, "Auto"])
def test_a_bad_steps_per_call_is_refused_naming_what_it_takes(value):
    with pytest.raises(ValueError, match=r'steps_per_call must be an int >= 1 .* or "auto"'):
        ciclo.fuse_steps(regression_step, value)


def test_a_step_that_is_not_a_function_is_refused():
    with pytest.raises(TypeError, match=r"step must be a function \(state, batch\)"):
        ciclo.fuse_steps(3)
