"""REPORT.html: the same report as REPORT.md, as one page that needs nothing else.

The markdown is the one source of the report's words and numbers; this module only renders it
(markdown-it-py: CommonMark plus tables) and makes the page stand alone and easy to use:
- every figure is embedded as a ``data:`` URI, so the file can be mailed or attached to a CI run;
  nothing is fetched from anywhere (no fonts, scripts or styles from elsewhere);
- every heading gets the id GitHub would give it, so the markdown's own ``#links`` work, and the
  page opens with a list of its sections;
- every table sits in its own scrolling box (a wide table never widens the page) and sorts by the
  column whose header is clicked, numbers as numbers ("14,767 (14,012 to 15,523)" sorts as 14767,
  "-" last);
- printing opens the folded ``<details>`` and lays the page out in landscape.
tests/unit/test_report_html.py loads the page in headless Chromium and fails on any network request
or console error, or when a table does not sort.
"""

from __future__ import annotations

import base64
import hashlib
import html
import re
from pathlib import Path

from markdown_it import MarkdownIt
from markdown_it.token import Token

STYLE = """
:root { color-scheme: light; --rule: #d0d7de; --muted: #57606a; --head: #f3f5f7; --stripe: #fafbfc; }
body { font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif;
       color: #1f2328; margin: 0 auto; padding: 1rem 1.5rem 3rem; max-width: 90rem; }
h1 { font-size: 1.7rem; margin: .5rem 0 .25rem; }
h2 { font-size: 1.3rem; margin-top: 2.2rem; padding-bottom: .2rem; border-bottom: 1px solid var(--rule); }
h3 { font-size: 1.1rem; margin-top: 1.5rem; }
p, li { max-width: 60rem; }
code { font: .88em ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; background: var(--head);
       padding: .05em .3em; border-radius: 3px; }
nav.contents { background: var(--head); border: 1px solid var(--rule); border-radius: 6px;
               padding: .4rem 1rem; margin: 1rem 0; }
nav.contents ul { margin: .2rem 0; padding-left: 1.2rem; columns: 3 14rem; }
.table-wrap { overflow-x: auto; margin: .6rem 0 1rem; border: 1px solid var(--rule); border-radius: 6px;
              max-height: 80vh; }
table { border-collapse: collapse; font-size: 13px; font-variant-numeric: tabular-nums; width: max-content;
        min-width: 100%; }
th, td { padding: .3rem .6rem; border-bottom: 1px solid var(--rule); text-align: left; vertical-align: top; }
td.num, th.num { text-align: right; white-space: nowrap; }
thead th { position: sticky; top: 0; background: var(--head); z-index: 1; }
tbody tr:nth-child(even) { background: var(--stripe); }
tbody tr:hover { background: #eef4ff; }
th button { all: unset; cursor: pointer; font-weight: 600; }
th button:focus-visible { outline: 2px solid #0969da; }
th .arrow { font-size: .75em; padding-left: .25em; }
th[aria-sort="ascending"] .arrow::after { content: "\\25B2"; }
th[aria-sort="descending"] .arrow::after { content: "\\25BC"; }
img { max-width: 100%; height: auto; border: 1px solid var(--rule); border-radius: 6px; }
details { margin: .5rem 0 1rem; }
summary { cursor: pointer; color: var(--muted); }
footer { color: var(--muted); font-size: .85rem; margin-top: 3rem; }
@page { size: A4 landscape; margin: 12mm; }
@media print {
  body { max-width: none; padding: 0; font-size: 11px; }
  nav.contents { display: none; }
  .table-wrap { overflow: visible; max-height: none; border: 0; }
  table { font-size: 9px; width: 100%; }
  thead th { position: static; }
  h2 { break-after: avoid; }
  img, tr { break-inside: avoid; }
}
"""

