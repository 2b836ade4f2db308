/* cuda_device.c — the CUDA device of core/device/device.h: the rank's GPU, its compute stream and cuBLAS handle, and
 * where the caching allocators' segments come from (cudaMalloc for the device pool, pinned host memory for the host
 * pool). The layer, vector and AdamW functions are core/cuda/kernels.cu's (cuda_ops_install). See cuda_device.h. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, nanosleep */
#include "core/cuda/cuda_device.h"

#include <math.h>
#include <mpi.h>
#include <sched.h>
#include <string.h>
#include <time.h>

#include "core/runtime/world.h"


/* The reductions' partial results (cuda_device.h `scratch`): 1 MiB holds 65,536 blocks' 16-byte partials. */
#define CUDA_SCRATCH_BYTES ((size_t)1 << 20)

/* ---- the host's waits for the GPU ---- */

int cuda_event_poll(int rank, cudaEvent_t event, double timeout_seconds, int (*failed)(void *arg), void *arg) {
    double start = MPI_Wtime();
    double deadline = timeout_seconds > 0 ? start + timeout_seconds : INFINITY;
    long sleep_ns = 0;
    for (;;) {
        cudaError_t status = cudaEventQuery(event);
        if (status == cudaSuccess) return 0;
        if (status != cudaErrorNotReady) CUDA_CHECK(rank, status);
        (void)cudaGetLastError(); /* not ready is not an error */
        if (failed != NULL && failed(arg)) return 1;
        double now = MPI_Wtime();
        if (now > deadline) return -1;
        if (now - start < WORLD_POLL_SPIN_US * 1e-6) {
            sched_yield();
            continue;
        }
        sleep_ns = sleep_ns == 0 ? 1000 : sleep_ns * 2;
        if (sleep_ns > WORLD_POLL_MAX_US * 1000L) sleep_ns = WORLD_POLL_MAX_US * 1000L;
        struct timespec pause = {0, sleep_ns};
        nanosleep(&pause, NULL);
    }
}

void cuda_event_wait(const cuda_device_state *device, cudaEvent_t event, const char *what, const char *stream_name) {
    if (cuda_event_poll(device->rank, event, device->timeout_seconds, NULL, NULL) == 0) return;
    fprintf(stderr, "rank %d: %s%s%s%s timed out: the GPU had not got there after %g s (TIMEOUT); its queue is stuck, "
            "most likely behind a collective that a rank has not joined (it stopped, died or fell behind by more than "
            "that)\n", device->rank, what, stream_name ? " on stream '" : "", stream_name ? stream_name : "",
            stream_name ? "'" : "", device->timeout_seconds);
    cuda_abort_run();
}

void cuda_queue_wait(const cuda_device_state *device, struct cuda_event_pool *pool, cudaStream_t stream,
                     const char *what, const char *stream_name) {
    cuda_event_wait(device, cuda_event_pool_record(pool, stream), what, stream_name);
}

void cuda_compute_wait(cuda_device_state *device, const char *what) {
    cuda_queue_wait(device, device->compute_events, device->compute, what, "compute");
}

void cuda_device_drain(cuda_device_state *device, const char *what) {
    for (int i = 0; i < device->stream_count; i++)
        cuda_queue_wait(device, device->streams[i].events, device->streams[i].stream, what, device->streams[i].name);
    cuda_compute_wait(device, what);
}

void cuda_device_add_stream(cuda_device_state *device, cudaStream_t stream, struct cuda_event_pool *events,
                            const char *name) {
    if (device->stream_count == CUDA_DEVICE_STREAMS) {
        fprintf(stderr, "rank %d: cuda device: stream '%s' is one more than the %d comm streams a device keeps "
                        "(CUDA_DEVICE_STREAMS)\n", device->rank, name, CUDA_DEVICE_STREAMS);
        cuda_abort_run();
    }
    device->streams[device->stream_count].stream = stream;
    device->streams[device->stream_count].events = events;
    device->streams[device->stream_count].name = name;
    device->stream_count++;
}

void cuda_device_remove_stream(cuda_device_state *device, cudaStream_t stream) {
    for (int i = 0; i < device->stream_count; i++)
        if (device->streams[i].stream == stream) {
            device->streams[i] = device->streams[--device->stream_count];
            return;
        }
}

