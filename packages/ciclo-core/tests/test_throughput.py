"""throughput(flops_per_step=...): every documented form of a step, read when the loop
starts; a step that cannot be read is named at once, with what to pass."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import ciclo
from ciclo.managed import ManagedState


@ciclo.managed.train_step
def regression_step(state, batch):
    x, y = batch
    loss = jnp.mean((x @ state.params["w"] - y) ** 2)
    return ciclo.logs().add_loss("loss", loss), state


@dataclasses.dataclass(frozen=True, kw_only=True)
class State(ManagedState):
    train_step = regression_step


def make_state(strategy="jit"):
    return State.create(params={"w": jnp.zeros(4)}, tx=optax.sgd(0.1), strategy=strategy)


BATCHES = [(np.ones((8, 4), np.float32), np.ones(8, np.float32))] * 5


def flops_logged(state, step, flops_per_step):
    meter = ciclo.throughput(2, flops_per_step=flops_per_step)
    _, history, _ = ciclo.loop(state, BATCHES, {ciclo.every(1): step, **meter})
    flops = history.collect("flops_per_second")
    assert len(flops) == 2  # at steps 2 and 4 (0 opens the window)
    return flops[-1] / history.collect("steps_per_second")[-1]


@pytest.mark.parametrize("strategy", ["jit", "eager", "data_parallel"])
def test_every_form_of_a_managed_step_gives_the_same_flops(strategy):
    state = make_state(strategy)
    bound = flops_logged(state, state.train_step, state.train_step)
    unbound = flops_logged(state, state.train_step, type(state).train_step)
    function = flops_logged(state, state.train_step, regression_step)
    assert bound > 0
    assert bound == pytest.approx(unbound) == pytest.approx(function)
    analysis = regression_step.lower(state, BATCHES[0]).compile().cost_analysis()
    assert bound == pytest.approx(analysis["flops"])


def test_a_jitted_function_and_a_number_give_their_flops():
    @jax.jit
    def step(state, batch):
        return state @ batch / 8.0

    state, batch = jnp.eye(8), np.ones((8, 8), np.float32)
    meter = ciclo.throughput(2, flops_per_step=step)
    _, history, _ = ciclo.loop(state, [batch] * 5, {ciclo.every(1): step, **meter})
    per_step = history.collect("flops_per_second")[-1] / history.collect("steps_per_second")[-1]
    assert per_step == pytest.approx(2 * 8**3, rel=0.1)
    meter = ciclo.throughput(2, flops_per_step=1e6)
    _, history, _ = ciclo.loop(state, [batch] * 5, {ciclo.every(1): step, **meter})
    per_step = history.collect("flops_per_second")[-1] / history.collect("steps_per_second")[-1]
    assert per_step == pytest.approx(1e6)


def test_a_step_that_cannot_be_read_fails_when_the_loop_starts():
    def three_arguments(state, batch, extra):
        return state

    # the first window would close at step 100: the loop of 3 steps fails at step 0
    meter = ciclo.throughput(100, flops_per_step=three_arguments)
    seen = []
    with pytest.raises(
        TypeError,
        match=r"throughput\(flops_per_step=.*three_arguments\): lowering on \(state, batch\) "
        r"failed \(TypeError: .*\); pass a number\.",
    ):
        ciclo.loop(
            jnp.zeros(2),
            [np.ones(2)] * 3,
            {ciclo.every(100): meter, ciclo.every(1): lambda s, b, elapsed: seen.append(elapsed)},
        )
    assert len(seen) == 0  # the throughput's schedule comes first: nothing ran after it


def test_a_wrong_flops_per_step_is_refused_at_once():
    with pytest.raises(TypeError, match=r"throughput\(flops_per_step=str 'lots'\): expected a "):
        ciclo.throughput(flops_per_step="lots")
    with pytest.raises(ValueError, match=r"throughput\(flops_per_step=0\): .* must be > 0"):
        ciclo.throughput(flops_per_step=0)
