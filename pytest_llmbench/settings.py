"""Options of the plugin and their resolution: CLI > ``LLMBENCH_*`` env > ini > default.

Each option is declared once (``OPTIONS``) and becomes a flag ``--llmbench-<name>``,
an ini key ``llmbench_<name>`` and an env var ``LLMBENCH_<NAME>``. A bad value raises
``pytest.UsageError`` (exit code 4) naming where it came from, as pytest-timeout does.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from harness import strategies
from harness.spec import WORKLOADS, SpecError, parse_variant
from pytest_llmbench.launchers import k8s_values

LAUNCHERS = ("local", "k8s")
HIGHER_IS_BETTER = ("tokens_per_s", "tokens_per_s_per_device", "mfu", "scaling_efficiency",
                    "tokens_per_usd", "tflops_per_device")


@dataclass(frozen=True)
class Option:
    name: str
    help: str
    parse: Callable[[str, str], Any]  # (raw text, where it came from) -> value
    default: Any = None
    many: bool = False  # repeatable / comma-separated
    short: str | None = None  # the design's short flag, e.g. --strategy
    flag: bool = False  # a switch without a value

    @property
    def dest(self) -> str:
        return "llmbench_" + self.name.replace("-", "_")

    @property
    def env(self) -> str:
        return "LLMBENCH_" + self.name.replace("-", "_").upper()


def _choice(choices: tuple[str, ...]) -> Callable[[str, str], str]:
    def parse(raw: str, where: str) -> str:
        if raw not in choices:
            raise pytest.UsageError(f"{where}: unknown value {raw!r}; choose from {', '.join(choices)}")
        return raw
    return parse


def _positive_int(raw: str, where: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise pytest.UsageError(f"{where}: {raw!r} is not an integer") from None
    if value < 1:
        raise pytest.UsageError(f"{where}: {value} must be >= 1")
    return value


def _variant(raw: str, where: str) -> str:
    try:
        parse_variant(raw)
    except SpecError as exc:
        raise pytest.UsageError(f"{where}: {str(exc).removeprefix('variant: ')}") from None
    return raw


def _positive_float(raw: str, where: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise pytest.UsageError(f"{where}: {raw!r} is not a number of seconds") from None
    if value <= 0:
        raise pytest.UsageError(f"{where}: {value} must be > 0")
    return value


def _text(raw: str, where: str) -> str:
    return raw


def _existing_file(raw: str, where: str) -> str:
    if not Path(raw).is_file():
        raise pytest.UsageError(f"{where}: profile file {raw!r} does not exist")
    return raw


def _k8s_value(check: Callable[[Any], str | None], what: str) -> Callable[[str, str], str]:
    """A value that goes into a Kubernetes manifest: checked by its rule (k8s_values)."""
    def parse(raw: str, where: str) -> str:
        rule = check(raw)
        if rule:
            raise pytest.UsageError(f"{where}: {raw!r} is not a valid {what}: it {rule}")
        return raw
    return parse


_GATE = re.compile(r"^(?P<metric>[a-z_]+):(?P<pct>\d+(\.\d+)?)%?$")


def _gate(raw: str, where: str) -> tuple[str, float]:
    match = _GATE.match(raw)
    if not match:
        raise pytest.UsageError(f"{where}: {raw!r} is not METRIC:PCT, e.g. tokens_per_s:5%")
    metric = match["metric"]
    if metric not in HIGHER_IS_BETTER:
        raise pytest.UsageError(f"{where}: {metric!r} is not a higher-is-better metric; choose from "
                                f"{', '.join(HIGHER_IS_BETTER)} (gate times with --benchmark-compare-fail)")
    return metric, float(match["pct"])


OPTIONS: tuple[Option, ...] = (
    Option("strategy", "strategies to run (repeatable or comma-separated). Default: the profile's.",
           lambda raw, where: _choice(strategies.names())(raw, where), many=True, short="--strategy"),
    Option("world-size", "world sizes to run (repeatable or comma-separated). Default: the profile's.",
           _positive_int, many=True, short="--world-size"),
    Option("seq-len", "sequence lengths to run (repeatable or comma-separated). Default: the profile's.",
           _positive_int, many=True, short="--seq-len"),
    Option("variant", "strategy variants to run, e.g. base,ac,ac+bucket100,powersgd4,noreshard,bf16-reduce,"
           "offload (repeatable or comma-separated). Default: the profile's (base).", _variant, many=True,
           short="--variant"),
    Option("workload", "what trains: pretrain, lora, qlora (repeatable or comma-separated). Default: the "
           "profile's (pretrain).", _choice(WORKLOADS), many=True, short="--workload"),
    Option("launcher", "where ranks run: local (torchrun here) or k8s (Indexed Job pods). Default: local.",
           _choice(LAUNCHERS), default="local"),
    Option("output", "folder for run logs, the results store and the report. Default: .llmbench",
           _text, default=".llmbench"),
    Option("steps", "optimizer steps per case, warm-up included. Default: the profile's.", _positive_int),
    Option("timeout", "seconds before a case is stopped and recorded as timeout. Default: the profile's.",
           _positive_float),
    Option("compare", "stored session to gate against: 'last' or a session id under OUTPUT/results.",
           _text),
    Option("fail-below", "fail a case whose METRIC fell more than PCT below the --llmbench-compare run, "
           "e.g. tokens_per_s:5% (repeatable).", _gate, many=True),
    Option("trials", "launches of each case, interleaved across the selected cases; the test of a case "
           "passes or fails on the aggregate of its trials. Default: the profile's (1).", _positive_int),
    Option("trials-max", "with --llmbench-fail-below: when the gate's confidence interval straddles the "
           "allowed drop, run more trials of that case, up to this many, before deciding.", _positive_int),
    Option("profile-file", "extra profile TOML file (repeatable); its stem is the profile name.",
           _existing_file, many=True),
    Option("report", "rebuild CSV, plots and REPORT.md from the results store, run no benchmark, exit.",
           _text, flag=True),
    Option("report-session", "with --llmbench-report: report only these stored sessions (repeatable or "
           "comma-separated). Default: every session, the latest run of each case.", _text, many=True),
    Option("k8s-context", "kubeconfig context for --llmbench-launcher=k8s.", _text),
    Option("k8s-namespace", "namespace for benchmark pods. Default: llmbench.",
           _k8s_value(k8s_values.dns_label, "namespace"), default="llmbench"),
    Option("k8s-kubeconfig", "kubeconfig file. Default: $KUBECONFIG or ~/.kube/config.", _text),
    Option("k8s-image", "container image with harness/ (tag or @sha256 digest).",
           _k8s_value(k8s_values.image, "image reference"), default="ghcr.io/pytest-llmbench/harness:0.1.0"),
    Option("k8s-pull-secret", "imagePullSecret name for the image.",
           _k8s_value(k8s_values.dns_subdomain, "secret name")),
)


@dataclass(frozen=True)
class Settings:
    values: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Any:
        try:
            return self.values[name]
        except KeyError:
            raise AttributeError(name) from None


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("llmbench", "distributed LLM training benchmarks (pytest-llmbench)")
    for opt in OPTIONS:
        names = [f"--llmbench-{opt.name}"] + ([opt.short] if opt.short else [])
        cli_help = opt.help.replace("%", "%%") + f" [env {opt.env}, ini {opt.dest}]"
        if opt.flag:
            group.addoption(*names, action="store_true", default=None, dest=opt.dest, help=cli_help)
        else:
            group.addoption(*names, action="append" if opt.many else "store", default=None,
                            dest=opt.dest, metavar=opt.name.upper().replace("-", "_"), help=cli_help)
        parser.addini(opt.dest, opt.help, type="string", default=None)


def resolve(config: pytest.Config) -> Settings:
    """Every option's value and where it came from; raises UsageError on a bad value."""
    values, sources = {}, {}
    for opt in OPTIONS:
        raw, where = _raw_value(config, opt)
        key = opt.dest.removeprefix("llmbench_")
        if raw is None:
            values[key], sources[key] = (opt.default if not opt.many else []), "default"
            continue
        if opt.flag:
            values[key] = raw is True or str(raw).strip().lower() in ("1", "true", "yes", "on")
        elif opt.many:
            items = [item.strip() for chunk in raw for item in str(chunk).split(",") if item.strip()]
            values[key] = [opt.parse(item, where) for item in items]
        else:
            values[key] = opt.parse(str(raw).strip(), where)
        sources[key] = where
    return Settings(values, sources)


def _raw_value(config: pytest.Config, opt: Option) -> tuple[Any, str]:
    cli = config.getoption(opt.dest)
    if cli is not None:
        return cli, f"command line --llmbench-{opt.name}"
    if opt.env in os.environ:
        raw = os.environ[opt.env]
        return ([raw] if opt.many else raw), f"environment {opt.env}"
    ini = config.getini(opt.dest)
    if ini not in (None, ""):
        where = f"ini {opt.dest} in {config.inipath}" if config.inipath else f"ini {opt.dest}"
        return ([ini] if opt.many else ini), where
    return None, "default"
