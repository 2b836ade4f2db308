/* nccl_comm.c — NCCL communicators from an MPI-broadcast ncclUniqueId; the collectives queued on cudaStreams. See
 * nccl_comm.h. */
#include "core/cuda/nccl_comm.h"

#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cuda/cuda_device.h"
#include "core/cuda/cuda_stream.h"
#include "core/runtime/world.h"
#include "core/base/error.h"

/* Aborts naming the rank, what was being done (the collective and unit, or the communicator), the call and NCCL's
 * reason with its last message, when an NCCL call failed. */
static void nccl_check(int rank, ncclResult_t result, const char *what, const char *call, ncclComm_t comm,
                       const char *file, int line) {
    if (result == ncclSuccess) return;
    const char *detail = ncclGetLastError(comm);
    fprintf(stderr, "rank %d: %s:%d: %s: %s failed: %s%s%s\n", rank, file, line, what, call,
            ncclGetErrorString(result), detail != NULL && detail[0] != '\0' ? ": " : "", detail ? detail : "");
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1); /* not reached */
}
#define NCCL_CHECK(rank, what, comm, call) nccl_check((rank), (call), (what), #call, (comm), __FILE__, __LINE__)

int nccl_comm_create(context *ctx, MPI_Comm mpi, const char *name, void **out) {
    *out = NULL;
    int rank = 0, size = 0;
    WORLD_MPI(ctx, MPI_Comm_rank(mpi, &rank));
    WORLD_MPI(ctx, MPI_Comm_size(mpi, &size));
    /* Rank 0's id and whether it got one, in one broadcast: every rank learns of a failure there. */
    struct {
        ncclUniqueId id;
        int status;
    } offer;
    memset(&offer, 0, sizeof offer);
    if (rank == 0) offer.status = (int)ncclGetUniqueId(&offer.id);
    WORLD_MPI(ctx, MPI_Bcast(&offer, (int)sizeof offer, MPI_BYTE, 0, mpi));
    if (offer.status != (int)ncclSuccess)
        return error_set(ctx->error, sizeof ctx->error, "rank %d: NCCL communicator '%s': ncclGetUniqueId failed on "
                         "its rank 0: %s", ctx->rank, name, ncclGetErrorString((ncclResult_t)offer.status));
    ncclComm_t comm = NULL;
    ncclResult_t result = ncclCommInitRank(&comm, size, offer.id, rank);
    if (result != ncclSuccess) {
        const char *detail = ncclGetLastError(NULL);
        return error_set(ctx->error, sizeof ctx->error, "rank %d: NCCL communicator '%s' (%d ranks; this one is its "
                         "rank %d): ncclCommInitRank failed: %s%s%s", ctx->rank, name, size, rank,
                         ncclGetErrorString(result), detail && detail[0] ? ": " : "", detail ? detail : "");
    }
    *out = comm;
    return 0;
}

void nccl_comm_destroy(void *comm) {
    if (comm == NULL) return;
    int rank = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    NCCL_CHECK(rank, "destroying an NCCL communicator", NULL, ncclCommDestroy((ncclComm_t)comm));
}

/* ---- the collectives ---- */

static ncclDataType_t nccl_type(context *ctx, const comm_handle *c) {
    switch (c->dtype) {
    case DTYPE_FLOAT32: return ncclFloat32;
    case DTYPE_BFLOAT16: return ncclBfloat16;
    default:
        world_fatal(ctx, "%s on unit '%s': NCCL moves float32 or bfloat16 here, not %s", comm_op_name(c->op), c->unit,
                  dtype_name(c->dtype));
    }
}

void nccl_comm_issue(context *ctx, comm_handle *c, stream *on) {
    cuda_device_state *device = ctx->device.impl;
    int own = on != NULL && on->device_ordered && on->kind == STREAM_WORKER; /* a comm stream; else compute */
    cudaStream_t stream = own ? (cudaStream_t)cuda_stream_handle(on) : device->compute;
    ncclComm_t comm = own ? cuda_stream_nccl(on, c->group) : c->group ? c->group->backend_comm : ctx->collectives_world;
    if (comm == NULL)
        world_fatal(ctx, "%s on unit '%s': no NCCL communicator for %s", comm_op_name(c->op), c->unit,
                  c->group ? c->group->name : "the world");
    char what[160];
    snprintf(what, sizeof what, "%s on unit '%s' (seq %llu, stream %s)", comm_op_name(c->op), c->unit,
             (unsigned long long)c->seq, own ? on->name : "compute");
    /* Its input was written by kernels queued on the compute stream so far: it starts after them. */
    if (own) CUDA_CHECK(ctx->rank, cudaStreamWaitEvent(stream, (cudaEvent_t)cuda_compute_record(ctx), 0));
    c->backend_comm = comm;
    if (own) {
        stream_event started = {0};
        event_record(&started, on);
        c->device_start = started.device_event;
    } else {
        c->device_start = cuda_compute_record(ctx);
    }
    ncclDataType_t type = nccl_type(ctx, c);
    ncclRedOp_t reduce = c->detail == 1 + COMM_AVG ? ncclAvg : ncclSum; /* comm.c's detail: 1 + the reduction */
    switch ((comm_op)c->op) {
    case COMM_OP_ALL_GATHER: /* in place when the shard sits at its chunk of the output, as NCCL allows */
        NCCL_CHECK(ctx->rank, what, comm, ncclAllGather(c->send, c->receive, c->chunk, type, comm, stream));
        break;
    case COMM_OP_REDUCE_SCATTER:
        NCCL_CHECK(ctx->rank, what, comm, ncclReduceScatter(c->send, c->receive, c->chunk, type, reduce, comm, stream));
        break;
    case COMM_OP_ALL_REDUCE:
        NCCL_CHECK(ctx->rank, what, comm, ncclAllReduce(c->receive, c->receive, c->count, type, reduce, comm, stream));
        break;
    case COMM_OP_BROADCAST:
        NCCL_CHECK(ctx->rank, what, comm,
                   ncclBroadcast(c->receive, c->receive, c->count, type, (int)c->detail, comm, stream));
        break;
    case COMM_OP_BARRIER: world_fatal(ctx, "%s: a barrier runs on MPI, not NCCL", what);
    }
    if (own) {
        event_record(&c->done, on);
        c->device_end = c->done.device_event;
    } else {
        c->device_end = cuda_compute_record(ctx);
    }
}

