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
