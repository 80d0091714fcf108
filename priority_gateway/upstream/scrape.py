"""Reading the few vLLM ``/metrics`` series that routing and admission use.

Only lines that start with a wanted name are looked at, so a 50 KB exposition costs a
single pass of ``startswith`` checks. Samples of one name are summed across label sets
(an engine with several ``engine=`` shards is one engine to the gateway); so are the buckets
of the engine's own ITL histogram, by their upper bound, which admission checks the relay's
gaps against. Of ``vllm:lora_requests_info`` (one series per label set ever seen, its value the
time it was last current) only the newest series counts: it is the engine's adapters now.
"""

from __future__ import annotations

import re

from priority_gateway.core.engines import EngineMetrics
from priority_gateway.core.lora import LoraInfo

_WANTED = {
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:kv_cache_usage_perc": "kv_usage",
    "vllm:prefix_cache_queries_total": "prefix_queries",
    "vllm:prefix_cache_hits_total": "prefix_hits",
}
_ITL_BUCKET = "vllm:inter_token_latency_seconds_bucket"
_LORA_INFO = "vllm:lora_requests_info"
_PREFIXES = (*_WANTED, "vllm:cache_config_info", _ITL_BUCKET, _LORA_INFO)
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
_LABEL_LE = re.compile(r'le="([^"]*)"')
_LABEL_MODEL = re.compile(r'model_name="((?:[^"\\]|\\.)*)"')


def parse_vllm_metrics(text: str) -> EngineMetrics:
    values: dict[str, float] = {}
    itl: dict[float, float] = {}
    metrics = EngineMetrics()
    lora_at = -1.0
    for line in text.splitlines():
        if not line.startswith(_PREFIXES):
            continue
        name_end = line.find("{")
        space = line.rfind(" ")
        if space < 0:
            continue
        name = line[:name_end] if 0 <= name_end < space else line[:space]
        if name == "vllm:cache_config_info":
            labels = dict(_LABEL.findall(line[name_end:space]))
            metrics.block_size = _int(labels.get("block_size"))
            metrics.num_blocks = _int(labels.get("num_gpu_blocks"))
            continue
        if name == _ITL_BUCKET:
            _add_bucket(itl, line, name_end, space)
            continue
        if name == _LORA_INFO:
            at = _float(line[space + 1 :])
            if at is not None and at > lora_at:
                lora_at = at
                metrics.lora = _lora_info(dict(_LABEL.findall(line[name_end:space])))
            continue
        if metrics.model is None and name_end >= 0:
            model = _LABEL_MODEL.search(line, name_end, space)
            if model is not None:
                metrics.model = model.group(1)
        field = _WANTED.get(name)
        if field is None:
            continue
        try:
            values[field] = values.get(field, 0.0) + float(line[space + 1 :])
        except ValueError:
            continue
    for field, value in values.items():
        setattr(metrics, field, value)
    if itl:
        metrics.itl_buckets = tuple(sorted(itl.items()))
    return metrics


def _add_bucket(buckets: dict[float, float], line: str, name_end: int, space: int) -> None:
    le = _LABEL_LE.search(line, name_end, space)
    try:
        bound = float(le.group(1)) if le is not None else None  # "+Inf" parses as inf
        if bound is not None:
            buckets[bound] = buckets.get(bound, 0.0) + float(line[space + 1 :])
    except ValueError:
        return


def _lora_info(labels: dict[str, str]) -> LoraInfo:
    def names(key: str) -> tuple[str, ...]:
        return tuple(name for name in labels.get(key, "").split(",") if name)

    return LoraInfo(names("running_lora_adapters"), names("waiting_lora_adapters"), _int(labels.get("max_lora")))


def _float(value: str) -> float | None:
    try:
        return float(value)
    except ValueError:
        return None


def _int(value: str | None) -> int | None:
    try:
        return int(float(value)) if value not in (None, "None") else None
    except ValueError:
        return None
