#!/usr/bin/env bash
# Maintainer tooling, not part of Hone Studio (see dev/README.md): prepare a bare GPU machine without network access
# from what was copied along with the checkout, then run tools/gpu_tests.py there.
#
#   dev/gpu_machine.sh [tools/gpu_tests.py arguments]        results in $OUT when set, else build/gpu-tests
#
#   .whl/*.whl     wheels the machine lacks (bitsandbytes, datasets, gguf, pytest-timeout, ...), installed without
#                  an index into /tmp/site, which goes first on PYTHONPATH
#   .gguf/tok/     a tokenizer folder from dev/export_test_tokenizer.py, used as HONE_TEST_TOKENIZER when that is unset
#
# hone itself is installed editable without dependencies: torch, transformers and peft come with the machine.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 PIP_DISABLE_PIP_VERSION_CHECK=1
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
python3 -m pip install -q --no-deps --no-build-isolation -e .
if [ -z "${HONE_TEST_TOKENIZER:-}" ] && [ -f .gguf/tok/tokenizer.json ]; then
  export HONE_TEST_TOKENIZER="$PWD/.gguf/tok"
fi
exec python3 tools/gpu_tests.py --out "${OUT:-build/gpu-tests}" "$@"
