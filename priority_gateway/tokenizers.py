"""Turning a request's prompt into the token ids the engine will see (precise prefix mode only).

The approximate prefix mode hashes text and needs no tokenizer. Precise mode matches the
engines' own KV cache blocks, which are made of token ids, so the gateway must tokenize the
prompt as the engine does: the model's tokenizer and chat template (``tokenizer: <model dir>``,
with ``tokenizer.json`` and ``tokenizer_config.json`` as Hugging Face writes them), or the
simulator's own scheme (``tokenizer: sim``, lent by ``priority_gateway.embedded``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from priority_gateway.core.prefix import response_messages, token_prompt


class PromptTokenizer(Protocol):
    def chat(self, messages: Sequence[Mapping[str, Any]]) -> list[int]: ...

    def text(self, prompt: str) -> list[int]: ...


class HFTokenizer:
    """A Hugging Face fast tokenizer with the model's chat template, as vLLM applies them."""

    def __init__(self, directory: str | Path) -> None:
        try:
            import jinja2
            from tokenizers import Tokenizer
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise RuntimeError("precise prefix mode with a model tokenizer needs `tokenizers` and `jinja2`") from exc
        root = Path(directory)
        self._tokenizer = Tokenizer.from_file(str(root / "tokenizer.json"))
        config = json.loads((root / "tokenizer_config.json").read_text())
        template = config.get("chat_template")
        template_file = root / "chat_template.jinja"
        if not template and template_file.is_file():
            template = template_file.read_text()
        if not template:
            raise RuntimeError(f"{root}: no chat template in tokenizer_config.json or chat_template.jinja")
        env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, autoescape=False)
        self._template = env.from_string(template)
        self._specials = {k: config.get(k) for k in ("bos_token", "eos_token", "pad_token", "unk_token")}

    def chat(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        rendered = self._template.render(messages=list(messages), add_generation_prompt=True, **self._specials)
        # The template already wrote the special tokens: vLLM tokenizes it without adding more.
        return list(self._tokenizer.encode(rendered, add_special_tokens=False).ids)

    def text(self, prompt: str) -> list[int]:
        return list(self._tokenizer.encode(prompt, add_special_tokens=True).ids)


def load_tokenizer(spec: str) -> PromptTokenizer:
    if spec == "sim":
        from priority_gateway.embedded import SimTokenizer

        return SimTokenizer()
    return HFTokenizer(spec)


def prompt_token_ids(tokenizer: PromptTokenizer, body: Mapping[str, Any]) -> list[int]:
    """The prompt's token ids: as given (``TokenPromptError`` if they are not valid ids), else tokenized."""
    messages = body.get("messages")
    if messages is not None:
        return tokenizer.chat(messages)
    if "input" in body and "prompt" not in body:
        return tokenizer.chat(response_messages(body.get("instructions"), body["input"]))
    ids = token_prompt(body)
    if ids is not None:
        return ids
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        prompt = prompt[0] if prompt else ""
    return tokenizer.text(str(prompt or ""))
