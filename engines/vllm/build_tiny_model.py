"""Build the tiny random-weight Llama that real vLLM serves on CPU-only machines.

The model is meant for exercising the serving stack (HTTP API, scheduling, prefix
cache, metrics, KV events), not for producing text: its weights are random.

- Model: ``LlamaForCausalLM`` with 4 layers, hidden size 256, vocab 4096, tied
  embeddings, bf16, seeded with ``torch.manual_seed(0)`` (about 4.2 M parameters).
- Tokenizer: byte-level BPE (``tokenizers``) trained on this interpreter's standard
  library ``*.py`` files, read in sorted order; specials ``<|endoftext|>`` = 0
  (bos/pad), ``<|im_start|>`` = 1, ``<|im_end|>`` = 2 (eos).
- Chat template: ChatML, written both to ``chat_template.jinja`` and into
  ``tokenizer_config.json``.

The output is byte-identical across runs on the same Python version (the stdlib
sources are the training corpus). Run it with the vLLM venv's interpreter:

    .venv-vllm/bin/python engines/vllm/build_tiny_model.py --out .cache/tiny-model
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import sysconfig
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tokenizers import Tokenizer

VOCAB_SIZE = 4096
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def log(event: str, **fields: object) -> None:
    parts = " ".join(f"{key}={value}" for key, value in fields.items())
    print(f"event={event} {parts}".rstrip(), file=sys.stderr, flush=True)


def corpus_files() -> list[Path]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return sorted(stdlib.glob("*.py"))


def train_tokenizer(files: list[Path]) -> Tokenizer:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train([str(path) for path in files], trainer)
    return tokenizer


def save_tokenizer(tokenizer: Tokenizer, out: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        eos_token="<|im_end|>",
        additional_special_tokens=["<|im_start|>"],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = 4096
    fast.save_pretrained(str(out))
    # vLLM and older transformers read the template from tokenizer_config.json.
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = CHAT_TEMPLATE
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def save_model(out: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=0,
        pad_token_id=0,
        eos_token_id=2,
        torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(str(out), safe_serialization=True)
    log("model_saved", parameters=sum(p.numel() for p in model.parameters()))


def digest(out: Path) -> str:
    sha = hashlib.sha256()
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        sha.update(path.relative_to(out).as_posix().encode())
        sha.update(path.read_bytes())
    return sha.hexdigest()


def build(out: Path) -> str:
    started = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    files = corpus_files()
    log("tokenizer_training", files=len(files))
    tokenizer = train_tokenizer(files)
    save_tokenizer(tokenizer, out)
    save_model(out)
    sha = digest(out)
    log("built", out=out, sha256=sha, seconds=round(time.monotonic() - started, 1))
    return sha


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(".cache/tiny-model"))
    args = parser.parse_args()
    print(build(args.out))


if __name__ == "__main__":
    main()
