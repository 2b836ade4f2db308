/* layers.c — Qwen2 layer kernels on the CPU. See layers.h for the conventions. */
#define _POSIX_C_SOURCE 200809L
#include "core/kernels/layers.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "core/base/kernel_math.h"

void layers_set_threads(int threads) { openblas_set_num_threads(threads); }

void layers_choose_blas_core(char **argv) {
    if (getenv("OPENBLAS_CORETYPE") != NULL) return; /* chosen by the user, or by us before the re-exec */
    const char *core = openblas_get_corename();
    if (core == NULL || strcasecmp(core, "prescott") != 0) return;
    const char *better = __builtin_cpu_supports("avx512f") ? "SkylakeX"
                         : __builtin_cpu_supports("avx2")  ? "Haswell"
                                                           : NULL;
    if (better == NULL) return;
    setenv("OPENBLAS_CORETYPE", better, 1);
    execv("/proc/self/exe", argv);
    fprintf(stderr, "warning: could not restart with OPENBLAS_CORETYPE=%s; matrix multiplies use slow kernels\n",
            better);
}

void embedding_forward(float *out, const int *tokens, const float *weight, int N, int C) {
    for (int n = 0; n < N; n++) memcpy(out + (size_t)n * C, weight + (size_t)tokens[n] * C, (size_t)C * sizeof(float));
}

void embedding_backward(float *dweight, const float *dout, const int *tokens, int N, int C) {
    for (int n = 0; n < N; n++) add_inplace(dweight + (size_t)tokens[n] * C, dout + (size_t)n * C, (size_t)C);
}

void rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int N, int C, float eps) {
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float *y = out + (size_t)n * C;
        double sum_squares = 0.0;
        for (int c = 0; c < C; c++) sum_squares += km_square(x[c]);
        float r = km_rmsnorm_rstd(sum_squares, C, eps);
        rstd[n] = r;
        for (int c = 0; c < C; c++) y[c] = km_rmsnorm_scale(x[c], weight[c], r);
    }
}

void residual_rmsnorm_forward(float *residual, float *out, float *rstd, const float *inp, const float *weight, int N,
                              int C, float eps) {
    add_inplace(residual, inp, (size_t)N * C);
    rmsnorm_forward(out, rstd, residual, weight, N, C, eps);
}

/* y = w * x * r, r = (mean(x^2) + eps)^(-1/2).  dx_c = r * (w_c dy_c) - x_c r^3 / C * sum_j (w_j dy_j x_j). */
void rmsnorm_backward(float *dinp, const float *dresidual, float *dweight, const float *dout, const float *inp,
                      const float *weight, const float *rstd, int N, int C) {
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C, *dy = dout + (size_t)n * C;
        const float *dres = dresidual != NULL ? dresidual + (size_t)n * C : NULL;
        float *dx = dinp + (size_t)n * C;
        float r = rstd[n];
        double dot = 0.0;
        for (int c = 0; c < C; c++) {
            dot += km_rmsnorm_dot_term(weight[c], dy[c], x[c]);
            dweight[c] += km_rmsnorm_dweight(dy[c], x[c], r);
        }
        float coefficient = km_rmsnorm_coefficient(dot, r, C);
        for (int c = 0; c < C; c++)
            dx[c] = (dres != NULL ? dres[c] : 0.0f) + km_rmsnorm_dinp(r, weight[c], dy[c], x[c], coefficient);
    }
}

void linear_forward(float *out, const float *inp, const float *weight, const float *bias, int N, int IC, int OC) {
    if (bias != NULL)
        for (int n = 0; n < N; n++) memcpy(out + (size_t)n * OC, bias, (size_t)OC * sizeof(float));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, IC, 1.0f, inp, IC, weight, IC, bias ? 1.0f : 0.0f,
                out, OC);
}

void linear_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                     const float *weight, int N, int IC, int OC) {
    if (dinp != NULL) /* (N, OC) @ (OC, IC), written (beta = 0) */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, IC, OC, 1.0f, dout, OC, weight, IC, 0.0f, dinp, IC);
    /* (OC, N) @ (N, IC) */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, IC, N, 1.0f, dout, OC, inp, IC, 1.0f, dweight, IC);
    if (dbias != NULL)
        for (int n = 0; n < N; n++) add_inplace(dbias, dout + (size_t)n * OC, (size_t)OC);
}

void rope_tables(float *cos_table, float *sin_table, int T, int D, float theta) {
    int half = D / 2;
    for (int i = 0; i < half; i++) {
        /* HF computes inv_freq in float32: 1 / theta^(2i/D). */
        float inv_freq = 1.0f / powf(theta, (float)(2 * i) / (float)D);
        for (int t = 0; t < T; t++) {
            float angle = (float)t * inv_freq;
            cos_table[(size_t)t * D + i] = cos_table[(size_t)t * D + i + half] = cosf(angle);
            sin_table[(size_t)t * D + i] = sin_table[(size_t)t * D + i + half] = sinf(angle);
        }
    }
}

