#!/usr/bin/env bash
# One training run, with fsdplab's FSDP or PyTorch's, printing the same lines so they can be compared.
#
#   PROCESSES=2 MODEL=tiny MBS=16 ACC=2 STEPS=3 EVAL=0 FSDP=fsdplab ./scripts/train.sh
#   ... FSDP=torch ./scripts/train.sh       PyTorch FSDP1 (FullyShardedDataParallel) on HF's Qwen2ForCausalLM
#   ... FSDP=torch FSDP_VERSION=2 ./scripts/train.sh   PyTorch FSDP2 (fully_shard, each parameter Shard(0)) instead
#   ... FSDP=both  ./scripts/train.sh       both, then a side-by-side table: loss difference, time and peak ratios
#
# Settings (environment): PROCESSES (ranks), FSDP (fsdplab, edufsdp = fsdplab, torch, both), BACKEND (mpi or gloo: the
# CPU; nccl: one GPU per rank, fsdplab's CUDA build (make CUDA=1, built here on demand into build/cuda/) and torch on
# cuda:LOCAL_RANK with NCCL), MODEL (tiny, qwen2-0.5b; qwen2 is the same), MBS, ACC, STEPS, SEQ, LR, SEED, DATA,
# STRATEGY, CLIP, SHARD_GROUP (HYBRID_SHARD and _HYBRID_SHARD_ZERO2: ranks per shard group; default the ranks per node,
# for both), EVAL (fsdplab: print a generated story every EVAL steps), MP (mixed precision as torch's MixedPrecision,
# both sides: fp32 off, bf16, bf16,reduce=fp32), BACKWARD_PREFETCH (NONE, BACKWARD_PRE: torch's default, BACKWARD_POST),
# FORWARD_PREFETCH and LIMIT_ALL_GATHERS (0/1; torch's defaults 0 and 1), FORWARD_PREFETCH_MODULES and
# BACKWARD_PREFETCH_MODULES (FSDP_VERSION=2: fully_shard's explicit lists over the layers, both sides), COMM_STREAMS
# (fsdplab only: 1, collectives on their own streams as torch's; 0, every collective blocks, as lab 05 runs by default),
# OFFLOAD (0/1: fsdplab's CPUOffload(offload_params=True); torch's needs CUDA, so the CPU torch run keeps its parameters
# in place, which computes the same numbers: offload is exact), CONFIG (model fields by HF name, for both), RUSAGE (a
# path prefix: <prefix>.fsdplab / <prefix>.torch get "user_s sys_s wall_s" of the launched ranks, mpirun or torchrun and
# their children, from /usr/bin/time; benchmarks read it), TORCH_GRADS (a directory: the torch run writes step 1's
# gradients there as model.safetensors, as lab 05's GRADS does for fsdplab), TORCH_PARAMS (a directory: the torch run
# writes the parameters after the last step there as model.safetensors), FSDP_VERSION (1: torch's FSDP1,
# FullyShardedDataParallel's flat parameters; 2: FSDP2, fully_shard on each decoder layer and the root, FULL_SHARD or
# SHARD_GRAD_OP only; exported to lab 05 as FSDP_VERSION). Both implementations start from the same bytes (fsdplab's
# initialisation, saved as an HF checkpoint) and read the same token windows per rank per step; runs/train/ keeps their
# outputs.
set -euo pipefail
cd "$(dirname "$0")/.."

PROCESSES=${PROCESSES:-2}
FSDP=${FSDP:-fsdplab}
BACKEND=${BACKEND:-mpi}
export MODEL=${MODEL:-tiny} MBS=${MBS:-4} ACC=${ACC:-2} STEPS=${STEPS:-3} SEQ=${SEQ:-128} LR=${LR:-1e-3}
export SEED=${SEED:-1234} STRATEGY=${STRATEGY:-FULL_SHARD} CLIP=${CLIP:-0} EVAL=${EVAL:-0} DATA=${DATA:-}
export CONFIG=${CONFIG:-}
# Mixed precision, torch's MixedPrecision for both sides: fp32 (off), bf16 (param and reduce), bf16,reduce=fp32, ...
export MP=${MP:-fp32}
# torch's FullyShardedDataParallel defaults, for both sides (lab 05 alone runs blocking; lab 06 teaches these)
export BACKWARD_PREFETCH=${BACKWARD_PREFETCH:-BACKWARD_PRE} FORWARD_PREFETCH=${FORWARD_PREFETCH:-0}
export LIMIT_ALL_GATHERS=${LIMIT_ALL_GATHERS:-1} COMM_STREAMS=${COMM_STREAMS:-1}
# FSDP2's explicit prefetch lists over the decoder layers (FSDP_VERSION=2), both sides
export FORWARD_PREFETCH_MODULES=${FORWARD_PREFETCH_MODULES:-0} BACKWARD_PREFETCH_MODULES=${BACKWARD_PREFETCH_MODULES:-0}
# CPUOffload(offload_params=True) (lab 09): shards, gradients and optimizer state in host memory; fsdplab only
export OFFLOAD=${OFFLOAD:-0}
# torch's FSDP1 (FullyShardedDataParallel) or FSDP2 (fully_shard); lab 05 gets it as FSDP_VERSION too
export FSDP_VERSION=${FSDP_VERSION:-1}
work=${TRAIN_DIR:-runs/train}
RUSAGE=${RUSAGE:-}

