"""The report's figures, read as people read them: every figure of the committed samples, drawn
together as one `make bench` output would hold them (two profiles, two models), has no panel with
two series under one label, no panel mixing profiles, and no legend over the data or off the
figure (plots.check_figure); and the check itself fails on a figure that breaks each rule."""

import shutil
from pathlib import Path

import matplotlib.pyplot as plt
import pytest

from pytest_llmbench.profiles import load_profiles
from pytest_llmbench.report.load import load_results
from pytest_llmbench.report.plots import check_figure, figures
from pytest_llmbench.report.scale import build_scale

REPORTS = Path(__file__).resolve().parent.parent.parent / "reports"
SAMPLES = ("cpu-scale-sample", "cpu-mistral-sample", "cpu-gate-sample", "cpu-trace-sample")


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    """Every figure of the samples' results in one output folder (the cpu profile's tiny GPT and
    cpu-mistral's tiny Mistral side by side, as in a fresh `make bench`)."""
    root = tmp_path_factory.mktemp("samples")
    for sample in SAMPLES:
        for session in (REPORTS / sample / "results").iterdir():
            shutil.copytree(session, root / "results" / f"{session.name}-{sample}")
    loaded = load_results(root)
    loaded.scale = build_scale(loaded, load_profiles([]))  # as build_report does
    assert set(loaded.frame.profile) == {"cpu", "cpu-mistral"}
    out = figures(loaded)
    yield out
    for _, fig in out.values():
        plt.close(fig)


def test_the_samples_draw_every_figure(drawn):
    assert {name for name, _ in drawn.values()} >= {
        "tokens_per_s.png", "step_times.png", "memory_vs_world_size.png", "scaling_efficiency.png",
        "loss_curves.png", "cost.png", "collectives.png", "projection.png",
        "per_rank.png"}  # no MFU on CPU: no peak


TITLES = ["Throughput vs world size", "Step-time distribution per case", "Peak memory vs sequence length",
          "Peak memory vs world size", "Scaling efficiency", "Loss curves", "Cost per 1M tokens",
          "Collectives: bus bandwidth vs message size",
          "Projection: tokens/s vs world size (measured solid, projected dashed)",
          "Per rank: compute-only step vs the median rank"]


@pytest.mark.parametrize("title", TITLES)
def test_no_figure_of_the_samples_can_be_misread(drawn, title):
    """(MFU, empty on CPU, draws its bars as the cost figure does.)"""
    assert check_figure(drawn[title][1]) == []


def test_throughput_has_a_panel_per_profile_and_sequence_length(drawn):
    panels = [ax.get_title() for ax in drawn["Throughput vs world size"][1].axes]
    assert any(t.startswith("cpu (tiny), seq 128") for t in panels)
    assert any(t.startswith("cpu-mistral (tiny-mistral), seq 128") for t in panels)


def test_the_check_fails_on_each_way_to_mislead():
    fig, ax = plt.subplots()
    ax.plot([1, 2], [1, 2], label="ddp", gid="cpu")
    ax.plot([1, 2], [2, 3], label="ddp", gid="cpu-mistral")
    ax.plot([1, 2, 2], [1, 2, 3], label="zero2")  # the old throughput plot: two models' ws2 in one line
    ax.legend(loc="center")
    problems = check_figure(fig)
    plt.close(fig)
    assert any("two series labelled ddp" in p for p in problems)
    assert any("profiles cpu, cpu-mistral in one panel" in p for p in problems)
    assert any("the legend lies over the data" in p for p in problems)
    assert any("series zero2 has two points at one x" in p for p in problems)
    fig, ax = plt.subplots()
    ax.bar(["ddp\nws2", "ddp\nws2"], [1, 2])
    ax.plot([0], [0], label="x")
    ax.legend(loc="upper left", bbox_to_anchor=(3.0, 1.0))
    problems = check_figure(fig)
    plt.close(fig)
    assert any("two bars or boxes under one tick label" in p for p in problems)
    assert any("the legend runs off the figure" in p for p in problems)
