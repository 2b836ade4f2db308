/* kernel_profile.h — PROFILE_KERNELS=1: where a step's GPU time goes, kernel by kernel, for core/cuda/ only.
 *
 * The trace's `compute` spans time whole pieces (a layer's forward, its backward). This profile times every piece
 * of work the compute stream runs: each kernel launch, cuBLAS call and copy or fill queued by core/cuda/ goes
 * between a pair of CUDA events (CUDA_TIMED below), and at each step's end, when the trainer reads the compute
 * spans' timers (device.timers_reset), the pairs are read and added up per kind of work (the launch function's name,
 * a GEMM's name with its m x n x k). The first step is left out (cuBLAS picks its kernels and the caching allocator
 * grows then); work after the last step (the last checkpoint) is in no step. session_close writes the table,
 * per step, into OUT/kernels_rank<R>.txt (cuda_profile_write): calls, milliseconds and share of the total, largest
 * first.
 *
 * What it shows and does not: the GPU time of each piece of work, not the gaps between them (a step's time minus
 * the table's total is the compute stream's idle time: host latency, waits for collectives); an event pair per call
 * costs a few microseconds of GPU time, so a profiled step is slower than the benchmark's. Only the thread that
 * opened the device records (a BACKEND=mpi comm stream's thread, which stages copies, does not). A step that runs
 * more than DEVICE_TIMERS_MAX pieces reads its timers twice, and counts as two steps here.
 */
#ifndef FSDPLAB_CUDA_KERNEL_PROFILE_H
#define FSDPLAB_CUDA_KERNEL_PROFILE_H

#include <cuda_runtime.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cuda_kernel_profile cuda_kernel_profile;

cuda_kernel_profile *cuda_profile_create(int rank);
void cuda_profile_destroy(cuda_kernel_profile *profile);

/* Marks `stream` before a call: the mark to hand to cuda_profile_end; -1 without a profile (NULL), or on another
 * thread than the one that made it. */
int cuda_profile_begin(cuda_kernel_profile *profile, cudaStream_t stream);
/* Marks its end: the call was `label` (a launch's source text "name_launch(...)", or a name), m x n x k its GEMM's
 * sizes (0 for others). */
void cuda_profile_end(cuda_kernel_profile *profile, int mark, cudaStream_t stream, const char *label, int m, int n,
                      int k);
/* The step's last end event (NULL: none this step): the caller waits for it (cuda_event_wait), then collects. */
cudaEvent_t cuda_profile_last_event(const cuda_kernel_profile *profile);
/* A step's end, its last event complete: its pairs read and added to the totals, the first step's left out. */
void cuda_profile_collect(cuda_kernel_profile *profile);
/* The totals per step into `path`, the title line first; 0, or -1 (errno's reason in `error`). */
int cuda_profile_write(const cuda_kernel_profile *profile, const char *path, const char *title, char *error,
                       size_t error_size);

/* `call` (work queued on s->compute; s a cuda_device_state, core/cuda/cuda_device.h) between a pair of s->profile's
 * events, as `label` with m, n, k; without a profile, just `call`. */
#define CUDA_TIMED(s, label, m, n, k, call)                                                                          \
    do {                                                                                                             \
        int profile_mark_ = cuda_profile_begin((s)->profile, (s)->compute);                                          \
        call;                                                                                                        \
        cuda_profile_end((s)->profile, profile_mark_, (s)->compute, (label), (m), (n), (k));                         \
    } while (0)

#ifdef __cplusplus
}
#endif

#endif
