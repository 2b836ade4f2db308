/* cuda_ops.cu — the CUDA device's layer, vector and AdamW functions (core/device/device.h's table), on the compute
 * stream: the kernels of kernels.cu and the GEMMs in cuBLAS. cuda_ops_install puts them in the table.
 *
 * Row-major through column-major cuBLAS. A row-major (r, c) matrix with row stride ld is, to cuBLAS, the
 * column-major (c, r) matrix with leading dimension ld: its transpose. So a row-major product C = op(A) op(B) is
 * computed as the column-major C^T = op(B)^T op(A)^T: swap the operands and keep each one's transposition as the
 * row-major formula writes it. Each call below gives the row-major formula and the cuBLAS dimensions (m, n, k of
 * the column-major C^T, which is (columns of C, rows of C)).
 *
 * Float32 GEMMs are exact fp32 (CUBLAS_DEFAULT_MATH) unless the device allows TF32 (ALLOW_TF32=1:
 * CUBLAS_TF32_TENSOR_OP_MATH, 10-bit mantissa products, the GPU check's bounds no longer hold). The backward
 * GEMMs add into the gradients (beta = 1), as core/kernels/layers.h's backward functions do.
 *
 * The bfloat16 layers' GEMMs (GEMM_BF16 below) read float32 buffers holding bfloat16 values: cublasGemmEx with
 * CUBLAS_COMPUTE_32F_FAST_16BF converts A and B to bfloat16 (exact: they already are) and runs the bfloat16 tensor
 * cores with float32 accumulation; C stays float32. Every A and B must therefore be rounded before the call (the
 * CUDA emulator aborts on one that is not); outputs are rounded after, by a kernel, where layers_bf16.h says.
 */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/cuda/cuda_device.h"
#include "core/cuda/kernels.cuh"

extern "C" {
#include "core/kernels/layers.h" /* rope_tables: computed on the host exactly as the CPU does */
}

static cuda_device_state *state_of(device *d) { return (cuda_device_state *)d->impl; }

/* A launcher's status, checked with the rank, the launcher's call text and the line. */
#define LAUNCH(s, call) CUDA_CHECK((s)->rank, (call))

static void ops_fatal(const cuda_device_state *s, const char *what) {
    fprintf(stderr, "rank %d: cuda device (GPU %d): %s\n", s->rank, s->ordinal, what);
    fflush(stderr);
    abort();
}

/* The reduction's result, copied to the host scratch after the kernels; the host waits for the stream. */
static kernels_result read_result(cuda_device_state *s) {
    CUDA_CHECK(s->rank, cudaMemcpyAsync(s->host_scratch, s->scratch, sizeof(kernels_result), cudaMemcpyDeviceToHost,
                                        s->compute));
    CUDA_CHECK(s->rank, cudaStreamSynchronize(s->compute));
    return *(const kernels_result *)s->host_scratch;
}

/* ---- layers ---- */

static void cuda_embedding_forward(device *d, float *out, const int *tokens, const float *weight, int N, int C) {
    cuda_device_state *s = state_of(d);
    LAUNCH(s, embedding_forward_launch(out, tokens, weight, N, C, s->compute));
}

static void cuda_embedding_backward(device *d, float *dweight, const float *dout, const int *tokens, int N, int C) {
    cuda_device_state *s = state_of(d);
    LAUNCH(s, embedding_backward_launch(dweight, dout, tokens, N, C, s->compute));
}

static void cuda_rmsnorm_forward(device *d, float *out, float *rstd, const float *inp, const float *weight, int N,
                                 int C, float eps) {
    cuda_device_state *s = state_of(d);
    LAUNCH(s, rmsnorm_forward_launch(out, rstd, inp, weight, N, C, eps, s->compute));
}

static void cuda_rmsnorm_backward(device *d, float *dinp, float *dweight, const float *dout, const float *inp,
                                  const float *weight, const float *rstd, int N, int C) {
    cuda_device_state *s = state_of(d);
    LAUNCH(s, rmsnorm_backward_launch(dinp, dweight, dout, inp, weight, rstd, N, C, s->compute));
}

/* out (N, OC) = inp (N, IC) @ weight^T + bias, weight (OC, IC).
 * cuBLAS: out^T (OC, N) = op_T(weight as (IC, OC)) @ inp^T (IC, N): m = OC, n = N, k = IC. */
static void cuda_linear_forward(device *d, float *out, const float *inp, const float *weight, const float *bias, int N,
                                int IC, int OC) {
    cuda_device_state *s = state_of(d);
    if (N <= 0 || OC <= 0) return;
    const float one = 1.0f, zero = 0.0f;
    if (bias != NULL) LAUNCH(s, bias_broadcast_launch(out, bias, N, OC, s->compute));
    CUBLAS_CHECK(s->rank, cublasSgemm(s->cublas, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC, &one, weight, IC, inp, IC,
                                      bias != NULL ? &one : &zero, out, OC));
}

