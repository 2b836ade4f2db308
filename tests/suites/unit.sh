# Unit suites (Check). The MPI suites run at several world sizes: buffers of 1, 7, 1001, 4099 ... floats and random
# shape lists make sizes that do and do not divide by the world size.
mpi_suite() { # mpi_suite NAME BINARY RANKS...
  local name=$1 binary=$2 ranks
  shift 2
  for ranks in "$@"; do
    check "$name -np $ranks" env OUT="runs/check/$(basename "$binary")_np$ranks" $MPIRUN -np "$ranks" "$binary"
  done
}
check "test_allocator: rounding, pools, split/merge, best fit, max_split_size, empty_cache, vs a reference model" \
  tests/bin/test_allocator
check "test_mem: tracked allocator" tests/bin/test_mem
check "test_safetensors: round trip, HF-written file, refusals" tests/bin/test_safetensors
check "test_tokenizer: merges by rank, specials, NFC, decode, tokenizer.json, bad files named by line" \
  tests/bin/test_tokenizer
check "test_rng: counter-based, any range alone, normal statistics" tests/bin/test_rng
check "test_dtype: bfloat16 round to nearest even, NaN kept, every value round-trips" tests/bin/test_dtype
check "test_kernel_math: the per-element math CPU and GPU share vs double references within derived bounds" \
  tests/bin/test_kernel_math
# The emulator's own barriers, which gpu_layers and the emulated labs rely on (tests/cuda_emulator/self_test.cu):
# shuffles and __syncthreads give the serial sums, and a barrier one thread never reaches aborts, naming the block.
check "emulator_self_test: the CUDA emulator's shuffles and block barriers give the serial sums, 8 block shapes" \
  tests/cuda_emulator/run.sh emulator_self_test
check_fails "emulator_self_test stuck: a barrier one thread never reaches aborts, naming the block and the waiters" \
  "block \(0, 0, 0\): 63 threads wait at a barrier the others never reach" \
  tests/cuda_emulator/run.sh emulator_self_test stuck
check "gpu_layers on the CUDA emulator: core/cuda's kernels and cuBLAS calls vs the CPU layers, derived bounds" \
  tests/cuda_emulator/run.sh gpu_layers
# The GEMM storage benchmark the GPU lease runs (tests/gpu_gemm_bench.c), at 1/32 of Qwen2-0.5B's sizes on the
# emulator: its 14 shapes x 4 storages (float32, float32 under FAST_16BF, bfloat16 operands with a float32 or a
# bfloat16 C) each against double dot products within the derived bound, so the program and the emulator's bfloat16
# GEMMs are right before a lease times them.
check "gpu_gemm_bench small on the CUDA emulator: 56 GEMMs in float32 and bfloat16 storage within derived bounds" \
  bash -c 'tests/cuda_emulator/run.sh gpu_gemm_bench small | tee /dev/stderr | grep -c " PASS$" | grep -qx 56'
mpi_suite "test_comm: collectives vs Send/Recv reference" tests/bin/test_comm 1 2 3 4
mpi_suite "test_flat_param: reassembly, views, gradient mean" tests/bin/test_flat_param 1 2 3 4
mpi_suite "test_data: tokenizer, stories, loaders, world-size independent batches" tests/bin/test_data 1 2 4
mpi_suite "test_optim: AdamW vs reference, state on the shard, padding, clip" tests/bin/test_optim 1 2 3 4
mpi_suite "test_fsdp: wrap policies, spans, illegal transitions, a clean micro-batch" tests/bin/test_fsdp 1 2 3
mpi_suite "test_mlp: a second model under the runtime: tree, finite differences, every mode vs the model alone" \
  tests/bin/test_mlp 1 2 3
check "fuzz_parsers: safetensors, config.json, token files, rank JSONL survive 100 mutants each; must-refuse refused" \
  env OUT=runs/check/fuzz_parsers tests/bin/fuzz_parsers 1 100