fail() { echo "train.sh: error: $*" >&2; exit 2; }
case "$FSDP" in
  fsdplab | edufsdp | torch | both) ;;
  *) fail "FSDP='$FSDP' is not allowed; choose one of: fsdplab, edufsdp, torch, both" ;;
esac
case "$BACKEND" in
  mpi | gloo) ;;
  nccl) ;;
  *) fail "BACKEND='$BACKEND' is not allowed; choose one of: mpi, gloo, nccl" ;;
esac
# BACKEND=nccl: fsdplab's CUDA build, one GPU per rank (NCCL refuses two ranks on one GPU: lab 05 says so and names
# DEVICE=cuda BACKEND=mpi, which shares one). Checked before anything builds: a machine without a GPU or without the
# CUDA toolkit gets one line that says which.
lab=lab/05_full_step
if [ "$BACKEND" = nccl ]; then
  have_gpu=0
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then have_gpu=1; fi
  [ "$have_gpu" = 1 ] || fail "BACKEND=nccl needs an NVIDIA GPU and none is visible here (nvidia-smi -L lists none);" \
    "use BACKEND=mpi or gloo on the CPU"
  if [ "$FSDP" != torch ]; then
    nvcc_bin=${CUDA_HOME:-/usr/local/cuda}/bin/nvcc
    command -v nvcc >/dev/null 2>&1 || [ -x "$nvcc_bin" ] ||
      fail "BACKEND=nccl needs fsdplab's CUDA build, and the CUDA toolkit (nvcc) is not installed here" \
        "(CUDA_HOME=${CUDA_HOME:-/usr/local/cuda})"
    make -s CUDA=1 >/dev/null || fail "the CUDA build (make CUDA=1) failed; run it to see why"
    lab=build/cuda/lab/05_full_step
    export DEVICE=cuda
  fi
fi
export BACKEND
[[ "$PROCESSES" =~ ^[1-9][0-9]*$ ]] || fail "PROCESSES='$PROCESSES' is not a positive integer"
case "$FSDP_VERSION" in
  1 | 2) ;;
  *) fail "FSDP_VERSION='$FSDP_VERSION' is not allowed; choose one of: 1 (FullyShardedDataParallel), 2 (fully_shard)" ;;
esac
# The grammar of MP (core/fsdp/fsdp.h fsdp_mixed_precision_parse), checked here so the torch side gets only what lab 05
# takes.
dtype_re='(bf16|bfloat16|fp32|float32)'
mp_setting_re=",reduce=$dtype_re|,buffer=(fp32|float32)|,keep_low_precision_grads=[01]|,output=$dtype_re"
[[ "$MP" =~ ^(none|$dtype_re($mp_setting_re)*)$ ]] ||
  fail "MP='$MP' is not allowed; choose fp32 (off), bf16, or" \
    "<param_dtype>[,reduce=<dtype>][,buffer=fp32][,keep_low_precision_grads=0|1][,output=<dtype>] with dtypes bf16" \
    "or fp32, e.g. bf16,reduce=fp32 (output: FSDP_VERSION=2's output_dtype)"
# FSDP2 on the torch side: fully_shard has FULL_SHARD and SHARD_GRAD_OP (reshard_after_forward True, False) and no
# keep_low_precision_grads; torch_fsdp_train.py refuses the rest, said here before anything is built or launched.
if [ "$FSDP_VERSION" = 2 ] && { [ "$FSDP" = torch ] || [ "$FSDP" = both ]; }; then
  case "$STRATEGY" in
    FULL_SHARD | SHARD_GRAD_OP) ;;
    *) fail "STRATEGY='$STRATEGY' with FSDP_VERSION=2: torch's fully_shard has FULL_SHARD and SHARD_GRAD_OP;" \
      "$STRATEGY is FSDP1's (FSDP_VERSION=1)" ;;
  esac
  [[ "$MP" != *keep_low_precision_grads=1* ]] ||
    fail "MP='$MP' with FSDP_VERSION=2: fully_shard has no keep_low_precision_grads; use FSDP_VERSION=1"
