/* cuda_check.c — CUDA's and cuBLAS's errors, checked (cuda_check.h). */
#include "core/cuda/cuda_check.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

void cuda_abort_run(void) {
    fflush(stderr);
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, 1);
    abort();
}

void cuda_check(int rank, cudaError_t status, const char *call, const char *file, int line) {
    if (status == cudaSuccess) return;
    fprintf(stderr, "rank %d: %s:%d: %s failed: %s (%s)\n", rank, file, line, call, cudaGetErrorString(status),
            cudaGetErrorName(status));
    cuda_abort_run();
}

void cublas_check(int rank, cublasStatus_t status, const char *call, const char *file, int line) {
    if (status == CUBLAS_STATUS_SUCCESS) return;
    fprintf(stderr, "rank %d: %s:%d: %s failed: %s (%s)\n", rank, file, line, call, cublasGetStatusString(status),
            cublasGetStatusName(status));
    cuda_abort_run();
}
