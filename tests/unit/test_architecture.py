"""docs/ARCHITECTURE.md is held to the code, as the GUIDE's layout is: every path it names exists, and
it names every package and top-level module of harness/ and pytest_llmbench/ (a module added without a
word on where it fits shows here)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "ARCHITECTURE.md").read_text()


def test_every_path_it_names_exists():
    named = set(re.findall(r"`((?:harness|pytest_llmbench|tests|tools|docs)/[\w/.*-]*)`", PAGE))
    assert len(named) >= 30
    missing = [p for p in sorted(named) if not list(ROOT.glob(p.rstrip("/")))]
    assert missing == []


def test_it_names_every_package_and_top_level_module():
    parts = []
    for package in ("harness", "pytest_llmbench"):
        for path in sorted((ROOT / package).iterdir()):
            if path.is_dir() and (path / "__init__.py").exists():
                parts.append(f"{package}/{path.name}/")
            elif path.suffix == ".py" and path.name not in ("__init__.py", "__main__.py"):
                parts.append(f"{package}/{path.name}")
    unnamed = [p for p in parts if p not in PAGE]
    assert unnamed == []