/* dinp (N, IC) += dout (N, OC) @ weight (OC, IC):   cuBLAS dinp^T (IC, N) += weight^T (IC, OC) @ dout^T (OC, N),
 *                                                    m = IC, n = N, k = OC, both as stored (N, N).
 * dweight (OC, IC) += dout^T (OC, N) @ inp (N, IC): cuBLAS dweight^T (IC, OC) += inp^T (IC, N) @ dout (N, OC),
 *                                                    m = IC, n = OC, k = N; dout transposed (N, T).
 * dbias (OC) += column sums of dout (a kernel). */
static void cuda_linear_backward(device *d, float *dinp, float *dweight, float *dbias, const float *dout,
                                 const float *inp, const float *weight, int N, int IC, int OC) {
    cuda_device_state *s = state_of(d);
    if (N <= 0 || OC <= 0 || IC <= 0) return;
    const float one = 1.0f;
    if (dinp != NULL)
        CUBLAS_CHECK(s->rank, cublasSgemm(s->cublas, CUBLAS_OP_N, CUBLAS_OP_N, IC, N, OC, &one, weight, IC, dout, OC,
                                          &one, dinp, IC));
    CUBLAS_CHECK(s->rank, cublasSgemm(s->cublas, CUBLAS_OP_N, CUBLAS_OP_T, IC, OC, N, &one, inp, IC, dout, OC, &one,
                                      dweight, IC));
    if (dbias != NULL) LAUNCH(s, bias_backward_launch(dbias, dout, N, OC, s->compute));
}

/* The tables on the host by core/kernels/layers.c's rope_tables (the CPU's bits), then copied; the host waits, so the
 * staging buffer can go. Called once per model, not per step. */
static void cuda_rope_tables(device *d, float *cos_table, float *sin_table, int T, int D, float theta) {
    cuda_device_state *s = state_of(d);
    size_t count = (size_t)T * D;
    if (count == 0) return;
    float *host = (float *)malloc(2 * count * sizeof(float));
    if (host == NULL) ops_fatal(s, "rope_tables: out of host memory for the staging tables");
    rope_tables(host, host + count, T, D, theta);
    CUDA_CHECK(s->rank, cudaMemcpyAsync(cos_table, host, count * sizeof(float), cudaMemcpyHostToDevice, s->compute));
    CUDA_CHECK(s->rank,
               cudaMemcpyAsync(sin_table, host + count, count * sizeof(float), cudaMemcpyHostToDevice, s->compute));
    CUDA_CHECK(s->rank, cudaStreamSynchronize(s->compute));
    free(host);
}

static void cuda_rope_forward(device *d, float *x, const float *cos_table, const float *sin_table, int B, int T, int H,
                              int D) {
    cuda_device_state *s = state_of(d);
    LAUNCH(s, rope_launch(x, cos_table, sin_table, B, T, H, D, 1.0f, s->compute));
}

static void cuda_rope_backward(device *d, float *dx, const float *cos_table, const float *sin_table, int B, int T,
                               int H, int D) {
    cuda_device_state *s = state_of(d);
    LAUNCH(s, rope_launch(dx, cos_table, sin_table, B, T, H, D, -1.0f, s->compute));
}

/* Grouped-query attention, q (B, T, H, D), k and v (B, past + T, KVH, D), probs (B, H, T, keys).
 * Per (batch b, key/value head kv) one strided-batched GEMM covers the G = H / KVH query heads h = kv G + g of the
 * group: their Q blocks are D apart in each row (batch stride D, row stride H D), they share K and V (batch stride
 * 0), and their probs are consecutive (T, keys) blocks. Then one causal softmax over every row, then P V the same
 * way.
 *   scores_h (T, keys) = scale q_h (T, D) @ k^T:   cuBLAS scores^T (keys, T) = op_T(k as (D, keys)) @ q_h^T (D, T),
 *                                                   m = keys, n = T, k = D.
 *   out_h (T, D) = probs_h (T, keys) @ v (keys, D): cuBLAS out^T (D, T) = v^T (D, keys) @ probs^T (keys, T),
 *                                                   m = D, n = T, k = keys. */
