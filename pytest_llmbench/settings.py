"""Options of the plugin and their resolution: CLI > ``LLMBENCH_*`` env > ini > default.

Each option is declared once (``OPTIONS`` here, a launcher's own in its LauncherKind) and becomes
a flag ``--llmbench-<name>``, an ini key ``llmbench_<name>`` and an env var ``LLMBENCH_<NAME>``
(options.py). A bad value raises ``pytest.UsageError`` (exit code 4) naming where it came from,
as pytest-timeout does.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import pytest

from harness import strategies
from harness.spec import WORKLOADS
from pytest_llmbench import launchers
from pytest_llmbench.ab import side_option as ab_side
from pytest_llmbench.options import (
    Option,
    at_most,
    choice,
    existing_file,
    gate,
    instrument,
    positive_float,
    positive_int,
    runner_label,
    text,
    variant,
)
from pytest_llmbench.profiles import MAX_TRIALS

TRACE_STEPS = 2  # steps --llmbench-trace records per case, after one untraced profiler warm-up step
MEMORY_STEPS = 1  # steps --llmbench-memory runs under PyTorch's memory tracker per case

OPTIONS: tuple[Option, ...] = (
    Option("strategy", "strategies to run (repeatable or comma-separated). Default: the profile's.",
           lambda raw, where: choice(strategies.names())(raw, where), many=True, short="--strategy"),
    Option("world-size", "world sizes to run (repeatable or comma-separated). Default: the profile's.",
           positive_int, many=True, short="--world-size", value_name="N"),
    Option("seq-len", "sequence lengths to run (repeatable or comma-separated). Default: the profile's.",
           positive_int, many=True, short="--seq-len", value_name="N"),
    Option("variant", "strategy variants to run, e.g. base,ac,ac-op,ac-every2,compile,ac+bucket100,powersgd4,"
           "noreshard,bf16-reduce,offload (repeatable or comma-separated). Default: the profile's (base).",
           variant, many=True,
           short="--variant"),
    Option("workload", "what trains: pretrain, lora, qlora (repeatable or comma-separated). Default: the "
           "profile's (pretrain).", choice(WORKLOADS), many=True, short="--workload"),
    Option("launcher", "where ranks run: local (torchrun here), k8s (Indexed Job pods), slurm (batch jobs "
           "or job steps) or a plugin's launcher. Default: local.",
           lambda raw, where: choice(tuple(launchers.kinds()))(raw, where), default="local",
           value_name="NAME"),
    Option("output", "folder for run logs, the results store and the report. Default: .llmbench",
           text, default=".llmbench", value_name="DIR"),
    Option("steps", "optimizer steps per case, warm-up included. Default: the profile's.", positive_int,
           value_name="N"),
    Option("trace", f"after each case's measured steps, trace {TRACE_STEPS} more with torch.profiler on "
           "every rank: a Chrome trace per rank in the case's run folder and the measured compute / "
           "communication overlap in the result and the report.", text, flag=True),
    Option("memory", f"after each case's measured steps, run {MEMORY_STEPS} more under PyTorch's memory "
           "tracker on every rank (FSDPMemTracker for fsdp, MemTracker for ddp and DeepSpeed): bytes by "
           "category at the peak (parameters, gradients, optimizer state, activations...) in the result and "
           "the report, beside the planner's terms.", text, flag=True),
    Option("instrument", "instruments to run after each case's measured steps, NAME or NAME=STEPS (default "
           "1 step; repeatable or comma-separated): trace, memory, bookkeeping (the bytes the strategy's own "
           "code moves: copies into and out of collective buffers, casts, divides) or a plugin's "
           "(harness/instruments).",
           instrument, many=True, value_name="NAME[=STEPS]"),
    Option("timeout", "seconds before a case is stopped and recorded as timeout. Default: the profile's.",
           positive_float, value_name="S"),
    Option("compare", "stored session to gate against: 'last' or a session id under OUTPUT/results.",
           text, value_name="last|SESSION"),
    Option("fail-below", "fail a case whose METRIC got more than PCT worse than on the --llmbench-ab "
           "baseline side or in the --llmbench-compare run (lower, or higher where lower is better: step "
           "time, peak memory), e.g. tokens_per_s:5% (repeatable).", gate, many=True,
           value_name="METRIC:PCT"),
    Option("ab", "A/B in one session: run every selected case on two sides in balanced rounds (ABBA), "
           "this session's code (the candidate) against SIDE: ref=GITREF (the harness of a git ref), "
           "python=PATH (another interpreter), env=FILE (extra KEY=VALUE environment) or image=REF "
           "(the Kubernetes pod image); with --llmbench-fail-below the gate reads each round's paired "
           "ratio. --llmbench-trials: rounds at the first look (default 4); --llmbench-trials-max: the "
           "last (default 32).", ab_side, value_name="SIDE"),
    Option("dry-run", "write every selected case's run spec and what its launcher would run or submit "
           "(the torchrun command, the sbatch script, the Kubernetes manifests) under OUTPUT/dry-run/, "
           "print where, and run nothing: no cluster is reached.", text, flag=True),
    Option("bisect", "find the first commit of GOOD..BAD that made a --llmbench-fail-below metric worse: "
           "each step runs the selected cases in a worktree of a commit, A/B against GOOD (--llmbench-ab "
           "ref=GOOD), and halves the range; the steps, their verdicts and minutes go to OUTPUT/bisect/.",
           text, value_name="GOOD..BAD"),
    Option("history-bisect", "bisect the latest change point of OUTPUT's stored history that made a "
           "--llmbench-fail-below metric worse by more than its allowed drop: --llmbench-bisect on its "
           "range, "
           "last good commit..first bad (llmbench-report --history lists them); none: says so, exits 0.",
           text, flag=True),
    Option("trials", "launches of each case, interleaved across the selected cases; the test of a case "
           f"passes or fails on the aggregate of its trials (at most {MAX_TRIALS}). Default: the profile's "
           "(1).", at_most(MAX_TRIALS), value_name="N"),
    Option("trials-max", "with --llmbench-fail-below: while the gate is undecided, run more trials (A/B: "
           "rounds) of that case, up to this many (it decides at the first count, then doubling, then this "
           f"one; at least --llmbench-trials, at most {MAX_TRIALS}).", at_most(MAX_TRIALS), value_name="M"),
    Option("runner", "a label for this runner (a CI machine class, a node pool), stored with each result: "
           "the history keeps a series per profile, case, hardware and runner label, never per hostname "
           "(a pod's is new every run). Default: none.", runner_label, value_name="LABEL"),
    Option("profile-file", "extra profile TOML file (repeatable); its stem is the profile name.",
           existing_file, many=True, value_name="FILE"),
    Option("report", "rebuild CSV, plots and REPORT.md from the results store, run no benchmark, exit.",
           text, flag=True),
    Option("session-report", "what a session that ran cases writes at its end: full (CSV, plots, REPORT.md "
           "and REPORT.html), text (the same without the plots: matplotlib's 6 of 8 s for a two-case "
           "report on a 2-core host) or none (the stored results only). --llmbench-report writes the full "
           "report at any time. Default: full.", choice(("full", "text", "none")), default="full",
           value_name="WHAT"),
    Option("report-session", "with --llmbench-report: report only these stored sessions (repeatable or "
           "comma-separated). Default: every session, the latest run of each case.", text, many=True,
           value_name="SESSION"),
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


def asked_instruments(settings: Settings) -> dict[str, int]:
    """What each case runs after its measured steps: --llmbench-instrument, and --llmbench-trace and
    --llmbench-memory as the trace and memory instruments with their own step counts."""
    asked = dict(settings.values.get("instrument") or [])
    if settings.values.get("trace"):
        asked.setdefault("trace", TRACE_STEPS)
    if settings.values.get("memory"):
        asked.setdefault("memory", MEMORY_STEPS)
    return asked


def all_options() -> tuple[Option, ...]:
    """The plugin's options, then those of every registered launcher."""
    return OPTIONS + tuple(opt for kind in launchers.kinds().values() for opt in kind.options)


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("llmbench", "distributed LLM training benchmarks (pytest-llmbench)")
    for opt in all_options():
        names = [f"--llmbench-{opt.name}"] + ([opt.short] if opt.short else [])
        cli_help = opt.help.replace("%", "%%") + f" [env {opt.env}, ini {opt.dest}]"
        if opt.flag:
            group.addoption(*names, action="store_true", default=None, dest=opt.dest, help=cli_help)
        else:
            group.addoption(*names, action="append" if opt.many else "store", default=None,
                            dest=opt.dest, metavar=opt.metavar, help=cli_help)
        parser.addini(opt.dest, opt.help, type="string", default=None)


