/* comm.c — collectives over MPI with an agreement check and a trace event each. See comm.h. */
#include "core/comm/comm.h"
#include "core/base/hash.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/runtime/offload.h"
#include "core/runtime/world.h"


static const char *const op_names[] = {"all_gather", "reduce_scatter", "all_reduce", "broadcast", "barrier"};

const char *comm_op_name(int op) { return (unsigned)op <= COMM_OP_BARRIER ? op_names[op] : "an unknown op"; }

typedef comm_handle call;

/* world_mpi_error, naming the collective and its unit: "rank R: all_gather on unit 'x': <what> failed: <reason>". */
static int mpi_failed(context *ctx, int rc, const call *c, const char *what) {
    if (rc == MPI_SUCCESS) return 0;
    char where[256];
    snprintf(where, sizeof where, "%s on unit '%s': %s", op_names[c->op], c->unit, what);
    return world_mpi_error(ctx, rc, where);
}

static const char *detail_name(comm_op op) { return op == COMM_OP_BROADCAST ? "root" : "reduction code"; }

/* The unit's hash, with the group's name in front: a signature agreed in one group is not taken as agreed in
 * another. The world's hash is the unit's alone, as before groups. */
static uint64_t call_hash(const call *c) {
    if (c->group == NULL) return hash_text(c->unit);
    char both[256];
    snprintf(both, sizeof both, "%s/%s", c->group->name, c->unit ? c->unit : "");
    return hash_text(both);
}

static int signature_equal(const ctx_signature *a, const ctx_signature *b) {
    return a->op == b->op && a->count == b->count && a->detail == b->detail && a->unit_hash == b->unit_hash;
}

/* The world rank of member `member` of the collective's group: what messages name. */
static int world_rank_of(const call *c, int member) { return c->group ? group_world_rank(c->group, member) : member; }

/* The units' names differ between ranks: a second exchange fetches them, so the message can name both. Every rank
 * sees the same table, so every rank makes this exchange or none does; a rank that has already written a message
 * (op or count) keeps it (`explain` 0). Returns -1. */
static int units_differ(context *ctx, const call *c, const ctx_signature *everyone, int explain) {
    enum { NAME = 64 };
    char mine[NAME] = {0};
    snprintf(mine, sizeof mine, "%s", c->unit ? c->unit : "");
    char *names = malloc((size_t)NAME * (size_t)c->size);
    if (names == NULL) {
        snprintf(ctx->error, sizeof ctx->error, "rank %d: %s on unit '%s': out of memory", ctx->rank,
                 op_names[c->op], c->unit);
        return -1;
    }
    int rc = MPI_Allgather(mine, NAME, MPI_CHAR, names, NAME, MPI_CHAR, c->group ? c->group->comm : ctx->comm);
    if (mpi_failed(ctx, rc, c, "unit name agreement (MPI_Allgather)")) {
        free(names);
        return -1;
    }
    uint64_t my_hash = call_hash(c);
    for (int rank = 0; rank < c->size && explain; rank++) {
        if (everyone[rank].unit_hash == my_hash) continue;
        names[(size_t)NAME * (size_t)rank + NAME - 1] = '\0';
        snprintf(ctx->error, sizeof ctx->error,
                 "rank %d: %s of %llu floats on unit '%s', but rank %d called it on unit '%s': every rank must "
                 "call the same collective on the same unit", ctx->rank, op_names[c->op],
                 (unsigned long long)c->count, c->unit, world_rank_of(c, rank), &names[(size_t)NAME * (size_t)rank]);
        break;
    }
    free(names);
    return -1;
}

/* Every rank says (op, count, detail, unit); all must agree. Costs one tiny all-gather, and turns a would-be hang
 * or silent corruption into an error that names the disagreeing ranks. Done once per signature: a signature every
 * rank has agreed on goes into ctx->agreed, and later calls with it skip the exchange (a unit's gathers repeat
 * every micro-batch with the same layout). What that trusts: a call with an agreed signature on one rank is
 * matched by the same call on the others; a mismatch among signatures seen before is no longer caught here. */
