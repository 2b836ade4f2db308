#!/usr/bin/env bash
# The one script to run on a GPU machine: builds fsdplab's CUDA backend and checks it against the CPU and PyTorch.
#
#   scripts/gpu_check.sh OUT_DIR        (from the repository root or anywhere; OUT_DIR gets every log and trace)
#
# Steps, each logged to OUT_DIR/<step>.log and summed up in OUT_DIR/gpu_check.txt (PASS / FAIL per line):
#   0. environment (scripts/gpu_env.sh's gpu_env_setup): OpenMPI, cJSON, Check, OpenBLAS, PCRE2, utf8proc from the
#      system, or else from the Debian packages scripts/gpu_bundle.sh packed into .gpu_bundle/ (GPU_BUNDLE=DIR to name
#      another), unpacked into a private root; NCCL and cuBLAS from the CUDA toolkit (CUDA_HOME, default
#      /usr/local/cuda) or pip's nvidia-* packages
#   1. build: `make` (the CPU reference) and `make CUDA=1` (build/cuda/)
#   2. layers: tests/bin/gpu_layers, every device function (each layer's forward and backward, the vectors, AdamW) on
#      the GPU against the CPU on random inputs, each within a bound derived in tests/gpu_layers.c
#   3. tiny model, 5 steps, 1 rank: DEVICE=cuda BACKEND=nccl vs the CPU build from the same init and batches; losses
#      (tests/compare_losses.py), gradients and parameters (qwen2_tool compare) within tests/tolerances.py's bounds,
#      the same bounds that hold 1 rank against N ranks on the CPU (float32 sums in another order, TF32 off)
#      then the same with MP=bf16 (the device's bfloat16 layers: cuBLAS GEMMs on bfloat16 tensor cores) against the
#      CPU's core/kernels/layers_bf16.c: losses within the bfloat16 flip bound and drift (compare_losses.py bf16),
#      parameters within AdamW's bound
#   4. Qwen2-0.5B, MBS=8 SEQ=256 ACC=2 STEPS=3 (train.sh's default run): BACKEND=nccl on 1 rank beside PyTorch FSDP on
#      the same GPU, same init and batches (scripts/train.sh FSDP=both: the table of loss difference, time and peak
#      ratios), in float32, then with MP=bf16 beside torch's MixedPrecision(param_dtype=reduce_dtype=bfloat16) (the
#      bounds of check_train_parity.sh bf16), then DEVICE=cuda BACKEND=mpi on 2 ranks sharing the GPU (MPI through
#      pinned host buffers)
#   5. throughput: tokens/s, achieved TFLOP/s and MFU of step 4's runs (qwen2_tool flops: the matmul count, 3 x
#      forward, attention included), against the GPU's dense peak (gpu_env.sh's gpu_peaks: H100 and H200 SXM 67 and
#      989, H100 PCIe 51 and 756, A100 19.5 and 312; PEAK_TFLOPS_FP32 / PEAK_TFLOPS_BF16 for others)
# Budget: 6 minutes 10 s on one H200 (2026-12-04: the build 21 s, torch's start-up and loading most of the rest).
# Exit status 0 only when every step passed.
#
# GPU_CHECK_DRY_RUN=1 runs the same script here, without a GPU, to find the script's own mistakes before GPU time is
# spent on them: the CUDA build is the emulator's (make CUDA=emulated, tests/cuda_emulator/), our GPU runs are
# DEVICE=cuda BACKEND=mpi on it, the runs are small (the tiny model in step 4 too, with torch on gloo and fsdplab's
# CPU build there: train.sh's BACKEND=nccl needs a GPU), and the peaks are PEAK_TFLOPS_* or unknown. Its numbers say
# nothing about a GPU; its PASS lines say the script's steps and comparisons run.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/gpu_check.sh OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
dry=${GPU_CHECK_DRY_RUN:-0}
if [ "$dry" = 1 ]; then
  cuda_make=CUDA=emulated cuda_bin=build/cuda_emulated gpu_backend=mpi train_backend=gloo gpu_flag=
  tiny_steps=2 tiny_mbs=2 tiny_seq=32 q_model=tiny q_mbs=2 q_seq=32 q_label="tiny (dry run)"
else
  cuda_make=CUDA=1 cuda_bin=build/cuda gpu_backend=nccl train_backend=nccl gpu_flag=--gpu
  tiny_steps=5 tiny_mbs=8 tiny_seq=128 q_model=qwen2 q_mbs=8 q_seq=256 q_label=Qwen2-0.5B
