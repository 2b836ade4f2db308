/* nccl_absent.c — core/cuda/nccl_comm.h in the CUDA emulator's build (make CUDA=emulated): NCCL is not emulated, so
 * BACKEND=nccl is refused at its first communicator, saying so; the collectives are never reached (issue, wait and
 * finish end the run if they are). BACKEND=mpi on the emulated device needs none of this. */
#include "core/cuda/nccl_comm.h"
#include "core/runtime/world.h"
#include "core/base/error.h"

int nccl_comm_create(context *ctx, MPI_Comm mpi, const char *name, void **comm) {
    (void)mpi;
    *comm = NULL;
    return error_set(ctx->error, sizeof ctx->error,
                     "rank %d: NCCL communicator '%s': NCCL is not emulated (the CUDA emulator's build); use "
                     "BACKEND=mpi", ctx->rank, name);
}

void nccl_comm_destroy(void *comm) { (void)comm; }

void nccl_comm_issue(context *ctx, comm_handle *c, stream *on) {
    (void)c, (void)on;
    world_fatal(ctx, "nccl_comm_issue: NCCL is not emulated (the CUDA emulator's build)");
}

int nccl_comm_wait(context *ctx, comm_handle *c) {
    (void)c;
    world_fatal(ctx, "nccl_comm_wait: NCCL is not emulated (the CUDA emulator's build)");
}

void nccl_comm_finish(context *ctx, comm_handle *c) {
    (void)c;
    world_fatal(ctx, "nccl_comm_finish: NCCL is not emulated (the CUDA emulator's build)");
}
