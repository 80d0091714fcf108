"""docker-compose.yml and docker-compose.gpu.yml, resolved by Docker Compose itself (`config`
needs no Docker engine): each stack brings the right services, engines run the pool profiles with
the model the variables name, nothing is published beyond loopback by default, the vLLM stack
refuses to start without HF_TOKEN, and the gateway's admin key is never a default one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from priority_gateway.config import load_config
from tests.deploy.support import (
    CPU_FILES,
    GPU_FILES,
    POOLS,
    REPO,
    compose_command,
    compose_config,
    compose_env,
    compose_variables,
    flag_values,
    gpu_config,
    profile,
)
from tests.support.procs import Proc, free_port

CORE = {"gateway", "redis"}
PUBLISHED = {"gateway", "prometheus", "grafana"}


@pytest.mark.parametrize(
    ("files", "profiles", "services"),
    [
        (CPU_FILES, ("cpu",), CORE | {"sim-interactive", "sim-batch"}),
        (CPU_FILES, ("cpu", "monitoring"), CORE | {"sim-interactive", "sim-batch", "prometheus", "grafana"}),
        (GPU_FILES, (), CORE | {"vllm-interactive", "vllm-batch"}),
        (GPU_FILES, ("monitoring",), CORE | {"vllm-interactive", "vllm-batch", "prometheus", "grafana"}),
    ],
)
def test_each_stack_brings_its_services(files: tuple[str, ...], profiles: tuple[str, ...], services: set[str]) -> None:
    resolved = compose_config(*profiles, files=files, variables={"HF_TOKEN": "hf_test"})
    assert set(resolved["services"]) == services


def compose_failure(files: tuple[str, ...], variables: dict[str, str]) -> str:
    command = compose_command(files, (), "config", "--quiet")
    done = subprocess.run(command, cwd=REPO, env=compose_env(variables), capture_output=True, text=True, timeout=60)
    assert done.returncode != 0, "compose accepted the files"
    return done.stderr


@pytest.mark.parametrize("token", [None, ""])
def test_the_vllm_stack_refuses_to_start_without_hf_token(token: str | None) -> None:
    variables = {} if token is None else {"HF_TOKEN": token}
    message = compose_failure(GPU_FILES, variables)
    assert "required variable HF_TOKEN is missing a value" in message
    assert "Hugging Face access token" in message


def test_the_simulator_stack_needs_no_hf_token() -> None:
    assert "HF_TOKEN" not in (REPO / "docker-compose.yml").read_text().split("name: priority-gateway")[1]
    assert compose_config("cpu", "monitoring")["services"]


def test_the_model_comes_from_the_variables() -> None:
    services = gpu_config(MODEL="Qwen/Qwen3-8B", SERVED_MODEL_NAME="qwen3", MTP_MODEL="example/qwen3-mtp")["services"]
    for pool in POOLS:
        command = services[f"vllm-{pool}"]["command"]
        assert command[0] == "Qwen/Qwen3-8B"
        assert flag_values(command)["--served-model-name"] == "qwen3"
    speculative = json.loads(flag_values(services["vllm-batch"]["command"])["--speculative-config"])
    assert speculative["model"] == "example/qwen3-mtp"
    sims = compose_config("cpu", variables={"SERVED_MODEL_NAME": "qwen3"})["services"]
    assert {flag_values(sims[f"sim-{pool}"]["command"])["--model"] for pool in POOLS} == {"qwen3"}


def test_the_default_model_is_the_articles_gemma_4() -> None:
    for pool in POOLS:
        command = gpu_config()["services"][f"vllm-{pool}"]["command"]
        assert command[0] == "nvidia/Gemma-4-31B-IT-NVFP4"
        assert command[0] == profile(pool)["args"][0]


def published(services: dict) -> dict[str, list[str]]:
    return {name: [p["host_ip"] for p in service["ports"]] for name, service in services.items() if "ports" in service}


def test_nothing_is_published_beyond_loopback_by_default() -> None:
    for files in (CPU_FILES, GPU_FILES):
        addresses = published(compose_config("cpu", "monitoring", files=files, variables={"HF_TOKEN": "x"})["services"])
        assert set(addresses) == PUBLISHED
        assert addresses == {name: ["127.0.0.1"] for name in PUBLISHED}


def test_addresses_are_chosen_by_variables() -> None:
    variables = {"GATEWAY_ADDRESS": "0.0.0.0", "MONITORING_ADDRESS": "10.1.2.3"}
    addresses = published(compose_config("cpu", "monitoring", variables=variables)["services"])
    assert addresses == {"gateway": ["0.0.0.0"], "prometheus": ["10.1.2.3"], "grafana": ["10.1.2.3"]}


def test_the_admin_key_is_the_operators_or_generated_into_the_state_volume() -> None:
    gateway = compose_config("cpu")["services"]["gateway"]
    env = gateway["environment"]
    assert env["GATEWAY__KEYS__ADMIN"] == "", "no default admin key"
    key_dir = str(Path(env["GATEWAY__KEYS__ADMIN_FILE"]).parent)
    mounts = {v["target"]: v for v in gateway["volumes"]}
    assert mounts[key_dir]["type"] == "volume", "the generated key survives a restart"
    assert (
        compose_config("cpu", variables={"GATEWAY_ADMIN_KEY": "k" * 64})["services"]["gateway"]["environment"][
            "GATEWAY__KEYS__ADMIN"
        ]
        == "k" * 64
    )


def test_compose_rejects_a_broken_file(tmp_path: Path) -> None:
    """The check is real: Compose validates against its schema."""
    from tests.deploy.support import compose_binary, run

    broken = tmp_path / "docker-compose.yml"
    broken.write_text((REPO / "docker-compose.yml").read_text().replace("restart:", "restarts:", 1))
    with pytest.raises(AssertionError, match="restarts"):
        run([compose_binary(), "-f", str(broken), "config", "--quiet"], cwd=tmp_path)


@pytest.mark.parametrize("pool", POOLS)
def test_gpu_engines_run_the_pool_profile_on_their_own_gpu(pool: str) -> None:
    service = gpu_config()["services"][f"vllm-{pool}"]
    data = profile(pool)
    assert service["image"] == data["image"]
    assert service["entrypoint"] == data["command"]
    assert service["command"] == data["args"]
    devices = service["deploy"]["resources"]["reservations"]["devices"]
    assert len(devices) == 1
    assert devices[0]["capabilities"] == ["gpu"]
    assert len(devices[0]["device_ids"]) == 1


def test_gpu_engines_use_different_gpus() -> None:
    services = gpu_config()["services"]
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


@pytest.mark.parametrize("files", [CPU_FILES, GPU_FILES])
def test_gateway_config_loads_and_names_the_engines(files: tuple[str, ...]) -> None:
    config = compose_config("cpu", files=files) if files == CPU_FILES else gpu_config()
    gateway = config["services"]["gateway"]
    config_path = gateway["command"][gateway["command"].index("--config") + 1]
    mount = next(v for v in gateway["volumes"] if v["target"] == config_path)
    env = gateway["environment"]
    loaded = load_config(mount["source"], env=env)
    assert loaded.store == "redis://redis:6379/0"
    assert loaded.keys.admin is None and loaded.keys.admin_file
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
        assert loaded.pools[pool].max_num_seqs == profile(pool)["gateway"]["max_num_seqs"]
    assert gateway["ports"][0]["target"] == loaded.listen.port


def test_monitoring_mounts_exist() -> None:
    services = compose_config("cpu", "monitoring")["services"]
    for name in ("prometheus", "grafana"):
        for volume in services[name]["volumes"]:
            if volume["type"] == "bind":
                assert Path(volume["source"]).is_file(), volume["source"]


def test_the_gateway_serves_with_the_compose_environment_and_the_hosts_variables(
    procs: list[Proc], tmp_path: Path
) -> None:
    """Its own variables (GATEWAY_PORT, GATEWAY_ADMIN_KEY, ...) set in the shell that runs
    `gateway serve` are not configuration; the container's GATEWAY__* overrides are. With no
    GATEWAY_ADMIN_KEY, the gateway generates its admin key into the state volume."""
    assert {"GATEWAY_PORT", "GATEWAY_ADMIN_KEY", "GATEWAY_LOG_LEVEL"} <= compose_variables()
    gateway = compose_config("cpu")["services"]["gateway"]
    config_path = gateway["command"][gateway["command"].index("--config") + 1]
    mount = next(v for v in gateway["volumes"] if v["target"] == config_path)
    port = free_port()
    key_file = tmp_path / "state" / Path(gateway["environment"]["GATEWAY__KEYS__ADMIN_FILE"]).name
    env = {
        **{name: "from-the-host" for name in compose_variables()},
        **gateway["environment"],
        # Only addresses and paths change: loopback, the volume in a temporary directory, and no
        # Redis or engines needed to answer /health and /admin/keys.
        "GATEWAY__LISTEN__HOST": "127.0.0.1",
        "GATEWAY__LISTEN__PORT": str(port),
        "GATEWAY__STORE": "memory",
        "GATEWAY__KEYS__ADMIN_FILE": str(key_file),
    }
    args = [mount["source"] if arg == config_path else arg for arg in gateway["command"]]
    proc = Proc(
        [sys.executable, "-m", "priority_gateway", *args], f"http://127.0.0.1:{port}", tmp_path / "gw.log", env=env
    )
    procs.append(proc.start())
    proc.wait_ready("/health")
    admin_key = key_file.read_text().strip()
    assert httpx.get(proc.url + "/admin/keys", headers={"Authorization": f"Bearer {admin_key}"}).status_code == 200
    assert httpx.get(proc.url + "/admin/keys", headers={"Authorization": "Bearer from-the-host"}).status_code == 401
    assert "environment_not_read" in proc.log() and "GATEWAY_LOG_LEVEL" in proc.log()
    assert "admin_key_generated" in proc.log() and admin_key not in proc.log()
