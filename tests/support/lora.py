"""LoRA adapter directories for tests: what ``--lora-modules`` and ``/v1/load_lora_adapter`` read."""

from __future__ import annotations

import json
from pathlib import Path


def make_adapter(path: Path, rank: int = 8) -> Path:
    """A PEFT adapter directory with only its ``adapter_config.json`` (the simulator reads no weights)."""
    path.mkdir(parents=True, exist_ok=True)
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": ["q_proj", "v_proj"]}
    (path / "adapter_config.json").write_text(json.dumps(config))
    return path