static int agree(context *ctx, const call *c) {
    /* The element type rides in the detail's upper half: a float32 call never matches a bfloat16 one. */
    ctx_signature mine = {(uint64_t)c->op, c->count, (uint64_t)c->detail | ((uint64_t)c->dtype << 32), call_hash(c)};
    for (int i = 0; i < ctx->agreed_count; i++)
        if (signature_equal(&ctx->agreed[i], &mine)) return 0;
    ctx_signature *everyone = malloc(sizeof mine * (size_t)c->size);
    if (everyone == NULL) {
        snprintf(ctx->error, sizeof ctx->error, "rank %d: %s on unit '%s': out of memory", ctx->rank,
                 op_names[c->op], c->unit);
        return -1;
    }
    ctx->agreements++;
    MPI_Request request;
    int rc = MPI_Iallgather(&mine, 4, MPI_UINT64_T, everyone, 4, MPI_UINT64_T, c->group ? c->group->comm : ctx->comm,
                            &request);
    if (rc == MPI_SUCCESS) rc = stream_progress(ctx, NULL, 1, &request);
    if (rc == WORLD_TIMED_OUT) {
        free(everyone);
        snprintf(ctx->error, sizeof ctx->error, "rank %d: %s on unit '%s': the size agreement timed out after %g s "
                 "(TIMEOUT); a rank has stopped, died or fallen behind by more than that", ctx->rank, op_names[c->op],
                 c->unit, ctx->timeout_seconds);
        return -1;
    }
    if (mpi_failed(ctx, rc, c, "size agreement (MPI_Allgather)")) {
        free(everyone);
        return -1;
    }
    int status = 0;
    for (int rank = 0; rank < c->size && status == 0; rank++) {
        const ctx_signature *theirs = &everyone[rank];
        if (theirs->op == mine.op && theirs->detail >> 32 != mine.detail >> 32) {
            snprintf(ctx->error, sizeof ctx->error, "rank %d: %s on unit '%s' of %s elements, but rank %d passed %s "
                     "elements: every rank must use the same dtype", ctx->rank, op_names[c->op], c->unit,
                     dtype_name(c->dtype), rank, dtype_name((dtype)(theirs->detail >> 32)));
            status = -1;
        } else if (theirs->op != mine.op || theirs->detail != mine.detail) {
            snprintf(ctx->error, sizeof ctx->error,
                     "rank %d: %s on unit '%s' (%s %lld) but rank %d called %s (%s %lld): every rank must call "
                     "the same collective", ctx->rank, op_names[c->op], c->unit, detail_name(c->op),
                     (long long)c->detail, world_rank_of(c, rank),
                     theirs->op <= COMM_OP_BARRIER ? op_names[theirs->op] : "an unknown op",
                     detail_name(c->op), (long long)theirs->detail);
            status = -1;
        } else if (theirs->count != mine.count) {
            snprintf(ctx->error, sizeof ctx->error,
                     "rank %d: %s on unit '%s' of %llu floats, but rank %d passed %llu floats", ctx->rank,
                     op_names[c->op], c->unit, (unsigned long long)c->count, world_rank_of(c, rank),
                     (unsigned long long)theirs->count);
            status = -1;
        }
    }
    /* Only names left to compare; decided on the whole table, so every rank takes the same branch. */
    int names_match = 1;
    for (int rank = 1; rank < c->size; rank++)
        if (everyone[rank].unit_hash != everyone[0].unit_hash) names_match = 0;
    if (!names_match) status = units_differ(ctx, c, everyone, status == 0);
    free(everyone);
    if (status == 0 && ctx->agreed_count < CTX_SIGNATURES_MAX) ctx->agreed[ctx->agreed_count++] = mine;
    return status;
}

/* Checks that apply before any data moves; the same on every rank, so every rank fails together. */
static int begin(context *ctx, call *c, size_t chunk_count) {
    c->issue_us = trace_now_us(&ctx->trace);
    if (chunk_count > (size_t)INT_MAX) {
        snprintf(ctx->error, sizeof ctx->error, "rank %d: %s on unit '%s': %zu floats per message exceeds MPI's int "
                 "count limit %d", ctx->rank, op_names[c->op], c->unit, chunk_count, INT_MAX);
        return -1;
    }
    return agree(ctx, c);
}

static int not_divisible(context *ctx, const call *c) {
    snprintf(ctx->error, sizeof ctx->error,
             "rank %d: %s on unit '%s' of %llu floats over %d ranks%s%s: not divisible; pad to a multiple of the "
             "group's size first (a FlatParameter does)", ctx->rank, op_names[c->op], c->unit,
             (unsigned long long)c->count, c->size, c->group ? " of group " : "", c->group ? c->group->name : "");
    return -1;
}

static const char *reduce_name(comm_reduce reduce) { return reduce == COMM_AVG ? "avg" : "sum"; }

/* Ring traffic for an all-gather or reduce-scatter: each rank sends and receives (N-1) chunks of full/N, N the
 * group's size. */
static uint64_t ring_chunk_bytes(int size, size_t full_count, dtype type) {
    return (uint64_t)(full_count / (size_t)size) * dtype_size(type) * (uint64_t)(size - 1);
}

/* How MPI moves the elements: bfloat16 as its 16 bits (MPI has no bfloat16; nothing is reduced by MPI here). */
static MPI_Datatype mpi_type(dtype type) { return type == DTYPE_BFLOAT16 ? MPI_UINT16_T : MPI_FLOAT; }

/* One ring step's arithmetic on `count` elements: sum = received + mine, then (the last step of a mean) times factor.
 * float32: one rounding per operation, in float32. bfloat16: the add in float32 rounded to bfloat16 (c10::BFloat16's
 * a + b), the scaling the same. */
static void ring_add(const call *c, void *sum, const void *mine, size_t count, float factor) {
    if (c->dtype == DTYPE_BFLOAT16) {
        bf16 *s = sum;
        const bf16 *m = mine;
        for (size_t i = 0; i < count; i++) s[i] = bf16_add(s[i], m[i]);
        if (factor != 1.0f)
            for (size_t i = 0; i < count; i++) s[i] = bf16_from_float(bf16_to_float(s[i]) * factor);
        return;
    }
    float *s = sum;
    const float *m = mine;
    if (factor != 1.0f)
        for (size_t i = 0; i < count; i++) s[i] = (s[i] + m[i]) * factor;
    else
        for (size_t i = 0; i < count; i++) s[i] += m[i];
}

