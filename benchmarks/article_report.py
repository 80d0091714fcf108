"""The article's experiments on the simulator profiles: every figure and table of docs/report.md.

Sections, run in this order (pool separation last):
- ``precision``: ``gateway sim --profile gemma4-{bf16,fp8,nvfp4} --concurrency 1,2,4,8,16,32``, the
  workload the profiles were fitted on (2048-token prompts, 512 output tokens, each +/-25 %).
- ``mtp``: the same sweep of ``gemma4-nvfp4-mtp4`` against ``gemma4-nvfp4``.
- ``prefix``: ``priority_gateway.engines.sim.sweep.run_level`` on ``gemma4-nvfp4`` at concurrency 16, 8192-token
  prompts whose first 0 to 95 % are common to all, 64 output tokens, prefix caching on and off.
- ``realtime``: ``gateway bench`` through ``gateway serve`` in front of one real-time
  ``gemma4-nvfp4`` engine (admission off), against ``gateway sim``'s virtual-time sweep of the
  same workload (2048-token prompts, 128 output tokens).
- ``pools``: ``gateway sim`` on 10 minutes of the Azure conversation trace, interactive and batch
  in their own pools (admission on, and off) against one shared FCFS pool without admission.

Raw results go to ``benchmarks/results/article_report/`` (``provenance.json``: the envelope of the run that
made each section's, ``priority_gateway/bench/envelope.py``), figures to ``docs/figures/``, and the
tables with the exact commands into ``docs/report.md`` between ``<!-- begin:NAME -->`` and
``<!-- end:NAME -->``. Progress is one JSON line per event on stdout.

    python benchmarks/article_report.py [--only precision,mtp,prefix,realtime,pools] [--replot]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from priority_gateway.bench import envelope
from priority_gateway.cli import main as gateway_main
from priority_gateway.engines.sim.profile import load_profile
from priority_gateway.engines.sim.sweep import run_level
from priority_gateway.loopback import Proc, free_port

ROOT = Path(__file__).resolve().parents[1]

RAW = ROOT / "benchmarks" / "results" / "article_report"
FIGURES = ROOT / "docs" / "figures"
REPORT = ROOT / "docs" / "report.md"
PROVENANCE = "provenance.json"
TTFT_MS, ITL_MS = 500.0, 50.0
LEVELS = (1, 2, 4, 8, 16, 32)
PRECISIONS = ("gemma4-bf16", "gemma4-fp8", "gemma4-nvfp4")
MTP = "gemma4-nvfp4-mtp4"
PREFIX = {"profile": "gemma4-nvfp4", "concurrency": 16, "input_len": 8192, "output_len": 64}
PREFIX_SHARES = (0.0, 0.25, 0.53125, 0.75, 0.9)
REALTIME = {"input_len": 2048, "output_len": 128, "duration_s": 20, "ramp_up_s": 10}
AZURE = "benchmarks/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv"
POOL_RATE_SCALE = 0.25
ARTICLE = {
    "nvfp4_max_concurrency": 4,
    "nvfp4_over_bf16": 1.86,
    "nvfp4_over_fp8": 1.20,
    "mtp_throughput": 2.13,
    "mtp_itl_p99": 4.0,
    "prefix_gain": 0.405,
    "prefix_ttft": 2.1,
    "hit_rate_spread": 10.0,
}


def log(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def load(name: str) -> Any:
    return json.loads((RAW / name).read_text())


def save(name: str, data: Any) -> None:
    (RAW / name).write_text(json.dumps(data, indent=1) + "\n")


# -- running ------------------------------------------------------------------------------


class Runner:
    """Runs each ``gateway sim`` command at most once per invocation (or never, with --replot)."""

    def __init__(self, run: bool) -> None:
        self.run = run
        self.done: set[str] = set()
        self.commands: dict[str, str] = {}

    def sim(self, name: str, args: list[str]) -> dict[str, Any]:
        path = RAW / f"{name}.json"
        argv = ["sim", *args, "--json", rel(path)]
        self.commands[name] = "gateway " + shlex.join(argv)
        if self.run and name not in self.done:
            started = time.monotonic()
            log(event="start", run=name, command=self.commands[name])
            gateway_main(argv)
            self.done.add(name)
            log(event="done", run=name, seconds=round(time.monotonic() - started, 1))
        return json.loads(path.read_text())

    def sweep(self, profile: str, levels: tuple[int, ...], input_len: int, output_len: int) -> dict[str, Any]:
        args = ["--profile", profile, "--concurrency", ",".join(map(str, levels))]
        args += ["--input-len", str(input_len), "--output-len", str(output_len)]
        return self.sim(f"sweep-{profile}-{input_len}-{output_len}", args)


# -- markdown -----------------------------------------------------------------------------


def table(header: list[str], rows: list[list[Any]]) -> str:
    def cell(v: Any) -> str:
        if isinstance(v, bool):
            return "yes" if v else "no"
        if isinstance(v, float):
            return f"{v:,.2f}" if abs(v) < 100 else f"{v:,.0f}"
        return str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def commands_block(*commands: str) -> str:
    return "```sh\n" + "\n".join(commands) + "\n```"


def findings(section: str, rows: list[list[Any]]) -> str:
    """The section's claims next to ours; kept for the summary at the top of the report."""
    save(f"findings-{section}.json", rows)
    return table(["claim", "article", "here"], rows)


