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
    missing = []
    for module in modules:
        for name in dir(module):
            value = getattr(module, name)
            if name.startswith("_") or isinstance(value, type(ciclo)):
                continue
            path = f"{module.__name__}.{name}"
            if path in entries or path in tabled or module.__name__ in entries:
                continue
            if any(
                getattr(other, name, None) is value
                and (other.__name__ in entries or f"{other.__name__}.{name}" in entries)
                for other in modules
            ):
                continue  # rendered under another public path: ciclo.keras_bar is
                # ciclo.callbacks.keras_bar, ciclo.callbacks.Checkpoint is ciclo.Checkpoint
            missing.append(path)
    assert missing == [], f"public names without an entry in docs/api/: {missing}"
