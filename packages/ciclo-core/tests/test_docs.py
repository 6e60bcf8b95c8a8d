"""The examples in ciclo-core's docstrings run and print what they show."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import ciclo

MODULES = sorted(m.name for m in pkgutil.walk_packages(ciclo.__path__, "ciclo."))


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS, raise_on_error=False)
    assert result.failed == 0, f"{result.failed} docstring example(s) of {name} failed"


def test_every_public_name_has_an_entry_in_the_api_reference():
    """Each name of ciclo, ciclo.callbacks, ciclo.managed, ciclo.adapters and ciclo.testing
    is rendered on a page of docs/api/ (an entry, a module's members, or the table of named
    schedules), so that the reference is complete and its cross-references resolve."""
    import re
    from pathlib import Path

    import ciclo.testing

    api = Path(__file__).resolve().parents[3] / "docs" / "api"
    if not api.is_dir():
        pytest.skip("docs/api is not in this tree (a built wheel)")
    text = "\n".join(page.read_text() for page in sorted(api.glob("*.md")))
    entries = set(re.findall(r"^::: (\S+)\s*$", text, re.MULTILINE))
    tabled = set(re.findall(r"^\| `(ciclo\.on_\w+)` \|", text, re.MULTILINE))
    modules = (ciclo, ciclo.callbacks, ciclo.managed, ciclo.adapters, ciclo.testing)
    paths: dict[int, set[str]] = {}  # every public path of each object
    for module in modules:
        for name in module.__all__:
            paths.setdefault(id(getattr(module, name)), set()).add(f"{module.__name__}.{name}")
    missing = []
    for module in modules:
        for name in module.__all__:
            path = f"{module.__name__}.{name}"
            if path in tabled or module.__name__ in entries:
                continue
            # rendered under this or another public path: ciclo.keras_bar is
            # ciclo.callbacks.KerasBar
            others = paths[id(getattr(module, name))]
            if not any(other in entries or other.rpartition(".")[0] in entries for other in others):
                missing.append(path)
    assert missing == [], f"public names without an entry in docs/api/: {missing}"
