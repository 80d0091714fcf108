"""The results at a glance: the table that opens docs/report.md, made from the committed results.

Each row reads result files under ``benchmarks/results/`` and gives the question, its headline figure, the
same figure against the row's baseline, the command that runs it (as ``benchmarks/README.md`` gives it; the
exact invocation is in the file) and the commit it was measured at: the envelope's
(``priority_gateway/bench/envelope.py``), what an older file recorded its own way, or "not recorded"; with
the host's load where the file has it. No figure is typed in here: when a result file changes, so does the
table, and ``tests/benchmarks/test_report_summary.py`` fails until the report is rewritten.

    python benchmarks/report_summary.py            # rewrite the summary in docs/report.md
    python benchmarks/report_summary.py --check    # exit 1 when docs/report.md is not what the results give
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from article_report import fill_blocks, table

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
REPORT = ROOT / "docs" / "report.md"
BLOCK = "results-summary"
HEADER = ["question", "headline", "against the baseline", "command", "measured at"]

Read = Callable[[str], dict[str, Any]]


# -- how figures read -------------------------------------------------------------------------------


def pct(share: float, digits: int = 1) -> str:
    return f"{100 * share:.{digits}f} %"


def times(ratio: float) -> str:
    return f"{ratio:.2f}x"


def ms(value: float) -> str:
    return f"{value:,.0f} ms" if value >= 100 else f"{value:.1f} ms"


def sec(value_ms: float) -> str:
    return f"{value_ms / 1000:.1f} s"


def rate(value: float) -> str:
    return f"{value:.1f}"


def measured_at(result: dict[str, Any], commit_from: dict[str, Any] | None = None) -> str:
    """The commit (short) and the host's load, as the file says; older files say less."""
    source = commit_from if commit_from is not None else result
    commit = str(source.get("commit") or "")
    dirty = source.get("dirty") is True or commit.endswith("-dirty")
    text = f"`{commit.removesuffix('-dirty')[:7]}`" + (" with uncommitted changes" if dirty else "")
    text = text if commit else "not recorded"
    host = result.get("host") if isinstance(result.get("host"), dict) else {}
    load = host.get("load_avg_at_start") or (result.get("load_average") or {}).get("start")
    cpus = host.get("cpus") or result.get("cpus")
    return text + (f"; load {load[0]:.1f} on {cpus} cores" if load and cpus else "")


# -- the rows: question, headline, against the baseline, the command as benchmarks/README.md runs it,
# -- measured at -----------------------------------------------------------------------------------


def routing(read: Read) -> list[str]:
    summary = read("routing/summary.json")
    one = summary["mooncake_1x"]
    prefix, rr = one["prefix"], one["round_robin"]
    return [
        "Does prefix-affinity routing keep prompts cached? The Mooncake conversation hour on 8 simulated "
        "H200 engines, admission off (virtual time)",
        f"{pct(prefix['prefix_hit_ratio'])} of prompt tokens from cache ({pct(one['prefix_share_of_oracle'], 0)} "
        f"of the pooled-cache ceiling), TTFT p99 {sec(prefix['ttft_p99_ms'])}",
        f"round robin ({pct(rr['prefix_hit_ratio'])} from cache): "
        f"{times(prefix['prefix_hit_ratio'] / rr['prefix_hit_ratio'])} the hit ratio, "
        f"{times(one['prefix_ttft_p99_over_round_robin'])} the TTFT p99",
        "`make bench-routing`",
        measured_at(summary),
    ]


def replicas(read: Read) -> list[str]:
    matrix = read("replicas/matrix.json")
    runs = read("replicas/summary.json")["matrix"]["runs"]
    share = {key: run["share_of_oracle"] for key, run in runs.items()}
    return [
        "Do gateway replicas that share their routing over Redis keep it? The same hour through 8 replicas",
        f"{pct(share['1x/8/shared'])} of the pooled-cache ceiling at the trace's rate, "
        f"{pct(share['2x/8/shared'])} at twice it",
        f"one replica: {pct(share['1x/1/shared'])} and {pct(share['2x/1/shared'])}, of which 8 sharing keep "
        f"{times(share['1x/8/shared'] / share['1x/1/shared'])} and "
        f"{times(share['2x/8/shared'] / share['2x/1/shared'])}; 8 sharing nothing: "
        f"{pct(share['1x/8/unshared'])} and {pct(share['2x/8/unshared'])}",
        "`python benchmarks/replicas.py --parts matrix`",
        measured_at(matrix),
    ]


