"""The sim overlay's stack, run as real processes on loopback with the manifests' own
arguments: Redis with the StatefulSet's persistence flags, the simulator with each pool's
profile arguments, the gateway with the ConfigMap and the pod's environment (the Services'
variables Kubernetes adds included). Only addresses
change (loopback and free ports). Every probe path the manifests use answers, and the
metrics the dashboard reads are exported."""

from __future__ import annotations

import base64
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis

from tests.deploy.documented_metrics import GATEWAY, VLLM
from tests.deploy.support import POOLS, container, find, named, profile, render
from tests.deploy.test_dashboard import dashboard, metrics_read
from tests.support.procs import Proc, free_port

pytestmark = pytest.mark.redis


def on_loopback(args: list[str], port: int) -> list[str]:
    replaced = {"--host": "--host=127.0.0.1", "--port": f"--port={port}"}
    return [replaced.get(arg.partition("=")[0], arg) for arg in args]


def pod_env(docs: list[dict], deployment: dict) -> dict[str, str]:
    """The container's variables as Kubernetes sets them: a variable from an optional Secret that
    does not exist is left out."""
    env = {}
    for item in container(deployment)["env"]:
        if "value" in item:
            env[item["name"]] = item["value"]
            continue
        ref = item["valueFrom"]["secretKeyRef"]
        secrets = [d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == ref["name"]]
        assert secrets or ref.get("optional"), f"Secret {ref['name']} is neither in the overlay nor optional"
        if secrets:
            env[item["name"]] = base64.b64decode(secrets[0]["data"][ref["key"]]).decode()
    return env


def service_links(docs: list[dict]) -> dict[str, str]:
    """The variables Kubernetes gives every pod for each Service with a cluster IP in its namespace
    (``enableServiceLinks``, on by default): for the Service named gateway, GATEWAY_PORT and more."""
    env = {}
    for i, service in enumerate(d for d in docs if d["kind"] == "Service" and d["spec"].get("clusterIP") != "None"):
        name, ip = service["metadata"]["name"].upper().replace("-", "_"), f"10.96.0.{10 + i}"
        ports = service["spec"]["ports"]
        env[f"{name}_SERVICE_HOST"] = ip
        env[f"{name}_SERVICE_PORT"] = str(ports[0]["port"])
        env[f"{name}_PORT"] = f"tcp://{ip}:{ports[0]['port']}"
        for port in ports:
            number, proto = port["port"], port.get("protocol", "TCP")
            if "name" in port:
                env[f"{name}_SERVICE_PORT_{port['name'].upper().replace('-', '_')}"] = str(number)
            prefix = f"{name}_PORT_{number}_{proto}"
            env.update({prefix: f"{proto.lower()}://{ip}:{number}", f"{prefix}_PROTO": proto.lower()})
            env.update({f"{prefix}_PORT": str(number), f"{prefix}_ADDR": ip})
    return env


@dataclass
class Stack:
    gateway: Proc
    engines: dict[str, Proc]
    redis_dir: Path
    redis_url: str


