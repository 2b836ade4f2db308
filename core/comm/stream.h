/* stream.h — execution: streams that run work in order, and events that say when work is done.
 *
 * The CUDA model, which every backend implements: work launched on a stream runs in launch order; event_record
 * puts a marker on a stream that completes when the work before it has; stream_wait makes later work on a stream
 * wait for an event of another; event_synchronize makes the host wait. FSDP runs three streams per rank:
 *
 *   compute          the layers' forward and backward
 *   all_gather       unshards (torch's _unshard_stream)
 *   reduce_scatter   gradient reduction (torch's _post_backward_stream)
 *
 * On CPU the compute stream is the host thread itself (STREAM_HOST: launched work runs at once, a recorded event is
 * complete when recorded, waiting on another stream's event blocks the host). A comm stream is a progress thread
 * (STREAM_WORKER) with its own duplicate of the communicator, so its collectives never mix with another stream's;
 * it runs its queue in order and drives its MPI requests to completion itself, yielding the core between polls.
 * Why a thread and not MPI non-blocking calls alone: Open MPI moves a large shared-memory message only while some
 * thread is inside MPI, so a collective started by the host would make no progress while the host computes.
 *
 * On the CUDA device (make CUDA=1, DEVICE=cuda; core/cuda/cuda_stream.c) the same functions map to cudaStream_t,
 * cudaEventRecord and cudaStreamWaitEvent. The compute stream is the device's compute cudaStream; with BACKEND=nccl a
 * comm stream is a cudaStream of its own (no thread: the host queues NCCL's kernels on it). Work launched on such a
 * *device stream* runs on the host at once and queues device work on its cudaStream; an event recorded on it is a
 * cudaEvent, and stream_wait of one device stream for another's event does not block the host. With BACKEND=mpi a
 * comm stream stays a progress thread (MPI runs on pinned host copies of the buffers, core/comm/comm.c), whose events
 * are host flags: a device stream waiting for one makes the host wait.
 */
#ifndef FSDPLAB_STREAM_H
#define FSDPLAB_STREAM_H

#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

#include "core/runtime/context.h"
#include "core/comm/group.h"

#define STREAM_GROUPS_MAX 4

typedef enum stream_kind { STREAM_HOST, STREAM_WORKER } stream_kind;

typedef struct stream stream;

/* A marker on a stream. Not recorded: counts as complete (as cudaEventQuery of a fresh event). */
typedef struct stream_event {
    stream *recorded_on;          /* the stream that completes it; NULL when never recorded */
    atomic_int complete;
    double complete_us;           /* trace clock, once complete */
    void *device_event;           /* recorded on a device stream: its cudaEvent_t (else NULL, and `complete` says) */
} stream_event;

typedef void (*stream_fn)(void *arg);

typedef struct stream_task {
    enum { TASK_RUN, TASK_RECORD, TASK_WAIT } kind;
    stream_fn fn;
    void *arg;
    stream_event *event;
} stream_task;

struct stream {
    context *ctx;
    char name[32];                /* "compute", "all_gather", "reduce_scatter": the trace's stream names */
    stream_kind kind;
    MPI_Comm comm;                /* the communicator its collectives use: the context's, or a duplicate */
    const comm_group *groups[STREAM_GROUPS_MAX]; /* the process groups it has a communicator of (stream_add_group) */
    MPI_Comm group_comms[STREAM_GROUPS_MAX];     /* a worker's duplicates of theirs; a host stream uses the group's */
    int group_count;
    pthread_t thread;
    pthread_mutex_t mutex;
    pthread_cond_t work;          /* the worker: a task arrived (or stop) */
    pthread_cond_t done;          /* the host: an event completed */
    stream_task *tasks;           /* ring buffer */
    size_t capacity, head, count;
    int stop, started;
    atomic_int host_waiting;      /* the host is blocked on an event of this stream (event_synchronize) */
    /* A plug-in's device (ctx->stream_ops; core/cuda/cuda_stream.c); 0 and NULL on the CPU device: */
    int device_ordered;           /* a device stream: its work is ordered by its cudaStream, no thread */
    void *device_side;            /* its cudaStream, event pool and NCCL communicators */
};

/* Streams and events on a plug-in's device (core/runtime/plugin.h sets ctx->stream_ops; the CUDA plug-in's are
 * cudaStreams and cudaEvents, core/cuda/cuda_stream.c). NULL on the CPU device: streams are the host thread and
 * progress threads, events are flags. The functions below call the table where a device orders the work. */
typedef struct stream_ops {
    /* Makes s's device side (s->device_side); sets s->device_ordered when the device orders its work (no thread).
     * 0, or -1 with ctx->error. */
    int (*init)(stream *s);
    /* A device stream's communicator of `group` for the device's collectives, the stream's group number `index`. */
    int (*add_group)(stream *s, const comm_group *group, int index);
    void (*destroy)(stream *s);
    void (*thread_start)(stream *s);                 /* a progress thread's first call (its current device) */
    void (*event_record)(stream_event *event, stream *s);
    int (*event_query)(const stream_event *event);
    void (*event_synchronize)(const stream_event *event);
    void (*wait_event)(stream *s, const stream_event *event); /* the device orders it: the host goes on */
    void (*synchronize)(stream *s);
    /* For MPI's collectives on host copies of device buffers ("staging", core/comm/comm.c): an event recorded now
     * on the compute stream, and a copy between device and host memory on s, after `after` (an event or NULL). */
    void *(*record_compute)(context *ctx);
    void (*stage_copy)(context *ctx, const stream *s, void *dst, const void *src, size_t bytes, int to_host,
                       void *after);
} stream_ops;

/* A host stream, or a worker stream with its own thread and communicator (collective over ctx->comm: every rank
 * creates its streams in the same order). A worker needs MPI_THREAD_MULTIPLE; without it, -1 with ctx->error. */
int stream_init(stream *s, context *ctx, const char *name, stream_kind kind);
/* Waits for the queued work, stops the thread, frees the communicator. */
void stream_destroy(stream *s);

/* Lets the stream run collectives in `group` (core/comm/group.h): a worker makes its own duplicate of the group's
 * communicator, as it has of the world's. Collective over the group (every member adds it to its streams in the same
 * order). 0, or -1 with ctx->error. */
int stream_add_group(stream *s, const comm_group *group);
/* The communicator the stream runs `group`'s collectives on (NULL: the world's); aborts, naming both, for a group
 * the stream was never given. */
MPI_Comm stream_comm(const stream *s, const comm_group *group);

/* Runs fn(arg) on the stream after the work launched before it. */
void stream_launch(stream *s, stream_fn fn, void *arg);
/* The event completes when the stream reaches this point. */
void event_record(stream_event *event, stream *s);
/* Work launched on s after this call starts only once the event has completed. On a host stream, the host waits
 * here; returns the microseconds it waited (0 when complete already, or on a worker stream). */
double stream_wait(stream *s, stream_event *event);
/* The host waits until the event completes; returns the microseconds it waited. */
double event_synchronize(stream_event *event);
int event_query(const stream_event *event);
/* Waits for everything launched on the stream so far. */
void stream_synchronize(stream *s);

/* Drives the MPI requests to completion under the watchdog: core/runtime/world.h's world_poll, polling as a progress
 * thread does on a worker stream, as the host does on a host stream (or NULL). MPI's code, or WORLD_TIMED_OUT. */
int stream_progress(context *ctx, stream *s, int count, MPI_Request *requests);

#endif