def gpu_routing(read: Read) -> list[str]:
    result = read("gpu/routing.json")
    mooncake = result["mooncake"]
    ours, over = mooncake["median_by_front"]["ours-prefix"], mooncake["ours_prefix_over"]
    return [
        "And on real vLLM? 4 engines of a 7B shape on one H200, Mooncake conversations (blocks shrunk to 128 tokens)",
        f"{pct(ours['cached_token_ratio'])} of prompt tokens cached, TTFT p99 {sec(ours['ttft_p99_ms'])} "
        f"(medians of {ours['runs']} runs)",
        f"vllm-router cache_aware: {times(over['vllmr-ca']['cached_token_ratio'])} the cached tokens, "
        f"{times(over['vllmr-ca']['ttft_p99_ms'])} the TTFT p99; its round robin: "
        f"{times(over['vllmr-rr']['cached_token_ratio'])} the cached tokens",
        "`harness.py launch --plan full`, then `--plan repeat`, on the GPU; `analyze.py` here "
        "(benchmarks/gpu/README.md)",
        measured_at(result),
    ]


def admission(read: Read) -> list[str]:
    summary = read("admission/summary.json")
    flood = summary["flood"]
    return [
        "Does SLO admission hold interactive budgets beside a batch flood? Gemma 4 profiles, interactive load "
        "at 60 % of the pool's capacity (virtual time)",
        f"interactive TTFT p99 {ms(flood['interactive_ttft_p99_ms'])}, ITL p99 {ms(flood['interactive_itl_p99_ms'])}, "
        f"{pct(flood['interactive_slo_attainment'])} within both budgets; batch output "
        f"{pct(flood['batch_goodput_share_of_free_capacity'], 0)} of the capacity left free",
        f"one shared FCFS pool: {pct(flood['shared_fcfs_interactive_slo_attainment'])} within both budgets, "
        f"TTFT p99 {sec(flood['shared_fcfs_interactive_ttft_p99_ms'])}; at 4x the Azure trace's rate "
        f"{times(summary['sweep']['goodput_vs_shared_fcfs_at_4x'])} its goodput",
        "`python benchmarks/admission.py`",
        measured_at(summary),
    ]


def fleet_admission(read: Read) -> list[str]:
    summary = read("fleet_admission/summary.json")
    four, alone = summary["table"]["four"], summary["table"]["four_no_share"]
    return [
        "Do four gateway replicas admit as one? The flood scene through 4 replicas sharing load and limits "
        "(virtual time)",
        f"interactive TTFT p99 {ms(four['interactive_ttft_p99_ms'])}, ITL p99 {ms(four['interactive_itl_p99_ms'])}, "
        f"batch {four['batch_goodput_tokens_per_s']:,.0f} tokens/s",
        f"one replica: {times(four['ttft_p99_vs_one'])} the TTFT p99, {times(four['itl_p99_vs_one'])} the ITL p99, "
        f"{times(four['batch_goodput_vs_one'])} the batch output; 4 sharing nothing: "
        f"{alone['overfilled_dispatches']:,} dispatches overfill an engine",
        "`python benchmarks/fleet_admission.py --minutes 10`",
        measured_at(summary),
    ]


def fairness(read: Read) -> list[str]:
    summary = read("fairness/summary.json")
    fair, unfair = summary["fair"], summary["unfair"]
    return [
        "Does a tenant sending 5x its share take the others' budgets? Four tenants of equal weight, one "
        "interactive pool (virtual time)",
        f"with fair queueing the other three keep at least {pct(fair['well_behaved_kept_min'])} of their SLO "
        f"attainment; Jain's index {fair['jain_index']:.4f}",
        f"without fair queueing: {pct(unfair['well_behaved_kept_min'])}, Jain's index {unfair['jain_index']:.4f}",
        "`python benchmarks/fairness.py --minutes 10 --replicas 2,4 --also-max-num-batched-tokens 8192`",
        measured_at(summary),
    ]