/* ---- the work, as it runs on its stream (a worker thread, or the host for the blocking forms) ----
 * It touches only the handle and its buffers: no trace, no allocator (those are the host's). */

static int work_failed(call *c, int rc, const char *what) {
    if (rc == MPI_SUCCESS) return 0;
    if (rc == WORLD_TIMED_OUT) {
        snprintf(c->error, sizeof c->error, "rank %d: %s on unit '%s' (seq %llu, stream %s) timed out: not complete "
                 "after %g s (TIMEOUT); a rank has stopped, died or fallen behind by more than that", c->ctx->rank,
                 op_names[c->op], c->unit, (unsigned long long)c->seq, c->stream ? c->stream->name : "compute",
                 c->ctx->timeout_seconds);
        return -1;
    }
    char reason[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(rc, reason, &length);
    snprintf(c->error, sizeof c->error, "rank %d: %s on unit '%s' (seq %llu, stream %s): %s failed: %s", c->ctx->rank,
             op_names[c->op], c->unit, (unsigned long long)c->seq, c->stream ? c->stream->name : "host", what, reason);
    return -1;
}

/* The ring reduce-scatter, written out because it is the lesson (and because Open MPI's MPI_Reduce_scatter_block
 * on one node was slower than its all-reduce, which moves twice the bytes). Chunk i is full[i*chunk ...]. In step k
 * (0..N-2) rank r sends its running sum of chunk (r-k-1) mod N to rank r+1 and receives rank r-1's running sum of
 * chunk (r-k-2) mod N, to which it adds its own. After N-1 steps rank r holds the complete sum of chunk r, having
 * sent and received N-1 chunks: (N-1)/N of the buffer, half of what a ring all-reduce moves.
 *
 * Each step adds the chunk it received to this rank's own as soon as it has arrived, in place in the receive buffer,
 * and the last step also multiplies by `factor` (1/N for a mean) in that same pass: one pass over memory per step,
 * with no zeroing and no copies. Per element the arithmetic is: received + mine, then (for a mean) times 1/N, each
 * rounded to float, in that order, whichever stream runs it. Running sums alternate between two buffers (one is
 * sent while the other receives); the last step receives straight into the shard. So 2 ranks need no buffer,
 * 3 ranks one, 4 or more two; the host allocates them at issue. */
static int ring_reduce_scatter(call *c) {
    int world = c->size, rank = c->rank; /* the group's */
    int right = (rank + 1) % world, left = (rank - 1 + world) % world;
    size_t chunk = c->chunk, chunk_bytes = chunk * dtype_size(c->dtype);
    const char *full = (const char *)c->send;
    char *shard = (char *)c->receive;
    if (world == 1) { /* the sum of one rank; a mean divides by 1, which changes nothing */
        memcpy(shard, full, chunk_bytes);
        return 0;
    }
    const char *sending = full + (size_t)((rank - 1 + world) % world) * chunk_bytes; /* step 0: my own chunk r-1 */
    for (int step = 0; step < world - 1; step++) {
        int last = step == world - 2;
        char *sum = last ? shard : (char *)c->ring_buffers[step % 2];
        MPI_Request requests[2];
        int rc = MPI_Irecv(sum, (int)chunk, mpi_type(c->dtype), left, 40, c->comm, &requests[0]);
        if (work_failed(c, rc, "MPI_Irecv (ring step)")) return -1;
        rc = MPI_Isend(sending, (int)chunk, mpi_type(c->dtype), right, 40, c->comm, &requests[1]);
        if (work_failed(c, rc, "MPI_Isend (ring step)")) return -1;
        if (work_failed(c, stream_progress(c->ctx, c->stream, 2, requests), "the ring step's MPI requests")) return -1;
        const char *mine = full + (size_t)((rank - step - 2 + 2 * world) % world) * chunk_bytes;
        ring_add(c, sum, mine, chunk, last ? c->factor : 1.0f);
        sending = sum;
    }
    return 0;
}

/* Chunk i of a ring all-reduce over `size` ranks: count / size elements, the first count % size chunks one more, so
 * any count works (an all-reduce needs no padding). */
static void ring_chunk(size_t count, int size, int i, size_t *first, size_t *length) {
    size_t base = count / (size_t)size, extra = count % (size_t)size, index = (size_t)i;
    *first = index * base + (index < extra ? index : extra);
    *length = base + (index < extra ? 1 : 0);
}

/* The bfloat16 all-reduce, in place: a ring reduce-scatter with the arithmetic of ring_reduce_scatter (each hop adds
 * the received running sum to this rank's chunk in float32 and rounds once to bfloat16; a mean's last hop scales and
 * rounds once more), after which rank r holds chunk r's total, then an all-gather of the chunks (copies: no
 * arithmetic). Every element is rounded N - 1 times (N times for a mean), as in the reduce-scatter, and every rank ends
 * with the same bits. MPI's own all-reduce cannot do this: MPI has no bfloat16, and a user-defined reduction's order
 * is Open MPI's to choose. Traffic per rank: 2 (N - 1) chunks, the ring all-reduce's 2 (N - 1) / N of the buffer. */
static int ring_all_reduce_bf16(call *c) {
    int world = c->size, rank = c->rank;
    if (world == 1) return 0; /* the sum of one rank; a mean divides by 1 */
    int right = (rank + 1) % world, left = (rank - 1 + world) % world;
    bf16 *buffer = (bf16 *)c->receive, *received = (bf16 *)c->ring_buffers[0];
    for (int step = 0; step < world - 1; step++) {
        int last = step == world - 2;
        size_t send_first, send_length, add_first, add_length;
        ring_chunk(c->count, world, (rank - step - 1 + 2 * world) % world, &send_first, &send_length);
        ring_chunk(c->count, world, (rank - step - 2 + 2 * world) % world, &add_first, &add_length);
        MPI_Request requests[2];
        int rc = MPI_Irecv(received, (int)add_length, MPI_UINT16_T, left, 41, c->comm, &requests[0]);
        if (work_failed(c, rc, "MPI_Irecv (all-reduce ring step)")) return -1;
        rc = MPI_Isend(buffer + send_first, (int)send_length, MPI_UINT16_T, right, 41, c->comm, &requests[1]);
        if (work_failed(c, rc, "MPI_Isend (all-reduce ring step)")) return -1;
        if (work_failed(c, stream_progress(c->ctx, c->stream, 2, requests), "the all-reduce ring step's MPI requests"))
            return -1;
        /* the received running sum + mine, as ring_add: bf16(received + mine), then (a mean's last hop) x factor */
        ring_add(c, received, buffer + add_first, add_length, last ? c->factor : 1.0f);
        memcpy(buffer + add_first, received, add_length * sizeof(bf16));
    }
    int *counts = malloc(2 * sizeof(int) * (size_t)world);
    if (counts == NULL) {
        snprintf(c->error, sizeof c->error, "rank %d: all_reduce on unit '%s': out of memory", c->ctx->rank, c->unit);
        return -1;
    }
    int *displacements = counts + world;
    for (int i = 0; i < world; i++) {
        size_t first, length;
        ring_chunk(c->count, world, i, &first, &length);
        counts[i] = (int)length, displacements[i] = (int)first;
    }
    MPI_Request request;
    int rc = MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buffer, counts, displacements, MPI_UINT16_T, c->comm,
                             &request);
    if (rc == MPI_SUCCESS) rc = stream_progress(c->ctx, c->stream, 1, &request);
    free(counts);
    return work_failed(c, rc, "MPI_Iallgatherv (the all-reduce's gather)");
}