/* One head vector at one position: forward rotates by +angle, backward (transpose) by -angle. */
static inline void rotate(float *x, const float *cos_row, const float *sin_row, int D, float direction) {
    int half = D / 2;
    for (int i = 0; i < half; i++) {
        float x1 = x[i], x2 = x[i + half];
        x[i] = km_rope_first(x1, x2, cos_row[i], sin_row[i], direction);
        x[i + half] = km_rope_second(x1, x2, cos_row[i + half], sin_row[i + half], direction);
    }
}

static void rope_apply(float *x, const float *cos_table, const float *sin_table, int B, int T, int H, int D,
                       float direction) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < H; h++)
                rotate(x + (((size_t)b * T + t) * H + h) * D, cos_table + (size_t)t * D, sin_table + (size_t)t * D,
                       D, direction);
}

void rope_forward(float *x, const float *cos_table, const float *sin_table, int B, int T, int H, int D) {
    rope_apply(x, cos_table, sin_table, B, T, H, D, 1.0f);
}

void rope_backward(float *dx, const float *cos_table, const float *sin_table, int B, int T, int H, int D) {
    rope_apply(dx, cos_table, sin_table, B, T, H, D, -1.0f);
}

/* Row-wise causal softmax of scores (T, past + T) in place: row t is query position past + t, keeps columns
 * 0 .. past + t, the rest become 0. */
void causal_softmax_rows(float *scores, int T, int past) {
    int width = past + T;
    for (int t = 0; t < T; t++) {
        float *row = scores + (size_t)t * width;
        int last = past + t;
        float max_value = row[0];
        for (int j = 1; j <= last; j++) max_value = km_max(max_value, row[j]);
        double sum = 0.0;
        for (int j = 0; j <= last; j++) {
            row[j] = km_softmax_exp(row[j], max_value);
            sum += row[j];
        }
        float inverse = km_softmax_inverse(sum);
        for (int j = 0; j <= last; j++) row[j] *= inverse;
        for (int j = last + 1; j < width; j++) row[j] = 0.0f;
    }
}

void attention_forward(float *out, float *probs, const float *q, const float *k, const float *v, int B, int T, int H,
                       int KVH, int D) {
    attention_forward_at(out, probs, q, k, v, B, T, 0, H, KVH, D);
}

void attention_probs_at(float *probs, const float *q, const float *k, int B, int T, int past, int H, int KVH, int D) {
    int group = H / KVH, keys = past + T;
    size_t q_stride = (size_t)H * D, kv_stride = (size_t)KVH * D;
    float scale = 1.0f / sqrtf((float)D);
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < H; h++) {
            const float *q_head = q + (size_t)b * T * q_stride + (size_t)h * D;
            const float *k_head = k + (size_t)b * keys * kv_stride + (size_t)(h / group) * D;
            float *p = probs + ((size_t)b * H + h) * T * keys;
            /* scores (T, keys) = scale * q_head (T, D) @ k_head^T; rows strided by the heads between them */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, keys, D, scale, q_head, (int)q_stride, k_head,
                        (int)kv_stride, 0.0f, p, keys);
            causal_softmax_rows(p, T, past);
        }
    }
}

void attention_forward_at(float *out, float *probs, const float *q, const float *k, const float *v, int B, int T,
                          int past, int H, int KVH, int D) {
    int group = H / KVH, keys = past + T;
    size_t q_stride = (size_t)H * D, kv_stride = (size_t)KVH * D;
    attention_probs_at(probs, q, k, B, T, past, H, KVH, D);
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < H; h++) {
            const float *v_head = v + (size_t)b * keys * kv_stride + (size_t)(h / group) * D;
            const float *p = probs + ((size_t)b * H + h) * T * keys;
            float *o = out + (size_t)b * T * q_stride + (size_t)h * D;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, D, keys, 1.0f, p, keys, v_head, (int)kv_stride,
                        0.0f, o, (int)q_stride);
        }
    }
}

