"""The report's sections: each computes and formats its own rows beside its template part.

    Section   a name, ``variables(view) -> {template variable: value}`` (its rows, formatted),
              and its Jinja part: ``templates/sections/<name>.md.j2``, or ``template`` (the text)
              for a section a plugin adds
    View      what every section reads: the loaded store (``loaded``, with ``loaded.scale``), the
              figures drawn (``plots``: file -> title) and the output folder

REPORT.md is the parts rendered in order (report/__init__.py keeps the built-in list and the one
render loop); a part sees only its own section's variables. A plugin adds a section through its
``pytest_llmbench_report_sections`` hook (hookspecs.py), which the plugin and ``llmbench-report``
both call, or by calling ``register``; it goes after the section its ``after`` names.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pandas, for the annotation only: the plugin registers sections without loading it
    from pytest_llmbench.report.load import Loaded

Variables = dict[str, Any]


@dataclass
class View:
    loaded: Loaded
    plots: dict[str, str] | None  # None: not drawn (build_report draw=False)
    output: Path


@dataclass(frozen=True)
class Section:
    name: str
    variables: Callable[[View], Variables]
    template: str | None = None  # a plugin's part as Jinja text; None: templates/sections/<name>.md.j2
    after: str = "stragglers"  # a plugin's section goes after this one (built-in: the list's order)


_ADDED: dict[str, Section] = {}


def register(section: Section) -> Section:
    """Add a plugin's section (once per name; a second, different one is an error)."""
    if _ADDED.get(section.name, section) != section:
        raise ValueError(f"report section {section.name!r} is already registered")
    _ADDED[section.name] = section
    return section


def ordered(builtin: Sequence[Section]) -> list[Section]:
    """The built-in sections with each plugin's after the one it names (at the end, before none,
    when that name is not a section)."""
    names = {s.name for s in builtin}
    if clash := names & set(_ADDED):
        raise ValueError(f"report section(s) {', '.join(sorted(clash))}: a built-in section's name")
    out = list(builtin)
    for section in _ADDED.values():
        at = next((i for i, s in enumerate(out) if s.name == section.after), len(out) - 1)
        out.insert(at + 1, section)
    return out