def summary() -> dict[str, str]:
    rows = []
    for section in SECTIONS:
        path = RAW / f"findings-{section}.json"
        if path.exists():
            rows += [[section, *row] for row in json.loads(path.read_text())]
    return {"summary": table(["section", "claim", "article", "here"], rows)}


def fill_blocks(text: str, blocks: dict[str, str]) -> tuple[str, list[str]]:
    """``text`` with each block's body between its markers; and the names whose markers it lacks."""
    missing = []
    for name, body in blocks.items():
        pattern = re.compile(rf"(<!-- begin:{name} -->\n).*?(<!-- end:{name} -->)", re.S)
        if not pattern.search(text):
            missing.append(name)
            continue
        text = pattern.sub(lambda m, body=body: m.group(1) + body.rstrip() + "\n" + m.group(2), text)
    return text, missing


def fill_report(blocks: dict[str, str]) -> None:
    if not REPORT.exists():
        return
    text, missing = fill_blocks(REPORT.read_text(), blocks)
    for name in missing:
        log(event="missing_block", block=name)
    REPORT.write_text(text)


# -- plotting -----------------------------------------------------------------------------


def pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(plt: Any, fig: Any, path: Path, title: str) -> None:
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def concurrency_axis(ax: Any, levels: tuple[int, ...] = LEVELS) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(levels), [str(c) for c in levels])
    ax.set_xlabel("concurrency (closed loop)")
    ax.grid(True, which="both", alpha=0.3)


def plot_sweeps(sweeps: dict[str, dict[str, Any]], path: Path, title: str) -> None:
    plt = pyplot()
    fig, (ax_ttft, ax_itl, ax_tput) = plt.subplots(1, 3, figsize=(15, 4.6))
    for name, sweep in sweeps.items():
        levels = [int(c) for c in sweep]
        rows = list(sweep.values())
        for ax, key in ((ax_ttft, "ttft_p99_ms"), (ax_itl, "itl_p99_ms"), (ax_tput, "output_tokens_per_s")):
            ax.plot(levels, [r[key] for r in rows], marker="o", label=name)
        met = [c for c, r in zip(levels, rows, strict=True) if r["meets_slo"]]
        ax_tput.scatter(met, [sweep[str(c)]["output_tokens_per_s"] for c in met], s=140, facecolors="none", color="k")
    ax_ttft.axhline(TTFT_MS, color="red", linestyle="--", label=f"SLO {TTFT_MS:g} ms")
    ax_itl.axhline(ITL_MS, color="red", linestyle="--", label=f"SLO {ITL_MS:g} ms")
    for ax, name in ((ax_ttft, "TTFT p99 (ms)"), (ax_itl, "ITL p99 (ms)"), (ax_tput, "output tokens/s")):
        concurrency_axis(ax)
        ax.set_yscale("log")
        ax.set_title(name)
        ax.legend(fontsize=8)
    ax_tput.set_title("output tokens/s (circled: both SLOs met)")
    save_figure(plt, fig, path, title)


# -- sections -----------------------------------------------------------------------------


