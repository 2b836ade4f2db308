# The CUDA device without a GPU: every program built on the CUDA emulator (make CUDA=emulated into
# build/cuda_emulated/: core/cuda/cuda_device.c, cuda_stream.c, kernels.cu, cuda_ops.cu and the runtime with
# FSDPLAB_CUDA, against tests/cuda_emulator/'s CUDA runtime and cuBLAS), then lab 05 with DEVICE=cuda BACKEND=mpi on 2
# ranks (MPI on pinned host staging buffers) against the CPU build's lab 05 with the same settings: losses, step-1
# gradients and the saved parameters within lab 05's bounds (tests/lab05_equal.sh, tests/tolerances.py), and the
# device pool's memory table exact to the byte. The emulator is synchronous and guards GPU memory from the host
# (tests/cuda_emulator/cuda_runtime.h says what that shows and what it cannot: asynchrony, races, the bus).
# Small settings (2 steps of 2 micro-batches of 2 x 32 tokens per rank): the emulator runs every GPU thread.
EMU=build/cuda_emulated
# (gpu_layers on the same build is the unit suite's: tests/cuda_emulator/run.sh.)
check "make CUDA=emulated builds lab 05 on the CUDA emulator" \
  env -u MAKEFLAGS -u MAKELEVEL make --no-print-directory -j2 CUDA=emulated $EMU/lab/05_full_step

source tests/lab05_equal.sh
STEPS05=2 ACC05=2 SEQ05=32 LR05=1e-3 GLOBAL05=4
# emulated05 TAG ENV...: the CPU build's run (the reference) and the emulated CUDA device's, the same settings, then
# the three equivalence checks; then (MEMORY=0: not, and why is said there) one more emulated run without GRADS (its
# gathered gradients would count in the peak) whose device pool's memory table must equal the model's to the byte.
emulated05() {
  local tag=$1 memory=1 log
  shift
  [ "${1:-}" = MEMORY=0 ] && { memory=0; shift; }
  REFERENCE05=runs/check/emu05_cpu_$tag
  lab05 "05_full_step -np 2 $tag (CPU build)" 2 $REFERENCE05 "$@"
  lab05 "05_full_step -np 2 $tag (emulated CUDA device)" 2 runs/check/emu05_cuda_$tag DEVICE=cuda BACKEND=mpi "$@"
  equal05 "emulated CUDA $tag vs CPU" runs/check/emu05_cuda_$tag
  if [ $memory = 1 ]; then
    log=runs/check/emu05_memory_$tag.log
    check "emulated CUDA $tag: device memory model exact to the byte" bash -c "env OUT=runs/check/emu05_memory \
      DEVICE=cuda BACKEND=mpi STEPS=1 ACC=$ACC05 SEQ=$SEQ05 MBS=$((GLOBAL05 / 2)) $* $MPIRUN -np 2 \
      $EMU/lab/05_full_step > $log && python3 tests/check_memory_model.py $log"
  fi
}
# run_lab runs lab/LAB: the emulated build's lab 05 is reached from there.
lab05() {
  local name=$1 ranks=$2 dir=$3 lab=05_full_step
  shift 3
  case " $* " in *" DEVICE=cuda "*) lab=../$EMU/lab/05_full_step ;; esac
  run_lab "$name" "$ranks" "$dir" $lab STEPS=$STEPS05 ACC=$ACC05 SEQ=$SEQ05 LR=$LR05 \
    MBS=$((GLOBAL05 / ranks)) SAVE="$dir/checkpoint" GRADS="$dir/grads" "$@"
}
emulated05 FULL_SHARD STRATEGY=FULL_SHARD
emulated05 COMM_STREAMS_BACKWARD_PRE STRATEGY=FULL_SHARD COMM_STREAMS=1 BACKWARD_PREFETCH=BACKWARD_PRE
emulated05 LOSS_CHUNK STRATEGY=FULL_SHARD LOSS_CHUNK=100
emulated05 CKPT STRATEGY=FULL_SHARD CKPT=1
# MP=fp32,reduce=bf16: float32 parameters gathered as without mixed precision, the gradient reduced in bfloat16
emulated05 MP_reduce_bf16 STRATEGY=FULL_SHARD MP=fp32,reduce=bf16
# OFFLOAD: the host pool's table on the CUDA device also holds the MPI staging buffers and the data, which
# core/memory_model.c does not predict yet: equivalence only.
emulated05 OFFLOAD MEMORY=0 STRATEGY=FULL_SHARD OFFLOAD=1
check_fails "emulated CUDA device refuses MP=bf16 (bfloat16 compute is the CPU's), saying why" \
  "MP='bf16': bfloat16 parameters and compute run on the CPU device only so far" \
  env OUT=runs/check/emu05_refused DEVICE=cuda BACKEND=mpi STEPS=1 MP=bf16 $MPIRUN -np 2 $EMU/lab/05_full_step
check_fails "emulated CUDA build refuses BACKEND=nccl: NCCL is not emulated" "NCCL is not emulated" \
  env OUT=runs/check/emu05_refused CUDA_EMULATOR_DEVICES=2 BACKEND=nccl STEPS=1 $MPIRUN -np 2 $EMU/lab/05_full_step
