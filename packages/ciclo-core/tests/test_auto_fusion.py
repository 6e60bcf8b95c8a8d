"""``steps_per_call="auto"``: accepted wherever a K is, the controller's rule (on a fake
clock: nothing here is timed), the loop's semantics with auto-fused groups, and an exact
resume after a kill inside a group."""

from __future__ import annotations

import dataclasses
import itertools
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ciclo
from ciclo._loop import _fusion
from ciclo._loop._callback import Callback
from ciclo._records._logs import Logs
from ciclo.managed import _auto, _compile

sys.path.insert(0, str(Path(__file__).parent))
import auto_fusion_training as training
import test_managed
from test_managed import (
    assert_same_history,
    assert_trees_close,
    make_batches,
    make_state,
    regression_step,
)


@pytest.mark.parametrize("name", ["jit", "data-parallel", "pmap", "fsdp"])
def test_auto_is_accepted_wherever_a_k_is(name):
    assert ciclo.managed.get_strategy(name, steps_per_call="auto").steps_per_call == "auto"
    assert make_state(name, steps_per_call="auto").strategy.steps_per_call == "auto"


@pytest.mark.parametrize("value", ["Auto", "8", 2.0])
def test_another_string_or_type_is_refused(value):
    with pytest.raises(
        ValueError, match=r'steps_per_call=\.\.\.\) must be a positive int or "auto"'
    ):
        ciclo.managed.jit(steps_per_call=value)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def drive(
    monkeypatch,
    seconds_per_step,
    dispatch_per_call,
    seconds=2.0,
    compile_every=0,
    pause_every=0,
    loop_steps=0,
    ahead=0,
):
    """Runs a controller on a fake loop: ``seconds_per_step(k)`` and ``dispatch_per_call(k)``
    say what a step costs at K; returns the Ks it chose, group by group. ``pause_every``
    groups, or once ``loop_steps`` steps ran, 50 ms pass outside the step and a new loop
    starts at step 0. ``ahead``: the calls the host may run ahead of the device (0: it
    waits for each); then each new K first compiles for 50 ms, while the device catches up."""
    clock, done = Clock(), deque()  # done: when the device ends each call still in flight

    def synced_now(state):
        clock.now = max([clock.now, *done])
        return clock.now

    monkeypatch.setattr(_auto.time, "perf_counter", clock)
    monkeypatch.setattr(_auto, "synced_now", synced_now)
    auto, loop_state = _auto.AutoFusion(), SimpleNamespace(batch=None, elapsed=None, state=None)
    assert auto.steps(loop_state) == _auto.MAX_STEPS  # before the first batch: it may fuse
    loop_state.batch, chosen, step = "batch", [], 0
    while clock.now < seconds:
        loop_state.elapsed = SimpleNamespace(steps=step)
        k = auto.steps(loop_state)
        if ahead and k != (chosen[-1] if chosen else 1):  # a new K: compiled first
            clock.now += 0.05
            _auto._count_compiles("/jax/core/compile/backend_compile_duration", 0.05)
        chosen.append(k)
        auto.timed(lambda k=k: setattr(clock, "now", clock.now + dispatch_per_call(k)))
        compute = seconds_per_step(k) * k - dispatch_per_call(k)
        if ahead:
            done.append(max([clock.now, *done]) + compute)
            if len(done) > ahead:
                clock.now = max(clock.now, done.popleft())
        else:
            clock.now += compute
        step += k
        if compile_every and len(chosen) % compile_every == 0:  # 50 ms of compiling
            clock.now += 0.05
            _auto._count_compiles("/jax/core/compile/backend_compile_duration", 0.05)
        if (pause_every and len(chosen) % pause_every == 0) or (loop_steps and step >= loop_steps):
            loop_state.elapsed = SimpleNamespace(steps=step)
            auto.loop_ended(loop_state, None)  # the step's __loop_end__
            clock.now, step = clock.now + 0.05, 0  # an evaluation, another loop
    return chosen, auto


