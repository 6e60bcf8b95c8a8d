"""The built documentation site (``nox -s docs`` builds it into site/ and runs this file),
opened in a real headless browser: Playwright driving Chromium (Debian's ``chromium``
package, or Playwright's own build). Skipped, saying why, when no browser can be started.

- The API reference's page of the loop shows ``ciclo.loop`` in its first screen.
- No code block on the home page is clipped (wider than its box).

A screenshot of the loop page is saved as ``site/_screenshots/loop.png``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SITE = Path(os.environ.get("CICLO_SITE", ROOT / "site"))
VIEWPORT = {"width": 1280, "height": 800}  # a laptop's screen

playwright_api = pytest.importorskip(
    "playwright.sync_api", reason="Playwright is not installed (nox -s docs installs it)"
)


def _chromium() -> str | None:
    """Debian's Chromium (apt-get install chromium), or None for Playwright's own."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


@pytest.fixture(scope="module")
def browser():
    if not (SITE / "index.html").exists():
        pytest.skip(f"no built site in {SITE}: run nox -s docs")
    with playwright_api.sync_playwright() as p:
        try:
            browser = p.chromium.launch(executable_path=_chromium(), args=["--no-sandbox"])
        except Exception as error:  # no browser on this machine
            pytest.skip(
                f"no headless browser could be started ({str(error).splitlines()[0]}); "
                f"install Debian's chromium (apt-get install chromium) or run "
                f"`playwright install chromium`"
            )
        yield browser
        browser.close()


def _open(browser, page_path: str):
    page = browser.new_page(viewport=VIEWPORT)
    page.goto((SITE / page_path).as_uri())
    page.wait_for_load_state("load")
    return page


def test_loop_is_in_the_first_screen_of_its_page(browser):
    page = _open(browser, "api/loop/index.html")
    heading = page.locator('[id="ciclo.loop"]')
    box = heading.bounding_box()
    assert box is not None, "the page has no entry ciclo.loop"
    assert box["y"] >= 0, box
    assert box["y"] + box["height"] <= VIEWPORT["height"], box
    assert "ciclo.loop" in heading.inner_text()
    shots = SITE / "_screenshots"
    shots.mkdir(exist_ok=True)
    page.screenshot(path=str(shots / "loop.png"))
    page.close()


def test_no_code_is_clipped_on_the_home_page(browser):
    page = _open(browser, "index.html")
    # the longest line of each code block wider than its box
    clipped = page.evaluate(
        """() => [...document.querySelectorAll("pre > code")]
            .filter(code => code.scrollWidth > code.clientWidth + 1)
            .map(code => code.innerText.split("\\n")
                .reduce((a, b) => (b.length > a.length ? b : a), ""))"""
    )
    assert page.locator("pre > code").count() > 0
    assert clipped == [], f"code wider than its box on the home page: {clipped}"
    page.close()
