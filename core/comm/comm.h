/* comm.h — the collectives FSDP is made of, on the device's buffers, over MPI or NCCL, blocking or on a stream.
 *
 *   all_gather      every rank has a shard; afterwards every rank has the whole buffer     (unshard)
 *   reduce_scatter  every rank has a whole buffer; afterwards rank r has chunk r of the sum  (gradient sync)
 *   all_reduce      every rank has a whole buffer; afterwards every rank has the sum         (DDP, NO_SHARD)
 *   broadcast       root's buffer is copied to every rank
 *
 * Each runs among all ranks (the world) or, in the `_group_` forms, among the ranks of a process group
 * (core/comm/group.h: HYBRID_SHARD's shard and replicate groups), where N below is the group's size.
 *
 * all_gather, all_reduce, broadcast and barrier are Open MPI's own (non-blocking) collectives; reduce_scatter is a
 * ring written out over MPI_Isend/MPI_Irecv in comm.c (read it: it is the algorithm the bytes in the trace assume).
 * On the CUDA device (make CUDA=1, DEVICE=cuda) the buffers are GPU memory: BACKEND=nccl queues NCCL's collectives on
 * the streams' cudaStreams (core/cuda/nccl_comm.h; the barrier stays MPI's), and BACKEND=mpi runs the same MPI code
 * on pinned host copies of the buffers (comm.c, "staging"). Either way the agreement check below is MPI's, on the host.
 *
 * Two forms. The blocking ones (labs 01-03) return when the data is there. The start/wait ones are FSDP's: `_start`
 * queues the collective on a stream (core/comm/stream.h) and returns at once with a handle; the host computes
 * meanwhile; comm_wait blocks until it is done (the blocked time is exposed communication, written as a `wait` event).
 * The buffers belong to the collective until comm_wait returns. (BACKEND=nccl: comm_wait makes the GPU's compute
 * stream wait for it, as torch's wait_stream, and the host goes on; below.)
 *
 * Each call writes one `collective` event (op, unit, bytes, ring traffic, seq, duration). Before moving data, every
 * rank checks that all ranks called the same op with the same count, detail (reduction, root) and unit: a mismatch
 * returns -1 on every rank with a message in ctx->error naming both ranks and values, instead of hanging or
 * producing garbage. (A start form agrees on the host at issue, on the context's communicator, or on its group's.) The
 * check is made once per signature (op, count, detail, unit): once every rank has agreed on it, later calls with it
 * skip the exchange (ctx->agreed; ctx->agreements counts the exchanges), so a unit's layout is agreed on its first
 * gather, not on every one. MPI failures also return -1 with MPI's reason. Callers check the result (COMM_CHECK aborts
 * with the message).
 */
#ifndef FSDPLAB_COMM_H
#define FSDPLAB_COMM_H

#include <stddef.h>

#include "core/runtime/context.h"
#include "core/base/dtype.h"
#include "core/comm/comm_backend.h"
#include "core/comm/stream.h"
#include "core/runtime/world.h"

typedef enum comm_reduce { COMM_SUM, COMM_AVG } comm_reduce;

/* The collectives, as a handle's `op` names them. */
typedef enum comm_op { COMM_OP_ALL_GATHER, COMM_OP_REDUCE_SCATTER, COMM_OP_ALL_REDUCE, COMM_OP_BROADCAST,
                       COMM_OP_BARRIER } comm_op;
/* "all_gather", "reduce_scatter", "all_reduce", "broadcast", "barrier": the events' `op`. */
const char *comm_op_name(int op);