def test_a_step_dominated_by_dispatch_is_fused_until_it_stops_paying(monkeypatch):
    # 40 us of dispatch per call, 1 us of compute per step: fusing pays up to the cap.
    chosen, auto = drive(monkeypatch, lambda k: (40e-6 + 1e-6 * k) / k, lambda k: 40e-6)
    assert chosen[0] == 1
    assert auto.k == _auto.MAX_STEPS
    assert auto.settled
    assert sorted(set(chosen)) == [1, 2, 4, 8, 16, 32, 64]


@pytest.mark.parametrize("loop_steps", [0, 100, 300])
def test_windows_run_from_and_to_a_device_that_caught_up(monkeypatch, loop_steps):
    # A device-bound step: 1 ms of compute a step, 0.3 ms of dispatch a call (30% of K = 1:
    # fusing is tried), the host allowed 16 calls ahead. After each new K's compile the
    # host dispatches 16 calls at once: timed without waiting for the device, K = 2-64 read
    # 0.12-0.39 ms a step and K = 64 was kept. Timed from and to a synced device, no K is
    # faster: K = 1 is kept after MISSES doublings that did not pay. A 100-step loop is
    # shorter than a window: read at its last group's start, unsynced, K = 64 was kept;
    # closed by the loop's end once the device caught up, K = 1. In 300-step loops a window
    # opened inside a loop and cut by its end is dropped (read, K = 8 was kept).
    chosen, auto = drive(
        monkeypatch, lambda k: 1e-3 + 0.3e-3 / k, lambda k: 0.3e-3, 8.0, 0, 0, loop_steps, 16
    )
    assert auto.settled
    assert auto.k == 1
    assert max(chosen) == 2**_auto.MISSES


@dataclasses.dataclass(frozen=True, kw_only=True)
class _WithStep(ciclo.managed.ManagedState):
    seen: jax.Array
    train_step = regression_step


@pytest.mark.parametrize("kind", ["managed step", "bound managed step", "fuse_steps"])
def test_each_loop_end_reaches_the_auto_controller(monkeypatch, kind):
    # The step's __loop_end__ reaches its controller (which closes a whole loop's window
    # there, above): once per loop, with the loop's count, and the error that ended it.
    ended = []
    monkeypatch.setattr(
        _auto.AutoFusion,
        "loop_ended",
        lambda self, loop_state, error: ended.append((loop_state.elapsed.steps, type(error))),
    )
    state, step = make_state("jit", steps_per_call="auto"), regression_step
    if kind == "bound managed step":  # state.train_step, as a class attribute defines it
        state = _WithStep.create(
            params=state.params, tx=state.tx, seen=state.seen, strategy=state.strategy
        )
        step = state.train_step
    elif kind == "fuse_steps":
        state = jnp.zeros(())
        step = ciclo.fuse_steps(jax.jit(lambda s, b: (ciclo.logs().add_metric("s", s), s + 1)))

    def fail_at_5(state, batch, elapsed):
        if elapsed.steps == 5:
            raise RuntimeError("at step 5")

    state, _, _ = ciclo.loop(state, make_batches(steps=12), {ciclo.every(1): step})
    state, _, _ = ciclo.loop(state, make_batches(steps=7), {ciclo.every(1): step})
    with pytest.raises(RuntimeError, match="at step 5"):
        ciclo.loop(state, make_batches(steps=7), {ciclo.every(1): [step, fail_at_5]})
    assert ended == [(12, type(None)), (7, type(None)), (5, RuntimeError)]


def test_a_window_waits_for_the_state_not_for_arrays_donated_since():
    donated = jnp.ones(3)
    live = jax.jit(lambda x: x + 1, donate_argnums=0)(donated)
    before = time.perf_counter()
    now = _auto.synced_now({"donated": donated, "live": live, "other": "text"})
    assert donated.is_deleted()
    assert live.is_ready()
    assert now >= before


