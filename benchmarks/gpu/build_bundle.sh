#!/bin/bash
# The trimmed vLLM 0.26.0 bundle for the offline GPU device (cp312, manylinux x86_64), from PyPI.
#
#   W=.gpu-build bash benchmarks/gpu/build_bundle.sh      # about 5-10 minutes, ~900 MB of downloads
#
# vLLM 0.20-0.26 pin torch 2.11.0, which the device has (built for CUDA 13, as vLLM's wheels are);
# 0.26.0 is the last of them. The bundle holds vLLM and the packages of vllm-0.26-closure.txt (what
# vLLM needs and the device lacks), newer protobuf / typing_extensions / anyio to put in front only
# where the device's are too old, and the tokenizer of the served model; FA2 (Ampere), the fused-MoE
# kernels (dense models only), the Rust frontend, DeepGEMM and the SM100 FMHA headers are removed.
# Output: $W/site.tar.xz (xz -9e, ~98 MB); prepare.sh splits it for the calls.
# Tokenizer: TOK_DIR (tokenizer.json, tokenizer_config.json, chat_template.jinja); without it, one is
# made from the Llama-style 32k SentencePiece model that mistral_common ships (tokenizer.model.v1),
# which needs transformers, sentencepiece and protobuf here.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
W=${W:-$PWD/.gpu-build}
PIP="${PIP:-python3 -m pip}"
export PIP_CONFIG_FILE=/dev/null; unset PIP_FIND_LINKS || true
PLAT="--platform manylinux_2_31_x86_64 \
 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64 \
 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64"
TGT="--no-deps --only-binary=:all: --python-version 3.12 --implementation cp $PLAT"

rm -rf "$W/wheels-bundle" "$W/shadow-wheels"; mkdir -p "$W/wheels-bundle" "$W/shadow-wheels"
$PIP download -q $TGT -d "$W/wheels-bundle" vllm==0.26.0 -r "$HERE/vllm-0.26-closure.txt"
$PIP download -q $TGT -d "$W/shadow-wheels" protobuf==6.33.6 typing_extensions==4.16.0 anyio==4.16.0

B=$W/bundle; rm -rf "$B"; mkdir -p "$B/site" "$B/shadow"
$PIP install -q --no-index --no-compile $TGT --target "$B/site" "$W"/wheels-bundle/*.whl
for n in protobuf typing_extensions anyio; do
  $PIP install -q --no-index --no-compile $TGT --target "$B/shadow/$n" "$W"/shadow-wheels/${n}-*.whl
done

rm -f "$B/site/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so" "$B/site/vllm/_moe_C_stable_libtorch.abi3.so" "$B/site/vllm/vllm-rs"
rm -rf "$B/site/vllm/third_party/deep_gemm" "$B/site/vllm/third_party/fmha_sm100"
rm -rf "$B/site/bin"   # console scripts with a foreign shebang

mkdir -p "$B/tok"
if [ -n "${TOK_DIR:-}" ]; then
  cp "$TOK_DIR"/tokenizer.json "$B/tok/"
else
  python3 - "$B/site/mistral_common/data/tokenizer.model.v1" "$B/tok" <<'EOF'
import sys
from transformers import LlamaTokenizerFast

backend = LlamaTokenizerFast(vocab_file=sys.argv[1], legacy=True).backend_tokenizer
# transformers 5.19 builds this without the model's vocabulary (3 tokens): give TOK_DIR then.
if backend.get_vocab_size() != 32000:
    sys.exit(f"tokenizer has {backend.get_vocab_size()} tokens, not 32000: set TOK_DIR to the model's tokenizer")
backend.save(f"{sys.argv[2]}/tokenizer.json")
EOF
fi
cp "$HERE"/tok/tokenizer_config.json "$HERE"/tok/chat_template.jinja "$B/tok/"

tar -C "$B" -cf - . | xz -T0 -9e > "$W/site.tar.xz"
ls -la "$W/site.tar.xz"