fi
summary=$out/gpu_check.txt
q_tokens=$((q_mbs * q_seq * 2)) qdir=$out/qwen2_nccl bdir=$out/qwen2_nccl_bf16 # step 4's runs, step 5's inputs
: >"$summary"
failures=0
t0=$(date +%s)
say() { echo "$*" | tee -a "$summary"; }
# GPU_CHECK_STEPS="2 3": only those of steps 2-5 (0 and 1, the environment and the build, always run)
want() { [ -z "${GPU_CHECK_STEPS:-}" ] || [[ " $GPU_CHECK_STEPS " == *" $1 "* ]]; }
result() { # result NAME STATUS DETAIL
  local verdict=PASS
  [ "$2" = 0 ] || { verdict=FAIL; failures=$((failures + 1)); }
  say "$(printf '%-4s %-58s %s  (%ds)' "$verdict" "$1" "$3" $(($(date +%s) - t0)))"
}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
# each run under a time limit (GPU_CHECK_STEP_TIMEOUT seconds, default 300): a hang fails its step, not the lease
limit=(timeout --kill-after=10 "${GPU_CHECK_STEP_TIMEOUT:-300}")
mpirun_cmd=("${limit[@]}" mpirun --oversubscribe)

# ---- 0. environment (scripts/gpu_env.sh: the bundle's libraries where the system lacks them, the CUDA homes)
. scripts/gpu_env.sh
if ! gpu_env_setup 2>"$out/environment_setup.log"; then
  say "FAIL environment: $(cat "$out/environment_setup.log")"
  exit 1
fi
cuda_home=$CUDA_HOME
{
  echo "date: $(date -u)"; nvidia-smi -L 2>&1; nvcc --version 2>&1 | tail -n 2; mpicc --version 2>&1 | head -n 1
  echo "CUDA_HOME=$cuda_home NCCL_HOME=${NCCL_HOME:-$cuda_home} CUBLAS_HOME=${CUBLAS_HOME:-$cuda_home}"
  ls "${NCCL_HOME:-$cuda_home}"/lib*/libnccl* "${CUBLAS_HOME:-$cuda_home}"/lib*/libcublas.so* 2>&1
  python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda)' 2>&1
} >"$out/environment.log"
say "environment: $(nvidia-smi -L 2>/dev/null | head -n 1 || echo 'no nvidia-smi');" \
  "$(grep -m1 ^torch "$out/environment.log")"

# ---- 1. build
jobs=$(nproc)
if make -j"$jobs" >"$out/build_cpu.log" 2>&1 && make -j"$jobs" $cuda_make >"$out/build_cuda.log" 2>&1 &&
  { [ "$dry" != 1 ] || make -j"$jobs" $cuda_make $cuda_bin/tests/bin/gpu_layers >>"$out/build_cuda.log" 2>&1; }; then
  result "build: make and make $cuda_make" 0 ""
else
  result "build: make and make $cuda_make" 1 "see build_cpu.log / build_cuda.log"
  exit 1
fi

# ---- 2. every layer on the GPU vs the CPU
if want 2; then
  "${limit[@]}" "$cuda_bin/tests/bin/gpu_layers" >"$out/layers.log" 2>&1
  result "layers: GPU vs CPU, forward and backward" $? \
    "$(grep -c PASS "$out/layers.log") pass, $(grep -c FAIL "$out/layers.log") fail"
fi

