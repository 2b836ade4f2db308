/* cuda_stream.h — core/comm/stream.h on the CUDA device: cudaStreams, cudaEvents, and the GPU's clock on the trace's.
 *
 * core/comm/stream.c calls these (in a `make CUDA=1` build, when ctx->device is the CUDA device); so do
 * core/comm/comm.c and core/cuda/nccl_comm.c. Plain C types only, so the core's C files include it without CUDA's
 * headers.
 *
 * Which stream is what on the CUDA device:
 *
 *   compute (STREAM_HOST)             a device stream on the device's compute cudaStream (cuda_device_state.compute)
 *   comm stream, BACKEND=nccl         a device stream on a cudaStream of its own, with NCCL communicators of its own
 *                                     (the world's, and one per group it is given), as a thread has MPI duplicates
 *   comm stream, BACKEND=mpi          a worker thread (core/comm/stream.c) with a cudaStream of its own for the copies
 *                                     between device buffers and the pinned host buffers MPI runs on
 *
 * Events: a device stream's event is a cudaEvent from its cudaStream's pool (CUDA_EVENT_POOL events, recorded in
 * turn, created on first use). An event recorded CUDA_EVENT_POOL records ago has been recorded again since, later on
 * the same cudaStream: waiting for it then waits a little longer, never less, so an old holder stays safe.
 *
 * The clock: cudaEventElapsedTime gives a duration between two completed events. To place an event on the trace's
 * clock, cuda_event_times records a fresh event on an idle stream of its own (it completes at once), waits for it,
 * reads the trace clock, and subtracts the elapsed times from there: each time is off by the few microseconds the
 * host takes to see that event complete, and no clock drift builds up over a run.
 */
#ifndef FSDPLAB_CUDA_STREAM_H
#define FSDPLAB_CUDA_STREAM_H

#include <stddef.h>

#include "core/runtime/context.h"
#include "core/comm/group.h"
#include "core/comm/stream.h"



/* ---- core/comm/stream.c's device side ---- */

/* Makes s's device side (s->device_side; s->device_ordered for a device stream). BACKEND=nccl: a worker stream's
 * NCCL communicator of the world, collective over ctx->comm. 0, or -1 with ctx->error. */
int cuda_stream_init(stream *s);
/* A device stream's NCCL communicator of `group` (BACKEND=nccl), the stream's group number `index`. Collective over
 * the group. 0, or -1 with ctx->error. */
int cuda_stream_add_group(stream *s, const comm_group *group, int index);
void cuda_stream_destroy(stream *s);
/* A worker thread's first call: its CUDA calls go to the rank's GPU (the current device is per thread). */
void cuda_stream_thread_start(stream *s);
void cuda_event_record(stream_event *event, stream *s);
int cuda_event_query(const stream_event *event);
void cuda_event_synchronize(const stream_event *event);
void cuda_stream_wait_event(stream *s, const stream_event *event);
void cuda_stream_synchronize(stream *s);

/* ---- for the collectives (core/comm/comm.c, nccl_comm.c) ---- */

/* s's cudaStream (cudaStream_t) and, BACKEND=nccl, its communicator (ncclComm_t) of `group` (NULL: the world). */
void *cuda_stream_handle(const stream *s);
void *cuda_stream_nccl(const stream *s, const comm_group *group);
/* A cudaEvent recorded now on the compute stream (from its pool): the point the work queued so far ends at. */
void *cuda_compute_record(context *ctx);
/* Copies `bytes` between device memory and pinned host memory (to_host: device -> host), on s's own cudaStream (a
 * BACKEND=mpi comm stream's thread) or, s NULL or a stream on the compute cudaStream, on the compute stream; after
 * `after` (a cudaEvent, or NULL) and waited for by the calling thread. */
void cuda_stage_copy(context *ctx, const stream *s, void *dst, const void *src, size_t bytes, int to_host,
                     void *after);
/* Two completed cudaEvents' times on the trace clock (see the clock above). */
void cuda_event_times(context *ctx, void *start_event, void *end_event, double *start_us, double *end_us);
/* Where the last span timed on s's own cudaStream ended on the trace clock (0 before the first): the next one on it
 * starts no earlier, as the GPU ran them (nccl_comm.c keeps the converted times in that order). */
double *cuda_stream_last_end_us(const stream *s);

#endif
