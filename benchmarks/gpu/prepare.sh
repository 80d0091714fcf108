#!/bin/bash
# Everything the device needs, built here from PyPI and laid out for as many carried calls as it takes.
#
#   bash benchmarks/gpu/prepare.sh DEST        # DEST: an ignored folder inside the checkout the device copies
#
# Makes under DEST one folder per call, k1 ... kN (N printed at the end, with the commands):
#   k1        vllm-router's orjson and redis wheels (the gateway's needs the device lacks) and the
#             bundle's first part
#   k2..kN-1  the bundle's middle parts
#   kN        its last part, SHA256SUMS, proj.tar.xz (this branch's gateway, engines and benchmarks,
#             with its COMMIT: the device runs the code of this worktree, not of the checkout it
#             copies), Debian's redis-server packages (the fleet scenes start one) and vllm-router 0.1.17
#             (its .so stripped: 15 MB instead of 24)
# Calls 1 to N-1 only copy their folder to /tmp/gpu/parts; call N unpacks, installs the extras and
# launches the plan. ROUTER=0 leaves vllm-router out (plans without a router: `harness.py --plan mixed`).
# A call carries at most 64 MiB with the checkout's own files (the tree grows, so N is worked out
# from it each time), so the bundle (vLLM 0.26.0 and the packages the device lacks, xz -9e: ~98 MB)
# is cut to fill each call up to the same margin.
# The bundle is built once (build_bundle.sh) and reused; W (default .gpu-build) keeps it.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
DEST=${1:?usage: prepare.sh DEST}
W=${W:-$ROOT/.gpu-build}
mkdir -p "$DEST"
CHECKOUT=${CHECKOUT:-$(cd "$DEST/.." && git rev-parse --show-toplevel)}
LIMIT=$((64 * 1024 * 1024))
MARGIN=${MARGIN:-1500000}
PIP="${PIP:-python3 -m pip}"
export PIP_CONFIG_FILE=/dev/null
TGT="--no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"

[ -f "$W/site.tar.xz" ] || W=$W bash "$HERE/build_bundle.sh"

rm -rf "$DEST"/c[0-9] "$DEST"/k[0-9]*; STAGE=$(mktemp -d); FIRST=$STAGE/first; LAST=$STAGE/last
mkdir -p "$FIRST" "$LAST" "$W/extra" "$W/redis"
# vllm-router: the Python launcher, the extension (symbols stripped) and the libraries it links.
if [ "${ROUTER:-1}" != 0 ] && [ ! -f "$W/extra/router.tar.xz" ]; then
  $PIP download -q $TGT -d "$W/extra" vllm-router==0.1.17
  rm -rf "$W/extra/router"; mkdir -p "$W/extra/router"
  (cd "$W/extra/router" && unzip -q ../vllm_router-0.1.17-*.whl 'vllm_router/*' 'vllm_router_rs.abi3.so' 'vllm_router.libs/*' \
    && strip --strip-unneeded vllm_router_rs.abi3.so)
  tar -C "$W/extra/router" -cf - . | xz -T0 -9e > "$W/extra/router.tar.xz"
fi
$PIP download -q $TGT -d "$W/extra" orjson==3.13.0 redis==8.1.0
cp "$W"/extra/orjson-*.whl "$W"/extra/redis-*.whl "$FIRST/"
[ "${ROUTER:-1}" = 0 ] || cp "$W/extra/router.tar.xz" "$LAST/"
# redis-server for the fleet scenes, as the device's Debian-like system takes it (unpacked, not installed).
ls "$W"/redis/redis-server_*.deb >/dev/null 2>&1 || \
  (cd "$W/redis" && apt-get download redis-server redis-tools libjemalloc2 liblzf1 libatomic1)
cp "$W"/redis/*.deb "$LAST/"

# This worktree's code (what git tracks under these paths, as it is now, committed or not), and which
# commit it is (the results record it).
STAMP=$(mktemp -d); (cd "$ROOT" && python3 -c 'from priority_gateway.bench.envelope import commit_stamp; print(commit_stamp())') \
  > "$STAMP/COMMIT"
(cd "$ROOT" && git ls-files -co --exclude-standard priority_gateway engines benchmarks/gpu benchmarks/vllm_calibration.py \
  benchmarks/live_stack.py benchmarks/agent_sessions.py benchmarks/agent_sessions_client.py benchmarks/fairness.py benchmarks/fairness_realtime.py benchmarks/fleet_admission_realtime.py \
  pyproject.toml | tar -cf - -T - -C "$STAMP" COMMIT | xz -9 > "$LAST/proj.tar.xz")
rm -rf "$STAMP"
(cd "$W" && sha256sum site.tar.xz > "$LAST/SHA256SUMS")

tree=$(cd "$CHECKOUT" && git ls-files -z | xargs -0 stat -c %s | awk '{s += $1} END {print s}')
first=$(du -cb "$FIRST"/* | tail -1 | cut -f1); last=$(du -cb "$LAST"/* | tail -1 | cut -f1)
total=$(stat -c %s "$W/site.tar.xz")
room=$((LIMIT - tree - MARGIN))
[ $((first + 1)) -le $room ] && [ $((last + 1)) -le $room ] || {
  echo "does not fit: the checkout ($tree bytes) leaves $room per call, call 1 needs $first, the last $last"; exit 1; }
# Fill each call up to the room in order; the last takes what is left beside its extras.
n=1; left=$total; offset=0
while :; do
  extra=0; [ $n = 1 ] && extra=$first
  part=$((room - extra)); [ $left -lt $part ] && part=$left
  mkdir -p "$DEST/k$n"; [ $n = 1 ] && cp "$FIRST"/* "$DEST/k$n/"
  dd if="$W/site.tar.xz" of="$DEST/k$n/site.tar.xz.part-$(printf '%02d' $n)" bs=1M iflag=skip_bytes,count_bytes \
    skip=$offset count=$part status=none
  offset=$((offset + part)); left=$((left - part))
  if [ $left -eq 0 ] && [ $part -le $((room - last - extra)) ]; then break; fi
  n=$((n + 1))
done
cp "$LAST"/* "$DEST/k$n/"; rm -rf "$STAGE"
for c in $(seq 1 $n); do
  size=$(du -cb "$DEST/k$c"/* | tail -1 | cut -f1)
  echo "k$c: $size bytes carried + $tree of the checkout = $((size + tree)) of $LIMIT"
  [ $((size + tree)) -le $LIMIT ] || { echo "k$c does not fit"; exit 1; }
done
echo "$n calls: 1 to $((n - 1)) copy .gpu/kI/* to /tmp/gpu/parts/; call $n (carry .gpu/k$n) unpacks, installs the extras and launches"