def max_meeting(sweep: dict[str, Any]) -> int:
    return max((int(c) for c, r in sweep.items() if r["meets_slo"]), default=0)


def precision(runner: Runner) -> dict[str, str]:
    sweeps = {p: runner.sweep(p, LEVELS, 2048, 512) for p in PRECISIONS}
    plot_sweeps(
        sweeps,
        FIGURES / "precision.png",
        "One engine per precision, closed loop, 2048-token prompts / 512 output tokens (virtual time)",
    )
    header = ["c"]
    for p in PRECISIONS:
        short = p.removeprefix("gemma4-")
        header += [f"{short} TTFT p99", f"{short} ITL p99", f"{short} tok/s"]
    rows = []
    for c in LEVELS:
        row: list[Any] = [c]
        for p in PRECISIONS:
            r = sweeps[p][str(c)]
            mark = " ✓" if r["meets_slo"] else ""
            row += [r["ttft_p99_ms"], r["itl_p99_ms"], f"{r['output_tokens_per_s']:,.1f}{mark}"]
        rows.append(row)
    bf16, fp8, nv = (sweeps[p] for p in PRECISIONS)
    found = [
        ["BF16 meets the SLO at concurrency 1", "no", bf16["1"]["meets_slo"]],
        ["FP8 meets the SLO at concurrency 1", "no", fp8["1"]["meets_slo"]],
        ["NVFP4: highest concurrency meeting the SLO", ARTICLE["nvfp4_max_concurrency"], max_meeting(nv)],
        ["NVFP4 / BF16 throughput at 32", "1.86x", ratio(nv, bf16, "32")],
        ["NVFP4 / FP8 throughput at 32", "1.20x", ratio(nv, fp8, "32")],
        ["NVFP4 / BF16 throughput at 1", "-", ratio(nv, bf16, "1")],
    ]
    commands = [runner.commands[f"sweep-{p}-2048-512"] for p in PRECISIONS]
    return {
        "precision-commands": commands_block(*commands),
        "precision-table": table(header, rows)
        + "\n\nms for latencies; ✓: TTFT p99 and ITL p99 both within 500 / 50 ms.",
        "precision-findings": findings("precision", found),
    }


def ratio(a: dict[str, Any], b: dict[str, Any], level: str, key: str = "output_tokens_per_s") -> str:
    return f"{a[level][key] / b[level][key]:.2f}x"


def mtp(runner: Runner) -> dict[str, str]:
    nv = runner.sweep("gemma4-nvfp4", LEVELS, 2048, 512)
    sp = runner.sweep(MTP, LEVELS, 2048, 512)
    plt = pyplot()
    fig, (ax_tput, ax_itl, ax_ratio) = plt.subplots(1, 3, figsize=(15, 4.6))
    for name, sweep in (("gemma4-nvfp4", nv), (MTP, sp)):
        levels = [int(c) for c in sweep]
        ax_tput.plot(levels, [r["output_tokens_per_s"] for r in sweep.values()], marker="o", label=name)
        ax_itl.plot(levels, [r["itl_p99_ms"] for r in sweep.values()], marker="o", label=f"{name} p99")
        ax_itl.plot(levels, [r["itl_p50_ms"] for r in sweep.values()], marker=".", linestyle=":", label=f"{name} p50")
    ax_itl.axhline(ITL_MS, color="red", linestyle="--", label=f"SLO {ITL_MS:g} ms")
    tput = {c: sp[str(c)]["output_tokens_per_s"] / nv[str(c)]["output_tokens_per_s"] for c in LEVELS}
    itl = {c: sp[str(c)]["itl_p99_ms"] / nv[str(c)]["itl_p99_ms"] for c in LEVELS}
    ax_ratio.plot(LEVELS, list(tput.values()), marker="o", label="throughput MTP / no MTP")
    ax_ratio.plot(LEVELS, list(itl.values()), marker="s", label="ITL p99 MTP / no MTP")
    ax_ratio.axhline(
        ARTICLE["mtp_throughput"], color="tab:blue", linestyle=":", label="article: up to 2.13x throughput"
    )
    ax_ratio.axhline(ARTICLE["mtp_itl_p99"], color="tab:orange", linestyle=":", label="article: ITL p99 > 4x worse")
    for ax, name in ((ax_tput, "output tokens/s"), (ax_itl, "ITL (ms)"), (ax_ratio, "ratio")):
        concurrency_axis(ax)
        ax.set_title(name)
        ax.legend(fontsize=8)
    ax_tput.set_yscale("log")
    ax_itl.set_yscale("log")
    save_figure(
        plt,
        fig,
        FIGURES / "mtp.png",
        "MTP (4 speculative tokens) on and off, gemma4-nvfp4, 2048 / 512 tokens (virtual time)",
    )
    rows = [
        [
            c,
            nv[str(c)]["output_tokens_per_s"],
            sp[str(c)]["output_tokens_per_s"],
            f"{tput[c]:.2f}x",
            nv[str(c)]["itl_p50_ms"],
            sp[str(c)]["itl_p50_ms"],
            nv[str(c)]["itl_p99_ms"],
            sp[str(c)]["itl_p99_ms"],
            f"{itl[c]:.2f}x",
        ]
        for c in LEVELS
    ]
    header = ["c", "tok/s off", "tok/s MTP", "ratio", "ITL p50 off", "ITL p50 MTP", "ITL p99 off", "ITL p99 MTP"]
    found = [
        ["MTP / no MTP throughput, highest", "2.13x", f"{max(tput.values()):.2f}x (c={max(tput, key=tput.get)})"],
        ["MTP / no MTP ITL p99, highest", "> 4x", f"{max(itl.values()):.2f}x (c={max(itl, key=itl.get)})"],
        ["MTP: highest concurrency meeting the SLO", "-", max_meeting(sp)],
    ]
    return {
        "mtp-commands": commands_block(
            runner.commands["sweep-gemma4-nvfp4-2048-512"], runner.commands[f"sweep-{MTP}-2048-512"]
        ),
        "mtp-table": table([*header, "ratio"], rows),
        "mtp-findings": findings("mtp", found),
    }


