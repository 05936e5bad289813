#!/usr/bin/env bash
# The H200 benchmark runs behind the numbers the speed issues ask for: one JSON per case under OUT_DIR, and the
# printed tables in OUT_DIR/bench.log.
#
#   tools/gpu_bench.sh OUT_DIR [GROUP ...]      GROUP: dense | moe | qlora (default: all three)
#
# Cases (3 timed steps after 1 warm-up; the long-row and QLoRA cases skip the extra sync-count pass):
#   dense:  dense-0.6b (+ the attention-alone micro-benchmark), dense-8b, dense-8b-long (32K tokens of 8K-16K
#           rows: recompute vs offload vs offload-double checkpoints, ratios against recompute)
#   moe:    moe-qwen3 (8 layers), moe-gptoss (4 layers), each Hone MoE backend and all paths together
#   qlora:  dense-8b --qlora at 16K tokens (the reference is expected to run out of memory there) and at 4K
#
# Time, estimated from the reference rates in DESIGN.md (dense-0.6b 10,976 tok/s, dense-8b 3,309, moe-qwen3
# 26,449 with checkpointing) and assuming Hone runs at 1-3x those: a run costs setup (3-6 s; QLoRA loads
# with quantization ~20 s) + 4 steps + one forward/backward for the sync count; plus ~15 s of imports and the
# matmul probe per case. dense ~220 s (0.6b ~60, 8b ~80, long ~80), moe ~130 s (qwen3 ~85 with Triton
# autotuning, gptoss ~45), qlora ~160 s (saving the 16 GB model once ~20 s, four quantized loads): about
# 8.5 minutes in all. Each group stays well under the 10-minute limit of one device command, so the groups
# can run as separate commands (e.g. `dense` in one, `moe qlora` in the next).
#
# QLoRA needs bitsandbytes: carry the wheels that ../shared/device/wheels.sh fetches into .whl/ (installed here
# when present). hone need not be installed: the checkout is put on PYTHONPATH as the `hone` package.
set -uo pipefail
out=${1:?usage: tools/gpu_bench.sh OUT_DIR [dense|moe|qlora ...]}
shift
groups=("$@")
[ ${#groups[@]} -eq 0 ] && groups=(dense moe qlora)
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
mkdir -p "$out"
log="$out/bench.log"
export PYTHONUNBUFFERED=1

if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
if ! python3 -c "import hone.core.bench" 2>/dev/null; then
  src=$(mktemp -d)
  mkdir -p "$src/hone"
  for folder in core kernels resources app; do ln -s "$root/$folder" "$src/hone/$folder"; done
  export PYTHONPATH="$src${PYTHONPATH:+:$PYTHONPATH}"
fi

models=$(mktemp -d)  # random-init model folders the QLoRA cases share
failed=0
bench() {
  local name=$1
  shift
  echo "=== $name: hone bench $*" | tee -a "$log"
  local start=$SECONDS
  python3 -m hone.core.cli bench "$@" --json "$out/$name.json" 2>&1 | tee -a "$log"
  local code=${PIPESTATUS[0]}
  echo "=== $name: exit $code after $((SECONDS - start)) s" | tee -a "$log"
  [ "$code" -eq 0 ] || failed=1
}

common=(--steps 3 --warmup 1)
for group in "${groups[@]}"; do
  case "$group" in
    dense)
      bench dense-0.6b dense-0.6b "${common[@]}" --micro on \
        --only 'hone-base,attn+loss,attn-varlen-per-layer,loss-chunked,all'
      bench dense-8b dense-8b "${common[@]}" --micro off --only 'attn+loss,all'
      bench dense-8b-long dense-8b "${common[@]}" --micro off --no-sync-count --tokens 32768 --seq-min 8192 \
        --seq-max 16384 --baseline all-ckpt-gpu --only 'all-ckpt-gpu,all-offload,all-offload-double'
      ;;
    moe)
      bench moe-qwen3 moe-qwen3 "${common[@]}" --micro off --only 'moe-*,all'
      bench moe-gptoss moe-gptoss "${common[@]}" --micro off --only 'moe-grouped_mm,moe-triton,all'
      ;;
    qlora)
      bench dense-8b-qlora dense-8b --qlora "${common[@]}" --micro off --no-sync-count --only all \
        --model-cache "$models"
      bench dense-8b-qlora-4k dense-8b --qlora "${common[@]}" --micro off --no-sync-count --tokens 4096 \
        --only all --model-cache "$models"
      ;;
    *)
      echo "unknown group $group (dense, moe or qlora)" | tee -a "$log"
      failed=1
      ;;
  esac
done
rm -rf "$models"
exit $failed
