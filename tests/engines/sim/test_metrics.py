from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from priority_gateway.engines.sim.core import EngineCore
from priority_gateway.engines.sim.lora import LoraAdapter
from priority_gateway.engines.sim.metrics import MetricsPage
from priority_gateway.engines.sim.profile import load_profile

from .helpers import request, run

REFERENCE = Path(__file__).parent / "data" / "vllm-0.32-metrics.txt"


def shape(text: str) -> dict[str, tuple[str, frozenset, frozenset]]:
    """Per vllm family: its type, the label-name sets of its samples, and its bucket bounds."""
    out = {}
    for family in text_string_to_metric_families(text):
        if not family.name.startswith("vllm:"):
            continue
        labels = frozenset((s.name, frozenset(k for k in s.labels if k != "le")) for s in family.samples)
        buckets = frozenset(s.labels["le"] for s in family.samples if s.name.endswith("_bucket"))
        out[family.name] = (family.type, labels, buckets)
    return out


def busy_page() -> tuple[EngineCore, str]:
    core = EngineCore(load_profile("tiny-cpu"), model="tiny")
    for i in range(3):
        core.add_request(request(f"r{i}", prompt=300, max_tokens=5, eos_at=3), 0.0)
    run(core)
    core.add_request(request("open", prompt=300, max_tokens=50), 1.0)
    core.step(1.0)
    return core, MetricsPage(core, created=1.0).render().decode()


def test_names_types_labels_and_buckets_match_real_vllm():
    _, page = busy_page()
    ours, theirs = shape(page), shape(REFERENCE.read_text())
    assert sorted(ours) == sorted(theirs)
    for name, (kind, labels, buckets) in theirs.items():
        assert ours[name][0] == kind, name
        assert ours[name][2] == buckets, name
        if name != "vllm:cache_config_info":
            assert ours[name][1] == labels, name


def test_cache_config_info_has_the_same_labels_with_this_engine_s_values():
    core, page = busy_page()
    info = next(f for f in text_string_to_metric_families(page) if f.name == "vllm:cache_config_info")
    ref = next(f for f in text_string_to_metric_families(REFERENCE.read_text()) if f.name == "vllm:cache_config_info")
    labels = info.samples[0].labels
    assert set(labels) == set(ref.samples[0].labels)
    assert labels["block_size"] == "128"
    assert labels["num_gpu_blocks"] == str(core.profile.num_blocks)
    assert labels["kv_cache_size_tokens"] == str(core.profile.num_blocks * 128)
    assert labels["enable_prefix_caching"] == "True"


def test_values_come_from_the_engine():
    core, page = busy_page()
    values = {
        (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("engine", "model_name")))): s.value
        for f in text_string_to_metric_families(page)
        for s in f.samples
    }
    assert values[("vllm:num_requests_running", ())] == 1
    assert values[("vllm:num_requests_waiting", ())] == 0
    assert values[("vllm:kv_cache_usage_perc", ())] == core.kv_cache_usage > 0
    assert values[("vllm:request_success_total", (("finished_reason", "stop"),))] == 3
    assert values[("vllm:generation_tokens_total", ())] == 3 * 3 + 1
    assert values[("vllm:prompt_tokens_total", ())] == 4 * 300
    assert values[("vllm:prefix_cache_queries_total", ())] == 4 * 300
    assert values[("vllm:time_to_first_token_seconds_count", ())] == 4
    assert values[("vllm:inter_token_latency_seconds_count", ())] == 3 * 2
    assert values[("vllm:e2e_request_latency_seconds_count", ())] == 3
    assert values[("vllm:request_queue_time_seconds_count", ())] == 3


LORA_REFERENCE = Path(__file__).parent / "data" / "vllm-0.32-lora-metrics.txt"


def lora_page(core: EngineCore) -> str:
    return MetricsPage(core, created=1.0, wall_offset=1000.0).render().decode()


def lora_core() -> EngineCore:
    return EngineCore(load_profile("tiny-cpu"), model="tiny", enable_lora=True, max_loras=2)


def info_series(page: str) -> list[tuple[dict[str, str], float]]:
    family = next(f for f in text_string_to_metric_families(page) if f.name == "vllm:lora_requests_info")
    return [(s.labels, s.value) for s in family.samples]


def test_lora_page_matches_real_vllm_with_lora_enabled():
    core = lora_core()
    core.add_request(request("a", prompt=300, max_tokens=3, lora=LoraAdapter("lora0", 1, "/a")), 0.0)
    run(core)
    page = lora_page(core)
    ours, theirs = shape(page), shape(LORA_REFERENCE.read_text())
    assert sorted(ours) == sorted(theirs)
    assert ours["vllm:lora_requests_info"] == theirs["vllm:lora_requests_info"]
    names = [f.name for f in text_string_to_metric_families(page) if f.name.startswith("vllm:")]
    assert names.index("vllm:lora_requests_info") == names.index("vllm:cache_config_info") - 1
    help_line = next(line for line in LORA_REFERENCE.read_text().splitlines() if "HELP vllm:lora_requests_info" in line)
    assert help_line in page


def test_lora_info_is_absent_without_lora():
    core = EngineCore(load_profile("tiny-cpu"), model="tiny")
    assert "lora_requests_info" not in MetricsPage(core, created=1.0).render().decode()


def test_lora_info_keeps_each_label_set_with_the_time_it_was_last_set():
    core = lora_core()
    core.add_request(request("a", prompt=300, max_tokens=3, lora=LoraAdapter("lora0", 1, "/a")), 0.0)
    core.add_request(request("b", prompt=300, max_tokens=6, lora=LoraAdapter("lora1", 2, "/b")), 0.0)
    now = 0.0
    while core.has_work:
        now += core.step(now).duration_s
    series = info_series(lora_page(core))
    labels = [(s["running_lora_adapters"], s["waiting_lora_adapters"], s["max_lora"]) for s, _ in series]
    assert labels == [("lora0,lora1", "lora0,lora1", "2"), ("lora1", "lora1", "2"), ("", "", "2")]
    values = [v for _, v in series]
    assert values == sorted(values)
    assert values[-1] == now + 1000.0


def test_deferred_waiting_requests_are_counted_apart():
    core = EngineCore(load_profile("tiny-cpu"), model="tiny", enable_lora=True, max_loras=1)
    core.add_request(request("a", prompt=300, max_tokens=50, lora=LoraAdapter("lora0", 1, "/a")), 0.0)
    core.add_request(request("b", prompt=300, max_tokens=50, lora=LoraAdapter("lora1", 2, "/b")), 0.0)
    core.step(0.0)
    page = MetricsPage(core, created=1.0).render().decode()
    assert 'vllm:num_requests_waiting_by_reason{engine="0",model_name="tiny",reason="deferred"} 1.0' in page
    assert 'vllm:num_requests_waiting_by_reason{engine="0",model_name="tiny",reason="capacity"} 0.0' in page
    assert 'vllm:num_requests_waiting{engine="0",model_name="tiny"} 1.0' in page