static void cuda_attention_forward_at(device *d, float *out, float *probs, const float *q, const float *k,
                                      const float *v, int B, int T, int past, int H, int KVH, int D) {
    cuda_device_state *s = state_of(d);
    if (B <= 0 || T <= 0 || H <= 0) return;
    if (KVH <= 0 || H % KVH != 0) ops_fatal(s, "attention_forward_at: query heads not a multiple of key/value heads");
    int group = H / KVH, keys = past + T;
    long long q_stride = (long long)H * D, kv_stride = (long long)KVH * D;
    float scale = 1.0f / sqrtf((float)D);
    const float one = 1.0f, zero = 0.0f;
    for (int b = 0; b < B; b++) {
        for (int kv = 0; kv < KVH; kv++) {
            const float *q_group = q + (size_t)b * T * q_stride + (size_t)kv * group * D;
            const float *k_head = k + (size_t)b * keys * kv_stride + (size_t)kv * D;
            float *p_group = probs + ((size_t)b * H + (size_t)kv * group) * T * keys;
            CUBLAS_CHECK(s->rank, cublasSgemmStridedBatched(s->cublas, CUBLAS_OP_T, CUBLAS_OP_N, keys, T, D, &scale,
                                                            k_head, (int)kv_stride, 0, q_group, (int)q_stride, D, &zero,
                                                            p_group, keys, (long long)T * keys, group));
        }
    }
    LAUNCH(s, causal_softmax_launch(probs, B * H, T, past, s->compute));
    for (int b = 0; b < B; b++) {
        for (int kv = 0; kv < KVH; kv++) {
            const float *v_head = v + (size_t)b * keys * kv_stride + (size_t)kv * D;
            const float *p_group = probs + ((size_t)b * H + (size_t)kv * group) * T * keys;
            float *o_group = out + (size_t)b * T * q_stride + (size_t)kv * group * D;
            CUBLAS_CHECK(s->rank, cublasSgemmStridedBatched(
                                      s->cublas, CUBLAS_OP_N, CUBLAS_OP_N, D, T, keys, &one, v_head, (int)kv_stride, 0,
                                      p_group, keys, (long long)T * keys, &zero, o_group, (int)q_stride, D, group));
        }
    }
}

/* The backward, per (b, h) as the CPU does, because the workspace `scratch` holds one head's (T, T) dp:
 *   dv += p^T dout:      cuBLAS dv^T (D, T) += dout^T (D, T) @ p (p stored as p^T: T), m = D, n = T, k = T; (N, T)
 *   dp = dout v^T:       cuBLAS dp^T (T, T) = op_T(v^T as (D, T)) @ dout^T (D, T), m = T, n = T, k = D; (T, N)
 *   ds = p (dp - rowsum(p dp)) (a kernel, in place on scratch)
 *   dq += scale ds k:    cuBLAS dq^T (D, T) += k^T (D, T) @ ds^T (T, T), m = D, n = T, k = T; (N, N)
 *   dk += scale ds^T q:  cuBLAS dk^T (D, T) += q^T (D, T) @ op_T(ds^T), m = D, n = T, k = T; (N, T)
 * A (G, T, T) scratch would let the G heads of a group share each call, as the forward does. */
static void cuda_attention_backward(device *d, float *dq, float *dk, float *dv, float *scratch, const float *dout,
                                    const float *probs, const float *q, const float *k, const float *v, int B, int T,
                                    int H, int KVH, int D) {
    cuda_device_state *s = state_of(d);
    if (B <= 0 || T <= 0 || H <= 0) return;
    if (KVH <= 0 || H % KVH != 0) ops_fatal(s, "attention_backward: query heads not a multiple of key/value heads");
    int group = H / KVH;
    int q_stride = H * D, kv_stride = KVH * D;
    float scale = 1.0f / sqrtf((float)D);
    const float one = 1.0f, zero = 0.0f;
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < H; h++) {
            size_t q_offset = (size_t)b * T * q_stride + (size_t)h * D;
            size_t kv_offset = (size_t)b * T * kv_stride + (size_t)(h / group) * D;
            const float *p = probs + ((size_t)b * H + h) * T * T;
            float *dp = scratch;
            CUBLAS_CHECK(s->rank, cublasSgemm(s->cublas, CUBLAS_OP_N, CUBLAS_OP_T, D, T, T, &one, dout + q_offset,
                                              q_stride, p, T, &one, dv + kv_offset, kv_stride));
            CUBLAS_CHECK(s->rank, cublasSgemm(s->cublas, CUBLAS_OP_T, CUBLAS_OP_N, T, T, D, &one, v + kv_offset,
                                              kv_stride, dout + q_offset, q_stride, &zero, dp, T));
            LAUNCH(s, softmax_backward_launch(dp, p, T, s->compute));
            CUBLAS_CHECK(s->rank, cublasSgemm(s->cublas, CUBLAS_OP_N, CUBLAS_OP_N, D, T, T, &scale, k + kv_offset,
                                              kv_stride, dp, T, &one, dq + q_offset, q_stride));
            CUBLAS_CHECK(s->rank, cublasSgemm(s->cublas, CUBLAS_OP_N, CUBLAS_OP_T, D, T, T, &scale, q + q_offset,
                                              q_stride, dp, T, &one, dk + kv_offset, kv_stride));
        }
    }
}