/* ---- event pools (a cudaStream's events, recorded in turn: core/cuda/cuda_stream.h says why) ---- */

struct cuda_event_pool {
    int rank;                     /* for messages */
    size_t next;                  /* records so far: the next event is events[next % CUDA_EVENT_POOL] */
    cudaEvent_t events[CUDA_EVENT_POOL];
};

cuda_event_pool *cuda_event_pool_create(int rank) {
    cuda_event_pool *pool = calloc(1, sizeof *pool);
    if (pool == NULL) CUDA_CHECK(rank, cudaErrorMemoryAllocation); /* the host's memory: aborts, naming the rank */
    pool->rank = rank;
    return pool;
}

void cuda_event_pool_destroy(cuda_event_pool *pool) {
    if (pool == NULL) return;
    for (size_t i = 0; i < CUDA_EVENT_POOL; i++)
        if (pool->events[i] != NULL) CUDA_CHECK(pool->rank, cudaEventDestroy(pool->events[i]));
    free(pool);
}

/* The pool's next event, recorded on `stream` now. With timing (cudaEventElapsedTime needs it). */
cudaEvent_t cuda_event_pool_record(cuda_event_pool *pool, cudaStream_t stream) {
    cudaEvent_t *event = &pool->events[pool->next++ % CUDA_EVENT_POOL];
    if (*event == NULL) CUDA_CHECK(pool->rank, cudaEventCreate(event));
    CUDA_CHECK(pool->rank, cudaEventRecord(*event, stream));
    return *event;
}

/* ---- core/comm/stream.c's device side ---- */

/* ---- segments ---- */

/* A segment from cudaMalloc or cudaMallocHost (`status`, `ptr`). Out of memory returns NULL: the caching allocator
 * then empties its cache and asks once more, as torch's does, and mem_alloc names the request if that fails too. Any
 * other failure aborts. */
static void *segment_or_null(const cuda_device_state *device, cudaError_t status, void *ptr, const char *call,
                             size_t bytes) {
    if (status == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError(); /* clear it, so a later kernel launch's check does not report this refusal */
        return NULL;
    }
    if (status != cudaSuccess) {
        char what[96];
        snprintf(what, sizeof what, "%s of a %zu-byte segment", call, bytes);
        cuda_check(device->rank, status, what, __FILE__, __LINE__);
    }
    return ptr;
}

static void *device_segment_alloc(void *state, size_t bytes) {
    void *ptr = NULL;
    cudaError_t status = cudaMalloc(&ptr, bytes);
    return segment_or_null(state, status, ptr, "cudaMalloc", bytes);
}

/* A segment goes back when none of its blocks is allocated; work queued before the blocks were freed may still read
 * or write it, so the device finishes its work first (every stream drained under TIMEOUT; cudaFree then finds it
 * idle). Rare (empty_cache, a retry after out of memory, shutdown). */
static void device_segment_free(void *state, void *ptr, size_t bytes) {
    cuda_device_state *device = state;
    (void)bytes;
    cuda_device_drain(device, "the wait before a GPU segment goes back");
    CUDA_CHECK(device->rank, cudaFree(ptr));
}

/* mem_alloc's zeroed blocks: queued on the compute stream, before any kernel the caller queues after it. */
static void device_segment_zero(void *state, void *ptr, size_t bytes) {
    cuda_device_state *device = state;
    CUDA_TIMED(device, "cudaMemsetAsync", 0, 0, 0,
               CUDA_CHECK(device->rank, cudaMemsetAsync(ptr, 0, bytes, device->compute)));
}

/* Pinned (page-locked) host memory: the host pool of CPU offload and the staging buffers of BACKEND=mpi, so copies to
 * and from the GPU run at the bus's speed without a bounce through a driver buffer. */
static void *pinned_segment_alloc(void *state, size_t bytes) {
    void *ptr = NULL;
    cudaError_t status = cudaMallocHost(&ptr, bytes);
    return segment_or_null(state, status, ptr, "cudaMallocHost", bytes);
}

static void pinned_segment_free(void *state, void *ptr, size_t bytes) {
    cuda_device_state *device = state;
    (void)bytes;
    cuda_device_drain(device, "the wait before a pinned segment goes back"); /* no copy in flight may use it */
    CUDA_CHECK(device->rank, cudaFreeHost(ptr));
}

