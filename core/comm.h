/* comm.h — the collectives FSDP is made of, on float buffers, over MPI (host memory).
 *
 *   all_gather      every rank has a shard; afterwards every rank has the whole buffer     (unshard)
 *   reduce_scatter  every rank has a whole buffer; afterwards rank r has chunk r of the sum  (gradient sync)
 *   all_reduce      every rank has a whole buffer; afterwards every rank has the sum         (DDP, NO_SHARD)
 *   broadcast       root's buffer is copied to every rank
 *
 * all_gather, all_reduce, broadcast and barrier are Open MPI's own collectives; reduce_scatter is a ring written out
 * over MPI_Sendrecv in comm.c (read it: it is the algorithm the bytes in the trace assume).
 *
 * Each call writes one `collective` event (op, unit, bytes, ring traffic, seq, duration). Before moving data, every
 * rank checks that all ranks called the same op with the same count, detail (reduction, root) and unit: a mismatch
 * returns -1 on every rank with a message in ctx->error naming both ranks and values, instead of hanging or
 * producing garbage. The check is made once per signature (op, count, detail, unit): once every rank has agreed on
 * it, later calls with it skip the exchange (ctx->agreed; ctx->agreements counts the exchanges), so a unit's
 * layout is agreed on its first gather, not on every one. MPI failures also return -1 with MPI's reason. Callers
 * check the result (COMM_CHECK aborts with the message).
 */
#ifndef FSDPLAB_COMM_H
#define FSDPLAB_COMM_H

#include <stddef.h>

#include "context.h"

typedef enum comm_reduce { COMM_SUM, COMM_AVG } comm_reduce;

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

/* Aborts every rank with ctx->error when a comm call returned non-zero. */
#define COMM_CHECK(ctx, call)                                              \
    do {                                                                  \
        if ((call) != 0) ctx_fatal((ctx), "%s", (ctx)->error);             \
    } while (0)

#endif
