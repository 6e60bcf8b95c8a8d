"""Errors that do not drown the code: a message longer than two source lines is a
module-level constant, formatted where it is raised (equinox's style), e.g.

    _UNKNOWN_AGGREGATION = (
        "unknown aggregation {method!r} {where}; use one of {methods}, a callable on the "
        "values stacked along axis 0 (e.g. jnp.median), None to leave the entries out, ..."
    )
    ...
    raise ValueError(_UNKNOWN_AGGREGATION.format(method=method, where=where, methods=...))

Checked on the source of every package (and the examples): the text of a ``raise``, of a
``warnings.warn``, of an exception built to be raised or returned, and of a local variable
such a message uses, spans at most two lines at that place."""

from __future__ import annotations

import ast
import builtins
from collections.abc import Collection
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SCANNED = [*sorted((ROOT / "packages").glob("*/src")), ROOT / "examples"]
#: Files whose long messages have not moved yet (none: issue 26's work on managed/ and the
#: adapters' states has landed).
SKIPPED: tuple[str, ...] = ()
MAX_LINES = 2


def _callee(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else None


def _looks_like_exception(name: str) -> bool:
    builtin = getattr(builtins, name, None)
    if isinstance(builtin, type) and issubclass(builtin, BaseException):
        return True
    return name.endswith(("Error", "Exception", "Warning"))


def exception_classes(trees: list[ast.Module]) -> set[str]:
    """The names of the exception classes the sources define (``DamagedCheckpoint``, ...):
    classes with an exception among their bases, followed through the sources."""
    bases = {
        node.name: {
            b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "") for b in node.bases
        }
        for tree in trees
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
    }
    found: set[str] = set()
    while True:
        more = {
            name
            for name, of in bases.items()
            if name not in found and any(_looks_like_exception(b) or b in found for b in of)
        }
        if not more:
            return found
        found |= more


def _text_lines(expr: ast.AST) -> set[int]:
    """The source lines that the string literals in ``expr`` occupy."""
    if isinstance(expr, ast.JoinedStr) or (
        isinstance(expr, ast.Constant) and isinstance(expr.value, str)
    ):
        return set(range(expr.lineno, expr.end_lineno + 1))  # type: ignore[operator]
    lines: set[int] = set()
    for child in ast.iter_child_nodes(expr):
        lines |= _text_lines(child)
    return lines


class _Messages(ast.NodeVisitor):
    """Finds the messages of a module: ``sites`` counts them, ``long`` holds the lines of
    those whose text (or the text of a local variable they use) spans more than two lines."""

    def __init__(self, exceptions: Collection[str]) -> None:
        self.exceptions = exceptions
        self.locals: list[dict[str, list[ast.expr]]] = [{}]
        self.raised: set[int] = set()
        self.sites = 0
        self.long: list[int] = []

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        assigned: dict[str, list[ast.expr]] = {}
        for child in ast.walk(node):
            if isinstance(child, ast.Assign):
                for target in child.targets:
                    if isinstance(target, ast.Name):
                        assigned.setdefault(target.id, []).append(child.value)
        self.locals.append(assigned)
        self.generic_visit(node)
        self.locals.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Raise(self, node: ast.Raise) -> None:
        if isinstance(node.exc, ast.Call):
            self.raised.add(id(node.exc))
            self._check(node, [*node.exc.args, *(k.value for k in node.exc.keywords)])
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        name = _callee(node)
        if id(node) not in self.raised and name is not None:
            if name == "warn":
                self._check(node, [*node.args[:1], *(k.value for k in node.keywords)])
            elif _looks_like_exception(name) or name in self.exceptions:
                self._check(node, [*node.args, *(k.value for k in node.keywords)])
        self.generic_visit(node)

    def _check(self, node: ast.Raise | ast.Call, message: list[ast.expr]) -> None:
        self.sites += 1
        used = {n.id for part in message for n in ast.walk(part) if isinstance(n, ast.Name)}
        texts = [set().union(*map(_text_lines, message))]  # the message at the raise
        texts += [_text_lines(value) for name in used for value in self.locals[-1].get(name, [])]
        if any(len(lines) > MAX_LINES for lines in texts):
            self.long.append(node.lineno)


