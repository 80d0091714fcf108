"""Scrape configuration: the prometheus-operator objects (custom resources, checked against
the operator's models since the Kubernetes schemas do not cover them) find the gateway and
every engine, and both they and compose's prometheus.yml give engine series their pool."""

from __future__ import annotations

import functools
import inspect
from typing import Any

import pydantic
import pytest
import yaml
from cloudcoil.models.prometheus_operator import v1 as prometheus_operator
from kubernetes_validate import utils as kubernetes_schemas

from tests.deploy.support import DEPLOY, OVERLAYS, Manifest, container, find, of_kind, render, selects

CUSTOM_KINDS = {"ServiceMonitor": prometheus_operator.ServiceMonitor, "PodMonitor": prometheus_operator.PodMonitor}


@functools.cache
def strict_operator_models() -> None:
    """The operator's generated models accept unknown fields; reject them, as the CRD does."""
    models = [m for _, m in inspect.getmembers(prometheus_operator, inspect.isclass)]
    models = [m for m in models if issubclass(m, pydantic.BaseModel)]
    for model in models:
        model.model_config["extra"] = "forbid"
    for _ in range(2):  # inner models first, then the ones embedding them
        for model in models:
            model.model_rebuild(force=True)


def validate_custom(doc: Manifest) -> Any:
    strict_operator_models()
    # The Kubernetes schemas know ObjectMeta: check the custom resource's metadata as a ConfigMap's.
    kubernetes_schemas.validate(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": doc["metadata"]}, "1.37", strict=True
    )
    return CUSTOM_KINDS[doc["kind"]].model_validate(doc)


def monitoring() -> list[Manifest]:
    return render("monitoring")


def test_monitoring_objects_are_valid() -> None:
    docs = monitoring()
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == ["ConfigMap", "PodMonitor", "ServiceMonitor"]
    for doc in docs:
        if doc["kind"] in CUSTOM_KINDS:
            validate_custom(doc)
        else:
            kubernetes_schemas.validate(doc, "1.37", strict=True)


def test_custom_resource_validation_rejects_an_unknown_field() -> None:
    monitor = find(monitoring(), "PodMonitor", "vllm")
    monitor["spec"]["podMetricsEndpoints"][0]["scrapeInterval"] = "15s"
    with pytest.raises(pydantic.ValidationError):
        validate_custom(monitor)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_service_monitor_finds_the_gateway_service(overlay: str) -> None:
    monitor = find(monitoring(), "ServiceMonitor", "gateway")
    services = [
        s
        for s in of_kind(render(overlay), "Service")
        if selects(monitor["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])
    ]
    assert [s["metadata"]["name"] for s in services] == ["gateway"]
    ports = {p["name"] for p in services[0]["spec"]["ports"]}
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= ports
    assert monitor["metadata"]["namespace"] == services[0]["metadata"]["namespace"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pod_monitor_finds_every_engine_and_labels_its_pool(overlay: str) -> None:
    monitor = find(monitoring(), "PodMonitor", "vllm")
    selector = monitor["spec"]["selector"]["matchLabels"]
    engines = [
        d
        for d in of_kind(render(overlay), "Deployment")
        if selects(selector, d["spec"]["template"]["metadata"]["labels"])
    ]
    assert sorted(d["metadata"]["name"] for d in engines) == ["vllm-batch", "vllm-interactive"]
    endpoint = monitor["spec"]["podMetricsEndpoints"][0]
    for deployment in engines:
        assert endpoint["port"] in {p["name"] for p in container(deployment)["ports"]}
        pool_label = deployment["spec"]["template"]["metadata"]["labels"]["llm.pool"]
        assert pool_label == deployment["metadata"]["name"].removeprefix("vllm-")
    relabel = {r["targetLabel"]: r["sourceLabels"] for r in endpoint["relabelings"]}
    assert relabel["pool"] == ["__meta_kubernetes_pod_label_llm_pool"]


def test_compose_prometheus_scrapes_the_gateway_and_both_pools() -> None:
    config = yaml.safe_load((DEPLOY / "compose" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert jobs["gateway"]["static_configs"][0]["targets"] == ["gateway:8080"]
    for pool in ("interactive", "batch"):
        job = jobs[f"vllm-{pool}"]
        assert job["dns_sd_configs"][0]["names"] == [f"vllm-{pool}"]
        assert job["dns_sd_configs"][0]["port"] == 8000
        assert {"target_label": "pool", "replacement": pool} in job["relabel_configs"]
