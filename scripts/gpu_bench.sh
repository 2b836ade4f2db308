#!/usr/bin/env bash
# fsdplab beside PyTorch FSDP on one GPU, in one run: the numbers issue 30 asks for, per setting.
#
#   scripts/gpu_bench.sh OUT_DIR        (from the repository root or anywhere; OUT_DIR gets every log and trace)
#
# Settings (each one scripts/train.sh FSDP=both run on 1 rank, BACKEND=nccl, Qwen2-0.5B, the same init and batches on
# both sides; name MBS SEQ ACC MP):
#   seed_fp32        8  256 2 fp32   the seed's command (train.sh's defaults for Qwen2 in scripts/gpu_check.sh step 4)
#   seed_bf16        8  256 2 bf16   the same under MixedPrecision(param_dtype=reduce_dtype=bfloat16), both sides
#   throughput_bf16 16 1024 1 bf16   a throughput setting: longer sequences, the GEMMs large enough to fill the GPU
# GPU_BENCH_SETTINGS="name MBS SEQ ACC MP; ..." replaces the list; GPU_BENCH_STEPS (default 5) the steps per run.
# Per setting it prints (scripts/gpu_bench_report.py; all in OUT_DIR/gpu_bench.txt): the median step time of steps
# 2.. of each side and fsdplab / torch, TFLOP/s achieved (qwen2_tool flops: the matmul FLOP of a micro-batch, forward
# and backward, attention included, times ACC) and % of the GPU's dense peak, each side's peak memory and the ratio,
# and a table of where fsdplab's time goes: rank 0's trace (compute spans per piece kind and phase, waits per stream,
# blocking collectives, the untraced rest), per step. For the settings GPU_BENCH_PROFILE names (default: seed_bf16;
# empty: none) fsdplab runs once more, alone, 3 steps, with PROFILE_KERNELS=1 (core/cuda/kernel_profile.h): the GPU
# time of each kernel, GEMM and copy per step, its largest 25 rows and the total in the summary (about 30 s a setting).
#
# The peaks are scripts/gpu_env.sh's (gpu_peaks: NVIDIA's datasheets, dense; H100/H200 SXM 989 bfloat16, 67 float32,
# 494 TF32 with ALLOW_TF32=1; PEAK_TFLOPS_FP32 / PEAK_TFLOPS_BF16 for any other GPU, or the % column says unknown).
# The libraries a bare GPU machine lacks come from the bundle there too (gpu_env_setup, as gpu_check.sh's step 0).
#
# GPU_BENCH_DRY_RUN=1 runs the whole script here, without a GPU, to find the script's own mistakes before GPU time is
# spent on them: the tiny model, small batches (GPU_BENCH_SETTINGS's dry default below), 3 steps, train.sh on
# BACKEND=gloo (fsdplab's CPU build, torch on gloo), the peak unknown; the report's format is the same, and the run
# fails when a table is missing a row. Its numbers say nothing about a GPU.
# Exit status 0 only when every setting ran on both sides and printed its table.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/gpu_bench.sh OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
dry=${GPU_BENCH_DRY_RUN:-0}
if [ "$dry" = 1 ]; then
  backend=gloo model=tiny steps=${GPU_BENCH_STEPS:-3}
  settings=${GPU_BENCH_SETTINGS:-"seed_fp32 2 32 2 fp32; seed_bf16 2 32 2 bf16; throughput_bf16 4 64 1 bf16"}
else
  backend=nccl model=qwen2 steps=${GPU_BENCH_STEPS:-5}
  settings=${GPU_BENCH_SETTINGS:-"seed_fp32 8 256 2 fp32; seed_bf16 8 256 2 bf16; throughput_bf16 16 1024 1 bf16"}
fi
summary=$out/gpu_bench.txt
: >"$summary"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
# each run under GPU_BENCH_RUN_TIMEOUT seconds, and none past GPU_BENCH_DEADLINE (epoch seconds; scripts/gpu_lease.sh
# sets it): a setting with under GPU_BENCH_MIN_SECONDS (default 60) left is skipped and said so, not failed
run_seconds() { gpu_seconds "${GPU_BENCH_DEADLINE:-}" "${GPU_BENCH_RUN_TIMEOUT:-600}"; } # scripts/gpu_env.sh's
time_left() {
  [ -z "${GPU_BENCH_DEADLINE:-}" ] || [ $((GPU_BENCH_DEADLINE - $(date +%s))) -ge "${GPU_BENCH_MIN_SECONDS:-60}" ]
}

