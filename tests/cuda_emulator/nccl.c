/* nccl.c — the CUDA emulator's NCCL over MPI (see nccl.h): communicators as MPI communicators, each collective run
 * at once on the emulated GPU memory. */
#include "nccl.h"

#include <limits.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/dtype.h"

struct nccl_emulated_comm {
    MPI_Comm mpi;
    int rank, size;
};

/* What a unique id holds: who made it and its number there (its MPI_Comm_split colour), and a mark. */
typedef struct {
    int creator, number;
    char mark[8];
} unique_id;
#define ID_MARK "fsdpemu"

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    static int made;
    unique_id made_id = {0, made++, ID_MARK};
    MPI_Comm_rank(MPI_COMM_WORLD, &made_id.creator);
    if (made_id.creator >= (1 << 14) || made_id.number >= (1 << 16)) return ncclInternalError;
    memset(id, 0, sizeof *id);
    memcpy(id->internal, &made_id, sizeof made_id);
    return ncclSuccess;
}

/* Collective over the world: every rank makes its communicators in the same order (the runtime's world, then each
 * comm stream's and each group's), each splitting MPI_COMM_WORLD by its id's colour. */
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
    unique_id made_id;
    memcpy(&made_id, id.internal, sizeof made_id);
    *comm = NULL;
    if (memcmp(made_id.mark, ID_MARK, sizeof made_id.mark) != 0 || nranks <= 0 || rank < 0 || rank >= nranks)
        return ncclInvalidArgument;
    struct nccl_emulated_comm *c = calloc(1, sizeof *c);
    if (c == NULL) return ncclSystemError;
    if (MPI_Comm_split(MPI_COMM_WORLD, made_id.creator * (1 << 16) + made_id.number, rank, &c->mpi) != MPI_SUCCESS) {
        free(c);
        return ncclSystemError;
    }
    MPI_Comm_rank(c->mpi, &c->rank);
    MPI_Comm_size(c->mpi, &c->size);
    if (c->rank != rank || c->size != nranks) {
        fprintf(stderr, "nccl emulator: ncclCommInitRank: rank %d of %d asked, rank %d of %d made (the ranks must make "
                "their communicators in the same order)\n", rank, nranks, c->rank, c->size);
        MPI_Comm_free(&c->mpi);
        free(c);
        return ncclInvalidUsage;
    }
    *comm = c;
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (comm == NULL) return ncclInvalidArgument;
    MPI_Comm_free(&comm->mpi);
    free(comm);
    return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *async_error) {
    if (comm == NULL || async_error == NULL) return ncclInvalidArgument;
    *async_error = ncclSuccess;
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t result) {
    switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    }
    return "unknown result code";
}

const char *ncclGetLastError(ncclComm_t comm) {
    (void)comm;
    return "";
}

static size_t type_size(ncclDataType_t type) { return type == ncclBfloat16 ? 2 : 4; }

/* Whether a call's arguments are ones this emulator serves; its buffers are opened to the host by the caller.
 * send_bytes of sendbuff and recv_bytes of recvbuff (0: not read) must be GPU memory: NCCL's kernels read and write
 * them on the GPU, where a host pointer is refused by NCCL's argument check or, unchecked, an illegal address found
 * later as the stream's error. Here the call refuses it at once, naming it. */
static int call_ok(ncclComm_t comm, ncclDataType_t type, size_t bytes, cudaStream_t stream, const char *call,
                   const void *sendbuff, size_t send_bytes, const void *recvbuff, size_t recv_bytes) {
    if (comm == NULL || (type != ncclFloat32 && type != ncclBfloat16) || !emulator_stream_ok(stream)) {
        fprintf(stderr, "nccl emulator: %s: a communicator, float32 or bfloat16 and a live stream, please\n", call);
        return 0;
    }
    if (bytes > (size_t)INT_MAX / (size_t)comm->size) {
        fprintf(stderr, "nccl emulator: %s of %zu bytes: too large for one MPI call here\n", call, bytes);
        return 0;
    }
    const void *buffers[2] = {sendbuff, recvbuff};
    const size_t sizes[2] = {send_bytes, recv_bytes};
    for (int i = 0; i < 2; i++)
        if (sizes[i] > 0 && !emulator_is_device(buffers[i], sizes[i])) {
            fprintf(stderr, "nccl emulator: %s: its %s buffer %p (%zu bytes) is not GPU memory\n", call,
                    i == 0 ? "send" : "receive", buffers[i], sizes[i]);
            return 0;
        }
    return 1;
}

