"""The code's shape (docs/ARCHITECTURE.md, "Rules the code keeps"): no import circle among the
package's modules (imports inside functions counted), no module over 330 lines, no function over 60.
Read from the source with ``ast``; nothing is imported."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("harness", "pytest_llmbench")
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 330, 60


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(tree: ast.Module):
    """Every import a module makes: at its top, inside ``try``/``if`` blocks (``if TYPE_CHECKING``
    among them: a circle only a type checker walks is a circle in the design all the same), and inside
    functions, which run when called: an import moved into a function to dodge a circle at import time
    leaves the circle in the design."""
    yield from (n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)))


def import_graph() -> dict[str, set[str]]:
    """{module: the package modules it imports, anywhere in it}. ``from pkg import name`` depends on
    ``pkg.name`` where that is a module, else on ``pkg`` itself; a parent package's own import (which
    Python runs first) is not an edge: its __init__ importing its submodules is no circle."""
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        deps = set()
        for node in _imports(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name in modules}
                continue
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(up) + (f".{node.module}" if node.module else "")
            for alias in node.names:
                full = f"{base}.{alias.name}"
                deps.add(full if full in modules else base)
        graph[name] = {d for d in deps if d in modules and d != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        for v in graph:
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return found


def test_no_import_circle_among_the_packages_modules():
    graph = import_graph()
    assert len(graph) >= 90 and graph["pytest_llmbench.planner.memory"] >= {"pytest_llmbench.planner.terms"}
    assert circles(graph) == []


def test_a_circle_is_found_where_there_is_one():
    """The walk itself: a two-module circle and a three-module one are found, a chain is not."""
    assert circles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_no_module_over_350_lines_and_no_function_over_60():
    long_modules, long_functions = [], []
    for name, path in _modules().items():
        source = path.read_text()
        if len(source.splitlines()) > MAX_MODULE_LINES:
            long_modules.append((name, len(source.splitlines())))
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long_functions.append((f"{name}.{node.name}", lines))
    assert long_modules == [] and long_functions == []


# The planner modules the report may ask (one question a section: at_scale for "what at N GPUs?",
# memory for the Memory by category section).
REPORT_ASKS = {"pytest_llmbench.planner.at_scale", "pytest_llmbench.planner.memory"}


def test_the_report_asks_the_planner_only_its_questions():
    """No report module computes with the planner's parts itself (issue 48: the report asked it three
    things per profile and built models). Every import of the planner in the report's source, a
    function's own included: the question modules, and three types from the others."""
    allowed = {"pytest_llmbench.planner": {m.rsplit(".", 1)[1] for m in REPORT_ASKS},
               **{m: {"*"} for m in REPORT_ASKS}, "pytest_llmbench.planner.projection": {"Group", "Point"},
               "pytest_llmbench.planner.step": {"Bandwidth"}}
    seen = set()
    for path in sorted((ROOT / "pytest_llmbench" / "report").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([(node.module or "", a.name) for a in node.names] if isinstance(node, ast.ImportFrom)
                     else [(a.name, "*") for a in node.names] if isinstance(node, ast.Import) else [])
            for module, name in names:
                if module.startswith("pytest_llmbench.planner"):
                    assert name in allowed.get(module, ()) or "*" in allowed.get(module, ()), (
                        f"{path.relative_to(ROOT)} imports {name} from {module}")
                    seen.add(f"{module}.{name}")
    assert REPORT_ASKS <= seen
