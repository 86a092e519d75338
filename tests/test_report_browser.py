"""report.html of a real rehearsal, opened in headless Chromium: the first screen answers the
operator, every chart renders, and the page fetches nothing and logs no error (screenshot kept)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from flare_diag.daemon.reports.report_html import CHARTS

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
ARTIFACTS = Path(os.environ.get("FLARE_DIAG_ARTIFACTS", Path(__file__).resolve().parent.parent / "test-artifacts"))
VIEWPORT = {"width": 1280, "height": 900}
# what Chromium needs to start as root in a container with no network (see the machine notes)
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run"]


def _browser_or_skip():
    """Chromium and playwright; under CI their absence is a failure (.ci/run installs both)."""
    missing = None
    if CHROMIUM is None:
        missing = "Chromium is not installed (Debian: apt-get install chromium; .ci/run does it)"
    else:
        try:
            from playwright.sync_api import sync_playwright
            return sync_playwright
        except ImportError:
            missing = "playwright is not installed (pip install -e '.[test]')"
    if os.environ.get("CI"):
        pytest.fail(f"the browser check must run in CI: {missing}")
    pytest.skip(missing)


@pytest.fixture(scope="module")
def opened_report(default_rehearsal):
    """The default rehearsal's report.html as Chromium shows it at 1280x900: what a person sees
    first, every chart's box, and every request and console message the page caused."""
    sync_playwright = _browser_or_skip()
    _rc, _r, out = default_rehearsal
    page_path = out / "report.html"
    requests, problems, seen = [], [], {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = browser.new_page(viewport=VIEWPORT)
            page.on("request", lambda r: requests.append(r.url))
            page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type in ("error", "warning") else None)
            page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
            page.goto(page_path.as_uri())
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "report-first-screen.png"))
            page.screenshot(path=str(ARTIFACTS / "report-full.png"), full_page=True)
            for sel in ("#outcome", "#restoration-line", "#verdict", "#cells", "#detail", *(f"#{cid}" for cid, *_ in CHARTS)):
                box = page.locator(sel).bounding_box()
                seen[sel] = box
            seen["ticks"] = {cid: page.locator(f"#{cid} .tick-x, #{cid} .tick-y").count() for cid, *_ in CHARTS}
            seen["request rows shown"] = page.locator("table.requests tr").first.is_visible()
            seen["request tables"] = page.locator("details table.requests").count()
            for sec in ("costs", "starting-observation"):
                seen[f"#{sec}"] = page.locator(f"#{sec}").bounding_box()
                seen[f"{sec} table"] = page.locator(f"#{sec} ~ .tw table").first.inner_text()
            seen["starting text"] = page.locator("#starting-observation + p").inner_text()
        finally:
            browser.close()
    return page_path, requests, problems, seen


def test_report_html_fetches_nothing_and_logs_no_error(opened_report):
    page_path, requests, problems, _seen = opened_report
    assert requests == [page_path.as_uri()]  # the page itself, nothing else
    assert problems == []
    assert (ARTIFACTS / "report-first-screen.png").stat().st_size > 10_000


def test_the_outcome_restoration_line_and_verdict_are_on_the_first_screen(opened_report):
    seen = opened_report[3]
    for sel in ("#outcome", "#restoration-line", "#verdict"):
        box = seen[sel]
        assert box is not None and box["height"] > 0, sel
        assert box["y"] < VIEWPORT["height"], f"{sel} starts at {box['y']} px, below the first screen"


def test_every_chart_renders_with_ticks_between_the_cells_and_the_per_request_detail(opened_report):
    seen = opened_report[3]
    for cid, *_ in CHARTS:
        box = seen[f"#{cid}"]
        assert box is not None and box["width"] > 300 and box["height"] > 40, cid
        assert seen["#cells"]["y"] < box["y"] < seen["#detail"]["y"], cid
        assert seen["ticks"][cid] >= 2, cid


