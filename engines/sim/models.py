"""The models one engine serves: its base model's names and its LoRA adapters, as vLLM's API server has them.

Rules (after ``vllm/entrypoints/openai/models/serving.py`` and ``serve/engine/serving.py``, 0.32):
- The base model is served under every name of ``--served-model-name`` (default: ``--model``); each is
  a model card with ``root`` the model path and ``parent`` null. A request naming any of them (or no
  model) is served by the base model, and replies name the first one.
- Adapters are listed after the base names, in the order they were registered, with ``root`` their
  path and ``parent`` their ``base_model_name`` (when it is a served name) or the first served name.
  A request naming an adapter is served with it, and replies name the adapter.
- Any other model is a 404 ``NotFoundError`` "The model `x` does not exist. Valid aliases: a, b.".
- Adapter ids count up from 1 for every registration of a new name; with runtime updating on, each
  request for an unknown model takes an id too (vLLM asks its LoRA resolvers with a fresh id).
- Loading checks the request (both names given, no clash with a base name, not loaded unless
  ``load_inplace``), then reads the adapter directory: it must hold a PEFT ``adapter_config.json``
  (the simulator has no hub to download from); its rank is ``r`` (or the largest of ``rank_pattern``).
  Unloading forgets the name only. Messages, types and statuses are vLLM's; paths in messages are
  sanitised as vLLM's ``sanitize_message`` does.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from priority_gateway.engines.sim.lora import LoraAdapter
from priority_gateway.engines.sim.protocol import ApiError

RUNTIME_LORA_UPDATING_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
MAX_ADAPTER_CONFIG_BYTES = 1 << 20


def runtime_lora_updating(environ: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    """vLLM's parse of ``VLLM_ALLOW_RUNTIME_LORA_UPDATING``: ``1`` or ``true``, any case."""
    return environ.get(RUNTIME_LORA_UPDATING_ENV, "0").strip().lower() in ("1", "true")


@dataclass(slots=True, frozen=True)
class LoraModule:
    """One ``--lora-modules`` entry: ``name=path`` or ``{"name", "path", "base_model_name"}``."""

    name: str
    path: str
    base_model_name: str | None = None


def parse_lora_module(text: str) -> LoraModule:
    if "=" in text and "," not in text:  # vLLM's test for the name=path form
        name, path = text.split("=", 1)
        if name and path:
            return LoraModule(name, path)
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            data = None
        if isinstance(data, dict) and isinstance(data.get("name"), str) and isinstance(data.get("path"), str):
            base = data.get("base_model_name")
            return LoraModule(data["name"], data["path"], base if isinstance(base, str) else None)
    raise ValueError(f"Invalid --lora-modules entry {text!r}: use name=path or a JSON object with name and path")


def sanitize_message(message: str) -> str:
    """vLLM's ``sanitize_message``: no memory addresses or local file paths in error messages."""
    message = re.sub(r" at 0x[0-9a-fA-F]+>", ">", message)
    message = re.sub(r"/(?:home|usr|opt|var|tmp|root|lib|mnt|srv)(?:/[\w.\-]+)+", "<path>", message)
    message = re.sub(r"(?:/[\w\-]+)+/[\w\-]+\.\w+", "<path>", message)
    return message.strip()


def read_adapter_rank(path: str) -> int:
    """The rank of the PEFT adapter in directory ``path``; ``FileNotFoundError`` when there is none."""
    config_path = Path(path).expanduser() / "adapter_config.json"
    with config_path.open("rb") as f:
        raw = f.read(MAX_ADAPTER_CONFIG_BYTES + 1)
    if len(raw) > MAX_ADAPTER_CONFIG_BYTES:
        raise ValueError(f"adapter_config.json is larger than {MAX_ADAPTER_CONFIG_BYTES} bytes")
    try:
        config = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"adapter_config.json is not JSON: {exc}") from None
    if not isinstance(config, dict):
        raise ValueError("adapter_config.json is not a JSON object")
    if config.get("bias", "none") != "none":
        raise ValueError("Adapter bias is not supported.")
    ranks = [config.get("r", 8), *(config.get("rank_pattern") or {}).values()]
    if not all(isinstance(r, int) and r > 0 for r in ranks):
        raise ValueError(f"adapter_config.json has an invalid rank: {ranks}")
    return int(max(ranks))