def long_messages(source: str, exceptions: Collection[str] = ()) -> tuple[int, list[int]]:
    """``(messages found, lines of those longer than two lines)`` in ``source``."""
    finder = _Messages(exceptions)
    finder.visit(ast.parse(source))
    return finder.sites, finder.long


def _sources() -> list[Path]:
    files = [path for folder in SCANNED for path in sorted(folder.rglob("*.py"))]
    return [p for p in files if not p.relative_to(ROOT).as_posix().startswith(SKIPPED)]


def test_no_message_longer_than_two_lines():
    files = _sources()
    trees = [ast.parse(path.read_text()) for path in files]
    exceptions = exception_classes(trees)
    found, offenders = 0, []
    for path in files:
        sites, long = long_messages(path.read_text(), exceptions)
        found += sites
        offenders += [f"{path.relative_to(ROOT)}:{line}" for line in long]
    # not vacuous: every package and the examples were read, and their messages found
    packages = {p.parent.name for p in SCANNED if p.name == "src"}
    assert packages == {"ciclo-core", "ciclo-flax", "ciclo-haiku", "ciclo-equinox"}
    wholly_skipped = {s.split("/")[1] for s in SKIPPED if s.endswith("/src/")}
    read = {
        p.relative_to(ROOT).parts[1] for p in files if p.relative_to(ROOT).parts[0] == "packages"
    }
    assert read == packages - wholly_skipped
    assert any(p.parent.name == "examples" for p in files)
    assert {"DamagedCheckpoint", "ProcessFailedError", "LoopInterrupted"} <= exceptions
    assert len(files) > 50, len(files)
    assert found > 150, found
    assert not offenders, (
        "these messages span more than two lines: make each a module-level constant and "
        "format it where it is raised, e.g. raise ValueError(_NOT_A_BOOL.format(value=value))"
        "\n" + "\n".join(offenders)
    )


def test_the_skipped_files_exist():
    for skipped in SKIPPED:
        assert (ROOT / skipped).exists(), skipped


def test_a_long_message_at_the_raise_is_flagged():
    source = """
import warnings

class BrokenRun(RuntimeError):
    pass

def check(value, steps):
    if value < 0:
        raise ValueError(
            f"value {value} is negative: the loop counts steps from 0, and a "
            f"negative value would never be reached; give a count of steps >= 0, "
            f"e.g. stop=100."
        )
    warnings.warn(
        "ciclo: the dataset ended before stop was reached: the run ends here. Give "
        "more data (more epochs, a repeated dataset), or a smaller stop, or no stop "
        "at all.",
        RuntimeWarning,
    )
    return BrokenRun(
        \"\"\"the run broke:
it cannot go on;
start it again\"\"\",
        steps,
    )
"""
    assert long_messages(source, {"BrokenRun"}) == (3, [9, 14, 20])


def test_long_message_text_in_a_local_variable_is_flagged():
    source = """
def check(value):
    fix = (
        "Give a zero-argument function returning a fresh one, e.g. lambda: batches(x), "
        "or a re-iterable dataset such as a list, or a Grain MapDataset, or anything "
        "that can be iterated twice."
    )
    raise TypeError(f"{value!r} is an iterator. {fix}")
"""
    assert long_messages(source) == (1, [8])


def test_a_constant_formatted_at_the_raise_is_not_flagged():
    source = """
import warnings

_NEGATIVE = (
    "value {value} is negative: the loop counts steps from 0, and a negative value "
    "would never be reached; give a count of steps >= 0, e.g. stop=100."
)

def check(value, name, where):
    fix = _NEGATIVE.format(value=value)
    if value < 0:
        raise ValueError(
            _NEGATIVE.format(
                value=value,
                name=name,
                where=where,
            )
        )
    if value > 10:
        raise ValueError(
            f"value {value} is too large: give at most 10 "
            f"(the loop has ten phases). {fix}"
        )
    warnings.warn(f"value {value} is large", RuntimeWarning, stacklevel=2)
"""
    assert long_messages(source) == (3, [])
