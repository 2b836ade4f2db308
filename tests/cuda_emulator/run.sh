#!/bin/bash
# tests/cuda_emulator/run.sh — a test program of the CUDA emulator's build, built if needed, then run: by default
# tests/gpu_layers.c on the CUDA device of core/cuda/ (the real cuda_device.c and cuda_ops.cu, the kernels of
# kernels.cu) running on the CUDA emulator (this folder: CPU fibers for GPU threads, OpenBLAS's column-major GEMM for
# cuBLAS, guarded host pages for GPU memory): every kernel and every cuBLAS call of the CUDA backend checked against the
# CPU layers where there is no GPU. Built by `make CUDA=emulated` into build/cuda_emulated/ (the whole runtime is built
# there too: tests/suites/cuda_emulated.sh runs lab 05 on it). The unit suite runs the others through it as well
# (emulator_self_test, this folder's self_test.cu; gpu_gemm_bench).
# Usage: tests/cuda_emulator/run.sh [PROGRAM [ARGS...]]   (PROGRAM in build/cuda_emulated/tests/bin/, default
# gpu_layers); exit status the program's.
set -euo pipefail
cd "$(dirname "$0")/../.."
program=gpu_layers
if [ $# -gt 0 ]; then program=$1; shift; fi
env -u MAKEFLAGS -u MAKELEVEL make --no-print-directory -j2 CUDA=emulated "build/cuda_emulated/tests/bin/$program" \
  > /dev/null
OPENBLAS_NUM_THREADS=1 "build/cuda_emulated/tests/bin/$program" "$@"
