"""deploy/eks-precise: the eks stack in precise prefix mode. The engines publish KV events where the
gateway listens for them, the gateway's config (with the pod's environment) turns precise mode on for
both pools, and the tokenizer comes from the engines' own model cache: the init container's script is
run here against a Hugging Face cache laid out as the engines leave it, and the gateway's tokenizer
loads what it copied."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from tokenizers import Tokenizer, models, pre_tokenizers

from priority_gateway.config import load_config
from priority_gateway.tokenizers import HFTokenizer
from tests.deploy.support import POOLS, REPO, container, find, pod_spec, profile, render
from tests.deploy.test_manifests import gateway_config_file, gateway_env

OVERLAY = "eks-precise"
KV_EVENTS_FLAG = "--kv-events-config"


def gateway() -> dict:
    return find(render(OVERLAY), "Deployment", "gateway")


def init_container() -> dict:
    (init,) = pod_spec(gateway())["initContainers"]
    return init


def mounts(spec: dict) -> dict[str, dict]:
    return {m["name"]: m for m in spec["volumeMounts"]}


@pytest.mark.parametrize("pool", POOLS)
def test_engines_run_the_profile_and_publish_kv_events_on_a_declared_port(pool: str) -> None:
    spec = container(find(render(OVERLAY), "Deployment", f"vllm-{pool}"))
    extra = [arg for arg in spec["args"] if arg.startswith(KV_EVENTS_FLAG)]
    assert [arg for arg in spec["args"] if arg not in extra] == profile(pool)["args"]
    (flag,) = extra
    events = json.loads(flag.partition("=")[2])
    assert events["enable_kv_cache_events"] is True and events["publisher"] == "zmq"
    port = int(events["endpoint"].rsplit(":", 1)[1])
    replay = int(events["replay_endpoint"].rsplit(":", 1)[1])
    ports = {p["name"]: p["containerPort"] for p in spec["ports"]}
    assert (ports["kv-events"], ports["kv-replay"]) == (port, replay)


def test_gateway_config_turns_on_precise_mode_where_the_engines_publish(tmp_path: Path) -> None:
    docs = render(OVERLAY)
    deployment = find(docs, "Deployment", "gateway")
    config = load_config(gateway_config_file(docs, tmp_path), env=gateway_env(deployment))
    tokenizer_mount = mounts(container(deployment))["tokenizer"]
    assert tokenizer_mount["readOnly"] is True
    for pool in POOLS:
        engine = container(find(docs, "Deployment", f"vllm-{pool}"))
        ports = {p["name"]: p["containerPort"] for p in engine["ports"]}
        assert config.pools[pool].kv_events == f"engine-port:{ports['kv-events']}"
        assert config.pools[pool].kv_events_replay_port == ports["kv-replay"]
        assert config.pools[pool].tokenizer == tokenizer_mount["mountPath"]


def test_the_tokenizer_is_copied_from_the_engines_model_cache() -> None:
    docs = render(OVERLAY)
    init = init_container()
    env = {e["name"]: e["value"] for e in init["env"]}
    volumes = {v["name"]: v for v in pod_spec(gateway())["volumes"]}
    for pool in POOLS:
        engine = find(docs, "Deployment", f"vllm-{pool}")
        engine_env = {e["name"]: e.get("value") for e in container(engine)["env"]}
        engine_volumes = {v["name"]: v for v in pod_spec(engine)["volumes"]}
        # The same model, in the same claim, at the same HF_HOME as the engines.
        assert container(engine)["args"][0] == env["MODEL"]
        assert engine_env["HF_HOME"] == env["HF_HOME"] == mounts(init)["model-cache"]["mountPath"]
        claim = engine_volumes["model-cache"]["persistentVolumeClaim"]["claimName"]
        assert volumes["model-cache"]["persistentVolumeClaim"] == {"claimName": claim, "readOnly": True}
    assert mounts(init)["model-cache"]["readOnly"] is True
    # What the init container writes is what the gateway reads, and nothing else is shared.
    assert mounts(init)["tokenizer"]["mountPath"] == env["TOKENIZER_DIR"]
    assert "emptyDir" in volumes["tokenizer"]
    assert "model-cache" not in mounts(container(gateway()))
    assert init["image"] == container(gateway())["image"]


def test_the_gateway_image_is_the_variant_with_tokenizers() -> None:
    workflow = yaml.safe_load((REPO / ".github/workflows/image.yml").read_text())
    variants = {v["extras"]: v["suffix"] for job in workflow["jobs"].values() for v in _matrix(job)}
    assert container(gateway())["image"].endswith(variants["[precise]"])
    assert "tokenizers" in (REPO / "pyproject.toml").read_text().split("precise = ", 1)[1].split("\n", 1)[0]


def _matrix(job: dict) -> list[dict]:
    include = job.get("strategy", {}).get("matrix", {}).get("include", [])
    return [v for v in include if "extras" in v]


# -- the init container's script, run -------------------------------------------------------------


def hf_cache(home: Path, model: str, revisions: dict[str, str]) -> Path:
    """A Hugging Face cache as ``vllm serve`` leaves it: blobs, snapshots of symbolic links to them,
    and refs/main naming the snapshot in use. ``revisions``: revision -> a word only its tokenizer has."""
    repo = home / "hub" / f"models--{model.replace('/', '--')}"
    (repo / "blobs").mkdir(parents=True)
    for revision, word in revisions.items():
        snapshot = repo / "snapshots" / revision
        snapshot.mkdir(parents=True)
        vocab = {"[UNK]": 0, "<start>": 1, "<end>": 2, "user": 3, "hello": 4, "there": 5, word: 6}
        tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
        tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        files = {
            "tokenizer.json": tokenizer.to_str(),
            "tokenizer_config.json": json.dumps(
                {"chat_template": "{% for m in messages %}<start> {{ m.role }} {{ m.content }} <end> {% endfor %}"}
            ),
            "config.json": "{}",
        }
        for name, text in files.items():
            blob = repo / "blobs" / f"{revision}-{name}"
            blob.write_text(text)
            (snapshot / name).symlink_to(Path("../../blobs") / blob.name)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(list(revisions)[-1])
    return repo


def run_init(home: Path, target: Path, wait_s: int = 0) -> subprocess.CompletedProcess[str]:
    init = init_container()
    assert init["command"] == ["sh", "-c"]
    env = {e["name"]: e["value"] for e in init["env"]}
    env.update(HF_HOME=str(home), TOKENIZER_DIR=str(target), WAIT_S=str(wait_s))
    return subprocess.run(
        ["sh", "-c", init["args"][0]], env={**os.environ, **env}, capture_output=True, text=True, timeout=60
    )


def test_the_init_script_copies_the_snapshot_in_use_and_the_gateway_tokenizes_with_it(tmp_path: Path) -> None:
    model = {e["name"]: e["value"] for e in init_container()["env"]}["MODEL"]
    repo = hf_cache(tmp_path / "models", model, {"old": "stale", "new": "fresh"})
    target = tmp_path / "tokenizer"
    target.mkdir()
    done = run_init(tmp_path / "models", target)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in target.iterdir()) == ["tokenizer.json", "tokenizer_config.json"]
    assert not any(p.is_symlink() for p in target.iterdir())
    copied = HFTokenizer(target)
    original = HFTokenizer(repo / "snapshots" / "new")
    messages = [{"role": "user", "content": "hello there fresh stale"}]
    assert copied.chat(messages) == original.chat(messages) == [1, 3, 4, 5, 6, 0, 2]


def test_the_init_script_fails_clearly_while_no_engine_has_downloaded_the_model(tmp_path: Path) -> None:
    target = tmp_path / "tokenizer"
    target.mkdir()
    done = run_init(tmp_path / "models", target, wait_s=0)
    assert done.returncode == 1
    assert "has an engine downloaded the model?" in done.stderr
    assert not list(target.iterdir())
