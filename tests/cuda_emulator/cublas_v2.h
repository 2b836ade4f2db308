/* cublas_v2.h of the CUDA emulator: the two GEMMs cuda_ops.cu calls, as OpenBLAS's column-major cblas_sgemm, which
 * has cuBLAS's exact meaning (column-major, op per operand, alpha, beta, leading dimensions). The leading
 * dimensions are checked as cuBLAS checks them (CUBLAS_STATUS_INVALID_VALUE). */
#ifndef FSDPLAB_CUDA_EMULATOR_CUBLAS_H
#define FSDPLAB_CUDA_EMULATOR_CUBLAS_H

#include <cblas.h>
#include <cuda_runtime.h>

typedef struct cublasContext *cublasHandle_t;
typedef int cublasStatus_t;
enum { CUBLAS_STATUS_SUCCESS = 0, CUBLAS_STATUS_INVALID_VALUE = 7 };
typedef enum { CUBLAS_OP_N, CUBLAS_OP_T } cublasOperation_t;
typedef enum { CUBLAS_DEFAULT_MATH, CUBLAS_TF32_TENSOR_OP_MATH } cublasMath_t;

static inline cublasStatus_t cublasSgemm(cublasHandle_t, cublasOperation_t transa, cublasOperation_t transb, int m,
                                         int n, int k, const float *alpha, const float *A, int lda, const float *B,
                                         int ldb, const float *beta, float *C, int ldc) {
    if (m < 0 || n < 0 || k < 0 || lda < (transa == CUBLAS_OP_N ? m : k) || lda < 1 ||
        ldb < (transb == CUBLAS_OP_N ? k : n) || ldb < 1 || ldc < m || ldc < 1)
        return CUBLAS_STATUS_INVALID_VALUE;
    cblas_sgemm(CblasColMajor, transa == CUBLAS_OP_T ? CblasTrans : CblasNoTrans,
                transb == CUBLAS_OP_T ? CblasTrans : CblasNoTrans, m, n, k, *alpha, A, lda, B, ldb, *beta, C, ldc);
    return CUBLAS_STATUS_SUCCESS;
}

static inline cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa,
                                                       cublasOperation_t transb, int m, int n, int k,
                                                       const float *alpha, const float *A, int lda, long long strideA,
                                                       const float *B, int ldb, long long strideB, const float *beta,
                                                       float *C, int ldc, long long strideC, int batch) {
    for (int i = 0; i < batch; i++) {
        cublasStatus_t status = cublasSgemm(handle, transa, transb, m, n, k, alpha, A + i * strideA, lda,
                                            B + i * strideB, ldb, beta, C + i * strideC, ldc);
        if (status != CUBLAS_STATUS_SUCCESS) return status;
    }
    return CUBLAS_STATUS_SUCCESS;
}

static inline cublasStatus_t cublasSetStream(cublasHandle_t, cudaStream_t) { return CUBLAS_STATUS_SUCCESS; }
static inline cublasStatus_t cublasSetMathMode(cublasHandle_t, cublasMath_t) { return CUBLAS_STATUS_SUCCESS; }

#endif
