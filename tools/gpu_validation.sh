#!/usr/bin/env bash
# The GPU validation of docs/gpu-validation.md. Sections (default: ladder):
#   ladder      preflight and the probe ladder on one GPU (2026-11-29)
#   run-rung    the run rung on two GPUs of one arch: the allreduce fusion as FlashInfer ships it, then
#               built from scratch copies with a fault put in (tools/inject_fault.py), and the
#               fused-MoE check, whose cold JIT build runs in the background meanwhile
#   moe-wait    wait (up to MOE_WAIT seconds) for that fused-MoE probe and report it
#   moe-run     the fused-MoE check alone on one GPU: the run rung only (tools/run_only.py), its
#               cold JIT build in its own session at full speed, then moe-wait
#   timing      the allreduce-fusion run check on two GPUs of one arch, run rung only (run_only.py):
#               its numbers, then its timing against NCCL + fused_add_rmsnorm; writes timing.json,
#               timing-table.txt (as `probe --probe run` prints it) and timing-table.md
#   timing-pcie   the same for the PCIe-IPC all-reduce against NCCL (needs FlashInfer >= 0.7.0)
#   timing-probe  the fusion's through `sm120patch probe ... --probe run` (climbs the build rung first)
#   moe-reduced the fused-MoE check with its reduced bf16 module (checks/moe_reduced.py) on one GPU, in
#               its own session: stock FlashInfer, then the same scratch copy with expandInputRowsKernel
#               compiled out (inject_fault.py moe-empty-body; ninja rebuilds only what includes it);
#               waits up to MOE_WAIT seconds, then reports; moe-reduced-wait carries on in the next call
#   spec-timing the spec rung over the catalogue for three archs (cold, then warm) and preflight, timed
# Needs: python3 with torch (CUDA), nvcc, and flashinfer-python + apache-tvm-ffi importable; wheels in
# $WHL (default .whl/ beside tools/, see the doc) are installed into /tmp/site first.
# Writes what it prints to ${OUT:-/tmp/gpu-validation}.
set -uo pipefail
# NVLink multicast can take a shared host's GPUs out of service: off here and in every child
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/gpu-validation}; mkdir -p "$OUT"
WHL=${WHL:-$HERE/../.whl}
SECTION=${1:-ladder}
VARIANTS=${VARIANTS:-stock empty-body big-cluster}  # run-rung: which FlashInfer builds to run
MOE=${MOE:-1}  # run-rung: start the fused-MoE probe in the background (1) or not (0)
export PYTHONUNBUFFERED=1
if ls "$WHL"/*.whl >/dev/null 2>&1 && [ ! -f /tmp/site/.installed ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHL"/*.whl || exit 1
  touch /tmp/site/.installed
fi
[ -d /tmp/site ] && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
SM="python3 -m sm120patch"
W=/tmp/sm120patch-run
step() {
  echo; echo "### $*"; local t0; t0=$(date +%s%N); "$@"; local rc=$?
  echo "### rc=$rc elapsed_ms=$(( ($(date +%s%N) - t0) / 1000000 ))"
}
# the fused-MoE probe's build: objects compiled so far, of how many
moe_progress() {
  local ninja; ninja=$(ls "$W"/moe/cache/sm120patch/probes/builds/*/.cache/flashinfer/*/*/cached_ops/fused_moe_90/build.ninja 2>/dev/null | head -1)
  if [ -z "$ninja" ]; then echo "fused_moe_90: no build.ninja yet"; return; fi
  local dir; dir=$(dirname "$ninja")
  echo "fused_moe_90: $(find "$dir" -name '*.o' | wc -l) of $(grep -c '^build .*\.o:' "$ninja") objects compiled," \
       "$(( $(date +%s) - $(cat "$W"/moe/started) )) s after the probe started; load: $(cut -d' ' -f1-3 /proc/loadavg)"
}
# the arguments that point the probe at one variant of FlashInfer
variant_args() { if [ "$1" = stock ]; then echo "--python python3"; else echo "--flashinfer $W/$1 --python python3"; fi; }

ladder() {
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
}