def shared_len(share: float) -> int:
    """Tokens of common prefix for a share of the prompt, in whole 16-token blocks."""
    return round(share * PREFIX["input_len"] / 16) * 16


def prefix(runner: Runner) -> dict[str, str]:
    p = PREFIX
    if runner.run:
        profile = load_profile(p["profile"])
        rows = []
        for share in PREFIX_SHARES:
            shared = shared_len(share)
            for caching in (True, False):
                r = run_level(
                    profile,
                    p["concurrency"],
                    p["input_len"],
                    p["output_len"],
                    shared_prefix_len=shared,
                    enable_prefix_caching=caching,
                )
                rows.append({"share": share, "caching": caching, **r})
                log(event="prefix", share=share, caching=caching, tokens_per_s=r["output_tokens_per_s"])
        save("prefix_caching.json", rows)
    rows = load("prefix_caching.json")
    on = {r["share"]: r for r in rows if r["caching"]}
    off = {r["share"]: r for r in rows if not r["caching"]}
    shares = sorted(on)
    plt = pyplot()
    fig, (ax_tput, ax_ttft) = plt.subplots(1, 2, figsize=(11, 4.4))
    pct = [100 * s for s in shares]
    for label, data, style, color in (("caching on", on, "o-", "tab:blue"), ("caching off", off, "s--", "tab:orange")):
        ax_tput.plot(pct, [data[s]["output_tokens_per_s"] for s in shares], style, color=color, label=label)
        ax_ttft.plot(pct, [data[s]["ttft_p50_ms"] for s in shares], style, color=color, label=f"TTFT p50, {label}")
        p99 = [data[s]["ttft_p99_ms"] for s in shares]
        ax_ttft.plot(pct, p99, style, color=color, alpha=0.4, label=f"TTFT p99, {label}")
    ax_ttft.axhline(TTFT_MS, color="red", linestyle="--", label=f"SLO {TTFT_MS:g} ms")
    ax_tput.axvline(100 * 0.53125, color="grey", linestyle=":", label="the fitted point (53 % shared)")
    for ax, name in ((ax_tput, "output tokens/s"), (ax_ttft, "TTFT (ms)")):
        ax.set_xlabel("share of every prompt common to all (%)")
        ax.set_title(name)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    ax_ttft.set_yscale("log")
    save_figure(
        plt,
        fig,
        FIGURES / "prefix_caching.png",
        f"Prefix caching on and off: {p['profile']}, concurrency {p['concurrency']}, "
        f"{p['input_len']}-token prompts, {p['output_len']} output tokens (virtual time)",
    )
    table_rows = [
        [
            f"{100 * s:.0f} %",
            on[s]["prefix_cache_hit_rate"],
            off[s]["output_tokens_per_s"],
            on[s]["output_tokens_per_s"],
            f"{100 * (on[s]['output_tokens_per_s'] / off[s]['output_tokens_per_s'] - 1):+.1f} %",
            off[s]["ttft_p50_ms"],
            on[s]["ttft_p50_ms"],
            f"{off[s]['ttft_p50_ms'] / on[s]['ttft_p50_ms']:.2f}x",
            off[s]["ttft_p99_ms"],
            on[s]["ttft_p99_ms"],
        ]
        for s in shares
    ]
    header = ["shared", "hit rate", "tok/s off", "tok/s on", "gain", "TTFT p50 off", "TTFT p50 on", "lower by"]
    fit = 0.53125
    spread = on[shares[-1]]["output_tokens_per_s"] / on[shares[0]]["output_tokens_per_s"]
    found = [
        ["throughput gain with shared prefixes (53 % shared)", "+40.5 %", table_rows[shares.index(fit)][4]],
        ["TTFT lower by (p50, 53 % shared)", "2.1x", table_rows[shares.index(fit)][7]],
        [
            "TTFT lower by (p99, 53 % shared)",
            "2.1x",
            f"{off[fit]['ttft_p99_ms'] / on[fit]['ttft_p99_ms']:.2f}x",
        ],
        [
            f"throughput, caching on, {100 * shares[-1]:.0f} % vs 0 % shared",
            "up to 10x with the hit rate",
            f"{spread:.1f}x",
        ],
    ]
    call = (
        f'run_level(load_profile("{p["profile"]}"), {p["concurrency"]}, {p["input_len"]}, {p["output_len"]}, '
        "shared_prefix_len=S, enable_prefix_caching=on)"
    )
    return {
        "prefix-commands": commands_block(
            "python benchmarks/article_report.py --only prefix",
            f"# for S in {', '.join(str(shared_len(s)) for s in shares)}, on in True, False:",
            f"# priority_gateway.engines.sim.sweep.{call}",
        ),
        "prefix-table": table([*header, "TTFT p99 off", "TTFT p99 on"], table_rows),
        "prefix-findings": findings("prefix", found),
    }


