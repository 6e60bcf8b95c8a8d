"""The examples in the adapters' docstrings run and print what they show (ciclo-core's
are run by its own tests/test_docs.py)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

PACKAGES = ("ciclo_flax", "ciclo_haiku", "ciclo_equinox")
MODULES = sorted(
    m.name
    for package in PACKAGES
    for m in pkgutil.walk_packages(importlib.import_module(package).__path__, f"{package}.")
)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS, raise_on_error=False)
    assert result.failed == 0, f"{result.failed} docstring example(s) of {name} failed"


def test_the_adapters_have_examples():
    finder = doctest.DocTestFinder()
    examples = {
        name: sum(len(t.examples) for t in finder.find(importlib.import_module(name)))
        for name in MODULES
    }
    assert sum(examples.values()) > 0, examples
