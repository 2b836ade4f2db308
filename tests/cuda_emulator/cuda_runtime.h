/* cuda_runtime.h of the CUDA emulator: the part of the CUDA runtime that core/cuda/ uses (cuda_device.c,
 * cuda_stream.c in C; kernels.cu, cuda_ops.cu as C++), on the CPU, so the CUDA device runs where there is no GPU.
 * `make CUDA=emulated` builds the whole runtime on it (FSDPLAB_CUDA defined) into build/cuda_emulated/:
 * tests/cuda_emulator/run.sh runs tests/gpu_layers.c there, tests/suites/cuda_emulated.sh lab 05.
 *
 * What it is:
 *   - Kernels: a block's threads are fibers (ucontext, emulator.cpp), run one at a time until each reaches
 *     __syncthreads, a warp's barrier (inside __shfl_down_sync) or its end; blocks run one after another, so
 *     `__shared__` can be a function's static. The arithmetic is the host's: g++ without contraction, glibc's expf
 *     (not CUDA's), no fused multiply-adds the source does not write.
 *   - Every call is synchronous: a kernel, a copy, a memset is done when it returns; an event is complete when it is
 *     recorded (its time: the host's monotonic clock then); a stream is a handle that is checked, nothing more.
 *   - Memory (runtime.cpp): cudaMalloc's blocks are mmap'd pages, filled with 0xff bytes (a NaN in every float) as
 *     fresh GPU memory holds garbage, and made inaccessible (PROT_NONE) whenever no kernel, copy, memset or cuBLAS
 *     call is running: host code that reads or writes GPU memory gets SIGSEGV, as it would on a GPU. cudaMallocHost's
 *     blocks are registered as pinned. cudaMemcpyAsync checks its kind against where the pointers are (device: inside
 *     one cudaMalloc block; host: not in any) and that the bytes fit in that block; cudaMemsetAsync likewise;
 *     cudaFree / cudaFreeHost take only a block's start; a stream or event used after its destroy is an error.
 *     A call the emulator refuses returns an error code (cudaErrorInvalidValue, ...), which the caller's CUDA_CHECK
 *     reports with the rank and line; cudaGetLastError returns and clears the calling thread's last error.
 *   - cuBLAS (cublas_v2.h): OpenBLAS's column-major cblas_sgemm, cuBLAS's exact meaning; the GemmEx GEMMs under
 *     CUBLAS_COMPUTE_32F_FAST_16BF also check that every A and B element is a bfloat16 value (abort otherwise).
 *   - GPUs: CUDA_EMULATOR_DEVICES (default 1) of them, all the same memory; cudaSetDevice per thread. Each one's
 *     size, as cudaMemGetInfo says it: CUDA_EMULATOR_MEMORY bytes (default the host's MemTotal); its free bytes that
 *     size less this process's live cudaMalloc blocks, and at most the host's MemAvailable. With CUDA_EMULATOR_MEMORY
 *     set, a cudaMalloc past it fails with cudaErrorMemoryAllocation, as on a full GPU.
 *
 * What it does not model: asynchrony (no work is ever in flight, so a missing cudaStreamSynchronize, event or
 * cudaStreamWaitEvent is never seen), races between blocks or between streams, kernels reading host memory (a kernel
 * may dereference any pointer), the bus (PCIe bandwidth, pinned vs pageable speed), GPU memory shared between processes
 * (each counts only its own blocks against CUDA_EMULATOR_MEMORY, and without it cudaMalloc never fails), timing
 * (cudaEventElapsedTime is host time), TF32 (the math mode is recorded only), and CUDA's own arithmetic (expf, rsqrtf,
 * fma contraction by nvcc). NCCL's calls are MPI's here (nccl.h says how).
 */
#ifndef FSDPLAB_CUDA_EMULATOR_RUNTIME_H
#define FSDPLAB_CUDA_EMULATOR_RUNTIME_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Defined in the emulator's build only: a check may tell the emulator (the host's arithmetic: glibc's expf, no
 * contraction) from a GPU (CUDA's expf, nvcc's fused multiply-adds). */
