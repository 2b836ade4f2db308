/* cuda_device.h — the CUDA device's state behind core/device/device.h (`device.impl`), for the files of core/cuda/
 * only.
 *
 * One GPU per rank, chosen from the node-local rank (core/runtime/context.h local_rank). Every kernel and GEMM runs on
 * `compute`, the rank's compute stream; the all-gather and reduce-scatter streams of core/comm/stream.h are other
 * cudaStreams ordered against it with CUDA events. Only files compiled in a `make CUDA=1` build include this.
 */
#ifndef FSDPLAB_CUDA_DEVICE_H
#define FSDPLAB_CUDA_DEVICE_H

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/cuda/cuda_check.h"
#include "core/cuda/kernel_profile.h"
#include "core/device/device.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CUDA_DEVICE_STREAMS 16 /* comm streams a device may have at once (cuda_device_add_stream) */

typedef struct cuda_device_state {
    int rank;                     /* for messages */
    int ordinal;                  /* cudaSetDevice's */
    cudaStream_t compute;         /* the compute stream */
    cublasHandle_t cublas;        /* bound to `compute` */
    int allow_tf32;               /* ALLOW_TF32=1: cuBLAS may use TF32 tensor cores for float32 GEMMs (off: exact
                                     fp32) */
    /* Reductions' partial results (sum_squares, sum_abs, first_nonfinite, the loss): a small device buffer and its
     * pinned host twin, made once at init outside the caching allocator (like cuBLAS's own workspace; they are the
     * device's tools, not tensors of the run). */
    void *scratch;
    size_t scratch_bytes;
    void *host_scratch;
    /* device.h's loss slots: DEVICE_LOSS_SLOTS (sum, count) pairs of doubles, made and zeroed at init, likewise
     * outside the caching allocator; read through host_scratch. */
    double *loss_slots;
    /* The runtime's (cuda_device.c, cuda_stream.c): */
    int device_count;             /* GPUs this rank sees (BACKEND=nccl needs one per rank of a node) */
    struct cuda_event_pool *compute_events; /* the compute stream's events */
    cudaStream_t clock;           /* an idle stream: an event recorded on it completes at once (the trace clock) */
    cudaEvent_t clock_event;
    /* device.timer_*: a start and a stop event per timer (made on first use, kept), and the reference event recorded
     * on `clock` when the first timer of a batch starts, at host time reference_seconds (CLOCK_MONOTONIC): a mark's
     * time is reference_seconds plus cudaEventElapsedTime from the reference. */
    cudaEvent_t timer_events[DEVICE_TIMERS_MAX][2];
    cudaEvent_t timer_reference;
    /* copy_from_pinned's: recorded after the last such copy; pending until pinned_copies_wait saw it complete */
    cudaEvent_t pinned_copy_event;
    int pinned_copy_pending;
    double reference_seconds;
    double timeout_seconds;       /* the context's TIMEOUT (0: never), for cuda_event_wait */
    /* The comm streams' cudaStreams and event pools (cuda_stream.c adds and removes them): with the compute stream,
     * every queue the device's work is on, for cuda_device_drain. */
    struct {
        cudaStream_t stream;
        struct cuda_event_pool *events;
        const char *name;
    } streams[CUDA_DEVICE_STREAMS];
    int stream_count;
    struct cuda_kernel_profile *profile; /* PROFILE_KERNELS=1's event pairs (core/cuda/kernel_profile.h); or NULL */
} cuda_device_state;

/* The host waits for `event` by polling it (yielding for WORLD_POLL_SPIN_US, then sleeping from 1 us doubling to
 * WORLD_POLL_MAX_US, as core/runtime/world.h's world_poll), so that a wait that never ends can end: 0 once it has
 * completed; 1 as soon as `failed` (called between polls with `arg`; NULL: never) returns nonzero; -1 when it is not
 * complete after timeout_seconds (0: never). */
int cuda_event_poll(int rank, cudaEvent_t event, double timeout_seconds, int (*failed)(void *arg), void *arg);
/* The host waits for `event` (cuda_event_poll under the device's TIMEOUT). A GPU queue that does not reach it in time
 * is stuck behind a collective a rank has not joined (BACKEND=nccl: the compute stream waits for the collectives on
 * the device), so the run ends there with a message naming `what` waited (and the stream's name, where not NULL), as
 * the collectives' watchdog does. */
void cuda_event_wait(const cuda_device_state *device, cudaEvent_t event, const char *what, const char *stream_name);
/* The host waits for everything queued on the compute stream so far: an event of its pool recorded now, waited for
 * by cuda_event_wait. Never cudaStreamSynchronize, which waits without end when the stream is held back by a
 * collective a stopped rank never joins. */
void cuda_compute_wait(cuda_device_state *device, const char *what);
/* The host waits for everything queued on `stream` so far: the next event of its pool recorded now, then
 * cuda_event_wait (`stream_name` names it in the timeout's message). The one way core/cuda waits for a queue. */
void cuda_queue_wait(const cuda_device_state *device, struct cuda_event_pool *pool, cudaStream_t stream,
                     const char *what, const char *stream_name);
/* The host waits for everything queued on every stream of the device, compute and comm streams (what
 * cudaDeviceSynchronize waits for), each through an event of its pool polled under TIMEOUT (cuda_event_wait): before a
 * segment goes back (work queued before its blocks were freed may still use it) and at close. */
void cuda_device_drain(cuda_device_state *device, const char *what);
/* cuda_stream.c's comm streams, known to cuda_device_drain from their init to their destroy. */
void cuda_device_add_stream(cuda_device_state *device, cudaStream_t stream, struct cuda_event_pool *events,
                            const char *name);
void cuda_device_remove_stream(cuda_device_state *device, cudaStream_t stream);

/* A pool of CUDA_EVENT_POOL events for one cudaStream, recorded in turn and created on first use (the compute
 * stream's is the device's; core/cuda/cuda_stream.c makes one per comm stream). */
#define CUDA_EVENT_POOL 1024
typedef struct cuda_event_pool cuda_event_pool;
cuda_event_pool *cuda_event_pool_create(int rank);
void cuda_event_pool_destroy(cuda_event_pool *pool);
/* The pool's next event, recorded on `stream` now. With timing (cudaEventElapsedTime needs it). */
cudaEvent_t cuda_event_pool_record(cuda_event_pool *pool, cudaStream_t stream);

/* Makes the CUDA device for this rank: picks the GPU from the node-local rank, creates the compute stream and the
 * cuBLAS handle. 0, or -1 with a message in error (no GPU, a busy GPU, ...). */
int cuda_device_init(device *d, int local_rank, int local_size, char *error, size_t error_size);
/* ALLOW_TF32 (core/runtime/session.c reads it): cuBLAS's math mode for float32 GEMMs. */
void cuda_device_allow_tf32(device *d, int allow);
/* device_destroy of the CUDA device: the cuBLAS handle, streams, events, scratch buffers. Every segment of the
 * caching allocators must have gone back first (mem_shutdown). */
void cuda_device_destroy(device *d);

/* Sets the layer, vector and AdamW functions of the table (core/cuda/kernels.cu); the memory functions and the
 * segments are cuda_device.c's. */
void cuda_ops_install(device *d);

#ifdef __cplusplus
}
#endif

#endif