def relay(read: Read) -> list[str]:
    result = read("relay_overhead/results.json")
    summary = result["summary"]
    ours, against = summary["gateway"], summary["gateway_vs_vllm-router"]
    plain, streamed = ours["nostream_c64"], ours["stream_c64"]
    floors = [
        f"{times(summary[f'{kind}-floor_vs_vllm-router']['nostream_c64']['cpu_per_request'])} as {what}"
        for kind, what in (("asgi", "an ASGI app"), ("protocol", "an asyncio protocol"))
        if f"{kind}-floor_vs_vllm-router" in summary
    ]
    floor_text = f"; a bare Python relay on the same stack: {', '.join(floors)} (`relay_floor.py`)" if floors else ""
    return [
        "What does relaying cost? The gateway with its defaults before simulated instant engines, 64 "
        "connections, the router pinned to one core",
        f"not streamed {plain['cpu_ms_per_request']:.2f} ms of CPU a request, p99 {ms(plain['p99_ms'])}; "
        f"streamed (32 tokens) {streamed['cpu_ms_per_request']:.2f} ms",
        f"vllm-router (Rust): {times(against['nostream_c64']['cpu_per_request'])} its CPU a request not streamed, "
        f"{times(against['stream_c64']['cpu_per_request'])} streamed, {times(against['nostream_c64']['p99'])} its "
        f"p99 not streamed{floor_text}",
        "`make bench-relay`",
        measured_at(result),
    ]


def batch_lines(read: Read) -> list[str]:
    result = read("batch_lines/results.json")
    summary = result["summary"]
    ours, base = summary["gateway"], summary["baseline"]
    return [
        f"How fast do batch jobs go? {result['lines']:,} chat lines through the embedded default "
        "(`gateway serve` without configuration)",
        f"{ours['lines_per_s']:,.0f} lines/s at {ours['gateway_cpu_ms_per_line']:.2f} ms of the gateway's CPU a line",
        f"an older checkout (`--baseline`): {times(summary['gateway_vs_baseline_lines_per_s'])} its lines/s at "
        f"{times(ours['gateway_cpu_ms_per_line'] / base['gateway_cpu_ms_per_line'])} its CPU a line",
        "`python benchmarks/batch_lines.py --baseline CHECKOUT`",
        measured_at(result),
    ]


def soak(read: Read) -> list[str]:
    result = read("soak/results.json")
    memory = result["memory"]
    return [
        f"Does memory stay flat? {result['requests']:,} mixed and hostile requests at concurrency "
        f"{result['concurrency']}",
        f"{memory['rss_after_warmup_mib']} MiB resident after warm-up, {memory['rss_end_mib']} MiB at the end "
        f"({memory['slope_mib_per_10k_requests']:+.2f} MiB per 10,000 requests); "
        f"{result['gateway_500s_or_tracebacks']} errors of the gateway's own",
        "none: the measure is the growth",
        "`python benchmarks/soak.py`",
        measured_at(result),
    ]


def gpu_fleet(read: Read) -> list[str]:
    result = read("gpu/fleet/seats/overview.json")
    one, four = result["by_replicas"]["1"], result["by_replicas"]["4"]
    runs = result["runs"]
    late = sum(r["interactive_first_tokens"]["over"] for r in runs)
    admitted = sum(r["interactive_first_tokens"]["over"] + r["interactive_first_tokens"]["within"] for r in runs)
    return [
        "On one H200, do the budgets hold with interactive and batch pools sharing it, through one replica "
        "and four? The fleet-itl scene, engines and seats as shipped (live; TTFT p99 1 s, ITL p99 100 ms)",
        f"TTFT p99 {sec(one['ttft_p99_ms_median'])} (one replica) and {sec(four['ttft_p99_ms_median'])} (four), "
        f"worst ITL p99 {ms(max(one['itl_p99_ms_max'], four['itl_p99_ms_max']))}; {late} of {admitted} admitted "
        f"first tokens late (medians of {one['runs']} runs each)",
        f"four replicas: {times(result['by_replicas']['most_over_one_goodput'])} one's goodput",
        "`harness.py launch --plan fleet-itl-shipped` on the GPU, `fleet_itl.py --overview` here "
        "(benchmarks/gpu/README.md)",
        measured_at(read("gpu/fleet/seats/one-0/summary.json")),
    ]


def gpu_sessions(read: Read) -> list[str]:
    result = read("gpu/sessions/seats/sessions.json")
    medians, ratios = result["medians"], result["ratios_against_ours_prefix"]
    plain, ours = medians["ours-prefix"], medians["ours-wait"]
    return [
        "Do agent sessions keep their KV cache across tool pauses? Four 4-seat engines on one H200 with small "
        "KV caches, 40 sessions in closed loop (live)",
        "sessions, retention and waiting for a session's engine: "
        f"{times(ratios['ours-wait']['reprefill_fewer_x'])} fewer re-prefilled tokens "
        f"than plain prefix routing, new-session TTFT p99 {plain['new_session_ttft_p99_s']:.1f} s -> "
        f"{ours['new_session_ttft_p99_s']:.1f} s",
        f"vllm-router cache_aware: {times(ratios['vllmr-ca']['reprefill_fewer_x'])} fewer, at "
        f"{times(ratios['vllmr-ca']['new_session_ttft_p99_change'])} the new-session TTFT p99",
        "`harness.py launch --plan sessions` on the GPU, `agent_sessions_client.py --overview` here",
        measured_at(read("gpu/sessions/seats/raw/run-1/ours-wait/sessions.json")),
    ]


