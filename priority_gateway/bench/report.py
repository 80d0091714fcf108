"""``results.json``, ``report.png`` and ``report.html`` of a benchmark.

The PNG has four panels over the runs (concurrency levels or traces): TTFT p50/p99 and ITL
p50/p99 against their budget lines (lines across the levels of a concurrency sweep, bars for
traces or a single run), output and goodput throughput, SLO attainment with the error and refusal
counts (bars: one value per run). Latency axes are logarithmic with plain tick labels (20, 50, 100).
The HTML is one self-contained file: the PNG inlined as base64, a table of the numbers and the
command line that produced them. Without matplotlib the PNG is skipped and the HTML has the
table only.
"""

from __future__ import annotations

import base64
import html
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

COLUMNS = (
    ("run", "label"),
    ("requests", "requests"),
    ("completed", "completed"),
    ("refused", "refused"),
    ("errors", "errors"),
    ("TTFT p50 ms", "ttft_p50_ms"),
    ("TTFT p90 ms", "ttft_p90_ms"),
    ("TTFT p99 ms", "ttft_p99_ms"),
    ("ITL p50 ms", "itl_p50_ms"),
    ("ITL p90 ms", "itl_p90_ms"),
    ("ITL p99 ms", "itl_p99_ms"),
    ("E2E p50 ms", "e2e_p50_ms"),
    ("E2E p99 ms", "e2e_p99_ms"),
    ("output tok/s", "output_tokens_per_s"),
    ("req/s", "request_throughput"),
    ("SLO attainment", "slo_attainment"),
    ("goodput req/s", "goodput_requests_per_s"),
    ("goodput tok/s", "goodput_tokens_per_s"),
)