void attention_backward(float *dq, float *dk, float *dv, float *scratch, const float *dout, const float *probs,
                        const float *q, const float *k, const float *v, int B, int T, int H, int KVH, int D) {
    int group = H / KVH;
    size_t q_stride = (size_t)H * D, kv_stride = (size_t)KVH * D;
    float scale = 1.0f / sqrtf((float)D);
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < H; h++) {
            size_t q_offset = (size_t)b * T * q_stride + (size_t)h * D;
            size_t kv_offset = (size_t)b * T * kv_stride + (size_t)(h / group) * D;
            const float *p = probs + ((size_t)b * H + h) * T * T;
            float *dp = scratch;
            float add = h % group == 0 ? 0.0f : 1.0f; /* a group's first head writes dk and dv, the others add */
            /* dv (+)= p^T @ dout;  dp = dout @ v^T */
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, D, T, 1.0f, p, T, dout + q_offset, (int)q_stride,
                        add, dv + kv_offset, (int)kv_stride);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, D, 1.0f, dout + q_offset, (int)q_stride,
                        v + kv_offset, (int)kv_stride, 0.0f, dp, T);
            /* softmax backward: ds = p * (dp - sum_j p_j dp_j), row by row (masked entries have p = 0) */
            for (int t = 0; t < T; t++) {
                const float *p_row = p + (size_t)t * T;
                float *row = dp + (size_t)t * T;
                double dot = 0.0;
                for (int j = 0; j <= t; j++) dot += km_softmax_dot_term(p_row[j], row[j]);
                for (int j = 0; j <= t; j++) row[j] = km_softmax_backward(p_row[j], row[j], dot);
                for (int j = t + 1; j < T; j++) row[j] = 0.0f;
            }
            /* dq = scale * ds @ k (its head's columns);  dk (+)= scale * ds^T @ q */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, D, T, scale, dp, T, k + kv_offset,
                        (int)kv_stride, 0.0f, dq + q_offset, (int)q_stride);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, D, T, scale, dp, T, q + q_offset, (int)q_stride,
                        add, dk + kv_offset, (int)kv_stride);
        }
    }
}

void swiglu_forward(float *out, const float *gate_up, int N, int width) {
    for (int n = 0; n < N; n++) {
        const float *gate = gate_up + (size_t)n * 2 * width, *up = gate + width;
        float *row = out + (size_t)n * width;
        for (int i = 0; i < width; i++) row[i] = km_silu(gate[i]) * up[i];
    }
}

void swiglu_backward(float *dgate_up, const float *dout, const float *gate_up, int N, int width) {
    for (int n = 0; n < N; n++) {
        const float *gate = gate_up + (size_t)n * 2 * width, *up = gate + width, *dy = dout + (size_t)n * width;
        float *dgate = dgate_up + (size_t)n * 2 * width, *dup = dgate + width;
        for (int i = 0; i < width; i++) {
            float s = km_sigmoid(gate[i]); /* one exp serves silu and its derivative s (1 + x (1 - s)) */
            dgate[i] = km_swiglu_dgate(dy[i], up[i], s, gate[i]);
            dup[i] = km_swiglu_dup(dy[i], gate[i], s);
        }
    }
}

float cross_entropy_forward_backward(float *dlogits, const float *logits, const int *targets, int N, int V,
                                     int ignore_index, int *count_out) {
    return cross_entropy_forward_backward_of(dlogits, logits, 0, targets, N, V, ignore_index, count_out);
}

/* A logit as the loss reads it: rounded to bfloat16 first when `bf16` (km_bf16_round: bits, no arithmetic). */
static inline float read_logit(const float *row, int j, int bf16) { return bf16 ? km_bf16_round(row[j]) : row[j]; }

float cross_entropy_forward_backward_of(float *dlogits, const float *logits, int logits_bf16, const int *targets,
                                        int N, int V, int ignore_index, int *count_out) {
    int count = 0;
    for (int n = 0; n < N; n++) count += targets[n] != ignore_index;
    if (count_out != NULL) *count_out = count;
    double loss = 0.0;
    for (int n = 0; n < N; n++) {
        const float *row = logits + (size_t)n * V;
        float *drow = dlogits ? dlogits + (size_t)n * V : NULL;
        if (targets[n] == ignore_index) {
            if (drow != NULL) memset(drow, 0, (size_t)V * sizeof(float));
            continue;
        }
        float max_value = read_logit(row, 0, logits_bf16);
        for (int j = 1; j < V; j++) max_value = km_max(max_value, read_logit(row, j, logits_bf16));
        double sum = 0.0;
        for (int j = 0; j < V; j++) sum += km_cross_entropy_exp(read_logit(row, j, logits_bf16), max_value);
        double log_sum = km_cross_entropy_log_sum(sum, max_value);
        loss += log_sum - read_logit(row, targets[n], logits_bf16);
        if (drow != NULL) {
            /* d(mean loss)/d(logit j) = (softmax_j - [j == target]) / count */
            float inverse_count = km_cross_entropy_inverse_count(count);
            for (int j = 0; j < V; j++)
                drow[j] = km_cross_entropy_dlogit(read_logit(row, j, logits_bf16), log_sum, inverse_count);
            drow[targets[n]] -= inverse_count;
        }
    }
    return count > 0 ? (float)(loss / count) : 0.0f;
}

void add_inplace(float *out, const float *inp, size_t count) {
    for (size_t i = 0; i < count; i++) out[i] += inp[i];
}