def test_time_spent_compiling_is_left_out(monkeypatch):
    # A compile in every window (a history's new stack shape...) would make each larger K
    # look slower; counted out through jax.monitoring, the choice is as without them.
    _, auto = drive(monkeypatch, lambda k: (40e-6 + 1e-6 * k) / k, lambda k: 40e-6, 30.0, 97)
    assert auto.k == _auto.MAX_STEPS


def test_a_window_does_not_span_two_loops(monkeypatch):
    # Loops of 600 groups (at K = 1, 24 ms: about one window), each 50 ms after the last
    # and counting from step 0: no window spans two loops (nor the time between them).
    _, auto = drive(monkeypatch, lambda k: (40e-6 + 1e-6 * k) / k, lambda k: 40e-6, 30.0, 0, 600)
    assert auto.k == _auto.MAX_STEPS


@pytest.mark.parametrize("loop_steps", [56, 200])
def test_loops_shorter_than_a_window_are_measured(monkeypatch, loop_steps):
    # Loops of 56 steps (an epoch of digits in batches of 32) or 200, each 50 ms after the
    # last: at K = 1 a loop lasts 2-8 ms, under a window's 20 ms, and at K = 64 it holds
    # fewer than a window's 4 calls. Each loop closes its window at its last group's start.
    _, auto = drive(
        monkeypatch, lambda k: (40e-6 + 1e-6 * k) / k, lambda k: 40e-6, 60.0, 0, 0, loop_steps
    )
    assert auto.settled
    assert auto.k >= 32


def test_a_k_kept_in_a_busy_moment_is_measured_again(monkeypatch):
    # For the first second dispatch looks like a small share (a busy host): K = 1 is kept;
    # measured again 10 s later, the step fuses.
    def now():
        return _auto.time.perf_counter()

    def per_step(k):
        return 1e-3 if now() < 1.0 else (40e-6 + 1e-6 * k) / k

    chosen, auto = drive(monkeypatch, per_step, lambda k: 30e-6 if now() < 1.0 else 40e-6, 20.0)
    assert chosen[0] == 1
    assert _auto.REPROBE_SECONDS < 20.0
    assert auto.k == _auto.MAX_STEPS


def test_once_fused_a_low_dispatch_share_does_not_stop_the_doubling(monkeypatch):
    # A busy host: fused calls read 5 us of dispatch (11% of K = 2's time), yet each doubling
    # still pays up to the cap. Only the share at K = 1 decides whether to fuse at all.
    chosen, auto = drive(
        monkeypatch, lambda k: (40e-6 + 2e-6 * k) / k, lambda k: 40e-6 if k == 1 else 5e-6
    )
    assert auto.k == _auto.MAX_STEPS
    assert auto.settled
    assert sorted(set(chosen)) == [1, 2, 4, 8, 16, 32, 64]


def test_a_k_whose_fused_steps_are_much_slower_is_never_tried_again(monkeypatch):
    # Dispatch reads a little over 20% of a 1.5 ms step, but fused, the step takes 20 ms (a
    # CNN's convolutions under XLA:CPU's loop): K = 2 is tried once, not at each new look.
    chosen, auto = drive(
        monkeypatch, lambda k: 1.5e-3 if k == 1 else 20e-3, lambda k: 0.35e-3, 40.0
    )
    trials = [k for k, before in itertools.pairwise([1, *chosen]) if k == 2 and before == 1]
    assert len(trials) == 1
    assert _auto.REPROBE_SECONDS * 3 < 40.0  # measured anew 3 times, each time at K = 1
    assert (auto.k, auto.ceiling) == (1, 1)