static int run_one(call *c) {
    MPI_Request request;
    int rc;
    switch ((comm_op)c->op) {
    case COMM_OP_ALL_GATHER: {
        /* In place when the shard already sits at its chunk of the output (CPU offload copies it there): MPI forbids
         * aliased buffers, MPI_IN_PLACE says the same thing legally (NCCL's in-place all-gather). */
        const char *own_chunk = (const char *)c->receive + (size_t)c->rank * c->chunk * dtype_size(c->dtype);
        const void *send = (const char *)c->send == own_chunk ? MPI_IN_PLACE : c->send;
        rc = MPI_Iallgather(send, (int)c->chunk, mpi_type(c->dtype), c->receive, (int)c->chunk, mpi_type(c->dtype),
                            c->comm, &request);
        if (work_failed(c, rc, "MPI_Iallgather")) return -1;
        return work_failed(c, stream_progress(c->ctx, c->stream, 1, &request), "MPI_Iallgather's completion");
    }
    case COMM_OP_REDUCE_SCATTER: return ring_reduce_scatter(c);
    case COMM_OP_ALL_REDUCE:
        if (c->dtype == DTYPE_BFLOAT16) return ring_all_reduce_bf16(c);
        rc = MPI_Iallreduce(MPI_IN_PLACE, c->receive, (int)c->count, MPI_FLOAT, MPI_SUM, c->comm, &request);
        if (work_failed(c, rc, "MPI_Iallreduce")) return -1;
        if (work_failed(c, stream_progress(c->ctx, c->stream, 1, &request), "MPI_Iallreduce's completion")) return -1;
        if (c->factor != 1.0f)
            for (size_t i = 0; i < c->count; i++) c->receive[i] *= c->factor;
        return 0;
    case COMM_OP_BROADCAST:
        rc = MPI_Ibcast(c->receive, (int)c->count, MPI_FLOAT, (int)c->detail, c->comm, &request);
        if (work_failed(c, rc, "MPI_Ibcast")) return -1;
        return work_failed(c, stream_progress(c->ctx, c->stream, 1, &request), "MPI_Ibcast's completion");
    case COMM_OP_BARRIER:
        rc = MPI_Ibarrier(c->comm, &request);
        if (work_failed(c, rc, "MPI_Ibarrier")) return -1;
        return work_failed(c, stream_progress(c->ctx, c->stream, 1, &request), "MPI_Ibarrier's completion");
    }
    return 0;
}

/* ---- BACKEND=mpi on a plug-in's device (CUDA): staging through pinned host memory ----
 * Open MPI here is not CUDA-aware: it cannot read or write GPU memory. So the collective runs on host buffers of the
 * host pool (pinned, category comm_buffer): what it reads is copied down from the device first, what it wrote is
 * copied up after, both on the stream that runs it and waited for there. The host allocates the buffers at issue and
 * frees them in comm_wait (the allocator is the host thread's); a comm stream's thread only copies. The copy down
 * waits for the compute stream's work queued before the issue (c->device_ready): that work wrote the input. It also
 * lets two ranks share one GPU, which NCCL refuses. */
