#!/usr/bin/env bash
# The GPU validation of docs/gpu-validation.md: preflight and the probe ladder on a real NVIDIA GPU.
# Needs: python3 with torch (CUDA), nvcc, and flashinfer-python + apache-tvm-ffi importable;
# the wheels in .whl/ (see the doc) are installed into /tmp/site when present.
# Writes everything it prints to ${OUT:-/tmp/gpu-validation}.
set -uo pipefail
OUT=${OUT:-/tmp/gpu-validation}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 SM120PATCH_CACHE=/tmp/sm120patch-cache XDG_CACHE_HOME=/tmp/xdg
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
fi
SM="python3 -m sm120patch"
step() {
  echo; echo "### $*"; local t0; t0=$(date +%s%N); "$@"; local rc=$?
  echo "### rc=$rc elapsed_ms=$(( ($(date +%s%N) - t0) / 1000000 ))"
}
{
  step nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv
  step nvcc --version
  step $SM preflight
  step $SM preflight --json
  step $SM preflight --arch sm_120
  step $SM probe --arch sm_90 --arch sm_100 --arch sm_120 --probe spec
  step $SM probe flashinfer:norm --probe run
  step $SM probe flashinfer:norm --probe run
  step $SM probe flashinfer:trtllm_comm --arch sm_90 --probe build
  step $SM probe flashinfer:trtllm_comm --arch sm_120 --probe build
  step $SM apply --installed --arch sm_120 --no-diff
  step $SM status --installed
  step $SM rollback --installed
  step $SM status --installed
} 2>&1 | tee "$OUT/gpu-validation.log"