/* cuda_event_poll's `failed`: NCCL's asynchronous error of c's communicator, into c->error. */
static int nccl_failed(void *arg) {
    comm_handle *c = arg;
    ncclResult_t async = ncclSuccess;
    NCCL_CHECK(c->ctx->rank, comm_op_name(c->op), (ncclComm_t)c->backend_comm,
               ncclCommGetAsyncError((ncclComm_t)c->backend_comm, &async));
    if (async == ncclSuccess || async == ncclInProgress) return 0;
    const char *detail = ncclGetLastError((ncclComm_t)c->backend_comm);
    snprintf(c->error, sizeof c->error, "rank %d: %s on unit '%s' (seq %llu): NCCL failed: %s%s%s", c->ctx->rank,
             comm_op_name(c->op), c->unit, (unsigned long long)c->seq, ncclGetErrorString(async),
             detail && detail[0] ? ": " : "", detail ? detail : "");
    return 1;
}

/* Polled (cuda_event_poll: the host has nothing else to do, and a wait of a few microseconds stays that short), NCCL's
 * asynchronous errors checked between polls. */
int nccl_comm_wait(context *ctx, comm_handle *c) {
    int status = cuda_event_poll(ctx->rank, (cudaEvent_t)c->device_end, ctx->timeout_seconds, nccl_failed, c);
    if (status == 0) {
        double now_us = trace_now_us(&ctx->trace);
        if (c->seen_us == 0.0 || now_us < c->seen_us) c->seen_us = now_us;
        return 0;
    }
    if (status < 0) /* the watchdog (TIMEOUT), as the MPI path's and NCCL's own in torch */
        snprintf(c->error, sizeof c->error, "rank %d: %s on unit '%s' (seq %llu, NCCL) timed out: not complete after "
                 "%g s (TIMEOUT); a rank has stopped, died or fallen behind by more than that", ctx->rank,
                 comm_op_name(c->op), c->unit, (unsigned long long)c->seq, ctx->timeout_seconds);
    c->status = -1;
    return -1;
}

/* Kernels queued on the compute stream from now on read what it wrote: the stream waits for its end event on the
 * device (torch's wait_stream), and the host goes on without waiting. */
void nccl_comm_order(context *ctx, comm_handle *c) {
    cuda_device_state *device = ctx->device.impl;
    CUDA_CHECK(ctx->rank, cudaStreamWaitEvent(device->compute, (cudaEvent_t)c->device_end, 0));
}

void nccl_comm_finish(context *ctx, comm_handle *c) {
    if (c->status != 0) return; /* comm_backend.h: called after wait, which saw it done (c->seen_us) */
    /* Its times on the trace clock, each off by the few microseconds of the conversion, then kept within what is
     * known for sure: it started no earlier than it was issued, nor before the one queued ahead of it on its stream
     * ended, and ended no later than the host saw it done. Moved (its duration kept) or, where the bounds pinch,
     * trimmed, so the trace never shows a stream's collectives overlap or a wait end before what it waited for. */
    double start_us = 0.0, end_us = 0.0;
    cuda_event_times(ctx, c->device_start, c->device_end, &start_us, &end_us);
    int own = c->stream != NULL && c->stream->device_ordered && c->stream->kind == STREAM_WORKER;
    double *previous_end = own ? cuda_stream_last_end_us(c->stream) : NULL;
    double earliest = c->issue_us;
    if (previous_end != NULL && *previous_end > earliest) earliest = *previous_end;
    if (end_us > c->seen_us) start_us -= end_us - c->seen_us, end_us = c->seen_us;
    if (start_us < earliest) start_us = earliest;
    if (end_us < start_us) end_us = start_us;
    if (previous_end != NULL) *previous_end = end_us;
    c->start_us = start_us;
    c->end_us = end_us;
}
