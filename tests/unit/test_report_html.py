"""REPORT.html: one page that stands alone, says what REPORT.md says, and works in a real browser.

The browser tests drive Debian's ``chromium`` with Playwright (``make test`` installs the
``browser`` extra); without a Chromium they are skipped, except under CI (``CI`` set), where they
fail: .ci/run installs it. What a person would look at, a screenshot at laptop size and the printed
PDF, is kept in ``test-artifacts/`` (or ``$LLMBENCH_ARTIFACTS``).
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest

from pytest_llmbench.report import build_report
from pytest_llmbench.report.html import render_html, slug

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = sorted(p.parent.parent for p in (ROOT / "reports").glob("*/report/REPORT.md"))
ARTIFACTS = Path(os.environ.get("LLMBENCH_ARTIFACTS") or ROOT / "test-artifacts")
CHROMIUM = (os.environ.get("LLMBENCH_CHROMIUM") or shutil.which("chromium")
            or shutil.which("chromium-browser") or shutil.which("google-chrome"))
LAPTOP = {"width": 1366, "height": 768}


class Page(HTMLParser):
    """Every tag's attributes, every heading's text, and the text of each table's cells."""

    def __init__(self, text: str):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.headings: list[tuple[str, str]] = []
        self._heading: str | None = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if re.fullmatch(r"h[1-6]", tag):
            self._heading = ""

    def handle_endtag(self, tag):
        if re.fullmatch(r"h[1-6]", tag) and self._heading is not None:
            self.headings.append((tag, self._heading))
            self._heading = None

    def handle_data(self, data):
        if self._heading is not None:
            self._heading += data

    def all(self, tag: str) -> list[dict]:
        return [attrs for t, attrs in self.tags if t == tag]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """The report of the traced sample (every section but the GPU-only ones), built by this code."""
    out = tmp_path_factory.mktemp("html-report")
    shutil.copytree(ROOT / "reports" / "cpu-trace-sample" / "results", out / "results")
    assert build_report(out, echo=lambda _: None) == 0
    return out / "report"


def test_the_report_writes_the_page_beside_the_markdown_with_every_figure_inside(built):
    page = Page((built / "REPORT.html").read_text())
    figures = sorted((built / "plots").glob("*.png"))
    images = page.all("img")
    assert len(figures) >= 4 and len(images) == len(figures)
    for image in images:
        kind, _, data = image["src"].partition(";base64,")
        assert kind == "data:image/png" and base64.b64decode(data).startswith(b"\x89PNG\r\n\x1a\n")
    # nothing that a browser would fetch: no stylesheet, script, frame or image from a URL
    assert not page.all("link") and not page.all("iframe")
    assert all("src" not in attrs for attrs in page.all("script"))
    policy = next(a["content"] for a in page.all("meta") if a.get("http-equiv") == "Content-Security-Policy")
    assert policy.startswith("default-src 'none'")


def test_the_page_says_what_the_markdown_says(built):
    markdown = (built / "REPORT.md").read_text()
    page = Page((built / "REPORT.html").read_text())
    md_headings = [(f"h{len(m[1])}", m[2]) for m in re.finditer(r"^(#{1,3}) (.+)$", markdown, re.M)]
    assert [(tag, text.replace("`", "")) for tag, text in md_headings] == page.headings
    md_tables = len(re.findall(r"^\|(?:---\|)+", markdown, re.M))
    assert md_tables >= 10 and len(page.all("table")) == md_tables
    # the answer comes first: winners and recommendations before the environment and the tables
    order = [text for _, text in page.headings]
    assert order.index("Winners") < order.index("Recommendations") < order.index("Environment")
    # every link inside the page lands on a heading (GitHub's anchors, as REPORT.md's links expect)
    ids = {attrs["id"] for _, attrs in page.tags if "id" in attrs}
    inner = [a["href"][1:] for a in page.all("a") if a.get("href", "").startswith("#")]
    assert {"caveats", "winners", "trace", "stragglers"} <= set(inner) and set(inner) <= ids


def test_a_heading_gets_the_anchor_github_gives_it():
    assert slug("Memory fit (predicted)") == "memory-fit-predicted"
    assert slug("Does it fit? (estimated)") == "does-it-fit-estimated"
    assert slug("Traffic (measured)") == "traffic-measured"
    page = Page(render_html("## Figures\n\n### A b\n\n### A b\n", Path(".")))
    assert [a["id"] for t, a in page.tags if t == "h3"] == ["a-b", "a-b-1"]


