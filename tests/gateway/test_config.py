import pytest

from gateway.config import ConfigError, load_config, parse_config

MINIMAL = """
pools:
  interactive:
    engines: ["http://127.0.0.1:8001", "http://127.0.0.1:8002"]
  batch:
    engines: ["http://127.0.0.1:8003"]
"""


def test_minimal_config_gets_defaults(tmp_path):
    path = tmp_path / "g.yaml"
    path.write_text(MINIMAL)
    config = load_config(path, env={})
    assert list(config.pools) == ["interactive", "batch"]
    assert config.pools["interactive"].policy == "prefix"
    assert config.classes["interactive"].pool == "interactive"
    assert config.classes["batch"].pool == "batch"
    assert config.classes["interactive"].budget.ttft_s == 0.5
    assert config.classes["interactive"].budget.itl_s == 0.05
    assert config.limits.max_body_bytes == 10 * 1024 * 1024
    assert (config.host, config.port, config.store) == ("127.0.0.1", 8080, "memory")


def test_environment_overrides_nested_values(tmp_path):
    path = tmp_path / "g.yaml"
    path.write_text(MINIMAL)
    env = {
        "GATEWAY_STORE": "redis://localhost:6379/0",
        "GATEWAY_POOLS__BATCH__POLICY": "least_loaded",
        "GATEWAY_POOLS__BATCH__ENGINES": '["http://10.0.0.9:8000"]',
        "GATEWAY_LISTEN__PORT": "9000",
        "GATEWAY_CLASSES__INTERACTIVE__TTFT_P99_MS": "300",
        "OTHER": "ignored",
    }
    config = load_config(path, env=env)
    assert config.store == "redis://localhost:6379/0"
    assert config.pools["batch"].policy == "least_loaded"
    assert config.pools["batch"].engines == ["http://10.0.0.9:8000"]
    assert config.port == 9000
    assert config.classes["interactive"].budget.ttft_s == 0.3


def test_single_pool_serves_both_classes():
    config = parse_config({"pools": {"shared": {"engines": ["http://a:1"]}}})
    assert config.classes["interactive"].pool == "shared"
    assert config.classes["batch"].pool == "shared"


@pytest.mark.parametrize(
    "data, message",
    [
        ({}, "at least one pool"),
        ({"pools": {"p": {"engines": ["ftp://x"]}}}, "not an http"),
        ({"pools": {"p": {"engines": ["http://x"], "policy": "magic"}}}, "policy"),
        ({"pools": {"p": {"engines": ["http://x"], "colour": "red"}}}, "unknown keys"),
        ({"pools": {"p": {"engines": ["http://x"], "accept_overflow": True}}}, "scheduling_policy: priority"),
        ({"pools": {"p": {}}}, "engines or discovery"),
        ({"pools": {"p": {"engines": ["http://x"]}}, "classes": {"interactive": {"pool": "q"}}}, "no pool"),
        ({"pools": {"p": {"engines": ["http://x"]}}, "colours": 1}, "unknown top-level"),
    ],
)
def test_invalid_configs_are_explained(data, message):
    with pytest.raises(ConfigError, match=message):
        parse_config(data)
