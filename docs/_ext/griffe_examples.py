"""A griffe extension for the API reference: ciclo's docstrings title their doctests
``Example:``; griffe's Google parser reads only ``Examples:`` as examples (code), so this
renames the section before the docstrings are parsed."""

from __future__ import annotations

import re
from typing import Any

import griffe

_EXAMPLE = re.compile(r"^(\s*)Example:\s*$", re.MULTILINE)


class ExampleSections(griffe.Extension):
    def on_instance(self, *, obj: Any, **kwargs: Any) -> None:
        docstring = getattr(obj, "docstring", None)
        if docstring is not None and "Example:" in docstring.value:
            docstring.value = _EXAMPLE.sub(r"\1Examples:", docstring.value)