class ServedModels:
    def __init__(
        self,
        served_names: list[str],
        root: str,
        max_model_len: int,
        *,
        runtime_updating: bool = False,
    ) -> None:
        if not served_names:
            raise ValueError("at least one served model name is needed")
        self.served_names = list(served_names)
        self.root = root
        self.max_model_len = max_model_len
        self.runtime_updating = runtime_updating
        self.adapters: dict[str, LoraAdapter] = {}
        self._last_id = 0

    @property
    def name(self) -> str:
        """The name replies give for the base model."""
        return self.served_names[0]

    def is_base(self, model: str) -> bool:
        return model in self.served_names

    def resolve(self, model: Any) -> LoraAdapter | None:
        """The adapter a request's ``model`` names, ``None`` for the base model; 404 for anything else."""
        if not model or (isinstance(model, str) and self.is_base(model)):
            return None
        if isinstance(model, str) and model in self.adapters:
            return self.adapters[model]
        if self.runtime_updating:
            self._last_id += 1
        raise ApiError(
            404, f"The model `{model}` does not exist. Valid aliases: {', '.join(self.served_names)}.", "model"
        )

    def reply_name(self, adapter: LoraAdapter | None) -> str:
        return adapter.name if adapter is not None else self.name

    def cards(self, created: int) -> bytes:
        data = [self._card(name, created, self.root, None, self.max_model_len) for name in self.served_names]
        for adapter in self.adapters.values():
            base = adapter.base_model_name
            parent = base if base is not None and self.is_base(base) else self.name
            data.append(self._card(adapter.name, created, adapter.path, parent, None))
        return orjson.dumps({"object": "list", "data": data})

    @staticmethod
    def _card(name: str, created: int, root: str, parent: str | None, max_model_len: int | None) -> dict[str, Any]:
        return {
            "id": name,
            "object": "model",
            "created": created,
            "owned_by": "vllm",
            "root": root,
            "parent": parent,
            "max_model_len": max_model_len,
            "permission": [
                {
                    "id": "modelperm-" + os.urandom(8).hex(),
                    "object": "model_permission",
                    "created": created,
                    "allow_create_engine": False,
                    "allow_sampling": True,
                    "allow_logprobs": True,
                    "allow_search_indices": False,
                    "allow_view": True,
                    "allow_fine_tuning": False,
                    "organization": "*",
                    "group": None,
                    "is_blocking": False,
                }
            ],
        }

    # -- loading and unloading -------------------------------------------------------------

    def check_load(self, name: str, path: str, load_inplace: bool = False) -> None:
        if not name or not path:
            raise ApiError(400, "Both 'lora_name' and 'lora_path' must be provided.", kind="InvalidUserInput")
        if self.is_base(name):
            raise ApiError(
                400, f"The lora adapter '{name}' conflicts with a served base model.", kind="InvalidUserInput"
            )
        if not load_inplace and name in self.adapters:
            raise ApiError(
                400,
                f"The lora adapter '{name}' has already been loaded. If you want to load the adapter in place, "
                "set 'load_inplace' to True.",
                kind="InvalidUserInput",
            )

    def prepare(self, name: str, path: str, base_model_name: str | None = None) -> LoraAdapter:
        """The adapter a load would register (its id taken), after reading its rank from disk."""
        try:
            rank = read_adapter_rank(path)
        except (FileNotFoundError, NotADirectoryError):
            raise ApiError(404, sanitize_message(f"Loading lora {name} failed: No adapter found for {path}")) from None
        except (OSError, ValueError) as exc:
            message = sanitize_message(f"Call to add_lora method failed: {exc}")
            raise ApiError(500, message, kind="InternalServerError") from None
        previous = self.adapters.get(name)
        if previous is not None:
            int_id = previous.int_id
        else:
            self._last_id += 1
            int_id = self._last_id
        base = base_model_name if base_model_name is not None and self.is_base(base_model_name) else None
        return LoraAdapter(name, int_id, path, rank, base)

    def register(self, adapter: LoraAdapter) -> str:
        self.adapters[adapter.name] = adapter
        return f"Success: LoRA adapter '{adapter.name}' added successfully."

    def unload(self, name: str) -> str:
        if not name:
            raise ApiError(400, "'lora_name' needs to be provided to unload a LoRA adapter.", kind="InvalidUserInput")
        if name not in self.adapters:
            raise ApiError(404, f"The lora adapter '{name}' cannot be found.")
        del self.adapters[name]
        return f"Success: LoRA adapter '{name}' removed successfully."
