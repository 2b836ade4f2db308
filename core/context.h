/* context.h — the one explicit context of a run: who we are (rank, world), where events go, the memory tracker.
 *
 * There are no globals in fsdplab; every function that needs the rank, the trace or the allocator takes a context.
 * A program's life is: ctx_init (MPI up, output dir made, trace opened, start barrier, t0) ... ctx_finish (leaks
 * checked, trace closed, rank 0 writes trace.json, MPI down).
 */
#ifndef FSDPLAB_CONTEXT_H
#define FSDPLAB_CONTEXT_H

#include <mpi.h>
#include <stdint.h>

#include "../trace/trace.h"
#include "device.h"
#include "mem.h"

/* A collective's signature that every rank has agreed on (core/comm.c): the op, the buffer's float count, the detail
 * (reduction or broadcast root) and a hash of the unit's name. A call whose signature is in the table skips the
 * agreement exchange; the table is the same on every rank because a signature enters it only after all agreed. */
typedef struct ctx_signature {
    uint64_t op, count, detail, unit_hash;
} ctx_signature;
#define CTX_SIGNATURES_MAX 256

typedef struct context {
    int rank;
    int world_size;
    MPI_Comm comm;             /* errors return (MPI_ERRORS_RETURN) and every call is checked */
    trace_sink trace;
    mem_tracker mem;           /* the device pool: everything not offloaded (DEVICE_MEMORY_MB: its budget) */
    mem_tracker host_mem;      /* the host pool of CPU offload (core/offload.h), made on first use */
    int host_mem_ready;
    allocator_settings allocation; /* ALLOC, MAX_SPLIT_SIZE_MB: both pools use them */
    uint64_t copies[2], copy_bytes[2]; /* offload copies so far (core/offload.h), per direction: h2d, d2h */
    double copy_us[2];
    uint64_t collective_seq;   /* next collective's sequence number; equal on every rank for the same collective */
    trace_collective_info last_collective; /* what the last finished collective moved and took (unit: NULL) */
    ctx_signature agreed[CTX_SIGNATURES_MAX]; /* signatures agreed so far (comm.c); when full, every call agrees */
    int agreed_count;
    uint64_t agreements;       /* agreement exchanges made (one small MPI_Allgather each), for tests and curiosity */
    int thread_multiple;       /* MPI provides MPI_THREAD_MULTIPLE: comm streams may be threads (core/stream.h) */
    double timeout_seconds;    /* TIMEOUT: a collective not complete after this long aborts the run (0: never) */
    const struct group_mesh *mesh; /* HYBRID_SHARD's shard x replicate groups (core/group.h), set by the program before
                                  it builds the model; NULL: one group, the world (every other strategy) */
    device device;             /* the compute device (core/device.h): cpu, or cuda (DEVICE=cuda, BACKEND=nccl) */
    device host;               /* the host as a device (a CPU device): CPU offload's accumulation and AdamW run here */
    enum { CTX_BACKEND_MPI, CTX_BACKEND_NCCL } backend; /* BACKEND: who moves collectives' bytes (mpi = gloo) */
    void *nccl;                /* BACKEND=nccl: the NCCL communicators (core/cuda/nccl_comm.h), else NULL */
    int local_rank, local_size; /* this rank among the ranks of its node (MPI_COMM_TYPE_SHARED): picks the GPU */
    int threads;               /* compute threads per rank (env THREADS, default 1: MPI already puts a rank per core) */
    char program[64];          /* e.g. "01_shard", for messages */
    char outdir[512];          /* where rank<R>.jsonl and trace.json go */
    char error[1024];          /* the last error a function returned -1 for */
} context;

/* Starts MPI and the run. OUT (environment) overrides default_outdir. Aborts with a message on failure. */
void ctx_init(context *ctx, int *argc, char ***argv, const char *program, const char *default_outdir);
/* Checks every rank's leaks, closes the trace and (rank 0) writes <outdir>/trace.json, then finalises MPI.
 * Returns the process exit status: 0, or 1 when memory leaked or the export failed. */
int ctx_finish(context *ctx);

/* A bad world size or setting is the same on every rank: rank 0 prints the message, every rank exits `status`
 * cleanly (MPI finalised), so mpirun reports a plain non-zero exit instead of an abort. */
void ctx_exit_all(context *ctx, int status, const char *format, ...) __attribute__((format(printf, 3, 4), noreturn));
/* Requires min_ranks <= world size <= max_ranks, else ctx_exit_all with a message that names the value. */
void ctx_require_world_size(context *ctx, int min_ranks, int max_ranks);
/* Something went wrong on this rank only: print "rank R: <message>" and abort every rank. */
void ctx_fatal(context *ctx, const char *format, ...) __attribute__((format(printf, 2, 3), noreturn));

/* Every rank contributes a text; rank 0 prints them in rank order (so tables do not interleave). Collective. */
void ctx_print_ordered(context *ctx, const char *text);
/* MPI_Allreduce in place of `count` values, waited for under the watchdog (TIMEOUT, core/stream.h): a rank that
 * stopped makes the others abort naming `what` instead of waiting forever. Collective. */
void ctx_allreduce(context *ctx, void *buffer, int count, MPI_Datatype type, MPI_Op op, const char *what);
/* True on every rank iff `ok` is true on every rank (an all-reduce of a flag). When false, a rank that did not fail
 * gets the ctx->error of the lowest rank that did (a failing rank keeps its own), so whichever rank prints names the
 * real cause. Collective. */
int ctx_all_true(context *ctx, int ok);

/* Writes the message into error (error_size bytes) and returns -1: how a function that fails with a message ends. */
int ctx_error(char *error, size_t error_size, const char *format, ...) __attribute__((format(printf, 3, 4)));

/* Aborts naming rank, file, line, the MPI call and MPI's error string when rc is not MPI_SUCCESS. */
void ctx_check_mpi(context *ctx, int rc, const char *call, const char *file, int line);
#define CTX_MPI(ctx, call) ctx_check_mpi((ctx), (call), #call, __FILE__, __LINE__)

/* mkdir -p. Returns 0 or -1 with errno set. */
int ctx_make_directories(const char *path);

#endif