def realtime(runner: Runner) -> dict[str, str]:
    levels = LEVELS
    w = REALTIME
    virtual = runner.sweep("gemma4-nvfp4", levels, w["input_len"], w["output_len"])
    out = RAW / "realtime"
    if runner.run:
        commands = run_realtime(out, levels)
        save("realtime/commands.json", commands)
    commands = load("realtime/commands.json")
    bench = json.loads((out / "results.json").read_text())
    real = {str(r["concurrency"]): r for r in bench["runs"]}
    shutil.copyfile(out / "report.png", FIGURES / "realtime_bench_report.png")
    plt = pyplot()
    fig, (ax_ttft, ax_itl, ax_tput) = plt.subplots(1, 3, figsize=(15, 4.6))
    for ax, key in ((ax_ttft, "ttft"), (ax_itl, "itl")):
        for q, marker in (("p50", "o"), ("p99", "s")):
            ax.plot(levels, [virtual[str(c)][f"{key}_{q}_ms"] for c in levels], f"{marker}--", label=f"virtual {q}")
            ax.plot(levels, [real[str(c)][f"{key}_{q}_ms"] for c in levels], f"{marker}-", label=f"real time {q}")
    ax_ttft.axhline(TTFT_MS, color="red", linestyle=":", label=f"SLO {TTFT_MS:g} ms")
    ax_itl.axhline(ITL_MS, color="red", linestyle=":", label=f"SLO {ITL_MS:g} ms")
    ax_tput.plot(levels, [virtual[str(c)]["output_tokens_per_s"] for c in levels], "o--", label="virtual")
    ax_tput.plot(levels, [real[str(c)]["output_tokens_per_s"] for c in levels], "o-", label="real time")
    for ax, name in ((ax_ttft, "TTFT (ms)"), (ax_itl, "ITL (ms)"), (ax_tput, "output tokens/s")):
        concurrency_axis(ax, levels)
        ax.set_yscale("log")
        ax.set_title(name)
        ax.legend(fontsize=8)
    save_figure(
        plt,
        fig,
        FIGURES / "realtime_vs_virtual.png",
        f"gemma4-nvfp4: gateway bench through gateway serve (real time, {w['ramp_up_s']} s ramp-up + "
        f"{w['duration_s']} s per level) vs "
        f"gateway sim (virtual time); {w['input_len']}-token prompts, {w['output_len']} output tokens",
    )
    rows = []
    for c in levels:
        v, r = virtual[str(c)], real[str(c)]
        rows.append(
            [
                c,
                r["requests"],
                f"{r['ttft_p50_ms']:.0f} / {v['ttft_p50_ms']:.0f}",
                f"{r['ttft_p99_ms']:.0f} / {v['ttft_p99_ms']:.0f}",
                f"{r['itl_p50_ms']:.1f} / {v['itl_p50_ms']:.1f}",
                f"{r['itl_p99_ms']:.0f} / {v['itl_p99_ms']:.0f}",
                f"{r['output_tokens_per_s']:.1f} / {v['output_tokens_per_s']:.1f}",
                f"{r['output_tokens_per_s'] / v['output_tokens_per_s']:.2f}",
                f"{r['slo_attainment']:.2f} / {v['slo_attainment']:.2f}",
                f"{(r['ttft_p50_ms'] - v['ttft_p50_ms']) / r['itl_p50_ms']:+.1f}",
                r["errors"],
            ]
        )
    header = ["c", "requests", "TTFT p50", "TTFT p99", "ITL p50", "ITL p99", "tok/s", "tok/s ratio", "SLO att."]
    header += ["TTFT p50 gap in steps", "err"]

    def spread(key: str) -> str:
        ratios = [real[str(c)][key] / virtual[str(c)][key] for c in levels]
        return f"{min(ratios):.2f} to {max(ratios):.2f}"

    found = [
        ["real time / virtual time, output tokens/s", "-", spread("output_tokens_per_s")],
        ["real time / virtual time, TTFT p50", "-", spread("ttft_p50_ms")],
        ["real time / virtual time, ITL p50", "-", spread("itl_p50_ms")],
        ["real time / virtual time, ITL p99", "-", spread("itl_p99_ms")],
        [
            "highest concurrency meeting the SLO, real time / virtual (128 output tokens)",
            "-",
            f"{max_meeting(real)} / {max_meeting(virtual)}",
        ],
    ]
    return {
        "realtime-findings": findings("realtime", found),
        "realtime-commands": commands_block(
            commands["engine"],
            commands["gateway"],
            commands["bench"],
            runner.commands[f"sweep-gemma4-nvfp4-{w['input_len']}-{w['output_len']}"],
        )
        + f"\n\nwith `{rel(out / 'gateway.yaml')}`:\n\n```yaml\n{(out / 'gateway.yaml').read_text()}```",
        "realtime-table": table(header, rows)
        + "\n\nEach cell: real time (gateway bench through gateway serve) / virtual time (gateway sim); "
        "ms for latencies, ratio = real / virtual; TTFT p50 gap in steps = (real - virtual TTFT p50) / "
        "real ITL p50, the extra wait in decode steps.",
    }