def test_per_request_rows_are_collapsed_until_opened(opened_report):
    seen = opened_report[3]
    assert seen["request tables"] > 0 and seen["request rows shown"] is False


def test_the_reproducers_page_renders_its_charts_with_no_error_or_request(default_rehearsal, tmp_path):
    from flare_diag.daemon.cli.commands import main
    sync_playwright = _browser_or_skip()
    out = default_rehearsal[2]
    assert main(["reproduce", str(out / "log.db"), "--policies", "lru_leaf,marconi,protect_full_prompt,block_lru",
                 "--out", str(tmp_path)]) == 0
    page_path = tmp_path / "reproduce.html"
    requests, problems = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = browser.new_page(viewport=VIEWPORT)
            page.on("request", lambda r: requests.append(r.url))
            page.on("console", lambda m: problems.append(m.text) if m.type in ("error", "warning") else None)
            page.on("pageerror", lambda e: problems.append(str(e)))
            page.goto(page_path.as_uri())
            boxes = [page.locator(sel).bounding_box() for sel in ("#chart-reused", "#chart-churn")]
            ticks = page.locator(".tick-x").count()
            page.screenshot(path=str(ARTIFACTS / "reproduce.png"), full_page=True)
        finally:
            browser.close()
    assert requests == [page_path.as_uri()] and problems == []
    assert all(b is not None and b["width"] > 300 and b["height"] > 40 for b in boxes) and ticks >= 4


def test_the_cost_decomposition_and_the_starting_observation_are_shown_in_the_evidence(opened_report):
    seen = opened_report[3]
    for sec in ("#costs", "#starting-observation"):
        box = seen[sec]
        assert box is not None and box["height"] > 0, sec
        assert seen["#cells"]["y"] < box["y"] < seen["#detail"]["y"], sec
    costs = seen["costs table"]
    for col in ("first byte p50 (s)", "TTFT p50 (s)", "decode p50 (ms/token)", "output p50 (tokens/s)", "host transfer (s)"):
        assert col in costs, col
    assert "A.forward_prime" in costs and "trace.C4.r1.on" in costs and "not exposed" in costs
    assert "A.forward_prime: REPRODUCED" in seen["starting text"]
    for line in ("stores_per_request", "records", "bytes_used", "restored_tokens"):
        assert line in seen["starting-observation table"], line


@pytest.mark.parametrize("width", [800, 1280])
def test_at_a_laptops_width_no_table_or_command_overflows_the_page_and_the_cells_fit(default_rehearsal, width):
    sync_playwright = _browser_or_skip()
    page_path = default_rehearsal[2] / "report.html"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = browser.new_page(viewport={"width": width, "height": 900})
            page.goto(page_path.as_uri())
            page.screenshot(path=str(ARTIFACTS / f"report-{width}px.png"))
            seen = page.evaluate("""() => {
              const cw = document.documentElement.clientWidth;
              // an element past the right edge counts unless a box of its own scrolls it, within the page
              const outside = [];
              for (const el of document.querySelectorAll('table, pre, code, svg, figure, p, li')) {
                const r = el.getBoundingClientRect();
                if (r.width === 0 || r.right <= cw + 1) continue;
                let p = el.parentElement, held = false;
                while (p) {
                  if (getComputedStyle(p).overflowX === 'auto') { held = p.getBoundingClientRect().right <= cw + 1; break; }
                  p = p.parentElement;
                }
                if (!held) outside.push(el.tagName + ' ' + (el.id || el.className) + ' ' + Math.round(r.right));
              }
              const cells = document.querySelector('#cells');
              return {page: [document.documentElement.scrollWidth, cw], outside,
                      cells: [cells.scrollWidth, cells.parentElement.clientWidth]};
            }""")
        finally:
            browser.close()
    assert seen["page"][0] <= seen["page"][1], f"the page scrolls sideways at {width} px: {seen}"
    assert seen["outside"] == [], seen["outside"]
    assert seen["cells"][0] <= seen["cells"][1], f"the cells table needs scrolling at {width} px: {seen['cells']}"
