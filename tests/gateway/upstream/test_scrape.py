from pathlib import Path

from gateway.upstream.scrape import parse_vllm_metrics

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
