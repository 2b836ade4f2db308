/* comm.c — collectives over MPI with an agreement check and a trace event each. See comm.h. */
#include "comm.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum comm_op { OP_ALL_GATHER, OP_REDUCE_SCATTER, OP_ALL_REDUCE, OP_BROADCAST, OP_BARRIER } comm_op;
static const char *const op_names[] = {"all_gather", "reduce_scatter", "all_reduce", "broadcast", "barrier"};

/* One collective in flight: what it is, for the agreement check and the event. */
typedef struct call {
    comm_op op;
    const char *unit;
    const char *reduce; /* "sum" / "avg" / NULL */
    int64_t detail;     /* what else must agree: the reduction (1 sum, 2 avg) or the broadcast root */
    uint64_t count;     /* floats in the whole buffer */
    uint64_t bytes_sent, bytes_recv;
    double start_us;
} call;

static int mpi_failed(context *ctx, int rc, const call *c, const char *what) {
    if (rc == MPI_SUCCESS) return 0;
    char reason[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(rc, reason, &length);
    snprintf(ctx->error, sizeof ctx->error, "rank %d: %s on unit '%s': %s failed: %s", ctx->rank, op_names[c->op],
             c->unit, what, reason);
    return -1;
}

static const char *detail_name(comm_op op) { return op == OP_BROADCAST ? "root" : "reduction code"; }

/* FNV-1a of the unit's name: the agreement compares names as one number, and the table stores no strings. */
static uint64_t unit_hash(const char *unit) {
    uint64_t hash = 14695981039346656037ull;
    for (const char *p = unit ? unit : ""; *p; p++) hash = (hash ^ (uint64_t)(unsigned char)*p) * 1099511628211ull;
    return hash;
}

static int signature_equal(const ctx_signature *a, const ctx_signature *b) {
    return a->op == b->op && a->count == b->count && a->detail == b->detail && a->unit_hash == b->unit_hash;
}

/* The units' names differ between ranks: a second exchange fetches them, so the message can name both. Every rank
 * sees the same table, so every rank makes this exchange or none does; a rank that has already written a message
 * (op or count) keeps it (`explain` 0). Returns -1. */
static int units_differ(context *ctx, const call *c, const ctx_signature *everyone, int explain) {
    enum { NAME = 64 };
    char mine[NAME] = {0};
    snprintf(mine, sizeof mine, "%s", c->unit ? c->unit : "");
    char *names = malloc((size_t)NAME * (size_t)ctx->world_size);
    if (names == NULL) {
        snprintf(ctx->error, sizeof ctx->error, "rank %d: %s on unit '%s': out of memory", ctx->rank,
                 op_names[c->op], c->unit);
        return -1;
    }
    int rc = MPI_Allgather(mine, NAME, MPI_CHAR, names, NAME, MPI_CHAR, ctx->comm);
    if (mpi_failed(ctx, rc, c, "unit name agreement (MPI_Allgather)")) {
        free(names);
        return -1;
    }
    uint64_t my_hash = unit_hash(c->unit);
    for (int rank = 0; rank < ctx->world_size && explain; rank++) {
        if (everyone[rank].unit_hash == my_hash) continue;
        names[(size_t)NAME * (size_t)rank + NAME - 1] = '\0';
        snprintf(ctx->error, sizeof ctx->error,
                 "rank %d: %s of %llu floats on unit '%s', but rank %d called it on unit '%s': every rank must "
                 "call the same collective on the same unit", ctx->rank, op_names[c->op],
                 (unsigned long long)c->count, c->unit, rank, &names[(size_t)NAME * (size_t)rank]);
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
    ctx_signature mine = {(uint64_t)c->op, c->count, (uint64_t)c->detail, unit_hash(c->unit)};
    for (int i = 0; i < ctx->agreed_count; i++)
        if (signature_equal(&ctx->agreed[i], &mine)) return 0;
    ctx_signature *everyone = malloc(sizeof mine * (size_t)ctx->world_size);
    if (everyone == NULL) {
        snprintf(ctx->error, sizeof ctx->error, "rank %d: %s on unit '%s': out of memory", ctx->rank,
                 op_names[c->op], c->unit);
        return -1;
    }
    ctx->agreements++;
    int rc = MPI_Allgather(&mine, 4, MPI_UINT64_T, everyone, 4, MPI_UINT64_T, ctx->comm);
    if (mpi_failed(ctx, rc, c, "size agreement (MPI_Allgather)")) {
        free(everyone);
        return -1;
    }
    int status = 0;
    for (int rank = 0; rank < ctx->world_size && status == 0; rank++) {
        const ctx_signature *theirs = &everyone[rank];
        if (theirs->op != mine.op || theirs->detail != mine.detail) {
            snprintf(ctx->error, sizeof ctx->error,
                     "rank %d: %s on unit '%s' (%s %lld) but rank %d called %s (%s %lld): every rank must call "
                     "the same collective", ctx->rank, op_names[c->op], c->unit, detail_name(c->op),
                     (long long)c->detail, rank, theirs->op <= OP_BARRIER ? op_names[theirs->op] : "an unknown op",
                     detail_name(c->op), (long long)theirs->detail);
            status = -1;
        } else if (theirs->count != mine.count) {
            snprintf(ctx->error, sizeof ctx->error,
                     "rank %d: %s on unit '%s' of %llu floats, but rank %d passed %llu floats", ctx->rank,
                     op_names[c->op], c->unit, (unsigned long long)c->count, rank, (unsigned long long)theirs->count);
            status = -1;
        }
    }
    /* Only names left to compare; decided on the whole table, so every rank takes the same branch. */
    int names_match = 1;
    for (int rank = 1; rank < ctx->world_size; rank++)
        if (everyone[rank].unit_hash != everyone[0].unit_hash) names_match = 0;
    if (!names_match) status = units_differ(ctx, c, everyone, status == 0);
    free(everyone);
    if (status == 0 && ctx->agreed_count < CTX_SIGNATURES_MAX) ctx->agreed[ctx->agreed_count++] = mine;
    return status;
}

/* Checks that applies before any data moves; the same on every rank, so every rank fails together. */
static int begin(context *ctx, call *c, size_t chunk_count) {
    c->start_us = trace_now_us(&ctx->trace);
    if (chunk_count > (size_t)INT_MAX) {
        snprintf(ctx->error, sizeof ctx->error, "rank %d: %s on unit '%s': %zu floats per message exceeds MPI's int "
                 "count limit %d", ctx->rank, op_names[c->op], c->unit, chunk_count, INT_MAX);
        return -1;
    }
    return agree(ctx, c);
}

static void finish(context *ctx, const call *c) {
    trace_collective_info info = {
        .op = op_names[c->op],
        .unit = c->unit,
        .reduce = c->reduce,
        .count = c->count,
        .bytes = c->count * sizeof(float),
        .bytes_sent = c->bytes_sent,
        .bytes_recv = c->bytes_recv,
        .seq = ctx->collective_seq++,
        .stream = "compute",
        .issue_us = c->start_us,
        .start_us = c->start_us,
        .dur_us = trace_now_us(&ctx->trace) - c->start_us,
    };
    trace_collective(&ctx->trace, &info);
    ctx->last_collective = info;
    ctx->last_collective.unit = NULL; /* the caller's string may not outlive the call */
}

static int not_divisible(context *ctx, const call *c) {
    snprintf(ctx->error, sizeof ctx->error,
             "rank %d: %s on unit '%s' of %llu floats over %d ranks: not divisible; pad to a multiple of the world "
             "size first (a FlatParameter does)", ctx->rank, op_names[c->op], c->unit, (unsigned long long)c->count,
             ctx->world_size);
    return -1;
}

static void scale(float *buffer, size_t count, float factor) {
    for (size_t i = 0; i < count; i++) buffer[i] *= factor;
}

static const char *reduce_name(comm_reduce reduce) { return reduce == COMM_AVG ? "avg" : "sum"; }

/* Ring traffic for an all-gather or reduce-scatter: each rank sends and receives (N-1) chunks of full/N. */
static uint64_t ring_chunk_bytes(const context *ctx, size_t full_count) {
    return (uint64_t)(full_count / (size_t)ctx->world_size) * sizeof(float) * (uint64_t)(ctx->world_size - 1);
}

int comm_all_gather(context *ctx, const float *shard, float *full, size_t full_count, const char *unit) {
    call c = {.op = OP_ALL_GATHER, .unit = unit, .count = full_count};
    c.bytes_sent = c.bytes_recv = ring_chunk_bytes(ctx, full_count);
    size_t shard_count = full_count / (size_t)ctx->world_size;
    if (begin(ctx, &c, shard_count) != 0) return -1;
    if (full_count % (size_t)ctx->world_size != 0) return not_divisible(ctx, &c);
    int rc = MPI_Allgather(shard, (int)shard_count, MPI_FLOAT, full, (int)shard_count, MPI_FLOAT, ctx->comm);
    if (mpi_failed(ctx, rc, &c, "MPI_Allgather")) return -1;
    finish(ctx, &c);
    return 0;
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
 * rounded to float, in that order. (Receiving in cache-sized pieces and adding each at once was measured too: no
 * faster here, as Open MPI's shared-memory copy dominates, so the step stays one message.) */
static int ring_reduce_scatter(context *ctx, const call *c, const float *full, float *shard, size_t chunk,
                               float factor) {
    int world = ctx->world_size, rank = ctx->rank;
    int right = (rank + 1) % world, left = (rank - 1 + world) % world;
    if (world == 1) { /* the sum of one rank; a mean divides by 1, which changes nothing */
        memcpy(shard, full, chunk * sizeof(float));
        return 0;
    }
    /* Running sums alternate between two buffers (one is sent while the other receives); the last step receives
     * straight into shard. So 2 ranks need no buffer, 3 ranks one, 4 or more two. Every element is received before
     * it is read: no zeroing. */
    float *buffers[2] = {NULL, NULL};
    for (int i = 0; i < 2 && i < world - 2; i++)
        buffers[i] = mem_alloc_uninitialized(&ctx->mem, chunk * sizeof(float), MEM_COMM_BUFFER,
                                             "reduce_scatter.ring_buffer");
    const float *sending = full + (size_t)((rank - 1 + world) % world) * chunk; /* step 0: my own chunk r-1 */
    int status = 0;
    for (int step = 0; step < world - 1 && status == 0; step++) {
        int last = step == world - 2;
        float *sum = last ? shard : buffers[step % 2];
        int rc = MPI_Sendrecv(sending, (int)chunk, MPI_FLOAT, right, 40, sum, (int)chunk, MPI_FLOAT, left, 40,
                              ctx->comm, MPI_STATUS_IGNORE);
        if (mpi_failed(ctx, rc, c, "MPI_Sendrecv (ring step)")) status = -1;
        const float *mine = full + (size_t)((rank - step - 2 + 2 * world) % world) * chunk;
        if (status != 0) break;
        if (last && factor != 1.0f)
            for (size_t i = 0; i < chunk; i++) sum[i] = (sum[i] + mine[i]) * factor;
        else
            for (size_t i = 0; i < chunk; i++) sum[i] += mine[i];
        sending = sum;
    }
    mem_free(&ctx->mem, buffers[0]);
    mem_free(&ctx->mem, buffers[1]);
    return status;
}

int comm_reduce_scatter(context *ctx, const float *full, float *shard, size_t full_count, comm_reduce reduce,
                        const char *unit) {
    call c = {.op = OP_REDUCE_SCATTER, .unit = unit, .reduce = reduce_name(reduce), .detail = 1 + (int)reduce,
              .count = full_count};
    c.bytes_sent = c.bytes_recv = ring_chunk_bytes(ctx, full_count);
    size_t shard_count = full_count / (size_t)ctx->world_size;
    if (begin(ctx, &c, shard_count) != 0) return -1;
    if (full_count % (size_t)ctx->world_size != 0) return not_divisible(ctx, &c);
    float factor = reduce == COMM_AVG ? 1.0f / (float)ctx->world_size : 1.0f;
    if (ring_reduce_scatter(ctx, &c, full, shard, shard_count, factor) != 0) return -1;
    finish(ctx, &c);
    return 0;
}

int comm_all_reduce(context *ctx, float *buffer, size_t count, comm_reduce reduce, const char *unit) {
    call c = {.op = OP_ALL_REDUCE, .unit = unit, .reduce = reduce_name(reduce), .detail = 1 + (int)reduce,
              .count = count};
    c.bytes_sent = c.bytes_recv =
        (uint64_t)(2.0 * (double)(ctx->world_size - 1) / (double)ctx->world_size * (double)count * sizeof(float));
    if (begin(ctx, &c, count) != 0) return -1;
    int rc = MPI_Allreduce(MPI_IN_PLACE, buffer, (int)count, MPI_FLOAT, MPI_SUM, ctx->comm);
    if (mpi_failed(ctx, rc, &c, "MPI_Allreduce")) return -1;
    if (reduce == COMM_AVG) scale(buffer, count, 1.0f / (float)ctx->world_size);
    finish(ctx, &c);
    return 0;
}

int comm_broadcast(context *ctx, float *buffer, size_t count, int root, const char *unit) {
    call c = {.op = OP_BROADCAST, .unit = unit, .detail = root, .count = count};
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
    int rc = MPI_Bcast(buffer, (int)count, MPI_FLOAT, root, ctx->comm);
    if (mpi_failed(ctx, rc, &c, "MPI_Bcast")) return -1;
    finish(ctx, &c);
    return 0;
}

int comm_barrier(context *ctx, const char *unit) {
    call c = {.op = OP_BARRIER, .unit = unit};
    if (begin(ctx, &c, 0) != 0) return -1;
    int rc = MPI_Barrier(ctx->comm);
    if (mpi_failed(ctx, rc, &c, "MPI_Barrier")) return -1;
    finish(ctx, &c);
    return 0;
}
