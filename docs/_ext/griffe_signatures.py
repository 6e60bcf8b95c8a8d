"""A griffe extension for the API reference: a public function that a call builds from
another's signature (``weights_plan = _planning(load_weights)``) is shown as a function,
with that signature, the return annotation and the docstring of the function the call
defines (read from the source: the site imports nothing), instead of as the assignment.

Configured in ``mkdocs.yml`` as ``{built function's path: path of the function whose
signature it takes}``.
"""

from __future__ import annotations

import ast
import copy
from typing import Any

import griffe


class SignatureTakers(griffe.Extension):
    def __init__(self, takers: dict[str, str]) -> None:
        self.takers = takers

    def on_attribute_instance(self, *, attr: Any, agent: Any, **kwargs: Any) -> None:
        if attr.path not in self.takers:
            return
        giver = attr.parent[self.takers[attr.path].rpartition(".")[2]]
        tree = ast.parse(attr.filepath.read_text(encoding="utf-8"))
        inner = next(  # the function of that name that a module-level function defines
            node
            for outer in tree.body
            if isinstance(outer, ast.FunctionDef)
            for node in ast.walk(outer)
            if isinstance(node, ast.FunctionDef) and node.name == attr.name
        )
        function = griffe.Function(
            attr.name,
            lineno=attr.lineno,
            endlineno=attr.endlineno,
            parameters=copy.deepcopy(giver.parameters),
            returns=ast.unparse(inner.returns) if inner.returns else None,
        )
        function.docstring = griffe.Docstring(
            ast.get_docstring(inner) or "",
            parent=function,
            parser=agent.docstring_parser,
            parser_options=agent.docstring_options,
        )
        attr.parent.set_member(attr.name, function)