def test_an_image_or_link_that_leaves_the_report_is_shown_not_followed(tmp_path):
    """Images from anywhere but the report's plots and links to anything but the page's own
    headings render as their text: nothing to fetch, nowhere to go (37c90cc raised on a web image,
    so a stored error holding `![log](https://...)` stopped both report commands)."""
    page = Page(render_html("# T\n\n![x](https://example.com/x.png) ![y](../../etc/y.png) "
                            "[web](https://example.com) [js](javascript:alert(1)) [csv](metrics.csv) "
                            "[top](#t)\n", tmp_path))
    assert [a["src"] for a in page.all("img")] == ["data:,", "data:,"]
    assert [a["alt"] for a in page.all("img")] == [
        "x (figure https://example.com/x.png not a figure of this report)",
        "y (figure ../../etc/y.png not a figure of this report)"]
    assert [a["href"] for a in page.all("a")] == ["#t"]


def test_raw_html_is_text_but_the_templates_own_folds():
    out = render_html("<details><summary>Fold</summary>\n\nx\n\n</details>\n\n<script>alert(1)</script>\n\n"
                      "a <img src=x onerror=alert(2)> b\n", Path("."))
    page = Page(out)
    assert [t for t, _ in page.tags if t in ("details", "summary")] == ["details", "summary"]
    assert page.all("img") == [] and out.count("<script>") == 1  # the page's own, at the end
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in out and "&lt;img src=x onerror=alert(2)&gt;" in out


def test_a_missing_figure_keeps_its_alt_text_and_says_it_is_missing(tmp_path):
    """A report folder whose plots/ lost a file still renders: the image names what is missing and
    the page fetches nothing (an empty data: URI, not the lost path)."""
    (tmp_path / "plots").mkdir()
    (tmp_path / "plots" / "here.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    page = Page(render_html("![Step times](plots/gone.png)\n\n![Here](plots/here.png)\n", tmp_path))
    gone, here = (a for t, a in page.tags if t == "img")
    assert gone["src"] == "data:," and gone["alt"] == "Step times (figure plots/gone.png is missing)"
    assert here["src"] == "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n").decode()
    assert here["alt"] == "Here"


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.name)
def test_each_committed_sample_carries_the_page_of_its_markdown(sample):
    report = sample / "report"
    committed = report / "REPORT.html"
    assert committed.is_file(), f"{committed} is missing: rebuild it with pytest --llmbench-report"
    assert committed.read_text() == render_html((report / "REPORT.md").read_text(), report), (
        f"{committed} is stale: rebuild it with pytest --llmbench-report --llmbench-output={sample.name}")


# --- in a real browser -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM:
        if os.environ.get("CI"):
            pytest.fail("CI must run the browser tests: no chromium on PATH (apt-get install chromium)")
        pytest.skip("no chromium on PATH (apt-get install chromium), or set LLMBENCH_CHROMIUM")
    playwright = pytest.importorskip("playwright.sync_api", reason="pip install -e '.[browser]'")
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM)
        yield browser
        browser.close()


def open_page(browser, path: Path, **context):
    """The page at ``path`` in a fresh context; (page, problems): every console error, uncaught
    error and request for anything but the file itself and data: URIs."""
    page = browser.new_context(viewport=LAPTOP, **context).new_page()
    problems: list[str] = []
    page.on("console", lambda m: m.type == "error" and problems.append(f"console error: {m.text}"))
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("request", lambda r: None if r.url.startswith(("data:", path.as_uri())) else problems.append(
        f"request: {r.url}"))
    page.goto(path.as_uri(), wait_until="load")
    return page, problems


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.name)
def test_each_committed_sample_loads_in_chromium_with_nothing_fetched_and_no_errors(browser, sample):
    page, problems = open_page(browser, sample / "report" / "REPORT.html")
    assert problems == []
    broken = page.eval_on_selector_all("img", "all => all.filter(i => !i.complete || !i.naturalWidth).length")
    assert page.locator("img").count() >= 3 and broken == 0
    # readable at laptop size: a wide table scrolls in its own box, never the whole page
    assert page.evaluate("document.documentElement.scrollWidth <= innerWidth")
    assert page.locator("#winners").bounding_box()["y"] < LAPTOP["height"]
    page.context.close()


def column(page, table, name: str) -> list[str]:
    index = table.locator("thead th").all_inner_texts().index(name)
    return table.locator(f"tbody tr td:nth-child({index + 1})").all_inner_texts()


def number(text: str) -> float:
    return float(re.match(r"[+-]?[\d,.]+", text)[0].replace(",", ""))


