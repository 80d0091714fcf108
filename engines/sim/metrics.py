"""The engine's ``/metrics`` page, in vLLM 0.32's names, types, labels and buckets.

Rules:
- Every ``vllm:`` family of a real vLLM 0.32 ``/metrics`` dump is rendered, in the same order, with
  the same HELP text and labels (``engine="0"``, ``model_name=...``, plus the family's own), in the
  text format ``prometheus_client`` writes (counters as ``_total`` with a ``_created`` gauge).
- Values come from the engine's live gauges and ``EngineStats``; what the simulator does not
  model (multi-modal cache, KV connectors but the CPU tier's, FLOP estimates, sleep) stays at its idle
  value; the CPU tier (``cpu_tier``) counts as vLLM's offloading connector, its hits external.
- The static text (HELP/TYPE lines, label sets, bucket bounds) is built once; a scrape only
  formats numbers, as ``prometheus_client`` does (``1.79e+09``, ``+Inf``).
- With LoRA enabled, ``vllm:lora_requests_info`` comes before ``vllm:cache_config_info``, labelled only
  by ``max_lora``, ``running_lora_adapters`` and ``waiting_lora_adapters`` (comma-joined names), one
  series per label set the engine ever recorded, each valued at the wall time it was last set
  (vLLM's ``set_to_current_time``): the newest series is the current state. Without LoRA it is absent.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable

from prometheus_client.utils import floatToGoString

from priority_gateway.engines.sim.core import EngineCore
from priority_gateway.engines.sim.cpu_tier import GIB
from priority_gateway.engines.sim.profile import Profile
from priority_gateway.engines.sim.stats import FINISH_REASONS, EngineStats, Histogram

_COUNTER = "counter"
_GAUGE = "gauge"

HELP = {
    "estimated_flops_per_gpu": "Estimated number of floating point operations per GPU "
    "(for Model Flops Utilization calculations).",
    "estimated_read_bytes_per_gpu": "Estimated number of bytes read from memory per GPU "
    "(for Model Flops Utilization calculations).",
    "estimated_write_bytes_per_gpu": "Estimated number of bytes written to memory per GPU "
    "(for Model Flops Utilization calculations).",
    "num_requests_running": "Number of requests in model execution batches.",
    "num_requests_waiting": "Number of requests waiting to be processed.",
    "num_requests_waiting_by_reason": "Number of waiting requests by reason. Reason labels: 'capacity' = waiting "
    "for scheduling capacity; 'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked "
    "status). Sum of all reasons equals vllm:num_requests_waiting.",
    "engine_sleep_state": "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is "
    "awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
    "kv_cache_usage_perc": "KV-cache usage. 1 means 100 percent usage.",
    "prefix_cache_queries": "Prefix cache queries, in terms of number of queried tokens.",
    "prefix_cache_hits": "Prefix cache hits, in terms of number of cached tokens.",
    "external_prefix_cache_queries": "External prefix cache queries from KV connector cross-instance cache "
    "sharing, in terms of number of queried tokens.",
    "external_prefix_cache_hits": "External prefix cache hits from KV connector cross-instance cache sharing, "
    "in terms of number of cached tokens.",
    "mm_cache_queries": "Multi-modal cache queries, in terms of number of queried items.",
    "mm_cache_hits": "Multi-modal cache hits, in terms of number of cached items.",
    "num_preemptions": "Cumulative number of preemption from the engine.",
    "prompt_tokens": "Number of prefill tokens processed.",
    "prompt_tokens_by_source": "Number of prompt tokens by source.",
    "prompt_tokens_cached": "Number of cached prompt tokens (local + external).",
    "prompt_tokens_cached_by_source": "Prefix-cache hit tokens by the cache tier that supplied them: device "
    "(local HBM), host (offloaded to DRAM), disk, p2p (transferred from another vLLM instance) or "
    "external_unspecified. Counted at admission; sums to vllm:prefix_cache_hits + vllm:external_prefix_cache_hits.",
    "generation_tokens": "Number of generation tokens processed.",
    "request_success": "Count of successfully processed requests.",
    "admission_rejections": "Number of admission attempts rejected by a queue limit, by reason.",
    "request_prompt_tokens": "Number of prefill tokens processed.",
    "request_generation_tokens": "Number of generation tokens processed.",
    "iteration_tokens_total": "Histogram of number of tokens per engine_step.",
    "request_max_num_generation_tokens": "Histogram of maximum number of requested generation tokens.",
    "request_params_n": "Histogram of the n request parameter.",
    "request_params_max_tokens": "Histogram of the max_tokens request parameter.",
    "time_to_first_token_seconds": "Histogram of time to first token in seconds.",
    "inter_token_latency_seconds": "Histogram of inter-token latency in seconds.",
    "request_time_per_output_token_seconds": "Histogram of time_per_output_token_seconds per request.",
    "e2e_request_latency_seconds": "Histogram of e2e request latency in seconds.",
    "request_queue_time_seconds": "Histogram of time spent in WAITING phase for request.",
    "request_inference_time_seconds": "Histogram of time spent in RUNNING phase for request.",
    "request_prefill_time_seconds": "Histogram of time spent in PREFILL phase for request.",
    "request_decode_time_seconds": "Histogram of time spent in DECODE phase for request.",
    "request_num_preemptions": "Histogram of the number of times a request was preempted.",
    "request_prefill_kv_computed_tokens": "Histogram of new KV tokens computed during prefill "
    "(excluding cached tokens).",
    "lora_requests_info": "Running stats on lora requests.",
    "cache_config_info": "Information of the LLMEngine CacheConfig",
}

Value = Callable[[], float]


_go_float: Callable[[float], str] = floatToGoString  # prometheus_client publishes no types


def _num(value: float) -> str:
    return _go_float(value)


def _finished(stats: EngineStats, reason: str) -> Value:
    return lambda: stats.finished.get(reason, 0)


def _offloading_gib(profile: Profile) -> str:
    """``--kv-offloading-size`` as vLLM echoes it: GiB, ``None`` without a CPU tier (or unknown bytes)."""
    if not profile.kv_offloading_blocks or not profile.kv_bytes_per_token:
        return "None"
    return _num(profile.kv_offloading_blocks * profile.block_size * profile.kv_bytes_per_token / GIB)


def _labels(pairs: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(pairs.items())) + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _zero() -> float:
    return 0.0


class MetricsPage:
    """Renders one engine's ``/metrics`` text; build once per engine, call ``render`` per scrape."""

    def __init__(self, core: EngineCore, created: float, engine: str = "0", wall_offset: float = 0.0) -> None:
        """``wall_offset`` turns the core's clock into wall time (``time.time() - time.monotonic()``)."""
        self.core = core
        self.wall_offset = wall_offset
        self.created = _num(created)
        self.base = {"engine": engine, "model_name": core.model}
        self._parts: list[Callable[[list[str]], None]] = []
        self._build()

    def render(self) -> bytes:
        out: list[str] = []
        for part in self._parts:
            part(out)
        return "".join(out).encode()

    # -- family builders ---------------------------------------------------------

    def _head(self, name: str, kind: str, help_key: str) -> str:
        return f"# HELP vllm:{name} {HELP[help_key]}\n# TYPE vllm:{name} {kind}\n"

    def _gauge(self, name: str, series: list[tuple[dict[str, str], Value]]) -> None:
        head = self._head(name, _GAUGE, name)
        lines = [(f"vllm:{name}{_labels({**self.base, **extra})} ", value) for extra, value in series]

        def part(out: list[str]) -> None:
            out.append(head)
            for prefix, value in lines:
                out.append(f"{prefix}{_num(value())}\n")

        self._parts.append(part)

    def _counter(self, name: str, series: list[tuple[dict[str, str], Value]], with_engine: bool = True) -> None:
        base = self.base if with_engine else {"model_name": self.base["model_name"]}
        label_sets = [_labels({**base, **extra}) for extra, _ in series]
        head = self._head(f"{name}_total", _COUNTER, name)
        created = self._head(f"{name}_created", _GAUGE, name) + "".join(
            f"vllm:{name}_created{labels} {self.created}\n" for labels in label_sets
        )
        lines = [(f"vllm:{name}_total{labels} ", value) for labels, (_, value) in zip(label_sets, series, strict=True)]

        def part(out: list[str]) -> None:
            out.append(head)
            for prefix, value in lines:
                out.append(f"{prefix}{_num(value())}\n")
            out.append(created)

        self._parts.append(part)

    def _histogram(self, name: str, hist: Callable[[], Histogram]) -> None:
        head = self._head(name, "histogram", name)
        bounds = [*(_num(b) for b in hist().bounds), "+Inf"]
        bucket_prefixes = [f"vllm:{name}_bucket{_labels({**self.base, 'le': le})} " for le in bounds]
        labels = _labels(self.base)
        created = self._head(f"{name}_created", _GAUGE, name) + f"vllm:{name}_created{labels} {self.created}\n"

        def part(out: list[str]) -> None:
            h = hist()
            out.append(head)
            for prefix, total in zip(bucket_prefixes, h.cumulative(), strict=True):
                out.append(f"{prefix}{_num(total)}\n")
            out.append(f"vllm:{name}_count{labels} {_num(h.count)}\nvllm:{name}_sum{labels} {_num(h.sum)}\n")
            out.append(created)

        self._parts.append(part)

    def _static(self, text: str) -> None:
        self._parts.append(lambda out: out.append(text))

    def _build(self) -> None:
        """The page's families, in the order rendered; one the simulator has no figure for reads zero."""
        self._engine_state()
        self._token_counters()
        self._request_histograms()
        if self.core.lora_slots is not None:
            self._parts.append(self._lora_info)
        self._static(self._head("cache_config_info", _GAUGE, "cache_config_info") + self._cache_config_line())

    def _engine_state(self) -> None:
        core = self.core
        for name in ("estimated_flops_per_gpu", "estimated_read_bytes_per_gpu", "estimated_write_bytes_per_gpu"):
            self._counter(name, [({}, _zero)])
        self._gauge("num_requests_running", [({}, lambda: core.num_running)])
        self._gauge("num_requests_waiting", [({}, lambda: core.num_waiting)])
        self._gauge(
            "num_requests_waiting_by_reason",
            [
                ({"reason": "capacity"}, lambda: core.num_waiting - core.num_waiting_deferred),
                ({"reason": "deferred"}, lambda: core.num_waiting_deferred),
            ],
        )
        self._gauge(
            "engine_sleep_state",
            [
                ({"sleep_state": "awake"}, lambda: 1.0),
                ({"sleep_state": "weights_offloaded"}, _zero),
                ({"sleep_state": "discard_all"}, _zero),
            ],
        )
        self._gauge("kv_cache_usage_perc", [({}, lambda: core.kv_cache_usage)])

    def _token_counters(self) -> None:
        stats = self.core.stats
        self._counter("prefix_cache_queries", [({}, lambda: stats.prefix_cache_queries)])
        self._counter("prefix_cache_hits", [({}, lambda: stats.prefix_cache_hits)])
        # The CPU tier is vLLM's offloading connector: its hits are the external ones.
        self._counter("external_prefix_cache_queries", [({}, lambda: stats.external_prefix_cache_queries)])
        self._counter("external_prefix_cache_hits", [({}, lambda: stats.external_prefix_cache_hits)])
        for name in ("mm_cache_queries", "mm_cache_hits"):
            self._counter(name, [({}, _zero)])
        self._counter("num_preemptions", [({}, lambda: stats.preemptions)])
        self._counter("prompt_tokens", [({}, lambda: stats.prompt_tokens)])
        self._counter(
            "prompt_tokens_by_source",
            [
                ({"source": "local_compute"}, lambda: stats.prompt_tokens_computed),
                ({"source": "local_cache_hit"}, lambda: stats.prompt_tokens_cached - stats.prompt_tokens_external),
                ({"source": "external_kv_transfer"}, lambda: stats.prompt_tokens_external),
            ],
        )
        self._counter("prompt_tokens_cached", [({}, lambda: stats.prompt_tokens_cached)])
        self._counter(
            "prompt_tokens_cached_by_source",
            [
                ({"source": "device"}, lambda: stats.prompt_tokens_cached - stats.prompt_tokens_external),
                ({"source": "host"}, lambda: stats.prompt_tokens_external),
            ]
            + [({"source": s}, _zero) for s in ("p2p", "disk", "external_unspecified")],
        )
        self._counter("generation_tokens", [({}, lambda: stats.generation_tokens)])
        self._counter(
            "request_success",
            [({"finished_reason": r}, _finished(stats, r)) for r in FINISH_REASONS],
        )
        self._counter(
            "admission_rejections",
            [({"reason": "max_num_queued_reqs"}, _zero), ({"reason": "max_num_queued_tokens"}, _zero)],
            with_engine=False,
        )

    def _request_histograms(self) -> None:
        stats = self.core.stats
        for name, attr in (
            ("request_prompt_tokens", "request_prompt_tokens"),
            ("request_generation_tokens", "request_generation_tokens"),
            ("iteration_tokens_total", "iteration_tokens"),
            ("request_max_num_generation_tokens", "request_max_generation_tokens"),
            ("request_params_n", "request_params_n"),
            ("request_params_max_tokens", "request_params_max_tokens"),
            ("time_to_first_token_seconds", "ttft"),
            ("inter_token_latency_seconds", "itl"),
            ("request_time_per_output_token_seconds", "tpot"),
            ("e2e_request_latency_seconds", "e2e"),
            ("request_queue_time_seconds", "queue"),
            ("request_inference_time_seconds", "inference"),
            ("request_prefill_time_seconds", "prefill"),
            ("request_decode_time_seconds", "decode"),
            ("request_num_preemptions", "request_preemptions"),
            ("request_prefill_kv_computed_tokens", "request_prefill_kv_computed"),
        ):
            self._histogram(name, functools.partial(operator.attrgetter(attr), stats))

    def _lora_info(self, out: list[str]) -> None:
        out.append(self._head("lora_requests_info", _GAUGE, "lora_requests_info"))
        max_lora = str(self.core.max_loras)
        for (running, waiting), at in self.core.lora_info.items():
            labels = {"max_lora": max_lora, "running_lora_adapters": running, "waiting_lora_adapters": waiting}
            out.append(f"vllm:lora_requests_info{_labels(labels)} {_num(at + self.wall_offset)}\n")

    def _cache_config_line(self) -> str:
        core = self.core
        profile = core.profile
        info = {
            "_block_size_resolved": "True",
            "block_size": str(core.block_size),
            "cache_dtype": "auto",
            "cache_hit_alignment_tokens": "None",
            "effective_attention_block_size": str(core.block_size),
            "enable_mamba_shared_prefix_checkpoint": "False",
            "enable_prefix_caching": str(profile.enable_prefix_caching),
            "gpu_memory_utilization": "0.92",
            "hash_block_size": "None",
            "is_attention_free": "False",
            "kv_cache_dtype_skip_layers": "[]",
            "kv_cache_layout": "None",
            "kv_cache_max_concurrency": _num(profile.num_blocks * core.block_size / core.max_model_len),
            "kv_cache_memory_bytes": "None",
            "kv_cache_size_tokens": str(profile.num_blocks * core.block_size),
            "kv_offloading_backend": "native",
            "kv_offloading_size": _offloading_gib(profile),
            "kv_sharing_fast_prefill": "False",
            "mamba_block_size": "None",
            "mamba_cache_dtype": "auto",
            "mamba_cache_mode": "none",
            "mamba_page_size_padded": "None",
            "mamba_ssm_cache_dtype": "float32",
            "num_cpu_blocks": "None",
            "num_gpu_blocks": str(profile.num_blocks),
            "num_gpu_blocks_override": "None",
            "prefix_cache_retention_interval": "0",
            "prefix_caching_hash_algo": "xxhash",
            "prefix_match_unit": "None",
            "replayssm_buffer_len": "16",
            "skip_page_size_padded": "None",
            "sliding_window": "None",
            "swa_bounded_replay": "True",
            "use_kda_recoverssm": "False",
            "use_replayssm": "False",
            "user_specified_block_size": "False",
        }
        return f"vllm:cache_config_info{_labels({'engine': self.base['engine'], **info})} 1.0\n"