/* ---- the memory functions of the table ---- */

static void cuda_zero(device *d, void *ptr, size_t bytes) {
    cuda_device_state *device = d->impl;
    if (bytes == 0) return;
    CUDA_TIMED(device, "cudaMemsetAsync", 0, 0, 0,
               CUDA_CHECK(device->rank, cudaMemsetAsync(ptr, 0, bytes, device->compute)));
}

/* Every copy is queued on the compute stream, so it comes after the kernels that wrote its source and before those
 * that read its destination. One that ends in host memory is waited for: the host reads it next. One that starts in
 * host memory is waited for too: the caller may write that memory again at once (a pinned source is read by the
 * copy engine when the copy runs, not when it is queued). A device-to-device copy stays queued. */
static void cuda_copy(device *d, void *dst, const void *src, size_t bytes, device_copy_kind kind) {
    static const struct {
        enum cudaMemcpyKind kind;
        const char *label, *wait; /* the profile's name; the host's wait (NULL: none) */
    } copies[] = {
        [DEVICE_H2D] = {cudaMemcpyHostToDevice, "cudaMemcpyAsync host to device", "the wait for a copy to the GPU"},
        [DEVICE_D2H] = {cudaMemcpyDeviceToHost, "cudaMemcpyAsync device to host", "the wait for a copy to the host"},
        [DEVICE_D2D] = {cudaMemcpyDeviceToDevice, "cudaMemcpyAsync device to device", NULL},
    };
    cuda_device_state *device = d->impl;
    if (bytes == 0) return;
    if (kind == DEVICE_H2H) {
        memcpy(dst, src, bytes); /* no queued work touches host memory: every copy above that does was waited for */
        return;
    }
    if ((unsigned)kind >= sizeof copies / sizeof copies[0]) {
        fprintf(stderr, "rank %d: device copy of %zu bytes: unknown direction %d\n", device->rank, bytes, (int)kind);
        cuda_abort_run();
    }
    CUDA_TIMED(device, copies[kind].label, 0, 0, 0,
               CUDA_CHECK(device->rank, cudaMemcpyAsync(dst, src, bytes, copies[kind].kind, device->compute)));
    if (copies[kind].wait != NULL) cuda_compute_wait(device, copies[kind].wait);
}

/* Tokens and targets: queued, not waited for (a pageable source is safe too: CUDA stages it before returning). */
static void cuda_copy_from_pinned(device *d, void *dst, const void *src, size_t bytes) {
    cuda_device_state *device = d->impl;
    if (bytes == 0) return;
    CUDA_TIMED(device, "cudaMemcpyAsync host to device", 0, 0, 0,
               CUDA_CHECK(device->rank, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, device->compute)));
    CUDA_CHECK(device->rank, cudaEventRecord(device->pinned_copy_event, device->compute));
    device->pinned_copy_pending = 1;
}

static void cuda_pinned_copies_wait(device *d) {
    cuda_device_state *device = d->impl;
    if (!device->pinned_copy_pending) return;
    cuda_event_wait(device, device->pinned_copy_event, "the wait for the last batch's token copy", NULL);
    device->pinned_copy_pending = 0;
}

static void cuda_synchronize(device *d) {
    cuda_device_state *device = d->impl;
    cuda_compute_wait(device, "the host's wait for the GPU");
}

/* cudaMemGetInfo of this rank's GPU (its context is current: cudaSetDevice at init). */
static void cuda_memory_info(device *d, size_t *free_bytes, size_t *total_bytes) {
    cuda_device_state *device = d->impl;
    CUDA_CHECK(device->rank, cudaMemGetInfo(free_bytes, total_bytes));
}

/* ---- timers (device.h: compute spans read once a step) ---- */

static double monotonic_seconds(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + 1e-9 * (double)now.tv_nsec;
}

/* The first timer of a batch records the reference on the idle clock stream: it completes as it is recorded, so its
 * GPU time is the host's time then (within a launch latency). */