def run_realtime(out: Path, levels: tuple[int, ...]) -> dict[str, str]:
    """One real-time engine, the gateway in front (admission off), gateway bench against it."""
    out.mkdir(parents=True, exist_ok=True)
    engine_port, gateway_port = free_port(), free_port()
    engine_url = f"http://127.0.0.1:{engine_port}"
    config = out / "gateway.yaml"
    config.write_text(
        f"# One interactive pool of one simulated gemma4-nvfp4 engine; admission off, so the gateway relays\n"
        f"# every request and the sweep measures the engine, as the virtual-time sweep does.\n"
        f"pools:\n  interactive:\n    engines: ['{engine_url}']\nadmission:\n  enabled: false\n"
    )
    engine_cmd = [
        "python",
        "-m",
        "priority_gateway.engines.sim",
        "--port",
        str(engine_port),
        "--profile",
        "gemma4-nvfp4",
    ]
    gateway_cmd = ["gateway", "serve", "--config", rel(config), "--port", str(gateway_port)]
    w = REALTIME
    bench_cmd = ["gateway", "bench", "--url", f"http://127.0.0.1:{gateway_port}"]
    bench_cmd += ["--concurrency", ",".join(map(str, levels)), "--duration", str(w["duration_s"])]
    bench_cmd += ["--ramp-up", str(w["ramp_up_s"])]
    bench_cmd += ["--input-len", str(w["input_len"]), "--output-len", str(w["output_len"])]
    bench_cmd += ["--x-priority", "interactive", "--out", rel(out)]
    python = [sys.executable]
    engine = Proc([*python, *engine_cmd[1:]], engine_url, out / "engine.log").start()
    gateway = Proc(
        [*python, "-m", "priority_gateway", *gateway_cmd[1:]], f"http://127.0.0.1:{gateway_port}", out / "gateway.log"
    )
    try:
        engine.wait_ready()
        gateway.start().wait_ready("/ready")
        started = time.monotonic()
        log(event="start", run="realtime", command=shlex.join(bench_cmd), load_avg=envelope.load_average())
        subprocess.run([*python, "-m", "priority_gateway", *bench_cmd[1:]], cwd=ROOT, check=True)
        seconds = round(time.monotonic() - started, 1)
        log(event="done", run="realtime", seconds=seconds, load_avg=envelope.load_average())
    finally:
        gateway.stop()
        engine.stop()
    for name in ("engine.log", "gateway.log"):
        (out / name).unlink(missing_ok=True)
    return {"engine": shlex.join(engine_cmd), "gateway": shlex.join(gateway_cmd), "bench": shlex.join(bench_cmd)}


