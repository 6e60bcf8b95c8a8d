"""A griffe extension for the API reference: ciclo's docstrings cross-reference with Sphinx
roles (``:func:`ciclo.loop```, ``:class:`History```, ``:meth:`state_dict```), which
mkdocstrings does not read. Once the package is loaded, each role becomes a link to the
object's entry in the reference (an mkdocs-autorefs ``[`text`][identifier]``) when the
object is rendered on an API page (``docs/api/*.md``), and code otherwise (private helpers).
A role naming a callback's lowercase alias (``:class:`ciclo.keras_bar```) links to its
class.

It also splits the parameters a docstring documents together (``on_start, on_end: ...``)
into one entry each, so that each shows its own type and default.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import griffe

_ROLE = re.compile(r":(?:func|class|meth|mod|attr|data|exc|obj):`(?P<tilde>~?)(?P<target>[^`]+)`")
_DIRECTIVE = re.compile(r"^:::\s+(?P<ident>\S+)\s*$", re.MULTILINE)
_SECTION = re.compile(r"^(?P<indent>\s*)(?:Args|Arguments|Parameters|Attributes):\s*$")
_TOGETHER = re.compile(r"^(?P<indent>\s+)(?P<names>\w+(?:, \w+)+):(?P<rest>.*)$")
_API_PAGES = Path("docs/api")
_PUBLIC_MODULES = ("ciclo", "ciclo.callbacks", "ciclo.managed", "ciclo.adapters", "ciclo.testing")


def _target(obj: Any) -> Any:
    try:
        return obj.final_target if isinstance(obj, griffe.Alias) else obj
    except Exception:  # an alias to something outside the package
        return None


def _documented(obj: Any) -> bool:
    return obj is not None and obj.docstring is not None


def _class_named_by(obj: Any) -> Any:
    """The class that a module-level alias names (``keras_bar = KerasBar``), else ``None``:
    a role naming the alias links to the class's entry, where the callback is documented."""
    if not obj.is_attribute or obj.parent is None or not obj.parent.is_module:
        return None
    member = obj.parent.members.get(str(obj.value)) if obj.value is not None else None
    cls = _target(member)
    return cls if cls is not None and cls.is_class else None


class CrossReferences(griffe.Extension):
    def on_package(self, *, pkg: Any, **kwargs: Any) -> None:
        if pkg.name != "ciclo":
            return
        self.pkg = pkg
        self.rendered = self._rendered()
        for obj in self._walk(pkg):
            docstring = obj.docstring
            if docstring is not None:
                text = _split_together(docstring.value)
                docstring.value = _ROLE.sub(lambda m, o=obj: self._link(m, o), text)

    # --- what the API pages render: canonical path -> its identifier there --------------
    def _rendered(self) -> dict[str, str]:
        rendered: dict[str, str] = {}
        for page in sorted(_API_PAGES.glob("*.md")):
            text = page.read_text()
            for match in _DIRECTIVE.finditer(text):
                ident = match["ident"]
                obj = _target(self._get(ident))
                if obj is None:
                    continue
                if obj.is_module:
                    excluded = re.findall(r'"!\^(\w+)\$"', text)
                    for name, member in obj.members.items():
                        member = _target(member) if not name.startswith("_") else None
                        if _documented(member) and name not in excluded:
                            self._add(rendered, member, f"{ident}.{name}")
                elif _documented(obj):
                    self._add(rendered, obj, ident)
        return rendered

    def _add(self, rendered: dict[str, str], obj: Any, ident: str) -> None:
        rendered.setdefault(obj.canonical_path, ident)
        if obj.is_class:  # its public, documented members are rendered under it
            for name, member in obj.all_members.items():
                member = _target(member)
                if not name.startswith("_") and _documented(member):
                    rendered.setdefault(f"{obj.canonical_path}.{name}", f"{ident}.{name}")

    def _get(self, path: str) -> Any:
        if path == "ciclo":
            return self.pkg
        if not path.startswith("ciclo."):
            return None
        try:
            return self.pkg[path[len("ciclo.") :]]
        except Exception:
            return None

    def _walk(self, obj: Any) -> Any:
        yield obj
        for member in obj.members.values():
            if not isinstance(member, griffe.Alias):
                yield from self._walk(member)

    # --- a role -------------------------------------------------------------------------
    def _link(self, match: re.Match[str], obj: Any) -> str:
        target = match["target"].strip().removesuffix("()")
        shown = target.rsplit(".", 1)[-1] if match["tilde"] else target
        ident = self._resolve(target, obj)
        return f"[`{shown}`][{ident}]" if ident else f"`{shown}`"

    def _resolve(self, target: str, obj: Any) -> str | None:
        candidates = []
        if target.startswith("ciclo."):
            candidates.append(target)
        elif not target.startswith("."):
            module = obj if obj.is_module else obj.module
            cls = obj if obj.is_class else obj.parent if obj.parent and obj.parent.is_class else None
            if cls is not None:
                candidates.append(f"{cls.path}.{target}")
            candidates.append(f"{module.path}.{target}")
            candidates += [f"{m}.{target}" for m in _PUBLIC_MODULES]
        for candidate in candidates:
            found = _target(self._get(candidate))
            if found is not None:
                found = _class_named_by(found) or found
            if found is not None and found.canonical_path in self.rendered:
                return self.rendered[found.canonical_path]
        return None


def _split_together(text: str) -> str:
    """``a, b: description`` in an Args or Attributes section as ``a: description`` and
    ``b: description`` (continuation lines repeated too)."""
    lines = text.splitlines()
    out: list[str] = []
    section: str | None = None  # the indent of the current section's header
    i = 0
    while i < len(lines):
        line = lines[i]
        header = _SECTION.match(line)
        if header:
            section = header["indent"]
        elif line.strip() and section is not None and len(line) - len(line.lstrip()) <= len(section):
            section = None
        together = _TOGETHER.match(line) if section is not None else None
        if together is None:
            out.append(line)
            i += 1
            continue
        indent = together["indent"]
        continuation = []
        i += 1
        while i < len(lines) and lines[i].startswith(indent + " "):
            continuation.append(lines[i])
            i += 1
        for name in together["names"].split(", "):
            out.append(f"{indent}{name}:{together['rest']}")
            out += continuation
    return "\n".join(out)
