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
# Every lab: 05, 06 and 08 run below, the others' refusal of DEVICE=cuda is checked.
check "make CUDA=emulated builds every lab on the CUDA emulator" \
  env -u MAKEFLAGS -u MAKELEVEL make --no-print-directory -j2 CUDA=emulated \
  $(ls lab/[0-9][0-9]_*.c | sed "s|^|$EMU/|; s|\.c\$||")

source tests/lab05_equal.sh
STEPS05=2 ACC05=2 SEQ05=32 LR05=1e-3 GLOBAL05=4
# emulated05 TAG ENV...: the CPU build's run (the reference) and the emulated CUDA device's, the same settings (2
# ranks; NP=3 first: 3 ranks, 6 sequences a micro-batch over all), then the three equivalence checks; then (MEMORY=0:
# not, and why is said there) one more emulated run without GRADS (its gathered gradients would count in the peak)
# whose device pool's memory table must equal the model's to the byte.
# BF16=1 (after MEMORY=0, if both): the runs compute in bfloat16 (MP=bf16), and the checks are the bfloat16 ones:
# every op's output is rounded at the same places on both devices, only float32 summation orders differ (cuBLAS's
# bfloat16 tensor-core GEMMs against OpenBLAS's), so the losses are compared as check_train_parity.sh compares them
# with torch's (compare_losses.py bf16: the rounding-flip bound, lr x the measured step-1 gradient difference per
# later step, that difference under twice the bfloat16 reduce's error bound), and the parameters within AdamW's.
# NCCL=1 (after the others): the emulated runs use BACKEND=nccl, one emulated GPU per rank (CUDA_EMULATOR_DEVICES=2):
# the real core/cuda/nccl_comm.c on the emulator's NCCL, which runs each collective over MPI
# (tests/cuda_emulator/nccl.h)
emulated05() {
  local tag=$1 memory=1 bf16=0 backend=BACKEND=mpi log dir ranks=2 GLOBAL05=$GLOBAL05
  shift
  [ "${1:-}" = NP=3 ] && { ranks=3; GLOBAL05=6; shift; }
  [ "${1:-}" = MEMORY=0 ] && { memory=0; shift; }
  [ "${1:-}" = BF16=1 ] && { bf16=1; shift; }
  [ "${1:-}" = NCCL=1 ] && { backend="BACKEND=nccl CUDA_EMULATOR_DEVICES=2"; shift; }
  REFERENCE05=runs/check/emu05_cpu_$tag
  dir=runs/check/emu05_cuda_$tag
  lab05 "05_full_step -np $ranks $tag (CPU build)" $ranks $REFERENCE05 "$@"
  lab05 "05_full_step -np $ranks $tag (emulated CUDA device)" $ranks $dir DEVICE=cuda $backend "$@"
  if [ $bf16 = 1 ]; then
    check "emulated CUDA $tag vs CPU: losses within the bfloat16 flip bound and drift" python3 tests/compare_losses.py \
      $REFERENCE05 $dir $((GLOBAL05 * SEQ05 * ACC05)) $SEQ05 $LR05 bf16
    check "emulated CUDA $tag vs CPU: parameters within AdamW's bound" \
      env OUT=runs/check/compare_$suite tests/bin/qwen2_tool \
      compare "$dir/checkpoint" $REFERENCE05/checkpoint "$(python3 tests/tolerances.py adamw $LR05 $STEPS05)" absolute
  else
    equal05 "emulated CUDA $tag vs CPU" $dir "the CPU build's"
  fi
  if [ $memory = 1 ]; then
    log=runs/check/emu05_memory_$tag.log
    check "emulated CUDA $tag: device memory model exact to the byte" bash -c "env OUT=runs/check/emu05_memory \
      DEVICE=cuda $backend STEPS=1 ACC=$ACC05 SEQ=$SEQ05 MBS=$((GLOBAL05 / ranks)) $* $MPIRUN -np $ranks \
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
# LOSS_CHUNK=20 of a micro-batch's 2 x 32 = 64 rows: chunks of 20, 20, 20 and 4, each one's lm_head backward in the
# head's forward (100, more than the rows, would not chunk at all)
emulated05 LOSS_CHUNK STRATEGY=FULL_SHARD LOSS_CHUNK=20
emulated05 CKPT STRATEGY=FULL_SHARD CKPT=1
# MP=fp32,reduce=bf16: float32 parameters gathered as without mixed precision, the gradient reduced in bfloat16
emulated05 MP_reduce_bf16 STRATEGY=FULL_SHARD MP=fp32,reduce=bf16
# OFFLOAD: the host pool's table on the CUDA device also holds the MPI staging buffers and the data, which
# core/models/memory_model.c does not predict yet: equivalence only. With CLIP: the norm's sums over host shards, its
# all-reduce on the device's buffer
emulated05 OFFLOAD_CLIP MEMORY=0 STRATEGY=FULL_SHARD OFFLOAD=1 CLIP=0.5
# MP=bf16: the CUDA device's bfloat16 layers (cuBLAS GEMMs under CUBLAS_COMPUTE_32F_FAST_16BF, which the emulator
# aborts on if any input is not a bfloat16 value) against the CPU's core/kernels/layers_bf16.c; with LOSS_CHUNK and CKPT
# too
emulated05 MP_bf16 BF16=1 STRATEGY=FULL_SHARD MP=bf16
emulated05 MP_bf16_LOSS_CHUNK_CKPT BF16=1 STRATEGY=FULL_SHARD MP=bf16 LOSS_CHUNK=20 CKPT=1
# BACKEND=nccl: a communicator per group and per comm stream, the collectives queued on the comm streams (or the
# compute stream without them), mean reductions as ncclAvg, the bfloat16 ones as ncclBfloat16
emulated05 NCCL NCCL=1 STRATEGY=FULL_SHARD
emulated05 NCCL_COMM_STREAMS_BACKWARD_PRE NCCL=1 STRATEGY=FULL_SHARD COMM_STREAMS=1 BACKWARD_PREFETCH=BACKWARD_PRE
emulated05 NCCL_MP_bf16 BF16=1 NCCL=1 STRATEGY=FULL_SHARD MP=bf16 COMM_STREAMS=1
# NO_SHARD: the gradients all-reduced in place (ncclAllReduce), which FULL_SHARD never calls
emulated05 NCCL_NO_SHARD NCCL=1 STRATEGY=NO_SHARD
# CLIP (clip_grad_norm_): the squared norm's all-reduce on a buffer of the device, over MPI's staging and over NCCL,
# which reads only GPU memory (the emulator's refuses a host pointer, as a GPU would fault on one); on the host's
# float, BACKEND=mpi crashed on its staging copy and NCCL failed "not GPU memory" (main at 1e11a8f)
emulated05 CLIP STRATEGY=FULL_SHARD CLIP=0.5
emulated05 NCCL_CLIP NCCL=1 STRATEGY=FULL_SHARD CLIP=0.5
# FSDP_VERSION=2 (lab 10's fully_shard): every parameter sharded on dim 0, the all-gather's copy-out and the
# reduce-scatter's copy-in done by the CUDA device; on 3 ranks in float32 (rows that do not divide: shards of unequal
# rows, the copy-in's zero padding rows), on 2 under MixedPrecisionPolicy(param_dtype=bf16)
emulated05 FSDP2 NP=3 STRATEGY=FULL_SHARD FSDP_VERSION=2
emulated05 FSDP2_MP_bf16 BF16=1 STRATEGY=FULL_SHARD FSDP_VERSION=2 MP=bf16
# What users open, from the CUDA device's runs, in the clients they use (the device mark, the cudaMalloc segments'
# backend names, the comm streams' threads): the timeline in Perfetto UI and Catapult, the memory page in headless
# Chromium, the snapshot in PyTorch's memory viewer's format
check "emulated CUDA runs: trace.json opens in Perfetto UI and Catapult (every arrow, every stream's thread)" \
  python3 tests/check_trace_viewers.py runs/check/emu05_cuda_COMM_STREAMS_BACKWARD_PRE runs/check/emu05_cuda_MP_bf16 \
  runs/check/emu05_cuda_NCCL_COMM_STREAMS_BACKWARD_PRE
check "emulated CUDA MP=bf16: memory.html in headless Chromium" python3 tests/check_memory_page.py \
  runs/check/emu05_cuda_MP_bf16
check "emulated CUDA MP=bf16: memory_snapshot.pickle loads, addresses consistent" python3 tests/check_snapshot.py \
  runs/check/emu05_cuda_MP_bf16
check "emulated CUDA MP=bf16: player.html in headless Chromium equals the JSONL" python3 tests/check_player.py \
  runs/check/emu05_cuda_MP_bf16
check_fails "emulated CUDA: BACKEND=nccl with 2 ranks on 1 GPU refused, naming BACKEND=mpi" \
  "NCCL refuses two ranks on one GPU.*BACKEND=mpi" \
  env OUT=runs/check/emu05_refused DEVICE=cuda BACKEND=nccl STEPS=1 $MPIRUN -np 2 $EMU/lab/05_full_step
# The memory check on a GPU (memory_model_require_fit): the device pool's predicted peak against the GPU's free memory
# (device.memory_info: cudaMemGetInfo; the emulator's GPU has CUDA_EMULATOR_MEMORY bytes) split among the ranks on that
# GPU, not against the host's MemAvailable (24 GB here, which let every GPU run through before). The tiny model at these
# settings is predicted at 10.8 MB a rank and the device's own buffers take 1.1 MB of a 16 MB GPU: 7.5 MB each for 2
# ranks on one GPU (BACKEND=mpi) is refused before the model is made; a 16 MB GPU a rank (BACKEND=nccl) runs.
EMU_SMALL="STEPS=1 ACC=2 SEQ=32 MBS=2 DEVICE=cuda CUDA_EMULATOR_MEMORY=16000000"
check_fails "emulated CUDA: 2 ranks on one 16 MB GPU refused, naming the GPU's free memory and the ranks sharing it" \
  "predicted peak [0-9.]+ MB of GPU memory per rank .* available \(GPU 0: [0-9.]+ MB free of 16\.0 MB, shared by 2 \
ranks\); lower MBS or SEQ, or use more GPUs" \
  env OUT=runs/check/emu_memory_check $EMU_SMALL BACKEND=mpi $MPIRUN -np 2 $EMU/lab/05_full_step
check "emulated CUDA: the same, one 16 MB GPU a rank (BACKEND=nccl): fits, runs" \
  env OUT=runs/check/emu_memory_check $EMU_SMALL BACKEND=nccl CUDA_EMULATOR_DEVICES=2 $MPIRUN -np 2 \
  $EMU/lab/05_full_step
# Past the check (MEMORY_CHECK=0) on a 6 MB GPU a rank: cudaMalloc refuses a segment (the emulator, as a full GPU),
# the caching allocator gives its free segments back and asks again, then names the rank, the bytes, the category and
# the buffer it could not place: the path a full GPU takes (cuda_device.c's segment_or_null), which the emulator could
# not reach before it had a size.
check_fails "emulated CUDA: MEMORY_CHECK=0 on a 6 MB GPU a rank: out of memory, naming the rank, bytes and buffer" \
  "rank [01]: out of memory allocating [0-9]+ bytes of [a-z_]+ for '[a-z0-9_.]+' \([0-9]+ bytes live, [0-9]+ \
reserved, the cache emptied\)" \
  env OUT=runs/check/emu_memory_check $EMU_SMALL CUDA_EMULATOR_MEMORY=6000000 MEMORY_CHECK=0 BACKEND=nccl \
  CUDA_EMULATOR_DEVICES=2 $MPIRUN -np 2 $EMU/lab/05_full_step
# Lab 06 on the GPU: every mode, the same arithmetic (each rank's parameters and losses equal across the modes), the
# memory model exact, overlap only with the comm streams; tests/check_lab06.py, as check-06 runs it on the CPU.
rm -rf runs/check/emu06
check "emulated CUDA: 06_prefetch -np 2 DEVICE=cuda, every mode" env OUT=runs/check/emu06 DEVICE=cuda MBS=2 SEQ=32 \
  STEPS=2 $MPIRUN -np 2 $EMU/lab/06_prefetch
check "emulated CUDA: 06_prefetch: same arithmetic, exact memory model, overlap only with streams" \
  python3 tests/check_lab06.py runs/check/emu06 "$(log_of "emulated CUDA: 06_prefetch -np 2 DEVICE=cuda, every mode")"
# Lab 08 on the GPU, 4 ranks: every strategy's memory model exact on the device pool (FULL_SHARD over 4 ranks is the
# first run with 3+ ranks in a reduce-scatter on a GPU: MPI's ring buffers are in the host pool there, NCCL has its own,
# so the model puts none in the device pool), shards of 1/2, less across nodes; tests/check_lab08.py, as check-08.
rm -rf runs/check/emu08
check "emulated CUDA: 08_hybrid_shard -np 4 DEVICE=cuda, every strategy" env OUT=runs/check/emu08 DEVICE=cuda SEQ=32 \
  STEPS=2 $MPIRUN -np 4 $EMU/lab/08_hybrid_shard
check "emulated CUDA: 08_hybrid_shard: memory model exact, shards of 1/2, less across nodes, groups in the trace" \
  python3 tests/check_lab08.py lab runs/check/emu08 \
  "$(log_of "emulated CUDA: 08_hybrid_shard -np 4 DEVICE=cuda, every strategy")"
# The labs that read their tensors on the host to teach from them refuse DEVICE=cuda (session_require_cpu), naming
# DEVICE=cpu and the labs that run on a GPU, where before they crashed on their first host read of GPU memory.
for lab in 01_shard 02_gather 03_reduce_scatter 04_checkpoint 07_mixed_precision 09_offload_and_init 10_fully_shard; do
  check_fails "emulated CUDA: $lab refuses DEVICE=cuda, naming DEVICE=cpu and the labs that run on a GPU" \
    "DEVICE=cuda: $lab runs on the CPU device only \\(DEVICE=cpu.*lab/05_full_step" \
    env OUT=runs/check/emu_refused_$lab DEVICE=cuda $MPIRUN -np 2 $EMU/lab/$lab
done
# The loss read once a step (docs/gpu.md's host waits): each micro-batch's cross-entropy adds into a device loss slot
# and lab 05 reads them all at the step's end, so LOSS_CHUNK=20's 4 chunks a micro-batch cost no host wait more than
# the loss at once: the same synchronizes and stops (field 14), at most 28 a step (ACC=2). When each call read its loss
# that was 58 stream waits a step, 65 with LOSS_CHUNK=20 (tests/host_waits.sh against main at 4483155). No stream is
# synchronized (field 2): every host wait for the GPU polls an event under TIMEOUT (cuda_compute_wait), 58 a step
# were cudaStreamSynchronize before (main at 5bb03b2), which a stuck queue would hold without end.
check "emulated CUDA: the loss read once a step (LOSS_CHUNK=20 stops as often as the whole, <= 28; no stream sync)" \
  bash -c 'whole=$(tests/host_waits.sh) && chunked=$(tests/host_waits.sh LOSS_CHUNK=20) || exit 1
    echo "whole loss:    $whole"; echo "LOSS_CHUNK=20: $chunked"
    [ "${whole% launches*}" = "${chunked% launches*}" ] &&
    [ "$(echo "$whole" | awk "{print \$14}")" = "$(echo "$chunked" | awk "{print \$14}")" ] &&
    echo "$whole" | awk "{exit !(\$2 == 0 && \$14 <= 28)}"'
# The residual add fused into the norm after it (residual_rmsnorm_forward) and the residual's gradient added in the
# norm's backward pass (rmsnorm_backward's dresidual; docs/gpu.md): per step (ACC=2, the tiny model's 4 layers) the
# forward makes 1 launch fewer per layer and micro-batch in float32 (the add) and 2 in bfloat16 (the add, its
# rounding); the backward 2 device copies fewer per layer and micro-batch (dout into dmid, dmid into dx) and 1 fill
# fewer per micro-batch (the final norm's zeroed gradient): 498 -> 490 launches and 99 -> 81 copies in float32, 773
# -> 757 and 120 -> 102 with MP=bf16 (tests/host_waits.sh on main at 4efec58, then after). Launches: field 8, copies 10.
# Then a backward writes its input's gradient (layers.h; GEMMs with beta = 0) instead of adding into a zeroed buffer:
# 8 fills fewer per layer and micro-batch (dact, dgate_up, dln2, the attention's output gradient, dq, dk, dv, dln1;
# in bfloat16 ln1's two shares, not dln1) and 1 per micro-batch (dnorm): 81 -> 15 copies in float32, 102 -> 20 in
# bfloat16; ln1's gradient adds its three shares in float32 as in bfloat16 (2 adds per layer and micro-batch:
# 490 -> 506 launches), and bfloat16 rounds dq, dk, dv and the attention's output as they are written (4 launches
# fewer per layer and micro-batch: 757 -> 725) (tests/host_waits.sh on main at 680e888, then after). Then bfloat16's
# other roundings went into the pass that writes the value: the adds of add_activation (the layer's output, ln1's
# gradient shares: 3), the biases of q, k, v (bias_add_bf16 after a GEMM with beta = 0: 3) per layer and
# micro-batch, and the loss's gradient per micro-batch: 725 -> 675 launches (tests/host_waits.sh at 859efb8, then).
# Then the backward made the attention's probabilities again instead of keeping them from the forward (B H T^2 floats
# a layer less between the two): q and k laid out, the scores' GEMM, (bfloat16: their scaling,) the softmax, 4 (5)
# launches more per layer and micro-batch: 506 -> 538, 675 -> 715 (tests/host_waits.sh at 92781dd, then).
check "emulated CUDA: residual add in the norm; input gradients written (launches <= 538, 715 bf16; copies <= 15, 20)" \
  bash -c 'fp32=$(tests/host_waits.sh) && bf16=$(tests/host_waits.sh MP=bf16) || exit 1
    echo "float32: $fp32"; echo "MP=bf16: $bf16"
    echo "$fp32" | awk "{exit !(\$8 <= 538 && \$10 <= 15)}" && echo "$bf16" | awk "{exit !(\$8 <= 715 && \$10 <= 20)}"'
# FSDP2's copy-in and copy-out (lab 10: torch's chunk_cat before the reduce-scatter, split_with_sizes_copy after the
# all-gather) one device call for every parameter of every rank (device.h's rows_copy, one launch per 32 parameters):
# per step (ACC=2, 2 ranks) 607 -> 15 device copies and 538 -> 566 launches in float32 (a copy per parameter per rank
# became a launch per unit), 1,279 -> 715 launches with MP=bf16 (a conversion per parameter per rank)
# (tests/host_waits.sh FSDP_VERSION=2 on main at a636706, then after). Launches: field 8, copies 10.
check "emulated CUDA FSDP2: copy-in and copy-out one launch a unit (launches <= 566, 715 bf16; copies <= 15, 20)" \
  bash -c 'fp32=$(tests/host_waits.sh FSDP_VERSION=2) && bf16=$(tests/host_waits.sh FSDP_VERSION=2 MP=bf16) || exit 1
    echo "float32: $fp32"; echo "MP=bf16: $bf16"
    echo "$fp32" | awk "{exit !(\$8 <= 566 && \$10 <= 15)}" && echo "$bf16" | awk "{exit !(\$8 <= 715 && \$10 <= 20)}"'
# BACKEND=nccl's comm waits on the device (comm_wait: the compute stream waits for the collective's end event, the host
# goes on; core/comm/comm.h): the host stops (looks at the GPU with work queued since its last look;
# tests/host_waits.sh) 4 times a step, none of them in a collective's wait: the next micro-batch's tokens (the last
# token copy has run), the losses read (which takes the pending collectives), the divergence check's nonfinite-gradient
# flag, the compute spans' timers. It stopped 28 times a step (32 with MP=bf16) when comm_wait polled each collective
# on the host (tests/host_waits.sh on main at c90769c, then after). Stops: field 14. No stream synchronized (field 2,
# as above): the compute stream waits for collectives, so a cudaStreamSynchronize would outwait TIMEOUT.
check "emulated CUDA BACKEND=nccl: collectives waited for on the device (stops <= 4, MP=bf16 too; no stream sync)" \
  bash -c 'fp32=$(tests/host_waits.sh BACKEND=nccl CUDA_EMULATOR_DEVICES=2) &&
    bf16=$(tests/host_waits.sh BACKEND=nccl CUDA_EMULATOR_DEVICES=2 COMM_STREAMS=1 MP=bf16) || exit 1
    echo "float32: $fp32"; echo "MP=bf16 COMM_STREAMS=1: $bf16"
    echo "$fp32" | awk "{exit !(\$2 == 0 && \$14 <= 4)}" && echo "$bf16" | awk "{exit !(\$2 == 0 && \$14 <= 4)}"'
# The whole run, start to close, not a step: no cudaStreamSynchronize or cudaDeviceSynchronize at all (fields 4 and 8 of
# the emulator's log), with the segment frees of OFFLOAD's pinned pool and the comm streams' destroys among them. Each
# would wait without end behind a collective a dead rank never joins; cuda_device_drain polls every stream's event
# under TIMEOUT instead (before this, each rank made 1 device synchronize at close and 1 per segment freed, and 1
# stream synchronize per comm stream destroyed).
for setting in "BACKEND=mpi OFFLOAD=1" "BACKEND=nccl CUDA_EMULATOR_DEVICES=2 COMM_STREAMS=1" \
  "BACKEND=mpi COMM_STREAMS=1 MP=bf16"; do
  check "emulated CUDA $setting: no stream or device synchronize in the whole run (frees, close: drained, polled)" \
    bash -c "rm -rf runs/check/emu_drain runs/check/emu_drain.log
      env $setting OUT=runs/check/emu_drain CUDA_EMULATOR_SYNC_LOG=runs/check/emu_drain.log DEVICE=cuda ACC=2 SEQ=32 \
        MBS=2 STEPS=2 $MPIRUN -np 2 $EMU/lab/05_full_step > runs/check/emu_drain.out 2>&1 || exit 1
      cat runs/check/emu_drain.log
      awk '{n++; if (\$4 != 0 || \$8 != 0) bad++} END {exit !(n == 2 && bad == 0)}' runs/check/emu_drain.log"
done
# PROFILE_KERNELS=1 (core/cuda/kernel_profile.h): every rank's table of the compute stream's work per step against
# the emulator's counts of the same run (tests/check_kernel_profile.py): as many GEMMs and as many fills and copies
# within GPU memory as the emulator ran, launchers that exist, a total that adds up, the losses of a run without it.
check "emulated CUDA PROFILE_KERNELS=1: every GEMM, fill and copy timed, per step and rank; losses unchanged" \
  bash -c "rm -rf runs/check/emu_profile runs/check/emu_profile_plain
    line=\$(HOST_WAITS_OUT=runs/check/emu_profile tests/host_waits.sh PROFILE_KERNELS=1) || exit 1
    echo \"\$line\"
    OUT=runs/check/emu_profile_plain DEVICE=cuda BACKEND=mpi ACC=2 SEQ=32 MBS=2 STEPS=3 \
      $MPIRUN -np 2 $EMU/lab/05_full_step > /dev/null || exit 1
    python3 tests/check_kernel_profile.py runs/check/emu_profile runs/check/emu_profile_plain \"\$line\""
check_fails "PROFILE_KERNELS=1 on the CPU device refused, naming DEVICE=cuda" "PROFILE_KERNELS=1.*DEVICE=cuda" \
  env OUT=runs/check/profile_cpu PROFILE_KERNELS=1 STEPS=1 $MPIRUN -np 2 lab/05_full_step
