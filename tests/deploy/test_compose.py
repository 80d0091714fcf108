"""docker-compose.yml, resolved by Docker Compose itself (`config` needs no Docker engine):
each profile brings the right services, engines run the pool profiles, and the gateway's
compose config loads and names engines that exist."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import httpx
import pytest

from gateway.config import load_config
from tests.deploy.support import POOLS, REPO, compose_config, profile
from tests.support.procs import Proc, free_port

CORE = {"gateway", "redis"}


@pytest.mark.parametrize(
    ("profiles", "services"),
    [
        (("cpu",), CORE | {"sim-interactive", "sim-batch"}),
        (("gpu",), CORE | {"vllm-interactive", "vllm-batch"}),
        (("cpu", "monitoring"), CORE | {"sim-interactive", "sim-batch", "prometheus", "grafana"}),
    ],
)
def test_profiles_select_services(profiles: tuple[str, ...], services: set[str]) -> None:
    assert set(compose_config(*profiles)["services"]) == services


def test_compose_rejects_a_broken_file(tmp_path: Path) -> None:
    """The check is real: Compose validates against its schema."""
    from tests.deploy.support import compose_binary, run

    broken = tmp_path / "docker-compose.yml"
    broken.write_text((REPO / "docker-compose.yml").read_text().replace("restart:", "restarts:", 1))
    with pytest.raises(AssertionError, match="restarts"):
        run([compose_binary(), "-f", str(broken), "config", "--quiet"], cwd=tmp_path)


@pytest.mark.parametrize("pool", POOLS)
def test_gpu_engines_run_the_pool_profile_on_their_own_gpu(pool: str) -> None:
    service = compose_config("gpu")["services"][f"vllm-{pool}"]
    data = profile(pool)
    assert service["image"] == data["image"]
    assert service["entrypoint"] == data["command"]
    assert service["command"] == data["args"]
    devices = service["deploy"]["resources"]["reservations"]["devices"]
    assert len(devices) == 1
    assert devices[0]["capabilities"] == ["gpu"]
    assert len(devices[0]["device_ids"]) == 1


def test_gpu_engines_use_different_gpus() -> None:
    services = compose_config("gpu")["services"]
    ids = [
        services[f"vllm-{pool}"]["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] for pool in POOLS
    ]
    assert ids[0] != ids[1]


@pytest.mark.parametrize("pool", POOLS)
def test_cpu_engines_run_the_simulator_under_the_pool_name(pool: str) -> None:
    services = compose_config("cpu")["services"]
    service = services[f"sim-{pool}"]
    sim = profile(pool)["simulator"]
    assert service["image"] == services["gateway"]["image"], "the simulator ships in the project's image"
    assert service["entrypoint"] == sim["command"]
    assert service["command"] == sim["args"]
    assert f"vllm-{pool}" in service["networks"]["default"]["aliases"]
    assert not service.get("deploy", {}).get("resources", {}).get("reservations"), "no GPU"


def test_redis_appends_to_a_volume() -> None:
    redis = compose_config("cpu")["services"]["redis"]
    command = redis["command"]
    options = dict(zip(command[1::2], command[2::2], strict=False))
    assert options["--appendonly"] == "yes"
    assert options["--appendfsync"] == "everysec"
    assert {v["target"] for v in redis["volumes"] if v["type"] == "volume"} == {options["--dir"]}


@pytest.mark.parametrize("profiles", [("cpu",), ("gpu",)])
def test_gateway_config_loads_and_names_the_engines(profiles: tuple[str, ...]) -> None:
    config = compose_config(*profiles)
    gateway = config["services"]["gateway"]
    config_path = gateway["command"][gateway["command"].index("--config") + 1]
    mount = next(v for v in gateway["volumes"] if v["target"] == config_path)
    env = gateway["environment"]
    loaded = load_config(mount["source"], env=env)
    assert loaded.store == "redis://redis:6379/0"
    assert loaded.keys.admin
    names = set()
    for name, service in config["services"].items():
        names.add(name)
        default_network = (service.get("networks") or {}).get("default") or {}
        names.update(default_network.get("aliases") or [])
    for pool in POOLS:
        host_port = loaded.pools[pool].discovery.removeprefix("dns://")
        host, port = host_port.split(":")
        assert host in names
        assert port == "8000"
        assert loaded.pools[pool].scheduling_policy == profile(pool)["gateway"]["scheduling_policy"]
    assert gateway["ports"][0]["target"] == loaded.listen.port


def test_monitoring_mounts_exist() -> None:
    services = compose_config("cpu", "monitoring")["services"]
    for name in ("prometheus", "grafana"):
        for volume in services[name]["volumes"]:
            if volume["type"] == "bind":
                assert Path(volume["source"]).is_file(), volume["source"]


def host_variables() -> set[str]:
    """The variables docker-compose.yml reads from the host's shell (``${NAME:-default}``)."""
    return set(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)", (REPO / "docker-compose.yml").read_text()))


def test_the_gateway_serves_with_the_compose_environment_and_the_hosts_variables(
    procs: list[Proc], tmp_path: Path
) -> None:
    """Its own variables (GATEWAY_PORT, GATEWAY_ADMIN_KEY, ...) set in the shell that runs
    `gateway serve` are not configuration; the container's GATEWAY__* overrides are."""
    assert {"GATEWAY_PORT", "GATEWAY_ADMIN_KEY", "GATEWAY_LOG_LEVEL"} <= host_variables()
    gateway = compose_config("cpu")["services"]["gateway"]
    config_path = gateway["command"][gateway["command"].index("--config") + 1]
    mount = next(v for v in gateway["volumes"] if v["target"] == config_path)
    port = free_port()
    env = {
        **{name: "from-the-host" for name in host_variables()},
        **gateway["environment"],
        # Only the addresses change: loopback, and no Redis or engines needed to answer /health.
        "GATEWAY__LISTEN__HOST": "127.0.0.1",
        "GATEWAY__LISTEN__PORT": str(port),
        "GATEWAY__STORE": "memory",
    }
    args = [mount["source"] if arg == config_path else arg for arg in gateway["command"]]
    proc = Proc([sys.executable, "-m", "gateway", *args], f"http://127.0.0.1:{port}", tmp_path / "gw.log", env=env)
    procs.append(proc.start())
    proc.wait_ready("/health")
    admin_key = gateway["environment"]["GATEWAY__KEYS__ADMIN"]
    assert httpx.get(proc.url + "/admin/keys", headers={"Authorization": f"Bearer {admin_key}"}).status_code == 200
    assert httpx.get(proc.url + "/admin/keys", headers={"Authorization": "Bearer from-the-host"}).status_code == 401
    assert "environment_not_read" in proc.log() and "GATEWAY_LOG_LEVEL" in proc.log()
