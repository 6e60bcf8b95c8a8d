"""The rules of docs/architecture.md, checked on the source: which folder may import which,
no private name imported across modules, no import cycle, one owner of the checkpoint
format, and core never imports a framework."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import ciclo

SOURCE = Path(ciclo.__file__).parent

#: What each folder may import from the rest of ciclo (docs/architecture.md, "The map").
ALLOWED = {
    "_processes": set(),
    "_data": set(),
    "_time": {"_processes"},
    "_records": {"_processes", "_time"},
    "_loop": {"_processes", "_time", "_records"},
    "callbacks": {"_processes", "_time", "_records", "_loop", "_checkpoint"},
    "_checkpoint": {"_processes", "_time", "_records", "_loop", "_loops"},
    "managed": {"_processes", "_records", "_loop"},
    "_loops": {"_processes", "_time", "_records", "_loop", "callbacks", "_checkpoint"},
    "adapters": {
        "_processes",
        "_time",
        "_records",
        "_loop",
        "_loops",
        "_checkpoint",
        "callbacks",
        "managed",
    },
}
#: What the folders below the loops may take from ``_loop``: its contract, not its engine.
LOOP_CONTRACT = {"ciclo._loop._hooks", "ciclo._loop._state"}
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


def _imports(name: str, path: Path, *, top_level_only: bool = False):
    """``(imported module, imported names, line)`` for each import of ``name``."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else ast.walk(tree)
    for node in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, [], node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = _package_of(name, path).split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            yield module, [a.name for a in node.names], node.lineno


def _folder(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in ALLOWED) else None


def test_every_folder_is_mapped():
    folders = {p.name for p in SOURCE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == set(ALLOWED), "a new folder needs its entry in ALLOWED and the map"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_folders_import_only_what_the_map_allows(name):
    source = _folder(name)
    if source is None:  # ciclo/__init__.py, testing.py: the public surface re-exports all
        return
    for module, _, line in _imports(name, MODULES[name]):
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
    for module, _, line in _imports(name, MODULES[name]):
        if module.startswith("ciclo._loop."):
            assert module in LOOP_CONTRACT, (
                f"{name} (line {line}) imports {module}: outside the loops, only the contract "
                f"({sorted(LOOP_CONTRACT)}) is imported from ciclo._loop"
            )


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_private_name_is_imported_across_modules(name):
    for module, names, line in _imports(name, MODULES[name]):
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
        for module, names, _ in _imports(name, MODULES[name])
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


@pytest.mark.parametrize("name", sorted(MODULES))
def test_core_never_imports_a_framework(name):
    for module, _, line in _imports(name, MODULES[name]):
        assert module.split(".")[0] not in FRAMEWORKS, f"{name} (line {line}) imports {module}"


def test_one_module_owns_the_checkpoint_format():
    owners = sorted(
        name
        for name, path in MODULES.items()
        if any(m.split(".")[0] == "orbax" for m, _, _ in _imports(name, path))
    )
    assert owners == ["ciclo._checkpoint._format"]


def test_module_imports_have_no_cycle():
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        targets = set()
        for module, names, _ in _imports(name, path, top_level_only=True):
            for candidate in (module, *(f"{module}.{n}" for n in names)):
                if candidate in MODULES and candidate != name:
                    targets.add(candidate)
        graph[name] = {t for t in targets if not name.startswith(t + ".")}
    # Packages' __init__ files re-export their own modules: an edge into a package is an
    # edge into the modules it re-exports, which the walk below follows anyway.
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = [*trail[trail.index(nxt) :], nxt] if nxt in trail else [node, nxt]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt, [*trail, nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