/* One collective, from issue to wait. The caller owns it; comm.c fills it. */
typedef struct comm_handle {
    context *ctx;
    stream *stream;               /* NULL: a blocking form, run on the host */
    MPI_Comm comm;
    const comm_group *group;      /* the process group it runs in (core/comm/group.h); NULL: the world */
    int rank, size;               /* this rank's position in that group, and its size */
    int op;
    const char *unit;
    const char *reduce;           /* "sum" / "avg" / NULL */
    int64_t detail;               /* what else must agree: the reduction (1 sum, 2 avg) or the broadcast root */
    uint64_t count;               /* floats in the whole buffer */
    uint64_t bytes_sent, bytes_recv;
    uint64_t seq;
    const float *send;
    float *receive;
    size_t chunk;                 /* floats per rank (all_gather, reduce_scatter) or the count */
    float factor;                 /* 1/N for a mean (N: the group's size), else 1 */
    float *ring_buffers[2];       /* reduce_scatter's running sums (3+ ranks), host-allocated */
    double issue_us, start_us, end_us;
    int status;                   /* MPI's failure, once done: 0 or -1 with error */
    char error[512];
    stream_event done;
    int active;                   /* issued and not yet waited for */
    dtype dtype;                  /* the elements' type (the float forms: float32); count and chunk are elements */
    mem_tracker *buffers;         /* the pool of its temporary buffers: the device pool, or the host pool (staged) */
    /* A device's plug-in (make CUDA=1, core/cuda/): */
    void *backend_comm;           /* BACKEND=nccl: the ncclComm_t it runs on (NULL: MPI moves the bytes) */
    void *device_start, *device_end; /* BACKEND=nccl: cudaEvents before and after it on its cudaStream, */
    double seen_us;               /* and when the host first saw it complete (its end is no later) */
    int staged;                   /* BACKEND=mpi on the CUDA device: MPI runs on pinned host copies of the buffers */
    const void *device_send;      /* then: the caller's device buffers, */
    void *device_receive;
    void *staging[2];             /* the host pool's blocks that stand in for them, */
    void *device_ready;           /* and a cudaEvent on the compute stream at issue: the inputs are written */
} comm_handle;

/* shard (full_count / world floats) from every rank → full (full_count floats) on every rank, rank r's shard at
 * offset r * full_count / world. full_count must be divisible by the world size (pad first: FlatParameter does). */
int comm_all_gather(context *ctx, const float *shard, float *full, size_t full_count, const char *unit);
/* full (full_count floats) from every rank → shard (full_count / world floats): chunk r of the sum (or mean). */
int comm_reduce_scatter(context *ctx, const float *full, float *shard, size_t full_count, comm_reduce reduce,
                        const char *unit);
/* buffer (count floats) ← the sum (or mean) over ranks, in place. Any count. */
int comm_all_reduce(context *ctx, float *buffer, size_t count, comm_reduce reduce, const char *unit);
/* buffer (count floats) ← root's buffer. Any count. */
int comm_broadcast(context *ctx, float *buffer, size_t count, int root, const char *unit);
int comm_barrier(context *ctx, const char *unit);

/* The start forms: the same checks and arithmetic as the blocking ones, run on `on` (a worker stream) after the
 * work launched there before. 0, or -1 with ctx->error (the agreement failed on every rank; nothing was queued). */
int comm_all_gather_start(context *ctx, stream *on, const float *shard, float *full, size_t full_count,
                          const char *unit, comm_handle *handle);
int comm_reduce_scatter_start(context *ctx, stream *on, const float *full, float *shard, size_t full_count,
                              comm_reduce reduce, const char *unit, comm_handle *handle);
int comm_all_reduce_start(context *ctx, stream *on, float *buffer, size_t count, comm_reduce reduce,
                          const char *unit, comm_handle *handle);
/* The same three in a process group (core/comm/group.h; NULL: the world, as the forms above): N is the group's size,
 * shards are ordered by group rank, a mean divides by the group's size, and the agreement is made among the group's
 * members. `on` NULL runs it on the host at once (a blocking form; comm_wait then only writes its event). A worker
 * stream needs the group's communicator (stream_add_group). The event names the group and its world ranks. */
int comm_all_gather_group_start(context *ctx, const comm_group *group, stream *on, const float *shard, float *full,
                                size_t full_count, const char *unit, comm_handle *handle);
