#!/usr/bin/env bash
# The one command for a short lease of a GPU machine: the kernels checked, then fsdplab timed beside torch, within one
# deadline, most important first.
#
#   scripts/gpu_lease.sh OUT_DIR        (OUT_DIR gets every log, trace and kernel table; OUT_DIR/lease.txt the summary)
#
# A lent machine is held for minutes (this project's: 15 minutes of device time a task, 10 a command, its start
# included) and is bare (scripts/gpu_bundle.sh's .gpu_bundle/ carried there: docs/gpu.md, "A lease, step by step").
# In order, each under what is left of GPU_LEASE_SECONDS (default 540: one 600-second command, with time to copy
# the outputs back):
#   1. the environment (scripts/gpu_env.sh) and the builds, once: make, make CUDA=1, gpu_layers
#   2. scripts/gpu_check.sh steps 2 and 3: every device function on the GPU against the CPU, and the tiny model's
#      losses, gradients and parameters, GPU against CPU, float32 and MP=bf16 (about 1 minute on an H200): whether
#      the kernels compute what the CPU does, before anything is timed; then tests/gpu_gemm_bench.c: Qwen2-0.5B's
#      GEMMs in float32 and bfloat16 storage, timed and checked (seconds): what 2-byte tensors would buy the GEMMs
#   3. scripts/gpu_bench.sh: fsdplab beside PyTorch FSDP (GPU_LEASE_BENCH_SETTINGS, default the bfloat16 seed
#      setting first: issue 30's headline target), and fsdplab's kernel table (PROFILE_KERNELS=1) for seed_bf16;
#      a setting is skipped, and said so, when too little time is left to start it (GPU_BENCH_DEADLINE)
#   4. scripts/gpu_check.sh steps 4 and 5 (Qwen2-0.5B's losses against torch's within the derived bounds, about 5
#      minutes on an H200) when the time left allows; otherwise lease.txt names the command for a second call.
# GPU_LEASE_COPY_TO=DIR: at the end, however it ends, the small text files (summaries, logs, kernel tables: *.txt and
# *.log under 2 MB) are copied there with their paths, and nothing else: OUT_DIR also holds Qwen2-0.5B's checkpoints
# and gradients (gigabytes), which a lent machine's way back (its $OUT) cannot carry. Keep OUT_DIR on the machine's
# disk and name its $OUT here.
# Exit status 0 when every part that ran passed. GPU_LEASE_DRY_RUN=1 runs it all here, without a GPU, with both
# scripts' dry runs (GPU_CHECK_DRY_RUN, GPU_BENCH_DRY_RUN): the tiny model, the emulated CUDA build, torch on gloo
# (make check-train runs it); its numbers say nothing about a GPU.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
out=${1:?usage: scripts/gpu_lease.sh OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
summary=$out/lease.txt
: >"$summary"
start=$(date +%s)
copy_to=
if [ -n "${GPU_LEASE_COPY_TO:-}" ]; then mkdir -p "$GPU_LEASE_COPY_TO" && copy_to=$(cd "$GPU_LEASE_COPY_TO" && pwd); fi
copy_back() {
  [ -n "$copy_to" ] || return 0
  (cd "$out" && find . -type f \( -name '*.txt' -o -name '*.log' \) -size -2M -print0 |
    xargs -0 -r cp --parents -t "$copy_to") &&
    echo "gpu_lease: $(find "$copy_to" -type f | wc -l) text files copied to $copy_to"
}
trap copy_back EXIT
deadline=$((start + ${GPU_LEASE_SECONDS:-540}))
left() { echo $((deadline - $(date +%s))); }
# a timeout's seconds: what is left, at most $1 when given, at least 1 (scripts/gpu_env.sh's gpu_seconds)
limit() { gpu_seconds "$deadline" "${1:-}"; }
say() { echo "$*" | tee -a "$summary"; }
failures=0
# part NAME COMMAND...: runs it, its summary lines (its standard output) into lease.txt, its status counted
part() {
  local name=$1 status
  shift
  say "== $name ($(left) s left)"
  "$@" | tee -a "$summary"
  status=${PIPESTATUS[0]}
  [ $status = 0 ] || failures=$((failures + 1))
  say "== $name: exit $status, $(($(date +%s) - start)) s into the lease"
}
if [ "${GPU_LEASE_DRY_RUN:-0}" = 1 ]; then
  export GPU_CHECK_DRY_RUN=1 GPU_BENCH_DRY_RUN=1
  settings=${GPU_LEASE_BENCH_SETTINGS:-"seed_bf16 2 32 2 bf16; seed_fp32 2 32 2 fp32; throughput_bf16 4 64 1 bf16"}
else
  settings=${GPU_LEASE_BENCH_SETTINGS:-"seed_bf16 8 256 2 bf16; seed_fp32 8 256 2 fp32; throughput_bf16 16 1024 1 bf16"}
fi

# 1. the environment once, exported for both scripts (their own gpu_env_setup then finds everything in place)
. scripts/gpu_env.sh
if ! gpu_env_setup 2>"$out/environment.log"; then
  say "gpu_lease: FAIL environment: $(cat "$out/environment.log")"
  exit 1
fi
say "gpu_lease: $(nvidia-smi -L 2>/dev/null | head -n 1 || echo 'no GPU (nvidia-smi lists none)'); $(date -u);" \
  "deadline in $(left) s"

# 2. correctness first: gpu_check.sh builds (step 1) and runs steps 2 and 3
run_check() { GPU_CHECK_STEPS="$1" GPU_CHECK_STEP_TIMEOUT=$(limit) scripts/gpu_check.sh "$out/check"; }
part "gpu_check.sh steps 2 3: layers and the tiny model, GPU vs CPU" run_check "2 3"

# 2b. what 2-byte storage would buy the GEMMs: Qwen2-0.5B's GEMMs in four storages, each result checked
# (tests/gpu_gemm_bench.c; seconds); it says whether issue 30's next step, 2-byte tensors, pays for the GEMMs
if [ "${GPU_LEASE_DRY_RUN:-0}" = 1 ]; then gemm=(build/cuda_emulated/tests/bin/gpu_gemm_bench small)
else gemm=(build/cuda/tests/bin/gpu_gemm_bench); fi
part "gpu_gemm_bench: Qwen2-0.5B's GEMMs in float32 and bfloat16 storage" timeout --kill-after=10 "$(limit 120)" \
  "${gemm[@]}"

# 3. the benchmark, each setting started only while there is time for it
part "gpu_bench.sh: fsdplab beside torch" env GPU_BENCH_SETTINGS="$settings" GPU_BENCH_DEADLINE="$deadline" \
  GPU_BENCH_RUN_TIMEOUT="$(limit)" scripts/gpu_bench.sh "$out/bench"

# 4. Qwen2-0.5B against torch within the bounds, if it fits (about 330 s on an H200, 2026-12-04)
need=${GPU_LEASE_CHECK4_SECONDS:-330}
if [ "$(left)" -ge "$need" ]; then
  part "gpu_check.sh steps 4 5: Qwen2-0.5B vs torch within the bounds, throughput" run_check "4 5"
else
  say "== gpu_check.sh steps 4 5: not run, $(left) s left and they take about $need s; next call:" \
    "GPU_CHECK_STEPS=\"4 5\" scripts/gpu_check.sh OUT_DIR"
fi
say "gpu_lease: $failures failed, $(($(date +%s) - start)) s; everything in $out"
[ "$failures" = 0 ]