static float load(const void *values, size_t i, ncclDataType_t type) {
    return type == ncclBfloat16 ? bf16_to_float(((const bf16 *)values)[i]) : ((const float *)values)[i];
}

static void store(void *values, size_t i, float value, ncclDataType_t type) {
    if (type == ncclBfloat16) ((bf16 *)values)[i] = bf16_from_float(value);
    else ((float *)values)[i] = value;
}

/* out[i] = the ranks' blocks (`ranks` blocks of `count` in `all`) reduced in rank order: each partial sum in float32,
 * rounded to bfloat16 after every addition when bfloat16 (a ring's hops each store one), ncclAvg then divided. */
static void reduce_blocks(void *out, const void *all, size_t count, int ranks, ncclDataType_t type, ncclRedOp_t op) {
    for (size_t i = 0; i < count; i++) {
        float sum = load(all, i, type);
        for (int r = 1; r < ranks; r++) {
            sum += load(all, (size_t)r * count + i, type);
            if (type == ncclBfloat16) sum = bf16_round(sum);
        }
        if (op == ncclAvg) sum /= (float)ranks;
        store(out, i, sum, type);
    }
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
    size_t bytes = sendcount * type_size(datatype);
    if (!call_ok(comm, datatype, bytes, stream, "ncclAllGather", sendbuff, bytes, recvbuff,
                 bytes * (size_t)comm->size))
        return ncclInvalidArgument;
    const char *own = (const char *)recvbuff + (size_t)comm->rank * bytes;
    emulator_device_access_begin();
    int rc = MPI_Allgather(sendbuff == own ? MPI_IN_PLACE : sendbuff, (int)bytes, MPI_BYTE, recvbuff, (int)bytes,
                           MPI_BYTE, comm->mpi);
    emulator_device_access_end();
    return rc == MPI_SUCCESS ? ncclSuccess : ncclSystemError;
}

/* ReduceScatter and AllReduce: every rank's blocks of `count` gathered here (all to all: each rank's own part of
 * every rank's buffer; all: every rank's whole buffer), then reduced in rank order into recvbuff. */
static ncclResult_t exchange_reduce(const char *call, int all_to_all, const void *sendbuff, void *recvbuff,
                                    size_t count, ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                    cudaStream_t stream) {
    size_t bytes = count * type_size(datatype);
    size_t all_bytes = bytes * (size_t)comm->size;
    if (!call_ok(comm, datatype, bytes, stream, call, sendbuff, all_to_all ? all_bytes : bytes, recvbuff, bytes) ||
        (op != ncclSum && op != ncclAvg))
        return ncclInvalidArgument;
    void *blocks = malloc(bytes * (size_t)comm->size + 1);
    if (blocks == NULL) return ncclSystemError;
    emulator_device_access_begin();
    int rc = all_to_all ? MPI_Alltoall(sendbuff, (int)bytes, MPI_BYTE, blocks, (int)bytes, MPI_BYTE, comm->mpi)
                        : MPI_Allgather(sendbuff, (int)bytes, MPI_BYTE, blocks, (int)bytes, MPI_BYTE, comm->mpi);
    if (rc == MPI_SUCCESS) reduce_blocks(recvbuff, blocks, count, comm->size, datatype, op);
    emulator_device_access_end();
    free(blocks);
    return rc == MPI_SUCCESS ? ncclSuccess : ncclSystemError;
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    return exchange_reduce("ncclReduceScatter", 1, sendbuff, recvbuff, recvcount, datatype, op, comm, stream);
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    return exchange_reduce("ncclAllReduce", 0, sendbuff, recvbuff, count, datatype, op, comm, stream);
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
    size_t bytes = count * type_size(datatype);
    if (!call_ok(comm, datatype, bytes, stream, "ncclBroadcast", sendbuff, comm->rank == root ? bytes : 0, recvbuff,
                 bytes) || root < 0 || root >= comm->size)
        return ncclInvalidArgument;
    emulator_device_access_begin();
    if (comm->rank == root && sendbuff != recvbuff) memmove(recvbuff, sendbuff, bytes);
    int rc = MPI_Bcast(recvbuff, (int)bytes, MPI_BYTE, root, comm->mpi);
    emulator_device_access_end();
    return rc == MPI_SUCCESS ? ncclSuccess : ncclSystemError;
}
