/* cublas_v2.h of the CUDA emulator (see cuda_runtime.h here): a handle, its stream and math mode, and the GEMMs
 * cuda_ops.cu calls as OpenBLAS's column-major cblas_sgemm, which has cuBLAS's exact meaning (column-major, op per
 * operand, alpha, beta, leading dimensions). The dimensions are checked as cuBLAS checks them
 * (CUBLAS_STATUS_INVALID_VALUE), the operands must lie in GPU memory (CUBLAS_STATUS_EXECUTION_FAILED otherwise: on a
 * GPU a host pointer faults), and the handle must be live (CUBLAS_STATUS_NOT_INITIALIZED). The math mode is
 * recorded, not applied: the GEMMs are float32 whatever it says.
 *
 * cublasGemmEx / cublasGemmStridedBatchedEx: float32 operands (CUDA_R_32F) under compute type CUBLAS_COMPUTE_32F or
 * CUBLAS_COMPUTE_32F_FAST_16BF, or bfloat16 storage (A and B CUDA_R_16BF, C CUDA_R_16BF or CUDA_R_32F) under
 * CUBLAS_COMPUTE_32F (the products summed in float32, a bfloat16 C rounded to nearest even), algorithm
 * CUBLAS_GEMM_DEFAULT; anything else (mixed A and B types, FAST_TF32, ...) is CUBLAS_STATUS_NOT_SUPPORTED. Under
 * FAST_16BF a GPU converts A and B to bfloat16 for its tensor cores (accumulating in float32): exact only when every
 * element already is a bfloat16 value. The emulator computes in float32 (sgemm) and instead checks that premise:
 * every element of A and B the call reads (through lda / ldb, the transpositions, the strides and the batch) must
 * have its low 16 bits zero, or the emulator aborts naming the call, the operand, the element and its value. So a
 * bfloat16 GEMM whose input was not rounded is caught here rather than as a tiny difference on the GPU.
 * Names and values are the real headers' (cublas_api.h, library_types.h). Implemented in runtime.cpp. */
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
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
} cublasStatus_t;
typedef enum { CUBLAS_OP_N, CUBLAS_OP_T } cublasOperation_t;
typedef enum { CUBLAS_DEFAULT_MATH, CUBLAS_TF32_TENSOR_OP_MATH } cublasMath_t;
/* library_types.h's element types (the ones a GEMM here may name; CUDA_R_16F is not computed). */
typedef enum cudaDataType_t { CUDA_R_32F = 0, CUDA_R_16F = 2, CUDA_R_16BF = 14 } cudaDataType;
typedef enum cudaDataType_t cudaDataType_t;
/* cublas_api.h's compute types (only the two float32 ones are computed) and the default algorithm. */
typedef enum {
    CUBLAS_COMPUTE_16F = 64,
    CUBLAS_COMPUTE_32F = 68,
    CUBLAS_COMPUTE_32F_PEDANTIC = 69,
    CUBLAS_COMPUTE_32F_FAST_16F = 74,
    CUBLAS_COMPUTE_32F_FAST_16BF = 75,
    CUBLAS_COMPUTE_32F_FAST_TF32 = 77,
} cublasComputeType_t;
typedef enum { CUBLAS_GEMM_DEFAULT = -1 } cublasGemmAlgo_t;

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
cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                            int k, const void *alpha, const void *A, cudaDataType Atype, int lda, const void *B,
                            cudaDataType Btype, int ldb, const void *beta, void *C, cudaDataType Ctype, int ldc,
                            cublasComputeType_t computeType, cublasGemmAlgo_t algo);
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                          int m, int n, int k, const void *alpha, const void *A, cudaDataType Atype,
                                          int lda, long long strideA, const void *B, cudaDataType Btype, int ldb,
                                          long long strideB, const void *beta, void *C, cudaDataType Ctype, int ldc,
                                          long long strideC, int batchCount, cublasComputeType_t computeType,
                                          cublasGemmAlgo_t algo);

#ifdef __cplusplus
}
#endif

#endif