@pytest.fixture(scope="module")
def stack(procs: list[Proc], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("stack")
    docs = render("sim")

    redis_args = container(find(docs, "StatefulSet", "redis"))["args"]
    redis_port = free_port()
    options = dict(zip(redis_args[1::2], redis_args[2::2], strict=False))
    options.update({"--dir": str(tmp), "--port": str(redis_port), "--bind": "127.0.0.1"})
    redis_cmd = ["redis-server", *(part for pair in options.items() for part in pair)]
    redis_proc = Proc(redis_cmd, f"redis://127.0.0.1:{redis_port}", tmp / "redis.log").start()
    procs.append(redis_proc)

    engines = {}
    for pool in POOLS:
        port = free_port()
        deployment = find(docs, "Deployment", f"vllm-{pool}")
        spec = container(deployment)
        cmd = [sys.executable if spec["command"][0] == "python" else spec["command"][0], *spec["command"][1:]]
        engine = Proc([*cmd, *on_loopback(spec["args"], port)], f"http://127.0.0.1:{port}", tmp / f"{pool}.log")
        procs.append(engine.start())
        engines[pool] = engine

    deployment = find(docs, "Deployment", "gateway")
    config = tmp / "gateway.yaml"
    config.write_text(named(docs, "ConfigMap", "gateway-config")["data"]["gateway.yaml"])
    port = free_port()
    links = service_links(docs)
    assert "GATEWAY_PORT" in links and "GATEWAY_SERVICE_HOST" in links
    env = {
        **links,
        **pod_env(docs, deployment),
        "GATEWAY__LISTEN__HOST": "127.0.0.1",
        "GATEWAY__LISTEN__PORT": str(port),
        "GATEWAY__STORE": f"redis://127.0.0.1:{redis_port}/0",
        "GATEWAY__POOLS__INTERACTIVE__DISCOVERY": f"dns://127.0.0.1:{engines['interactive'].url.rsplit(':', 1)[1]}",
        "GATEWAY__POOLS__BATCH__DISCOVERY": f"dns://127.0.0.1:{engines['batch'].url.rsplit(':', 1)[1]}",
    }
    args = container(deployment)["args"]
    args = [str(config) if arg == "/etc/gateway/gateway.yaml" else arg for arg in args]
    gateway = Proc(
        [sys.executable, "-m", "priority_gateway", *args], f"http://127.0.0.1:{port}", tmp / "gateway.log", env=env
    )
    procs.append(gateway.start())

    for engine in engines.values():
        engine.wait_ready("/health")
    gateway.wait_ready("/health")
    yield Stack(gateway, engines, tmp, redis_proc.url)


def wait_for(url: str, timeout: float = 30.0) -> httpx.Response:
    deadline = time.monotonic() + timeout
    while True:
        response = httpx.get(url, timeout=2.0)
        if response.status_code == 200 or time.monotonic() > deadline:
            return response
        time.sleep(0.1)


def probe_paths(deployment: dict) -> set[str]:
    spec = container(deployment)
    return {spec[p]["httpGet"]["path"] for p in ("startupProbe", "readinessProbe", "livenessProbe")}


def test_gateway_probes_answer_once_engines_are_found(stack: Stack) -> None:
    deployment = find(render("sim"), "Deployment", "gateway")
    for path in sorted(probe_paths(deployment)):
        assert wait_for(stack.gateway.url + path).status_code == 200, path


@pytest.mark.parametrize("pool", POOLS)
def test_engine_probes_answer(stack: Stack, pool: str) -> None:
    deployment = find(render("sim"), "Deployment", f"vllm-{pool}")
    for path in probe_paths(deployment):
        assert httpx.get(stack.engines[pool].url + path, timeout=2.0).status_code == 200


def exported_names(text: str) -> set[str]:
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}


@pytest.mark.parametrize("pool", POOLS)
def test_engines_export_what_the_dashboard_reads(stack: Stack, pool: str) -> None:
    exported = exported_names(httpx.get(stack.engines[pool].url + "/metrics", timeout=5.0).text)
    wanted = {name for name in metrics_read(dashboard()) if name.startswith("vllm:")}
    families = {name for name in VLLM if any(w == name or w.startswith(name + "_") for w in wanted)}
    assert families
    assert families <= exported, families - exported


def test_gateway_exports_what_the_dashboard_reads(stack: Stack) -> None:
    url = stack.gateway.url
    assert wait_for(url + "/ready").status_code == 200
    model = dict(a.partition("=")[::2] for a in profile("interactive")["simulator"]["args"])["--model"]
    body = {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
    response = httpx.post(url + "/v1/chat/completions", json=body, timeout=30.0)
    assert response.status_code == 200, response.text
    exported = exported_names(httpx.get(url + "/metrics", timeout=5.0).text)
    wanted = {name for name in metrics_read(dashboard()) if name.startswith("gateway_")}
    families = {name for name in GATEWAY if any(w.startswith(name) for w in wanted)}
    assert families <= exported, families - exported


def test_redis_runs_with_the_append_only_file_on(stack: Stack) -> None:
    """The StatefulSet's flags, as Redis itself reports them, and the file they produce."""
    client = redis.Redis.from_url(stack.redis_url)
    try:
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        assert client.config_get("appendfsync") == {"appendfsync": "everysec"}
    finally:
        client.close()
    assert list((stack.redis_dir / "appendonlydir").glob("*.aof"))
