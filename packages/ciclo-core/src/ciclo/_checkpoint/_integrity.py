"""What ciclo trusts of a checkpoint directory. A step whose orbax files cannot be read is
hidden from orbax (:class:`IntactSteps`) and a :class:`DamagedCheckpoint` when read; a
non-finite state (its orbax metrics ``{"finite": false}``) never evicts the newest finite one
(:class:`NewestFinite`), nor one a ``rollback_on_nan`` may still need (:func:`hold`); a
resume or restore passes both over (:func:`newest`), and a resumed run sets aside, never
deletes, those whose steps it writes again (:func:`set_aside`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


class NewestFinite:
    """An orbax preservation policy: keeps the newest checkpoint of a finite state, so that
    a NaN state saved after it never evicts it (``keep=1`` included)."""

    def should_preserve(self, checkpoints: Sequence[Any], *, context: Any) -> list[bool]:
        finite = [i for i, info in enumerate(checkpoints) if finite_metrics(info.metrics)]
        return [bool(finite) and i == finite[-1] for i in range(len(checkpoints))]


#: By checkpoint directory, what must not be evicted yet: ``held(steps) -> [bool]`` for the
#: steps on disk (``rollback_on_nan`` holds the pre-fault checkpoints it may still need).
#: Written here only, through :func:`hold` and :func:`release`.
_HELD: dict[str, Callable[[list[int]], list[bool]]] = {}


def hold(path: str, held: Callable[[list[int]], list[bool]]) -> None:
    """Keeps from ``keep``'s eviction the checkpoints of ``path`` that ``held`` says."""
    _HELD[path] = held


def release(path: str) -> None:
    """Ends :func:`hold` of ``path``."""
    _HELD.pop(path, None)


def is_held(path: str) -> bool:
    """Whether a :func:`hold` of ``path`` runs (a ``rollback_on_nan`` of that directory)."""
    return path in _HELD


class Held:
    """An orbax preservation policy: keeps what :func:`hold` holds for ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path

    def should_preserve(self, checkpoints: Sequence[Any], *, context: Any) -> list[bool]:
        held = _HELD.get(self.path)
        return [False] * len(checkpoints) if held is None else held([c.step for c in checkpoints])


def finite_metrics(metrics: Any) -> bool:
    """Whether a checkpoint's orbax metrics say its state is finite (older checkpoints,
    written without the flag, count as finite)."""
    return not isinstance(metrics, Mapping) or metrics.get("finite", True) is not False


#: Steps whose orbax files (read when a manager opens the directory: the step's
#: ``_CHECKPOINT_METADATA``, its ``metrics`` item) cannot be read, by directory:
#: ``{path: {step: (file, error)}}``. orbax would fail to open the directory for them, so
#: :class:`IntactSteps` hides them from its managers and :func:`read` reports them damaged.
unreadable: dict[str, dict[int, tuple[str, Exception]]] = {}
_ORBAX_FILES = ("_CHECKPOINT_METADATA", os.path.join("metrics", "metrics"))


def _orbax_damage(step_directory: str) -> tuple[str, Exception] | None:
    """``(file, error)`` for the first of orbax's own files of a step that cannot be read;
    ``None`` when they read. orbax writes ``_CHECKPOINT_METADATA`` before it commits a step,
    so a committed step without it is damaged too (orbax would warn about it at every read);
    a missing ``metrics`` item is orbax's to handle."""
    for name in _ORBAX_FILES:
        file = os.path.join(step_directory, name)
        try:
            with open(file, encoding="utf-8") as f:
                value = json.load(f)
        except FileNotFoundError as error:
            if name == _ORBAX_FILES[0]:
                return file, error
            continue
        except (OSError, ValueError) as error:
            return file, error
        if not isinstance(value, dict):
            return file, ValueError(f"not a JSON object: {str(value)[:40]!r}")
    return None


class IntactSteps:
    """orbax's standard step names (``<step>``), less the steps of a local directory whose
    orbax files cannot be read (recorded in ``unreadable[path]``): an orbax step name
    format, given to every manager ciclo opens."""

    def __init__(self, path: str, names: Any) -> None:
        self.path, self.names = path, names

    def __str__(self) -> str:
        return f"ciclo intact steps of {self.names}"

    def build_name(self, step: int) -> str:
        return str(self.names.build_name(step))

    def find_all(self, base_path: Any) -> Any:
        found, damaged_steps = [], {}
        for metadata in self.names.find_all(base_path):
            local = "://" not in self.path
            if local and not os.listdir(metadata.path):
                continue  # left empty by a kill while keep deleted it: not a checkpoint
            damage = _orbax_damage(str(metadata.path)) if local else None
            if damage is None:
                found.append(metadata)
            else:
                damaged_steps[metadata.step] = damage
        unreadable[self.path] = damaged_steps
        return iter(found)

    def find_step(self, base_path: Any, step: int) -> Any:
        metadata = self.names.find_step(base_path, step)
        if "://" not in self.path and _orbax_damage(str(metadata.path)) is not None:
            raise ValueError(f"checkpoint {step} in {self.path!r} is damaged")
        return metadata