/* ---- the layers in bfloat16 (core/kernels/layers_bf16.h; the CPU's are core/kernels/layers_bf16.c) ---- */

/* A GEMM of bfloat16 values (float32 buffers), float32 accumulation and output; checked, naming the rank and the call
 * as written at the call site. */
#define GEMM_BF16(s, transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc)                                  \
    CUBLAS_CHECK((s)->rank, cublasGemmEx((s)->cublas, transa, transb, m, n, k, alpha, A, CUDA_R_32F, lda, B,        \
                                         CUDA_R_32F, ldb, beta, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F_FAST_16BF,   \
                                         CUBLAS_GEMM_DEFAULT))
#define GEMM_BF16_BATCHED(s, transa, transb, m, n, k, alpha, A, lda, strideA, B, ldb, strideB, beta, C, ldc,         \
                          strideC, batch)                                                                            \
    CUBLAS_CHECK((s)->rank, cublasGemmStridedBatchedEx((s)->cublas, transa, transb, m, n, k, alpha, A, CUDA_R_32F,  \
                                                       lda, strideA, B, CUDA_R_32F, ldb, strideB, beta, C,          \
                                                       CUDA_R_32F, ldc, strideC, batch,                             \
                                                       CUBLAS_COMPUTE_32F_FAST_16BF, CUBLAS_GEMM_DEFAULT))

/* HF's scaling, head_dim ** -0.5 in double taken to float32 (layers_bf16.c's, not the float32 layer's sqrtf). */
static float attention_scale_bf16(int D) { return (float)(1.0 / sqrt((double)D)); }

/* out = bf16(inp @ weight^T + bias): cuda_linear_forward's GEMM (m = OC, n = N, k = IC) on the tensor cores, the
 * float32 sum (with the bias, broadcast first and added by beta = 1) rounded once. */
static void cuda_linear_forward_bf16(device *d, float *out, const float *inp, const float *weight, const float *bias,
                                     int N, int IC, int OC) {
    cuda_device_state *s = state_of(d);
    if (N <= 0 || OC <= 0) return;
    const float one = 1.0f, zero = 0.0f;
    if (bias != NULL) LAUNCH(s, bias_broadcast_launch(out, bias, N, OC, s->compute));
    GEMM_BF16(s, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC, &one, weight, IC, inp, IC, bias != NULL ? &one : &zero, out, OC);
    LAUNCH(s, round_to_bf16_launch(out, (size_t)N * OC, s->compute));
}

/* cuda_linear_backward's GEMMs on the tensor cores (dout, inp, weight are bfloat16 values):
 *   dinp (N, IC) = bf16(dinp + dout @ weight):  m = IC, n = N, k = OC, beta = 1, then rounded;
 *   dweight (OC, IC) += dout^T @ inp:            m = IC, n = OC, k = N, a float32 sum (rounded at the reduce);
 *   dbias (OC) += column sums of dout (the float32 kernel). */
static void cuda_linear_backward_bf16(device *d, float *dinp, float *dweight, float *dbias, const float *dout,
                                      const float *inp, const float *weight, int N, int IC, int OC) {
    cuda_device_state *s = state_of(d);
    if (N <= 0 || OC <= 0 || IC <= 0) return;
    const float one = 1.0f;
    if (dinp != NULL) {
        GEMM_BF16(s, CUBLAS_OP_N, CUBLAS_OP_N, IC, N, OC, &one, weight, IC, dout, OC, &one, dinp, IC);
        LAUNCH(s, round_to_bf16_launch(dinp, (size_t)N * IC, s->compute));
    }
    GEMM_BF16(s, CUBLAS_OP_N, CUBLAS_OP_T, IC, OC, N, &one, inp, IC, dout, OC, &one, dweight, IC);
    if (dbias != NULL) LAUNCH(s, bias_backward_launch(dbias, dout, N, OC, s->compute));
}

/* Two Linear modules' input gradients, weights stacked (2 OC, IC), dout (N, 2 OC) (layers_bf16.h):
 *   dinp (N, IC) = dout[:, :OC] @ weight[:OC]:      m = IC, n = N, k = OC, dout's row stride 2 OC;
 *   scratch (N, IC) = dout[:, OC:] @ weight[OC:]:   the same, from column OC and row OC;
 *   dinp = bf16(bf16(dinp) + bf16(scratch)) (a kernel). */
static void cuda_linear_backward_input_stacked_bf16(device *d, float *dinp, float *scratch, const float *dout,
                                                    const float *weight, int N, int IC, int OC) {
    cuda_device_state *s = state_of(d);
    if (N <= 0 || IC <= 0) return;
    const float one = 1.0f, zero = 0.0f;
    GEMM_BF16(s, CUBLAS_OP_N, CUBLAS_OP_N, IC, N, OC, &one, weight, IC, dout, 2 * OC, &zero, dinp, IC);
    GEMM_BF16(s, CUBLAS_OP_N, CUBLAS_OP_N, IC, N, OC, &one, weight + (size_t)OC * IC, IC, dout + OC, 2 * OC, &zero,
              scratch, IC);
    LAUNCH(s, add_rounded_bf16_launch(dinp, scratch, (size_t)N * IC, s->compute));
}

