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

/* A launcher's status, checked with the rank, the launcher's call text and the line; timed under PROFILE_KERNELS as
 * the launcher's name (core/cuda/kernel_profile.h). */
#define LAUNCH(s, call) CUDA_TIMED(s, #call, 0, 0, 0, CUDA_CHECK((s)->rank, (call)))
/* A cuBLAS GEMM, checked likewise; timed as `name` m x n x k. */
#define GEMM(s, name, m, n, k, call) CUDA_TIMED(s, name, m, n, k, CUBLAS_CHECK((s)->rank, call))

static void ops_fatal(const cuda_device_state *s, const char *what) {
    fprintf(stderr, "rank %d: cuda device (GPU %d): %s\n", s->rank, s->ordinal, what);
    fflush(stderr);
    abort();
}

/* The reduction's result, copied to the host scratch after the kernels; the host waits for the stream. */
static kernels_result read_result(cuda_device_state *s) {
    CUDA_TIMED(s, "cudaMemcpyAsync device to host", 0, 0, 0,
               CUDA_CHECK(s->rank, cudaMemcpyAsync(s->host_scratch, s->scratch, sizeof(kernels_result),
                                                   cudaMemcpyDeviceToHost, s->compute)));
    cuda_compute_wait(s, "the wait for a reduction's result");
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

static void cuda_residual_rmsnorm_forward(device *d, float *residual, float *out, float *rstd, const float *inp,
                                          const float *weight, int N, int C, float eps) {
    cuda_device_state *s = state_of(d);
    LAUNCH(s, residual_rmsnorm_forward_launch(residual, out, rstd, inp, weight, N, C, eps, 0, s->compute));
}

static void cuda_rmsnorm_backward(device *d, float *dinp, const float *dresidual, float *dweight, const float *dout,
                                  const float *inp, const float *weight, const float *rstd, int N, int C) {
    cuda_device_state *s = state_of(d);
    LAUNCH(s, rmsnorm_backward_launch(dinp, dresidual, dweight, dout, inp, weight, rstd, N, C, s->compute));
}

/* out (N, OC) = inp (N, IC) @ weight^T + bias, weight (OC, IC).
 * cuBLAS: out^T (OC, N) = op_T(weight as (IC, OC)) @ inp^T (IC, N): m = OC, n = N, k = IC. */
static void cuda_linear_forward(device *d, float *out, const float *inp, const float *weight, const float *bias, int N,
                                int IC, int OC) {
    cuda_device_state *s = state_of(d);
    if (N <= 0 || OC <= 0) return;
    const float one = 1.0f, zero = 0.0f;
    if (bias != NULL) LAUNCH(s, bias_broadcast_launch(out, bias, N, OC, s->compute));
    GEMM(s, "cublasSgemm", OC, N, IC,
         cublasSgemm(s->cublas, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC, &one, weight, IC, inp, IC,
                     bias != NULL ? &one : &zero, out, OC));
}

/* dinp (N, IC) = dout (N, OC) @ weight (OC, IC):    cuBLAS dinp^T (IC, N) = weight^T (IC, OC) @ dout^T (OC, N),
 *                                                    m = IC, n = N, k = OC, both as stored (N, N); beta = 0.
 * dweight (OC, IC) += dout^T (OC, N) @ inp (N, IC): cuBLAS dweight^T (IC, OC) += inp^T (IC, N) @ dout (N, OC),
 *                                                    m = IC, n = OC, k = N; dout transposed (N, T).
 * dbias (OC) += column sums of dout (a kernel). */
static void cuda_linear_backward(device *d, float *dinp, float *dweight, float *dbias, const float *dout,
                                 const float *inp, const float *weight, int N, int IC, int OC) {
    cuda_device_state *s = state_of(d);
    if (N <= 0 || OC <= 0 || IC <= 0) return;
    const float one = 1.0f, zero = 0.0f;
    if (dinp != NULL)
        GEMM(s, "cublasSgemm", IC, N, OC,
             cublasSgemm(s->cublas, CUBLAS_OP_N, CUBLAS_OP_N, IC, N, OC, &one, weight, IC, dout, OC, &zero, dinp, IC));
    GEMM(s, "cublasSgemm", IC, OC, N,
         cublasSgemm(s->cublas, CUBLAS_OP_N, CUBLAS_OP_T, IC, OC, N, &one, inp, IC, dout, OC, &one, dweight, IC));
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
    cuda_compute_wait(s, "the wait for the RoPE tables' copy");
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

/* The attention's batched GEMMs need every head's block at a fixed stride from the last one's, which the projections'
 * (B, T, heads, D) layout does not give (a head's rows are H D apart, and the next batch's block does not follow the
 * last head's). So the attention transposes q, k, v (and in backward dout) to (B, heads, T, D) in its scratch
 * (core/device/device.h's sizes), runs each product as ONE strided-batched GEMM over every (batch, head) pair, and
 * transposes the results back. Grouped-query attention then falls out of the layout: the G = H / KVH query heads of
 * key/value head kv are consecutive (T, D) blocks, one (G T, D) matrix against that head's keys, so the products with
 * k or v batch over the B KVH pairs (b, kv) with G T rows each, and the products that make dk or dv terms batch over
 * the B H heads into a (B, H, T, D) block that one kernel (group_sum) sums into each key/value head in head order:
 * no two GEMM outputs point at one gradient. Launches per call: forward 7 (float32) or 9 (bfloat16), backward 12
 * or 13, whatever B and H (before: per (b, kv) or (b, h) loops, 2 B KVH + 1 forward, 5 B H backward in float32).
 *
 * Every output element is still one dot of D or of T (past + T) products, as the CPU's per-head GEMMs compute it; the
 * group's heads are added into dk / dv one at a time, t_0 + t_1 + ..., as the CPU's GEMMs add them (beta = 0 for a
 * group's first head, 1 after).
 *
 * With QB (B, heads, T, D) blocks and the row-major/column-major rule at the top, for batch index i:
 *   scores_i (G T, keys) = Q_i (G T, D) @ K_i^T:  scores^T = op_T(K_i as (D, keys)) @ Q_i^T (D, G T),
 *                                                  m = keys, n = G T, k = D; i over B KVH.
 *   out_i (G T, D) = P_i (G T, keys) @ V_i:        out^T (D, G T) = V_i^T (D, keys) @ P_i^T (keys, G T),
 *                                                  m = D, n = G T, k = keys; i over B KVH. */
static void check_heads(cuda_device_state *s, const char *what, int H, int KVH) {
    if (KVH > 0 && H % KVH == 0) return;
    char message[160];
    snprintf(message, sizeof message, "%s: %d query heads are not a multiple of %d key/value heads", what, H, KVH);
    ops_fatal(s, message);
}

/* q and k into the scratch's (B, heads, T, D) blocks: q at the start (later the output's), k after it (then v, for
 * the forward). The backward's scratch starts the same way (attention_backward_layouts). */
static void attention_qk_layouts(cuda_device_state *s, float *scratch, const float *q, const float *k, int B, int T,
                                 int keys, int H, int KVH, int D, float **qt, float **kt) {
    *qt = scratch;
    *kt = *qt + (size_t)B * T * H * D;
    LAUNCH(s, heads_layout_launch(*qt, q, B, T, H, D, HEADS_TO_MAJOR, s->compute));
    LAUNCH(s, heads_layout_launch(*kt, k, B, keys, KVH, D, HEADS_TO_MAJOR, s->compute));
}

static float *attention_v_layout(cuda_device_state *s, float *kt, const float *v, int B, int keys, int KVH, int D) {
    float *vt = kt + (size_t)B * keys * KVH * D;
    LAUNCH(s, heads_layout_launch(vt, v, B, keys, KVH, D, HEADS_TO_MAJOR, s->compute));
    return vt;
}

/* probs (B, H, T, keys) from the laid-out q and k: scores (the scaling as the GEMM's alpha), the causal softmax.
 * The forward's and the backward's recompute (cuda_attention_probs): the same calls, the same values. */
static void attention_probs_batched(cuda_device_state *s, float *probs, const float *qt, const float *kt, int B, int T,
                                    int past, int H, int KVH, int D) {
    int rows = H / KVH * T, keys = past + T;
    float scale = 1.0f / sqrtf((float)D);
    const float zero = 0.0f;
    long long kv_block = (long long)keys * D, q_block = (long long)rows * D, p_block = (long long)rows * keys;
    GEMM(s, "cublasSgemmStridedBatched", keys, rows, D,
         cublasSgemmStridedBatched(s->cublas, CUBLAS_OP_T, CUBLAS_OP_N, keys, rows, D, &scale, kt, D, kv_block, qt, D,
                                   q_block, &zero, probs, keys, p_block, B * KVH));
    LAUNCH(s, causal_softmax_launch(probs, B * H, T, past, s->compute));
}

static void cuda_attention_forward_at(device *d, float *out, float *probs, float *scratch, const float *q,
                                      const float *k, const float *v, int B, int T, int past, int H, int KVH, int D) {
    cuda_device_state *s = state_of(d);
    if (B <= 0 || T <= 0 || H <= 0) return;
    check_heads(s, "attention_forward_at", H, KVH);
    int group = H / KVH, keys = past + T, rows = group * T;
    const float one = 1.0f, zero = 0.0f;
    float *qt, *kt;
    attention_qk_layouts(s, scratch, q, k, B, T, keys, H, KVH, D, &qt, &kt);
    float *vt = attention_v_layout(s, kt, v, B, keys, KVH, D);
    long long kv_block = (long long)keys * D, q_block = (long long)rows * D, p_block = (long long)rows * keys;
    attention_probs_batched(s, probs, qt, kt, B, T, past, H, KVH, D);
    float *out_t = qt; /* q's block is read: it holds the output now */
    GEMM(s, "cublasSgemmStridedBatched", D, rows, keys,
         cublasSgemmStridedBatched(s->cublas, CUBLAS_OP_N, CUBLAS_OP_N, D, rows, keys, &one, vt, D, kv_block, probs,
                                   keys, p_block, &zero, out_t, D, q_block, B * KVH));
    LAUNCH(s, heads_layout_launch(out, out_t, B, T, H, D, HEADS_FROM_MAJOR, s->compute));
}

/* The backward's scratch: q, k, v, dout in (B, heads, T, D) (dout's block holds dq's after its last read), one
 * (B, H, T, D) block of dk or dv terms, dp (B, H, T, T). */
typedef struct attention_backward_scratch {
    float *qt, *kt, *vt, *dout_t, *terms, *dp;
} attention_backward_scratch;

static attention_backward_scratch attention_backward_layouts(cuda_device_state *s, float *scratch, const float *dout,
                                                             const float *q, const float *k, const float *v, int B,
                                                             int T, int H, int KVH, int D) {
    size_t queries = (size_t)B * T * H * D, key_values = (size_t)B * T * KVH * D;
    attention_backward_scratch w;
    w.qt = scratch;
    w.kt = w.qt + queries;
    w.vt = w.kt + key_values;
    w.dout_t = w.vt + key_values;
    w.terms = w.dout_t + queries;
    w.dp = w.terms + queries;
    LAUNCH(s, heads_layout_launch(w.qt, q, B, T, H, D, HEADS_TO_MAJOR, s->compute));
    LAUNCH(s, heads_layout_launch(w.kt, k, B, T, KVH, D, HEADS_TO_MAJOR, s->compute));
    LAUNCH(s, heads_layout_launch(w.vt, v, B, T, KVH, D, HEADS_TO_MAJOR, s->compute));
    LAUNCH(s, heads_layout_launch(w.dout_t, dout, B, T, H, D, HEADS_TO_MAJOR, s->compute));
    return w;
}

/* The backward (past = 0), in the (B, heads, T, D) blocks; i over the B H heads or the B KVH groups as marked:
 *   dv terms_h (T, D) = p_h^T dout_h:    terms^T (D, T) = dout_h^T (D, T) @ op_T(p_h stored as p_h^T),
 *                                         m = D, n = T, k = T; over B H; then dv = the group's terms' sum (group_sum);
 *   dp_i (G T, T) = dout_i v_i^T:         dp^T (T, G T) = op_T(v_i as (D, T)) @ dout_i^T (D, G T),
 *                                         m = T, n = G T, k = D; over B KVH;
 *   ds = p (dp - rowsum(p dp)) (a kernel over all B H T rows, in place);
 *   dq_i (G T, D) = scale ds_i k_i:       dq^T (D, G T) = k_i^T (D, T) @ ds_i^T (T, G T), m = D, n = G T, k = T;
 *                                         over B KVH, into dout's block; then dq = it, transposed back;
 *   dk terms_h (T, D) = scale ds_h^T q_h: terms^T (D, T) = q_h^T (D, T) @ op_T(ds_h stored as ds_h^T),
 *                                         m = D, n = T, k = T; over B H; then dk = the group's terms' sum. */
static void cuda_attention_backward(device *d, float *dq, float *dk, float *dv, float *scratch, const float *dout,
                                    const float *probs, const float *q, const float *k, const float *v, int B, int T,
                                    int H, int KVH, int D) {
    cuda_device_state *s = state_of(d);
    if (B <= 0 || T <= 0 || H <= 0) return;
    check_heads(s, "attention_backward", H, KVH);
    int group = H / KVH, rows = group * T;
    float scale = 1.0f / sqrtf((float)D);
    const float one = 1.0f, zero = 0.0f;
    attention_backward_scratch w = attention_backward_layouts(s, scratch, dout, q, k, v, B, T, H, KVH, D);
    long long head = (long long)T * D, square = (long long)T * T, kv_block = head;
    long long q_block = (long long)rows * D, p_block = (long long)rows * T;
    GEMM(s, "cublasSgemmStridedBatched", D, T, T,
         cublasSgemmStridedBatched(s->cublas, CUBLAS_OP_N, CUBLAS_OP_T, D, T, T, &one, w.dout_t, D, head, probs, T,
                                   square, &zero, w.terms, D, head, B * H));
    LAUNCH(s, group_sum_launch(dv, w.terms, B, T, KVH, group, D, 0, s->compute));
    GEMM(s, "cublasSgemmStridedBatched", T, rows, D,
         cublasSgemmStridedBatched(s->cublas, CUBLAS_OP_T, CUBLAS_OP_N, T, rows, D, &one, w.vt, D, kv_block, w.dout_t,
                                   D, q_block, &zero, w.dp, T, p_block, B * KVH));
    LAUNCH(s, softmax_backward_launch(w.dp, probs, B * H, T, s->compute));
    float *dq_t = w.dout_t; /* dout's block is read: it holds dq's terms now */
    GEMM(s, "cublasSgemmStridedBatched", D, rows, T,
         cublasSgemmStridedBatched(s->cublas, CUBLAS_OP_N, CUBLAS_OP_N, D, rows, T, &scale, w.kt, D, kv_block, w.dp, T,
                                   p_block, &zero, dq_t, D, q_block, B * KVH));
    LAUNCH(s, heads_layout_launch(dq, dq_t, B, T, H, D, HEADS_FROM_MAJOR, s->compute));
    GEMM(s, "cublasSgemmStridedBatched", D, T, T,
         cublasSgemmStridedBatched(s->cublas, CUBLAS_OP_N, CUBLAS_OP_T, D, T, T, &scale, w.qt, D, head, w.dp, T,
                                   square, &zero, w.terms, D, head, B * H));
    LAUNCH(s, group_sum_launch(dk, w.terms, B, T, KVH, group, D, 0, s->compute));
}

/* ---- the layers in bfloat16 (core/kernels/layers_bf16.h; the CPU's are core/kernels/layers_bf16.c) ---- */

/* A GEMM of bfloat16 values (float32 buffers), float32 accumulation and output; checked, naming the rank and the call
 * as written at the call site, and timed like GEMM. */
#define GEMM_BF16(s, transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc)                                  \
    GEMM(s, "cublasGemmEx FAST_16BF", m, n, k,                                                                     \
         cublasGemmEx((s)->cublas, transa, transb, m, n, k, alpha, A, CUDA_R_32F, lda, B, CUDA_R_32F, ldb, beta, C, \
                      CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F_FAST_16BF, CUBLAS_GEMM_DEFAULT))
#define GEMM_BF16_BATCHED(s, transa, transb, m, n, k, alpha, A, lda, strideA, B, ldb, strideB, beta, C, ldc,         \
                          strideC, batch)                                                                            \
    GEMM(s, "cublasGemmStridedBatchedEx FAST_16BF", m, n, k,                                                       \
         cublasGemmStridedBatchedEx((s)->cublas, transa, transb, m, n, k, alpha, A, CUDA_R_32F, lda, strideA, B,    \
                                    CUDA_R_32F, ldb, strideB, beta, C, CUDA_R_32F, ldc, strideC, batch,             \
                                    CUBLAS_COMPUTE_32F_FAST_16BF, CUBLAS_GEMM_DEFAULT))

/* HF's scaling, head_dim ** -0.5 in double taken to float32 (layers_bf16.c's, not the float32 layer's sqrtf). */
static float attention_scale_bf16(int D) { return (float)(1.0 / sqrt((double)D)); }

/* cuda_linear_forward's GEMM (m = OC, n = N, k = IC) on the tensor cores with beta = 0, nothing after it: the
 * float32 sums, rounded by their reader (or by cuda_linear_forward_bf16 below). */
static void cuda_linear_forward_bf16_sums(device *d, float *out, const float *inp, const float *weight, int N, int IC,
                                          int OC) {
    cuda_device_state *s = state_of(d);
    if (N <= 0 || OC <= 0) return;
    const float one = 1.0f, zero = 0.0f;
    GEMM_BF16(s, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC, &one, weight, IC, inp, IC, &zero, out, OC);
}

/* out = bf16(inp @ weight^T + bias): cuda_linear_forward's GEMM (m = OC, n = N, k = IC) on the tensor cores with
 * beta = 0, then one pass that adds the bias to the float32 sum and rounds once (bias_add_bf16; without a bias, the
 * rounding alone): the float32 value acc + bias that beta = 1 over a broadcast bias gave, one launch fewer. */
static void cuda_linear_forward_bf16(device *d, float *out, const float *inp, const float *weight, const float *bias,
                                     int N, int IC, int OC) {
    cuda_device_state *s = state_of(d);
    if (N <= 0 || OC <= 0) return;
    cuda_linear_forward_bf16_sums(d, out, inp, weight, N, IC, OC);
    if (bias != NULL) LAUNCH(s, bias_add_bf16_launch(out, bias, N, OC, s->compute));
    else LAUNCH(s, round_to_bf16_launch(out, (size_t)N * OC, s->compute));
}

/* cuda_linear_backward's GEMMs on the tensor cores (dout, inp, weight are bfloat16 values):
 *   dinp (N, IC) = bf16(dout @ weight):         m = IC, n = N, k = OC, beta = 0, then rounded;
 *   dweight (OC, IC) += dout^T @ inp:            m = IC, n = OC, k = N, a float32 sum (rounded at the reduce);
 *   dbias (OC) += column sums of dout (the float32 kernel). */
static void cuda_linear_backward_bf16(device *d, float *dinp, float *dweight, float *dbias, const float *dout,
                                      const float *inp, const float *weight, int N, int IC, int OC) {
    cuda_device_state *s = state_of(d);
    if (N <= 0 || OC <= 0 || IC <= 0) return;
    const float one = 1.0f, zero = 0.0f;
    if (dinp != NULL) {
        GEMM_BF16(s, CUBLAS_OP_N, CUBLAS_OP_N, IC, N, OC, &one, weight, IC, dout, OC, &zero, dinp, IC);
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

static void cuda_residual_rmsnorm_forward_bf16(device *d, float *residual, float *out, float *rstd, const float *inp,
                                               const float *weight, int N, int C, float eps) {
    cuda_device_state *s = state_of(d);
    LAUNCH(s, residual_rmsnorm_forward_launch(residual, out, rstd, inp, weight, N, C, eps, 1, s->compute));
}

static void cuda_rmsnorm_backward_bf16(device *d, float *dinp, const float *dresidual, float *dweight,
                                       const float *dout, const float *inp, const float *weight, const float *rstd,
                                       int N, int C) {
    cuda_device_state *s = state_of(d);
    LAUNCH(s, rmsnorm_backward_bf16_launch(dinp, dresidual, dweight, dout, inp, weight, rstd, N, C, s->compute));
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

/* The bfloat16 attention's probs from the laid-out q and k: scores (alpha 1: the scaling is its own rounded op), then
 * bf16(bf16(s) * scale) (a kernel) and the float32 causal softmax. The forward's and the recompute's. */
static void attention_probs_batched_bf16(cuda_device_state *s, float *probs, const float *qt, const float *kt, int B,
                                         int T, int past, int H, int KVH, int D) {
    int rows = H / KVH * T, keys = past + T;
    const float one = 1.0f, zero = 0.0f;
    long long kv_block = (long long)keys * D, q_block = (long long)rows * D, p_block = (long long)rows * keys;
    GEMM_BF16_BATCHED(s, CUBLAS_OP_T, CUBLAS_OP_N, keys, rows, D, &one, kt, D, kv_block, qt, D, q_block, &zero, probs,
                      keys, p_block, B * KVH);
    LAUNCH(s, attention_scores_bf16_launch(probs, (size_t)B * H * T * keys, attention_scale_bf16(D), s->compute));
    LAUNCH(s, causal_softmax_launch(probs, B * H, T, past, s->compute));
}

/* The backward's recompute of the probs (past = 0): q and k laid out at the start of its scratch, as the backward
 * lays them out after, then the forward's own calls. */
static void attention_probs_again(device *d, const char *what, float *probs, float *scratch, const float *q,
                                  const float *k, int B, int T, int H, int KVH, int D, int bf16) {
    cuda_device_state *s = state_of(d);
    if (B <= 0 || T <= 0 || H <= 0) return;
    check_heads(s, what, H, KVH);
    float *qt, *kt;
    attention_qk_layouts(s, scratch, q, k, B, T, T, H, KVH, D, &qt, &kt);
    if (bf16) attention_probs_batched_bf16(s, probs, qt, kt, B, T, 0, H, KVH, D);
    else attention_probs_batched(s, probs, qt, kt, B, T, 0, H, KVH, D);
}

static void cuda_attention_probs(device *d, float *probs, float *scratch, const float *q, const float *k, int B, int T,
                                 int H, int KVH, int D) {
    attention_probs_again(d, "attention_probs", probs, scratch, q, k, B, T, H, KVH, D, 0);
}

static void cuda_attention_probs_bf16(device *d, float *probs, float *scratch, const float *q, const float *k, int B,
                                      int T, int H, int KVH, int D) {
    attention_probs_again(d, "attention_probs_bf16", probs, scratch, q, k, B, T, H, KVH, D, 1);
}

/* HF's eager attention in bfloat16 (layers_bf16.h), the float32 attention's batched GEMMs and layouts (above):
 *   probs: attention_probs_batched_bf16 (the scores, their scaling, the float32 causal softmax; what the backward
 *          makes again);
 *   rounded = bf16(probs) into the scratch (after k and v), and out = rounded @ v as above;
 *   then out transposed back and rounded in the same pass (HEADS_FROM_MAJOR_BF16: each element is written once,
 *   so rounding at the end is the CPU's per-head rounding). */
static void cuda_attention_forward_bf16(device *d, float *out, float *probs, float *scratch, const float *q,
                                        const float *k, const float *v, int B, int T, int past, int H, int KVH,
                                        int D) {
    cuda_device_state *s = state_of(d);
    if (B <= 0 || T <= 0 || H <= 0) return;
    check_heads(s, "attention_forward_bf16", H, KVH);
    int group = H / KVH, keys = past + T, rows = group * T;
    const float one = 1.0f, zero = 0.0f;
    float *qt, *kt;
    attention_qk_layouts(s, scratch, q, k, B, T, keys, H, KVH, D, &qt, &kt);
    float *vt = attention_v_layout(s, kt, v, B, keys, KVH, D);
    float *rounded = vt + (size_t)B * keys * KVH * D;
    long long kv_block = (long long)keys * D, q_block = (long long)rows * D, p_block = (long long)rows * keys;
    size_t p_count = (size_t)B * H * T * keys;
    attention_probs_batched_bf16(s, probs, qt, kt, B, T, past, H, KVH, D);
    LAUNCH(s, round_copy_bf16_launch(rounded, probs, p_count, s->compute));
    float *out_t = qt;
    GEMM_BF16_BATCHED(s, CUBLAS_OP_N, CUBLAS_OP_N, D, rows, keys, &one, vt, D, kv_block, rounded, keys, p_block,
                      &zero, out_t, D, q_block, B * KVH);
    LAUNCH(s, heads_layout_launch(out, out_t, B, T, H, D, HEADS_FROM_MAJOR_BF16, s->compute));
}

/* Its backward (past = 0), layers_bf16.c's steps on the float32 backward's batched GEMMs (alpha 1 throughout):
 *   rounded = bf16(probs) into dp's block (dp is not made yet);
 *   dv terms = rounded^T dout per head; dv = bf16(the float32 sum of bf16(term) over the group's heads, in head
 *     order) (group_sum with rounding: repeat_kv's backward, rounded once);
 *   dp = dout v^T per group, over the rounded probs' block;
 *   ds = bf16(bf16(p (bf16(dp) - rowsum(p bf16(dp)))) * scale) (a kernel over all rows, in place);
 *   dq = bf16(ds k) per group into dout's block, rounded as it is moved back (HEADS_FROM_MAJOR_BF16);
 *   dk terms = ds^T q per head; dk as dv. */
static void cuda_attention_backward_bf16(device *d, float *dq, float *dk, float *dv, float *scratch, const float *dout,
                                         const float *probs, const float *q, const float *k, const float *v, int B,
                                         int T, int H, int KVH, int D) {
    cuda_device_state *s = state_of(d);
    if (B <= 0 || T <= 0 || H <= 0) return;
    check_heads(s, "attention_backward_bf16", H, KVH);
    int group = H / KVH, rows = group * T;
    const float one = 1.0f, zero = 0.0f;
    attention_backward_scratch w = attention_backward_layouts(s, scratch, dout, q, k, v, B, T, H, KVH, D);
    long long head = (long long)T * D, square = (long long)T * T, kv_block = head;
    long long q_block = (long long)rows * D, p_block = (long long)rows * T;
    float *rounded = w.dp;
    LAUNCH(s, round_copy_bf16_launch(rounded, probs, (size_t)B * H * square, s->compute));
    GEMM_BF16_BATCHED(s, CUBLAS_OP_N, CUBLAS_OP_T, D, T, T, &one, w.dout_t, D, head, rounded, T, square, &zero,
                      w.terms, D, head, B * H);
    LAUNCH(s, group_sum_launch(dv, w.terms, B, T, KVH, group, D, 1, s->compute));
    GEMM_BF16_BATCHED(s, CUBLAS_OP_T, CUBLAS_OP_N, T, rows, D, &one, w.vt, D, kv_block, w.dout_t, D, q_block, &zero,
                      w.dp, T, p_block, B * KVH);
    LAUNCH(s, softmax_backward_bf16_launch(w.dp, probs, B * H, T, attention_scale_bf16(D), s->compute));
    float *dq_t = w.dout_t;
    GEMM_BF16_BATCHED(s, CUBLAS_OP_N, CUBLAS_OP_N, D, rows, T, &one, w.kt, D, kv_block, w.dp, T, p_block, &zero, dq_t,
                      D, q_block, B * KVH);
    LAUNCH(s, heads_layout_launch(dq, dq_t, B, T, H, D, HEADS_FROM_MAJOR_BF16, s->compute));
    GEMM_BF16_BATCHED(s, CUBLAS_OP_N, CUBLAS_OP_T, D, T, T, &one, w.qt, D, head, w.dp, T, square, &zero, w.terms, D,
                      head, B * H);
    LAUNCH(s, group_sum_launch(dk, w.terms, B, T, KVH, group, D, 1, s->compute));
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
    LAUNCH(s, cross_entropy_launch(dlogits, logits, 0, targets, N, V, ignore_index, 1.0f, 0, NULL, s->scratch,
                                   s->compute));
    kernels_result result = read_result(s);
    if (count_out != NULL) *count_out = result.count;
    return result.mean_loss;
}

/* A slot outside the table: the caller's mistake, named with the rank and the values. */
static void check_slots(const cuda_device_state *s, const char *what, int first, int count) {
    if (first >= 0 && count >= 0 && first + count <= DEVICE_LOSS_SLOTS) return;
    char message[160];
    snprintf(message, sizeof message, "%s: loss slots %d .. %d outside the table's 0 .. %d", what, first,
             first + count - 1, DEVICE_LOSS_SLOTS - 1);
    ops_fatal(s, message);
}

/* The loss (on the logits rounded as read, when logits_dtype says so) and its scaled (and rounded) gradient queued,
 * the mean added into the slot on the device: no copy, no wait. */
static void cuda_cross_entropy_to_slot(device *d, float *dlogits, const float *logits, dtype logits_dtype,
                                       const int *targets, int N, int V, int ignore_index, float dlogits_scale,
                                       dtype dlogits_dtype, int slot) {
    cuda_device_state *s = state_of(d);
    check_slots(s, "cross_entropy_to_slot", slot, 1);
    LAUNCH(s, cross_entropy_launch(dlogits, logits, logits_dtype == DTYPE_BFLOAT16, targets, N, V, ignore_index,
                                   dlogits_scale, dlogits_dtype == DTYPE_BFLOAT16, s->loss_slots + 2 * (size_t)slot,
                                   s->scratch, s->compute));
}

/* The slots to the host: one copy, one wait; then zeroed, queued, for the next step's micro-batches. */
static void cuda_loss_slots_read(device *d, double *sums, double *counts, int first, int count) {
    cuda_device_state *s = state_of(d);
    check_slots(s, "loss_slots_read", first, count);
    if (count == 0) return;
    size_t bytes = sizeof(double) * 2 * (size_t)count;
    CUDA_TIMED(s, "cudaMemcpyAsync device to host", 0, 0, 0,
               CUDA_CHECK(s->rank, cudaMemcpyAsync(s->host_scratch, s->loss_slots + 2 * (size_t)first, bytes,
                                                   cudaMemcpyDeviceToHost, s->compute)));
    cuda_compute_wait(s, "the losses read");
    const double *host = (const double *)s->host_scratch;
    for (int i = 0; i < count; i++) sums[i] = host[2 * i], counts[i] = host[2 * i + 1];
    CUDA_TIMED(s, "cudaMemsetAsync", 0, 0, 0,
               CUDA_CHECK(s->rank, cudaMemsetAsync(s->loss_slots + 2 * (size_t)first, 0, bytes, s->compute)));
}

/* ---- vectors ---- */

static void cuda_add_inplace(device *d, float *out, const float *inp, size_t count) {
    cuda_device_state *s = state_of(d);
    LAUNCH(s, add_inplace_launch(out, inp, count, s->compute));
}

static void cuda_add_inplace_bf16(device *d, float *out, const float *inp, size_t count) {
    cuda_device_state *s = state_of(d);
    LAUNCH(s, add_rounded_bf16_launch(out, inp, count, s->compute));
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
        cuda_compute_wait(s, "the wait for the non-finite check's indices");
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
        CUDA_TIMED(s, "cudaMemcpyAsync device to device", 0, 0, 0,
                   CUDA_CHECK(s->rank, cudaMemcpyAsync(dst, src, count * dtype_size(to), cudaMemcpyDeviceToDevice,
                                                       s->compute)));
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

static void cuda_rows_copy(device *d, void *rank_major, dtype type, float *full, int to_full,
                           const device_rows_param *params, int param_count, size_t sharded_numel, int first_rank,
                           int ranks) {
    cuda_device_state *s = state_of(d);
    if (type != DTYPE_FLOAT32 && type != DTYPE_BFLOAT16) {
        char what[120];
        snprintf(what, sizeof what, "rows_copy: a rank-major buffer of %s (float32 or bfloat16 only)",
                 dtype_name(type));
        ops_fatal(s, what);
    }
    LAUNCH(s, rows_copy_launch(rank_major, type == DTYPE_BFLOAT16, full, to_full, params, param_count, sharded_numel,
                               first_rank, ranks, s->compute));
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
    d->residual_rmsnorm_forward = cuda_residual_rmsnorm_forward;
    d->rmsnorm_backward = cuda_rmsnorm_backward;
    d->linear_forward = cuda_linear_forward;
    d->linear_backward = cuda_linear_backward;
    d->rope_tables = cuda_rope_tables;
    d->rope_forward = cuda_rope_forward;
    d->rope_backward = cuda_rope_backward;
    d->attention_forward_at = cuda_attention_forward_at;
    d->attention_probs = cuda_attention_probs;
    d->attention_backward = cuda_attention_backward;
    d->swiglu_forward = cuda_swiglu_forward;
    d->swiglu_backward = cuda_swiglu_backward;
    d->cross_entropy_forward_backward = cuda_cross_entropy_forward_backward;
    d->cross_entropy_to_slot = cuda_cross_entropy_to_slot;
    d->loss_slots_read = cuda_loss_slots_read;
    d->add_inplace = cuda_add_inplace;
    d->accumulate = cuda_accumulate;
    d->scale = cuda_scale;
    d->sum_squares = cuda_sum_squares;
    d->sum_abs = cuda_sum_abs;
    d->first_nonfinite = cuda_first_nonfinite;
    d->first_nonfinite_of = cuda_first_nonfinite_of;
    d->convert = cuda_convert;
    d->round_to = cuda_round_to;
    d->rows_copy = cuda_rows_copy;
    d->adamw_update = cuda_adamw_update;
    d->linear_forward_bf16 = cuda_linear_forward_bf16;
    d->linear_forward_bf16_sums = cuda_linear_forward_bf16_sums;
    d->linear_backward_bf16 = cuda_linear_backward_bf16;
    d->rmsnorm_forward_bf16 = cuda_rmsnorm_forward_bf16;
    d->residual_rmsnorm_forward_bf16 = cuda_residual_rmsnorm_forward_bf16;
    d->rmsnorm_backward_bf16 = cuda_rmsnorm_backward_bf16;
    d->rope_forward_bf16 = cuda_rope_forward_bf16;
    d->rope_backward_bf16 = cuda_rope_backward_bf16;
    d->attention_forward_bf16 = cuda_attention_forward_bf16;
    d->attention_probs_bf16 = cuda_attention_probs_bf16;
    d->attention_backward_bf16 = cuda_attention_backward_bf16;
    d->swiglu_forward_bf16 = cuda_swiglu_forward_bf16;
    d->swiglu_backward_bf16 = cuda_swiglu_backward_bf16;
    d->linear_backward_input_stacked_bf16 = cuda_linear_backward_input_stacked_bf16;
    d->add_inplace_bf16 = cuda_add_inplace_bf16;
}
