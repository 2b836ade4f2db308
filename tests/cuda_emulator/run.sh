#!/bin/bash
# tests/cuda_emulator/run.sh — tests/gpu_layers.c on the CUDA device of core/cuda/ (the real cuda_device.c and
# cuda_ops.cu, the kernels of kernels.cu) running on the CUDA emulator (this folder: CPU fibers for GPU threads,
# OpenBLAS's column-major GEMM for cuBLAS, guarded host pages for GPU memory): every kernel and every cuBLAS call of
# the CUDA backend checked against the CPU layers where there is no GPU. Built by `make CUDA=emulated` into
# build/cuda_emulated/ (the whole runtime is built there too: tests/suites/cuda_emulated.sh runs lab 05 on it).
# Usage: tests/cuda_emulator/run.sh; exit status gpu_layers's.
set -euo pipefail
cd "$(dirname "$0")/../.."
env -u MAKEFLAGS -u MAKELEVEL make --no-print-directory -j2 CUDA=emulated build/cuda_emulated/tests/bin/gpu_layers
OPENBLAS_NUM_THREADS=1 build/cuda_emulated/tests/bin/gpu_layers