def code_version() -> str:
    """The commit the runs were made on, and whether its code had uncommitted changes (``envelope``)."""
    commit, dirty = envelope.code_commit()
    version = f"commit {commit[:7] if commit else 'unknown'}"
    return version + (" with uncommitted changes" if dirty else "")


POOL_SETUPS = (
    ("separate", "own pools, admission on", []),
    ("separate-admission-off", "own pools, admission off", ["--admission", "off"]),
    ("shared", "one shared FCFS pool, admission off", ["--shared-pool", "--admission", "off"]),
)


def pools(runner: Runner) -> dict[str, str]:
    common = ["--trace", f"{AZURE}@interactive", "--minutes", "10", "--engines", "interactive=4,batch=4"]
    common += ["--profile", "interactive=gemma4-nvfp4,batch=gemma4-nvfp4-mtp4", "--batch-flood", "64"]
    common += ["--rate-scale", f"{POOL_RATE_SCALE:g}", "--no-oracle"]
    results = {}
    for name, _, extra in POOL_SETUPS:
        results[name] = runner.sim(f"pools-{name}", [*common, *extra])["prefix"]
    if runner.run:
        save("pools-code.json", {"code": code_version()})
    code = load("pools-code.json")["code"] if (RAW / "pools-code.json").exists() else "an unrecorded commit"
    plt = pyplot()
    fig, axes = plt.subplots(1, 4, figsize=(17, 4.4))
    names = [n for n, _, _ in POOL_SETUPS]
    labels = [label.replace(", ", ",\n") for _, label, _ in POOL_SETUPS]
    xs = list(range(len(names)))
    inter = [results[n]["by_class"]["interactive"] for n in names]
    batch = [results[n]["by_class"].get("batch", {}) for n in names]
    width = 0.38
    for ax, key, limit, title in (
        (axes[0], "ttft", TTFT_MS, "interactive TTFT (ms)"),
        (axes[1], "itl", ITL_MS, "interactive ITL (ms)"),
    ):
        ax.bar([x - width / 2 for x in xs], [b[f"{key}_p50_ms"] or 0 for b in inter], width, label="p50")
        ax.bar([x + width / 2 for x in xs], [b[f"{key}_p99_ms"] or 0 for b in inter], width, label="p99")
        ax.axhline(limit, color="red", linestyle="--", label=f"budget {limit:g} ms")
        ax.set_title(title)
    met = [100 * b["slo_attainment"] for b in inter]
    rejected = [100 * b["rejected"] / max(1, b["requests"]) for b in inter]
    axes[2].bar([x - width / 2 for x in xs], met, width, color="tab:green", label="meet both budgets")
    axes[2].bar([x + width / 2 for x in xs], rejected, width, color="tab:red", label="rejected (429)")
    axes[2].set_ylim(0, 105)
    axes[2].set_title("interactive requests (%)")
    axes[3].bar([x - width / 2 for x in xs], [b["output_tokens_per_s"] for b in inter], width, label="interactive")
    axes[3].bar([x + width / 2 for x in xs], [b.get("output_tokens_per_s", 0) for b in batch], width, label="batch")
    axes[3].set_title("output tokens/s")
    for ax in axes:
        ax.set_xticks(xs, labels, fontsize=8)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    save_figure(
        plt,
        fig,
        FIGURES / "pool_separation.png",
        f"Azure conversation trace (10 min at {POOL_RATE_SCALE:g}x rate) as interactive, 64 batch requests kept "
        "outstanding; 8 engines (virtual time)",
    )
    rows = []
    for (name, label, _), i, b in zip(POOL_SETUPS, inter, batch, strict=True):
        rows.append(
            [
                label,
                i["requests"],
                i["rejected"],
                i["ttft_p50_ms"],
                i["ttft_p99_ms"],
                i["itl_p50_ms"],
                i["itl_p99_ms"],
                f"{100 * i['slo_attainment']:.1f} %",
                i["goodput_rps"],
                i["output_tokens_per_s"],
                b.get("completed", 0),
                b.get("output_tokens_per_s", 0.0),
            ]
        )
        log(event="pools", setup=name, slo_attainment=i["slo_attainment"])
    attain = {n: f"{100 * b['slo_attainment']:.1f} %" for n, b in zip(names, inter, strict=True)}
    batch_tps = {n: f"{b.get('output_tokens_per_s', 0.0):,.0f}" for n, b in zip(names, batch, strict=True)}
    found = [
        [
            "interactive requests meeting both budgets: own pools with admission / own pools / one shared pool",
            "separate pools",
            " / ".join(attain[n] for n in names),
        ],
        ["batch output tokens/s, same three setups", "-", " / ".join(batch_tps[n] for n in names)],
    ]
    header = ["setup", "interactive requests", "rejected", "TTFT p50", "TTFT p99", "ITL p50", "ITL p99"]
    header += ["SLO attainment", "goodput req/s", "interactive tok/s", "batch completed", "batch tok/s"]
    return {
        "pools-commands": commands_block(*(runner.commands[f"pools-{n}"] for n in names)),
        "pools-table": table(header, rows) + f"\n\nRun on {code}; ms for latencies.",
        "pools-findings": findings("pools", found),
    }


