"""The bench PNG as a reader sees it: plain numbers on the latency axes, lines only across the
ordered levels of a concurrency sweep, bars where each run has one value (SLO attainment,
errors and refusals) and for traces or a single run."""

from __future__ import annotations

import re
from typing import Any

import matplotlib
import pytest
from matplotlib.container import BarContainer

from priority_gateway.bench.report import figure

matplotlib.use("Agg")
PLAIN = re.compile(r"^\d+(\.\d+)?$")


def run(label: str, ttft: float, itl: float, slo: float, errors: int = 0, refused: int = 0) -> dict[str, Any]:
    return {
        "label": label,
        "ttft_p50_ms": ttft,
        "ttft_p99_ms": ttft * 3,
        "itl_p50_ms": itl,
        "itl_p99_ms": itl * 4,
        "output_tokens_per_s": 100.0,
        "goodput_tokens_per_s": 100.0 * slo,
        "slo_attainment": slo,
        "errors": errors,
        "refused": refused,
    }


def results(mode: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    budget = {"ttft_p99_ms": 500.0, "itl_p99_ms": 50.0}
    return {"mode": mode, "runs": runs, "budget": budget, "url": "http://x", "model": "m"}


SWEEP = [run("c=1", 210, 36, 1.0), run("c=4", 260, 41, 0.0, refused=5), run("c=32", 330, 110, 0.0, errors=3)]


def panels(data: dict[str, Any]) -> dict[str, Any]:
    fig = figure(data)
    fig.canvas.draw()
    ttft, itl, throughput, slo = fig.axes[:4]
    return {"ttft": ttft, "itl": itl, "throughput": throughput, "slo": slo, "errors": fig.axes[4]}


def bars(ax: Any) -> list[BarContainer]:
    return [c for c in ax.containers if isinstance(c, BarContainer)]


def test_latency_ticks_are_plain_numbers() -> None:
    for name in ("ttft", "itl"):
        ax = panels(results("closed loop", SWEEP))[name]
        low, high = ax.get_ylim()
        shown = [t.get_text() for t in ax.get_yticklabels() if low <= t.get_position()[1] <= high]
        assert len(shown) >= 2, shown
        assert all(PLAIN.match(text) for text in shown), shown


def test_a_sweep_joins_its_levels_with_lines() -> None:
    ttft = panels(results("closed loop", SWEEP))["ttft"]
    quantiles = [line for line in ttft.get_lines() if len(line.get_xdata()) == len(SWEEP)]
    assert len(quantiles) == 2 and not bars(ttft)


@pytest.mark.parametrize(
    "data",
    [
        results("trace replay", [run("azure", 300, 40, 0.9), run("mooncake", 900, 60, 0.2)]),
        results("closed loop", [SWEEP[0]]),
    ],
    ids=["traces", "one level"],
)
def test_traces_and_a_single_run_are_bars(data: dict[str, Any]) -> None:
    ttft = panels(data)["ttft"]
    assert [len(c) for c in bars(ttft)] == [len(data["runs"])] * 2
    assert not [line for line in ttft.get_lines() if line.get_marker() in ("o", "s")]


def test_slo_attainment_errors_and_refusals_are_one_bar_per_run() -> None:
    shown = panels(results("closed loop", SWEEP))
    (attainment,) = bars(shown["slo"])
    errors, refused = bars(shown["errors"])
    assert [bar.get_height() for bar in attainment] == [100.0, 0.0, 0.0]
    assert [bar.get_height() for bar in errors] == [0, 0, 3]
    assert [(bar.get_y(), bar.get_height()) for bar in refused] == [(0, 0), (0, 5), (3, 0)]  # stacked on errors
    assert not [line for line in shown["slo"].get_lines() if line.get_marker() == "o"]