run_rung() {
  step nvidia-smi --query-gpu=index,name,compute_cap,driver_version --format=csv
  step nvidia-smi topo -m
  echo; echo "### multicast off:"; env | grep -E '^(NCCL_NVLS_ENABLE|TORCH_SYMM_MEM_DISABLE_MULTICAST|NVSHMEM_DISABLE_NVLS)='
  rm -rf "$W"; mkdir -p "$W"/moe "$W"/stock
  # scratch copies of the installed FlashInfer, each with one fault (before anything writes into it)
  for f in $VARIANTS; do
    [ "$f" = stock ] && continue
    mkdir -p "$W/$f" && cp -r /tmp/site/flashinfer "$W/$f"/ && step python3 "$HERE"/inject_fault.py "$f" "$W/$f/flashinfer"
  done
  # the fused-MoE probe in its own session, at lower priority: its cold build is ~180 CUDA files
  date +%s > "$W"/moe/started
  [ "$MOE" = 1 ] && (cd "$W"/moe && MAX_JOBS=${MOE_JOBS:-32} XDG_CACHE_HOME="$W"/moe/cache setsid nice -n 10 \
     $SM probe flashinfer:cutlass_fused_moe_sm90 --arch sm_90 --probe run --python python3 --json \
     > "$W"/moe/verdict.json 2> "$W"/moe/stderr.txt < /dev/null &)
  # build rung for the three variants at once (and the norm module), then run them one at a time
  echo; echo "### build rung: $VARIANTS (in parallel)"
  local t0; t0=$(date +%s)
  for v in $VARIANTS; do
    mkdir -p "$W/$v"
    # shellcheck disable=SC2046
    XDG_CACHE_HOME="$W/$v/cache" $SM probe flashinfer:trtllm_comm --arch sm_90 --probe build $(variant_args $v) \
      > "$W/$v/build.txt" 2>&1 &
  done
  XDG_CACHE_HOME="$W/stock/cache" $SM probe flashinfer:norm --arch sm_90 --probe build --python python3 \
    > "$W/stock/norm-build.txt" 2>&1 &
  wait_builds=$(jobs -p); wait $wait_builds
  echo "### builds done in $(( $(date +%s) - t0 )) s"
  for v in $VARIANTS; do echo "--- $v"; cat "$W/$v/build.txt"; done
  cat "$W/stock/norm-build.txt"
  moe_progress
  for v in $VARIANTS; do
    # shellcheck disable=SC2046
    step env XDG_CACHE_HOME="$W/$v/cache" timeout 300 $SM probe flashinfer:trtllm_comm --arch sm_90 --probe run $(variant_args $v)
    # the same question again: answered from the verdict cache, with the whole record
    # shellcheck disable=SC2046
    XDG_CACHE_HOME="$W/$v/cache" timeout 60 $SM probe flashinfer:trtllm_comm --arch sm_90 --probe run --json \
      $(variant_args $v) > "$OUT/$v.json"
    python3 -c "import json,sys; v=json.load(open(sys.argv[1]))['verdicts'][0]; print('cached:', v['cached'], v['elapsed_s'], 's;', [(s['rung'], s['result']) for s in v['steps']])" "$OUT/$v.json"
    moe_progress
  done
  step env XDG_CACHE_HOME="$W/stock/cache" timeout 300 $SM probe flashinfer:norm --arch sm_90 --probe run --python python3
  XDG_CACHE_HOME="$W/stock/cache" $SM probe flashinfer:norm --arch sm_90 --probe run --python python3 --json > "$OUT/norm.json"
  moe_progress
}

moe_run() {
  mkdir -p "$W"/moe; date +%s > "$W"/moe/started
  (cd "$W"/moe && MAX_JOBS=${MOE_JOBS:-$(nproc)} XDG_CACHE_HOME="$W"/moe/cache setsid \
     python3 "$HERE"/run_only.py flashinfer:cutlass_fused_moe_sm90 sm_90 \
     > "$W"/moe/verdict.json 2> "$W"/moe/stderr.txt < /dev/null &)
  sleep 5; moe_wait
}

