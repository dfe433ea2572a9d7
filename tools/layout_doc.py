"""Print the code's layout, one line a module with the first line of its docstring, as the block
in docs/GUIDE.md's Layout section.

    python tools/layout_doc.py > /tmp/layout.md   # then paste between the markers in docs/GUIDE.md

tests/unit/test_tables.py fails when docs/GUIDE.md no longer holds this exact block, or when a
module has no docstring: the layout is written where the code is, and cannot drift from it.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("harness", "pytest_llmbench")
BEGIN = "<!-- layout: tools/layout_doc.py -->"
END = "<!-- end of layout -->"


def modules() -> list[Path]:
    """Every module of the packages, in path order (__init__ first in its folder)."""
    found = [p for package in PACKAGES for p in (ROOT / package).rglob("*.py")
             if "__pycache__" not in p.parts]
    return sorted(found, key=lambda p: (p.parent.relative_to(ROOT).parts, p.name != "__init__.py", p.name))


def summary(path: Path) -> str | None:
    """The first sentence of the module's docstring (its first paragraph up to ". "), or None."""
    doc = ast.get_docstring(ast.parse(path.read_text()))
    if not doc:
        return None
    paragraph = " ".join(line.strip() for line in doc.strip().split("\n\n")[0].splitlines())
    first, dot, _ = paragraph.partition(". ")
    return first + "." if dot else paragraph


def render(width: int = 110) -> str:
    names = [str(p.relative_to(ROOT)) for p in modules()]
    column = max(map(len, names)) + 6
    lines = [BEGIN, ""]
    for name, path in zip(names, modules(), strict=True):
        text = textwrap.wrap(summary(path) or "(no docstring)", width - column)
        lines.append(f"    {name:<{column - 4}}{text[0]}")
        lines += [" " * column + more for more in text[1:]]
    return "\n".join([*lines, "", END])


if __name__ == "__main__":
    print(render())