def steps_on_disk(manager: Any, path: str) -> list[int]:
    """The steps of ``path``, oldest first: those of ``manager`` and those it hides because
    orbax's own files of the step cannot be read (damaged, see :func:`read`)."""
    return sorted({*manager.all_steps(), *unreadable.get(path, {})})


class DamagedCheckpoint(ValueError):
    """A checkpoint that cannot be read: a truncated or missing file, a missing item, bad
    JSON. Its message names the step, the file and the fix; ``step`` and ``file`` say them.
    """

    def __init__(self, message: str, *, step: int, file: str) -> None:
        super().__init__(message)
        self.step, self.file = step, file


FILE_IN_ERROR = re.compile(r'(?:local )?file "([^"]+)"')

#: Checkpoints passed over by a read in this process, ``{path: {step: why}}``:
#: ``"damaged"`` or ``"non-finite"``. The writer of ``path`` replaces them when it reaches
#: their step, setting them aside (:func:`set_aside`), never deleting them.
_passed_over: dict[str, dict[int, str]] = {}


def passed_over(path: str) -> dict[int, str]:
    """The steps of ``path`` that a resume or restore of this process passed over, with
    why (``"damaged"``, ``"non-finite"``)."""
    return dict(_passed_over.get(path, {}))


_DAMAGED = (
    "checkpoint {step} in {path!r} is damaged: cannot read {file!r} ({error}). Restore another "
    "step (it holds {others}), or resume=, which falls back to the newest intact checkpoint; "
    "move '{path}/{step}' away to keep it from being tried."
)


def damaged(path: str, step: int, file: str, error: BaseException, steps: list[int]) -> Any:
    others = sorted(s for s in steps if s != step)
    reason = f"{type(error).__name__}: {str(error)[:200]}"
    text = _DAMAGED.format(step=step, path=path, file=file, error=reason, others=others)
    return DamagedCheckpoint(text, step=step, file=file)


def is_finite_step(manager: Any, step: int) -> bool:
    """Whether checkpoint ``step`` holds a finite state (by its orbax metrics; unreadable
    metrics count as finite: reading it then tells)."""
    try:
        return finite_metrics(manager.metrics(step))
    except Exception:
        return True


def newest(manager: Any, path: str, read_step: Callable[[int], T]) -> T:
    """``read_step(step)`` of the newest intact checkpoint of a finite state.

    Damaged checkpoints, and non-finite ones while an older finite one exists, are passed
    over with a warning (naming the step); nothing is deleted.

    Raises:
        DamagedCheckpoint: every checkpoint is damaged (the newest one's error).
    """
    steps = steps_on_disk(manager, path)[::-1]
    finite = [step for step in steps if is_finite_step(manager, step)]
    skipped = _passed_over.setdefault(path, {})
    first_error: DamagedCheckpoint | None = None
    for step in finite + [step for step in steps if step not in finite]:
        try:
            contents = read_step(step)
        except DamagedCheckpoint as error:
            first_error = first_error or error
            skipped[step] = "damaged"
            _warn(f"passing over damaged checkpoint {step} ({error.file!r}); reading an older one")
            continue
        nonfinite = sorted(s for s in steps if s > step and s not in finite)
        skipped.update(dict.fromkeys(nonfinite, "non-finite"))
        if nonfinite or step not in finite:
            what = f"checkpoints {nonfinite}" if nonfinite else f"checkpoint {step}"
            _warn(f"{what} in {path!r}: a non-finite state; reading checkpoint {step}")
        return contents
    assert first_error is not None
    raise first_error


def _warn(text: str) -> None:
    warnings.warn(f"ciclo: {text}. Nothing is deleted.", RuntimeWarning, stacklevel=4)


def remove_empty_steps(path: str) -> None:
    """Removes the empty step directories of ``path`` (left by a kill while ``keep``
    deleted a checkpoint), so that a save of that step can be written (local paths only)."""
    if "://" not in path and os.path.isdir(path):
        for name in os.listdir(path):
            with contextlib.suppress(OSError):  # not empty, or not a directory: left alone
                if name.isdigit():
                    os.rmdir(os.path.join(path, name))


def set_aside(path: str, step: int, why: str) -> str:
    """Renames the step directory of checkpoint ``step`` to ``<step>.<why>[.n]`` (a name
    orbax does not read as a step), so a new checkpoint of that step can be written;
    returns the new path. Local directories only (a URL's is left in place)."""
    source = os.path.join(path, str(step))
    target = f"{source}.{why}"
    n = 1
    while os.path.exists(target):
        n += 1
        target = f"{source}.{why}.{n}"
    os.rename(source, target)
    return target