def resolve(config: pytest.Config) -> Settings:
    """Every option's value and where it came from; raises UsageError on a bad value."""
    values, sources = {}, {}
    for opt in all_options():
        raw, where = _raw_value(config, opt)
        key = opt.dest.removeprefix("llmbench_")
        if raw is None:
            values[key], sources[key] = (opt.default if not opt.many else []), "default"
            continue
        if opt.flag:
            values[key] = switch(raw, where)
        elif opt.many:
            items = [item.strip() for chunk in raw for item in str(chunk).split(",") if item.strip()]
            if not items:
                raise pytest.UsageError(f"{where}: empty; give at least one value (leave the option out "
                                        f"for the default)")
            values[key] = list(dict.fromkeys(opt.parse(item, where) for item in items))  # repeats collapse
        else:
            values[key] = opt.parse(str(raw).strip(), where)
        sources[key] = where
    return Settings(values, sources)


# A switch's words, from the environment or an ini file (as git and systemd read booleans); any other
# word is a usage error: a misspelt "on" must never run a session with the switch off.
SWITCH_ON = frozenset({"1", "true", "yes", "y", "on", "enable", "enabled"})
SWITCH_OFF = frozenset({"0", "false", "no", "n", "off", "disable", "disabled"})


def switch(raw: Any, where: str) -> bool:
    """A switch's value: True from the command line, else one of the words above."""
    if raw is True:
        return True
    word = str(raw).strip().lower()
    if not word:  # set and empty, as unset
        return False
    if word in SWITCH_ON or word in SWITCH_OFF:
        return word in SWITCH_ON
    raise pytest.UsageError(f"{where}: {str(raw)!r} is not a switch value; use one of "
                            f"{', '.join(sorted(SWITCH_ON))} or {', '.join(sorted(SWITCH_OFF))}")


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