# the libraries (or the bundle's) and the CUDA homes; the peaks
. scripts/gpu_env.sh
if ! gpu_env_setup 2>"$out/environment.log"; then
  echo "gpu_bench: FAIL environment: $(cat "$out/environment.log")" | tee -a "$summary"
  exit 1
fi
gpu_peaks
echo "gpu_bench: ${gpu_name:-no GPU (nvidia-smi lists none)}; model $model, BACKEND=$backend, $steps steps;" \
  "$(date -u)" | tee -a "$summary"

# the CPU build: qwen2_tool's FLOP count needs no device (train.sh builds the CUDA build itself for BACKEND=nccl); a
# make of its own, not a caller's jobserver (make check runs the dry run)
if ! env -u MAKEFLAGS -u MAKELEVEL make -j"$(nproc)" >"$out/build.log" 2>&1; then
  echo "gpu_bench: make failed: see $out/build.log" | tee -a "$summary"
  exit 1
fi
failures=0
IFS=';' read -r -a setting_list <<<"$settings"
for setting in "${setting_list[@]}"; do
  read -r name mbs seq acc mp <<<"$setting"
  [ -n "${name:-}" ] || continue
  dir=$out/$name
  label="$name: MODEL=$model MBS=$mbs SEQ=$seq ACC=$acc MP=$mp"
  if ! time_left; then
    echo "$label: SKIPPED, $((GPU_BENCH_DEADLINE - $(date +%s))) s left before GPU_BENCH_DEADLINE" | tee -a "$summary"
    continue
  fi
  env PROCESSES=1 FSDP=both BACKEND=$backend MODEL=$model MBS=$mbs SEQ=$seq ACC=$acc MP=$mp STEPS=$steps EVAL=0 \
    TRAIN_DIR="$dir" timeout --kill-after=10 "$(run_seconds)" scripts/train.sh >"$out/$name.log" 2>&1
  status=$?
  micro_flop=$(OUT="$out/flops" tests/bin/qwen2_tool flops $model $mbs $seq | awk '/^step_flops/ {print $2}')
  if [ "$mp" = fp32 ]; then peak=$peak_fp32 peak_name="$fp32_name $peak_fp32 TFLOP/s"
  else peak=$peak_bf16 peak_name="BF16 $peak_bf16 TFLOP/s"; fi
  [ "$peak" = 0 ] && peak_name="unknown (PEAK_TFLOPS_FP32 / PEAK_TFLOPS_BF16)"
  if [ $status != 0 ]; then
    echo "$label: FAIL train.sh exited $status (see $out/$name.log)" | tee -a "$summary"
    failures=$((failures + 1))
  elif ! python3 scripts/gpu_bench_report.py "$dir" "$label" "$(awk -v f="${micro_flop:-0}" -v a="$acc" \
    'BEGIN {printf "%.0f", f * a}')" "$peak" "$peak_name" | tee -a "$summary"; then
    failures=$((failures + 1))
  fi
  if [ "$dry" != 1 ] && [[ " ${GPU_BENCH_PROFILE-seed_bf16} " == *" $name "* ]] && time_left; then
    profile_dir=$out/${name}_profile
    table=$profile_dir/fsdplab/kernels_rank0.txt
    env PROFILE_KERNELS=1 PROCESSES=1 FSDP=fsdplab BACKEND=$backend MODEL=$model MBS=$mbs SEQ=$seq ACC=$acc MP=$mp \
      STEPS=3 EVAL=0 TRAIN_DIR="$profile_dir" timeout --kill-after=10 "$(run_seconds)" scripts/train.sh \
      >"$out/${name}_profile.log" 2>&1
    if [ -f "$table" ]; then
      { echo "$name: fsdplab's GPU time per kernel, GEMM and copy (PROFILE_KERNELS=1; every row: $table)"
        awk 'NR >= 2 && (NR <= 28 || /^total /)' "$table"; } | tee -a "$summary"
    else
      echo "$name: FAIL PROFILE_KERNELS=1 wrote no $table (see $out/${name}_profile.log)" | tee -a "$summary"
      failures=$((failures + 1))
    fi
  fi
done
echo "gpu_bench: $failures failed; logs and traces in $out" | tee -a "$summary"
[ "$failures" = 0 ]
