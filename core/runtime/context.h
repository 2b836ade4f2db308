/* context.h — the one explicit context of a run: who we are (rank, world), where events go, the memory pools, the
 * device and the backends its plug-in brought.
 *
 * There are no globals in fsdplab; every function that needs the rank, the trace or the allocator takes a context.
 * This header is the type alone. A program's life is core/runtime/session.h's: session_open (MPI up, output dir
 * made, trace opened, device chosen, start barrier, t0) ... session_close (leaks checked, trace closed, rank 0
 * writes trace.json, MPI down); core/runtime/world.h holds what the ranks do together (errors that name the rank,
 * exits every rank takes, agreement, ordered printing).
 */
#ifndef FSDPLAB_CONTEXT_H
#define FSDPLAB_CONTEXT_H

#include <mpi.h>
#include <stdint.h>

#include "trace/trace.h"
#include "core/device/device.h"
#include "core/memory/mem.h"

/* A collective's signature that every rank has agreed on (core/comm/comm.c): the op, the buffer's float count, the
 * detail (reduction or broadcast root) and a hash of the unit's name. A call whose signature is in the table skips the
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
    mem_tracker host_mem;      /* the host pool of CPU offload (core/runtime/offload.h), made on first use */
    int host_mem_ready;
    allocator_settings allocation; /* ALLOC, MAX_SPLIT_SIZE_MB: both pools use them */
    uint64_t copies[2], copy_bytes[2]; /* offload copies so far (core/runtime/offload.h), per direction: h2d, d2h */
    double copy_us[2];
    uint64_t collective_seq;   /* next collective's sequence number; equal on every rank for the same collective */
    trace_collective_info last_collective; /* what the last finished collective moved and took (unit: NULL) */
    ctx_signature agreed[CTX_SIGNATURES_MAX]; /* signatures agreed so far (comm.c); when full, every call agrees */
    int agreed_count;
    uint64_t agreements;       /* agreement exchanges made (one small MPI_Allgather each), for tests and curiosity */
    int thread_multiple;       /* MPI provides MPI_THREAD_MULTIPLE: comm streams may be threads (core/comm/stream.h) */
    double timeout_seconds;    /* TIMEOUT: a collective not complete after this long aborts the run (0: never) */
    const struct group_mesh *mesh; /* HYBRID_SHARD's shard x replicate groups (core/comm/group.h), set by the program
                                      before it builds the model; NULL: one group, the world (every other strategy) */
    int per_parameter_sharding; /* FSDP2 (FSDP_VERSION=2, fully_shard): units made from now on shard every parameter
                                   on dim 0 (core/fsdp/flat_param.h's FLAT_PARAM_ROWS); set, as mesh, before the model
                                   is built. 0: FSDP1's FlatParameter */
    device device;             /* the compute device (core/device/device.h): cpu, or cuda (DEVICE=cuda, BACKEND=nccl) */
    device host;               /* the host as a device (a CPU device): CPU offload's accumulation and AdamW run here */
    /* What the device's plug-in (core/runtime/plugin.h) brought; NULL on the CPU device: */
    const struct plugin *plugin;             /* the plug-in that made `device` (DEVICE=cuda: core/cuda/) */
    const struct stream_ops *stream_ops;     /* its streams and events (core/comm/stream.h); NULL: threads and flags */
    const struct comm_backend *collectives;  /* BACKEND=nccl: its collectives (core/comm/comm.h); NULL: MPI (= gloo) */
    void *collectives_world;                 /* that backend's communicator of the world (an ncclComm_t) */
    /* That backend's collectives that comm_wait ordered the compute stream after without the host waiting for them:
     * their completion, errors, times and trace events are taken when the host next looks (core/comm/comm.h's
     * comm_finish_pending, comm.c's list); finish_pending is that function, for session_close. */
    void *pending_collectives;
    int pending_collective_count;
    int (*finish_pending)(struct context *ctx);
    int local_rank, local_size; /* this rank among the ranks of its node (MPI_COMM_TYPE_SHARED): picks the GPU */
    int profile_kernels;       /* PROFILE_KERNELS=1: the plug-in writes outdir/kernels_rank<R>.txt at close */
    int threads;               /* compute threads per rank (env THREADS, default 1: MPI already puts a rank per core) */
    char program[64];          /* e.g. "01_shard", for messages */
    char outdir[512];          /* where rank<R>.jsonl and trace.json go */
    char error[1024];          /* the last error a function returned -1 for */
} context;

#endif
