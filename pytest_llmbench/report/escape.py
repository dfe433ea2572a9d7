"""Stored strings in REPORT.md: text, never markup.

A stored result is untrusted input (a file anyone can edit, mail or attach), and REPORT.md becomes
REPORT.html, the page people open. So every value the template prints is escaped for markdown
(``text``) unless the report wrote it as markdown itself (``Markdown``, whose own stored parts were
escaped with ``text`` as it was built). The template's environment applies ``text`` to every
``{{ value }}`` (jinja2's ``finalize``); ``code`` is for a value inside a code span.

``text`` backslash-escapes what could start markup or end a table cell (CommonMark: any ASCII
punctuation may be escaped and then renders as itself): ``<`` ``>`` ``&`` (HTML, entities), ``[``
``]`` (links, images), `` ` `` (code), ``*`` (emphasis), ``|`` (a table cell), ``#`` (a heading),
``\\`` itself; a line break becomes a space (a value is one table cell or one list item). ``_`` is
left alone: CommonMark never reads an underscore inside a word as emphasis, and names such as
``tokens_per_s`` stay as readable in REPORT.md as they render.

``csv_cell`` is for metrics.csv: a spreadsheet reads a cell that starts with ``=``, ``+``, ``-``,
``@``, a tab or a carriage return as a formula (OWASP's "CSV injection"), so such a text cell gets
a leading ``'``, which spreadsheets show as text; numbers are left alone.
"""

from __future__ import annotations

import re

SPECIAL = re.compile(r"([\\`*\[\]<>|&#])")
LINE_BREAK = re.compile(r"\r\n|[\r\n\u2028\u2029]")


class Markdown(str):
    """Markdown the report wrote itself (bold, code): printed as it is."""


def text(value: object) -> str:
    """``value`` as markdown text that renders as exactly its characters, on one line."""
    return SPECIAL.sub(r"\\\1", LINE_BREAK.sub(" ", str(value)))


def code(value: object) -> Markdown:
    """``value`` for a code span (inside backticks, where backslashes are literal): no backtick,
    no line break."""
    return Markdown(LINE_BREAK.sub(" ", str(value)).replace("`", "'"))


def finalize(value: object) -> object:
    """What jinja2 prints for ``{{ value }}``: strings escaped unless they are ``Markdown``."""
    if isinstance(value, str) and not isinstance(value, Markdown):
        return text(value)
    return value


FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: object) -> object:
    """A metrics.csv cell: text that a spreadsheet would run as a formula is quoted as text."""
    if isinstance(value, str) and value.startswith(FORMULA_START):
        return "'" + value
    return value