static void cuda_rmsnorm_forward_bf16(device *d, float *out, float *rstd, const float *inp, const float *weight, int N,
                                      int C, float eps) {
    cuda_device_state *s = state_of(d);
    LAUNCH(s, rmsnorm_forward_bf16_launch(out, rstd, inp, weight, N, C, eps, s->compute));
}

static void cuda_rmsnorm_backward_bf16(device *d, float *dinp, float *dweight, const float *dout, const float *inp,
                                       const float *weight, const float *rstd, int N, int C) {
    cuda_device_state *s = state_of(d);
    LAUNCH(s, rmsnorm_backward_bf16_launch(dinp, dweight, dout, inp, weight, rstd, N, C, s->compute));
}

static void cuda_rope_forward_bf16(device *d, float *x, const float *cos_table, const float *sin_table, int B, int T,
                                   int H, int D) {
    cuda_device_state *s = state_of(d);
    LAUNCH(s, rope_bf16_launch(x, cos_table, sin_table, B, T, H, D, 0, s->compute));
}

static void cuda_rope_backward_bf16(device *d, float *dx, const float *cos_table, const float *sin_table, int B, int T,
                                    int H, int D) {
    cuda_device_state *s = state_of(d);
    LAUNCH(s, rope_bf16_launch(dx, cos_table, sin_table, B, T, H, D, 1, s->compute));
}

/* HF's eager attention in bfloat16 (layers_bf16.h), q (B, T, H, D), k and v (B, keys, KVH, D), probs (B, H, T, keys):
 *   scores: per (b, kv group) one strided-batched GEMM as cuda_attention_forward_at's, alpha 1 (the scaling is its
 *           own rounded op): scores^T (keys, T) = op_T(k as (D, keys)) @ q_h^T (D, T), m = keys, n = T, k = D;
 *   then on all of probs bf16(bf16(s) * scale) (a kernel) and the float32 causal softmax (cuda's kernel), saved;
 *   per head (the scratch holds one head's (T, keys)): scratch = bf16(probs_h), and
 *           out_h (T, D) = scratch (T, keys) @ v (keys, D): out^T (D, T) = v^T (D, keys) @ scratch^T (keys, T),
 *           m = D, n = T, k = keys;
 *   then out rounded once, all heads (each head's block is written once, so rounding at the end is the CPU's
 *   per-head rounding). */
static void cuda_attention_forward_bf16(device *d, float *out, float *probs, float *scratch, const float *q,
                                        const float *k, const float *v, int B, int T, int past, int H, int KVH,
                                        int D) {
    cuda_device_state *s = state_of(d);
    if (B <= 0 || T <= 0 || H <= 0) return;
    if (KVH <= 0 || H % KVH != 0) ops_fatal(s, "attention_forward_bf16: query heads not a multiple of key/value heads");
    int group = H / KVH, keys = past + T;
    long long q_stride = (long long)H * D, kv_stride = (long long)KVH * D, block = (long long)T * keys;
    const float one = 1.0f, zero = 0.0f;
    for (int b = 0; b < B; b++) {
        for (int kv = 0; kv < KVH; kv++) {
            const float *q_group = q + (size_t)b * T * q_stride + (size_t)kv * group * D;
            const float *k_head = k + (size_t)b * keys * kv_stride + (size_t)kv * D;
            float *p_group = probs + ((size_t)b * H + (size_t)kv * group) * block;
            GEMM_BF16_BATCHED(s, CUBLAS_OP_T, CUBLAS_OP_N, keys, T, D, &one, k_head, (int)kv_stride, 0, q_group,
                              (int)q_stride, D, &zero, p_group, keys, block, group);
        }
    }
    LAUNCH(s, attention_scores_bf16_launch(probs, (size_t)B * H * block, attention_scale_bf16(D), s->compute));
    LAUNCH(s, causal_softmax_launch(probs, B * H, T, past, s->compute));
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < H; h++) {
            const float *v_head = v + (size_t)b * keys * kv_stride + (size_t)(h / group) * D;
            float *o_head = out + (size_t)b * T * q_stride + (size_t)h * D;
            LAUNCH(s, round_copy_bf16_launch(scratch, probs + ((size_t)b * H + h) * block, (size_t)block, s->compute));
            GEMM_BF16(s, CUBLAS_OP_N, CUBLAS_OP_N, D, T, keys, &one, v_head, (int)kv_stride, scratch, keys, &zero,
                      o_head, (int)q_stride);
        }
    }
    LAUNCH(s, round_to_bf16_launch(out, (size_t)B * T * q_stride, s->compute));
}

