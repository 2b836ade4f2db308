/* nccl.h of the CUDA emulator: the part of NCCL that core/cuda/nccl_comm.c calls, over MPI on the emulated GPU
 * memory (nccl.c), so `make CUDA=emulated` runs BACKEND=nccl where there is no GPU: the real nccl_comm.c, the comm
 * streams' communicators (cuda_stream.c) and the runtime's NCCL paths.
 *
 * What it is: a communicator is an MPI communicator of the same ranks in the same order (ncclCommInitRank splits
 * MPI_COMM_WORLD by the unique id, so every rank makes its communicators in the same order, as the runtime does);
 * each collective runs at once on the host, between emulator_device_access_begin and _end (the emulator is
 * synchronous: done when it returns, its stream only checked). Sums add the ranks' values in rank order in float32
 * (nccl.c reduce_blocks), in bfloat16 each partial sum rounded to bfloat16 as a ring's hops are; ncclAvg then divides
 * by the ranks (rounded once more in bfloat16). NCCL's own orders and its bfloat16 arithmetic differ: the checks that
 * use this compare within the bounds that hold for any order.
 * What it is not: NCCL's asynchrony, its proxies and kernels, its errors (ncclCommGetAsyncError is always
 * ncclSuccess), or more than the calls below. */
#ifndef FSDPLAB_CUDA_EMULATOR_NCCL_H
#define FSDPLAB_CUDA_EMULATOR_NCCL_H

#include <stddef.h>

#include "cuda_runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7,
} ncclResult_t;
typedef enum { ncclFloat32 = 7, ncclBfloat16 = 9 } ncclDataType_t;
typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 } ncclRedOp_t;
typedef struct {
    char internal[128];
} ncclUniqueId;
typedef struct nccl_emulated_comm *ncclComm_t;

ncclResult_t ncclGetUniqueId(ncclUniqueId *id);
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *async_error);
const char *ncclGetErrorString(ncclResult_t result);
const char *ncclGetLastError(ncclComm_t comm);
ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
