"""Reading the file, and the order of the sources: defaults, file, environment, options."""

import pytest

from priority_gateway.config import ConfigError, Raw, load_config

MINIMAL = "pools:\n  p:\n    engines: [http://127.0.0.1:8001]\n"


def test_each_source_overrides_the_one_before(tmp_path):
    path = tmp_path / "gateway.yaml"
    path.write_text(MINIMAL + "listen: {host: 0.0.0.0, port: 9000}\nlog_level: warning\n")
    base = {"pools": {"q": {"engines": ["http://127.0.0.1:8002"]}}, "store": "redis://base:6379/0"}
    config = load_config(
        path,
        env={"GATEWAY__LISTEN__PORT": "9001", "GATEWAY__LOG_LEVEL": "error"},
        base=base,
        flags={"listen.port": Raw("9002", "--port"), "listen.host": None},
    )
    assert (config.listen.host, config.listen.port, config.log_level) == ("0.0.0.0", 9002, "error")
    assert list(config.pools) == ["q", "p"] and config.store == "redis://base:6379/0"


def test_a_bad_option_names_the_option(tmp_path):
    path = tmp_path / "gateway.yaml"
    path.write_text(MINIMAL)
    with pytest.raises(ConfigError) as refused:
        load_config(path, env={}, flags={"listen.port": Raw("70000", "--port")})
    assert str(refused.value) == "--port: listen.port: must be <= 65535, got 70000"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("pools: [a, b", "not valid YAML: expected ',' or ']', but got '<stream end>' at line 1, column 13"),
        ("- pools", "the top level must be a mapping of sections"),
        (MINIMAL + "admission: {enabld: false}\n", "admission.enabld: unknown key; did you mean 'enabled'?"),
    ],
)
def test_file_errors_name_the_file(tmp_path, text, message):
    path = tmp_path / "gateway.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as refused:
        load_config(path, env={})
    assert str(refused.value) == f"{path}: {message}"


def test_a_missing_file_is_one_clear_error(tmp_path):
    with pytest.raises(ConfigError, match=r"gateway\.yaml: cannot read the file \(No such file or directory\)$"):
        load_config(tmp_path / "gateway.yaml", env={})


def test_an_empty_file_is_the_defaults_and_still_needs_pools(tmp_path):
    path = tmp_path / "gateway.yaml"
    path.write_text("# nothing yet\n")
    with pytest.raises(ConfigError, match="pools: at least one pool is needed"):
        load_config(path, env={})
    assert load_config(path, env={}, pools_required=False).store == "sqlite"
