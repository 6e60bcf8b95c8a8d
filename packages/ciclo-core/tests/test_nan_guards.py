"""The NaN guards catch a NaN where it happens: one that reaches the parameters but not the
loss (a managed step's ``params_finite``, a plain step's ``state_every``), a spike noticed
late (its pre-spike checkpoint is held from ``keep``), with two processes (one line, at the
stop); a checkpoint of a non-finite state says so; an evaluation bounded in time is refused
with several processes, and one far longer than the training before it is warned about."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import ciclo
from ciclo._checkpoint import _rollback
from ciclo._loops import _train
from ciclo.testing import free_port, run_on_loopback

sys.path.insert(0, str(Path(__file__).parent))
import spike_training

HERE = Path(__file__).parent
TIMEOUT = 150  # seconds, for a subprocess or a 2-process job
NAN_AT, STEPS = 13, 30


# --- two models whose loss stays finite while a NaN reaches the parameters ----------------
def relu(z):  # as XLA's max does on some backends: NaN -> 0, so the loss stays finite
    return jnp.where(z > 0, z, 0.0)


def cnn_loss(params, batch):
    """A ReLU CNN on 8x8 images: NaN inputs give logits 0, a loss of ln 10, NaN gradients."""
    y = jax.lax.conv_general_dilated(
        batch["x"], params["conv"], (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
    )
    y = jax.lax.reduce_window(relu(y), -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
    logits = y.reshape(y.shape[0], -1) @ params["dense"]
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()


def masked_loss(params, batch):
    """A regression that masks non-finite errors out of the loss (``jnp.where``): the
    gradient of the masked branch is NaN times 0, NaN."""
    err = batch["x"].reshape(len(batch["x"]), -1)[:, :3] @ params["dense"][:3, 0] - 1.0
    return jnp.mean(jnp.where(jnp.isfinite(err), err, 0.0) ** 2)


LOSSES = {"relu_cnn": cnn_loss, "masked_loss": masked_loss}


def cnn_data():
    rng = np.random.default_rng(0)
    data = [
        {"x": rng.normal(size=(8, 8, 8, 1)).astype(np.float32), "y": rng.integers(0, 10, 8)}
        for _ in range(40)
    ]
    data[NAN_AT]["x"][:] = np.nan
    return data


def cnn_params():
    k1, k2 = jax.random.split(jax.random.key(0))
    return {
        "conv": jax.random.normal(k1, (3, 3, 1, 4)) * 0.3,
        "dense": jax.random.normal(k2, (64, 10)) * 0.1,
    }


def state_and_step(loss_fn, managed):
    """``(state, step, params_of)``: a managed train step, or a plain jitted one."""
    if managed:

        @ciclo.managed.train_step
        def managed_step(state, batch):
            return ciclo.logs().add_loss("loss", loss_fn(state.params, batch)), state

        state = ciclo.managed.ManagedState.create(params=cnn_params(), tx=optax.sgd(0.1))
        return state, managed_step, lambda state: state.params

    @jax.jit
    def plain_step(params, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        return ciclo.logs().add_loss("loss", loss), jax.tree.map(
            lambda p, g: p - 0.1 * g, params, grads
        )

    return cnn_params(), plain_step, lambda params: params


def finite(tree):
    return all(bool(jnp.isfinite(leaf).all()) for leaf in jax.tree.leaves(tree))


@pytest.mark.parametrize("loss", sorted(LOSSES))
def test_the_nan_batch_leaves_the_loss_finite_and_the_parameters_nan(loss):
    params = cnn_params()
    batch = cnn_data()[NAN_AT]
    assert np.isfinite(float(LOSSES[loss](params, batch)))
    assert not finite(jax.grad(LOSSES[loss])(params, batch))


@pytest.mark.parametrize("managed", [True, False], ids=["managed", "plain-jit"])
@pytest.mark.parametrize("loss", sorted(LOSSES))
def test_terminate_on_nan_stops_within_a_step(loss, managed):
    state, step, _ = state_and_step(LOSSES[loss], managed)
    out = io.StringIO()
    guard = ciclo.terminate_on_nan(interval=0, state_every=None if managed else 1, file=out)
    _, history, elapsed = ciclo.loop(state, cnn_data(), {ciclo.every(1): [step, guard]})
    assert elapsed.steps in (NAN_AT + 1, NAN_AT + 2)  # stopped after step 13 or 14
    assert all(np.isfinite(history.collect("loss")))  # the loss never told
    what = "the parameters" if managed else "the state"
    assert out.getvalue() == (
        f"terminate_on_nan: NaN or inf in {what} at step {NAN_AT}; training stopped after "
        f"step {elapsed.steps - 1}.\n"
    )


def test_a_plain_step_s_state_check_stops_within_a_step_however_far_behind_the_device_runs():
    """A step whose device work far outlasts its dispatch: the host runs up to the bound on
    steps in flight ahead, and a check read only once ready would stop many steps late."""
    (_, plain_step, _), out = state_and_step(cnn_loss, managed=False), io.StringIO()

    @jax.jit
    def slow_step(params, batch):  # ~10 ms of device work that the host never waits for
        busy = jax.lax.fori_loop(0, 40, lambda _, m: jnp.tanh(m @ m), jnp.eye(256))
        logs, params = plain_step(params, batch)
        return logs, jax.tree.map(lambda p: p + 0.0 * busy[0, 0], params)

    guard = ciclo.terminate_on_nan(interval=60, state_every=1, file=out)
    _, _, elapsed = ciclo.loop(cnn_params(), cnn_data(), {ciclo.every(1): [slow_step, guard]})
    assert elapsed.steps in (NAN_AT + 1, NAN_AT + 2)
    assert f"NaN or inf in the state at step {NAN_AT};" in out.getvalue()


@pytest.mark.parametrize("managed", [True, False], ids=["managed", "plain-jit"])
@pytest.mark.parametrize("loss", sorted(LOSSES))
def test_rollback_on_nan_rolls_back_past_it_and_the_final_model_is_finite(loss, managed, tmp_path):
    state, step, params_of = state_and_step(LOSSES[loss], managed)
    ckpt = ciclo.checkpoint(tmp_path, keep=2, async_save=False)
    rollback = ciclo.rollback_on_nan(ckpt, state_every=None if managed else 1, verbose=False)
    tasks = {ciclo.every(1): [step, rollback], ciclo.every(5): ckpt}
    state, history, elapsed = ciclo.loop(state, cnn_data(), tasks, stop=STEPS)
    assert finite(params_of(state))
    assert elapsed.steps == STEPS
    # checkpoint 11 holds steps 0-10; batches 11-13 are skipped
    assert history.collect("fault_step", "skipped_from", "skipped_batches") == ([13], [11], [3])


def test_a_managed_step_logs_whether_its_parameters_are_finite():
    state, step, _ = state_and_step(cnn_loss, managed=True)
    data = cnn_data()
    logs, state = step(state, data[0])
    assert logs.outputs.params_finite.dtype == jnp.int32
    assert int(logs.outputs.params_finite) == 1
    logs, state = step(state, data[NAN_AT])
    assert np.isfinite(float(logs.losses.loss))
    assert int(logs.outputs.params_finite) == 0


def test_a_checkpoint_of_a_non_finite_state_says_so_at_once(tmp_path):
    ckpt = ciclo.checkpoint(tmp_path, async_save=False)

    def poison(state, batch):
        return None, state * batch

    with pytest.warns(RuntimeWarning, match="the state of step 2 holds NaN or inf; written"):
        ciclo.loop(jnp.ones(2), [1.0, np.nan], {ciclo.every(1): [poison, ckpt]})
    assert ckpt.all_steps() == [1, 2]  # written all the same


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"state_every": 0}, r"rollback_on_nan\(state_every=0\): expected an int >= 1 or None"),
        ({"state_every": 1.5}, r"state_every=1.5\): expected an int >= 1"),
    ],
)
def test_bad_state_every_is_named(kwargs, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        ciclo.rollback_on_nan(ciclo.checkpoint(tmp_path), **kwargs)
    with pytest.raises(ValueError, match=match.replace("rollback_on_nan", "terminate_on_nan")):
        ciclo.terminate_on_nan(**kwargs)


# --- a spike noticed late still has its pre-spike checkpoint ------------------------------
def test_a_spike_noticed_late_rolls_back_to_its_held_pre_spike_checkpoint(tmp_path):
    # Noticed only at the loop's end, 60 steps late: keep=2 would have evicted checkpoint 16.
    result = spike_training.run(str(tmp_path), look_seconds=1e9)
    assert result["fault_steps"] == [spike_training.SPIKE]
    assert result["steps"] == spike_training.STEPS
    np.testing.assert_allclose(result["w"], spike_training.TRUE_W, atol=0.05)


def test_without_the_hold_the_same_run_could_not_roll_back(tmp_path, monkeypatch):
    monkeypatch.setattr(_rollback.RollbackOnNaN, "_held", lambda self, steps: [False] * len(steps))
    result = spike_training.run(str(tmp_path), look_seconds=1e9)
    assert result["fault_steps"] == []  # "no finite checkpoint ... before it": no rollback


@pytest.mark.slow
@pytest.mark.parametrize("look_seconds", [0.1, 1e9], ids=["looks-every-0.1s", "at-the-end"])
def test_a_spike_rolls_back_in_every_fresh_process(tmp_path, look_seconds):
    for run in range(3):
        directory = tmp_path / str(run)
        done = subprocess.run(
            [sys.executable, str(HERE / "spike_training.py"), str(directory), str(look_seconds)],
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            env={"JAX_PLATFORMS": "cpu", "PATH": "", "PYTHONWARNINGS": "ignore"},
        )
        assert done.returncode == 0, done.stderr[-3000:]
        result = json.loads(done.stdout.strip().splitlines()[-1])
        assert result["fault_steps"] == [spike_training.SPIKE], (run, result)
        np.testing.assert_allclose(result["w"], spike_training.TRUE_W, atol=0.05)


def test_the_spike_median_forgets_the_warm_up(tmp_path):
    # A loss falling from 2.3 to 0.2 in 30 steps, flat for 15, then back to 2.3 (step 45):
    # 11 times the median of the last 20 values; 3.2 times that of all 45.
    losses = [*np.linspace(2.3, 0.2, 30).tolist(), *[0.2] * 15, 2.3, *[0.2] * 5]

    def step(state, batch):
        return ciclo.logs().add_loss("loss", batch), state + 1

    ckpt = ciclo.checkpoint(tmp_path, async_save=False)
    rollback = ciclo.rollback_on_nan(ckpt, spike=5, verbose=False)
    tasks = {ciclo.every(1): [step, rollback], ciclo.every(10): ckpt}
    _, history, _ = ciclo.loop(0, losses, tasks)
    assert history.collect("fault_step") == [45]


# --- two processes ----------------------------------------------------------------------
def run_pair(scenario: str):
    port = free_port()
    command = [sys.executable, str(HERE / "nan_guard_worker.py"), scenario]
    return run_on_loopback(
        [[*command, str(i), str(port)] for i in range(2)], devices_per_process=1, timeout=TIMEOUT
    )


@pytest.mark.slow
def test_a_time_bounded_evaluation_with_two_processes_is_refused_at_once():
    start = time.monotonic()
    codes, outputs, _ = run_pair("timed_test")
    assert time.monotonic() - start < TIMEOUT  # never a hang
    for code, output in zip(codes, outputs, strict=True):
        assert code != 0
        assert "test_duration=ciclo.at(time=0.05) (set 'test'): with several" in output, output


@pytest.mark.slow
def test_terminate_on_nan_with_two_processes_prints_one_line_naming_the_process():
    codes, outputs, _ = run_pair("nan")
    assert codes == [0, 0], outputs
    lines = [line for line in outputs[0].splitlines() if line.startswith("terminate_on_nan")]
    steps = int(outputs[0].split("steps ")[-1].split()[0])
    assert steps <= 10 + 4  # the NaN of step 10, stopped within the agreement's few steps
    assert lines == [
        f"terminate_on_nan: NaN or inf in losses.loss, the parameters at step 10 on process "
        f"{lines[0].split('on process ')[1][0]}; training stopped after step {steps - 1}."
    ]
    assert "terminate_on_nan" not in outputs[1]  # printed by process 0 only


# --- an evaluation far longer than the training before it ---------------------------------
def test_an_evaluation_far_longer_than_the_training_before_it_warns(monkeypatch):
    monkeypatch.setattr(_train, "EVALUATION_WARN_SECONDS", 0.2)

    def test_step(state, batch):
        time.sleep(0.01)
        return ciclo.logs().add_metric("m", batch)

    def endless():
        while True:  # stopped by the test_duration below, as a watchdog would
            yield 1.0

    with pytest.warns(RuntimeWarning, match=r"evaluating test_dataset at step 2 takes over 10 "):
        ciclo.train_loop(
            0,
            [1.0, 2.0],
            {ciclo.on_train_step: lambda state: state + 1, ciclo.on_test_step: test_step},
            test_dataset=endless,
            test_duration=50,  # 0.5 s
        )
