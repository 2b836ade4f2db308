/* cublas_v2.h of the CUDA emulator (see cuda_runtime.h here): a handle, its stream and math mode, and the two GEMMs
 * cuda_ops.cu calls as OpenBLAS's column-major cblas_sgemm, which has cuBLAS's exact meaning (column-major, op per
 * operand, alpha, beta, leading dimensions). The dimensions are checked as cuBLAS checks them
 * (CUBLAS_STATUS_INVALID_VALUE), the operands must lie in GPU memory (CUBLAS_STATUS_EXECUTION_FAILED otherwise: on a
 * GPU a host pointer faults), and the handle must be live (CUBLAS_STATUS_NOT_INITIALIZED). The math mode is
 * recorded, not applied: the GEMMs are float32 whatever it says. Implemented in runtime.cpp. */
#ifndef FSDPLAB_CUDA_EMULATOR_CUBLAS_H
#define FSDPLAB_CUDA_EMULATOR_CUBLAS_H

#include "cuda_runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cublasContext *cublasHandle_t;
typedef enum cublasStatus {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_EXECUTION_FAILED = 13,
} cublasStatus_t;
typedef enum { CUBLAS_OP_N, CUBLAS_OP_T } cublasOperation_t;
typedef enum { CUBLAS_DEFAULT_MATH, CUBLAS_TF32_TENSOR_OP_MATH } cublasMath_t;

cublasStatus_t cublasCreate(cublasHandle_t *handle);
cublasStatus_t cublasDestroy(cublasHandle_t handle);
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream);
cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode);
const char *cublasGetStatusString(cublasStatus_t status);
const char *cublasGetStatusName(cublasStatus_t status);
cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                           int k, const float *alpha, const float *A, int lda, const float *B, int ldb,
                           const float *beta, float *C, int ldc);
cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                         int m, int n, int k, const float *alpha, const float *A, int lda,
                                         long long strideA, const float *B, int ldb, long long strideB,
                                         const float *beta, float *C, int ldc, long long strideC, int batch);

#ifdef __cplusplus
}
#endif

#endif
