"""report.html opens in headless Chromium with no console errors and no network request (screenshotted)."""

from __future__ import annotations

import shutil

import pytest

from daemon.publish import build_report, render
from tests.logtools import write_window

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)


async def test_report_html_renders_in_headless_chromium_without_errors_or_network(tmp_path):
    if CHROMIUM is None:
        pytest.skip("Chromium is not installed here (Debian: apt-get install chromium); the HTML check needs a browser")
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        pytest.skip("playwright is not installed (pip install -e '.[browser]'); it drives the system Chromium")
    await write_window(tmp_path / "log.db")
    page_path = tmp_path / "report.html"
    page_path.write_bytes(render(build_report(tmp_path / "log.db", "w-report"), "html"))
    requests, problems = [], []
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = await browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("request", lambda r: requests.append(r.url))
            page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type in ("error", "warning") else None)
            page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
            await page.goto(page_path.as_uri())
            await page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
            svgs = await page.locator("svg").count()
            collapsed = await page.locator("details:not([open])").count()
        finally:
            await browser.close()
    assert requests == [page_path.as_uri()]  # the page itself, nothing else
    assert problems == []
    assert svgs == 3 and collapsed >= 1
    assert (tmp_path / "report.png").stat().st_size > 10_000