def test_one_window_whose_dispatch_reads_slow_does_not_fuse_a_large_step(monkeypatch):
    # A 1 ms step with 30 us of dispatch; in the second of the first 3 windows (20-40 ms) a
    # busy host preempts the dispatch (0.3 ms) and that window reads fastest (0.9 ms a
    # step). The middle of the 3 shares decides: K = 1 is kept, no fused call compiled (the
    # fastest window's share, 0.33, had K = 2, 4 and 8 compiled).
    def busy():
        return 0.02 <= _auto.time.perf_counter() < 0.04

    chosen, auto = drive(
        monkeypatch, lambda k: 0.9e-3 if busy() else 1e-3, lambda k: 0.3e-3 if busy() else 30e-6
    )
    assert set(chosen) == {1}
    assert auto.settled


def test_a_large_step_keeps_k_1(monkeypatch):
    # 30 us of dispatch in a 1 ms step: never fused, never a fused call compiled.
    chosen, auto = drive(monkeypatch, lambda k: 1e-3, lambda k: 30e-6)
    assert set(chosen) == {1}
    assert auto.settled


def test_doublings_that_do_not_pay_are_undone(monkeypatch):
    # Dispatch dominates, but steps get no faster past K = 4: 8, 16 and 32 are tried (the
    # MISSES doublings in a row that did not pay), 4 kept.
    chosen, auto = drive(monkeypatch, lambda k: 100e-6 / min(k, 4), lambda k: 60e-6)
    assert auto.k == 4
    assert auto.settled
    assert max(chosen) == 4 * 2**_auto.MISSES
    assert chosen[-1] == 4


@pytest.mark.parametrize("fused_call", [150e-6, 240e-6])
def test_a_doubling_that_costs_is_passed_when_the_next_pays(monkeypatch, fused_call):
    # A fused call's own cost makes K = 2 slower than K = 1 (1.6x; or 2.5x, as a busy host
    # read it once, which is under SLOWER and so does not bar K = 2); larger Ks are faster.
    def per_step(k):
        return 50e-6 if k == 1 else (fused_call + 5e-6 * k) / k

    chosen, auto = drive(monkeypatch, per_step, lambda k: 40e-6 if k == 1 else 140e-6)
    assert 2 in chosen
    assert auto.k == _auto.MAX_STEPS


class Spy:
    """The fused calls a loop makes under auto-fusion: their sizes, in order."""

    def __init__(self, monkeypatch):
        self.groups = []
        parts = _compile.power_of_2_parts

        def spy(count):
            self.groups.extend(parts(count))
            return parts(count)

        monkeypatch.setattr(_compile, "power_of_2_parts", spy)


def test_with_several_processes_auto_keeps_k_1(monkeypatch):
    # Each process would pick its own K, and fused calls of several processes must match.
    monkeypatch.setattr(_auto.jax, "process_count", lambda: 2)
    spy = Spy(monkeypatch)
    batches = make_batches(steps=12)
    _, history, _ = ciclo.loop(
        make_state("jit", steps_per_call="auto"), batches, {ciclo.every(1): regression_step}
    )
    assert spy.groups == []
    assert len(history) == 12


@pytest.fixture
def forced_k(monkeypatch):
    monkeypatch.setattr(_auto.AutoFusion, "steps", lambda self, loop_state: 8)


def test_auto_groups_see_every_step_and_cut_groups_run_as_powers_of_2(monkeypatch, forced_k):
    seen = []

    def every_third(state, batch, elapsed):
        seen.append((elapsed.steps, int(state.step)))

    batches = make_batches(steps=20)

    def tasks():
        return {ciclo.every(1): regression_step, ciclo.every(steps=3): every_third}

    state_1, history_1, _ = ciclo.loop(make_state("jit"), batches, tasks())
    unfused, seen[:] = list(seen), []
    spy = Spy(monkeypatch)
    state_a, history_a, elapsed = ciclo.loop(
        make_state("jit", steps_per_call="auto"), batches, tasks()
    )
    assert elapsed.steps == 20
    assert seen == unfused
    assert_trees_close(state_a.params, state_1.params)
    assert_same_history(history_a, history_1)
    # groups 1-3 | 4-6 | ... (every(3) ends them): each group of 3 runs as calls of 2 and 1
    assert spy.groups == [2, 1] * 6