static int cuda_timer_start(device *d) {
    cuda_device_state *device = d->impl;
    if (d->timer_count == DEVICE_TIMERS_MAX) return -1;
    if (d->timer_count == 0) {
        CUDA_CHECK(device->rank, cudaEventRecord(device->timer_reference, device->clock));
        device->reference_seconds = monotonic_seconds();
    }
    int timer = d->timer_count++;
    for (int mark = 0; mark < 2; mark++)
        if (device->timer_events[timer][mark] == NULL)
            CUDA_CHECK(device->rank, cudaEventCreate(&device->timer_events[timer][mark]));
    CUDA_CHECK(device->rank, cudaEventRecord(device->timer_events[timer][0], device->compute));
    return timer;
}

static void cuda_timer_stop(device *d, int timer) {
    cuda_device_state *device = d->impl;
    CUDA_CHECK(device->rank, cudaEventRecord(device->timer_events[timer][1], device->compute));
}

/* The compute stream runs in order: once the last stop has passed, every mark before it has. */
static void cuda_timers_wait(device *d) {
    cuda_device_state *device = d->impl;
    if (d->timer_count == 0) return;
    cuda_event_wait(device, device->timer_events[d->timer_count - 1][1], "the wait for the step's compute timers",
                    "compute");
}

static void cuda_timer_read(device *d, int timer, double *start_seconds, double *end_seconds) {
    cuda_device_state *device = d->impl;
    float start_ms = 0.0f, end_ms = 0.0f;
    CUDA_CHECK(device->rank, cudaEventElapsedTime(&start_ms, device->timer_reference, device->timer_events[timer][0]));
    CUDA_CHECK(device->rank, cudaEventElapsedTime(&end_ms, device->timer_reference, device->timer_events[timer][1]));
    *start_seconds = device->reference_seconds + 1e-3 * (double)start_ms;
    *end_seconds = device->reference_seconds + 1e-3 * (double)end_ms;
}

/* A step's end (the trainer reads its spans once a step): PROFILE_KERNELS' pairs are read here too. */
static void cuda_timers_reset(device *d) {
    cuda_device_state *device = d->impl;
    d->timer_count = 0;
    if (device->profile == NULL) return;
    cudaEvent_t last = cuda_profile_last_event(device->profile);
    if (last != NULL) cuda_event_wait(device, last, "PROFILE_KERNELS' read of the step's events", "compute");
    cuda_profile_collect(device->profile);
}

/* ---- making and ending the device ---- */