moe_wait() {
  local deadline=$(( $(date +%s) + ${MOE_WAIT:-480} ))
  while pgrep -f "flashinfer:cutlass_fused_moe_sm90" >/dev/null && [ "$(date +%s)" -lt "$deadline" ]; do
    moe_progress; sleep 60
  done
  moe_progress
  if pgrep -f "flashinfer:cutlass_fused_moe_sm90" >/dev/null; then
    echo "fused-MoE probe still running (build not finished)"
  else
    echo "fused-MoE probe finished:"; cat "$W"/moe/verdict.json
  fi
  cp "$W"/moe/verdict.json "$OUT"/moe.json 2>/dev/null
  tail -c 4000 "$W"/moe/stderr.txt > "$OUT"/moe-stderr.txt 2>/dev/null
}

# the run rung's timing: the run rung alone, so that a cold JIT build (trtllm_comm and the norm
# module, about 3 minutes on an H200 host) and the timing fit one call. $1: kernel, $2: file prefix
timing() {
  local kernel=${1:-flashinfer:trtllm_comm} name=${2:-timing}
  step nvidia-smi --query-gpu=index,name,compute_cap,driver_version,pci.bus_id --format=csv
  step nvidia-smi topo -m
  step nvidia-smi nvlink --status
  echo; echo "### multicast off:"; env | grep -E '^(NCCL_NVLS_ENABLE|TORCH_SYMM_MEM_DISABLE_MULTICAST|NVSHMEM_DISABLE_NVLS)='
  local arch; arch=${ARCH:-sm_$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' .')}
  python3 -c "import flashinfer, torch; print('flashinfer', flashinfer.__version__, 'torch', torch.__version__)"
  mkdir -p "$W"/timing
  echo; echo "### run rung alone: $kernel $arch (numbers, then timing)"
  local t0; t0=$(date +%s)
  XDG_CACHE_HOME="$W"/timing/cache timeout "${TIMING_TIMEOUT:-540}" \
    python3 "$HERE"/run_only.py "$kernel" "$arch" > "$OUT/$name.json"
  echo "### rc=$? elapsed_s=$(( $(date +%s) - t0 ))"
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(d['result'], d['elapsed_s'], 's:', d['reason'])" "$OUT/$name.json"
  python3 "$HERE"/timing_table.py "$OUT/$name.json" | tee "$OUT/$name-table.txt"
  python3 "$HERE"/timing_table.py "$OUT/$name.json" --markdown > "$OUT/$name-table.md"
  python3 -c "import json,sys; t=json.load(open(sys.argv[1]))['evidence']['run'].get('timing') or {}; print(json.dumps(t.get('topology'), indent=1))" "$OUT/$name.json"
}

timing_probe() {
  local arch; arch=${ARCH:-sm_$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' .')}
  step env XDG_CACHE_HOME="$W"/timing/cache timeout "${TIMING_TIMEOUT:-540}" \
    $SM probe flashinfer:trtllm_comm --arch "$arch" --probe run --python python3
  XDG_CACHE_HOME="$W"/timing/cache timeout 60 $SM probe flashinfer:trtllm_comm --arch "$arch" --probe run \
    --python python3 --json > "$OUT"/timing-probe.json
}

