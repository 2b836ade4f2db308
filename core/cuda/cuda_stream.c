/* cuda_stream.c — core/comm/stream.h on the CUDA device. See cuda_stream.h. */
#include "core/cuda/cuda_stream.h"

#include <stdlib.h>
#include <string.h>

#include "core/cuda/cuda_device.h"
#include "core/comm/comm_backend.h"
#include "core/runtime/world.h"
#include "core/base/error.h"

/* What a stream is on the device (stream.device_side). */
typedef struct cuda_stream_state {
    cudaStream_t stream;          /* the compute stream's, or its own */
    int owns_stream;
    cuda_event_pool *events;      /* that cudaStream's pool: the device's for compute, else its own */
    void *nccl;                   /* BACKEND=nccl comm stream: its ncclComm_t of the world */
    void *group_nccl[STREAM_GROUPS_MAX]; /* and of its groups, by the stream's group number */
    double last_end_us;           /* cuda_stream_last_end_us */
} cuda_stream_state;

static cuda_device_state *device_of(const stream *s) { return s->ctx->device.impl; }
static cuda_stream_state *state_of(const stream *s) { return s->device_side; }

int cuda_stream_init(stream *s) {
    context *ctx = s->ctx;
    cuda_device_state *device = ctx->device.impl;
    cuda_stream_state *state = calloc(1, sizeof *state);
    if (state == NULL)
        return error_set(ctx->error, sizeof ctx->error, "rank %d: stream '%s': out of memory", ctx->rank, s->name);
    s->device_side = state;
    if (s->kind == STREAM_HOST) { /* the compute stream: the host's work is the GPU's compute stream */
        state->stream = device->compute;
        state->events = device->compute_events;
        s->device_ordered = 1;
        return 0;
    }
    /* A comm stream: a cudaStream of its own that does not synchronize with the legacy default stream. */
    CUDA_CHECK(ctx->rank, cudaStreamCreateWithFlags(&state->stream, cudaStreamNonBlocking));
    state->owns_stream = 1;
    state->events = cuda_event_pool_create(ctx->rank);
    cuda_device_add_stream(device, state->stream, state->events, s->name);
    if (ctx->collectives == NULL) return 0; /* BACKEND=mpi: stream.c makes the thread; this is for its copies */
    s->device_ordered = 1;
    char name[64];
    snprintf(name, sizeof name, "%s/world", s->name);
    return ctx->collectives->create(ctx, ctx->comm, name, &state->nccl);
}

int cuda_stream_add_group(stream *s, const comm_group *group, int index) {
    context *ctx = s->ctx;
    cuda_stream_state *state = state_of(s);
    if (ctx->collectives == NULL || s->kind != STREAM_WORKER || index < 0 || index >= STREAM_GROUPS_MAX)
        return 0; /* the compute stream's collectives use the group's own communicator (group.h `backend_comm`) */
    char name[64];
    snprintf(name, sizeof name, "%s/%s", s->name, group->name);
    return ctx->collectives->create(ctx, group->comm, name, &state->group_nccl[index]);
}

void cuda_stream_destroy(stream *s) {
    cuda_stream_state *state = state_of(s);
    int rank = s->ctx->rank;
    if (state->owns_stream) {
        cuda_queue_wait(device_of(s), state->events, state->stream, "the wait for a comm stream before its destroy",
                        s->name);
        cuda_device_remove_stream(device_of(s), state->stream);
        const comm_backend *backend = s->ctx->collectives; /* the stream's communicators are its (BACKEND=nccl) */
        if (backend != NULL) {
            for (int i = 0; i < STREAM_GROUPS_MAX; i++) backend->destroy(state->group_nccl[i]);
            backend->destroy(state->nccl);
        }
        cuda_event_pool_destroy(state->events);
        CUDA_CHECK(rank, cudaStreamDestroy(state->stream));
    }
    free(state);
    s->device_side = NULL;
    s->device_ordered = 0;
}

void cuda_stream_thread_start(stream *s) { CUDA_CHECK(s->ctx->rank, cudaSetDevice(device_of(s)->ordinal)); }

