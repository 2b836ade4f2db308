/* cuda_check.h — CUDA's and cuBLAS's errors, checked: the lowest file of the CUDA plug-in (core/cuda/), which every
 * other includes (through cuda_device.h, or directly). A failed call ends every rank with a message naming the rank,
 * the file and line, the call as written and CUDA's or cuBLAS's message.
 */
#ifndef FSDPLAB_CUDA_CHECK_H
#define FSDPLAB_CUDA_CHECK_H

#include <cublas_v2.h>
#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Aborts naming the rank, file, line, the call and CUDA's / cuBLAS's message when a call failed. */
void cuda_check(int rank, cudaError_t status, const char *call, const char *file, int line);
void cublas_check(int rank, cublasStatus_t status, const char *call, const char *file, int line);
#define CUDA_CHECK(rank, call) cuda_check((rank), (call), #call, __FILE__, __LINE__)
#define CUBLAS_CHECK(rank, call) cublas_check((rank), (call), #call, __FILE__, __LINE__)

/* Ends every rank after a message: MPI_Abort when MPI is running (a rank that stops alone would leave the others
 * waiting in a collective), abort() in a program without MPI. */
void cuda_abort_run(void);

#ifdef __cplusplus
}
#endif

#endif
