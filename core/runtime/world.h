/* world.h — what the ranks of a run do together: errors that name the rank, exits every rank takes at once, agreement
 * on a verdict, printing in rank order, and waiting for MPI requests under the watchdog (TIMEOUT).
 *
 * Two ways to stop, for two kinds of trouble:
 *   world_exit_all   a bad setting or world size, the same on every rank: rank 0 prints it, every rank exits cleanly
 *   world_fatal      something went wrong on this rank only: it prints "rank R: ..." and aborts every rank
 * and one way for a function to fail with a message its caller decides about: core/base/error.h's error_set into
 * ctx->error, then world_all_true when every rank must reach the same verdict.
 */
#ifndef FSDPLAB_WORLD_H
#define FSDPLAB_WORLD_H

#include <mpi.h>
#include <stdatomic.h>

#include "core/runtime/context.h"

/* A bad world size or setting is the same on every rank: rank 0 prints the message, every rank exits `status`
 * cleanly (MPI finalised), so mpirun reports a plain non-zero exit instead of an abort. */
void world_exit_all(context *ctx, int status, const char *format, ...) __attribute__((format(printf, 3, 4), noreturn));
/* Requires min_ranks <= world size <= max_ranks, else world_exit_all with a message that names the value. */
void world_require_size(context *ctx, int min_ranks, int max_ranks);
/* Something went wrong on this rank only: print "rank R: <message>" and abort every rank. */
void world_fatal(context *ctx, const char *format, ...) __attribute__((format(printf, 2, 3), noreturn));

/* Aborts naming rank, file, line, the MPI call and MPI's error string when rc is not MPI_SUCCESS. */
void world_check_mpi(context *ctx, int rc, const char *call, const char *file, int line);
#define WORLD_MPI(ctx, call) world_check_mpi((ctx), (call), #call, __FILE__, __LINE__)
/* When rc is not MPI_SUCCESS: "rank R: <what> failed: <MPI's reason>" into ctx->error and -1; else 0. */
int world_mpi_error(context *ctx, int rc, const char *what);

/* True on every rank iff `ok` is true on every rank (an all-reduce of a flag). When false, a rank that did not fail
 * gets the ctx->error of the lowest rank that did (a failing rank keeps its own), so whichever rank prints names the
 * real cause. Collective. */
int world_all_true(context *ctx, int ok);
/* Every rank contributes a text; rank 0 prints them in rank order (so tables do not interleave). Collective. */
void world_print_ordered(context *ctx, const char *text);
/* MPI_Allreduce in place of `count` values, waited for under the watchdog: a rank that stopped makes the others
 * abort naming `what` instead of waiting forever. Collective. */
void world_allreduce(context *ctx, void *buffer, int count, MPI_Datatype type, MPI_Op op, const char *what);

/* Drives MPI requests to completion. The host (hurry NULL) polls back to back, as MPI_Waitall would. A progress
 * thread (core/comm/stream.h; hurry: its "the host waits for me" count) polls back to back while *hurry > 0 and for
 * WORLD_POLL_SPIN_US after the start, otherwise in bursts of WORLD_POLL_BURST with sleeps doubling up to
 * WORLD_POLL_MAX_US between them, so the compute threads keep their cores. Returns MPI's code, or WORLD_TIMED_OUT
 * when they are not complete after ctx->timeout_seconds (TIMEOUT; 0: never): the watchdog, as NCCL's, for a rank
 * that stopped or died. */
#define WORLD_POLL_SPIN_US 200
#define WORLD_POLL_BURST 16
#define WORLD_POLL_MAX_US 64
#define WORLD_TIMED_OUT (-1)
int world_poll(context *ctx, atomic_int *hurry, int count, MPI_Request *requests);

#endif