R=$W/moe-reduced
REPO=$(cd "$HERE/.." && pwd)
moe_reduced_progress() {
  local ninja; ninja=$(ls "$R"/cache/sm120patch/probes/builds/*/.cache/flashinfer/*/*/cached_ops/fused_moe_90_sm120patch_bf16/build.ninja 2>/dev/null | head -1)
  if [ -z "$ninja" ]; then echo "reduced fused_moe_90: no build.ninja yet, $(( $(date +%s) - $(cat "$R"/started) )) s"; return; fi
  echo "reduced fused_moe_90: $(find "$(dirname "$ninja")" -name '*.o' | wc -l) objects of $(grep -c '^build .*\.o:' "$ninja")," \
       "$(( $(date +%s) - $(cat "$R"/started) )) s after the start; load: $(cut -d' ' -f1-3 /proc/loadavg)"
}
moe_chain() {  # stock, then the fault, in one scratch FlashInfer and one run workspace
  cd "$R" || exit 1
  export PYTHONPATH=$R/tree:$REPO:/tmp/site XDG_CACHE_HOME=$R/cache MAX_JOBS=${MOE_JOBS:-$(nproc)}
  python3 "$HERE"/run_only.py flashinfer:cutlass_fused_moe_sm90 sm_90 > stock.json 2> stock.err; echo $? > stock.rc
  date +%s > fault.started
  python3 "$HERE"/inject_fault.py moe-empty-body "$R"/tree/flashinfer > fault.txt 2>&1
  python3 "$HERE"/run_only.py flashinfer:cutlass_fused_moe_sm90 sm_90 > fault.json 2> fault.err; echo $? > fault.rc
}
moe_report() {
  for v in stock fault; do
    [ -f "$R/$v.rc" ] || { echo "$v: not finished"; continue; }
    echo "--- $v: exit $(cat "$R/$v.rc")"; cat "$R/$v.txt" 2>/dev/null
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(d['result'], d['elapsed_s'], 's:', d['reason']); r=d.get('evidence',{}).get('run',{}); print('build_s', r.get('build_s'), 'run_s', r.get('run_s')); [print(' ', c.get('name'), c.get('ok'), c.get('max_abs_err'), c.get('n_bad'), c.get('numel'), c.get('n_nonfinite')) for c in r.get('cases',[])]" "$R/$v.json" || tail -c 1500 "$R/$v.json"
    tail -c 1500 "$R/$v.err"; cp "$R/$v.json" "$OUT/moe-reduced-$v.json" 2>/dev/null
  done
}
moe_reduced_wait() {
  local deadline=$(( $(date +%s) + ${MOE_WAIT:-540} ))
  while [ ! -f "$R"/fault.rc ] && [ "$(date +%s)" -lt "$deadline" ]; do moe_reduced_progress; sleep 30; done
  moe_reduced_progress; moe_report
}
moe_reduced() {
  nvidia-smi --query-gpu=index,name,compute_cap,driver_version --format=csv; nvcc --version | tail -2; nproc; which nm
  rm -rf "$R"; mkdir -p "$R"/tree && cp -r /tmp/site/flashinfer "$R"/tree/ && date +%s > "$R"/started
  (setsid bash "$HERE"/gpu_validation.sh moe-chain < /dev/null > "$R"/chain.log 2>&1 &)
  sleep 5; moe_reduced_wait
}

spec_timing() {
  export XDG_CACHE_HOME=$W/spec-cache; rm -rf "$XDG_CACHE_HOME"
  step $SM probe --arch sm_90 --arch sm_100 --arch sm_120 --probe spec
  step $SM probe --arch sm_90 --arch sm_100 --arch sm_120 --probe spec
  rm -rf "$XDG_CACHE_HOME"; step $SM preflight --arch sm_120
}

case "$SECTION" in
  ladder) ladder 2>&1 | tee "$OUT/gpu-validation.log" ;;
  run-rung) run_rung 2>&1 | tee "$OUT/gpu-run-rung.log" ;;
  moe-wait) moe_wait 2>&1 | tee "$OUT/gpu-moe.log" ;;
  moe-run) moe_run 2>&1 | tee "$OUT/gpu-moe.log" ;;
  timing) timing 2>&1 | tee "$OUT/gpu-timing.log" ;;
  timing-pcie) timing flashinfer:pcie_ipc_comm timing-pcie 2>&1 | tee "$OUT/gpu-timing-pcie.log" ;;
  timing-probe) timing_probe 2>&1 | tee "$OUT/gpu-timing-probe.log" ;;
  moe-chain) moe_chain ;;
  spec-timing) spec_timing 2>&1 | tee "$OUT/gpu-spec-timing.log" ;;
  moe-reduced) moe_reduced 2>&1 | tee "$OUT/gpu-moe-reduced.log" ;;
  moe-reduced-wait) moe_reduced_wait 2>&1 | tee -a "$OUT/gpu-moe-reduced.log" ;;
  *) echo "unknown section $SECTION: ladder, run-rung, moe-wait, moe-run, moe-reduced, moe-reduced-wait, spec-timing, timing, timing-pcie or timing-probe" >&2; exit 2 ;;
esac
