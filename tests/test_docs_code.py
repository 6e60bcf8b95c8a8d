"""Every ```python block of docs/*.md and README.md runs, and the adapter that the adapter
guide (docs/adapters.md) builds passes the conformance suite.

The blocks of one page run in order in one namespace (a page reads as one program). A block
is skipped only when the line just before it is ``<!-- skip: the reason -->``; each skipped
block is its own test that reports the page, the line and the reason.
"""

from __future__ import annotations

import contextlib
import functools
import re
import sys
import tempfile
import types
from dataclasses import dataclass
from pathlib import Path

import pytest

import ciclo.testing

ROOT = Path(__file__).resolve().parents[1]
PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<ticks>`{3,})(?P<info>[^`\n]*)$")
_SKIP = re.compile(r"^\s*<!--\s*skip\s*(?::\s*(?P<reason>.*?))?\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    """A ```python block: where it is, its code, and why it is skipped (or ``None``)."""

    page: Path
    line: int  # the line of the first line of code (1-based)
    code: str
    skip: str | None

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def parse(page: Path) -> list[Block]:
    """The ```python blocks of ``page``, in order.

    Raises:
        ValueError: a skip marker without a reason, or a fence that is never closed.
    """
    lines = page.read_text().splitlines()
    blocks: list[Block] = []
    previous = ""  # the last non-blank line before the current one
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if fence is None:
            if lines[i].strip():
                previous = lines[i]
            i += 1
            continue
        indent, ticks = fence["indent"], fence["ticks"]
        start = i + 1
        end = start
        while end < len(lines) and lines[end].strip() != ticks:
            end += 1
        if end == len(lines):
            raise ValueError(f"{page.name}:{i + 1}: a code fence is never closed")
        if fence["info"].strip().split(" ")[0] == "python":
            marker = _SKIP.match(previous)
            reason = None
            if marker is not None:
                reason = (marker["reason"] or "").strip()
                if not reason:
                    raise ValueError(
                        f"{page.name}:{i}: a skip marker needs a written reason: "
                        f"<!-- skip: why this block cannot run in the tests -->"
                    )
            code = "\n".join(line.removeprefix(indent) for line in lines[start:end])
            blocks.append(Block(page, start + 1, code, reason))
        previous = lines[end]
        i = end + 1
    return blocks


BLOCKS = {page: parse(page) for page in PAGES}
RUNNABLE = [page for page, blocks in BLOCKS.items() if any(b.skip is None for b in blocks)]
SKIPPED = [block for blocks in BLOCKS.values() for block in blocks if block.skip is not None]


def test_the_docs_have_code():
    assert (ROOT / "docs").is_dir()
    assert len(RUNNABLE) >= 2, [p.name for p in RUNNABLE]


def run_page(page: Path, directory: Path) -> types.ModuleType:
    """Runs the page's blocks, in order, in one new module, from ``directory``; a traceback
    points at the page's own line numbers. Returns the module."""
    name = f"docs_{page.stem.replace('-', '_')}"
    module = types.ModuleType(name)
    module.__file__ = str(page)
    sys.modules[name] = module  # dataclasses and pickle look the module up
    with contextlib.chdir(directory):
        for block in BLOCKS[page]:
            if block.skip is not None:
                continue
            source = "\n" * (block.line - 1) + block.code
            try:
                exec(compile(source, str(page), "exec"), module.__dict__)
            except Exception as error:
                error.add_note(f"(in the code block at {block.where})")
                raise
    return module


@pytest.mark.parametrize("page", RUNNABLE, ids=lambda p: str(p.relative_to(ROOT)))
def test_page_code_runs(page, tmp_path):
    run_page(page, tmp_path)


_LINK = re.compile(r"\[[^\]]*\]\(([^)#\s]+)(?:#[^)]*)?\)")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_to_files(page):
    targets = [t for t in _LINK.findall(page.read_text()) if "://" not in t]
    missing = [t for t in targets if not (page.parent / t).exists()]
    assert not missing, f"{page.name} links to missing files: {missing}"


@pytest.mark.parametrize("block", SKIPPED, ids=lambda b: b.where)
def test_skipped_block(block):
    """Shows each skipped block and its reason (it must still be valid Python)."""
    compile(block.code, str(block.page), "exec")
    pytest.skip(f"{block.where}: {block.skip}")


def test_parse_finds_blocks_skip_markers_and_indented_fences(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "Intro\n\n```python\nx = 1\n```\n\n<!-- skip: needs 2 processes -->\n```python\n"
        "y = 2\n```\n\n- a list item:\n\n  ```python\n  z = x + 1\n  ```\n\n```toml\na = 1\n```\n"
    )
    blocks = parse(page)
    assert [(b.line, b.code, b.skip) for b in blocks] == [
        (4, "x = 1", None),
        (9, "y = 2", "needs 2 processes"),
        (15, "z = x + 1", None),
    ]


def test_a_skip_marker_needs_a_reason(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("<!-- skip -->\n```python\nx = 1\n```\n")
    with pytest.raises(ValueError, match="skip marker needs a written reason"):
        parse(page)


# --- the adapter guide's adapter, through the whole conformance suite ----------------------


@functools.cache
def _guide_suite() -> ciclo.testing.AdapterConformance:
    """The conformance class that docs/adapters.md defines for its adapter, instantiated."""
    module = run_page(ROOT / "docs" / "adapters.md", Path(tempfile.mkdtemp()))
    suites = [
        value
        for value in vars(module).values()
        if isinstance(value, type)
        and issubclass(value, ciclo.testing.AdapterConformance)
        and value is not ciclo.testing.AdapterConformance
    ]
    assert len(suites) == 1, f"docs/adapters.md should define one conformance class: {suites}"
    return suites[0]()


class TestAdapterGuideConformance(ciclo.testing.AdapterConformance):
    """Every check of ``ciclo.testing`` on the adapter built in docs/adapters.md, with the
    model and ``create_state`` of the guide's own conformance class."""

    @property
    def adapter(self) -> str:  # type: ignore[override]
        return _guide_suite().adapter

    def make_model(self):
        return _guide_suite().make_model()

    def create_state(self, model, **kwargs):
        return _guide_suite().create_state(model, **kwargs)


def test_the_adapter_guide_skips_no_check():
    assert _guide_suite().skip == {}


def test_the_keras_fit_example_trains_with_epochs(tmp_path):
    """docs/from-keras.md's ``fit(x, y, epochs=5, validation_data=...)`` runs as
    ``train_loop(..., epochs=5, test_dataset=[(x_val, y_val)])``: 5 passes over 8 batches,
    evaluated after each."""
    page = ROOT / "docs" / "from-keras.md"
    keras, ciclo_fit = [b for b in BLOCKS[page] if "fit(" in b.code or "train_loop(" in b.code][:2]
    assert keras.skip is not None
    assert "epochs=5" in keras.code
    assert "validation_data=(x_val, y_val)" in keras.code
    assert ciclo_fit.skip is None
    assert "epochs=5" in ciclo_fit.code
    assert "epoch_duration" not in ciclo_fit.code
    module = run_page(page, tmp_path)
    assert module.elapsed.steps == 40
    assert module.history.collect("steps", "loss_test")[0] == [7, 15, 23, 31, 39]