fi
# The same names core/models/qwen2.c accepts (qwen2, the name in the PyTorch FSDP training script whose command line
# this script keeps, is Qwen2-0.5B); checked here so a typo fails before make.
case "$MODEL" in
  tiny | qwen2-0.5b | qwen2) ;;
  *) fail "MODEL='$MODEL' is not a model; choose one of: qwen2-0.5b (or qwen2), tiny" ;;
esac

mpirun_flags=()
[ "$(id -u)" = 0 ] && mpirun_flags+=(--allow-run-as-root)
[ "$PROCESSES" -gt "$(nproc)" ] && mpirun_flags+=(--oversubscribe)
make -s lab/05_full_step tests/bin/qwen2_tool >/dev/null
mkdir -p "$work"

# timed IMPL COMMAND...: the command, under /usr/bin/time when RUSAGE asks for its CPU seconds.
timed() {
  local impl=$1
  shift
  if [ -z "$RUSAGE" ]; then "$@"; return; fi
  [ -x /usr/bin/time ] || fail "RUSAGE needs /usr/bin/time (Debian/Ubuntu package: time)"
  /usr/bin/time -f '%U %S %e' -o "$RUSAGE.$impl" "$@"
}

run_fsdplab() {
  OUT="$work/fsdplab" timed fsdplab mpirun "${mpirun_flags[@]}" -np "$PROCESSES" "$lab"
}

run_torch() {
  python3 -c "import torch, transformers" 2>/dev/null ||
    fail "FSDP=torch needs torch and transformers (scripts/install_deps.sh installs them)"
  [ "$EVAL" = 0 ] || echo "(EVAL applies to fsdplab only; the torch run does not generate)" >&2
  [ "$OFFLOAD" = 0 ] || echo "(OFFLOAD applies to fsdplab only: torch's CPUOffload needs a CUDA device)" >&2
  local model_dir="$work/torch/init" batches="$work/torch/batches.bin"
  mkdir -p "$work/torch"
  # fsdplab's own initialisation as an HF checkpoint, and the global micro-batches lab 05 reads: the CPU build's tool,
  # on the CPU whatever BACKEND the runs use (BACKEND=nccl would choose DEVICE=cuda, which that build has not)
  local tool=(env BACKEND=mpi DEVICE=cpu OUT="$work/torch/tool" tests/bin/qwen2_tool)
  "${tool[@]}" init "$MODEL" "$SEED" "$model_dir" ${CONFIG:+"$CONFIG"} >/dev/null
  "${tool[@]}" batches "$SEED" $((MBS * PROCESSES)) "$SEQ" $((STEPS * ACC)) "$batches" ${DATA:+"$DATA"}
  # torchrun, as its module (a python3 without torchrun's script on PATH runs it too)
  OMP_NUM_THREADS=1 timed torch python3 -m torch.distributed.run --standalone --nproc_per_node "$PROCESSES" \
    scripts/torch_fsdp_train.py \
    --model-dir "$model_dir" --batches "$batches" --mbs "$MBS" --seq "$SEQ" --acc "$ACC" --steps "$STEPS" \
    --lr "$LR" --clip "$CLIP" --strategy "$STRATEGY" --shard-group "${SHARD_GROUP:-0}" \
    --backward-prefetch "$BACKWARD_PREFETCH" \
    --forward-prefetch "$FORWARD_PREFETCH" --limit-all-gathers "$LIMIT_ALL_GATHERS" --mp "$MP" \
    --backend "$([ "$BACKEND" = nccl ] && echo nccl || echo gloo)" --grads "${TORCH_GRADS:-}" \
    --params "${TORCH_PARAMS:-}" --fsdp-version "$FSDP_VERSION" \
    --forward-prefetch-modules "$FORWARD_PREFETCH_MODULES" --backward-prefetch-modules "$BACKWARD_PREFETCH_MODULES" \
    2> "$work/torch/stderr.log" ||
    { tail -n 20 "$work/torch/stderr.log" >&2; exit 1; }
}

case "$FSDP" in
  fsdplab | edufsdp) run_fsdplab ;;
  torch) run_torch ;;
  both)
    # the same measure on both sides: process max RSS on the CPU; on the GPU the tracked device peak, beside torch's
    # torch.cuda.max_memory_allocated()
    if [ "$BACKEND" = nccl ]; then
      run_fsdplab | tee "$work/fsdplab.log"
    else
      PEAK=rss run_fsdplab | tee "$work/fsdplab.log"
    fi
    echo
    run_torch | tee "$work/torch.log"
    echo
    python3 scripts/compare_runs.py "$work/fsdplab.log" "$work/torch.log" $([ "$BACKEND" = nccl ] && echo --gpu)
    ;;
esac