#define FSDPLAB_CUDA_EMULATOR 1

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
    cudaErrorIllegalAddress = 700, /* the emulator's: a pointer not where the call's kind says it is */
} cudaError_t;
typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;
enum cudaMemcpyKind { cudaMemcpyHostToHost, cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice,
                      cudaMemcpyDefault };
typedef enum cudaMemcpyKind cudaMemcpyKind;
#define cudaStreamDefault 0x0u
#define cudaStreamNonBlocking 0x1u
#define cudaEventDefault 0x0u
#define cudaEventDisableTiming 0x2u

/* The emulator's own: the kernel launches and cuBLAS calls (one per API call, a batched GEMM one) so far in the
 * process, for tests that count what a device function queues (a GPU's per-call overhead is per launch). */
unsigned long long emulator_work_count(void);
/* And the host's stops so far (CUDA_EMULATOR_SYNC_LOG's last count: its synchronizes and event queries made while
 * work queued since its previous look was still to run; a poll of one event until it completes is one), for tests
 * that count where a device function makes the host wait for the GPU. */
unsigned long long emulator_host_stop_count(void);

const char *cudaGetErrorString(cudaError_t error);
const char *cudaGetErrorName(cudaError_t error);
cudaError_t cudaGetLastError(void);
cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaMalloc(void **ptr, size_t bytes);
cudaError_t cudaFree(void *ptr);
cudaError_t cudaMallocHost(void **ptr, size_t bytes);
cudaError_t cudaFreeHost(void *ptr);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind, cudaStream_t stream);
cudaError_t cudaMemsetAsync(void *ptr, int value, size_t bytes, cudaStream_t stream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags);
cudaError_t cudaEventCreate(cudaEvent_t *event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream);
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);

/* The emulator's own: GPU memory is open to the host between begin and end (a kernel, copy, memset, GEMM). Nested
 * and thread-safe (a count). */
void emulator_device_access_begin(void);
void emulator_device_access_end(void);
/* Whether [ptr, ptr + bytes) lies inside one cudaMalloc block. */
int emulator_is_device(const void *ptr, size_t bytes);
/* Whether a stream handle is live (or 0, the default stream). */
int emulator_stream_ok(cudaStream_t stream);
/* Records err as the calling thread's last error (cudaGetLastError) and returns it. */
cudaError_t emulator_fail(cudaError_t err, const char *what);

#ifdef __cplusplus
}

/* ---- the kernels' side (C++ only: kernels.cu through translate.py, cuda_ops.cu) ---- */
#include <algorithm>
#include <functional>

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

/* kernel<<<grid, block, shared, stream>>>(args) becomes emulator_launch(grid, block, stream, [&] { kernel(args); })
 * (translate.py). A launch on a destroyed stream, or with no threads or more than 1024, is refused (the thread's last
 * error, as CUDA reports a bad launch: cudaGetLastError after it). */
void emulator_launch(dim3 grid, dim3 block, cudaStream_t stream, std::function<void()> body);
void __syncthreads();
void emulator_warp_barrier();
unsigned emulator_linear_thread();
/* The words a warp's shuffle exchanges: two sets per warp, its shuffles alternating by the generation of the warp's
 * barrier. Every lane of one shuffle writes in the same generation (none passes the barrier before all have written),
 * and a lane that writes a set again has passed a barrier every lane reached after its read of that set: so one
 * barrier a shuffle suffices (a single set would need a second, before anyone may write the next round). */
uint64_t *emulator_shuffle_lanes(unsigned warp);

/* Every lane of the warp writes its value, waits for the others, and reads lane + offset's (its own past the end). */
template <typename T>
T __shfl_down_sync(unsigned, T value, int offset) {
    static_assert(sizeof(T) <= sizeof(uint64_t), "a shuffle moves at most 8 bytes");
    unsigned thread = emulator_linear_thread(), lane = thread % 32;
    uint64_t *lanes = emulator_shuffle_lanes(thread / 32), raw = 0;
    memcpy(&raw, &value, sizeof(T));
    lanes[lane] = raw;
    emulator_warp_barrier();
    T result = value;
    if (lane + offset < 32) memcpy(&result, &lanes[lane + offset], sizeof(T));
    return result;
}

using std::max;
using std::min;
#endif

#endif
