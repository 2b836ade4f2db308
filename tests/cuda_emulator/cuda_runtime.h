/* cuda_runtime.h of the CUDA emulator (tests/cuda_emulator/run.sh runs it): the part of the CUDA runtime that
 * core/cuda/kernels.cu and cuda_ops.cu use, on the CPU, so their kernels run where there is no GPU.
 *
 * A block's threads are fibers (ucontext), run one at a time until each reaches __syncthreads, a warp's barrier
 * (inside __shfl_down_sync) or its end; blocks run one after another, so `__shared__` can be a function's static.
 * Memory is host memory; a stream is nothing (every call is done when it returns). It checks logic (indices,
 * masks, reductions, barriers, the GEMMs' arguments), not speed or races between blocks, and the arithmetic is
 * the host's: g++ without contraction, glibc's expf (not CUDA's), no fused multiply-adds the source does not write.
 */
#ifndef FSDPLAB_CUDA_EMULATOR_RUNTIME_H
#define FSDPLAB_CUDA_EMULATOR_RUNTIME_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <functional>

typedef int cudaError_t;
enum { cudaSuccess = 0 };
typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t; /* cuda_device_state names one; the emulated device records none */
enum cudaMemcpyKind { cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice, cudaMemcpyDefault };

static inline cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind, cudaStream_t) {
    memmove(dst, src, bytes);
    return cudaSuccess;
}
static inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
/* A launch the emulator refuses aborts, so there is never an error left to report. */
static inline cudaError_t cudaGetLastError() { return cudaSuccess; }

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct emulator_index {
    unsigned x, y, z;
};
extern emulator_index emulator_thread, emulator_block;
extern dim3 emulator_block_dim, emulator_grid_dim;
#define threadIdx emulator_thread
#define blockIdx emulator_block
#define blockDim emulator_block_dim
#define gridDim emulator_grid_dim
#define __global__
#define __device__
#define __host__
#define __shared__ static
#define __launch_bounds__(threads)

/* kernel<<<grid, block, 0, stream>>>(args) becomes emulator_launch(grid, block, [&] { kernel(args); })
 * (translate.py). */
void emulator_launch(dim3 grid, dim3 block, std::function<void()> body);
void __syncthreads();
void emulator_warp_barrier();
unsigned emulator_linear_thread();
extern uint64_t emulator_lanes[32][32];

/* Every lane of the warp writes its value, waits for the others, reads lane + offset's (its own past the end),
 * and waits again before anyone may write the next round. */
template <typename T>
T __shfl_down_sync(unsigned, T value, int offset) {
    static_assert(sizeof(T) <= sizeof(uint64_t), "a shuffle moves at most 8 bytes");
    unsigned thread = emulator_linear_thread(), warp = thread / 32, lane = thread % 32;
    uint64_t raw = 0;
    memcpy(&raw, &value, sizeof(T));
    emulator_lanes[warp][lane] = raw;
    emulator_warp_barrier();
    T result = value;
    if (lane + offset < 32) memcpy(&result, &emulator_lanes[warp][lane + offset], sizeof(T));
    emulator_warp_barrier();
    return result;
}

using std::max;
using std::min;

#endif
