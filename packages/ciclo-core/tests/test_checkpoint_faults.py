"""Nothing lost: damaged checkpoints, non-finite states, one writer per directory, a
background save error that ends the run (issue "nothing lost, every mistake named")."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ciclo
from ciclo._checkpoint import _lock

sys.path.insert(0, str(Path(__file__).parent))
import checkpoint_training as training


# --- a damaged latest checkpoint -------------------------------------------------------------
def _truncate(directory: Path) -> None:
    for path in (directory / "state").rglob("*"):
        if path.is_file():
            with open(path, "r+b") as f:
                f.truncate(path.stat().st_size // 2)


def _remove_state(directory: Path) -> None:
    shutil.rmtree(directory / "state")


def _bad_json(directory: Path) -> None:
    (directory / "meta" / "metadata").write_text('{"format": 1, "elapsed": ')


def _truncate_every_file(directory: Path) -> None:
    """orbax's own files too (``_CHECKPOINT_METADATA``, the ``metrics`` item), which orbax
    reads when it opens the directory."""
    for path in directory.rglob("*"):
        if path.is_file():
            with open(path, "r+b") as f:
                f.truncate(path.stat().st_size // 2)


def _remove_orbax_metadata(directory: Path) -> None:
    (directory / "_CHECKPOINT_METADATA").unlink()


DAMAGES = {
    "missing orbax metadata": _remove_orbax_metadata,
    "truncated files": _truncate,
    "missing state": _remove_state,
    "bad JSON": _bad_json,
    "every file truncated": _truncate_every_file,
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_damaged_latest_checkpoint_falls_back_and_the_resumed_run_is_exact(
    tmp_path: Path, damage: str
) -> None:
    directory = tmp_path / "run"
    training.run(str(directory), stop=14)  # checkpoints 9, 13 and 14 (the end): keep=2
    assert sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit()) == [13, 14]
    DAMAGES[damage](directory / "14")
    with pytest.warns(RuntimeWarning) as warned:
        resumed = training.fingerprint(*training.run(str(directory), resume=True))
    messages = [str(w.message) for w in warned]
    assert any(
        "passing over damaged checkpoint 14" in m and "Nothing is deleted" in m for m in messages
    )
    assert any("[14]" in m and "set aside as ['14.damaged'] (not deleted)" in m for m in messages)
    assert resumed == training.reference()
    assert (directory / "14.damaged").is_dir()  # set aside when step 14 was written anew


@pytest.mark.parametrize("damage", ["missing orbax metadata", "every file truncated"])
def test_orbax_logs_nothing_about_a_step_that_ciclo_passes_over(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Issue 28: orbax's "Metadata file does not exist" / "Failed to json parse Metadata
    # file" about the step ciclo passes over (and sets aside) were shown on resume.
    directory = tmp_path / "run"
    training.run(str(directory), stop=14)
    DAMAGES[damage](directory / "14")
    with caplog.at_level("INFO"), pytest.warns(RuntimeWarning) as warned:
        training.run(str(directory), resume=True)
    assert any("passing over damaged checkpoint 14" in str(w.message) for w in warned)
    about_it = [r.getMessage() for r in caplog.records if "/14/" in r.getMessage()]
    assert not [m for m in about_it if "Metadata" in m], about_it
    assert (directory / "14.damaged").is_dir()


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_restore_of_a_damaged_step_names_the_step_the_file_and_the_fix(
    tmp_path: Path, damage: str
) -> None:
    training.run(str(tmp_path), stop=14)
    DAMAGES[damage](tmp_path / "14")
    with pytest.raises(ValueError, match=r"checkpoint 14 in .* is damaged: cannot read '.*14.*'"):
        ciclo.restore(tmp_path, training.init_state(), step=14)
    with pytest.warns(RuntimeWarning, match="passing over damaged checkpoint 14"):
        _, _, elapsed = ciclo.restore(tmp_path, training.init_state())
    assert elapsed.steps == 13
    assert (tmp_path / "14").is_dir()  # nothing is deleted


def test_every_checkpoint_damaged_is_an_error_naming_the_newest(tmp_path: Path) -> None:
    training.run(str(tmp_path), stop=14)
    _bad_json(tmp_path / "13")
    _bad_json(tmp_path / "14")
    with (
        pytest.warns(RuntimeWarning, match="damaged"),
        pytest.raises(ValueError, match=r"checkpoint 14 .* is damaged.*move .* away"),
    ):
        ciclo.restore(tmp_path, training.init_state())


# --- a non-finite state never replaces a finite one ------------------------------------------
def _nan_run(directory: Path, keep: int = 1) -> tuple[Any, ciclo.History, ciclo.Elapsed]:
    def step(state: Any, batch: Any) -> Any:
        w = state["w"] + 1.0 if batch < 5 else state["w"] * jnp.nan
        return ciclo.logs().add_loss("loss", w.sum()), {"w": w}

    ckpt = ciclo.checkpoint(directory, keep=keep)
    tasks = {ciclo.every(1): [step, ciclo.terminate_on_nan()], ciclo.every(2): ckpt}
    with pytest.warns(RuntimeWarning, match=r"the state of step \d+ holds NaN or inf; written"):
        return ciclo.loop({"w": jnp.zeros(2)}, list(range(10)), tasks)


def test_a_nan_stop_with_keep_1_keeps_the_finite_checkpoint_and_restore_returns_it(
    tmp_path: Path,
) -> None:
    _nan_run(tmp_path, keep=1)
    steps = ciclo.checkpoint(tmp_path).all_steps()
    assert steps[0] == 5  # the last finite one
    assert len(steps) == 2  # and the NaN stop
    with pytest.warns(
        RuntimeWarning, match=r"checkpoints \[\d+\] .* non-finite .* reading checkpoint 5"
    ):
        state, _, elapsed = ciclo.restore(tmp_path, {"w": jnp.zeros(2)})
    assert elapsed.steps == 5
    assert np.isfinite(np.asarray(state["w"])).all()
    state, _, _ = ciclo.restore(tmp_path, {"w": jnp.zeros(2)}, step=steps[1])  # readable
    assert np.isnan(np.asarray(state["w"])).all()


def test_resume_after_a_nan_stop_starts_from_the_newest_finite_checkpoint(tmp_path: Path) -> None:
    _nan_run(tmp_path, keep=2)

    def step(state: Any, batch: Any) -> Any:  # the fix: no NaN any more
        return ciclo.logs().add_loss("loss", state["w"].sum()), {"w": state["w"] + 1.0}

    tasks = {ciclo.every(1): step, ciclo.every(2): ciclo.checkpoint(tmp_path, keep=2)}
    # A run the NaN guard ended stays finished unless resume_stopped=True (issue 27).
    with pytest.warns(RuntimeWarning, match="non-finite"):
        state, _, elapsed = ciclo.loop(
            {"w": jnp.zeros(2)}, list(range(10)), tasks, resume=tmp_path, resume_stopped=True
        )
    assert elapsed.steps == 10
    np.testing.assert_array_equal(state["w"], [10.0, 10.0])
    assert any(p.name.endswith(".nonfinite") for p in tmp_path.iterdir())  # set aside


# --- one writer per directory -----------------------------------------------------------------
WRITER = textwrap.dedent(
    """
    import os, sys, time
    import jax.numpy as jnp, numpy as np
    import ciclo

    hold = sys.argv[3] if len(sys.argv) > 3 else None

    def slow(state, batch):
        time.sleep(0.1)
        print("step", flush=True)
        while hold is not None and os.path.exists(hold):  # until the test lets it go on
            time.sleep(0.02)
        return None, state + 1.0

    ckpt = ciclo.checkpoint(sys.argv[1], keep=2)
    ciclo.loop(jnp.zeros(4), range(int(sys.argv[2])), {ciclo.every(1): slow, ciclo.every(5): ckpt})
    print("done", flush=True)
    """
)


def _writer(directory: Path, steps: int, *hold: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, str(directory), str(steps), *map(str, hold)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )


@pytest.mark.slow
def test_a_second_writer_fails_at_once_and_the_first_finishes_intact(tmp_path: Path) -> None:
    # The first run holds at its first step until the second has failed: however slow the
    # second's start (importing JAX), the first has not finished and released the lock.
    hold = tmp_path.with_name(f"{tmp_path.name}.hold")
    hold.touch()
    first = _writer(tmp_path, 40, hold)
    try:
        assert first.stdout is not None
        assert first.stdout.readline().startswith("step")  # the first run writes
        start = time.monotonic()
        second = _writer(tmp_path, 40)
        _, err = second.communicate(timeout=60)
        assert time.monotonic() - start < 10
        assert second.returncode != 0
        assert f"checkpoint directory {str(tmp_path)!r} is in use by another run" in err
        assert f"process {first.pid} on host" in err
        hold.unlink()  # the first run goes on
        out, err = first.communicate(timeout=120)
    finally:
        hold.unlink(missing_ok=True)
        first.kill()
    assert first.returncode == 0, err
    assert out.rstrip().endswith("done")
    state, _, elapsed = ciclo.restore(tmp_path, jnp.zeros(4))
    assert elapsed.steps == 40
    assert float(state[0]) == 40.0
    assert not (tmp_path / _lock.LOCK_NAME).exists()  # released at the loop's end


def test_a_stale_lock_of_a_dead_process_is_taken_over_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    import socket

    lock = {"host": socket.gethostname(), "pid": int(dead.stdout), "since": 0.0}
    (tmp_path / _lock.LOCK_NAME).write_text(json.dumps(lock))
    with caplog.at_level("WARNING", logger="ciclo"):
        ckpt = ciclo.checkpoint(tmp_path)
    assert f"stale lock of checkpoint directory {str(tmp_path)!r}" in caplog.text
    assert json.loads((tmp_path / _lock.LOCK_NAME).read_text())["pid"] == os.getpid()
    ckpt.close()
    assert not (tmp_path / _lock.LOCK_NAME).exists()


def test_a_lock_of_another_host_is_in_use(tmp_path: Path) -> None:
    lock = {"host": "elsewhere", "pid": 1, "since": 0.0}
    (tmp_path / _lock.LOCK_NAME).write_text(json.dumps(lock))
    with pytest.raises(
        RuntimeError,
        match=r"in use by another run: process 1 on host 'elsewhere'.*delete the lock",
    ):
        ciclo.checkpoint(tmp_path)


# --- a background save error ends the run promptly --------------------------------------------
READ_ONLY = textwrap.dedent(
    """
    import os, subprocess, sys, time
    import jax.numpy as jnp
    import ciclo

    directory, how = sys.argv[1], sys.argv[2]

    ckpt = ciclo.checkpoint(directory, keep=None)

    def make_read_only(state, batch, elapsed):
        if elapsed.steps == 2:
            ckpt.wait()  # the first save is on disk
            if how == "mount":
                subprocess.run(["mount", "-o", "remount,ro", directory], check=True)
            else:
                os.chmod(directory, 0o555)
        time.sleep(0.05)

    tasks = {
        ciclo.every(1): [lambda state, batch: (None, state + 1.0), make_read_only],
        ciclo.every(3): ckpt,
    }
    ciclo.loop(jnp.zeros(1000), range(1000), tasks)
    """
)


@pytest.mark.slow
def test_a_directory_turning_read_only_ends_the_process_with_the_error(tmp_path: Path) -> None:
    directory = tmp_path / "run"
    directory.mkdir()
    how = "chmod"
    if os.geteuid() == 0:  # root writes to a read-only directory: remount a tmpfs instead
        how = "mount"
        if subprocess.run(["mount", "-t", "tmpfs", "none", str(directory)]).returncode:
            pytest.skip("running as root without mount: cannot make a directory read-only")
    try:
        start = time.monotonic()
        run = subprocess.run(
            [sys.executable, "-c", READ_ONLY, str(directory), how],
            capture_output=True,
            text=True,
            timeout=30,
            env={**os.environ, "JAX_PLATFORMS": "cpu"},
        )
        assert time.monotonic() - start < 30
    finally:
        if how == "mount":
            subprocess.run(["umount", str(directory)])
        else:
            os.chmod(directory, 0o755)
    assert run.returncode != 0
    assert "ciclo.checkpoint: writing checkpoint 4" in run.stderr
    assert "Make the directory writable" in run.stderr


def test_a_background_save_error_surfaces_at_the_next_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orbax.checkpoint._src.path import atomicity

    async def finalize(self: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomicity.AtomicRenameTemporaryPath, "finalize", finalize)
    seen: list[int] = []
    ckpt = ciclo.checkpoint(tmp_path)

    def step(state: Any, batch: Any, elapsed: ciclo.Elapsed) -> Any:
        seen.append(elapsed.steps)
        if elapsed.steps == 1:  # the background write fails meanwhile: all_steps waits for
            ckpt.all_steps()  # it to end (keeping its error), however slow the writer thread
        return None, state + 1.0

    tasks = {ciclo.every(1): step, ciclo.every(1000): ckpt}
    with pytest.raises(RuntimeError, match=r"writing checkpoint 1 .* failed"):
        ciclo.loop(jnp.zeros(2), range(50), tasks)
    assert len(seen) <= 3  # not at the next checkpoint (step 1000): within a step or two


# --- a second Ctrl-C during the final save ends the process quietly ------------------------------
SLOW_FINAL_SAVE = textwrap.dedent(
    """
    import asyncio, re, sys, time
    import jax, jax.numpy as jnp
    import ciclo
    from orbax.checkpoint._src.handlers import base_pytree_checkpoint_handler as handler

    directory, marker = sys.argv[1], sys.argv[2]
    write_metadata = handler.BasePyTreeCheckpointHandler._write_metadata_after_commits

    async def slow(self, *args, **kwargs):  # the final save's metadata waits 2 s
        where = str(jax.tree.leaves(kwargs["param_infos"])[0].parent_dir)
        if re.search(r"/(\\d+)\\.orbax", where).group(1) != "1":
            open(marker, "w").close()
            await asyncio.sleep(2)
        await write_metadata(self, *args, **kwargs)

    handler.BasePyTreeCheckpointHandler._write_metadata_after_commits = slow

    def step(state, batch):
        print("step", flush=True)
        time.sleep(0.02)
        return None, state + 1.0

    tasks = {ciclo.every(1): step, ciclo.every(100000): ciclo.checkpoint(directory)}
    ciclo.loop(jnp.zeros(1000), range(100000), tasks)
    """
)


@pytest.mark.slow
def test_a_second_ctrl_c_during_the_final_save_ends_without_orbax_tracebacks(
    tmp_path: Path,
) -> None:
    marker = tmp_path / "saving"
    run = subprocess.Popen(
        [sys.executable, "-c", SLOW_FINAL_SAVE, str(tmp_path / "run"), str(marker)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    try:
        assert run.stdout is not None
        for _ in range(5):
            run.stdout.readline()
        run.send_signal(signal.SIGINT)  # the loop stops and saves its final state
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert run.poll() is None, run.stderr
            assert time.monotonic() < deadline, "the final save never started"
            time.sleep(0.02)
        run.send_signal(signal.SIGINT)  # during that save
        _, err = run.communicate(timeout=60)
    finally:
        run.kill()
    assert run.returncode == -signal.SIGINT, err
    assert "ciclo.checkpoint: interrupted while writing checkpoint" in err
    assert "the checkpoints before it are intact" in err
    for noise in ("Exception in thread", "Event loop is closed", "cannot schedule new futures"):
        assert noise not in err
    assert err.count("Traceback") == 1  # the main thread's KeyboardInterrupt
    assert ciclo.restore(tmp_path / "run", jnp.zeros(1000)).elapsed.steps == 1


# --- a structure change on restore -------------------------------------------------------------
def test_restoring_adam_into_adamw_names_the_first_differing_path(tmp_path: Path) -> None:
    optax = pytest.importorskip("optax")
    params = {"w": jnp.zeros(3)}
    ciclo.loop(
        {"p": params, "o": optax.adam(1e-3).init(params)},
        range(2),
        {ciclo.every(1): ciclo.checkpoint(tmp_path)},
    )
    with pytest.raises(
        ValueError, match=r"first differing path: \['o'\]\[2\].*same model, optimizer"
    ) as info:
        ciclo.restore(tmp_path, {"p": params, "o": optax.adamw(1e-3).init(params)})
    assert "partial_restore" not in str(info.value)


def test_restoring_into_other_leaves_names_the_first_differing_path(tmp_path: Path) -> None:
    ciclo.loop(
        {"a": jnp.zeros(1), "b": jnp.zeros(2)},
        range(2),
        {ciclo.every(1): ciclo.checkpoint(tmp_path)},
    )
    with pytest.raises(
        ValueError, match=r"first differing path: \"\['c'\]\" in the state, \"\['b'\]\""
    ):
        ciclo.restore(tmp_path, {"a": jnp.zeros(1), "c": jnp.zeros(2)})


def test_all_finite() -> None:
    from ciclo._checkpoint._codec import all_finite

    assert all_finite({"w": jnp.ones(3), "k": jax.random.key(0), "n": 3, "s": "x"})
    assert not all_finite({"w": jnp.array([1.0, jnp.inf])})
    assert not all_finite([np.float32(np.nan)])


def test_a_run_ending_after_a_failed_background_save_still_saves_its_final_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orbax.checkpoint._src.path import atomicity

    finalize = atomicity.AtomicRenameTemporaryPath.finalize
    failures = []

    async def fail_once(self: Any) -> None:
        if not failures:
            failures.append(self.get_final().name)
            raise OSError(28, "No space left on device")
        await finalize(self)

    monkeypatch.setattr(atomicity.AtomicRenameTemporaryPath, "finalize", fail_once)
    tasks = {
        ciclo.every(1): lambda state: state + 1.0,
        ciclo.every(1000): ciclo.checkpoint(tmp_path),
    }
    with pytest.warns(RuntimeWarning, match=r"writing checkpoint 1 .*final state was saved"):
        state, _, elapsed = ciclo.loop(jnp.zeros(2), range(1), tasks)
    assert len(failures) == 1
    restored, _, restored_elapsed = ciclo.restore(tmp_path, jnp.zeros(2))
    assert restored_elapsed.steps == elapsed.steps == 1
    np.testing.assert_array_equal(restored, state)


def test_early_stopping_with_nan_at_every_check_keeps_the_result() -> None:
    def step(state: Any, batch: Any) -> Any:
        return ciclo.logs().add_loss("loss", jnp.nan), state + 1.0

    def test_step(state: Any, batch: Any) -> Any:
        return ciclo.logs().add_metric("acc", jnp.nan)

    stopper = ciclo.early_stopping("acc_test", 2, mode="max", restore_best_weights=True)
    tasks = {ciclo.on_train_step: step, ciclo.on_test_step: test_step}
    state, _, elapsed = ciclo.train_loop(
        jnp.zeros(2),
        [1] * 6,
        tasks,
        callbacks=[stopper],
        test_dataset=lambda: [1],
        epoch_duration=2,
        stop=6,
    )
    assert stopper.best is None  # NaN is never an improvement
    np.testing.assert_array_equal(state, [elapsed.steps] * 2)  # the final state, not lost


def test_an_empty_step_directory_left_by_a_kill_is_no_checkpoint_and_is_removed(
    tmp_path: Path,
) -> None:
    # A kill while keep deleted checkpoint 5 can leave its directory empty (issue 41).
    directory = tmp_path / "run"
    training.run(str(directory), stop=9)  # checkpoints 5 and 9 (keep=2)
    (directory / "121").mkdir()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not passed over as damaged: not a checkpoint at all
        restored = ciclo.restore(directory, training.init_state())
    assert restored.elapsed.steps == 9
    with pytest.raises(FileNotFoundError, match=r"no checkpoint of step 121 .* steps \[5, 9\]"):
        ciclo.restore(directory, training.init_state(), step=121)
    (directory / "7").mkdir()  # a step the resumed run saves again: removed at its first save
    _, _, elapsed = training.run(str(directory), resume=True, stop=14)
    assert elapsed.steps == 14
    assert not (directory / "7").exists()
    assert not (directory / "121").exists()
