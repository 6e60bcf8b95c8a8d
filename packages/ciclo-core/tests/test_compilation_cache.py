"""A run that checkpoints keeps JAX's persistent compilation cache next to its checkpoints, so
a resumed run in a fresh process compiles nothing it compiled before (counted with JAX's own
monitoring events); a cache the user set in JAX is kept; bad settings are clear errors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import pytest

import ciclo
from ciclo._checkpoint import _compilation_cache

RUN = Path(__file__).with_name("compilation_cache_run.py")
THRESHOLD = "jax_persistent_cache_min_compile_time_secs"


def run(directory: Path, steps: int, *args: str) -> dict:
    done = subprocess.run(
        [sys.executable, str(RUN), str(directory), str(steps), *args],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture
def jax_cache_of_its_own():
    """JAX's cache settings as a fresh process has them, put back afterwards (a checkpoint
    made by an earlier test of this process may have set ciclo's)."""

    def clean():
        _compilation_cache.use_compilation_cache(False, "")
        jax.config.update("jax_compilation_cache_dir", None)
        jax.config.update(THRESHOLD, 1.0)

    clean()
    yield
    clean()


@pytest.mark.slow
def test_a_resumed_run_in_a_fresh_process_compiles_nothing_it_compiled_before(tmp_path):
    first = run(tmp_path / "ckpt", 10)
    assert first["steps"] == 10
    assert first["cache"] == str(tmp_path / "ckpt" / "compilation_cache")
    assert first.get("hits", 0) == 0
    assert first["writes"] == first["requests"] > 3  # every program, the eager ones too
    entries = list((tmp_path / "ckpt" / "compilation_cache").iterdir())
    assert len(entries) >= first["writes"]

    resumed = run(tmp_path / "ckpt", 20)
    assert resumed["steps"] == 20  # it resumed from step 10 and trained on
    assert resumed["requests"] > 3
    assert resumed["hits"] == resumed["requests"]  # loaded, none compiled
    assert resumed.get("writes", 0) == 0

    # Without the cache the same resume compiles everything again.
    again = run(tmp_path / "ckpt", 30, "--no-cache")
    assert again["steps"] == 30
    assert again["cache"] is None
    assert again.get("hits", 0) == 0


def test_the_cache_follows_the_latest_checkpoint_and_turns_off(tmp_path, jax_cache_of_its_own):
    first = ciclo.checkpoint(tmp_path / "a")
    assert first.compilation_cache == str(tmp_path / "a" / "compilation_cache")
    assert jax.config.jax_compilation_cache_dir == first.compilation_cache
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 0.0  # all cached, not > 1 s

    shared = tmp_path / "shared"
    second = ciclo.checkpoint(tmp_path / "b", compilation_cache=shared)
    assert second.compilation_cache == str(shared)
    assert jax.config.jax_compilation_cache_dir == str(shared)
    (jax.numpy.arange(3) * 7).block_until_ready()  # a compilation: the cache is written
    assert list(shared.iterdir())

    off = ciclo.checkpoint(tmp_path / "c", compilation_cache=False)
    assert off.compilation_cache is None
    assert jax.config.jax_compilation_cache_dir is None
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 1.0  # JAX's own again
    assert not (tmp_path / "c" / "compilation_cache").exists()


def test_a_cache_the_user_set_in_jax_is_kept(tmp_path, jax_cache_of_its_own):
    mine = str(tmp_path / "my-cache")
    jax.config.update("jax_compilation_cache_dir", mine)
    jax.config.update(THRESHOLD, 2.0)
    ckpt = ciclo.checkpoint(tmp_path / "ckpt")
    assert ckpt.compilation_cache == mine
    assert jax.config.jax_compilation_cache_dir == mine
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 2.0
    assert ciclo.checkpoint(tmp_path / "ckpt2", compilation_cache=mine).compilation_cache == mine
    off = ciclo.checkpoint(tmp_path / "ckpt3", compilation_cache=False)
    assert off.compilation_cache == mine  # off for ciclo, not for JAX: yours is in use
    assert jax.config.jax_compilation_cache_dir == mine
    with pytest.raises(
        ValueError, match=r"already set to '.*my-cache'.*does not move a cache you set"
    ):
        ciclo.checkpoint(tmp_path / "ckpt4", compilation_cache=tmp_path / "other")


def test_bad_compilation_cache_settings_are_clear_errors(tmp_path, jax_cache_of_its_own):
    with pytest.raises(
        TypeError, match=r"compilation_cache=3\): expected True, False or a path, got int"
    ):
        ciclo.checkpoint(tmp_path / "a", compilation_cache=3)
    with pytest.raises(ValueError, match=r"compilation_cache=''\): give a path, True or False"):
        ciclo.checkpoint(tmp_path / "b", compilation_cache="")
    a_file = tmp_path / "file"
    a_file.write_text("")
    with pytest.raises(NotADirectoryError, match=r"'.*file' is a file; give a directory"):
        ciclo.checkpoint(tmp_path / "c", compilation_cache=a_file)
    assert jax.config.jax_compilation_cache_dir is None  # nothing was changed


def test_the_cache_ends_with_the_checkpoint_s_loop(tmp_path, jax_cache_of_its_own):
    """A later compilation is not written to the directory, which may be gone by then (a
    temporary one): JAX would warn at each compilation."""
    directory = tmp_path / "ckpt"
    ckpt = ciclo.checkpoint(directory, async_save=False)
    ciclo.loop(jax.numpy.zeros(2), [1.0, 2.0], {ciclo.every(1): lambda s, b: s + b, **ckpt})
    assert jax.config.jax_compilation_cache_dir is None
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 1.0
    shutil.rmtree(directory)
    (jax.numpy.arange(4) * 11 + 3).block_until_ready()  # no warning (an error in the tests)


def test_an_unwritable_cache_directory_is_an_error_at_once(tmp_path, jax_cache_of_its_own):
    # issue 41: it was accepted, then JAX warned at each compilation.
    readonly = tmp_path / "readonly"
    readonly.mkdir()
    readonly.chmod(0o555)
    if os.access(readonly, os.W_OK):  # root ignores permissions; /sys refuses even root
        readonly = Path("/sys")
    match = r"compilation_cache=\.\.\.\): cannot write to '.*cache' \(.*\); give a writable"
    with pytest.raises(PermissionError, match=match):
        ciclo.checkpoint(tmp_path / "ckpt", compilation_cache=readonly / "cache")
    assert jax.config.jax_compilation_cache_dir is None  # nothing was changed
