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

from pytest_llmbench.launchers.base import Interrupted, Launcher, LauncherKind

__all__ = ["Interrupted", "Launcher", "LauncherKind", "kinds", "get", "register"]
ENTRY_POINT_GROUP = "pytest_llmbench.launchers"


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
        from pytest_llmbench.launchers.k8s import launcher as k8s
        from pytest_llmbench.launchers.local import launcher as local
        from pytest_llmbench.launchers.slurm import launcher as slurm

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
