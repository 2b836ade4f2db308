# The sanitizer suite (`make check-sanitize`): labs 01-05 on 2 ranks with small settings, the unit tests, fsdptrace
# and the parser fuzzer, all from the build `make sanitize` puts in build/sanitize/ (ASan with LeakSanitizer, UBSan
# with float-cast-overflow, every UB fatal: -fno-sanitize-recover). A check passes only when its command exits 0 AND
# no sanitizer printed a report (belt and braces: a report in a forked child or a rank that mpirun hides still fails).
SAN=${SANITIZE_DIR:-build/sanitize}
SAN_REPORT='ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:'
SAN_REPORT+='|SUMMARY: (AddressSanitizer|UndefinedBehaviorSanitizer)'
# LeakSanitizer is on (detect_leaks=1) with tests/sanitize.supp naming Open MPI's, PMIx's, hwloc's, libevent's and
# OpenBLAS's own allocations (never a frame of ours). A leak makes the process exit non-zero, so it fails a Check
# test's fork like a crash does.
export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:strict_string_checks=1:check_initialization_order=1"
export LSAN_OPTIONS="suppressions=$PWD/tests/sanitize.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
# Under MPI (mpirun's ranks and the fuzzer's singleton MPI_Init): Open MPI dlopens its components (mca_*.so) and
# dlcloses them in MPI_Finalize, before LeakSanitizer symbolizes at exit, and they are built without frame pointers:
# with the default fast unwinder their leaks show one frame in "<unknown module>" (or one misattributed to our
# binary) that no suppression can name. fast_unwind_on_malloc=0 records full stacks (DWARF), which reach libmpi /
# libopen-pal frames that the suppressions do name. It is slower, so only the MPI programs use it. No other
# mitigation was needed: vader (shared memory) and CMA single-copy raise no false positives here.
MPI_ASAN_OPTIONS="$ASAN_OPTIONS:fast_unwind_on_malloc=0"

sanitized() { # sanitized NAME COMMAND...: COMMAND exits 0 and its output holds no sanitizer report
  local name=$1
  shift
  check "$name" bash -c 'output=$("${@:2}" 2>&1); status=$?; printf "%s\n" "$output"
    [ $status -eq 0 ] && ! grep -qE "$1" <<<"$output"' _ "$SAN_REPORT" "$@"
}
sanitized_mpi() { # sanitized_mpi NAME RANKS DIR PROGRAM [ENV=VALUE...]: PROGRAM on RANKS ranks, events into DIR
  local name=$1 ranks=$2 dir=$3 program=$4
  shift 4
  rm -rf "$dir"
  sanitized "$name" env OUT="$dir" ASAN_OPTIONS="$MPI_ASAN_OPTIONS" "$@" $MPIRUN -np "$ranks" "$program"
}

# The build carries the sanitizers (the fast-math kernels too): a check that found nothing must have looked.
check "sanitize build: ASan and UBSan float-cast-overflow in the labs and core/kernels/layers.o" bash -c "
  nm $SAN/lab/05_full_step | grep -q __asan_report_load && nm $SAN/core/kernels/layers.o | grep -q __asan_report &&
  nm $SAN/core/io/safetensors.o | grep -q __ubsan_handle_float_cast_overflow"

sanitized_mpi "sanitize 01_shard -np 2" 2 runs/check/san_01 $SAN/lab/01_shard
sanitized_mpi "sanitize 02_gather -np 2" 2 runs/check/san_02 $SAN/lab/02_gather
sanitized_mpi "sanitize 03_reduce_scatter -np 2 BW_MB=2" 2 runs/check/san_03 $SAN/lab/03_reduce_scatter BW_MB=2
sanitized_mpi "sanitize 04_checkpoint -np 2" 2 runs/check/san_04 $SAN/lab/04_checkpoint
sanitized_mpi "sanitize 05_full_step -np 2 STEPS=2 ACC=2 SEQ=32, SAVE, GRADS" 2 runs/check/san_05 \
  $SAN/lab/05_full_step STEPS=2 ACC=2 SEQ=32 MBS=2 SAVE=runs/check/san_05/checkpoint GRADS=runs/check/san_05/grads
sanitized_mpi "sanitize 05_full_step -np 2 comm streams, BACKWARD_PRE, CKPT=1, ALLOC=malloc" 2 \
  runs/check/san_05_streams $SAN/lab/05_full_step STEPS=1 ACC=2 SEQ=32 MBS=2 CKPT=1 ALLOC=malloc COMM_STREAMS=1 \
  BACKWARD_PREFETCH=BACKWARD_PRE FORWARD_PREFETCH=1
