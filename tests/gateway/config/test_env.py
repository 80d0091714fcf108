"""Environment overrides: ``GATEWAY__<SECTION>__<KEY>``, and nothing else that starts with GATEWAY_."""

import pytest

from priority_gateway.config import Config, ConfigError, load_config
from priority_gateway.config.env import unread
from priority_gateway.config.schema import type_hints
from tests.gateway.config.support import section_class, section_paths, typo

MINIMAL = """
pools:
  Interactive:
    engines: ["http://127.0.0.1:8001", "http://127.0.0.1:8002"]
  batch:
    engines: ["http://127.0.0.1:8003"]
"""

# What a shell set up for docker-compose.yml holds, and what Kubernetes gives every pod in a
# namespace with a Service named ``gateway``: none of it is configuration.
NOT_OURS = {
    "GATEWAY_PORT": "tcp://10.96.0.12:8080",
    "GATEWAY_ADMIN_KEY": "from-the-host",
    "GATEWAY_SERVICE_HOST": "10.96.0.12",
    "GATEWAY_SERVICE_PORT": "8080",
    "GATEWAY_SERVICE_PORT_HTTP": "8080",
    "GATEWAY_PORT_8080_TCP": "tcp://10.96.0.12:8080",
    "GATEWAY_PORT_8080_TCP_ADDR": "10.96.0.12",
    "GATEWAY_PORT_8080_TCP_PORT": "8080",
    "GATEWAY_PORT_8080_TCP_PROTO": "tcp",
    "GATEWAY_LOG_LEVEL": "debug",
}


@pytest.fixture
def path(tmp_path):
    path = tmp_path / "gateway.yaml"
    path.write_text(MINIMAL)
    return path


def test_environment_overrides_nested_values(path):
    env = {
        "GATEWAY__STORE": "redis://localhost:6379/0",
        "GATEWAY__POOLS__BATCH__POLICY": "least_loaded",
        "GATEWAY__POOLS__BATCH__ENGINES": '["http://10.0.0.9:8000"]',
        "GATEWAY__POOLS__INTERACTIVE__BACKFILL": "false",
        "GATEWAY__LISTEN__PORT": "9000",
        "GATEWAY__CLASSES__INTERACTIVE__TTFT_P99_MS": "300",
        "GATEWAY__PREFIX__POLICY__LOAD_FACTOR": "1.5",
        "OTHER": "ignored",
    }
    config = load_config(path, env=env)
    assert config.store == "redis://localhost:6379/0"
    assert config.pools["batch"].policy == "least_loaded"
    assert config.pools["batch"].engines == ["http://10.0.0.9:8000"]
    assert list(config.pools) == ["Interactive", "batch"], "a pool is matched in any case, not added"
    assert config.pools["Interactive"].backfill is False
    assert config.listen.port == 9000
    assert config.classes.interactive.budget.ttft_s == 0.3
    assert config.prefix.policy.load_factor == 1.5


def test_compose_and_kubernetes_variables_are_not_read(path):
    assert load_config(path, env=NOT_OURS) == load_config(path, env={})


def test_the_old_single_underscore_overrides_are_named_for_a_warning():
    env = {**NOT_OURS, "GATEWAY_STORE": "redis://r", "GATEWAY_KEYS__ADMIN": "k", "GATEWAY__STORE": "memory"}
    assert unread(Config, env) == ["GATEWAY_KEYS__ADMIN", "GATEWAY_LOG_LEVEL", "GATEWAY_STORE"]


def test_string_keys_are_taken_as_written(path):
    config = load_config(path, env={"GATEWAY__KEYS__ADMIN": "0123", "GATEWAY__POOLS__BATCH__API_KEY": "true"})
    assert (config.keys.admin, config.pools["batch"].api_key) == ("0123", "true")


def test_a_whole_section_may_be_one_variable(path):
    config = load_config(path, env={"GATEWAY__ADMISSION": "{enabled: false, max_queue: 10}"})
    assert (config.admission.enabled, config.admission.max_queue) == (False, 10)


def test_an_empty_value_means_the_default(path):
    config = load_config(path, env={"GATEWAY__LISTEN__PORT": "", "GATEWAY__KEYS__ADMIN": ""})
    assert (config.listen.port, config.keys.admin) == (8080, None)


def test_pools_may_come_from_the_environment_alone():
    config = load_config(None, env={"GATEWAY__POOLS__SHARED__ENGINES": "http://127.0.0.1:8001"})
    assert config.pools["shared"].engines == ["http://127.0.0.1:8001"]


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"GATEWAY__ADMISSION__ENABLD": "false"},
            "GATEWAY__ADMISSION__ENABLD: admission.enabld: unknown key; did you mean 'enabled'?",
        ),
        ({"GATEWAY__STOER": "memory"}, "GATEWAY__STOER: stoer: unknown key; did you mean 'store'?"),
        (
            {"GATEWAY__POOLS__BATCH__POLICI": "x"},
            "GATEWAY__POOLS__BATCH__POLICI: pools.batch.polici: unknown key; did you mean 'policy'?",
        ),
        ({"GATEWAY__STORE__HOST": "r"}, "GATEWAY__STORE__HOST: store: is a value, not a section"),
        (
            {"GATEWAY__LISTEN____PORT": "1"},
            "GATEWAY__LISTEN____PORT: expected GATEWAY__<SECTION>__<KEY>, with __ between levels",
        ),
        (
            {"GATEWAY__LISTEN__PORT": "eighty"},
            "GATEWAY__LISTEN__PORT: listen.port: expected an integer >= 1, <= 65535, got 'eighty'",
        ),
        (
            {"GATEWAY__ADMISSION": "{enabld: false}"},
            "GATEWAY__ADMISSION: admission.enabld: unknown key; did you mean 'enabled'?",
        ),
        (
            {"GATEWAY__LOG_LEVEL": "loud"},
            "GATEWAY__LOG_LEVEL: log_level: expected one of 'debug', 'info', 'warning', 'error', 'critical', "
            "got 'loud'",
        ),
    ],
)
def test_a_bad_override_names_the_variable(path, env, message):
    with pytest.raises(ConfigError) as refused:
        load_config(path, env=env)
    assert str(refused.value) == message


@pytest.mark.parametrize("section", section_paths(), ids=lambda path: ".".join(path) or "top")
def test_a_misspelt_override_in_any_section_names_the_variable_and_the_nearest_key(path, section):
    known = next(iter(type_hints(section_class(section))))
    parts = [part if part != "<name>" else "batch" for part in (*section, typo(known))]
    variable = "GATEWAY__" + "__".join(part.upper() for part in parts)
    with pytest.raises(ConfigError) as refused:
        load_config(path, env={variable: "1"})
    assert str(refused.value) == f"{variable}: {'.'.join(parts)}: unknown key; did you mean {known!r}?"
