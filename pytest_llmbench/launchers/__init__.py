"""Launchers, by name: where the ranks of a case run. Each runs one RunSpec and returns one
BenchResult (launchers/base.py says what every launcher provides).

A launcher is declared once, in its own module, as a ``LauncherKind``: its options, the profile
table it reads, whether it takes the host lock, runs ranks on this host, spans nodes. The rest of
the plugin reads those facts and never compares launcher names. Built in: local (torchrun here),
k8s (Indexed Job pods) and slurm (batch jobs or job steps). Another package adds one through the
entry-point group ``pytest_llmbench.launchers`` (a LauncherKind object; its options become flags,
ini keys and env vars like the built-in ones), or a pytest plugin or conftest through the
``pytest_llmbench_launchers`` hook (hookspecs.py; such a launcher adds its own options in its
``pytest_addoption``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_llmbench.launchers.base import Interrupted, Launcher

if TYPE_CHECKING:
    from pytest_llmbench.options import Option

__all__ = ["Interrupted", "Launcher", "LauncherKind", "kinds", "get", "register"]
ENTRY_POINT_GROUP = "pytest_llmbench.launchers"


@dataclass(frozen=True)
class LauncherKind:
    """What the plugin needs to know of a launcher.

    ``make(settings, profile)`` builds the launcher for one case of that profile (a launcher reads
    its own options from ``settings`` and its profile table from ``profile.launch[name]``).
    ``check(settings, profiles)`` says, before anything runs, why this launcher cannot work with
    these settings and profiles (None when it can). ``parse_table(table, bad)`` validates the
    profile's ``[<profile_table>]`` table; ``bad(key, why)`` makes the error naming the profile file.
    """

    name: str
    doc: str
    make: Callable[[Any, Any], Launcher]
    options: tuple[Option, ...] = ()
    profile_table: str | None = None
    parse_table: Callable[[Any, Callable[[str, str], Exception]], dict] | None = None
    host_lock: bool = False  # one measured case at a time on this host (hostlock.py)
    on_this_host: bool = False  # ranks run here: this host's GPUs decide skips and -m auto
    spans_nodes: bool = False  # can run a case whose ranks span several nodes
    marker: bool = False  # its cases carry a pytest marker of its name
    owned_env: tuple[str, ...] = ()  # variables it sets for every rank (fnmatch patterns): no profile may
    check: Callable[[Any, dict], str | None] = lambda settings, profiles: None
    finish: Callable[[], None] = lambda: None  # at the session's end: release what it kept (warm ranks)
    # --llmbench-ab (pytest_llmbench/ab.py): the side kinds it can run. env= (extra environment) runs on
    # any launcher; image= changes a launcher option (side settings); ref= and python= start the ranks
    # with another folder or interpreter on this host, through make_on_host(settings, profile, host)
    # (host: launchers/warm.Host), which a launcher that runs them must provide.
    ab_sides: tuple[str, ...] = ("env",)
    make_on_host: Callable[[Any, Any, Any], Launcher] | None = None

    def __post_init__(self) -> None:
        if {"ref", "python"} & set(self.ab_sides) and self.make_on_host is None:
            raise ValueError(f"launcher {self.name!r}: ab_sides {self.ab_sides} start ranks on this host "
                             f"with another folder or interpreter: it needs make_on_host")


_REGISTRY: dict[str, LauncherKind] = {}
_loaded = False


def register(kind: LauncherKind) -> LauncherKind:
    """Add a launcher; the same kind twice is harmless, another under a taken name an error."""
    known = _REGISTRY.get(kind.name)
    if known is not None and known is not kind:
        raise ValueError(f"launcher {kind.name!r} is already registered")
    _REGISTRY[kind.name] = kind
    return kind


def kinds() -> dict[str, LauncherKind]:
    """Every registered launcher: the built-in ones, the entry points', the hooks' (plugin.py)."""
    global _loaded
    if not _loaded:
        _loaded = True
        from pytest_llmbench.launchers import k8s, local, slurm

        for kind in (local.KIND, k8s.KIND, slurm.KIND):
            register(kind)
        from importlib.metadata import entry_points

        for point in entry_points(group=ENTRY_POINT_GROUP):
            register(point.load())
    return dict(_REGISTRY)


def get(name: str) -> LauncherKind:
    try:
        return kinds()[name]
    except KeyError:
        raise ValueError(f"unknown launcher {name!r}; known: {', '.join(kinds())}") from None


# What every launcher's ranks get from torchrun and the plugin: never a profile's to set.
RANK_ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
            "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "TORCHELASTIC_*",
            "LLMBENCH_RUN_ID", "LLMBENCH_GIT_COMMIT")


def owned_env() -> tuple[str, ...]:
    """The environment variables (fnmatch patterns) that the launchers set for every rank."""
    return tuple(dict.fromkeys([*RANK_ENV, *(p for kind in kinds().values() for p in kind.owned_env)]))


def spanning() -> list[str]:
    """The launchers that can run a case whose ranks span nodes (for messages)."""
    return [name for name, kind in kinds().items() if kind.spans_nodes]
