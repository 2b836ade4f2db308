/* layers_bf16.c — the layers as torch computes them on bfloat16 tensors. See layers_bf16.h for the rules.
 *
 * Built without contraction (-ffp-contract=off, the Makefile): a product that torch rounds before an addition must not
 * be fused into it. bf16_round (dtype.h) is round to nearest even, as c10::BFloat16. The per-element formulas are
 * kernel_math.h's km_bf16_* functions, which the CUDA device's kernels (core/cuda/kernels.cu) call too. */
#include "core/kernels/layers_bf16.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

#include "core/base/dtype.h"
#include "core/base/kernel_math.h"
#include "core/kernels/layers.h"

static inline float r16(float value) { return bf16_round(value); }

void rmsnorm_forward_bf16(float *out, float *rstd, const float *inp, const float *weight, int N, int C, float eps) {
    rmsnorm_forward(out, rstd, inp, weight, N, C, eps); /* layers.c's rstd (the float32 output is replaced) */
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float *y = out + (size_t)n * C;
        for (int c = 0; c < C; c++) y[c] = km_bf16_rmsnorm_scale(x[c], weight[c], rstd[n]);
    }
}

void residual_rmsnorm_forward_bf16(float *residual, float *out, float *rstd, const float *inp, const float *weight,
                                   int N, int C, float eps) {
    add_inplace(residual, inp, (size_t)N * C);
    dtype_round_to(residual, (size_t)N * C, DTYPE_BFLOAT16);
    rmsnorm_forward_bf16(out, rstd, residual, weight, N, C, eps);
}

void rmsnorm_backward_bf16(float *dinp, const float *dresidual, float *dweight, const float *dout, const float *inp,
                           const float *weight, const float *rstd, int N, int C) {
    /* dweight: per column, the float32 sum over rows of the rounded products, rounded once */
    for (int c = 0; c < C; c++) {
        double sum = 0.0;
        for (int n = 0; n < N; n++) {
            size_t at = (size_t)n * C + c;
            sum += km_bf16_rmsnorm_dweight_term(dout[at], inp[at], rstd[n]);
        }
        dweight[c] += r16((float)sum);
    }
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C, *dy = dout + (size_t)n * C;
        const float *dres = dresidual != NULL ? dresidual + (size_t)n * C : NULL;
        float *dx = dinp + (size_t)n * C;
        float r = rstd[n];
        double dot = 0.0; /* sum_c dh_c x_c, dh = bf16(dy * weight) */
        for (int c = 0; c < C; c++) dot += km_bf16_rmsnorm_dot_term(km_bf16_rmsnorm_dh(dy[c], weight[c]), x[c]);
        float coefficient = km_rmsnorm_coefficient(dot, r, C);
        for (int c = 0; c < C; c++)
            dx[c] = km_bf16_rmsnorm_dinp(dres != NULL ? dres[c] : 0.0f, r, km_bf16_rmsnorm_dh(dy[c], weight[c]), x[c],
                                         coefficient);
    }
}

/* One head vector at one position. Forward: [x1, x2] -> [bf16(bf16(x1 c) - bf16(x2 s)),
 * bf16(bf16(x2 c') + bf16(x1 s'))] (rotate_half(x) = [-x2, x1]; c, s the first half's table entries, c', s' the
 * second's). */
static void rotate_forward(float *x, const float *cos_row, const float *sin_row, int D) {
    int half = D / 2;
    for (int i = 0; i < half; i++) {
        float x1 = x[i], x2 = x[i + half];
        x[i] = km_bf16_rope_difference(x1, cos_row[i], x2, sin_row[i]);
        x[i + half] = km_bf16_rope_sum(x2, cos_row[i + half], x1, sin_row[i + half]);
    }
}

/* Backward: g = bf16(dy * sin) flows back through rotate_half (x1 gets g's second half, x2 minus its first) and is
 * added to bf16(dy * cos). */
static void rotate_backward(float *dx, const float *cos_row, const float *sin_row, int D) {
    int half = D / 2;
    for (int i = 0; i < half; i++) {
        float dy1 = dx[i], dy2 = dx[i + half];
        dx[i] = km_bf16_rope_sum(dy1, cos_row[i], dy2, sin_row[i + half]);
        dx[i + half] = km_bf16_rope_difference(dy2, cos_row[i + half], dy1, sin_row[i]);
    }
}

