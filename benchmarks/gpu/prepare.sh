#!/bin/bash
# Everything the device needs, built here from PyPI and laid out for two carried calls.
#
#   bash benchmarks/gpu/prepare.sh DEST        # DEST: an ignored folder inside the checkout the device copies
#
# Makes (each under DEST):
#   c1/  call 1: vllm-router 0.1.17 (its .so stripped: 15 MB instead of 24), orjson and redis wheels
#        (the gateway's needs the device lacks) and the first part of the vLLM bundle
#   c2/  call 2: the rest of the bundle, SHA256SUMS, and proj.tar.xz (this branch's gateway, engines
#        and benchmarks, with its COMMIT: the device runs the code of this worktree, not of the checkout
#        it copies)
#   c3/  call 3 (sent while the plan runs): Debian's redis-server packages (the fleet scenes start one),
#        and vllm-router when ROUTER=late
# ROUTER=late moves vllm-router from call 1 to call 3: the bundle then fills calls 1 and 2 alone (the
# budgets plan, whose router step comes late); ROUTER=0 leaves it out.
# A call carries at most 64 MiB with the checkout's own files, so the bundle (vLLM 0.26.0 and the
# packages the device lacks, xz -9e: ~98 MB) is split so that both calls fit with the same margin.
# The bundle is built once (build_bundle.sh) and reused; W (default .gpu-build) keeps it.
# ROUTER=0 leaves vllm-router out (plans without a router: `harness.py --plan mixed`), which frees
# 15 MB of call 1 for the bundle.
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

rm -rf "$DEST/c1" "$DEST/c2" "$DEST/c3"; mkdir -p "$DEST/c1" "$DEST/c2" "$DEST/c3" "$W/extra" "$W/redis"
# vllm-router: the Python launcher, the extension (symbols stripped) and the libraries it links.
if [ "${ROUTER:-1}" != 0 ] && [ ! -f "$W/extra/router.tar.xz" ]; then
  $PIP download -q $TGT -d "$W/extra" vllm-router==0.1.17
  rm -rf "$W/extra/router"; mkdir -p "$W/extra/router"
  (cd "$W/extra/router" && unzip -q ../vllm_router-0.1.17-*.whl 'vllm_router/*' 'vllm_router_rs.abi3.so' 'vllm_router.libs/*' \
    && strip --strip-unneeded vllm_router_rs.abi3.so)
  tar -C "$W/extra/router" -cf - . | xz -T0 -9e > "$W/extra/router.tar.xz"
fi
$PIP download -q $TGT -d "$W/extra" orjson==3.13.0 redis==8.1.0
cp "$W"/extra/orjson-*.whl "$W"/extra/redis-*.whl "$DEST/c1/"
case "${ROUTER:-1}" in 0) ;; late) cp "$W/extra/router.tar.xz" "$DEST/c3/" ;; *) cp "$W/extra/router.tar.xz" "$DEST/c1/" ;; esac
# redis-server for the fleet scenes, as the device's Debian-like system takes it (unpacked, not installed).
ls "$W"/redis/redis-server_*.deb >/dev/null 2>&1 || \
  (cd "$W/redis" && apt-get download redis-server redis-tools libjemalloc2 liblzf1 libatomic1)
cp "$W"/redis/*.deb "$DEST/c3/"

# This worktree's code (what git tracks under these paths, as it is now, committed or not), and which
# commit it is (the results record it).
STAMP=$(mktemp -d); (cd "$ROOT" && python3 -c 'from priority_gateway.bench.envelope import commit_stamp; print(commit_stamp())') \
  > "$STAMP/COMMIT"
(cd "$ROOT" && git ls-files -co --exclude-standard priority_gateway engines benchmarks/gpu benchmarks/vllm_calibration.py \
  benchmarks/live_stack.py benchmarks/fairness.py benchmarks/fairness_realtime.py benchmarks/fleet_admission_realtime.py \
  pyproject.toml | tar -cf - -T - -C "$STAMP" COMMIT | xz -9 > "$DEST/c2/proj.tar.xz")
rm -rf "$STAMP"
(cd "$W" && sha256sum site.tar.xz > "$DEST/c2/SHA256SUMS")

tree=$(cd "$CHECKOUT" && git ls-files -z | xargs -0 stat -c %s | awk '{s += $1} END {print s}')
c1=$(du -cb "$DEST/c1"/* | tail -1 | cut -f1); c2=$(du -cb "$DEST/c2"/* | tail -1 | cut -f1)
total=$(stat -c %s "$W/site.tar.xz")
room=$((LIMIT - tree - MARGIN))
# Part A fills call 1 as much as part B will fill call 2: both calls keep the same margin.
part_a=$(( (total + c2 - c1) / 2 ))
[ $((c1 + part_a)) -le $room ] && [ $((c2 + total - part_a)) -le $room ] || {
  echo "does not fit: tree $tree, call 1 $((c1 + part_a)), call 2 $((c2 + total - part_a)), room $room"; exit 1; }
head -c "$part_a" "$W/site.tar.xz" > "$DEST/c1/site.tar.xz.part-aa"
tail -c +$((part_a + 1)) "$W/site.tar.xz" > "$DEST/c2/site.tar.xz.part-ab"
for c in c1 c2 c3; do
  size=$(du -cb "$DEST/$c"/* | tail -1 | cut -f1)
  echo "$c: $size bytes carried + $tree of the checkout = $((size + tree)) of $LIMIT"
  [ $((size + tree)) -le $LIMIT ] || { echo "$c does not fit"; exit 1; }
done
