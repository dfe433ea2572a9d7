"""``llmbench-report [OUTPUT]`` / ``python -m pytest_llmbench.report``: the report without pytest."""

from __future__ import annotations

import argparse
import sys

from pytest_llmbench.report import build_report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llmbench-report", description=__doc__)
    parser.add_argument("output", nargs="?", default=".llmbench",
                        help="the --llmbench-output folder holding results/ (default: .llmbench)")
    parser.add_argument("--fail-on-empty", action="store_true",
                        help="exit 1 when there are no stored results (default: exit 0, write nothing)")
    args = parser.parse_args(argv)
    return build_report(args.output, fail_on_empty=args.fail_on_empty)


if __name__ == "__main__":
    sys.exit(main())