void cuda_device_allow_tf32(device *d, int allow) {
    cuda_device_state *device = d->impl;
    device->allow_tf32 = allow;
    /* CUBLAS_DEFAULT_MATH computes float32 GEMMs in float32; the TF32 mode may round their inputs to 10 mantissa
     * bits on the tensor cores (torch.backends.cuda.matmul.allow_tf32). */
    CUBLAS_CHECK(device->rank,
                 cublasSetMathMode(device->cublas, allow ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
}

int cuda_device_init(device *d, int local_rank, int local_size, char *error, size_t error_size) {
    memset(d, 0, sizeof *d);
    int rank = 0, initialized = 0; /* the world rank, for messages only (a test program may run without MPI) */
    MPI_Initialized(&initialized);
    if (initialized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    int count = 0;
    cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess || count == 0) {
        (void)cudaGetLastError();
        snprintf(error, error_size, "no CUDA GPU here (cudaGetDeviceCount: %s): run where there is one, or with "
                 "DEVICE=cpu", status != cudaSuccess ? cudaGetErrorString(status) : "0 devices");
        return -1;
    }
    /* The node's ranks take the node's GPUs in turn; more ranks than GPUs share them (BACKEND=mpi only: NCCL refuses
     * two ranks on one GPU, which core/cuda/plugin.c says before NCCL would). */
    int ordinal = local_rank % count;
    status = cudaSetDevice(ordinal);
    if (status == cudaSuccess) status = cudaFree(NULL); /* makes the GPU's context now: a busy GPU fails here */
    if (status != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(error, error_size, "cannot use GPU %d (node-local rank %d of %d, %d GPUs): %s", ordinal, local_rank,
                 local_size, count, cudaGetErrorString(status));
        return -1;
    }
    cuda_device_state *device = calloc(1, sizeof *device);
    if (device == NULL) {
        snprintf(error, error_size, "out of memory for the CUDA device's state");
        return -1;
    }
    device->rank = rank;
    device->ordinal = ordinal;
    device->device_count = count;
    CUDA_CHECK(rank, cudaStreamCreateWithFlags(&device->compute, cudaStreamNonBlocking));
    CUBLAS_CHECK(rank, cublasCreate(&device->cublas));
    CUBLAS_CHECK(rank, cublasSetStream(device->cublas, device->compute));
    device->scratch_bytes = CUDA_SCRATCH_BYTES;
    CUDA_CHECK(rank, cudaMalloc(&device->scratch, device->scratch_bytes));
    CUDA_CHECK(rank, cudaMallocHost(&device->host_scratch, device->scratch_bytes));
    CUDA_CHECK(rank, cudaMalloc((void **)&device->loss_slots, sizeof(double) * 2 * DEVICE_LOSS_SLOTS));
    CUDA_CHECK(rank, cudaMemsetAsync(device->loss_slots, 0, sizeof(double) * 2 * DEVICE_LOSS_SLOTS, device->compute));
    CUDA_CHECK(rank, cudaStreamCreateWithFlags(&device->clock, cudaStreamNonBlocking));
    CUDA_CHECK(rank, cudaEventCreate(&device->clock_event));
    CUDA_CHECK(rank, cudaEventCreate(&device->timer_reference));
    CUDA_CHECK(rank, cudaEventCreateWithFlags(&device->pinned_copy_event, cudaEventDisableTiming));
    device->compute_events = cuda_event_pool_create(rank);

    d->name = "cuda";
    d->kind = DEVICE_CUDA;
    d->ordinal = ordinal;
    d->impl = device;
    /* No events yet: the runtime records no other stream's use of a block (allocator_record_stream), so every free
     * completes at once, ordered by the compute stream, as before (docs/gpu.md: what a GPU run must add). */
    d->segments = (allocator_backend){"cuda", device_segment_alloc, device_segment_free, device,
                                      device_segment_zero, NULL, NULL, NULL};
    d->host_segments = (allocator_backend){"pinned", pinned_segment_alloc, pinned_segment_free, device, NULL, NULL,
                                           NULL, NULL};
    d->zero = cuda_zero;
    d->copy = cuda_copy;
    d->synchronize = cuda_synchronize;
    d->memory_info = cuda_memory_info;
    d->copy_from_pinned = cuda_copy_from_pinned;
    d->pinned_copies_wait = cuda_pinned_copies_wait;
    d->timers_deferred = 1;
    d->timer_start = cuda_timer_start;
    d->timer_stop = cuda_timer_stop;
    d->timers_wait = cuda_timers_wait;
    d->timer_read = cuda_timer_read;
    d->timers_reset = cuda_timers_reset;
    d->destroy = cuda_device_destroy;
    cuda_device_allow_tf32(d, 0);
    cuda_ops_install(d);
    return 0;
}

void cuda_device_destroy(device *d) {
    cuda_device_state *device = d->impl;
    if (device == NULL) return;
    int rank = device->rank;
    cuda_device_drain(device, "the wait for the GPU at close");
    cuda_profile_destroy(device->profile);
    cuda_event_pool_destroy(device->compute_events);
    CUDA_CHECK(rank, cudaEventDestroy(device->clock_event));
    CUDA_CHECK(rank, cudaEventDestroy(device->timer_reference));
    CUDA_CHECK(rank, cudaEventDestroy(device->pinned_copy_event));
    for (int timer = 0; timer < DEVICE_TIMERS_MAX; timer++)
        for (int mark = 0; mark < 2; mark++)
            if (device->timer_events[timer][mark] != NULL)
                CUDA_CHECK(rank, cudaEventDestroy(device->timer_events[timer][mark]));
    CUDA_CHECK(rank, cudaStreamDestroy(device->clock));
    CUDA_CHECK(rank, cudaFreeHost(device->host_scratch));
    CUDA_CHECK(rank, cudaFree(device->scratch));
    CUDA_CHECK(rank, cudaFree(device->loss_slots));
    CUBLAS_CHECK(rank, cublasDestroy(device->cublas));
    CUDA_CHECK(rank, cudaStreamDestroy(device->compute));
    free(device);
    d->impl = NULL;
}
