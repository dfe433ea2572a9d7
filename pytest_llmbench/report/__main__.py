"""``llmbench-report [OUTPUT]`` / ``python -m pytest_llmbench.report``: the report without pytest."""

from __future__ import annotations

import argparse
import sys

from pytest_llmbench.report import ReportError, build_report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llmbench-report", description=__doc__)
    parser.add_argument("output", nargs="?", default=".llmbench",
                        help="the --llmbench-output folder holding results/ (default: .llmbench)")
    parser.add_argument("--fail-on-empty", action="store_true",
                        help="exit 1 when there are no stored results (default: exit 0, write nothing)")
    parser.add_argument("--session", action="append", default=[], metavar="SESSION",
                        help="report only this stored session (a folder under OUTPUT/results; repeatable). "
                             "Default: every session, the latest run of each case")
    args = parser.parse_args(argv)
    try:
        return build_report(args.output, fail_on_empty=args.fail_on_empty, sessions=args.session)
    except ReportError as exc:
        parser.error(f"--session: {exc}")


if __name__ == "__main__":
    sys.exit(main())