def test_batches_of_another_shape_end_an_auto_group(monkeypatch, forced_k):
    batches = make_batches(steps=6, batch_size=16) + make_batches(steps=4, batch_size=8, seed=1)
    spy = Spy(monkeypatch)
    _state, history, _ = ciclo.loop(
        make_state("jit", steps_per_call="auto"), batches, {ciclo.every(1): regression_step}
    )
    _state_1, history_1, _ = ciclo.loop(
        make_state("jit"), batches, {ciclo.every(1): regression_step}
    )
    assert spy.groups == [4, 2, 4]
    assert_same_history(history, history_1)


_NESTED = {"x": {"a": np.zeros(3, np.float32)}, "y": np.zeros(1)}


@pytest.mark.parametrize(
    ("first", "other"),
    [
        (np.zeros(3, np.float32), np.zeros(3, np.int32)),  # the dtype only
        (jnp.zeros(3), jnp.zeros(4)),
        (np.zeros(3), (np.zeros(3),)),
        ((np.zeros(3), np.zeros(2)), (np.zeros(3), np.zeros(2, np.int32))),
        ((np.zeros(3), np.zeros(2)), [np.zeros(3), np.zeros(2)]),
        ((np.zeros(3), 1), (np.zeros(3), 1.0)),
        (_NESTED, {"x": {"a": np.zeros(3, np.float16)}, "y": np.zeros(1)}),
        (_NESTED, {"x": {"b": np.zeros(3, np.float32)}, "y": np.zeros(1)}),
        (_NESTED, {"x": {"a": np.zeros((3, 1), np.float32)}, "y": np.zeros(1)}),
    ],
)
def test_a_batch_of_another_shape_dtype_or_structure_ends_a_group(first, other):
    group = _fusion.Group(Callback(regression_step), 8, Logs(), first)
    assert group.accepts_batch(jax.tree.map(lambda x: x + 1 if type(x) is int else 2 * x, first))
    assert not group.accepts_batch(other)


def test_a_batch_whose_dtype_changes_ends_a_fixed_k_group(monkeypatch):
    batches = make_batches(steps=6)
    batches[3] = (batches[3][0], batches[3][1].astype(np.float16))
    spy = test_managed.Spy(monkeypatch)
    tasks = {ciclo.every(1): regression_step}
    _, history, _ = ciclo.loop(make_state("jit", steps_per_call=4), batches, tasks)
    _, history_1, _ = ciclo.loop(make_state("jit"), batches, tasks)
    assert spy.groups == [3, 2]  # steps 1-3 | 4 (a plain step) | 5-6
    assert_same_history(history, history_1)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kill_at", "kind"), [(14, "managed"), (23, "managed"), (14, "plain")]
)  # inside the groups 11-18 and 21-28; plain: a jax.jit step under ciclo.fuse_steps
def test_a_kill_inside_an_auto_group_resumes_bit_identical(tmp_path, kill_at, kind, monkeypatch):
    directory = tmp_path / "run"
    run = subprocess.run(
        [sys.executable, training.__file__, str(directory), str(kill_at), kind],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == -9, run.stderr[-3000:]
    assert f"killed at {kill_at}" in run.stdout
    assert any(p.name.isdigit() for p in directory.iterdir()), "no checkpoint before the kill"
    # groups of K in this process too; monkeypatch puts AutoFusion.steps back afterwards
    monkeypatch.setattr(_auto.AutoFusion, "steps", lambda self, loop_state: training.K)
    plain = kind == "plain"
    resumed = training.fingerprint(*training.run(str(directory), resume=True, plain=plain))
    reference = training.fingerprint(*training.run(str(tmp_path / "reference"), plain=plain))
    assert resumed == reference
