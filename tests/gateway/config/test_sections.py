"""The configuration's sections: defaults, unknown keys in every section, wrong types, limits, rules across keys."""

import inspect
from dataclasses import asdict, fields

import pytest

from priority_gateway.config import ClassesConfig, Config, ConfigError, PrefixPolicyConfig, load_config, parse_config
from priority_gateway.config.schema import open_field, type_hints
from priority_gateway.core.classes import CLASSES
from priority_gateway.core.dispatcher import AdmissionSettings
from priority_gateway.core.prefix_policy import PrefixAffinity
from priority_gateway.runtime import admission_settings, build_dispatcher
from tests.gateway.config.support import POOLS, section_class, section_paths, typo, with_value

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
    assert config.classes.interactive.pool == "interactive"
    assert config.classes.batch.pool == "batch"
    assert config.classes.interactive.budget.ttft_s == 0.5
    assert config.classes.interactive.budget.itl_s == 0.05
    assert config.classes.batch.budget.deadline_s == 86400
    assert config.limits.max_body_bytes == 10 * 1024 * 1024
    assert (config.listen.host, config.listen.port, config.store) == ("127.0.0.1", 8080, "sqlite")
    assert (config.upstream.connect_timeout_s, config.upstream.read_timeout_s) == (2.0, 300.0)
    assert config.admission.enabled and config.keys.required == "auto" and config.keys.admin is None


def test_defaults_are_the_cores_own():
    """The configuration refers to the core's defaults instead of repeating them."""
    config = parse_config({"pools": POOLS})
    assert admission_settings(config) == AdmissionSettings()
    affinity = inspect.signature(PrefixAffinity).parameters
    assert asdict(config.prefix.policy) == {name: affinity[name].default for name in asdict(config.prefix.policy)}


def test_every_prefix_policy_knob_is_a_documented_setting():
    """A new knob of the policy fails here until it is a setting (with a docstring) too."""
    # Set per pool from what its engines are: precise from kv_events, the chunk budget from max_num_batched_tokens.
    knobs = set(inspect.signature(PrefixAffinity).parameters) - {"precise", "prefill_chunk_tokens"}
    assert {f.name for f in fields(PrefixPolicyConfig)} == knobs


def test_the_classes_section_has_every_class():
    assert tuple(ClassesConfig().by_name()) == CLASSES


FOUR_CLASSES = {
    "realtime": {"priority": 0, "pool": "interactive", "ttft_p99_ms": 200},
    "interactive": {"priority": 1},
    "standard": {"priority": 2, "pool": "batch", "ttft_p99_ms": 5000},
    "batch": {"priority": 3},
}


def test_more_classes_sit_beside_the_two_and_keep_their_defaults():
    config = parse_config({"pools": POOLS, "classes": FOUR_CLASSES})
    assert list(config.classes.by_name()) == ["interactive", "batch", "realtime", "standard"]
    assert config.classes.interactive.ttft_p99_ms == 500.0, "the default budget stays"
    assert config.home_pools() == {
        "interactive": "interactive",
        "batch": "batch",
        "realtime": "interactive",
        "standard": "batch",
    }
    table = config.classes.table()
    assert table.names == ("realtime", "interactive", "standard", "batch")
    assert [table.priority(n) for n in table.names] == [0, 1, 2, 3]
    assert table.batch_like == ("batch",)
    assert build_dispatcher(config).home["realtime"] == "interactive"


def test_two_class_configs_keep_their_priorities():
    table = parse_config({"pools": POOLS}).classes.table()
    assert (table.names, table.priority("interactive"), table.priority("batch")) == (("interactive", "batch"), 0, 1)


@pytest.mark.parametrize(
    ("classes", "message"),
    [
        ({"realtime": {"pool": "interactive"}}, "classes.realtime.priority: a class other than interactive and batch"),
        ({"Realtime": {"priority": 0}}, "classes.Realtime: a class name is lower-case"),
        ({"interactve": {"priority": 0}}, "classes.interactve: unknown key; did you mean 'interactive'?"),
        ({"realtime": {"priority": 0, "kind": "urgent"}}, "classes.realtime.kind: expected one of"),
        ({"realtime": {"priority": 0, "pool": "gpu"}}, "classes.realtime.pool: no pool named 'gpu'"),
    ],
)
def test_a_bad_extra_class_is_refused_with_its_path(classes, message):
    with pytest.raises(ConfigError) as refused:
        parse_config({"pools": POOLS, "classes": classes})
    assert str(refused.value).startswith(message), str(refused.value)


