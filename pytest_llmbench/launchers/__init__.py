"""Launchers, by name. Each runs one RunSpec and returns one BenchResult."""

from __future__ import annotations

from pytest_llmbench.launchers.base import Interrupted, Launcher

__all__ = ["Interrupted", "Launcher", "make_launcher"]


def make_launcher(name: str, settings) -> Launcher:
    if name == "local":
        from pytest_llmbench.launchers.local import LocalLauncher

        return LocalLauncher()
    if name == "k8s":
        from pytest_llmbench.launchers.k8s import K8sLauncher

        return K8sLauncher.from_settings(settings)
    raise ValueError(f"unknown launcher {name!r}")
