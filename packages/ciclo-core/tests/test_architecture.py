"""The rules of docs/architecture.md, checked on the source: which folder may import which,
the folders form a layering and the modules no cycle (counting every import, those deferred
into functions or ``TYPE_CHECKING`` too), at most three deferred imports inside ciclo, each
with its reason, no private name imported across modules, one owner of the checkpoint
format, and core never imports a framework."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest

import ciclo

SOURCE = Path(ciclo.__file__).parent

#: What each folder may import from the rest of ciclo (docs/architecture.md, "The map"): a
#: layering, each folder importing only folders listed before it.
ALLOWED = {
    "_processes": set(),
    "_data": set(),
    "_plugins": set(),
    "_time": {"_processes"},
    "_records": {"_processes", "_time"},
    "_loop": {"_processes", "_time", "_records"},
    "_checkpoint": {"_processes", "_plugins", "_time", "_records", "_loop"},
    "callbacks": {"_processes", "_time", "_records", "_loop", "_checkpoint"},
    "managed": {"_processes", "_plugins", "_time", "_records", "_loop"},
    "adapters": {"_plugins", "_records", "managed"},
    "_weights": {"_processes", "managed"},
    "_loops": {"_processes", "_time", "_records", "_loop", "_checkpoint", "callbacks"},
    # the conformance suite runs loops and checkpoints on adapters: the top floor
    "testing": {
        "_processes",
        "_plugins",
        "_time",
        "_records",
        "_loop",
        "_checkpoint",
        "callbacks",
        "managed",
        "adapters",
        "_loops",
    },
}
#: The imports inside ciclo deferred into a function or an ``if TYPE_CHECKING:`` block
#: (``"importing module:imported name"``), each with its reason; at most three. Any other
#: is a cycle hidden from the rules above: move the code to where it belongs instead.
DEFERRED: dict[str, str] = {}
#: What the folders below the loops may take from ``_loop``: its contract, not its engine.
LOOP_CONTRACT = {
    "ciclo._loop._hooks",
    "ciclo._loop._state",
    "ciclo._loop._base",
    "ciclo._loop._returns",
    "ciclo._loop._naming",
}
FRAMEWORKS = {"flax", "haiku", "equinox", "ciclo_flax", "ciclo_haiku", "ciclo_equinox"}


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(SOURCE.rglob("*.py")):
        parts = path.relative_to(SOURCE).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(("ciclo", *parts))] = path
    return found


MODULES = _modules()


def _package_of(name: str, path: Path) -> str:
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _import_nodes(node: ast.AST, deferred: bool = False):
    """``(import node, deferred)`` under ``node``: deferred when inside a function or an
    ``if TYPE_CHECKING:`` block."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child, deferred
        inside = isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        yield from _import_nodes(child, deferred or inside or _is_type_checking(child))


def _imports(name: str, path: Path):
    """``(imported module, imported names, line, deferred)`` for every import of ``name``,
    those deferred into a function or ``TYPE_CHECKING`` included."""
    for node, deferred in _import_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, [], node.lineno, deferred
            continue
        if node.level:
            base = _package_of(name, path).split(".")
            base = base[: len(base) - (node.level - 1)]
            module = ".".join([*base, *([node.module] if node.module else [])])
        else:
            module = node.module or ""
        yield module, [a.name for a in node.names], node.lineno, deferred