static void stage_begin(context *ctx, call *c) {
    mem_tracker *host = offload_host_pool(ctx);
    size_t element = dtype_size(c->dtype);
    c->staged = 1;
    c->buffers = host;
    c->device_send = c->send;
    c->device_receive = c->receive;
    void *whole = mem_alloc_uninitialized_typed(host, c->count * element, MEM_COMM_BUFFER, c->dtype, "comm.staging");
    c->staging[0] = whole;
    switch ((comm_op)c->op) {
    case COMM_OP_ALL_GATHER: /* in place on the host: this rank's shard at its chunk of the whole */
        c->receive = whole;
        c->send = (const float *)((char *)whole + (size_t)c->rank * c->chunk * element);
        break;
    case COMM_OP_REDUCE_SCATTER:
        c->send = whole;
        c->staging[1] = mem_alloc_uninitialized_typed(host, c->chunk * element, MEM_COMM_BUFFER, c->dtype,
                                                      "comm.staging");
        c->receive = c->staging[1];
        break;
    case COMM_OP_ALL_REDUCE:
    case COMM_OP_BROADCAST:
    case COMM_OP_BARRIER: c->send = c->receive = whole; break;
    }
    c->device_ready = ctx->stream_ops->record_compute(ctx);
}

/* Down: what the collective reads (a broadcast's root only). */
static void stage_in(call *c) {
    size_t element = dtype_size(c->dtype);
    const void *from = c->op == COMM_OP_ALL_GATHER || c->op == COMM_OP_REDUCE_SCATTER ? c->device_send
                                                                                       : c->device_receive;
    size_t count = c->op == COMM_OP_ALL_GATHER ? c->chunk : c->count;
    if (c->op == COMM_OP_BROADCAST && c->rank != (int)c->detail) count = 0;
    c->ctx->stream_ops->stage_copy(c->ctx, c->stream, (void *)c->send, from, count * element, 1, c->device_ready);
}

/* Up: what it wrote (the whole buffer, or a reduce-scatter's shard). */
static void stage_out(call *c) {
    size_t count = c->op == COMM_OP_REDUCE_SCATTER ? c->chunk : c->count;
    c->ctx->stream_ops->stage_copy(c->ctx, c->stream, c->device_receive, c->receive, count * dtype_size(c->dtype), 0,
                                   NULL);
}

static void run_on_stream(void *arg) {
    call *c = arg;
    c->start_us = trace_now_us(&c->ctx->trace);
    if (c->staged) stage_in(c);
    c->status = run_one(c);
    if (c->staged && c->status == 0) stage_out(c);
    c->end_us = trace_now_us(&c->ctx->trace);
}

/* ---- issue and wait (the host) ---- */

/* After begin: the sequence number, the buffers the ring needs, and the work queued on `on` (or run now). */
static void issue(context *ctx, call *c, stream *on) {
    c->ctx = ctx;
    c->stream = on;
    c->comm = on ? stream_comm(on, c->group) : c->group ? c->group->comm : ctx->comm;
    c->seq = ctx->collective_seq++;
    c->status = 0;
    c->error[0] = '\0';
    c->active = 1;
    c->ring_buffers[0] = c->ring_buffers[1] = NULL;
    c->buffers = &ctx->mem;
    c->done = (stream_event){0};
    /* A plug-in's device: its collectives backend queues it on a device stream (BACKEND=nccl, core/cuda/nccl_comm.c);
     * MPI runs it on host copies. A barrier has no buffers: MPI's, either way. */
    if (ctx->device.kind != DEVICE_CPU && c->op != COMM_OP_BARRIER) {
        if (ctx->collectives != NULL) {
            ctx->collectives->issue(ctx, c, on);
            return;
        }
        stage_begin(ctx, c);
    }
    if (c->op == COMM_OP_REDUCE_SCATTER) /* every element is received before it is read: no zeroing */
        for (int i = 0; i < 2 && i < c->size - 2; i++)
            c->ring_buffers[i] = mem_alloc_uninitialized_typed(c->buffers, c->chunk * dtype_size(c->dtype),
                                                               MEM_COMM_BUFFER, c->dtype, "reduce_scatter.ring_buffer");
    if (c->op == COMM_OP_ALL_REDUCE && c->dtype == DTYPE_BFLOAT16 && c->size > 1) /* one chunk received per hop */
        c->ring_buffers[0] = mem_alloc_uninitialized_typed(c->buffers, comm_all_reduce_ring_bytes(c->count, c->size,
                                                                                                 c->dtype),
                                                           MEM_COMM_BUFFER, c->dtype, "all_reduce.ring_buffer");
    if (on == NULL || on->kind == STREAM_HOST) {
        run_on_stream(c);
    } else {
        stream_launch(on, run_on_stream, c);
        event_record(&c->done, on);
    }
}

int comm_done(const comm_handle *handle) { return !handle->active || event_query(&handle->done); }

