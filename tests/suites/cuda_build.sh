# The CUDA build (`make CUDA=1`, into build/cuda/): it compiles and links on any machine with the CUDA toolkit, GPU or
# not, and nothing here needs a GPU. What can run without one runs: the CUDA build's programs on the CPU device train
# exactly as the CPU build's, and both builds refuse what they cannot do, saying why. (The GPU's own checks are
# scripts/gpu_check.sh, on a machine that has one.)
CUDA_BUILD=build/cuda

# The collectives on the context's device memory (tests/test_device_comm.c), here on the CPU device, data in and out
# through device copies only; a GPU runs the same program with DEVICE=cuda (BACKEND=mpi, BACKEND=nccl).
for ranks in 1 2 3 4; do
  rm -rf runs/check/test_device_comm_np$ranks
  check "test_device_comm -np $ranks: collectives on device memory, blocking, on streams, in groups (CPU device)" \
    env OUT=runs/check/test_device_comm_np$ranks $MPIRUN -np $ranks tests/bin/test_device_comm
  check "test_device_comm -np $ranks: trace valid" \
    python3 tests/validate_trace.py --expect-ranks $ranks runs/check/test_device_comm_np$ranks
done
NVCC_AT=${NVCC:-${CUDA_HOME:-/usr/local/cuda}/bin/nvcc}
CUDA_LABS=$(echo lab/[0-9][0-9]_*.c | sed 's|\.c\b||g')
# A GPU is here when nvidia-smi lists one (then the CUDA device starts, and "no GPU" cannot be checked).
HAVE_GPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)

if [ ! -x "$NVCC_AT" ]; then
  check "make CUDA=1" bash -c \
    "echo 'skipped: no nvcc at $NVCC_AT (install the CUDA toolkit, or set CUDA_HOME)'; exit 77"