int comm_reduce_scatter_group_start(context *ctx, const comm_group *group, stream *on, const float *full,
                                    float *shard, size_t full_count, comm_reduce reduce, const char *unit,
                                    comm_handle *handle);
int comm_all_reduce_group_start(context *ctx, const comm_group *group, stream *on, float *buffer, size_t count,
                                comm_reduce reduce, const char *unit, comm_handle *handle);
/* Whether the collective has completed (its buffers are ready); never blocks. */
int comm_done(const comm_handle *handle);
/* The host waits for the collective (a `wait` event when it had to, naming `hook`), writes its `collective` event
 * and releases its temporary buffers. 0, or -1 with ctx->error when MPI failed. On a device-ordered backend
 * (BACKEND=nccl) the device waits instead: the compute stream is ordered after the collective, the host goes on, and
 * the handle joins the pending ones that comm_finish_pending takes (ctx->last_collective then has what it moved, its
 * times 0). Either way the kernels and copies queued from now on see its result, and the handle may be reused. */
int comm_wait(context *ctx, comm_handle *handle, const char *hook);
/* The host waits for every pending collective of a device-ordered backend, in issue order (polling: TIMEOUT and the
 * backend's errors end the wait), and writes their `collective` events with their times. 0, or -1 with ctx->error
 * naming the first that failed (the others are dropped). Called where the host waits anyway: the runtime's losses
 * read and compute spans (core/fsdp/fsdp.c), session_close; nothing to do elsewhere. */
int comm_finish_pending(context *ctx);

/* The typed forms (mixed precision): the same collectives on elements of `type` (float32 or bfloat16), so a bfloat16
 * all-gather moves half the bytes. on NULL: blocking, as comm_wait blocks (handle may then be NULL). The float
 * functions above are these with DTYPE_FLOAT32. A bfloat16 reduce-scatter sums as c10::BFloat16 does: each step of the
 * ring adds the received partial sum to this rank's chunk in float32 and rounds once to bfloat16 (N - 1 roundings for N
 * ranks, as a bfloat16 tensor's `a + b` per hop); a mean then multiplies by 1/N and rounds once more (exact when N is a
 * power of two). The dtype is part of the agreement: every rank must pass the same one. group: as the _group_ forms
 * (NULL: the world). */
int comm_all_gather_typed(context *ctx, const comm_group *group, stream *on, const void *shard, void *full,
                          size_t full_count, dtype type, const char *unit, comm_handle *handle);
int comm_reduce_scatter_typed(context *ctx, const comm_group *group, stream *on, const void *full, void *shard,
                              size_t full_count, dtype type, comm_reduce reduce, const char *unit,
                              comm_handle *handle);

/* buffer (count elements of `type`, any count) <- the sum (or mean) over the group, in place. float32: MPI's own
 * all-reduce, as comm_all_reduce. bfloat16: a ring written out in comm.c with the reduce-scatter's rounding (each hop's
 * float32 add rounded once to bfloat16, a mean's 1/N once more: N - 1 roundings per element, N for a mean), then an
 * all-gather of the reduced chunks; chunks are count / N elements, the first count % N one more. It receives one
 * chunk per hop into a buffer (comm_buffer, comm_all_reduce_ring_bytes) allocated at issue and freed at the wait. */
int comm_all_reduce_typed(context *ctx, const comm_group *group, stream *on, void *buffer, size_t count, dtype type,
                          comm_reduce reduce, const char *unit, comm_handle *handle);
/* The bytes of that receive buffer for count elements over `size` ranks (0 for float32, or one rank). */
size_t comm_all_reduce_ring_bytes(size_t count, int size, dtype type);

/* Aborts every rank with ctx->error when a comm call returned non-zero. */
#define COMM_CHECK(ctx, call)                                              \
    do {                                                                  \
        if ((call) != 0) world_fatal((ctx), "%s", (ctx)->error);             \
    } while (0)

#endif
