"""``llmbench-report [OUTPUT]`` / ``python -m pytest_llmbench.report``: the report without pytest."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pytest_llmbench.profiles import ProfileError, load_profiles
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
    parser.add_argument("--project", type=_world_sizes, metavar="N,N,...",
                        help="project every measured strategy to these world sizes (default: each profile's "
                             "project_world_sizes, 8,16,32,64,128,256)")
    parser.add_argument("--profile-file", action="append", default=[], metavar="FILE",
                        help="a profile TOML of your own (repeatable), as --llmbench-profile-file: its "
                             "links, device memory and world sizes to project to")
    parser.add_argument("--history", action="store_true",
                        help="print every case's series over the stored sessions with its change points "
                             "(Apache Otava), write its figures to OUTPUT/report/plots/, and exit")
    parser.add_argument("--export", choices=("bencher", "pytorch-hud", "pytest-benchmark"), metavar="FORMAT",
                        help="write every reported case's throughput, step time, memory, MFU, cost and "
                             "scaling for a dashboard, and exit: bencher (Bencher Metric Format), "
                             "pytorch-hud (PyTorch's OSS benchmark records) or pytest-benchmark (its JSON, "
                             "metrics in extra_info); to OUTPUT/report/export/FORMAT.json or --export-to")
    parser.add_argument("--export-to", type=Path, metavar="FILE", help="where --export writes")
    args = parser.parse_args(argv)
    if args.history:
        return _history(Path(args.output))
    if args.export_to and not args.export:
        parser.error("--export-to: give --export FORMAT too")
    if args.export:
        return _export(parser, args)
    _conftest_hooks(Path.cwd() / "conftest.py")
    try:
        profiles = load_profiles(args.profile_file)
    except ProfileError as exc:
        parser.error(f"--profile-file: {exc}")
    try:
        return build_report(args.output, fail_on_empty=args.fail_on_empty, sessions=args.session,
                            profiles=profiles, project=args.project)
    except ReportError as exc:
        parser.error(f"--session: {exc}")


def _export(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from pytest_llmbench.report import export

    try:
        path, written, left = export.write(Path(args.output), args.export, args.session, args.export_to)
    except (export.ExportError, ReportError) as exc:
        parser.error(f"--export: {exc}")
    print(f"llmbench export ({args.export}): {written} case(s) written to {path}"
          + (f"; {left} left out (no value to export: failed cases)" if left else ""))
    return 0


def _history(output: Path) -> int:
    from pytest_llmbench.report import history

    for line in history.lines(history.collect(output)):
        print(line)
    written = history.write_figures(output, output / "report" / "plots")
    none = f"none (no case has {history.MIN_SESSIONS} or more sessions)"
    print(f"figures: {', '.join(written.values()) or none}")
    return 0


def _conftest_hooks(conftest: Path) -> None:
    """The metrics and report sections the project's conftest.py adds (its ``pytest_llmbench_metrics``
    and ``pytest_llmbench_report_sections`` hooks, called with no config), as pytest-benchmark's own
    command line dispatches a conftest's hooks: the columns and sections a ``pytest --llmbench-report``
    from here would have."""
    if not conftest.is_file():
        return
    import importlib.util

    from harness import metrics
    from pytest_llmbench.report import sections

    spec = importlib.util.spec_from_file_location("llmbench_report_conftest", conftest)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    hook = getattr(module, "pytest_llmbench_metrics", None)
    known = set(metrics.names())
    for metric in (hook(config=None) or ()) if hook else ():
        if metric.name not in known:
            metrics.register(metric)
    hook = getattr(module, "pytest_llmbench_report_sections", None)
    for section in (hook(config=None) or ()) if hook else ():
        sections.register(section)


def _world_sizes(text: str) -> list[int]:
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of world sizes") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: world sizes are integers of at least 1")
    return sizes


if __name__ == "__main__":
    sys.exit(main())
