import json

import orjson
import pytest

from priority_gateway.engines.sim.models import (
    LoraModule,
    ServedModels,
    parse_lora_module,
    read_adapter_rank,
    runtime_lora_updating,
)
from priority_gateway.engines.sim.protocol import ApiError
from tests.support.lora import make_adapter


def test_lora_modules_are_parsed_in_both_of_vllm_s_forms():
    assert parse_lora_module("sql=/a/sql") == LoraModule("sql", "/a/sql")
    entry = json.dumps({"name": "chat", "path": "/a/chat", "base_model_name": "base"})
    assert parse_lora_module(entry) == LoraModule("chat", "/a/chat", "base")
    with pytest.raises(ValueError, match="Invalid --lora-modules"):
        parse_lora_module("{not json")


def test_the_environment_gate_reads_as_vllm_s():
    assert runtime_lora_updating({"VLLM_ALLOW_RUNTIME_LORA_UPDATING": " True "})
    assert runtime_lora_updating({"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"})
    assert not runtime_lora_updating({"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "yes"})
    assert not runtime_lora_updating({})


def test_ids_count_registrations_and_unknown_models_under_runtime_updating(tmp_path):
    path = str(make_adapter(tmp_path / "a"))
    models = ServedModels(["base"], "/m", 1024, runtime_updating=True)
    first = models.prepare("a", path)
    models.register(first)
    with pytest.raises(ApiError):
        models.resolve("unknown")  # vLLM's resolver lookup takes an id
    second = models.prepare("b", path)
    assert (first.int_id, second.int_id) == (1, 3)
    assert models.prepare("a", path).int_id == 1  # a reload in place keeps its id
    assert models.resolve("a") == first and models.resolve("base") is None and models.resolve(None) is None


def test_adapter_rank_comes_from_its_config(tmp_path):
    assert read_adapter_rank(str(make_adapter(tmp_path / "r8", rank=8))) == 8
    patterned = make_adapter(tmp_path / "p")
    config = orjson.loads((patterned / "adapter_config.json").read_bytes())
    (patterned / "adapter_config.json").write_bytes(orjson.dumps({**config, "rank_pattern": {"q_proj": 32}}))
    assert read_adapter_rank(str(patterned)) == 32
    (patterned / "adapter_config.json").write_bytes(orjson.dumps({**config, "bias": "all"}))
    with pytest.raises(ValueError, match="bias is not supported"):
        read_adapter_rank(str(patterned))
    with pytest.raises(FileNotFoundError):
        read_adapter_rank(str(tmp_path / "missing"))


def test_error_messages_hide_local_paths_as_vllm_does():
    models = ServedModels(["base"], "/m", 1024)
    with pytest.raises(ApiError) as caught:
        models.prepare("x", "/tmp/secret/adapter")
    assert (caught.value.status, caught.value.message) == (404, "Loading lora x failed: No adapter found for <path>")