# Sharded checkpoints (core/io/dcp.c): written every step, then a run on another world size resumes from step 1.
sanitized_mpi "sanitize 05_full_step -np 2 CHECKPOINT_EVERY=1" 2 runs/check/san_05_dcp $SAN/lab/05_full_step STEPS=2 \
  ACC=1 SEQ=32 MBS=2 CHECKPOINT_EVERY=1 CHECKPOINT_DIR=runs/check/san_dcp
sanitized_mpi "sanitize 05_full_step -np 1 RESUME from 2 ranks' step 1" 1 runs/check/san_05_resume \
  $SAN/lab/05_full_step STEPS=2 ACC=1 SEQ=32 MBS=4 RESUME=runs/check/san_dcp/step_00000001
# Generation (EVAL) with the KV cache; text through Qwen2's tokenizer when its vocabulary is here.
sanitized_mpi "sanitize 05_full_step -np 2 EVAL=1 (generation with the KV cache)" 2 runs/check/san_05_eval \
  $SAN/lab/05_full_step STEPS=1 ACC=1 SEQ=32 MBS=2 EVAL=1
# Labs 07-09's paths through the core: bfloat16 casts and typed collectives on streams with prefetch; process groups
# with CPU offload's host pool, h2d copies into the in-place all-gather and d2h copies after the replicate all-reduce;
# lab 09's naive and deferred initialisation.
sanitized_mpi "sanitize 05_full_step -np 2 MP=bf16, comm streams, prefetch" 2 runs/check/san_05_mp \
  $SAN/lab/05_full_step STEPS=2 ACC=2 SEQ=32 MBS=2 MP=bf16 COMM_STREAMS=1 BACKWARD_PREFETCH=BACKWARD_PRE \
  FORWARD_PREFETCH=1
sanitized_mpi "sanitize 05_full_step -np 4 HYBRID_SHARD 2x2, OFFLOAD=1, comm streams" 4 runs/check/san_05_hybrid \
  $SAN/lab/05_full_step STEPS=1 ACC=2 SEQ=32 MBS=2 STRATEGY=HYBRID_SHARD SHARD_GROUP=2 OFFLOAD=1 COMM_STREAMS=1
sanitized_mpi "sanitize 09_offload_and_init -np 2 (tiny, 1 step)" 2 runs/check/san_09 $SAN/lab/09_offload_and_init \
  INIT_MODELS=tiny STEPS=1 MBS=2 SEQ=32
if [ -f "${QWEN2_TOKENIZER:-data/qwen2/qwen.tiktoken}" ]; then
  sanitized_mpi "sanitize 05_full_step -np 2 on Qwen2's vocabulary and tokenizer" 2 runs/check/san_05_qwen2 \
    $SAN/lab/05_full_step MODEL=qwen2-0.5b STEPS=1 ACC=1 SEQ=32 MBS=1 \
    CONFIG=hidden_size=32,num_hidden_layers=1,intermediate_size=64,num_attention_heads=2,num_key_value_heads=1
fi
# The trace tool and the checkpoint reader on the lab's real files.
sanitized "sanitize fsdptrace all + overlap on lab 05's run" bash -c "
  $SAN/trace/fsdptrace all runs/check/san_05_streams && $SAN/trace/fsdptrace overlap runs/check/san_05_streams"
sanitized "sanitize qwen2_tool compare: lab 05's checkpoint read back (safetensors, config.json)" \
  env OUT=runs/check/san_compare ASAN_OPTIONS="$MPI_ASAN_OPTIONS" $SAN/tests/bin/qwen2_tool compare \
  runs/check/san_05/checkpoint runs/check/san_05/checkpoint 0 absolute

for binary in test_allocator test_mem test_safetensors test_rng test_layers test_trace test_tokenizer; do
  sanitized "sanitize $binary" env OUT=runs/check/san_$binary $SAN/tests/bin/$binary
done
# test_qwen2 starts MPI (a singleton), so it needs the full-stack unwinder on every malloc: 4 min 42 s on this 2-core
# machine with the bfloat16 tests (30 s with the fast unwinder), past the default 300 s check timeout.
CHECK_TIMEOUT=900 sanitized "sanitize test_qwen2" env OUT=runs/check/san_test_qwen2 ASAN_OPTIONS="$MPI_ASAN_OPTIONS" \
  $SAN/tests/bin/test_qwen2
for binary in test_comm test_flat_param test_data test_optim test_fsdp test_mlp; do
  sanitized_mpi "sanitize $binary -np 2" 2 runs/check/san_$binary $SAN/tests/bin/$binary
done

# Every parser of a user's file on mutants of a valid one (tests/fuzz_parsers.c): no crash, hang, leak or UB, and
# the changes that must be refused are.
sanitized "sanitize fuzz_parsers: 300 mutants per parser, seed 1" env OUT=runs/check/san_fuzz \
  ASAN_OPTIONS="$MPI_ASAN_OPTIONS" $SAN/tests/bin/fuzz_parsers 1 300
