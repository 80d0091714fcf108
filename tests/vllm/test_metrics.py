"""The engines' /metrics carry the series the gateway routes and admits on, and they move."""

from __future__ import annotations

import httpx
import pytest

from priority_gateway.upstream.scrape import parse_vllm_metrics
from tests.vllm.client import metric_sum, metric_values, unique_prompt
from tests.vllm.conftest import BLOCK_SIZE, VllmEngines

pytestmark = pytest.mark.vllm

GATEWAY_SIGNALS = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:cache_config_info",
    "vllm:time_to_first_token_seconds_bucket",
    "vllm:inter_token_latency_seconds_bucket",
)


@pytest.mark.parametrize("name", ["interactive", "batch"])
def test_metrics_carry_the_gateway_signals(vllm_engines: VllmEngines, name: str) -> None:
    text = httpx.get(f"{getattr(vllm_engines, name).url}/metrics").text
    missing = [signal for signal in GATEWAY_SIGNALS if not metric_values(text, signal)]
    assert missing == []
    for signal in GATEWAY_SIGNALS:
        if signal == "vllm:cache_config_info":  # its labels are the cache settings
            continue
        assert all('model_name="tiny"' in labels for labels, _ in metric_values(text, signal))


def test_gateway_parser_reads_the_cache_config(vllm_engines: VllmEngines) -> None:
    scraped = parse_vllm_metrics(httpx.get(f"{vllm_engines.interactive.url}/metrics").text)
    assert scraped.block_size == BLOCK_SIZE
    assert scraped.num_blocks == 256 * 1024 * 1024 // (BLOCK_SIZE * 2048)  # 2 KiB of KV per token


def test_a_repeated_prompt_counts_its_full_blocks_as_hits(vllm_engines: VllmEngines) -> None:
    url = vllm_engines.interactive.url
    prompt = unique_prompt(1000)
    before = httpx.get(f"{url}/metrics").text
    for _ in range(2):
        reply = httpx.post(f"{url}/v1/completions", json={"model": "tiny", "prompt": prompt, "max_tokens": 1})
        assert reply.status_code == 200
    after = httpx.get(f"{url}/metrics").text

    def delta(metric: str) -> float:
        return metric_sum(after, metric) - metric_sum(before, metric)

    assert delta("vllm:prefix_cache_queries_total") == 2000
    assert delta("vllm:prefix_cache_hits_total") == 7 * BLOCK_SIZE  # 7 full blocks of the 999 before the last
    assert reply.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 7 * BLOCK_SIZE