/* Its backward (past = 0), per (b, h) as layers_bf16.c: the scratch (2 T T + T D) holds one head's rounded probs,
 * its dp and a (T, D) term:
 *   rounded = bf16(probs_h) (a kernel);
 *   term = rounded^T dout_h: term^T (D, T) = dout_h^T (D, T) @ rounded (stored as rounded^T: T),
 *          m = D, n = T, k = T; then dv_kv += bf16(term) (a kernel: the group's heads summed in float32, in order);
 *   dp = dout_h v^T:        dp^T (T, T) = op_T(v^T as (D, T)) @ dout_h^T (D, T), m = T, n = T, k = D;
 *   ds = bf16(bf16(p (bf16(dp) - rowsum(p bf16(dp)))) * scale) (a kernel, in place on dp);
 *   dq_h = bf16(dq_h + ds k): dq^T (D, T) += k^T (D, T) @ ds^T (T, T), m = D, n = T, k = T, beta 1 (dq is zero:
 *          each head writes its own columns once, so all of dq is rounded once at the end);
 *   term = ds^T q_h:         term^T (D, T) = q_h^T (D, T) @ op_T(ds^T), m = D, n = T, k = T; dk_kv += bf16(term);
 * and finally dk, dv rounded once (repeat_kv's backward: the float32 sum over the group, rounded). */
static void cuda_attention_backward_bf16(device *d, float *dq, float *dk, float *dv, float *scratch, const float *dout,
                                         const float *probs, const float *q, const float *k, const float *v, int B,
                                         int T, int H, int KVH, int D) {
    cuda_device_state *s = state_of(d);
    if (B <= 0 || T <= 0 || H <= 0) return;
    if (KVH <= 0 || H % KVH != 0)
        ops_fatal(s, "attention_backward_bf16: query heads not a multiple of key/value heads");
    int group = H / KVH;
    int q_stride = H * D, kv_stride = KVH * D;
    size_t block = (size_t)T * T;
    float scale = attention_scale_bf16(D);
    float *rounded = scratch, *dp = scratch + block, *term = scratch + 2 * block;
    const float one = 1.0f, zero = 0.0f;
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < H; h++) {
            size_t q_offset = (size_t)b * T * q_stride + (size_t)h * D;
            size_t kv_offset = (size_t)b * T * kv_stride + (size_t)(h / group) * D;
            const float *p = probs + ((size_t)b * H + h) * block;
            LAUNCH(s, round_copy_bf16_launch(rounded, p, block, s->compute));
            GEMM_BF16(s, CUBLAS_OP_N, CUBLAS_OP_T, D, T, T, &one, dout + q_offset, q_stride, rounded, T, &zero, term,
                      D);
            LAUNCH(s, add_rounded_rows_launch(dv + kv_offset, (size_t)kv_stride, term, T, D, s->compute));
            GEMM_BF16(s, CUBLAS_OP_T, CUBLAS_OP_N, T, T, D, &one, v + kv_offset, kv_stride, dout + q_offset, q_stride,
                      &zero, dp, T);
            LAUNCH(s, softmax_backward_bf16_launch(dp, p, T, scale, s->compute));
            GEMM_BF16(s, CUBLAS_OP_N, CUBLAS_OP_N, D, T, T, &one, k + kv_offset, kv_stride, dp, T, &one, dq + q_offset,
                      q_stride);
            GEMM_BF16(s, CUBLAS_OP_N, CUBLAS_OP_T, D, T, T, &one, q + q_offset, q_stride, dp, T, &zero, term, D);
            LAUNCH(s, add_rounded_rows_launch(dk + kv_offset, (size_t)kv_stride, term, T, D, s->compute));
        }
    }
    size_t q_count = (size_t)B * T * q_stride, kv_count = (size_t)B * T * kv_stride;
    LAUNCH(s, round_to_bf16_launch(dq, q_count, s->compute));
    LAUNCH(s, round_to_bf16_launch(dk, kv_count, s->compute));
    LAUNCH(s, round_to_bf16_launch(dv, kv_count, s->compute));
}

static void cuda_swiglu_forward_bf16(device *d, float *out, const float *gate_up, int N, int width) {
    cuda_device_state *s = state_of(d);
    LAUNCH(s, swiglu_forward_bf16_launch(out, gate_up, N, width, s->compute));
}

static void cuda_swiglu_backward_bf16(device *d, float *dgate_up, const float *dout, const float *gate_up, int N,
                                      int width) {
    cuda_device_state *s = state_of(d);
    LAUNCH(s, swiglu_backward_bf16_launch(dgate_up, dout, gate_up, N, width, s->compute));
}