# ---- 3. tiny model, 5 steps: GPU vs CPU
if want 3; then
  tiny=(MODEL=tiny STEPS=$tiny_steps ACC=2 SEQ=$tiny_seq LR=1e-3 MBS=$tiny_mbs SEED=1234)
  tiny_tokens=$((tiny_mbs * tiny_seq * 2))
  # tiny_runs NAME ENV...: the CPU build's lab 05 into OUT_DIR/NAME_cpu, the CUDA build's into NAME_gpu (each with its
  # checkpoint and step-1 gradients, log beside); the status is non-zero when either failed
  tiny_runs() {
    local name=$1 cpu_status
    shift
    env "${tiny[@]}" "$@" OUT="$out/${name}_cpu" SAVE="$out/${name}_cpu/checkpoint" GRADS="$out/${name}_cpu/grads" \
      "${mpirun_cmd[@]}" -np 1 lab/05_full_step >"$out/${name}_cpu.log" 2>&1
    cpu_status=$?
    env "${tiny[@]}" "$@" DEVICE=cuda BACKEND=$gpu_backend OUT="$out/${name}_gpu" \
      SAVE="$out/${name}_gpu/checkpoint" GRADS="$out/${name}_gpu/grads" \
      "${mpirun_cmd[@]}" -np 1 "$cuda_bin/lab/05_full_step" >"$out/${name}_gpu.log" 2>&1
    return $((cpu_status | $?))
  }
  tiny_runs tiny
  status=$?
  if [ $status = 0 ]; then
    config=$out/tiny_cpu/grads/config.json
    python3 tests/compare_losses.py "$out/tiny_cpu" "$out/tiny_gpu" $tiny_tokens $tiny_seq 1e-3 \
      >"$out/tiny_compare.log" 2>&1 &&
      OUT="$out/compare" tests/bin/qwen2_tool compare "$out/tiny_gpu/grads" "$out/tiny_cpu/grads" \
        "$(python3 tests/tolerances.py gradients "$config" $tiny_tokens $tiny_seq)" relative \
        >>"$out/tiny_compare.log" 2>&1 &&
      OUT="$out/compare" tests/bin/qwen2_tool compare "$out/tiny_gpu/checkpoint" "$out/tiny_cpu/checkpoint" \
        "$(python3 tests/tolerances.py adamw 1e-3 $tiny_steps)" absolute >>"$out/tiny_compare.log" 2>&1 &&
      python3 tests/check_memory_model.py "$out/tiny_gpu.log" >>"$out/tiny_compare.log" 2>&1
    status=$?
  fi
  result "tiny $tiny_steps steps: GPU losses, gradients, parameters = CPU's; memory model" $status \
    "$(grep -m1 -i 'bound' "$out/tiny_compare.log" 2>/dev/null)"

  # ---- 3b. the same in bfloat16 (MP=bf16): the GPU's bfloat16 layers vs core/kernels/layers_bf16.c
  tiny_runs tiny_bf16 MP=bf16
  status=$?
  if [ $status = 0 ]; then
    python3 tests/compare_losses.py "$out/tiny_bf16_cpu" "$out/tiny_bf16_gpu" $tiny_tokens $tiny_seq 1e-3 bf16 \
      >"$out/tiny_bf16_compare.log" 2>&1 &&
      OUT="$out/compare" tests/bin/qwen2_tool compare "$out/tiny_bf16_gpu/checkpoint" "$out/tiny_bf16_cpu/checkpoint" \
        "$(python3 tests/tolerances.py adamw 1e-3 $tiny_steps)" absolute >>"$out/tiny_bf16_compare.log" 2>&1 &&
      python3 tests/check_memory_model.py "$out/tiny_bf16_gpu.log" >>"$out/tiny_bf16_compare.log" 2>&1
    status=$?
  fi
  result "tiny $tiny_steps steps MP=bf16: GPU losses, parameters = CPU's; memory" $status \
    "$(grep -m1 -i 'bound' "$out/tiny_bf16_compare.log" 2>/dev/null)"
fi