def test_single_pool_serves_both_classes():
    config = parse_config({"pools": {"shared": {"engines": ["http://a:1"]}}})
    assert config.home_pools() == {"interactive": "shared", "batch": "shared"}


def test_keys_given_for_a_class_replace_only_those_keys():
    config = parse_config({"pools": POOLS, "classes": {"interactive": {"pool": "batch", "itl_p99_ms": None}}})
    assert config.classes.interactive.pool == "batch"
    assert config.classes.interactive.ttft_p99_ms == 500.0, "the default budget stays"
    assert config.classes.interactive.itl_p99_ms is None, "null: no budget"


def test_null_means_the_default():
    config = parse_config({"pools": POOLS, "admission": None, "listen": {"port": None}, "store": None})
    assert config.admission == Config().admission
    assert (config.listen.port, config.store) == (8080, "sqlite")


def test_admission_off_reaches_the_dispatcher():
    """``admission: {enabled: false}`` turns admission off (once, a misspelt key silently left it on)."""
    assert build_dispatcher(parse_config({"pools": POOLS})).admission.enabled is True
    assert build_dispatcher(parse_config({"pools": POOLS, "admission": {"enabled": False}})).admission.enabled is False
    with pytest.raises(ConfigError, match=r"^admission\.enabld: unknown key; did you mean 'enabled'\?$"):
        parse_config({"pools": POOLS, "admission": {"enabld": False}})


def test_a_misspelt_listen_port_is_refused_not_replaced_by_the_default():
    with pytest.raises(ConfigError, match=r"^listen\.prot: unknown key; did you mean 'port'\?$"):
        parse_config({"pools": POOLS, "listen": {"prot": 9000}})


def test_prefix_policy_options_reach_the_pools_policy():
    config = parse_config({"pools": POOLS, "prefix": {"policy": {"load_factor": 1.5, "rendezvous_blocks": 4}}})
    policy = build_dispatcher(config).pools["interactive"].policy
    assert isinstance(policy, PrefixAffinity)
    assert (policy.load_factor, policy.rendezvous_blocks, policy.precise) == (1.5, 4, None)


def test_engines_may_be_one_url_and_lose_their_trailing_slash():
    config = parse_config({"pools": {"p": {"engines": "http://a:8000/"}}})
    assert config.pools["p"].engines == ["http://a:8000"]


def test_choices_are_read_in_any_case():
    config = parse_config({"pools": {"p": {"engines": ["http://a:1"], "policy": "Least_Loaded"}}, "log_level": "INFO"})
    assert (config.pools["p"].policy, config.log_level) == ("least_loaded", "info")


SECTIONS = section_paths()


def test_the_sections_walked_are_all_of_them():
    names = {".".join(path) for path in SECTIONS}
    assert names >= {
        *("", "listen", "upstream", "health", "scrape", "pools.<name>", "classes", "classes.interactive"),
        *("classes.batch", "admission", "prefix", "prefix.policy", "batch", "keys"),
    }


@pytest.mark.parametrize("path", SECTIONS, ids=lambda path: ".".join(path) or "top")
def test_a_misspelt_key_in_any_section_names_the_nearest_known_key(path):
    known = next(iter(type_hints(section_class(path))))
    with pytest.raises(ConfigError) as refused:
        parse_config(with_value(path, typo(known), 1))
    where = ".".join(part if part != "<name>" else "batch" for part in (*path, typo(known)))
    assert str(refused.value) == f"{where}: unknown key; did you mean {known!r}?"


