"""JAX's persistent compilation cache for runs that checkpoint: ``ciclo.checkpoint(...,
compilation_cache=True)`` points JAX at ``<directory>/compilation_cache``, so that a resumed
run loads every program the interrupted run compiled instead of compiling it again.

JAX keeps the cache it first compiled with: :func:`use_compilation_cache` resets it
(``reset_cache``) when it moves the directory, and lowers
``jax_persistent_cache_min_compile_time_secs`` to 0 (JAX's 1 s leaves most CPU programs out).
ciclo only changes what it set itself: a directory or threshold the user set is kept. With
several processes, each reads the cache and process 0 writes it (JAX's rule).
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import jax
from jax.experimental.compilation_cache import compilation_cache as _jax_cache

__all__ = [
    "CACHE_NAME",
    "cache_path",
    "use_compilation_cache",
    "release_compilation_cache",
    "managed_cache_directory",
]

#: The name of the cache's folder in a checkpoint directory (orbax reads no step in it).
CACHE_NAME = "compilation_cache"
_DIR = "jax_compilation_cache_dir"
_THRESHOLD = "jax_persistent_cache_min_compile_time_secs"
_JAX_DEFAULT_THRESHOLD = 1.0

#: A cache path given to ``ciclo.checkpoint`` while JAX's is set to another by the user.
_TWO_CACHES = (
    "ciclo.checkpoint(compilation_cache={given!r}): JAX's cache is already set to {current!r} "
    "outside ciclo, which does not move a cache you set: leave out compilation_cache=."
)

#: A ``compilation_cache=`` that is neither a bool nor a path.
_NOT_A_SETTING = (
    "ciclo.checkpoint(compilation_cache={setting!r}): expected True, False or a path, got {kind}."
)

# What ciclo set: the directory (None: JAX's setting is not ciclo's) and the threshold it
# replaced (None: ciclo left the threshold alone).
_ours: dict[str, Any] = {"dir": None, "threshold": None}


def _get(name: str) -> Any:
    return getattr(jax.config, name)


def _set(name: str, value: Any) -> None:
    jax.config.update(name, value)  # type: ignore[no-untyped-call]


def managed_cache_directory() -> str | None:
    """The compilation cache directory that ciclo set in JAX, if any."""
    return _ours["dir"]  # type: ignore[no-any-return]


def _check_path(path: str) -> str:
    """``path`` made absolute (local paths), refused if it names a file."""
    if "://" in path:
        return path
    path = os.path.abspath(os.path.expanduser(path))
    if os.path.exists(path) and not os.path.isdir(path):
        raise NotADirectoryError(f"compilation_cache={path!r} is a file; give a directory.")
    return path


def cache_path(setting: Any, checkpoint_directory: str) -> str | None:
    """The cache directory that ``compilation_cache=setting`` asks for (``None``: off).

    Example:
        >>> cache_path(True, "/runs/a")
        '/runs/a/compilation_cache'
        >>> cache_path(False, "/runs/a") is None
        True
    """
    if setting is True:
        if "://" in checkpoint_directory:
            return f"{checkpoint_directory.rstrip('/')}/{CACHE_NAME}"
        return _check_path(os.path.join(checkpoint_directory, CACHE_NAME))
    if setting is False:
        return None
    try:
        text = os.fspath(setting)
    except TypeError:
        raise TypeError(
            _NOT_A_SETTING.format(setting=setting, kind=type(setting).__name__)
        ) from None
    if not isinstance(text, str):
        text = os.fsdecode(text)
    if not text:
        raise ValueError("ciclo.checkpoint(compilation_cache=''): give a path, True or False.")
    return _check_path(text)


def use_compilation_cache(setting: Any, checkpoint_directory: str) -> str | None:
    """Points JAX's persistent compilation cache where ``compilation_cache=setting`` asks
    (see the module docstring); returns the cache directory in use (the user's own when
    they set one, ``None`` when there is none).

    Raises:
        TypeError, ValueError: ``setting`` is neither a bool nor a path.
        NotADirectoryError: the path is a file.
        ValueError: a path was given while JAX's cache is set, outside ciclo, to another.
    """
    wanted = cache_path(setting, checkpoint_directory)
    current = _get(_DIR)
    if current is not None and current != _ours["dir"]:  # the user's own: kept
        if setting is not True and wanted is not None and wanted != current:
            raise ValueError(_TWO_CACHES.format(given=wanted, current=current))
        return current  # type: ignore[no-any-return]
    if wanted is None:
        if _ours["dir"] is not None:  # ciclo's cache of an earlier checkpoint: off now
            _set(_DIR, None)
            if _ours["threshold"] is not None and not _threshold():  # still ciclo's 0
                _set(_THRESHOLD, _ours["threshold"])
            _ours.update(dir=None, threshold=None)
            _jax_cache.reset_cache()
        return None
    if wanted != current:
        if "://" not in wanted:  # else JAX would warn at each compilation
            _check_writable(wanted)
        _set(_DIR, wanted)
        _jax_cache.reset_cache()  # JAX reads the directory once, at its next compilation
    if _ours["threshold"] is None and _default_threshold():
        _ours["threshold"] = _threshold()
        _set(_THRESHOLD, 0.0)
    _ours["dir"] = wanted
    return wanted


def _check_writable(path: str) -> None:
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".ciclo-write-test-"):
            pass
    except OSError as error:
        raise PermissionError(
            f"ciclo.checkpoint(compilation_cache=...): cannot write to {path!r} "
            f"({error.strerror}); give a writable directory, or False."
        ) from error


def release_compilation_cache(directory: str | None) -> None:
    """Turns ciclo's cache off (JAX's settings as they were) if it is still ``directory``:
    called when the loop of the checkpoint that set it ends, so that later compilations of
    the process are not written to a directory that may be deleted meanwhile."""
    if directory is not None and _ours["dir"] == directory and _get(_DIR) == directory:
        use_compilation_cache(False, "")


def _threshold() -> float:
    return float(_get(_THRESHOLD))


def _default_threshold() -> bool:
    """Whether the minimum compile time of a cached program is JAX's default, unset by
    the user."""
    return (
        _threshold() == _JAX_DEFAULT_THRESHOLD
        and "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ
    )