# ---- 4. Qwen2-0.5B, train.sh's default run: fsdplab (NCCL, 1 rank) beside PyTorch FSDP on the same GPU
# Losses within the bounds tests/check_train_parity.sh uses on the CPU (tests/tolerances.py: rounding of the first
# step from the same bytes, plus AdamW's drift per later step), derived from this config and its gradients.
if want 4; then
  seed_run=(PROCESSES=1 MODEL=$q_model MBS=$q_mbs SEQ=$q_seq ACC=2 STEPS=3 EVAL=0 BACKEND=$train_backend)
  env "${seed_run[@]}" FSDP=both TRAIN_DIR="$qdir" GRADS="$qdir/grads" "${limit[@]}" scripts/train.sh \
    >"$out/qwen2_nccl.log" 2>&1
  status=$?
  if [ $status = 0 ]; then
    python3 scripts/compare_runs.py "$qdir/fsdplab.log" "$qdir/torch.log" $gpu_flag \
      --max-loss-diff "$(python3 tests/tolerances.py loss "$qdir/grads/config.json" $q_tokens $q_seq)" \
      --drift "$(python3 tests/tolerances.py drift "$qdir/grads" $q_tokens $q_seq 1e-3)" \
      >"$out/qwen2_compare.log" 2>&1 &&
      python3 tests/check_memory_model.py "$qdir/fsdplab.log" >>"$out/qwen2_compare.log" 2>&1
    status=$?
  fi
  result "$q_label BACKEND=$train_backend 1 rank vs torch FSDP (losses, time, peak)" $status \
    "$(grep -m1 -E "^(OK|FAIL)" "$out/qwen2_compare.log" 2>/dev/null)"
  cat "$qdir/fsdplab.log" "$qdir/torch.log" "$out/qwen2_compare.log" 2>/dev/null |
    grep -E '^[0-9]+/[0-9]+: Loss|^ *[0-9]+ |ratio' |
    tee -a "$summary" >/dev/null
  # MP=bf16 beside torch's MixedPrecision: check_train_parity.sh bf16's bounds (the flip bound of the first step, lr x
  # the measured step-1 gradient difference per later step; torch writes its gradients with TORCH_GRADS)
  env "${seed_run[@]}" MP=bf16 FSDP=both TRAIN_DIR="$bdir" GRADS="$bdir/grads" TORCH_GRADS="$bdir/torch_grads" \
    "${limit[@]}" scripts/train.sh >"$out/qwen2_nccl_bf16.log" 2>&1
  status=$?
  if [ $status = 0 ]; then
    drift=$(python3 tests/tolerances.py torch_bf16_drift "$bdir/grads" "$bdir/torch_grads" 1e-3 \
      2>"$out/qwen2_bf16_compare.log") &&
      python3 scripts/compare_runs.py "$bdir/fsdplab.log" "$bdir/torch.log" $gpu_flag --drift "$drift" \
        --max-loss-diff "$(python3 tests/tolerances.py torch_bf16_loss "$bdir/grads/config.json" $q_tokens $q_seq)" \
        >>"$out/qwen2_bf16_compare.log" 2>&1 &&
      python3 tests/check_memory_model.py "$bdir/fsdplab.log" >>"$out/qwen2_bf16_compare.log" 2>&1
    status=$?
  fi
  result "$q_label MP=bf16 BACKEND=$train_backend vs torch MixedPrecision" $status \
    "$(grep -m1 -E "^(OK|FAIL)" "$out/qwen2_bf16_compare.log" 2>/dev/null)"
  cat "$bdir/fsdplab.log" "$bdir/torch.log" "$out/qwen2_bf16_compare.log" 2>/dev/null |
    grep -E '^[0-9]+/[0-9]+: Loss|^ *[0-9]+ |ratio' | tee -a "$summary" >/dev/null
  env MODEL=$q_model MBS=$q_mbs SEQ=$q_seq ACC=2 STEPS=3 EVAL=0 DEVICE=cuda BACKEND=mpi OUT="$out/qwen2_mpi2" \
    "${mpirun_cmd[@]}" -np 2 "$cuda_bin/lab/05_full_step" >"$out/qwen2_mpi2.log" 2>&1
  status=$?
  if [ $status = 0 ]; then
    python3 tests/check_memory_model.py "$out/qwen2_mpi2.log" >"$out/qwen2_mpi2_memory.log" 2>&1
    status=$?
  fi
  result "$q_label DEVICE=cuda BACKEND=mpi, 2 ranks on one GPU" $status "$(grep -m1 '^3/3' "$out/qwen2_mpi2.log")"
fi

# ---- 5. throughput of step 4's runs (ours and torch's): tokens/s, achieved TFLOP/s (median step time of steps 2-3),
# MFU against the dense peak of the run's arithmetic (float32 CUDA cores; bfloat16 tensor cores)
if want 5; then
  flops_per_micro=$(OUT="$out/flops" tests/bin/qwen2_tool flops $q_model $q_mbs $q_seq | awk '/^step_flops/ {print $2}')
  gpu_peaks
  for run in "fp32 fsdplab $qdir/fsdplab.log $peak_fp32" "fp32 torch $qdir/torch.log $peak_fp32" \
    "bf16 fsdplab $bdir/fsdplab.log $peak_bf16" "bf16 torch $bdir/torch.log $peak_bf16"; do
    python3 - $run "$flops_per_micro" $q_tokens <<'PY' | tee -a "$summary"
import re, statistics, sys
precision, side, path, peak = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
flops_per_micro, tokens = float(sys.argv[5]), int(sys.argv[6])  # tokens: MBS x SEQ x ACC, one rank
try:
    lines = [l for l in open(path) if re.match(r"\d+/\d+: Loss", l)]
except OSError:
    lines = []
times = [float(re.search(r"Time = ([0-9.]+)s", l).group(1)) for l in lines][1:]
if not times:
    sys.exit(f"throughput {precision} {side}: no step lines in {path}")
step = statistics.median(times)
flops = flops_per_micro * 2
achieved = flops / step / 1e12
mfu = f", MFU {100 * achieved / peak:.1f}% of {peak:g} TFLOP/s" if peak > 0 else ", MFU: peak unknown (PEAK_TFLOPS_*)"
print(f"throughput {precision} {side}: {tokens / step:,.0f} tokens/s, {achieved:.1f} TFLOP/s achieved{mfu} "
      f"({flops / 1e12:.2f} TFLOP per step, step {step:.3f} s)")
PY
  done
fi

say "gpu_check: $failures failed, $(($(date +%s) - t0)) s; logs and traces in $out"
[ "$failures" = 0 ]
