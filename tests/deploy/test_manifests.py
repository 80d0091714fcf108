"""The Kubernetes manifests: both overlays render offline, every object passes the Kubernetes
schemas (strict: unknown fields fail), and the objects fit together — Services select pods,
references resolve, and the engines run exactly the pool profiles."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from kubernetes_validate import utils as kubernetes_schemas

from priority_gateway.config import load_config
from tests.deploy.support import (
    NAMESPACE,
    OVERLAYS,
    POOLS,
    REPO,
    Manifest,
    container,
    find,
    flag_values,
    named,
    of_kind,
    pod_spec,
    profile,
    render,
    run,
    selects,
    tool,
)

# The oldest Kubernetes version EKS still supports here, and the newest schemas we have.
KUBERNETES_VERSIONS = ("1.30", "1.37")
WORKLOADS = ("Deployment", "StatefulSet")
# Secrets created out of band on a real cluster (deploy/eks/kustomization.yaml says how).
EXTERNAL_SECRETS = {"gateway-secrets", "hf-token"}


def workloads(docs: list[Manifest]) -> list[Manifest]:
    return list(of_kind(docs, *WORKLOADS))


def pod_labels(workload: Manifest) -> dict[str, str]:
    return workload["spec"]["template"]["metadata"]["labels"]


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_object_passes_the_kubernetes_schema(overlay: str, version: str) -> None:
    docs = render(overlay)
    assert docs
    for doc in docs:
        kubernetes_schemas.validate(doc, version, strict=True)


def test_strict_validation_rejects_an_unknown_field() -> None:
    deployment = find(render("sim"), "Deployment", "gateway")
    container(deployment)["readinesProbe"] = {"httpGet": {"path": "/ready", "port": "http"}}
    with pytest.raises(kubernetes_schemas.ValidationError):
        kubernetes_schemas.validate(deployment, KUBERNETES_VERSIONS[-1], strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_everything_lives_in_one_namespace(overlay: str) -> None:
    docs = render(overlay)
    find(docs, "Namespace", NAMESPACE)
    for doc in docs:
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == NAMESPACE, doc["metadata"]["name"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_services_select_pods_on_named_ports(overlay: str) -> None:
    docs = render(overlay)
    for service in of_kind(docs, "Service"):
        selected = [w for w in workloads(docs) if selects(service["spec"]["selector"], pod_labels(w))]
        assert selected, f"Service {service['metadata']['name']} selects no pods"
        for port in service["spec"]["ports"]:
            assert port["name"]
            for workload in selected:
                names = {p["name"] for p in container(workload)["ports"]}
                assert port["targetPort"] in names, service["metadata"]["name"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes_use_declared_ports(overlay: str) -> None:
    for workload in workloads(render(overlay)):
        spec = container(workload)
        names = {p["name"] for p in spec["ports"]}
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert probe in spec, f"{workload['metadata']['name']} has no {probe}"
            if "httpGet" in spec[probe]:
                assert spec[probe]["httpGet"]["port"] in names


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_references_resolve(overlay: str) -> None:
    """Every ConfigMap, Secret and claim a pod uses exists in the render, or is an optional or
    documented out-of-band Secret (never in the sim overlay, which must run as is)."""
    docs = render(overlay)
    present = {(d["kind"], d["metadata"]["name"]) for d in docs}
    external = EXTERNAL_SECRETS if overlay.startswith("eks") else set()
    for workload in workloads(docs):
        spec = pod_spec(workload)
        for volume in spec.get("volumes", []):
            if "configMap" in volume:
                assert ("ConfigMap", volume["configMap"]["name"]) in present
            if "persistentVolumeClaim" in volume:
                assert ("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"]) in present
        for env in container(workload).get("env", []):
            ref = env.get("valueFrom", {}).get("secretKeyRef")
            if ref and not ref.get("optional"):
                assert ("Secret", ref["name"]) in present or ref["name"] in external, ref["name"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_disruption_budgets_and_autoscaler_target_real_workloads(overlay: str) -> None:
    docs = render(overlay)
    for pdb in of_kind(docs, "PodDisruptionBudget"):
        selector = pdb["spec"]["selector"]["matchLabels"]
        assert any(selects(selector, pod_labels(w)) for w in workloads(docs)), pdb["metadata"]["name"]
    hpa = find(docs, "HorizontalPodAutoscaler", "gateway")
    target = hpa["spec"]["scaleTargetRef"]
    find(docs, target["kind"], target["name"])
    assert hpa["spec"]["minReplicas"] >= 2


# --- engines -------------------------------------------------------------------------------


def engine(docs: list[Manifest], pool: str) -> Manifest:
    return find(docs, "Deployment", f"vllm-{pool}")


@pytest.mark.parametrize("pool", POOLS)
def test_eks_engines_run_the_pool_profile(pool: str) -> None:
    spec = container(engine(render("eks"), pool))
    data = profile(pool)
    assert spec["image"] == data["image"]
    assert spec["command"] == data["command"]
    assert spec["args"] == data["args"]
    assert {p["name"]: p["containerPort"] for p in spec["ports"]} == {"http": data["port"]}


@pytest.mark.parametrize("pool", POOLS)
def test_eks_engines_get_one_gpu_on_a_gpu_node(pool: str) -> None:
    deployment = engine(render("eks"), pool)
    resources = container(deployment)["resources"]
    assert resources["requests"]["nvidia.com/gpu"] == 1
    assert resources["limits"]["nvidia.com/gpu"] == 1
    spec = pod_spec(deployment)
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]


@pytest.mark.parametrize("pool", POOLS)
def test_eks_engines_share_the_model_cache(pool: str) -> None:
    docs = render("eks")
    deployment = engine(docs, pool)
    volumes = {v["name"]: v for v in pod_spec(deployment)["volumes"]}
    claim = find(docs, "PersistentVolumeClaim", volumes["model-cache"]["persistentVolumeClaim"]["claimName"])
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    mounts = {m["name"]: m["mountPath"] for m in container(deployment)["volumeMounts"]}
    env = {e["name"]: e.get("value") for e in container(deployment)["env"]}
    assert env["HF_HOME"] == mounts["model-cache"]


@pytest.mark.parametrize("pool", POOLS)
def test_engines_survive_long_loads_and_drain(pool: str) -> None:
    deployment = engine(render("eks"), pool)
    spec = container(deployment)
    startup = spec["startupProbe"]
    assert startup["httpGet"]["path"] == "/health"
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 20 * 60, "model loads take minutes"
    assert spec["readinessProbe"]["httpGet"]["path"] == "/health"
    assert spec["livenessProbe"]["httpGet"]["path"] == "/health"
    pre_stop = spec["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    drain_s = int(flag_values(spec["args"])["--shutdown-timeout"])
    assert pod_spec(deployment)["terminationGracePeriodSeconds"] > int(pre_stop[1]) + drain_s


@pytest.mark.parametrize("pool", POOLS)
def test_sim_engines_run_the_simulator_without_gpus(pool: str) -> None:
    docs = render("sim")
    deployment = engine(docs, pool)
    spec = container(deployment)
    sim = profile(pool)["simulator"]
    gateway_image = container(find(docs, "Deployment", "gateway"))["image"]
    assert spec["image"] == gateway_image, "the simulator ships in the project's image"
    assert spec["command"] == sim["command"]
    assert spec["args"] == sim["args"]
    assert "nvidia.com/gpu" not in json.dumps(deployment)
    assert "volumes" not in pod_spec(deployment)


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("pool", POOLS)
def test_headless_service_per_pool(overlay: str, pool: str) -> None:
    docs = render(overlay)
    service = find(docs, "Service", f"vllm-{pool}")
    assert service["spec"]["clusterIP"] == "None"
    assert not service["spec"].get("publishNotReadyAddresses", False)
    selected = [w for w in workloads(docs) if selects(service["spec"]["selector"], pod_labels(w))]
    assert [w["metadata"]["name"] for w in selected] == [f"vllm-{pool}"]


# --- gateway -------------------------------------------------------------------------------


def gateway_config_file(docs: list[Manifest], tmp_path: Path) -> Path:
    config_map = named(docs, "ConfigMap", "gateway-config")
    path = tmp_path / "gateway.yaml"
    path.write_text(config_map["data"]["gateway.yaml"])
    return path


def gateway_env(deployment: Manifest) -> dict[str, str]:
    """The container's environment as the pod would see it (Secrets as placeholders)."""
    env = {}
    for item in container(deployment).get("env", []):
        env[item["name"]] = item.get("value", "from-a-secret")
    return env


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_gateway_config_loads_with_the_pod_environment(overlay: str, tmp_path: Path) -> None:
    docs = render(overlay)
    deployment = find(docs, "Deployment", "gateway")
    args = container(deployment)["args"]
    config_path = args[args.index("--config") + 1]
    mounts = {m["mountPath"]: m["name"] for m in container(deployment)["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec(deployment)["volumes"]}
    mounted = volumes[mounts[str(Path(config_path).parent)]]["configMap"]["name"]
    assert mounted == named(docs, "ConfigMap", "gateway-config")["metadata"]["name"]

    config = load_config(gateway_config_file(docs, tmp_path), env=gateway_env(deployment))
    assert config.store == "redis://redis:6379/0"
    assert (config.listen.host, config.listen.port) == ("0.0.0.0", container(deployment)["ports"][0]["containerPort"])
    assert config.classes.interactive.pool == "interactive"
    assert config.classes.batch.pool == "batch"
    assert config.keys.admin == "from-a-secret"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_gateway_discovers_engines_through_the_headless_services(overlay: str, tmp_path: Path) -> None:
    docs = render(overlay)
    config = load_config(gateway_config_file(docs, tmp_path), env={})
    for pool in POOLS:
        service = find(docs, "Service", f"vllm-{pool}")
        port = service["spec"]["ports"][0]["port"]
        name = service["metadata"]["name"]
        assert config.pools[pool].discovery == f"dns://{name}.{NAMESPACE}.svc.cluster.local:{port}"
        assert config.pools[pool].scheduling_policy == profile(pool)["gateway"]["scheduling_policy"]
        assert config.pools[pool].max_num_seqs == profile(pool)["gateway"]["max_num_seqs"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_gateway_store_is_the_redis_service(overlay: str, tmp_path: Path) -> None:
    docs = render(overlay)
    config = load_config(gateway_config_file(docs, tmp_path), env={})
    host_port = config.store.removeprefix("redis://").split("/")[0]
    host, port = host_port.split(":")
    service = find(docs, "Service", host)
    assert int(port) in [p["port"] for p in service["spec"]["ports"]]
    assert selects(service["spec"]["selector"], pod_labels(find(docs, "StatefulSet", "redis")))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_only_the_gateway_reaches_redis(overlay: str) -> None:
    docs = render(overlay)
    policy = find(docs, "NetworkPolicy", "redis")
    redis = find(docs, "StatefulSet", "redis")
    assert selects(policy["spec"]["podSelector"]["matchLabels"], pod_labels(redis))
    (rule,) = policy["spec"]["ingress"]
    allowed = [
        w for w in workloads(docs) if any(selects(p["podSelector"]["matchLabels"], pod_labels(w)) for p in rule["from"])
    ]
    assert [w["metadata"]["name"] for w in allowed] == ["gateway"]
    ports = {p["name"]: p["containerPort"] for p in container(redis)["ports"]}
    assert [ports.get(p["port"], p["port"]) for p in rule["ports"]] == [6379]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_gateway_deployment(overlay: str) -> None:
    deployment = find(render(overlay), "Deployment", "gateway")
    spec = container(deployment)
    assert deployment["spec"]["replicas"] >= 2
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert spec["args"][0] == "serve"
    assert spec["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert spec["livenessProbe"]["httpGet"]["path"] == "/health"
    assert spec["resources"]["requests"]["cpu"]
    assert spec["resources"]["limits"]["memory"]
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(spec["ports"][0]["containerPort"])
    assert pod_spec(deployment)["securityContext"]["runAsNonRoot"] is True
    assert "GATEWAY__KEYS__ADMIN" in {e["name"] for e in spec["env"]}


def admin_key_ref(overlay: str) -> dict:
    env = container(find(render(overlay), "Deployment", "gateway"))["env"]
    return next(e["valueFrom"]["secretKeyRef"] for e in env if e["name"] == "GATEWAY__KEYS__ADMIN")


def test_sim_runs_as_is_with_the_admin_api_off_until_its_secret_exists() -> None:
    """No admin key is committed: the sim overlay's reference to it is optional, eks's is not."""
    assert not list(of_kind(render("sim"), "Secret"))
    assert admin_key_ref("sim") == {"name": "gateway-secrets", "key": "admin-key", "optional": True}
    assert not admin_key_ref("eks").get("optional")


def test_eks_commits_no_secret() -> None:
    assert not list(of_kind(render("eks"), "Secret"))


# --- redis ---------------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_redis_keeps_an_append_only_file_on_a_volume(overlay: str) -> None:
    redis = find(render(overlay), "StatefulSet", "redis")
    args = container(redis)["args"]
    options = dict(zip(args[1::2], args[2::2], strict=False))
    assert args[0] == "redis-server"
    assert options["--appendonly"] == "yes"
    assert options["--appendfsync"] == "everysec"
    claim = redis["spec"]["volumeClaimTemplates"][0]["metadata"]["name"]
    mounts = {m["name"]: m["mountPath"] for m in container(redis)["volumeMounts"]}
    assert mounts[claim] == options["--dir"]


def test_eks_storage_classes() -> None:
    docs = render("eks")
    redis = find(docs, "StatefulSet", "redis")
    assert redis["spec"]["volumeClaimTemplates"][0]["spec"]["storageClassName"] == "gp3"
    assert find(docs, "PersistentVolumeClaim", "model-cache")["spec"]["storageClassName"] == "efs-sc"


# --- image ---------------------------------------------------------------------------------


def test_pods_run_as_the_image_user() -> None:
    """The gateway image's USER is the uid the manifests run the project's containers as."""
    dockerfile = (Path(__file__).resolve().parents[2] / "Dockerfile").read_text()
    user = [line.split()[1] for line in dockerfile.splitlines() if line.startswith("USER ")][-1]
    uid = int(user.split(":")[0])
    docs = render("sim")
    assert pod_spec(find(docs, "Deployment", "gateway"))["securityContext"]["runAsUser"] == uid
    for pool in POOLS:
        assert container(engine(docs, pool))["securityContext"]["runAsUser"] == uid


def test_the_deploy_readme_pushes_the_image_and_sets_it_before_it_applies_the_stack() -> None:
    text = (REPO / "deploy" / "README.md").read_text()
    push = text.index("docker push ghcr.io/OWNER/priority-gateway:0.1.0")
    set_image = text.index("kustomize edit set image priority-gateway=ghcr.io/OWNER/priority-gateway:0.1.0")
    apply = text.index("kubectl apply -k deploy/eks")
    assert push < set_image < apply


def test_setting_the_image_as_the_deploy_readme_says_points_the_gateway_at_it(tmp_path: Path) -> None:
    copy = tmp_path / "deploy"
    shutil.copytree(REPO / "deploy", copy)
    overlay = copy / "eks" / "kustomization.yaml"
    kustomization = yaml.safe_load(overlay.read_text())
    # What `kustomize edit set image priority-gateway=ghcr.io/OWNER/priority-gateway:0.1.0` writes.
    kustomization["images"] = [
        {"name": "priority-gateway", "newName": "ghcr.io/OWNER/priority-gateway", "newTag": "0.1.0"}
    ]
    overlay.write_text(yaml.safe_dump(kustomization))
    docs = [d for d in yaml.safe_load_all(run([tool("kubectl"), "kustomize", str(copy / "eks")])) if d]
    (gateway,) = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "gateway"]
    images = {c["image"] for c in gateway["spec"]["template"]["spec"]["containers"]}
    assert images == {"ghcr.io/OWNER/priority-gateway:0.1.0"}
