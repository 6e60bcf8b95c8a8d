"""An mkdocs hook: links from a page to files of the repository outside docs/ (``../examples/
x.py``, ``../benchmarks/RESULTS.md``) point at the repository on GitHub in the site, since the
site holds only docs/."""

from __future__ import annotations

import re
from typing import Any

_OUTSIDE = re.compile(r"\]\(\.\./(?P<path>[^)\s]+)\)")


def on_page_markdown(markdown: str, *, config: Any, **kwargs: Any) -> str:
    base = str(config["repo_url"]).rstrip("/") + "/blob/main/"
    return _OUTSIDE.sub(lambda m: f"]({base}{m['path']})", markdown)