@pytest.mark.parametrize("path", SECTIONS, ids=lambda path: ".".join(path) or "top")
def test_an_unknown_key_in_any_section_lists_the_known_ones(path):
    if open_field(section_class(path)) is not None:
        with pytest.raises(ConfigError, match=r"\bzzz: expected a section"):
            parse_config(with_value(path, "zzz", 1))
        return
    known = list(type_hints(section_class(path)))
    with pytest.raises(ConfigError, match=r"\bzzz: unknown key; known keys: ") as refused:
        parse_config(with_value(path, "zzz", 1))
    assert str(refused.value).endswith(", ".join(known))


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"listen": {"port": "eighty"}}, "listen.port: expected an integer >= 1, <= 65535, got 'eighty'"),
        ({"listen": {"port": 70000}}, "listen.port: must be <= 65535, got 70000"),
        ({"listen": "0.0.0.0:80"}, "listen: expected a section (a mapping of keys to values), got '0.0.0.0:80'"),
        ({"store": 6379}, "store: expected a string (quote it), got 6379"),
        (
            {"store": "postgres://x"},
            "store: expected sqlite, sqlite://PATH, memory or a redis:// URL, got 'postgres://x'",
        ),
        ({"max_body_bytes": 0}, "max_body_bytes: must be > 0, got 0"),
        ({"log_level": "verbose"}, "log_level: expected one of 'debug', 'info', 'warning', 'error', 'critical'"),
        ({"upstream": {"read_timeout_s": "5m"}}, "upstream.read_timeout_s: expected a number > 0, got '5m'"),
        ({"health": {"unhealthy_after": 0}}, "health.unhealthy_after: must be >= 1, got 0"),
        ({"health": {"unhealthy_after": 1.5}}, "health.unhealthy_after: expected an integer >= 1, got 1.5"),
        ({"scrape": {"interval_s": -2}}, "scrape.interval_s: must be > 0, got -2"),
        ({"admission": {"enabled": "no way"}}, "admission.enabled: expected a boolean, got 'no way'"),
        ({"admission": {"backfill_reserve": 1}}, "admission.backfill_reserve: must be < 1, got 1"),
        ({"admission": {"min_limit": 8, "max_limit": 4}}, "admission.min_limit: must be <= max_limit (4), got 8"),
        ({"admission": {"initial_limit": 500}}, "admission.initial_limit: must be between min_limit and"),
        ({"admission": {"max_queue": True}}, "admission.max_queue: expected an integer >= 0, got true"),
        ({"classes": {"interactive": {"ttft_p99_ms": "fast"}}}, "classes.interactive.ttft_p99_ms: expected a"),
        ({"classes": {"batch": {"deadline_s": 0}}}, "classes.batch.deadline_s: must be > 0, got 0"),
        ({"classes": {"batch": {"pool": "gpu"}}}, "classes.batch.pool: no pool named 'gpu'"),
        ({"prefix": {"block_chars": "64 chars"}}, "prefix.block_chars: expected an integer > 0"),
        ({"prefix": {"policy": {"load_factor": 0.5}}}, "prefix.policy.load_factor: must be >= 1, got 0.5"),
        ({"prefix": {"policy": {"rendezvous_blocks": 2.5}}}, "prefix.policy.rendezvous_blocks: expected an"),
        ({"batch": {"concurrency": -1}}, "batch.concurrency: must be > 0, got -1"),
        ({"batch": {"file_retention_s": -1}}, "batch.file_retention_s: must be >= 0, got -1"),
        ({"batch": {"files_dir": ["/a"]}}, "batch.files_dir: expected a string, got ['/a']"),
        ({"keys": {"required": "sometimes"}}, "keys.required: expected a boolean or 'auto', got 'sometimes'"),
        ({"keys": {"cache_s": -1}}, "keys.cache_s: must be >= 0, got -1"),
    ],
)
def test_wrong_types_and_values_out_of_range_name_the_key(section, message):
    with pytest.raises(ConfigError) as refused:
        parse_config({"pools": POOLS, **section})
    assert str(refused.value).startswith(message)


@pytest.mark.parametrize(
    ("pool", "message"),
    [
        ({}, "pools.p: give engines or discovery"),
        (
            {"engines": ["http://x", "ftp://x"]},
            "pools.p.engines[1]: expected an http:// or https:// URL, got 'ftp://x'",
        ),
        ({"discovery": "vllm:8000"}, "pools.p.discovery: expected dns://HOST:PORT, got 'vllm:8000'"),
        ({"engines": ["http://x"], "policy": "magic"}, "pools.p.policy: expected one of 'prefix', 'least_loaded'"),
        ({"engines": ["http://x"], "scheduling_policy": "lifo"}, "pools.p.scheduling_policy: expected one of"),
        ({"engines": ["http://x"], "backfill": "yes please"}, "pools.p.backfill: expected a boolean"),
        ({"engines": ["http://x"], "accept_overflow": True}, "pools.p.accept_overflow: needs scheduling_policy"),
        ({"engines": ["http://x"], "kv_events": "tcp://0.0.0.0:5557"}, "pools.p.kv_events: needs tokenizer"),
        ({"engines": ["http://x"], "kv_events": "5557", "tokenizer": "sim"}, "pools.p.kv_events: expected tcp://"),
        (
            {"engines": ["http://x"], "kv_events": "tcp://0.0.0.0:5557", "tokenizer": "sim", "policy": "round_robin"},
            "pools.p.kv_events: needs policy: prefix",
        ),
        ({"engines": ["http://x"], "kv_events_topics": ["a"]}, "pools.p.kv_events_topics: expected a mapping"),
        (
            {
                "engines": ["http://x"],
                "kv_events": "tcp://0.0.0.0:5557",
                "tokenizer": "sim",
                "kv_events_replay_port": 5558,
            },
            "pools.p.kv_events_replay_port: needs kv_events: engine-port:PORT",
        ),
        (
            {"engines": ["http://x"], "kv_events": "engine-port:5557", "tokenizer": "sim", "kv_events_replay_port": 0},
            "pools.p.kv_events_replay_port: must be >= 1, got 0",
        ),
        ({"engines": ["http://x"], "api_key": 1234}, "pools.p.api_key: expected a string (quote it)"),
    ],
)
def test_pool_settings_are_checked(pool, message):
    with pytest.raises(ConfigError) as refused:
        parse_config({"pools": {"p": pool}})
    assert str(refused.value).startswith(message)