/* What a collective moved and took (its times once known), for its event; ranks: room for its group's ranks. */
static trace_collective_info collective_info(const comm_handle *c, char *ranks, size_t ranks_size) {
    return (trace_collective_info){
        .group = c->group ? c->group->name : "world",
        .group_size = c->size,
        .group_ranks = c->group ? group_ranks_text(c->group, ranks, ranks_size) : NULL,
        .op = op_names[c->op],
        .unit = c->unit,
        .reduce = c->reduce,
        .count = c->count,
        .bytes = c->count * dtype_size(c->dtype),
        .dtype = dtype_name(c->dtype),
        .bytes_sent = c->bytes_sent,
        .bytes_recv = c->bytes_recv,
        .seq = c->seq,
        .stream = c->stream && c->stream->kind == STREAM_WORKER ? c->stream->name : "compute",
        .issue_us = c->issue_us,
        .start_us = c->start_us,
        .dur_us = c->end_us - c->start_us,
    };
}

/* ctx->last_collective: the info without its strings (the caller's may not outlive the call). */
static void set_last_collective(context *ctx, const trace_collective_info *info) {
    ctx->last_collective = *info;
    ctx->last_collective.unit = NULL;
    ctx->last_collective.stream = NULL;
    ctx->last_collective.group = ctx->last_collective.group_ranks = NULL;
}

/* Its `collective` event, and ctx->last_collective. */
static void write_collective(context *ctx, const comm_handle *c) {
    char ranks[8192]; /* a group's world ranks as text: ~1,600 ranks of 4 digits */
    trace_collective_info info = collective_info(c, ranks, sizeof ranks);
    trace_collective(&ctx->trace, &info);
    set_last_collective(ctx, &info);
}

/* A failed collective's error into ctx->error (a timeout marked in the JSONL too): -1. */
static int failed(context *ctx, const comm_handle *c) {
    snprintf(ctx->error, sizeof ctx->error, "%s", c->error);
    if (strstr(c->error, "timed out") != NULL) trace_mark(&ctx->trace, c->error); /* the JSONL says so */
    return -1;
}

/* ---- a device-ordered backend's collectives, waited for later (BACKEND=nccl) ----
 * comm_wait orders the compute stream after the collective on the device and keeps a copy of its handle here, its
 * unit's name with it; comm_finish_pending takes them in issue order: the host's wait (the backend's watchdog and
 * errors), the times, the event. At most PENDING_MAX wait at once (a full list finishes its oldest first, long done
 * by then): a handle's cudaEvents come from pools that reuse an event CUDA_EVENT_POOL (1,024) records later, and
 * PENDING_MAX collectives record a few hundred at most. */
enum { PENDING_MAX = 64, PENDING_UNIT = 96 };
typedef struct pending_list {
    comm_handle handles[PENDING_MAX];
    char units[PENDING_MAX][PENDING_UNIT];
    int first; /* the oldest's index; ctx->pending_collective_count follow it, in a ring */
} pending_list;

static int finish_one(context *ctx, comm_handle *c) {
    if (ctx->collectives->wait(ctx, c) == 0) ctx->collectives->finish(ctx, c);
    else c->status = -1;
    if (c->status != 0) return failed(ctx, c);
    write_collective(ctx, c);
    return 0;
}

int comm_finish_pending(context *ctx) {
    pending_list *list = ctx->pending_collectives;
    int status = 0;
    while (list != NULL && ctx->pending_collective_count > 0) {
        comm_handle *c = &list->handles[list->first];
        list->first = (list->first + 1) % PENDING_MAX;
        ctx->pending_collective_count--;
        if (status == 0) status = finish_one(ctx, c);
    }
    free(list);
    ctx->pending_collectives = NULL;
    return status;
}

static int defer(context *ctx, comm_handle *c) {
    pending_list *list = ctx->pending_collectives;
    if (list == NULL) {
        list = ctx->pending_collectives = calloc(1, sizeof *list);
        if (list == NULL) {
            snprintf(ctx->error, sizeof ctx->error, "rank %d: %s on unit '%s': out of memory", ctx->rank,
                     op_names[c->op], c->unit);
            return -1;
        }
        ctx->finish_pending = comm_finish_pending;
    }
    if (ctx->pending_collective_count == PENDING_MAX) { /* the oldest, issued PENDING_MAX collectives ago */
        comm_handle *oldest = &list->handles[list->first];
        list->first = (list->first + 1) % PENDING_MAX;
        ctx->pending_collective_count--;
        if (finish_one(ctx, oldest) != 0) return -1;
    }
    int at = (list->first + ctx->pending_collective_count++) % PENDING_MAX;
    list->handles[at] = *c;
    snprintf(list->units[at], PENDING_UNIT, "%s", c->unit ? c->unit : "");
    list->handles[at].unit = list->units[at];
    /* What it moved is known now, its times only once finished: ctx->last_collective has them 0 until then (its
     * event has them) */
    comm_handle untimed = *c;
    untimed.start_us = untimed.end_us = 0.0;
    char ranks[8192];
    trace_collective_info info = collective_info(&untimed, ranks, sizeof ranks);
    set_last_collective(ctx, &info);
    return 0;
}

