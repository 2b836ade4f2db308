#!/bin/bash
# tests/cuda_emulator/run.sh — builds tests/gpu_layers.c against the CUDA device of core/cuda/ running on the CUDA
# emulator (this folder: CPU fibers for GPU threads, OpenBLAS's column-major GEMM for cuBLAS) and runs it: every
# kernel and every cuBLAS call of the CUDA backend checked against the CPU layers where there is no GPU.
# Usage: tests/cuda_emulator/run.sh [BUILD_DIR]   (default tests/bin/cuda_emulator); exit status gpu_layers's.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-tests/bin/cuda_emulator}
mkdir -p "$build"
blas_cflags=$(pkg-config --cflags openblas)
blas_libs=$(pkg-config --libs openblas)
# The emulator's cuda_runtime.h and cublas_v2.h come first; no CUDA toolkit on the include path.
cxx=(g++ -std=c++17 -O2 -ffp-contract=off -Wall -Wextra -Werror -Wno-unused-parameter -Itests/cuda_emulator -Icore/cuda -Icore $blas_cflags)
python3 tests/cuda_emulator/translate.py core/cuda/kernels.cu > "$build/kernels.cpp"
"${cxx[@]}" -c tests/cuda_emulator/emulator.cpp -o "$build/emulator.o"
"${cxx[@]}" -c tests/cuda_emulator/device.cpp -o "$build/device.o"
"${cxx[@]}" -c "$build/kernels.cpp" -o "$build/kernels.o"
"${cxx[@]}" -x c++ -c core/cuda/cuda_ops.cu -o "$build/cuda_ops.o"
${CC:-mpicc} -std=c11 -O2 -Wall -Wextra -Werror -c tests/gpu_layers.c -o "$build/gpu_layers.o"
g++ "$build/gpu_layers.o" "$build/emulator.o" "$build/device.o" "$build/kernels.o" "$build/cuda_ops.o" \
  core/libfsdplab.a trace/libfsdptrace.a $blas_libs $(pkg-config --libs libcjson libpcre2-8 libutf8proc) $(${CC:-mpicc} --showme:link) -lm -o "$build/gpu_layers"
OPENBLAS_NUM_THREADS=1 "$build/gpu_layers"