def test_pools_are_needed_unless_a_command_needs_none():
    with pytest.raises(ConfigError, match=r"^pools: at least one pool is needed"):
        parse_config({})
    assert parse_config({"store": "redis://r:6379/0"}, pools_required=False).store == "redis://r:6379/0"


def test_a_pool_that_is_not_a_section_is_refused():
    with pytest.raises(ConfigError, match=r"^pools\.p: expected a section, got null$"):
        parse_config({"pools": {"p": None}})


def test_aliases_take_a_name_or_a_weighted_split():
    config = parse_config(
        {
            "pools": {"p": {"engines": ["http://e:1"], "models": ["a", "b"]}},
            "models": {"aliases": {"one": "a", "canary": [{"model": "a", "weight": 90}, {"model": "b", "weight": 10}]}},
        }
    )
    assert config.models.aliases["one"] == "a"
    assert [(t.model, t.weight) for t in config.models.aliases["canary"]] == [("a", 90), ("b", 10)]
    assert config.pools["p"].models == ["a", "b"]


def test_an_alias_to_a_model_no_pool_declares_is_refused():
    pools = {"a": {"engines": ["http://e:1"], "models": ["m-a"]}, "b": {"engines": ["http://e:2"], "model": "m-b"}}
    split = [{"model": "m-a", "weight": 1}, {"model": "m-b", "weight": 1}, {"model": "m-c", "weight": 1}]
    with pytest.raises(ConfigError, match=r"^models\.aliases\.canary: 'm-c' is declared by no pool") as caught:
        parse_config({"pools": pools, "models": {"aliases": {"chat": "m-b", "canary": split}}})
    assert "pools.<name>.models" in str(caught.value)
    assert parse_config({"pools": pools, "models": {"aliases": {"canary": split[:2]}}}).models.aliases


@pytest.mark.parametrize(
    ("aliases", "where"),
    [
        ({"c": [{"model": "a", "weight": 0}]}, "models.aliases.c"),
        ({"c": [{"weight": 3}]}, "models.aliases.c"),
        ({"c": [{"model": "a", "weight": -1}]}, "models.aliases.c"),
        ({"c": 5}, "models.aliases.c"),
    ],
)
def test_impossible_aliases_are_refused_naming_the_key(aliases, where):
    with pytest.raises(ConfigError) as caught:
        parse_config({"pools": {"p": {"engines": ["http://e:1"]}}, "models": {"aliases": aliases}})
    assert where in str(caught.value)


def test_a_pool_can_share_its_devices_only_with_another_pool_that_exists():
    import pytest

    from priority_gateway.config import ConfigError
    from priority_gateway.config.load import parse_config

    base = {"interactive": {"engines": ["http://i:8000"]}, "batch": {"engines": ["http://b:8000"]}}
    ok = parse_config({"pools": {**base, "batch": {**base["batch"], "shares_hardware_with": "interactive"}}})
    assert ok.pools["batch"].shares_hardware_with == "interactive"
    for bad in ("nowhere", "batch"):
        with pytest.raises(ConfigError, match="shares_hardware_with"):
            parse_config({"pools": {**base, "batch": {**base["batch"], "shares_hardware_with": bad}}}).validated()


@pytest.mark.parametrize(
    ("seats", "message"),
    [(0, "must be >= 1, got 0"), (-3, "must be >= 1, got -3"), ("four", "expected an integer >= 1, got 'four'")],
)
def test_engine_seats_are_a_positive_count_and_reach_the_pools_limits(seats, message):
    pool = {"engines": ["http://127.0.0.1:8101"]}
    with pytest.raises(ConfigError, match=rf"^pools\.interactive\.max_num_seqs: {message}$"):
        parse_config({"pools": {"interactive": {**pool, "max_num_seqs": seats}}})
    dispatcher = build_dispatcher(parse_config({"pools": {"interactive": {**pool, "max_num_seqs": 3}}}))
    assert dispatcher.limits["http://127.0.0.1:8101"].settings.maximum == 3.0