# Sorting: a button in every header cell (keyboard and screen readers reach it); the sort order is
# shown by aria-sort. Empty cells and "-" go last both ways; numbers sort before words. A column
# whose every value starts with a number is right-aligned.
SCRIPT = """
"use strict";
function sortKey(text) {
  const t = text.trim();
  if (t === "" || t === "-") return null;
  const m = t.replace(/,/g, "").match(/^[$]?([+-]?(?:\\d+\\.?\\d*|\\.\\d+)(?:e[+-]?\\d+)?)/i);
  return m ? parseFloat(m[1]) : t.toLowerCase();
}
function compareKeys(a, b) {
  if (typeof a === "number" && typeof b === "number") return a - b;
  if (typeof a === "number") return -1;
  if (typeof b === "number") return 1;
  return a.localeCompare(b, undefined, {numeric: true});
}
function sortTable(table, column, header) {
  const ascending = header.getAttribute("aria-sort") !== "ascending";
  for (const cell of table.tHead.rows[0].cells) cell.setAttribute("aria-sort", "none");
  header.setAttribute("aria-sort", ascending ? "ascending" : "descending");
  const body = table.tBodies[0];
  const text = row => (row.cells[column] ? row.cells[column].textContent : "");
  const keyed = [...body.rows].map(row => [sortKey(text(row)), row]);
  keyed.sort(([a], [b]) => {
    if (a === null || b === null) return (a === null) - (b === null);
    return ascending ? compareKeys(a, b) : compareKeys(b, a);
  });
  for (const [, row] of keyed) body.appendChild(row);
}
for (const table of document.querySelectorAll("table")) {
  if (!table.tHead || !table.tBodies.length) continue;
  const rows = [...table.tBodies[0].rows];
  for (let column = 0; column < table.tHead.rows[0].cells.length; column++) {
    const cells = rows.map(row => row.cells[column])
      .filter(cell => cell && sortKey(cell.textContent) !== null);
    if (cells.length && cells.every(cell => typeof sortKey(cell.textContent) === "number"))
      for (const cell of [table.tHead.rows[0].cells[column], ...cells]) cell.classList.add("num");
  }
  [...table.tHead.rows[0].cells].forEach((header, column) => {
    if (!header.textContent.trim()) return;
    const button = document.createElement("button");
    button.type = "button";
    button.title = "Sort by this column";
    button.append(...header.childNodes);
    const arrow = document.createElement("span");  // the order, for the eye; aria-sort says it aloud
    arrow.className = "arrow";
    arrow.setAttribute("aria-hidden", "true");
    button.append(arrow);
    header.append(button);
    header.setAttribute("aria-sort", "none");
    button.addEventListener("click", () => sortTable(table, column, header));
  });
}
addEventListener("beforeprint", () => {
  for (const details of document.querySelectorAll("details")) details.open = true;
});
"""

# The page may load nothing from anywhere and run no script but its own: SCRIPT by its SHA-256
# (CSP Level 2 hash source), so a script that reached the page some other way would not run.
# Styles: the page's own and markdown-it's table alignment attributes (no code runs from CSS here).
SCRIPT_HASH = base64.b64encode(hashlib.sha256(SCRIPT.encode()).digest()).decode()
POLICY = (f"default-src 'none'; img-src data:; style-src 'unsafe-inline'; "
          f"script-src 'sha256-{SCRIPT_HASH}'")
# The only raw HTML REPORT.md may carry: the template's folded sections
# (pytest_llmbench/report/templates). Any other tag is shown as text; stored strings never reach here as
# tags (report/escape.py).
OWN_HTML = re.compile(r"^(<details><summary>[^<>]*</summary>|</details>)\s*$")

PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="{policy}">
<title>{title}</title>
<style>{style}</style>
</head>
<body>
{header}
<nav class="contents" aria-label="Sections"><strong>Sections</strong>
<ul>
{contents}
</ul>
</nav>
{body}
<footer>The same report as REPORT.md, from the same data; written by pytest-llmbench.</footer>
<script>{script}</script>
</body>
</html>
"""


def render_html(markdown: str, report_dir: Path) -> str:
    """The report page for ``markdown`` (REPORT.md's text); figures are read from ``report_dir``."""
    md = MarkdownIt("commonmark", {"html": True}).enable("table")
    md.add_render_rule("table_open", lambda *_: '<div class="table-wrap"><table>\n')
    md.add_render_rule("table_close", lambda *_: "</table></div>\n")
    tokens = md.parse(markdown)
    sections = _give_headings_ids(tokens)
    for token in tokens:
        if token.type == "html_block" and not OWN_HTML.match(token.content):
            _as_text(token)
        for child in token.children or []:
            if child.type == "image":
                _embed(child, report_dir)
            elif child.type == "html_inline":
                _as_text(child)
        _unlink(token)
    body = md.renderer.render(tokens, md.options, {})
    # the first h1 and the paragraph under it stay above the list of sections
    split = body.find("<h2")
    header, body = (body[:split], body[split:]) if split >= 0 else ("", body)
    title = next((text for level, text, _ in sections if level == 1), "Benchmark report")
    contents = "\n".join(f'<li><a href="#{slug}">{html.escape(text)}</a></li>'
                         for level, text, slug in sections if level == 2)
    return PAGE.format(policy=POLICY, title=html.escape(title), style=STYLE, header=header, contents=contents,
                       body=body, script=SCRIPT)


def slug(text: str) -> str:
    """GitHub's heading anchor: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def _give_headings_ids(tokens: list[Token]) -> list[tuple[int, str, str]]:
    """Set each heading's id as GitHub does (a repeat gets -1, -2...); [(level, text, id)]."""
    seen: dict[str, int] = {}
    sections = []
    for opening, inline in zip(tokens, tokens[1:], strict=False):
        if opening.type != "heading_open":
            continue
        text = "".join(child.content for child in inline.children or []
                       if child.type in ("text", "code_inline"))
        base = slug(text)
        anchor = base if base not in seen else f"{base}-{seen[base]}"
        seen[base] = seen.get(base, 0) + 1
        opening.attrSet("id", anchor)
        sections.append((int(opening.tag[1]), text, anchor))
    return sections


def _as_text(token: Token) -> None:
    """Raw HTML the report did not write: shown as the text it is, never as markup."""
    token.type = "text" if token.type == "html_inline" else "code_block"  # both escaped when rendered


def _unlink(token: Token) -> None:
    """Links in ``token``'s inline children that leave the page become their text: the page's own
    ``#anchors`` stay links; a web address, a file beside the report (metrics.csv, which a mailed
    page does not carry) or a script URL is shown, not followed."""
    children, kept, depth = token.children or [], [], 0
    for child in children:
        if child.type == "link_open" and (depth or not str(child.attrGet("href") or "").startswith("#")):
            depth += 1
            continue
        if child.type == "link_close" and depth:
            depth -= 1
            continue
        kept.append(child)
    if token.children is not None:
        token.children = kept


def _embed(image: Token, report_dir: Path) -> None:
    """An image of the report folder as a data: URI; any other image (a web address, a file outside
    the report folder) or a figure that is not there is shown as its alt text, saying why."""
    src = str(image.attrGet("src") or "")
    path = (report_dir / src).resolve()
    web = src.startswith(("data:", "http:", "https:", "//"))
    outside = web or not path.is_relative_to(report_dir.resolve())
    if outside or not path.is_file():
        image.attrSet("src", "data:,")
        # markdown-it renders an image's alt from its children, not from the attribute
        why = "not a figure of this report" if outside else "is missing"
        image.children = [Token("text", "", 0, content=f"{image.content} (figure {src} {why})")]
        return
    kind = {".png": "image/png", ".svg": "image/svg+xml"}.get(path.suffix.lower(), "application/octet-stream")
    image.attrSet("src", f"data:{kind};base64,{base64.b64encode(path.read_bytes()).decode()}")