static void rope_apply_bf16(float *x, const float *cos_table, const float *sin_table, int B, int T, int H, int D,
                            int backward) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < H; h++) {
                float *vector = x + (((size_t)b * T + t) * H + h) * D;
                if (backward) rotate_backward(vector, cos_table + (size_t)t * D, sin_table + (size_t)t * D, D);
                else rotate_forward(vector, cos_table + (size_t)t * D, sin_table + (size_t)t * D, D);
            }
}

void rope_forward_bf16(float *x, const float *cos_table, const float *sin_table, int B, int T, int H, int D) {
    rope_apply_bf16(x, cos_table, sin_table, B, T, H, D, 0);
}

void rope_backward_bf16(float *dx, const float *cos_table, const float *sin_table, int B, int T, int H, int D) {
    rope_apply_bf16(dx, cos_table, sin_table, B, T, H, D, 1);
}

/* HF's scaling, head_dim ** -0.5 in double, taken to float32 as torch's opmath takes a Python scalar. */
static float attention_scale(int D) { return (float)(1.0 / sqrt((double)D)); }

/* Rows of a (rows, columns) block with leading dimension ld, rounded in place. */
static void round_block(float *block, int rows, int columns, size_t ld) {
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < columns; j++) block[(size_t)i * ld + j] = r16(block[(size_t)i * ld + j]);
}

void attention_probs_bf16(float *probs, const float *q, const float *k, int B, int T, int past, int H, int KVH,
                          int D) {
    int group = H / KVH, keys = past + T;
    size_t q_stride = (size_t)H * D, kv_stride = (size_t)KVH * D, block = (size_t)T * keys;
    float scale = attention_scale(D);
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < H; h++) {
            const float *q_head = q + (size_t)b * T * q_stride + (size_t)h * D;
            const float *k_head = k + (size_t)b * keys * kv_stride + (size_t)(h / group) * D;
            float *p = probs + ((size_t)b * H + h) * block;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, keys, D, 1.0f, q_head, (int)q_stride, k_head,
                        (int)kv_stride, 0.0f, p, keys);
            for (size_t i = 0; i < block; i++) p[i] = km_bf16_attention_score(p[i], scale); /* matmul, * scaling */
            causal_softmax_rows(p, T, past); /* layers.c's: the float32 softmax, masked */
        }
    }
}

void attention_forward_bf16(float *out, float *probs, float *scratch, const float *q, const float *k, const float *v,
                            int B, int T, int past, int H, int KVH, int D) {
    int group = H / KVH, keys = past + T;
    size_t q_stride = (size_t)H * D, kv_stride = (size_t)KVH * D, block = (size_t)T * keys;
    attention_probs_bf16(probs, q, k, B, T, past, H, KVH, D);
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < H; h++) {
            const float *v_head = v + (size_t)b * keys * kv_stride + (size_t)(h / group) * D;
            const float *p = probs + ((size_t)b * H + h) * block;
            float *o = out + (size_t)b * T * q_stride + (size_t)h * D;
            for (size_t i = 0; i < block; i++) scratch[i] = r16(p[i]); /* .to(query.dtype) */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, D, keys, 1.0f, scratch, keys, v_head,
                        (int)kv_stride, 0.0f, o, (int)q_stride);
            round_block(o, T, D, q_stride);
        }
    }
}

/* block (rows, D) with leading dimension ld = bf16(term) (first: a group's first head) or += it (term (rows, D),
 * contiguous). */
static void add_rounded_block(float *block, size_t ld, const float *term, int rows, int D, int first) {
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < D; j++) {
            float *out = &block[(size_t)i * ld + j];
            *out = first ? r16(term[(size_t)i * D + j]) : *out + r16(term[(size_t)i * D + j]);
        }
}