def write(out_dir: Path, results: dict[str, Any]) -> list[Path]:
    """Write the three files; returns the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / "results.json"]
    written[0].write_text(json.dumps(results, indent=1) + "\n")
    png = out_dir / "report.png"
    if plot(results, png):
        written.append(png)
    page = out_dir / "report.html"
    page.write_text(render_html(results, png if png in written else None))
    written.append(page)
    return written


def plot(results: dict[str, Any], path: Path) -> bool:
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = figure(results)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def as_lines(results: dict[str, Any]) -> bool:
    """Lines only join ordered levels (a concurrency sweep); traces, and a single run, are bars."""
    return results["mode"] == "closed loop" and len(results["runs"]) > 1


def figure(results: dict[str, Any]) -> Figure:
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    runs = results["runs"]
    budget = results["budget"]
    xs = list(range(len(runs)))
    labels = [r["label"] for r in runs]
    width = 0.4
    fig, axes = plt.subplots(2, 2, figsize=(12, 8.5))
    (ax_ttft, ax_itl), (ax_tput, ax_slo) = axes
    for ax, metric, limit in ((ax_ttft, "ttft", budget["ttft_p99_ms"]), (ax_itl, "itl", budget["itl_p99_ms"])):
        for i, (q, style) in enumerate((("p50", "o-"), ("p99", "s-"))):
            values = [_num(r.get(f"{metric}_{q}_ms")) for r in runs]
            if as_lines(results):
                ax.plot(xs, values, style, label=f"{metric.upper()} {q}")
            else:
                ax.bar([x + (i - 0.5) * width for x in xs], values, width, label=f"{metric.upper()} {q}")
        ax.axhline(limit, color="red", linestyle="--", label=f"budget {limit:g} ms (p99)")
        ax.set_ylabel("ms")
        ax.set_yscale("log")
        # Plain numbers (20, 50, 100, 200) rather than powers of ten, more of them on a short axis.
        low, high = ax.get_ylim()
        decades = math.log10(high / low)
        subs = tuple(range(1, 10)) if decades < 1 else (1, 2, 3, 5) if decades < 2 else (1, 2, 5)
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=[float(sub) for sub in subs]))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_title(f"{metric.upper()} (per request: {'first content chunk' if metric == 'ttft' else 'chunk gaps'})")
    ax_tput.bar([x - width / 2 for x in xs], [r["output_tokens_per_s"] for r in runs], width, label="output tokens/s")
    goodput = [r["goodput_tokens_per_s"] for r in runs]
    ax_tput.bar([x + width / 2 for x in xs], goodput, width, label="goodput tokens/s (SLO met)")
    ax_tput.set_ylabel("tokens/s")
    ax_tput.set_title("Throughput")
    attainment = [100.0 * r["slo_attainment"] for r in runs]
    ax_slo.bar([x - width / 2 for x in xs], attainment, width, color="tab:green", label="SLO attainment")
    ax_slo.set_ylim(0, 105)
    ax_slo.set_ylabel("% of requests meeting TTFT and ITL budgets")
    ax_err = ax_slo.twinx()
    errors = [r["errors"] for r in runs]
    refused = [r.get("refused", 0) for r in runs]
    right = [x + width / 2 for x in xs]
    ax_err.bar(right, errors, width, color="tab:red", alpha=0.6, label="errors")
    ax_err.bar(right, refused, width, bottom=errors, color="tab:orange", alpha=0.6, label="refused")
    ax_err.set_ylabel("errors, refused")
    ax_err.set_ylim(0, max(1, *(e + n for e, n in zip(errors, refused, strict=True))) * 1.1)
    ax_err.yaxis.get_major_locator().set_params(integer=True)
    ax_slo.set_title("SLO attainment, errors and refusals")
    lines, names = ax_slo.get_legend_handles_labels()
    more, more_names = ax_err.get_legend_handles_labels()
    ax_slo.legend(lines + more, names + more_names, fontsize=8)
    for ax in (ax_ttft, ax_itl, ax_tput):
        ax.legend(fontsize=8)
    for ax in axes.flat:
        ax.set_xticks(xs, labels, rotation=20 if len(runs) > 6 else 0, fontsize=8)
        ax.grid(True, alpha=0.3)
    fig.suptitle(f"gateway bench: {results['url']} ({results['model']}, {results['mode']})", fontsize=11)
    fig.tight_layout()
    return fig


def _num(value: Any) -> float:
    return float("nan") if value is None else float(value)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1 else f"{value:,.1f}"
    return html.escape(str(value))


_REFUSED = "429: the endpoint keeping its budgets or limits; each client waited what Retry-After asked."


def _by_code(runs: list[dict[str, Any]], kind: str) -> str:
    return "".join(
        f"<li>{html.escape(run['label'])}: {html.escape(json.dumps(run[f'{kind}_by_code']))}</li>"
        for run in runs
        if run.get(kind)
    )


def render_html(results: dict[str, Any], png: Path | None) -> str:
    head = "".join(f"<th>{html.escape(name)}</th>" for name, _ in COLUMNS)
    rows = "".join(
        "<tr>" + "".join(f"<td>{_cell(run.get(key, ''))}</td>" for _, key in COLUMNS) + "</tr>"
        for run in results["runs"]
    )
    errors = _by_code(results["runs"], "errors")
    refused = _by_code(results["runs"], "refused")
    image = ""
    if png is not None:
        data = base64.b64encode(png.read_bytes()).decode()
        image = f'<img alt="benchmark report" src="data:image/png;base64,{data}">'
    budget = results["budget"]
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>gateway bench: {html.escape(results["url"])}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; }}
table {{ border-collapse: collapse; font-size: 0.85em; }}
td, th {{ border: 1px solid #ccc; padding: 0.25em 0.5em; text-align: right; }}
td:first-child, th:first-child {{ text-align: left; }}
img {{ max-width: 100%; }}
pre {{ background: #f4f4f4; padding: 0.75em; white-space: pre-wrap; }}
</style></head><body>
<h1>gateway bench</h1>
<p>{html.escape(results["url"])}, model <code>{html.escape(results["model"])}</code>,
{html.escape(results["mode"])}, started {html.escape(results["started"])}.
Budgets: TTFT p99 {budget["ttft_p99_ms"]:g} ms, ITL p99 {budget["itl_p99_ms"]:g} ms.</p>
<pre>{html.escape(results["command"])}</pre>
{image}
<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>
{f"<h2>Refused</h2><p>{_REFUSED}</p><ul>{refused}</ul>" if refused else ""}
{f"<h2>Errors</h2><ul>{errors}</ul>" if errors else ""}
</body></html>
"""