else
  # The make of `make check` passes its jobserver in MAKEFLAGS; this make is a program of its own.
  check "make CUDA=1 builds every program into $CUDA_BUILD/ (nvcc for sm_80 and sm_90)" \
    env -u MAKEFLAGS -u MAKELEVEL make --no-print-directory -j2 CUDA=1
  check "make CUDA=1 built the labs, the unit tests, the tools and fsdptrace" bash -c "
    for program in $CUDA_LABS tests/bin/test_comm tests/bin/qwen2_tool trace/fsdptrace scripts/bench_model; do
      [ -x $CUDA_BUILD/\$program ] || { echo \"missing: $CUDA_BUILD/\$program\"; exit 1; }
    done"
  if [ -f tests/gpu_layers.c ]; then
    check "make CUDA=1 built tests/bin/gpu_layers (the kernels vs the CPU layers, on a GPU)" \
      test -x $CUDA_BUILD/tests/bin/gpu_layers
    if [ "$HAVE_GPU" = 0 ]; then
      check "make CUDA=1's gpu_gemm_bench (the GPU lease's GEMM storages) without a GPU: exit 77, said so" \
        bash -c "out=\$($CUDA_BUILD/tests/bin/gpu_gemm_bench); test \$? = 77 &&
          grep -qx 'gpu_gemm_bench: no CUDA device here' <<<\"\$out\""
    fi
  else
    check "make CUDA=1 built tests/bin/gpu_layers" bash -c \
      "echo 'skipped: tests/gpu_layers.c is not in this tree'; exit 77"
  fi
  # Linked, not just compiled: every lab holds the CUDA plug-in (its device, streams and NCCL), and calls into the CUDA
  # runtime, cuBLAS and NCCL (dynamic symbols, found through the rpath).
  check "every lab links the CUDA device, streams and NCCL (nm)" bash -c "
    for lab in $CUDA_LABS; do
      symbols=\$(nm $CUDA_BUILD/\$lab) || exit 1
      for wanted in ' [DR] plugins_linked\$' ' T cuda_device_init\$' ' T cuda_ops_install\$' ' T cuda_stream_init\$' \
                    ' T nccl_comm_create\$' \
                    ' U cudaMalloc@' ' U cudaStreamWaitEvent@' ' U cublasCreate_v2@' ' U ncclCommInitRank' \
                    ' U ncclReduceScatter'; do
        grep -qE \"\$wanted\" <<<\"\$symbols\" || { echo \"$CUDA_BUILD/\$lab lacks \$wanted\"; exit 1; }
      done
    done"
  check "the CUDA build's programs find the CUDA runtime, cuBLAS and NCCL at run time (ldd)" bash -c "
    libraries=\$(ldd $CUDA_BUILD/lab/05_full_step) && ! grep -q 'not found' <<<\"\$libraries\" &&
    grep -q libcudart <<<\"\$libraries\" && grep -q libcublas <<<\"\$libraries\" && grep -q libnccl <<<\"\$libraries\""
  # The CUDA build on the CPU device (DEVICE unset) is the CPU path: the same losses and the same saved model, byte
  # for byte, as the CPU build's lab 05.
  check "make CUDA=1's lab 05 on the CPU device: losses and model.safetensors byte-identical to the CPU build's" \
    bash -c "rm -rf runs/check/cuda_build_cpu runs/check/cuda_build_cuda
      OUT=runs/check/cuda_build_cpu SAVE=runs/check/cuda_build_cpu/model $MPIRUN -np 2 lab/05_full_step > \
        runs/check/cuda_build_cpu.log 2>&1 || exit 1
      OUT=runs/check/cuda_build_cuda SAVE=runs/check/cuda_build_cuda/model $MPIRUN -np 2 \
        $CUDA_BUILD/lab/05_full_step > runs/check/cuda_build_cuda.log 2>&1 || exit 1
      losses() { grep -o '^[0-9]*/[0-9]*: Loss = [^,]*' \$1; }
      [ \$(losses runs/check/cuda_build_cpu.log | wc -l) -gt 0 ] || { echo 'no losses printed'; exit 1; }
      diff <(losses runs/check/cuda_build_cpu.log) <(losses runs/check/cuda_build_cuda.log) &&
      cmp runs/check/cuda_build_cpu/model/model.safetensors runs/check/cuda_build_cuda/model/model.safetensors"
  if [ "$HAVE_GPU" = 0 ]; then
    check_fails "make CUDA=1's lab 01 with DEVICE=cuda and no GPU: refused, saying so" \
      "rank 0: DEVICE=cuda: no CUDA GPU here" env OUT=runs/check/cuda_build_nogpu DEVICE=cuda $MPIRUN -np 2 \
      $CUDA_BUILD/lab/01_shard
    check_fails "make CUDA=1's lab 01 with BACKEND=nccl and no GPU: refused, saying so" \
      "DEVICE=cuda \(BACKEND=nccl\): no CUDA GPU here" env OUT=runs/check/cuda_build_nogpu BACKEND=nccl \
      $MPIRUN -np 1 $CUDA_BUILD/lab/01_shard
  else
    check "make CUDA=1's lab 01 with DEVICE=cuda and no GPU" bash -c "echo 'skipped: this machine has a GPU'; exit 77"
  fi
fi

# The CPU build refuses the CUDA device and NCCL by name, and says how to get them; either build refuses NCCL on the
# CPU device.
check_fails "the CPU build's lab 01 refuses DEVICE=cuda: build with make CUDA=1" \
  "DEVICE=cuda: this build has no CUDA device: build with make CUDA=1" \
  env OUT=runs/check/cuda_build_refused DEVICE=cuda $MPIRUN -np 2 lab/01_shard
check_fails "the CPU build's lab 05 refuses BACKEND=nccl: build with make CUDA=1" \
  "BACKEND=nccl\): this build has no CUDA device: build with make CUDA=1" \
  env OUT=runs/check/cuda_build_refused BACKEND=nccl $MPIRUN -np 2 lab/05_full_step
check_fails "BACKEND=nccl with DEVICE=cpu is refused: NCCL moves GPU buffers" \
  "BACKEND=nccl moves GPU buffers: it needs DEVICE=cuda" \
  env OUT=runs/check/cuda_build_refused BACKEND=nccl DEVICE=cpu $MPIRUN -np 2 lab/01_shard
check_fails "DEVICE=tpu is refused, listing the devices" "DEVICE='tpu' is not allowed; choose one of: cpu, cuda" \
  env OUT=runs/check/cuda_build_refused DEVICE=tpu $MPIRUN -np 1 lab/01_shard

# The GPU machine's set-up (scripts/gpu_env.sh), tried here before a lease spends minutes on it: the Debian packages
# scripts/gpu_bundle.sh downloads (when .gpu_bundle/ is missing), unpacked into a private root, give a build and a
# 2-rank run every library from that root; NCCL and cuBLAS are found in pip's nvidia-* layout when no toolkit has them.
check "gpu_env.sh: the bundle's libraries from a private root (built, loaded, run on 2 ranks); pip's NCCL and cuBLAS" \
  tests/gpu_env_check.sh