ARRIVALS = {"poisson": "Poisson", "bursty": "bursty (the Azure trace's)"}


def budgets(
    folder: str, arrivals: str, sitting: str, plan: str = "budgets", card: str = "H200"
) -> Callable[[Read], list[str]]:
    """One arrival process of a single-engine budgets sitting; the commit from the device run's own record
    in ``raw/<sitting>`` (the analysis did not copy it). Where a front ran more than once (``cap-64@2``),
    the gateway's goodput is the median of its runs, against the best cap's median run."""
    raw_run = f"gpu/budgets/raw/{sitting}/budgets-{arrivals}-ours-admission/run.json"

    def row(read: Read) -> list[str]:
        result = read(f"gpu/budgets/{folder}/budgets.json")
        rates = result["by_arrivals"][arrivals]["rates"]

        def gateway(r: dict[str, Any]) -> float:
            runs = [v["goodput_rps"] for k, v in r["fronts"].items() if k.split("@")[0] == "ours-admission"]
            return float(statistics.median(runs))

        runs = max(len([k for k in r["fronts"] if k.split("@")[0] == "ours-admission"]) for r in rates)
        ours = ", ".join(f"{gateway(r):.2f}" for r in rates)
        strict = [times(r["gateway_goodput_over_best_cap"]) for r in rates]
        if runs > 1:  # median against median, and the gateway's worst run against the cap's best
            pairs = zip((times(r["gateway_median_over_best_cap_median"]) for r in rates), strict, strict=True)
            over = ", ".join(f"{median} ({worst})" for median, worst in pairs)
        else:
            over = ", ".join(strict)
        best = ", ".join(sorted({r["best_static_cap"].split("@")[0] for r in rates}))
        offered = f"{rate(rates[0]['rate'])} to {rate(rates[-1]['rate'])} requests/s"
        off = rates[-1]["fronts"].get("ours-off")  # a sitting may leave admission off out
        medians = f" (medians of {runs} runs)" if runs > 1 else ""
        return [
            f"On one {card} engine, does the learned limit admit as well as the best static cap? Interactive "
            f"{ARRIVALS[arrivals]} arrivals at rising rates (live; TTFT p99 500 ms, ITL p99 50 ms)",
            f"the gateway's goodput {ours} requests/s within both budgets at {offered} offered{medians}"
            + (f"; admission off {off['goodput_rps']:.2f} at the highest" if off else ""),
            f"the best static cap ({best}){', median against median (worst run against best)' if runs > 1 else ''}: "
            f"{over}",
            f"`harness.py launch --plan {plan}` on the GPU, `budgets.py analyze` here (benchmarks/gpu/README.md)",
            measured_at(result, read(raw_run)),
        ]

    return row


ROWS: tuple[Callable[[Read], list[str]], ...] = (
    routing,
    replicas,
    gpu_routing,
    admission,
    fleet_admission,
    fairness,
    relay,
    batch_lines,
    soak,
    budgets("at-6038b99", "poisson", "sitting-7", "budgets-pairs", "H100"),
    budgets("at-6038b99", "bursty", "sitting-7", "budgets-pairs", "H100"),
    gpu_fleet,
    gpu_sessions,
)


def summary(results: Path = RESULTS) -> str:
    def read(path: str) -> dict[str, Any]:
        return json.loads((results / path).read_text())

    return table(HEADER, [row(read) for row in ROWS])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing: exit 1 if the report differs")
    parser.add_argument("--results", type=Path, default=RESULTS, help="the results folder to read")
    parser.add_argument("--report", type=Path, default=REPORT, help="the report to fill")
    args = parser.parse_args()
    text = args.report.read_text()
    filled, missing = fill_blocks(text, {BLOCK: summary(args.results)})
    if missing:
        raise SystemExit(f"{args.report}: no <!-- begin:{BLOCK} --> ... <!-- end:{BLOCK} --> markers")
    if args.check:
        if filled != text:
            sys.exit(f"{args.report}: the summary is not what the results give: python benchmarks/report_summary.py")
        return
    args.report.write_text(filled)


if __name__ == "__main__":
    main()