def _targets(name: str, module: str, names: list[str]) -> set[str]:
    """The modules of ciclo an import of ``names`` from ``module`` in ``name`` reaches."""
    found = {c for c in (module, *(f"{module}.{n}" for n in names)) if c in MODULES}
    return {t for t in found if t != name and not name.startswith(t + ".")}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of ``graph`` (its nodes in order, the first repeated at the end), or None."""
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*trail[trail.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt, [*trail, nxt])):
                return found
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node, [node])):
            return found
    return None


def _folder(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in ALLOWED) else None


def test_every_folder_is_mapped():
    folders = {p.name for p in SOURCE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == set(ALLOWED), "a new folder needs its entry in ALLOWED and the map"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_folders_import_only_what_the_map_allows(name):
    source = _folder(name)
    if source is None:  # ciclo/__init__.py, _deprecated.py: the public surface
        return
    for module, _, line, _ in _imports(name, MODULES[name]):
        target = _folder(module) if module.startswith("ciclo.") else None
        if target is not None and target != source:
            assert target in ALLOWED[source], (
                f"{name} (line {line}) imports {module}: folder {source} may import only "
                f"{sorted(ALLOWED[source])} (docs/architecture.md)"
            )


@pytest.mark.parametrize("name", sorted(MODULES))
def test_callbacks_checkpoints_and_managed_see_only_the_loop_contract(name):
    if _folder(name) not in {"callbacks", "_checkpoint", "managed"}:
        return
    for module, _, line, _ in _imports(name, MODULES[name]):
        if module.startswith("ciclo._loop."):
            assert module in LOOP_CONTRACT, (
                f"{name} (line {line}) imports {module}: outside the loops, only the contract "
                f"({sorted(LOOP_CONTRACT)}) is imported from ciclo._loop"
            )


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_private_name_is_imported_across_modules(name):
    for module, names, line, _ in _imports(name, MODULES[name]):
        if not module.startswith("ciclo"):
            continue
        for imported in names:
            if imported.startswith("_") and f"{module}.{imported}" not in MODULES:
                pytest.fail(
                    f"{name} (line {line}) imports the private name {imported} from "
                    f"{module}: make it public inside the package, or move the code"
                )
    # ... nor reached through a module: ``from . import _resume; _resume._open(...)``
    modules = {
        alias
        for module, names, _, _ in _imports(name, MODULES[name])
        for alias in names
        if f"{module}.{alias}" in MODULES
    }
    for node in ast.walk(ast.parse(MODULES[name].read_text())):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            pytest.fail(
                f"{name} (line {node.lineno}) uses the private name {node.value.id}.{node.attr}"
            )


#: The one framework module core may import, deferred: Flax's msgpack reader, to read a
#: ``.msgpack`` file given to ``ciclo.load_weights`` (an error says to install flax).
READERS = {("ciclo._weights._sources", "flax")}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_core_never_imports_a_framework(name):
    for module, _, line, deferred in _imports(name, MODULES[name]):
        if deferred and (name, module) in READERS:
            continue
        assert module.split(".")[0] not in FRAMEWORKS, f"{name} (line {line}) imports {module}"


def test_one_module_owns_the_checkpoint_format():
    owners = sorted(
        name
        for name, path in MODULES.items()
        if any(m.split(".")[0] == "orbax" for m, _, _, _ in _imports(name, path))
    )
    # _weights/_sources.py reads others' Orbax pytrees (and a checkpoint's plain ``state``).
    assert owners == ["ciclo._checkpoint._format", "ciclo._weights._sources"]


def _deferred_imports() -> dict[str, str]:
    """``{"importing module:imported name": where}`` for every deferred import inside ciclo."""
    found = {}
    for name, path in MODULES.items():
        for module, names, line, deferred in _imports(name, path):
            if deferred and module.split(".")[0] == "ciclo":
                for imported in names or [module]:
                    found[f"{name}:{imported}"] = f"{path.relative_to(SOURCE)}:{line}"
    return found


def test_at_most_three_deferred_imports_each_with_its_reason():
    assert len(DEFERRED) <= 3, "at most three deferred imports inside ciclo"
    found = _deferred_imports()
    unlisted = {key: where for key, where in found.items() if key not in DEFERRED}
    assert not unlisted, (
        f"imports inside ciclo deferred into a function or TYPE_CHECKING: {unlisted}. A "
        f"deferred import hides a cycle: move the code to where it belongs (a small module "
        f"lower in the folder), or list it in DEFERRED with its reason."
    )
    gone = sorted(set(DEFERRED) - set(found))
    assert not gone, f"DEFERRED lists imports that are no longer deferred: {gone}"


def _module_graph(*, skip_listed: bool) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        targets = graph.setdefault(name, set())
        for module, names, _, deferred in _imports(name, path):
            if deferred and skip_listed:
                names = [n for n in names if f"{name}:{n}" not in DEFERRED]
                if not names:
                    continue
            targets |= _targets(name, module, names)
    return graph


def test_folders_form_a_layering():
    """Every import counts (deferred ones too): a folder cycle fails, printed."""
    edges: dict[tuple[str, str], str] = {}
    for name, targets in _module_graph(skip_listed=False).items():
        for target in sorted(targets):
            pair = (_folder(name), _folder(target))
            if None not in pair and pair[0] != pair[1]:
                edges.setdefault(pair, f"{name} -> {target}")
    graph: dict[str, set[str]] = {}
    for source, target in edges:
        graph.setdefault(source, set()).add(target)
    cycle = _cycle(graph)
    if cycle is not None:
        through = "; ".join(edges[pair] for pair in itertools.pairwise(cycle))
        pytest.fail(f"folder cycle: {' -> '.join(cycle)} ({through})")
    order = list(ALLOWED)
    for i, folder in enumerate(order):
        later = ALLOWED[folder] - set(order[:i])
        assert not later, f"ALLOWED is no layering: {folder} may import {later}, listed after it"


def test_module_imports_have_no_cycle():
    """Every import counts, deferred ones too, but for those DEFERRED lists."""
    cycle = _cycle(_module_graph(skip_listed=True))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


#: Calls whose result a module may hold at its top level and others use: not mutable state.
_IMMUTABLE_CALLS = {"frozenset", "tuple", "object", "compile", "TypeVar", "ParamSpec", "NewType"}
#: Methods that only read: any other method called on a module's state may change it.
_READERS = {"get", "items", "keys", "values", "copy", "count", "index", "format"}


def _module_state(path: Path) -> set[str]:
    """The names a module binds at its top level to a value that can change: a list, dict
    or set, or an object made by a call (``PHASES = Phases()``)."""
    found = set()
    for node in ast.parse(path.read_text()).body:
        value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", 0)]
        if isinstance(value, ast.Call):
            called = value.func.attr if isinstance(value.func, ast.Attribute) else value.func
            mutable = getattr(called, "id", called) not in _IMMUTABLE_CALLS
        else:
            mutable = isinstance(value, ast.List | ast.Dict | ast.Set | ast.ListComp | ast.DictComp)
        found |= {t.id for t in targets if mutable and isinstance(t, ast.Name)}
    return found


def _writes(tree: ast.AST, names: set[str]) -> set[str]:
    """Which of ``names`` the code changes: assigns to (or deletes) an attribute or item
    of, changes in place, or calls a method of (which may change it)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute | ast.Subscript) and not isinstance(node.ctx, ast.Load):
            base = node.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            base = None if node.func.attr in _READERS else node.func.value
        else:
            continue
        while isinstance(base, ast.Attribute | ast.Subscript):
            base = base.value
        if isinstance(base, ast.Name) and base.id in names:
            found.add(base.id)
    return found


def test_no_module_level_state_is_written_from_another_module():
    """A module's top-level mutable state (a record, a registry, a cache) is changed by that
    module alone, through its functions: other modules import it only to read it. (Its
    functions and classes may be called anywhere; an object a loop owns is passed, not
    imported.)"""
    state = {name: _module_state(path) for name, path in MODULES.items()}
    written = []
    for name, path in MODULES.items():
        imported: dict[str, str] = {}
        for module, names, _, _ in _imports(name, path):
            imported |= {n: module for n in names if n in state.get(module, ())}
        imported = {n: m for n, m in imported.items() if m != name}
        for changed in sorted(_writes(ast.parse(path.read_text()), set(imported))):
            written.append(f"{name} changes {imported[changed]}.{changed}")
    assert not written, written