static void cuda_swiglu_forward(device *d, float *out, const float *gate_up, int N, int width) {
    cuda_device_state *s = state_of(d);
    LAUNCH(s, swiglu_forward_launch(out, gate_up, N, width, s->compute));
}

static void cuda_swiglu_backward(device *d, float *dgate_up, const float *dout, const float *gate_up, int N,
                                 int width) {
    cuda_device_state *s = state_of(d);
    LAUNCH(s, swiglu_backward_launch(dgate_up, dout, gate_up, N, width, s->compute));
}

static float cuda_cross_entropy_forward_backward(device *d, float *dlogits, const float *logits, const int *targets,
                                                 int N, int V, int ignore_index, int *count_out) {
    cuda_device_state *s = state_of(d);
    LAUNCH(s, cross_entropy_launch(dlogits, logits, targets, N, V, ignore_index, s->scratch, s->compute));
    kernels_result result = read_result(s);
    if (count_out != NULL) *count_out = result.count;
    return result.mean_loss;
}

/* ---- vectors ---- */

static void cuda_add_inplace(device *d, float *out, const float *inp, size_t count) {
    cuda_device_state *s = state_of(d);
    LAUNCH(s, add_inplace_launch(out, inp, count, s->compute));
}

/* out += inp widened to float32: a float32 input is add_inplace; a bfloat16 one its own kernel. */
static void cuda_accumulate(device *d, float *out, const void *inp, dtype type, size_t count) {
    cuda_device_state *s = state_of(d);
    if (type == DTYPE_FLOAT32) {
        LAUNCH(s, add_inplace_launch(out, (const float *)inp, count, s->compute));
    } else if (type == DTYPE_BFLOAT16) {
        LAUNCH(s, accumulate_bf16_launch(out, (const uint16_t *)inp, count, s->compute));
    } else {
        char what[128];
        snprintf(what, sizeof what, "accumulate: a %s input is not one this device adds (float32, bfloat16)",
                 dtype_name(type));
        ops_fatal(s, what);
    }
}

static void cuda_scale(device *d, float *x, float factor, size_t count) {
    cuda_device_state *s = state_of(d);
    LAUNCH(s, scale_launch(x, factor, count, s->compute));
}

static double cuda_sum_squares(device *d, const float *x, size_t count) {
    cuda_device_state *s = state_of(d);
    if (count == 0) return 0.0;
    LAUNCH(s, sum_launch(x, count, 1, s->scratch, s->compute));
    return read_result(s).value;
}

static double cuda_sum_abs(device *d, const float *x, size_t count) {
    cuda_device_state *s = state_of(d);
    if (count == 0) return 0.0;
    LAUNCH(s, sum_launch(x, count, 0, s->scratch, s->compute));
    return read_result(s).value;
}

static size_t cuda_first_nonfinite(device *d, const float *x, size_t count) {
    cuda_device_state *s = state_of(d);
    if (count == 0) return 0;
    LAUNCH(s, first_nonfinite_launch(x, count, s->scratch, s->compute));
    return (size_t)read_result(s).index;
}

/* Each array's reduction in a scratch region of its own (KERNELS_SCRATCH_BYTES apart), each result's index copied
 * into the pinned host scratch behind it, then one wait for the batch: as many arrays as the scratch has regions
 * (about 250) cost one host wait. */
static int cuda_first_nonfinite_of(device *d, const float *const *xs, const size_t *counts, int n) {
    cuda_device_state *s = state_of(d);
    const size_t region = (KERNELS_SCRATCH_BYTES + 255) / 256 * 256;
    const int per_batch = (int)(s->scratch_bytes / region);
    uint64_t *indices = (uint64_t *)s->host_scratch;
    if ((size_t)per_batch * sizeof(uint64_t) > s->scratch_bytes) ops_fatal(s, "first_nonfinite_of: scratch too small");
    for (int first = 0; first < n; first += per_batch) {
        int batch = n - first < per_batch ? n - first : per_batch;
        for (int i = 0; i < batch; i++) {
            void *scratch = (char *)s->scratch + (size_t)i * region;
            indices[i] = counts[first + i];
            if (counts[first + i] == 0) continue;
            LAUNCH(s, first_nonfinite_launch(xs[first + i], counts[first + i], scratch, s->compute));
            CUDA_CHECK(s->rank, cudaMemcpyAsync(&indices[i], (char *)scratch + offsetof(kernels_result, index),
                                                sizeof(uint64_t), cudaMemcpyDeviceToHost, s->compute));
        }
        CUDA_CHECK(s->rank, cudaStreamSynchronize(s->compute));
        for (int i = 0; i < batch; i++)
            if (indices[i] < counts[first + i]) return first + i;
    }
    return n;
}

/* dtype_convert on device memory: the same type is a device-to-device copy; float32 <-> bfloat16 the shared
 * rounding; any other pair is the caller's bug. */