void cuda_event_record(stream_event *event, stream *s) {
    cuda_stream_state *state = state_of(s);
    event->device_event = cuda_event_pool_record(state->events, state->stream);
}

int cuda_event_query(const stream_event *event) {
    cudaError_t status = cudaEventQuery((cudaEvent_t)event->device_event);
    if (status == cudaErrorNotReady) return 0;
    CUDA_CHECK(event->recorded_on->ctx->rank, status);
    return 1;
}

/* Polled under TIMEOUT (cuda_event_wait): with BACKEND=nccl the stream may wait for a collective on the device, and a
 * rank that never joins it must not hang this one (the rate limiter waits here). */
void cuda_event_synchronize(const stream_event *event) {
    cuda_event_wait(device_of(event->recorded_on), (cudaEvent_t)event->device_event, "the host's wait for an event",
                    event->recorded_on->name);
}

void cuda_stream_wait_event(stream *s, const stream_event *event) {
    CUDA_CHECK(s->ctx->rank, cudaStreamWaitEvent(state_of(s)->stream, (cudaEvent_t)event->device_event, 0));
}

/* As every host wait for the GPU in a run: polled under TIMEOUT (cuda_event_wait), not cudaStreamSynchronize. */
void cuda_stream_synchronize(stream *s) {
    cuda_stream_state *state = state_of(s);
    cuda_queue_wait(device_of(s), state->events, state->stream, "the host's wait for a stream", s->name);
}

/* ---- for the collectives ---- */

void *cuda_stream_handle(const stream *s) { return state_of(s)->stream; }

void *cuda_stream_nccl(const stream *s, const comm_group *group) {
    cuda_stream_state *state = state_of(s);
    if (group == NULL) return state->nccl;
    for (int i = 0; i < s->group_count; i++)
        if (s->groups[i] == group) return state->group_nccl[i];
    world_fatal(s->ctx, "stream '%s' has no NCCL communicator of group '%s' (stream_add_group)", s->name, group->name);
}

double *cuda_stream_last_end_us(const stream *s) { return &state_of(s)->last_end_us; }

void *cuda_compute_record(context *ctx) {
    cuda_device_state *device = ctx->device.impl;
    return cuda_event_pool_record(device->compute_events, device->compute);
}

void cuda_stage_copy(context *ctx, const stream *s, void *dst, const void *src, size_t bytes, int to_host,
                     void *after) {
    cuda_device_state *device = ctx->device.impl;
    int own = s != NULL && s->device_side != NULL && s->kind == STREAM_WORKER;
    cudaStream_t stream = own ? state_of(s)->stream : device->compute;
    if (after != NULL) CUDA_CHECK(ctx->rank, cudaStreamWaitEvent(stream, (cudaEvent_t)after, 0));
    enum cudaMemcpyKind kind = to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice;
    if (bytes > 0) CUDA_CHECK(ctx->rank, cudaMemcpyAsync(dst, src, bytes, kind, stream));
    cuda_event_pool *pool = own ? state_of(s)->events : device->compute_events;
    const char *what = to_host ? "the staging copy to the host" : "the staging copy to the GPU";
    cuda_queue_wait(device, pool, stream, what, own ? s->name : "compute");
}

void cuda_event_times(context *ctx, void *start_event, void *end_event, double *start_us, double *end_us) {
    cuda_device_state *device = ctx->device.impl;
    CUDA_CHECK(ctx->rank, cudaEventRecord(device->clock_event, device->clock));
    CUDA_CHECK(ctx->rank, cudaEventSynchronize(device->clock_event));
    double now_us = trace_now_us(&ctx->trace);
    float since_start_ms = 0.0f, since_end_ms = 0.0f;
    CUDA_CHECK(ctx->rank, cudaEventElapsedTime(&since_start_ms, (cudaEvent_t)start_event, device->clock_event));
    CUDA_CHECK(ctx->rank, cudaEventElapsedTime(&since_end_ms, (cudaEvent_t)end_event, device->clock_event));
    *start_us = now_us - 1000.0 * (double)since_start_ms;
    *end_us = now_us - 1000.0 * (double)since_end_ms;
}