def test_tables_sort_on_a_click_and_the_page_prints(browser, built):
    page, problems = open_page(browser, built / "REPORT.html")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=ARTIFACTS / "REPORT.png")  # the first screen at laptop size: the answer
    table = page.locator("#all-cases ~ .table-wrap table").first
    before = column(page, table, "tokens/s")
    pairs = sorted(zip(column(page, table, "strategy"), before, strict=True))
    assert len(before) >= 4
    header = table.get_by_role("button", name="tokens/s", exact=True)
    header.click()  # a real mouse click at the header's place on the screen
    ascending = column(page, table, "tokens/s")
    assert [number(t) for t in ascending] == sorted(number(t) for t in before)
    assert sorted(ascending) == sorted(before)  # none lost
    assert header.locator("xpath=..").get_attribute("aria-sort") == "ascending"
    header.click()
    assert [number(t) for t in column(page, table, "tokens/s")] == sorted((number(t) for t in before),
                                                                          reverse=True)
    table.get_by_role("button", name="strategy", exact=True).click()
    strategies = column(page, table, "strategy")
    assert strategies == sorted(strategies) and len(set(strategies)) >= 4
    # each row moved whole: every strategy kept its own tokens/s
    assert sorted(zip(strategies, column(page, table, "tokens/s"), strict=True)) == pairs
    assert problems == []
    table.screenshot(path=ARTIFACTS / "REPORT-sorted-table.png")
    pdf = page.pdf(path=ARTIFACTS / "REPORT.pdf")
    assert pdf.startswith(b"%PDF") and len(pdf) > 100_000
    page.context.close()


# markup for the page, and TeX for matplotlib's mathtext (the names are also titles and legends)
HOSTILE = ("<img src=x onerror=\"window.injected=(window.injected||0)+1\"><script>window.injected=99</script>"
           " $\\frac{x}{$")


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> Path:
    """A store whose strings try to become markup: every field the report prints as text (the
    profile, env.device_name and host, a failed case's error, a null reason, a strategy setting, a
    stored error with a web image, a skipped file's name and reason), built by this code."""
    out = tmp_path_factory.mktemp("hostile")
    shutil.copytree(ROOT / "reports" / "cpu-trace-sample" / "results", out / "results")
    files = sorted((out / "results").glob("*/*-ws2-seq128.json"))
    for i, path in enumerate(files):
        data = json.loads(path.read_text())
        data["env"]["device_name"] = f"dev {HOSTILE}"
        data["env"]["host"] = f"host {HOSTILE} | broken | table"
        data["null_reasons"]["energy_j"] = f"reason {HOSTILE} [click](javascript:alert(3))\n# heading"
        data["strategy_config"]["wrap_policy"] = f"wrap {HOSTILE}"
        if i == 0:
            data.update(status="error", error=f"=HYPERLINK(\"https://example.com\") {HOSTILE} "
                                              f"![log](https://example.com/x.png) [more](https://example.com)",
                        profile=f"cpu{HOSTILE}")
        path.write_text(json.dumps(data))
    session = files[0].parent
    (session / f"x{HOSTILE.replace('/', '')}.json").write_text("{not json " + HOSTILE)
    assert build_report(out, echo=lambda _: None) == 0
    return out / "report"


def test_stored_strings_stay_text_in_the_markdown_and_the_page(hostile):
    markdown = (hostile / "REPORT.md").read_text()
    # only escaped forms (CommonMark: a backslash-escaped character is that character, never markup)
    assert not re.search(r"(?<!\\)<(img|script)|(?<!\\)\]\(javascript", markdown)
    assert markdown.count(r"\<script\>") >= 5
    page = Page((hostile / "REPORT.html").read_text())
    srcs = [a.get("src", "") for a in page.all("img")]
    assert all(src.startswith("data:image/png;base64,") or src == "data:," for src in srcs)
    assert [a for a in page.all("a") if not a["href"].startswith("#")] == []
    assert len([t for t, _ in page.tags if t == "script"]) == 1
    assert "onerror" not in {k for _, attrs in page.tags for k in attrs}
    # metrics.csv: a cell a spreadsheet would run as a formula is quoted as text (CSV injection)
    import pandas as pd

    errors = pd.read_csv(hostile / "metrics.csv").error.dropna().tolist()
    assert errors and all(e.startswith("'=HYPERLINK(") for e in errors)


def test_a_page_built_from_hostile_strings_runs_no_injected_script(browser, hostile):
    """In the real Chromium: no injected element exists, no injected script ran (the page's own
    sorted its tables), and nothing was fetched; the content policy allows the page's own script
    by its hash alone."""
    page, problems = open_page(browser, hostile / "REPORT.html")
    assert problems == []
    assert page.evaluate("window.injected") is None
    assert page.evaluate("document.querySelectorAll('img[onerror], script:not(:last-of-type)').length") == 0
    assert page.locator("th button").count() > 10  # the page's own script ran
    assert "window.injected" in page.locator("body").inner_text()  # shown, as text
    page.context.close()