int comm_wait(context *ctx, comm_handle *c, const char *hook) {
    if (!c->active) return 0;
    if (c->backend_comm != NULL) { /* the compute stream waits for it on the device, and the host goes on */
        ctx->collectives->order(ctx, c);
        c->active = 0;
        return defer(ctx, c);
    }
    if (!event_query(&c->done)) {
        double start = trace_now_us(&ctx->trace);
        event_synchronize(&c->done);
        trace_wait_info wait = {.on = c->stream->name, .op = op_names[c->op], .unit = c->unit, .seq = (int64_t)c->seq,
                                .hook = hook, .start_us = start, .dur_us = trace_now_us(&ctx->trace) - start};
        trace_wait(&ctx->trace, &wait);
    }
    if (c->staged) {
        mem_free(c->buffers, c->staging[0]);
        mem_free(c->buffers, c->staging[1]);
        c->staging[0] = c->staging[1] = NULL;
    }
    c->active = 0;
    mem_free(c->buffers, c->ring_buffers[0]);
    mem_free(c->buffers, c->ring_buffers[1]);
    c->ring_buffers[0] = c->ring_buffers[1] = NULL;
    if (c->status != 0) return failed(ctx, c);
    write_collective(ctx, c);
    return 0;
}

/* ---- the collectives: set up, checked, issued ---- */

/* The group a collective runs in: its members, this rank's position. NULL: the world. */
static void in_group(const context *ctx, call *c, const comm_group *group) {
    c->group = group;
    c->rank = group ? group->rank : ctx->rank;
    c->size = group ? group->size : ctx->world_size;
}

static int all_gather_begin(context *ctx, call *c, const comm_group *group, const void *shard, void *full,
                            size_t full_count, dtype type, const char *unit) {
    *c = (call){.op = COMM_OP_ALL_GATHER, .unit = unit, .count = full_count, .send = shard, .receive = full,
                .factor = 1.0f, .dtype = type};
    in_group(ctx, c, group);
    c->chunk = full_count / (size_t)c->size;
    c->bytes_sent = c->bytes_recv = ring_chunk_bytes(c->size, full_count, type);
    if (begin(ctx, c, c->chunk) != 0) return -1;
    if (full_count % (size_t)c->size != 0) return not_divisible(ctx, c);
    return 0;
}

static int reduce_scatter_begin(context *ctx, call *c, const comm_group *group, const void *full, void *shard,
                                size_t full_count, dtype type, comm_reduce reduce, const char *unit) {
    *c = (call){.op = COMM_OP_REDUCE_SCATTER, .unit = unit, .reduce = reduce_name(reduce), .detail = 1 + (int)reduce,
                .count = full_count, .send = full, .receive = shard, .dtype = type};
    in_group(ctx, c, group);
    c->chunk = full_count / (size_t)c->size;
    /* EXERCISE 03-mean BEGIN: the factor the ring's last step multiplies by: a mean (COMM_AVG) over the group, or 1 */
    c->factor = reduce == COMM_AVG ? 1.0f / (float)c->size : 1.0f;
    /* EXERCISE 03-mean END */
    c->bytes_sent = c->bytes_recv = ring_chunk_bytes(c->size, full_count, type);
    if (begin(ctx, c, c->chunk) != 0) return -1;
    if (full_count % (size_t)c->size != 0) return not_divisible(ctx, c);
    return 0;
}

/* A ring all-reduce's traffic, 2(N-1)/N of the buffer each way (a reduce-scatter, then an all-gather), as a double
 * product truncated to bytes (EVENTS.md). */
static int all_reduce_begin(context *ctx, call *c, const comm_group *group, void *buffer, size_t count, dtype type,
                            comm_reduce reduce, const char *unit) {
    *c = (call){.op = COMM_OP_ALL_REDUCE, .unit = unit, .reduce = reduce_name(reduce), .detail = 1 + (int)reduce,
                .count = count, .send = buffer, .receive = buffer, .chunk = count, .dtype = type};
    in_group(ctx, c, group);
    c->factor = reduce == COMM_AVG ? 1.0f / (float)c->size : 1.0f;
    c->bytes_sent = c->bytes_recv =
        (uint64_t)(2.0 * (double)(c->size - 1) / (double)c->size * (double)count * (double)dtype_size(type));
    return begin(ctx, c, count);
}

size_t comm_all_reduce_ring_bytes(size_t count, int size, dtype type) {
    if (type != DTYPE_BFLOAT16 || size < 2) return 0;
    return (count / (size_t)size + (count % (size_t)size != 0)) * dtype_size(type);
}

/* A blocking form: issue on the host, then wait (which writes the event); with BACKEND=nccl the host waits for it too,
 * so its data and times are there when it returns (lab 03 compares the times). */
static int blocking(context *ctx, call *c) {
    issue(ctx, c, NULL);
    if (comm_wait(ctx, c, NULL) != 0) return -1;
    return comm_finish_pending(ctx);
}

int comm_all_gather(context *ctx, const float *shard, float *full, size_t full_count, const char *unit) {
    call c;
    if (all_gather_begin(ctx, &c, NULL, shard, full, full_count, DTYPE_FLOAT32, unit) != 0) return -1;
    return blocking(ctx, &c);
}

int comm_reduce_scatter(context *ctx, const float *full, float *shard, size_t full_count, comm_reduce reduce,
                        const char *unit) {
    call c;
    if (reduce_scatter_begin(ctx, &c, NULL, full, shard, full_count, DTYPE_FLOAT32, reduce, unit) != 0) return -1;
    return blocking(ctx, &c);
}