static void cuda_convert(device *d, void *dst, dtype to, const void *src, dtype from, size_t count) {
    cuda_device_state *s = state_of(d);
    if (count == 0) return;
    if (to == from) {
        CUDA_CHECK(s->rank, cudaMemcpyAsync(dst, src, count * dtype_size(to), cudaMemcpyDeviceToDevice, s->compute));
    } else if (to == DTYPE_BFLOAT16 && from == DTYPE_FLOAT32) {
        LAUNCH(s, float_to_bf16_launch((uint16_t *)dst, (const float *)src, count, s->compute));
    } else if (to == DTYPE_FLOAT32 && from == DTYPE_BFLOAT16) {
        LAUNCH(s, bf16_to_float_launch((float *)dst, (const uint16_t *)src, count, s->compute));
    } else {
        char what[160];
        snprintf(what, sizeof what, "convert: %s to %s is not a conversion this device makes (float32 <-> bfloat16)",
                 dtype_name(from), dtype_name(to));
        ops_fatal(s, what);
    }
}

static void cuda_round_to(device *d, float *x, size_t count, dtype type) {
    cuda_device_state *s = state_of(d);
    if (type == DTYPE_BFLOAT16) LAUNCH(s, round_to_bf16_launch(x, count, s->compute));
}

static void cuda_adamw_update(device *d, float *param, const float *grad, float *exp_avg, float *exp_avg_sq,
                              size_t count, const adamw_kernel_scalars *scalars) {
    cuda_device_state *s = state_of(d);
    LAUNCH(s, adamw_launch(param, grad, exp_avg, exp_avg_sq, count, *scalars, s->compute));
}

void cuda_ops_install(device *d) {
    cuda_device_state *s = state_of(d);
    static_assert(sizeof(floatX) == sizeof(float), "the table passes float tensors: floatX must be float here");
    if (s->scratch == NULL || s->host_scratch == NULL || s->scratch_bytes < KERNELS_SCRATCH_BYTES) {
        char what[160];
        snprintf(what, sizeof what, "the reduction scratch holds %zu bytes, the kernels need %zu", s->scratch_bytes,
                 (size_t)KERNELS_SCRATCH_BYTES);
        ops_fatal(s, what);
    }
    /* cuBLAS on the compute stream; exact float32 unless TF32 is allowed. */
    CUBLAS_CHECK(s->rank, cublasSetStream(s->cublas, s->compute));
    CUBLAS_CHECK(s->rank,
                 cublasSetMathMode(s->cublas, s->allow_tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));

    d->embedding_forward = cuda_embedding_forward;
    d->embedding_backward = cuda_embedding_backward;
    d->rmsnorm_forward = cuda_rmsnorm_forward;
    d->rmsnorm_backward = cuda_rmsnorm_backward;
    d->linear_forward = cuda_linear_forward;
    d->linear_backward = cuda_linear_backward;
    d->rope_tables = cuda_rope_tables;
    d->rope_forward = cuda_rope_forward;
    d->rope_backward = cuda_rope_backward;
    d->attention_forward_at = cuda_attention_forward_at;
    d->attention_backward = cuda_attention_backward;
    d->swiglu_forward = cuda_swiglu_forward;
    d->swiglu_backward = cuda_swiglu_backward;
    d->cross_entropy_forward_backward = cuda_cross_entropy_forward_backward;
    d->add_inplace = cuda_add_inplace;
    d->accumulate = cuda_accumulate;
    d->scale = cuda_scale;
    d->sum_squares = cuda_sum_squares;
    d->sum_abs = cuda_sum_abs;
    d->first_nonfinite = cuda_first_nonfinite;
    d->first_nonfinite_of = cuda_first_nonfinite_of;
    d->convert = cuda_convert;
    d->round_to = cuda_round_to;
    d->adamw_update = cuda_adamw_update;
    d->linear_forward_bf16 = cuda_linear_forward_bf16;
    d->linear_backward_bf16 = cuda_linear_backward_bf16;
    d->rmsnorm_forward_bf16 = cuda_rmsnorm_forward_bf16;
    d->rmsnorm_backward_bf16 = cuda_rmsnorm_backward_bf16;
    d->rope_forward_bf16 = cuda_rope_forward_bf16;
    d->rope_backward_bf16 = cuda_rope_backward_bf16;
    d->attention_forward_bf16 = cuda_attention_forward_bf16;
    d->attention_backward_bf16 = cuda_attention_backward_bf16;
    d->swiglu_forward_bf16 = cuda_swiglu_forward_bf16;
    d->swiglu_backward_bf16 = cuda_swiglu_backward_bf16;
    d->linear_backward_input_stacked_bf16 = cuda_linear_backward_input_stacked_bf16;
}
