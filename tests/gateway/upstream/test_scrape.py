import math
from pathlib import Path

from priority_gateway.upstream.scrape import parse_vllm_metrics

REAL_DUMP = Path(__file__).parents[2] / "engines" / "sim" / "data" / "vllm-0.32-metrics.txt"


def test_reads_what_routing_needs_from_a_real_vllm_dump():
    m = parse_vllm_metrics(REAL_DUMP.read_text())
    assert m.block_size == 128
    assert m.num_blocks == 4096
    assert m.model == "tiny"
    assert m.prefix_queries == 75085.0
    assert m.prefix_hits == 3584.0
    assert (m.running, m.waiting, m.kv_usage) == (0.0, 0.0, 0.0)


def test_sums_label_sets_and_ignores_the_rest():
    text = "\n".join(
        [
            "# HELP vllm:num_requests_running x",
            'vllm:num_requests_running{engine="0",model_name="m"} 3.0',
            'vllm:num_requests_running{engine="1",model_name="m"} 2.0',
            'vllm:num_requests_waiting{engine="0",model_name="m"} 7',
            'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25',
            'vllm:num_requests_running_by_reason{engine="0"} 99',
            "vllm:prefix_cache_hits_total 12",
            "garbage line",
        ]
    )
    m = parse_vllm_metrics(text)
    assert (m.running, m.waiting, m.kv_usage, m.prefix_hits) == (5.0, 7.0, 0.25, 12.0)
    assert m.block_size is None


def test_reads_the_engines_own_itl_histogram_summed_over_label_sets():
    m = parse_vllm_metrics(REAL_DUMP.read_text())
    assert m.itl_buckets is not None
    bounds = [b for b, _ in m.itl_buckets]
    assert bounds == sorted(bounds) and bounds[-1] == math.inf
    assert dict(m.itl_buckets)[0.05] == 4486.0 and dict(m.itl_buckets)[math.inf] == 4715.0
    text = "\n".join(
        [
            'vllm:inter_token_latency_seconds_bucket{engine="0",le="0.05",model_name="m"} 3.0',
            'vllm:inter_token_latency_seconds_bucket{engine="1",le="0.05",model_name="m"} 4.0',
            'vllm:inter_token_latency_seconds_bucket{engine="0",le="+Inf",model_name="m"} 5.0',
            'vllm:inter_token_latency_seconds_bucket{engine="1",le="+Inf",model_name="m"} 6.0',
            'vllm:inter_token_latency_seconds_count{engine="0",model_name="m"} 5.0',
            'vllm:inter_token_latency_seconds_bucket{engine="0",le="oops",model_name="m"} 1.0',
        ]
    )
    assert parse_vllm_metrics(text).itl_buckets == ((0.05, 7.0), (math.inf, 11.0))
    assert parse_vllm_metrics("vllm:num_requests_running 1").itl_buckets is None


def test_only_the_newest_lora_requests_info_series_counts():
    text = (
        "# TYPE vllm:lora_requests_info gauge\n"
        'vllm:lora_requests_info{max_lora="4",running_lora_adapters="a,b",waiting_lora_adapters=""} 1.7e9\n'
        'vllm:lora_requests_info{max_lora="4",running_lora_adapters="c",waiting_lora_adapters="d,e"} 1.8e9\n'
        'vllm:lora_requests_info{max_lora="4",running_lora_adapters="",waiting_lora_adapters=""} 1.75e9\n'
    )
    info = parse_vllm_metrics(text).lora
    assert info is not None
    assert (info.running, info.waiting, info.max_lora) == (("c",), ("d", "e"), 4)


def test_no_lora_series_means_no_lora_info():
    assert parse_vllm_metrics("vllm:num_requests_running 1\n").lora is None
