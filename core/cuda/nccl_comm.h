/* nccl_comm.h — BACKEND=nccl: NCCL communicators, and core/comm/comm.h's collectives run on them (make CUDA=1).
 *
 * A communicator is made the way torch's ProcessGroupNCCL makes one: the group's rank 0 asks NCCL for an
 * ncclUniqueId, MPI_Bcast gives it to the group's other ranks over the group's MPI communicator, and every member
 * joins with ncclCommInitRank(size, id, its rank in the group). There is one for the world (ctx->collectives_world, the
 * compute stream's), one per process group (core/comm/group.h `backend_comm`), and one of the world and of each group
 * per comm stream (core/cuda/cuda_stream.c): as on the MPI path each comm stream has its own duplicate communicators,
 * so the all-gathers and reduce-scatters on two streams never share one.
 *
 * What stays on MPI: the agreement check of every collective (core/comm/comm.c, on the host, before anything is
 * queued), the barrier, and everything of the context (world_allreduce, ordered printing).
 *
 * A collective is queued on a cudaStream (the comm stream's, or the compute stream's for the blocking forms and a
 * host stream) behind the compute stream's work queued before it (a cudaEvent: its input was written there), between
 * two cudaEvents that give its duration on the trace clock. comm_wait makes the compute stream wait for the second
 * (cudaStreamWaitEvent, as torch's wait_stream) and does not wait on the host: a host wait there would empty the
 * GPU's queue before the next kernels are launched. The host waits for it later, where it waits anyway (the step's
 * losses and timers, core/comm/comm.h's comm_finish_pending), polling, so TIMEOUT's watchdog and NCCL's
 * asynchronous errors are seen then, and its trace event is written then.
 *
 * A mean (COMM_AVG) is ncclAvg, where the MPI path sums and then multiplies once by 1/N. Depending on its version and
 * kernel NCCL scales each input by 1/N before summing or divides the sum by N; for N a power of two either is an exact
 * scaling (short of underflow), so the results differ from the MPI path's only as two orders of summation differ, and
 * for other N by one more rounding (half an ulp) per term. Why not ncclSum and a scaling kernel: one NCCL call, no
 * kernel of ours on the comm stream, and what torch's FSDP2 asks of NCCL (ReduceOp.AVG). The events' byte counts stay
 * the ring's (EVENTS.md), whatever algorithm NCCL picks.
 */
#ifndef FSDPLAB_NCCL_COMM_H
#define FSDPLAB_NCCL_COMM_H

#include <mpi.h>

#include "core/comm/comm.h"
#include "core/runtime/context.h"

/* The NCCL communicator (ncclComm_t, as void *) of the ranks of `mpi`, called `name` in messages. Collective over
 * mpi. 0, or -1 with ctx->error (the failing rank's; a rank that fails while others wait in ncclCommInitRank must
 * abort them: the caller world_fatal's). */
int nccl_comm_create(context *ctx, MPI_Comm mpi, const char *name, void **comm);
/* NULL: nothing. */
void nccl_comm_destroy(void *comm);

/* Queues the collective c (core/comm/comm.c has agreed on it and set it up) on `on`: a device stream of its own
 * (BACKEND=nccl comm stream), or, on NULL or a stream on the compute cudaStream, the compute stream. */
void nccl_comm_issue(context *ctx, comm_handle *c, stream *on);
/* The compute stream waits for c on the device: the kernels queued from now on read what it wrote. No host wait. */
void nccl_comm_order(context *ctx, comm_handle *c);
/* The host waits until c has run, polling: 0, or -1 with c->error when NCCL reported an error or TIMEOUT passed. */
int nccl_comm_wait(context *ctx, comm_handle *c);
/* After nccl_comm_wait returned 0 (it set c->status and c->error where not): c's start and end onto the trace clock
 * (c->start_us, c->end_us). */
void nccl_comm_finish(context *ctx, comm_handle *c);

#endif