int comm_all_reduce(context *ctx, float *buffer, size_t count, comm_reduce reduce, const char *unit) {
    call c;
    if (all_reduce_begin(ctx, &c, NULL, buffer, count, DTYPE_FLOAT32, reduce, unit) != 0) return -1;
    return blocking(ctx, &c);
}

int comm_broadcast(context *ctx, float *buffer, size_t count, int root, const char *unit) {
    call c = {.op = COMM_OP_BROADCAST, .unit = unit, .detail = root, .count = count, .receive = buffer, .chunk = count,
              .factor = 1.0f};
    in_group(ctx, &c, NULL);
    if (ctx->world_size > 1) {
        if (ctx->rank == root) c.bytes_sent = count * sizeof(float);
        else c.bytes_recv = count * sizeof(float);
    }
    if (begin(ctx, &c, count) != 0) return -1;
    if (root < 0 || root >= ctx->world_size) {
        snprintf(ctx->error, sizeof ctx->error, "rank %d: broadcast on unit '%s': root %d is not a rank of 0..%d",
                 ctx->rank, unit, root, ctx->world_size - 1);
        return -1;
    }
    return blocking(ctx, &c);
}

int comm_barrier(context *ctx, const char *unit) {
    call c = {.op = COMM_OP_BARRIER, .unit = unit, .factor = 1.0f};
    in_group(ctx, &c, NULL);
    if (begin(ctx, &c, 0) != 0) return -1;
    return blocking(ctx, &c);
}

int comm_all_gather_group_start(context *ctx, const comm_group *group, stream *on, const float *shard, float *full,
                                size_t full_count, const char *unit, comm_handle *handle) {
    if (all_gather_begin(ctx, handle, group, shard, full, full_count, DTYPE_FLOAT32, unit) != 0) return -1;
    issue(ctx, handle, on);
    return 0;
}

int comm_reduce_scatter_group_start(context *ctx, const comm_group *group, stream *on, const float *full,
                                    float *shard, size_t full_count, comm_reduce reduce, const char *unit,
                                    comm_handle *handle) {
    if (reduce_scatter_begin(ctx, handle, group, full, shard, full_count, DTYPE_FLOAT32, reduce, unit) != 0) return -1;
    issue(ctx, handle, on);
    return 0;
}

int comm_all_reduce_group_start(context *ctx, const comm_group *group, stream *on, float *buffer, size_t count,
                                comm_reduce reduce, const char *unit, comm_handle *handle) {
    if (all_reduce_begin(ctx, handle, group, buffer, count, DTYPE_FLOAT32, reduce, unit) != 0) return -1;
    issue(ctx, handle, on);
    return 0;
}

int comm_all_gather_start(context *ctx, stream *on, const float *shard, float *full, size_t full_count,
                          const char *unit, comm_handle *handle) {
    return comm_all_gather_group_start(ctx, NULL, on, shard, full, full_count, unit, handle);
}

int comm_reduce_scatter_start(context *ctx, stream *on, const float *full, float *shard, size_t full_count,
                              comm_reduce reduce, const char *unit, comm_handle *handle) {
    return comm_reduce_scatter_group_start(ctx, NULL, on, full, shard, full_count, reduce, unit, handle);
}

int comm_all_reduce_start(context *ctx, stream *on, float *buffer, size_t count, comm_reduce reduce,
                          const char *unit, comm_handle *handle) {
    return comm_all_reduce_group_start(ctx, NULL, on, buffer, count, reduce, unit, handle);
}

/* The typed forms: the begin and issue of the float ones with the element type; on NULL runs on the host and waits
 * (BACKEND=nccl: queued on the compute stream, which the kernels queued after it wait for; comm_wait). */
static int issue_typed(context *ctx, call *c, stream *on) {
    issue(ctx, c, on);
    return on == NULL ? comm_wait(ctx, c, NULL) : 0;
}

int comm_all_gather_typed(context *ctx, const comm_group *group, stream *on, const void *shard, void *full,
                          size_t full_count, dtype type, const char *unit, comm_handle *handle) {
    call local;
    call *c = on != NULL ? handle : &local;
    if (all_gather_begin(ctx, c, group, shard, full, full_count, type, unit) != 0) return -1;
    return issue_typed(ctx, c, on);
}

int comm_reduce_scatter_typed(context *ctx, const comm_group *group, stream *on, const void *full, void *shard,
                              size_t full_count, dtype type, comm_reduce reduce, const char *unit,
                              comm_handle *handle) {
    call local;
    call *c = on != NULL ? handle : &local;
    if (reduce_scatter_begin(ctx, c, group, full, shard, full_count, type, reduce, unit) != 0) return -1;
    return issue_typed(ctx, c, on);
}

int comm_all_reduce_typed(context *ctx, const comm_group *group, stream *on, void *buffer, size_t count, dtype type,
                          comm_reduce reduce, const char *unit, comm_handle *handle) {
    call local;
    call *c = on != NULL ? handle : &local;
    if (all_reduce_begin(ctx, c, group, buffer, count, type, reduce, unit) != 0) return -1;
    return issue_typed(ctx, c, on);
}
