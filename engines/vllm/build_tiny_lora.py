"""Build tiny LoRA adapters for the tiny model with ``peft``, for real vLLM's LoRA tests.

Each adapter is a rank-``r`` LoRA on the attention projections of the tiny Llama
(``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``), random and seeded by its index so
adapters differ from each other, saved with ``PeftModel.save_pretrained`` as
``adapter_config.json`` + ``adapter_model.safetensors``: what ``vllm serve
--lora-modules name=path`` loads. Its weights are random; it exists to exercise
the serving stack, not to change the text.

Run it with the vLLM venv's interpreter and ``peft`` on the path (``setup.sh``
installs ``peft`` into ``.cache/peft`` so the locked venv stays as locked):

    PYTHONPATH=.cache/peft .venv-vllm/bin/python engines/vllm/build_tiny_lora.py \\
        --model .cache/tiny-model --out .cache/tiny-lora --count 3
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

TARGET_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj"]


def build(model_dir: Path, out: Path, count: int, rank: int) -> list[Path]:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    paths = []
    for index in range(count):
        torch.manual_seed(1000 + index)
        base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
        config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=TARGET_MODULES, init_lora_weights=False)
        model = get_peft_model(base, config)
        path = out / f"lora{index}"
        model.save_pretrained(path)
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--count", type=int, default=3)
    parser.add_argument("--rank", type=int, default=8)
    args = parser.parse_args(argv)
    started = time.monotonic()
    paths = build(args.model, args.out, args.count, args.rank)
    seconds = time.monotonic() - started
    print(f"event=tiny_lora_built out={args.out} adapters={len(paths)} seconds={seconds:.1f}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
