"""ciclo.checkpoint, ciclo.restore / restore_best and loop(resume=...), in process.

The subprocess kill tests are in test_checkpoint_kill.py; the loop hooks the checkpoint
relies on (at_step_end, __loop_end__, graceful SIGTERM) in test_checkpoint_loop.py.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import ciclo

sys.path.insert(0, str(Path(__file__).parent))
import checkpoint_training as training


def save_once(directory: Path, state: Any, **options: Any) -> ciclo.callbacks.Checkpoint:
    """A one-step loop that only saves ``state`` when it ends."""
    ckpt = ciclo.checkpoint(directory, **options)
    ciclo.loop(state, [np.zeros((1,))], {ciclo.never(): ckpt})
    return ckpt


# --- exact resume -----------------------------------------------------------------------------
@pytest.mark.parametrize("data", ["list", "generator", "stateful"])
def test_stop_then_resume_equals_an_uninterrupted_run(tmp_path: Path, data: str) -> None:
    # Stopping after step 6 (between the periodic checkpoints at 5 and 9) and resuming
    # must give the same state, history and counts, bit for bit, whatever way the
    # dataset is skipped: by index (list), by replay (generator) or by state_dict.
    training.run(str(tmp_path), data=data, stop=6)
    resumed = training.fingerprint(*training.run(str(tmp_path), data=data, resume=True))
    expected = training.reference()
    assert {k: resumed[k] == expected[k] for k in expected} == dict.fromkeys(expected, True)


def test_resume_restores_schedules_and_stateful_callbacks(tmp_path: Path) -> None:
    state = {"x": jnp.zeros(())}
    counter = training.SampleCounter()
    tasks = {ciclo.every(samples=7): counter, ciclo.every(100): ciclo.checkpoint(tmp_path)}
    data = [training.make_batch(i) for i in range(10)]
    ciclo.loop(state, data, tasks, stop=5, batch_size_fn=training.batch_size)
    schedule = next(iter(tasks))
    saved = (schedule.state_dict(), counter.state_dict())
    assert saved[1] == {"seen": 4, "calls": 2}

    fresh_counter = training.SampleCounter()
    fresh = {ciclo.every(samples=7): fresh_counter, ciclo.every(100): ciclo.checkpoint(tmp_path)}
    ciclo.loop(state, data, fresh, stop=5, resume=tmp_path)  # only restores
    assert (next(iter(fresh)).state_dict(), fresh_counter.state_dict()) == saved


def test_resume_from_an_empty_or_missing_directory_starts_afresh(tmp_path: Path) -> None:
    for directory in (tmp_path / "none", tmp_path):
        tasks = {ciclo.every(1): lambda state: state + 1}
        state, _history, elapsed = ciclo.loop(0, range(3), tasks, resume=directory)
        assert (state, elapsed.steps) == (3, 3)


def test_resume_with_different_tasks_is_a_clear_error(tmp_path: Path) -> None:
    ckpt = ciclo.checkpoint(tmp_path)
    ciclo.loop(0, range(3), {ciclo.every(1): lambda s: s + 1, ciclo.every(2): ckpt})
    other = {ciclo.every(1): lambda s: s + 1}
    with pytest.raises(ValueError, match=r"written by a loop with 2 tasks; this loop has 1"):
        ciclo.loop(0, range(5), other, resume=tmp_path)


def test_resuming_with_a_ledger_the_run_did_not_have_names_it(tmp_path: Path) -> None:
    tasks = {ciclo.every(1): lambda s: s + 1, ciclo.every(2): ciclo.checkpoint(tmp_path)}
    ciclo.loop(0, range(3), tasks, stop_signals=())
    with pytest.raises(
        ValueError,
        match=r"this loop has a ledger \(ciclo.goodput\), checkpoint \d+ .* has none\. Resume "
        r"with the same tasks",
    ):
        ciclo.loop(0, range(5), {**tasks, **ciclo.goodput()}, resume=tmp_path)


def test_resume_after_the_run_finished_does_nothing_more(tmp_path: Path) -> None:
    tasks = {ciclo.every(1): lambda s: s + 1, ciclo.every(10): ciclo.checkpoint(tmp_path)}
    ciclo.loop(0, range(4), tasks)
    calls = []
    state, _, elapsed = ciclo.loop(0, range(4), tasks, resume=tmp_path, on_end=calls.append)
    # A finished run returns at once: no step, and no on_end either (issue 27).
    assert (state, elapsed.steps, len(calls)) == (4, 4, 0)


def test_on_start_logs_are_not_recorded_twice(tmp_path: Path) -> None:
    def on_start() -> Any:
        return ciclo.logs().add_metric("started", 1)

    tasks = {ciclo.every(1): lambda s: s + 1, ciclo.every(10): ciclo.checkpoint(tmp_path)}
    ciclo.loop(0, range(6), tasks, stop=2, on_start=on_start)
    _, history, _ = ciclo.loop(0, range(6), tasks, on_start=on_start, resume=tmp_path)
    assert history.collect("steps", "started") == ([0], [1])


# --- what restore gives back ----------------------------------------------------------------
def test_restore_returns_the_saved_state_history_and_elapsed(tmp_path: Path) -> None:
    state, history, elapsed = training.run(str(tmp_path))
    restored = ciclo.restore(tmp_path, training.init_state())
    assert np.asarray(restored.state["w"]).tobytes() == np.asarray(state["w"]).tobytes()
    assert restored.history.collect("steps", "loss") == history.collect("steps", "loss")
    assert (restored.elapsed.steps, restored.elapsed.samples) == (elapsed.steps, elapsed.samples)
    # keep=2: the two latest checkpoints remain; an older one can be asked for by step.
    assert ciclo.checkpoint(tmp_path).all_steps() == [13, 16]
    older = ciclo.restore(tmp_path, training.init_state(), step=13)
    assert older.elapsed.steps == 13
    assert len(older.history) == 13


def test_restore_keeps_the_sharding_of_the_target(tmp_path: Path) -> None:
    mesh = Mesh(np.array(jax.devices()), ("data",))
    sharded = NamedSharding(mesh, P("data"))
    replicated = NamedSharding(mesh, P())
    w = jnp.arange(16.0).reshape(8, 2)
    save_once(tmp_path, {"w": jax.device_put(w, sharded), "b": jnp.ones(2)})

    for sharding in (sharded, replicated):
        target = {"w": jax.device_put(jnp.zeros((8, 2)), sharding), "b": jnp.zeros(2)}
        restored = ciclo.restore(tmp_path, target).state
        assert restored["w"].sharding == sharding
        np.testing.assert_array_equal(restored["w"], w)
    restored = ciclo.restore(tmp_path, {"w": jnp.zeros((8, 2)), "b": jnp.zeros(2)}).state
    assert not restored["w"].committed  # an uncommitted target restores uncommitted


def test_leaves_orbax_cannot_store_come_from_the_target(tmp_path: Path) -> None:
    def relu(x: Any) -> Any:
        return x

    state = {
        "name": "run-1",
        "act": relu,
        "n": 3,
        "flag": True,
        "lr": np.float32(0.5),
        "empty": np.zeros((0, 3)),
        "table": np.arange(3),
        "key": jax.random.key(7),
        "none": None,
    }
    save_once(tmp_path, state)
    target = {
        **state,
        "name": "run-2",
        "n": 0,
        "flag": False,
        "lr": np.float32(0),
        "table": np.zeros(3, int),
        "key": jax.random.key(0),
    }
    restored = ciclo.restore(tmp_path, target).state
    assert restored["name"] == "run-2"
    assert restored["act"] is relu
    assert restored["none"] is None
    assert (restored["n"], restored["flag"]) == (3, True)
    assert type(restored["lr"]) is np.float32
    assert restored["lr"] == 0.5
    np.testing.assert_array_equal(restored["table"], np.arange(3))
    assert restored["empty"].shape == (0, 3)
    np.testing.assert_array_equal(
        jax.random.key_data(restored["key"]), jax.random.key_data(jax.random.key(7))
    )


def test_a_lone_array_or_scalar_state_is_saved(tmp_path: Path) -> None:
    save_once(tmp_path / "a", jnp.arange(3.0))
    np.testing.assert_array_equal(ciclo.restore(tmp_path / "a", jnp.zeros(3)).state, [0, 1, 2])
    save_once(tmp_path / "b", 5)
    assert ciclo.restore(tmp_path / "b", 0).state == 5


def test_restore_into_a_state_of_another_structure_names_the_leaves(tmp_path: Path) -> None:
    save_once(tmp_path, {"params": {"w": jnp.zeros((3, 2)), "b": jnp.zeros(2)}})
    with pytest.raises(ValueError, match=r"not in the state: \[\"\['params'\]\['b'\]\"\]"):
        ciclo.restore(tmp_path, {"params": {"w": jnp.zeros((3, 2))}})
    with pytest.raises(ValueError, match=r"not in the checkpoint: \[\"\['params'\]\['c'\]\"\]"):
        ciclo.restore(tmp_path, {"params": {"w": jnp.zeros((3, 2)), "b": 0, "c": 0}})
    with pytest.raises(
        ValueError, match=r"\['params'\]\['w'\]: shape \(3, 2\) float32 in the checkpoint, \(2, 3\)"
    ):
        ciclo.restore(tmp_path, {"params": {"w": jnp.zeros((2, 3)), "b": jnp.zeros(2)}})
    with pytest.raises(ValueError, match=r"\['params'\]\['b'\]: the checkpoint holds a float32"):
        ciclo.restore(tmp_path, {"params": {"w": jnp.zeros((3, 2)), "b": "bias"}})


def test_restore_from_a_missing_or_empty_directory_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"checkpoint directory .*nowhere.* does not exist"):
        ciclo.restore(tmp_path / "nowhere", {})
    with pytest.raises(FileNotFoundError, match=r"holds no checkpoint"):
        ciclo.restore(tmp_path, {})
    (tmp_path / "file").write_text("")
    with pytest.raises(NotADirectoryError, match=r"is a file"):
        ciclo.restore(tmp_path / "file", {})
    save_once(tmp_path / "run", {"x": jnp.zeros(())})
    with pytest.raises(FileNotFoundError, match=r"no checkpoint of step 7 .* holds steps \[1\]"):
        ciclo.restore(tmp_path / "run", {"x": jnp.zeros(())}, step=7)


# --- the callback's options and errors ---------------------------------------------------------
def _writable(directory: Path) -> bool:
    try:
        (directory / "probe").touch()
    except OSError:
        return False
    (directory / "probe").unlink()
    return True


def test_an_unwritable_directory_is_an_error_at_once(tmp_path: Path) -> None:
    readonly = tmp_path / "readonly"
    readonly.mkdir()
    readonly.chmod(0o555)
    if _writable(readonly):  # root ignores permissions; /sys refuses even root
        readonly = Path("/sys")
        if not readonly.is_dir() or _writable(readonly):
            pytest.skip("no unwritable directory available")
    with pytest.raises(PermissionError, match=r"checkpoint directory .* is not writable"):
        ciclo.checkpoint(readonly)
    with pytest.raises(PermissionError, match=r"checkpoint directory .* cannot be created"):
        ciclo.checkpoint(readonly / "sub")
    (tmp_path / "file").write_text("")
    with pytest.raises(NotADirectoryError, match=r"is a file"):
        ciclo.checkpoint(tmp_path / "file")


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"keep": 0}, r"keep must be a positive int"),
        ({"mode": "lowest"}, r"mode must be 'min'"),
        ({"monitor": 3}, r"monitor must be the name of a log entry"),
    ],
)
def test_bad_options_are_clear_errors(tmp_path: Path, options: Any, match: str) -> None:
    with pytest.raises((TypeError, ValueError), match=match):
        ciclo.checkpoint(tmp_path, **options)


def test_a_monitor_never_logged_is_a_clear_error(tmp_path: Path) -> None:
    def train_step(state: Any) -> Any:
        return ciclo.logs().add_loss("loss", 1.0), state

    ckpt = ciclo.checkpoint(tmp_path, monitor="val_loss")
    with pytest.raises(KeyError, match=r"no log entry 'val_loss' by step 1.*'losses.loss'"):
        ciclo.loop(0, range(3), {ciclo.every(1): train_step, ciclo.every(2): ckpt})
    assert ckpt.all_steps() == []


def test_keep_the_best_by_monitor_plus_the_latest(tmp_path: Path) -> None:
    losses = [5.0, 1.0, 4.0, 0.5, 3.0]

    def train_step(state: Any, batch: Any, elapsed: ciclo.Elapsed) -> Any:
        return ciclo.logs().add_loss("loss", losses[elapsed.steps]), state + 1

    ckpt = ciclo.checkpoint(tmp_path, keep=2, monitor="loss", mode="min")
    ciclo.loop(0, range(5), {ciclo.every(1): [train_step, ckpt]})
    # checkpoint n holds the state after n steps, ranked by the loss of step n - 1
    assert ckpt.all_steps() == [2, 4, 5]
    assert ciclo.restore_best(ckpt, 0).state == 4  # a checkpoint is path-like
    best_max = ciclo.checkpoint(tmp_path / "max", keep=1, monitor="losses.loss", mode="max")
    ciclo.loop(0, range(5), {ciclo.every(1): [train_step, best_max]})
    assert best_max.all_steps() == [1, 5]
    assert ciclo.restore_best(tmp_path / "max", 0).state == 1


def test_restore_best_without_a_monitor_is_a_clear_error(tmp_path: Path) -> None:
    save_once(tmp_path, {"x": jnp.zeros(())})
    with pytest.raises(ValueError, match=r"no checkpoint in .* has a monitored value"):
        ciclo.restore_best(tmp_path, {"x": jnp.zeros(())})


def test_a_directory_with_checkpoints_of_later_steps_is_an_error(tmp_path: Path) -> None:
    ciclo.loop(0, range(5), {ciclo.every(10): ciclo.checkpoint(tmp_path)})
    with pytest.raises(FileExistsError, match=r"later steps \[5\] than this run's step 1"):
        ciclo.loop(0, range(5), {ciclo.every(10): ciclo.checkpoint(tmp_path)})


def test_callback_state_that_json_cannot_hold_is_a_clear_error(tmp_path: Path) -> None:
    class Bad:
        def __call__(self) -> None:
            return None

        def state_dict(self) -> dict[str, Any]:
            return {"when": object()}

        def load_state_dict(self, state: Any) -> None:
            pass

    with pytest.raises(TypeError, match=r"state_dict\(\) of callback .*Bad\['when'\].*object"):
        ciclo.loop(0, range(2), {ciclo.every(1): [Bad(), ciclo.checkpoint(tmp_path)]})


def _failing_finalize(monkeypatch: pytest.MonkeyPatch) -> None:
    """Makes every background commit of orbax fail, as a full disk would."""
    from orbax.checkpoint._src.path import atomicity

    async def finalize(self: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomicity.AtomicRenameTemporaryPath, "finalize", finalize)


def test_a_failed_background_save_is_raised_at_the_next_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _failing_finalize(monkeypatch)
    steps = []
    tasks = {
        ciclo.every(1): lambda s, b, e: steps.append(e.steps),
        ciclo.every(2): ciclo.checkpoint(tmp_path),
    }
    with pytest.raises(RuntimeError, match=r"writing checkpoint 1 .* failed.*No space"):
        ciclo.loop(0, range(10), tasks)
    assert steps == [0, 1, 2]  # raised by the checkpoint's next call, at step 2


def test_a_failed_background_save_is_raised_at_the_loop_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _failing_finalize(monkeypatch)
    ended = []
    with pytest.raises(RuntimeError, match=r"writing checkpoint 3 .* failed"):
        ciclo.loop(0, range(3), {ciclo.never(): ciclo.checkpoint(tmp_path)}, on_end=ended.append)
    assert ended == []


def test_synchronous_saves(tmp_path: Path) -> None:
    ckpt = ciclo.checkpoint(tmp_path, async_save=False, keep=None)
    ciclo.loop(0, range(4), {ciclo.every(1): lambda s: s + 1, ciclo.every(2): ckpt})
    assert ckpt.all_steps() == [1, 3, 4]
    assert ciclo.restore(tmp_path, 0, step=3).state == 3


# --- History.state_dict ----------------------------------------------------------------------
def test_history_state_dict_round_trips_every_kind_of_column() -> None:
    history = ciclo.history()
    elapsed = ciclo.Elapsed.create()
    for i in range(6):
        logs = ciclo.logs().add_loss("loss", jnp.float32(i / 3))
        if i % 2:
            logs.add_metric("acc", i)  # sparse, ints
        if i == 3:
            logs.add_output("pred", np.arange(3))  # one array
        logs.add_entry("info", "tag", "ok" if i < 4 else True)  # a list column
        history.commit(elapsed, logs)
        elapsed = elapsed.update(2)
    copy = ciclo.history()
    copy.load_state_dict(history.state_dict())
    for key in ("steps", "samples", "time", "loss", "acc", "tag"):
        assert copy.collect("steps", key) == history.collect("steps", key)
    np.testing.assert_array_equal(copy.collect("pred")[0], np.arange(3))
    assert len(copy) == 6
    assert copy[3]["metrics"] == {"acc": 3}
    copy.commit(elapsed, ciclo.logs().add_metric("acc", 7))  # still appendable
    assert copy.collect("steps", "acc") == ([1, 3, 5, 6], [1, 3, 5, 7])


# --- train_loop ---------------------------------------------------------------------------------
@jax.jit
def _test_step(state: Any, batch: Any) -> Any:
    x, size = batch
    rows = jnp.arange(4) < size
    loss = jnp.sum(jnp.where(rows, (x @ state["w"] - 1.0) ** 2, 0.0)) / size
    return ciclo.logs().add_metric("loss", loss)


def _train(
    directory: Path, *, stop: int, resume: bool = False, epoch: int | None = 4
) -> tuple[Any, ...]:
    ckpt = ciclo.checkpoint(directory, monitor="loss_test")
    stopper = ciclo.early_stopping(
        "loss_test", patience=100, restore_best_weights=True, verbose=False
    )
    state, history, elapsed = ciclo.train_loop(
        training.init_state(),
        training.dataset("list"),
        {ciclo.on_train_step: training.train_step, ciclo.on_test_step: _test_step},
        callbacks=[ckpt, stopper],
        test_dataset=lambda: [training.make_batch(i) for i in range(3)],
        epoch_duration=epoch,
        stop=stop,
        batch_size_fn=training.batch_size,
        resume=directory if resume else None,
    )
    return training.fingerprint(state, history, elapsed), stopper, ckpt


def test_train_loop_resumes_exactly_with_early_stopping_state(tmp_path: Path) -> None:
    expected, expected_stopper, _ = _train(tmp_path / "straight", stop=training.STEPS)
    _train(tmp_path / "run", stop=6)  # stops mid-epoch (epochs end after steps 4, 8, ...)
    resumed, stopper, ckpt = _train(tmp_path / "run", stop=training.STEPS, resume=True)
    assert {k: resumed[k] == expected[k] for k in expected} == dict.fromkeys(expected, True)
    # early stopping's state (its best value and best state) came back with the run
    assert stopper.best == expected_stopper.best
    assert stopper.best_step == expected_stopper.best_step
    best, expected_best = stopper.best_weights, expected_stopper.best_weights
    assert np.asarray(best["w"]).tobytes() == np.asarray(expected_best["w"]).tobytes()
    assert best["w"].sharding == expected_best["w"].sharding
    # one checkpoint per epoch end (monitored) plus the latest, ranked by loss_test
    assert ckpt.all_steps()[-1] == training.STEPS


def test_train_loop_with_one_epoch_saves_its_evaluation(tmp_path: Path) -> None:
    _, _, ckpt = _train(tmp_path, stop=8, epoch=None)
    # the evaluation runs in on_end; the checkpoint it asks for replaces the loop-end one
    assert ckpt.all_steps() == [8]
    restored = ciclo.restore_best(tmp_path, training.init_state())
    assert restored.elapsed.steps == 8
    assert restored.history.collect("steps", "loss_test")[0] == [8]


# --- fused steps --------------------------------------------------------------------------------
@ciclo.managed.train_step
def _managed_step(state: Any, batch: Any) -> Any:
    x, y = batch
    return ciclo.logs().add_loss("loss", jnp.mean((x @ state.params["w"] - y) ** 2)), state


def test_fused_managed_steps_resume_exactly(tmp_path: Path) -> None:
    import optax

    rng = np.random.default_rng(0)
    batches = [
        (rng.normal(size=(8, 4)).astype(np.float32), rng.normal(size=8).astype(np.float32))
        for _ in range(10)
    ]

    def run(directory: Path, stop: int, resume: bool = False) -> Any:
        state = ciclo.managed.ManagedState.create(
            params={"w": jnp.zeros(4)}, tx=optax.sgd(0.1, momentum=0.9), strategy="jit"
        ).with_strategy("jit", steps_per_call=2)  # 2 steps per compiled call
        tasks = {ciclo.every(1): _managed_step, ciclo.every(4): ciclo.checkpoint(directory)}
        return ciclo.loop(state, batches, tasks, stop=stop, resume=directory if resume else None)

    expected, expected_history, _ = run(tmp_path / "straight", 10)
    # Stopping after step 5 cuts the group of steps 5-6: the resumed run groups 6-7, 8, 9.
    run(tmp_path / "run", 6)
    state, history, elapsed = run(tmp_path / "run", 10, resume=True)
    assert elapsed.steps == 10
    for leaf, expected_leaf in zip(jax.tree.leaves(state), jax.tree.leaves(expected), strict=True):
        assert np.asarray(leaf).tobytes() == np.asarray(expected_leaf).tobytes()
    assert history.collect("steps", "loss") == expected_history.collect("steps", "loss")


def test_train_loop_resumes_epochs_counted_in_samples(tmp_path: Path) -> None:
    # Batches of 2, 3, 4, 2... samples and epochs of 7 samples: step 2 ends an epoch
    # (9 samples) without the count landing on a multiple of 7, so only the saved epoch
    # clock knows that step 3 begins one.
    def run(directory: Path, stop: int, resume: bool = False) -> ciclo.History:
        def begin(state: Any, batch: Any, elapsed: ciclo.Elapsed) -> Any:
            return ciclo.logs().add_metric("begins", elapsed.steps)

        _, history, _ = ciclo.train_loop(
            training.init_state(),
            training.dataset("list"),
            {ciclo.on_train_step: training.train_step, ciclo.on_epoch_begin: begin},
            callbacks=[ciclo.checkpoint(directory)],
            epoch_duration=ciclo.at(samples=7),
            stop=stop,
            batch_size_fn=training.batch_size,
            resume=directory if resume else None,
        )
        return history

    expected = run(tmp_path / "straight", 8).collect("begins")
    run(tmp_path / "run", 3)
    assert run(tmp_path / "run", 8, resume=True).collect("begins") == expected == [0, 3, 5]
