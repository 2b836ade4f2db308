/* comm_backend.h — the table a collectives backend other than MPI fills (BACKEND=nccl: core/cuda/nccl_comm.c).
 *
 * MPI is the collectives' own backend (core/comm/comm.c, on host buffers); a device's plug-in (core/runtime/plugin.h)
 * may bring another and set ctx->collectives to its table. Process groups (core/comm/group.h) then make a
 * communicator of it for each group, and comm.c hands it the collectives. Types by name only, so the groups need
 * no more than this header.
 */
#ifndef FSDPLAB_COMM_BACKEND_H
#define FSDPLAB_COMM_BACKEND_H

#include <mpi.h>

#include "core/runtime/context.h"

struct comm_handle; /* core/comm/comm.h */
struct stream;      /* core/comm/stream.h */

/* A collectives backend other than MPI, brought by the device's plug-in (core/runtime/plugin.h; BACKEND=nccl:
 * core/cuda/nccl_comm.c) and set as ctx->collectives. comm.c agrees on every collective and sets its handle up as
 * for MPI, then hands it over: issue queues it on `on`; comm_wait calls order, which makes the compute stream wait
 * for it on the device (the host goes on), and keeps the handle; later (comm_finish_pending) wait is the host's wait
 * for it and finish reads its times. The barrier stays MPI's. */
typedef struct comm_backend {
    const char *name;             /* the BACKEND value: "nccl" */
    /* The communicator of the ranks of `mpi` (collective over them), `name` in messages: 0, or -1 with ctx->error. */
    int (*create)(context *ctx, MPI_Comm mpi, const char *name, void **communicator);
    void (*destroy)(void *communicator); /* NULL: nothing */
    void (*issue)(context *ctx, struct comm_handle *c, struct stream *on);
    /* Work queued on the compute stream from now on runs after c (no host wait) */
    void (*order)(context *ctx, struct comm_handle *c);
    int (*wait)(context *ctx, struct comm_handle *c); /* 0, or -1 with c->error (the backend's error, or TIMEOUT) */
    void (*finish)(context *ctx, struct comm_handle *c); /* after wait: its start and end on the trace's clock */
} comm_backend;

#endif