SECTIONS: dict[str, Callable[[Runner], dict[str, str]]] = {
    "precision": precision,
    "mtp": mtp,
    "prefix": prefix,
    "realtime": realtime,
    "pools": pools,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated: {', '.join(SECTIONS)}")
    parser.add_argument("--replot", action="store_true", help="no runs: figures and tables from the raw results")
    args = parser.parse_args()
    os.chdir(ROOT)
    RAW.mkdir(parents=True, exist_ok=True)
    FIGURES.mkdir(parents=True, exist_ok=True)
    runner = Runner(run=not args.replot)
    provenance = envelope.start()
    started = time.monotonic()
    for name in [s.strip() for s in args.only.split(",") if s.strip()]:
        if name not in SECTIONS:
            raise SystemExit(f"unknown section {name!r}; known: {', '.join(SECTIONS)}")
        section_started = time.monotonic()
        fill_report(SECTIONS[name](runner))
        seconds = round(time.monotonic() - section_started, 1)
        if runner.run:  # each section's raw results, and the run that made them last
            record = json.loads((RAW / PROVENANCE).read_text()) if (RAW / PROVENANCE).exists() else {}
            save(PROVENANCE, {**record, name: provenance.wrap({"seconds": seconds})})
        log(event="section_done", section=name, seconds=seconds)
    fill_report(summary())
    log(event="done", seconds=round(time.monotonic() - started, 1), figures=rel(FIGURES), raw=rel(RAW))


if __name__ == "__main__":
    main()