void attention_backward_bf16(float *dq, float *dk, float *dv, float *scratch, const float *dout, const float *probs,
                             const float *q, const float *k, const float *v, int B, int T, int H, int KVH, int D) {
    int group = H / KVH;
    size_t q_stride = (size_t)H * D, kv_stride = (size_t)KVH * D, block = (size_t)T * T;
    float scale = attention_scale(D);
    float *rounded_probs = scratch, *dp = scratch + block, *term = scratch + 2 * block;
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < H; h++) {
            size_t q_offset = (size_t)b * T * q_stride + (size_t)h * D;
            size_t kv_offset = (size_t)b * T * kv_stride + (size_t)(h / group) * D;
            const float *p = probs + ((size_t)b * H + h) * block;
            int first = h % group == 0; /* the group's first head writes dk and dv, the others add */
            for (size_t i = 0; i < block; i++) rounded_probs[i] = r16(p[i]);
            /* dv_head = bf16(probs^T dout), summed over the group's heads in float32 */
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, D, T, 1.0f, rounded_probs, T, dout + q_offset,
                        (int)q_stride, 0.0f, term, D);
            add_rounded_block(dv + kv_offset, kv_stride, term, T, D, first);
            /* dp = bf16(dout v^T); the softmax's float32 backward from the float32 probabilities, rounded to the
             * scores' bfloat16, then the scaling's backward rounded again */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, D, 1.0f, dout + q_offset, (int)q_stride,
                        v + kv_offset, (int)kv_stride, 0.0f, dp, T);
            for (int t = 0; t < T; t++) {
                const float *p_row = p + (size_t)t * T;
                float *row = dp + (size_t)t * T;
                double dot = 0.0;
                for (int j = 0; j <= t; j++) dot += km_softmax_dot_term(p_row[j], r16(row[j]));
                for (int j = 0; j <= t; j++) row[j] = km_bf16_softmax_backward(p_row[j], row[j], dot, scale);
                for (int j = t + 1; j < T; j++) row[j] = 0.0f;
            }
            /* dq = bf16(ds k): each head writes its own columns of dq */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, D, T, 1.0f, dp, T, k + kv_offset,
                        (int)kv_stride, 0.0f, dq + q_offset, (int)q_stride);
            round_block(dq + q_offset, T, D, q_stride);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, D, T, 1.0f, dp, T, q + q_offset, (int)q_stride,
                        0.0f, term, D);
            add_rounded_block(dk + kv_offset, kv_stride, term, T, D, first);
        }
    }
    size_t kv_count = (size_t)B * T * kv_stride; /* repeat_kv's backward: the float32 sums, rounded once */
    for (size_t i = 0; i < kv_count; i++) {
        dk[i] = r16(dk[i]);
        dv[i] = r16(dv[i]);
    }
}

void swiglu_forward_bf16(float *out, const float *gate_up, int N, int width) {
    for (int n = 0; n < N; n++) {
        const float *gate = gate_up + (size_t)n * 2 * width, *up = gate + width;
        float *row = out + (size_t)n * width;
        for (int i = 0; i < width; i++) row[i] = km_bf16_swiglu(gate[i], up[i]);
    }
}

void swiglu_backward_bf16(float *dgate_up, const float *dout, const float *gate_up, int N, int width) {
    for (int n = 0; n < N; n++) {
        const float *gate = gate_up + (size_t)n * 2 * width, *up = gate + width, *dy = dout + (size_t)n * width;
        float *dgate = dgate_up + (size_t)n * 2 * width, *dup = dgate + width;
        for (int i = 0; i < width; i++) {
            dgate[i] = km_bf16_swiglu_dgate(dy[i], up[i], gate[i]);
            dup[i] = km_bf16_swiglu_dup(dy[i], gate[i]);
        }
    }
}

void linear_backward_input_stacked_bf16(float *dinp, float *scratch, const float *dout, const float *weight, int N,
                                        int IC, int OC) {
    size_t count = (size_t)N * IC;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, IC, OC, 1.0f, dout, 2 * OC, weight, IC, 0.0f, dinp, IC);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, IC, OC, 1.0f, dout + OC, 2 * OC,
                weight + (size_t)OC * IC, IC, 0.0f, scratch, IC);
    add_bf16(dinp, scratch, count);
}

void add_bf16(float *out, const float *inp, size_t count) {
    for (size_t i = 0; i < count; i++) out[i] = km_bf16_add_rounded(out[i], inp[i]);
}
