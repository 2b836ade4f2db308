/* gpu_layers.c — the CUDA device against the CPU, function by function (step 1 of scripts/gpu_check.sh).
 *
 * For every function of core/device/device.h's table that computes (all but zero, copy and synchronize), on several
 * shapes (grouped-query, multi-query and plain attention, a KV cache with past > 0, odd row and column counts, tokens
 * that repeat, ignore_index targets, a batch where every target is ignored), the same random inputs go to the CPU
 * (core/kernels/layers.c and the CPU's element loops, called directly) and to the CUDA device (cuda_device_init, then
 * the table), and every output element is compared within a bound derived for it, next to each check below. Prints one
 * row per check (what, max |cpu - gpu|, the bound at the worst element, worst |diff| / bound, PASS or FAIL) and
 * exits 1 when any check fails, 77 when this build or machine has no CUDA device.
 *
 * The bounds. u = 2^-24. Each device computes each output within an error bound of the exact value of the same
 * real-number expression; the two results then differ by at most the sum of the two bounds. For a sum or a dot of
 * K terms in any order, with or without fused multiply-adds, the computed value is within gamma(K) sum |terms|,
 * gamma(K) = K u / (1 - K u) (Higham, Accuracy and Stability of Numerical Algorithms, §3.1): so OpenBLAS and cuBLAS
 * each are, whatever kernel and split each picks. An expf is within 4 ulp on either side (8u: glibc's vectorised
 * expf, which -ffast-math may pick for layers.c, is specified to 4 ulp; CUDA's expf to 2), exp / log in double
 * within 2^-52. The magnitudes (sum |terms|) are computed here in double from the inputs. Where the two devices
 * run the same correctly rounded operations in the same order, the bound is 0 and the check is bit equality:
 * the embedding (copies; one add per token in token order), add, scale, the casts, the RoPE tables (made on the
 * host by the same function), first_nonfinite, and AdamW (kernel_math.h's element: IEEE multiply, divide, sqrtf
 * and the two fmaf's only; km_mul_unfused keeps nvcc from fusing the rest). TF32 must be off (the GEMM bounds
 * assume float32 products).
 *
 * The bfloat16 layers (device.h's *_bf16 entries: the CPU device's, core/kernels/layers_bf16.c, against the CUDA
 * device's) run on inputs rounded to bfloat16 and are checked with intervals carried through each layer op by op (see
 * "the layers in bfloat16" below): bit equality wherever no bfloat16 rounding can flip, one bfloat16 ulp (or what a
 * flip upstream carries) where one can. On the emulator, a last check shows its GemmEx refusing other types and
 * aborting on a non-bfloat16 operand under CUBLAS_COMPUTE_32F_FAST_16BF.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/device/device.h"
#include "core/base/dtype.h"
#include "core/base/kernel_math.h"
#include "core/kernels/layers.h"
#include "core/kernels/layers_bf16.h"
#include "core/base/rng.h"
#ifdef FSDPLAB_CUDA
#include "core/cuda/cuda_device.h"
#endif

#define U 0x1p-24
#define EXP_ULPS 4.0 /* expf's error on either device, in ulps (2u relative each) */
static double gamma_n(double n) { return n * U / (1.0 - n * U); }
/* A result below FLT_MIN errs by up to 2^-150 absolute per rounding instead of relatively. */
#define UNDERFLOW 0x1p-146

static device gpu;
static int failures = 0, checks = 0;

/* ---- host buffers and inputs ---- */

static void *host_alloc(size_t bytes) {
    void *p = malloc(bytes > 0 ? bytes : 1);
    if (p == NULL) {
        fprintf(stderr, "gpu_layers: out of host memory (%zu bytes)\n", bytes);
        exit(2);
    }
    return p;
}
static float *random_floats(size_t count, uint64_t stream, float scale) {
    float *x = host_alloc(count * sizeof(float));
    for (size_t i = 0; i < count; i++) x[i] = scale * (2.0f * rng_uniform(7, stream, i) - 1.0f);
    return x;
}
static double *bounds(size_t count) { return calloc(count > 0 ? count : 1, sizeof(double)); }
/* The GPU's buffer for an input gradient a backward writes (layers.h: =, not +=): NaN everywhere, so a kernel or a
 * GEMM that read it (beta = 1, an add) would put NaN in the result. The CPU's starts as other random numbers: a CPU
 * that added them would differ from the GPU by more than any bound. */
static float *nan_floats(size_t count) {
    float *x = host_alloc(count * sizeof(float));
    for (size_t i = 0; i < count; i++) x[i] = NAN;
    return x;
}
static float *copy_floats(const float *x, size_t count) {
    float *y = host_alloc(count * sizeof(float));
    memcpy(y, x, count * sizeof(float));
    return y;
}

/* ---- device buffers through the device's own segments and copies ---- */

typedef struct buffer {
    void *ptr;
    size_t bytes;
} buffer;

static buffer device_alloc(size_t bytes) {
    buffer b = {gpu.segments.segment_alloc(gpu.segments.state, bytes > 0 ? bytes : 4), bytes > 0 ? bytes : 4};
    if (b.ptr == NULL) {
        fprintf(stderr, "gpu_layers: the device has no %zu bytes\n", bytes);
        exit(2);
    }
    return b;
}
static buffer to_device(const void *host, size_t bytes) {
    buffer b = device_alloc(bytes);
    if (bytes > 0) gpu.copy(&gpu, b.ptr, host, bytes, DEVICE_H2D);
    return b;
}
static void *from_device(buffer b, size_t bytes) {
    void *host = host_alloc(bytes);
    if (bytes > 0) gpu.copy(&gpu, host, b.ptr, bytes, DEVICE_D2H);
    return host;
}
static void device_free(buffer b) { gpu.segments.segment_free(gpu.segments.state, b.ptr, b.bytes); }

/* ---- the table of results ---- */

/* |cpu[i] - gpu[i]| <= bound[i] for every i (bound NULL: every bound 0, bit equality). */
static void compare(const char *what, const float *cpu, const float *gpu_values, const double *bound, size_t count) {
    double max_diff = 0.0, worst_ratio = 0.0, worst_bound = 0.0;
    size_t bad = 0, first_bad = 0;
    for (size_t i = 0; i < count; i++) {
        double diff = fabs((double)cpu[i] - (double)gpu_values[i]), b = bound != NULL ? bound[i] : 0.0;
        int same_bits = km_float_bits(cpu[i]) == km_float_bits(gpu_values[i]);
        int ok = bound != NULL ? (diff <= b || same_bits) : same_bits;
        if (isnan(diff) && !same_bits) ok = 0;
        if (!ok && bad++ == 0) first_bad = i;
        if (diff > max_diff) max_diff = diff;
        double ratio = b > 0.0 ? diff / b : (diff > 0.0 ? INFINITY : 0.0);
        if (ratio > worst_ratio || i == 0) {
            worst_ratio = ratio;
            worst_bound = b;
        }
    }
    checks++;
    if (bad > 0) failures++;
    printf("%-58s %11.3e %11.3e %9.3f  %s", what, max_diff, worst_bound, worst_ratio, bad ? "FAIL" : "PASS");
    if (bad > 0)
        printf("  (%zu of %zu; first at %zu: cpu %.9g gpu %.9g)", bad, count, first_bad, (double)cpu[first_bad],
               (double)gpu_values[first_bad]);
    printf("\n");
}

static void compare_exact_bytes(const char *what, const void *cpu, const void *gpu_values, size_t bytes) {
    checks++;
    int same = memcmp(cpu, gpu_values, bytes) == 0;
    if (!same) failures++;
    printf("%-58s %11s %11s %9s  %s\n", what, same ? "0" : "differ", "0 (bits)", "-", same ? "PASS" : "FAIL");
}

/* ---- embedding ---- */

static void check_embedding(int N, int V, int C) {
    char name[96];
    float *weight = random_floats((size_t)V * C, 1, 1.0f), *dout = random_floats((size_t)N * C, 2, 1.0f);
    float *dweight = random_floats((size_t)V * C, 3, 0.5f);
    int *tokens = host_alloc((size_t)N * sizeof(int));
    for (int n = 0; n < N; n++) tokens[n] = (int)(rng_bits(7, 4, n) % (uint64_t)V); /* repeats when N > V */
    buffer d_weight = to_device(weight, (size_t)V * C * 4), d_tokens = to_device(tokens, (size_t)N * 4);
    buffer d_out = device_alloc((size_t)N * C * 4), d_dout = to_device(dout, (size_t)N * C * 4);
    buffer d_dweight = to_device(dweight, (size_t)V * C * 4);

    float *out = host_alloc((size_t)N * C * 4);
    embedding_forward(out, tokens, weight, N, C);
    gpu.embedding_forward(&gpu, d_out.ptr, d_tokens.ptr, d_weight.ptr, N, C);
    float *g_out = from_device(d_out, (size_t)N * C * 4);
    snprintf(name, sizeof name, "embedding_forward N=%d V=%d C=%d", N, V, C);
    compare(name, out, g_out, NULL, (size_t)N * C); /* a copy: bits */

    embedding_backward(dweight, dout, tokens, N, C);
    gpu.embedding_backward(&gpu, d_dweight.ptr, d_dout.ptr, d_tokens.ptr, N, C);
    float *g_dweight = from_device(d_dweight, (size_t)V * C * 4);
    snprintf(name, sizeof name, "embedding_backward N=%d V=%d C=%d", N, V, C);
    compare(name, dweight, g_dweight, NULL, (size_t)V * C); /* one add per token, in token order, on both: bits */
    device_free(d_weight), device_free(d_tokens), device_free(d_out), device_free(d_dout), device_free(d_dweight);
    free(weight), free(dout), free(dweight), free(tokens), free(out), free(g_out), free(g_dweight);
}

/* ---- RMSNorm ---- */

static void check_rmsnorm(int N, int C, float scale) {
    char name[96];
    size_t n_elements = (size_t)N * C;
    float eps = 1e-6f;
    float *inp = random_floats(n_elements, 10, scale), *weight = random_floats(C, 11, 1.5f);
    float *dout = random_floats(n_elements, 12, 1.0f), *dinp = random_floats(n_elements, 13, 0.5f);
    float *dweight = random_floats(C, 14, 0.5f);
    float *dinp0 = copy_floats(dinp, n_elements), *dweight0 = copy_floats(dweight, C);
    buffer d_inp = to_device(inp, n_elements * 4), d_weight = to_device(weight, C * 4),
           d_out = device_alloc(n_elements * 4);
    buffer d_rstd = device_alloc((size_t)N * 4), d_dout = to_device(dout, n_elements * 4);
    /* backward's dinp: the GPU's overwritten (it starts as other numbers) from a separate dresidual holding dinp, the
     * CPU's accumulated in place (dresidual == dinp): the two forms of the residual's add */
    float *garbage = random_floats(n_elements, 15, 0.5f);
    buffer d_dinp = to_device(garbage, n_elements * 4), d_dweight = to_device(dweight, C * 4);
    buffer d_dresidual = to_device(dinp, n_elements * 4);

    float *out = host_alloc(n_elements * 4), *rstd = host_alloc((size_t)N * 4);
    rmsnorm_forward(out, rstd, inp, weight, N, C, eps);
    gpu.rmsnorm_forward(&gpu, d_out.ptr, d_rstd.ptr, d_inp.ptr, d_weight.ptr, N, C, eps);
    float *g_out = from_device(d_out, n_elements * 4), *g_rstd = from_device(d_rstd, (size_t)N * 4);
    /* rstd: each device sums the exact squares in double (error <= C 2^-53 of the sum, in its own order), then
     * 1 / sqrt(sum / C + eps) in double (4 more 2^-53), rounded to float once (u): each within
     * (u + (C + 4) 2^-53) r of the exact, so the two within twice that (one float ulp at most, in practice).
     * out = w (x r): two roundings on each side, and r's difference: |w x| (|dr| + 2 gamma(2) r). */
    double *rstd_bound = bounds(N), *out_bound = bounds(n_elements);
    for (int n = 0; n < N; n++) {
        double r = fabs((double)rstd[n]), dr = 2.0 * (U + (C + 4) * 0x1p-53) * r * (1.0 + 4 * U);
        rstd_bound[n] = dr;
        for (int c = 0; c < C; c++) {
            double wx = fabs((double)weight[c] * inp[(size_t)n * C + c]);
            out_bound[(size_t)n * C + c] = wx * (dr + 2.0 * gamma_n(2) * r) + UNDERFLOW;
        }
    }
    snprintf(name, sizeof name, "rmsnorm_forward rstd N=%d C=%d", N, C);
    compare(name, rstd, g_rstd, rstd_bound, N);
    snprintf(name, sizeof name, "rmsnorm_forward out N=%d C=%d", N, C);
    compare(name, out, g_out, out_bound, n_elements);

    /* Backward from the CPU's rstd on both (the GPU's is in d_rstd: copy the CPU's over it). */
    gpu.copy(&gpu, d_rstd.ptr, rstd, (size_t)N * 4, DEVICE_H2D);
    rmsnorm_backward(dinp, dinp, dweight, dout, inp, weight, rstd, N, C);
    gpu.rmsnorm_backward(&gpu, d_dinp.ptr, d_dresidual.ptr, d_dweight.ptr, d_dout.ptr, d_inp.ptr, d_weight.ptr,
                         d_rstd.ptr, N, C);
    float *g_dinp = from_device(d_dinp, n_elements * 4), *g_dweight = from_device(d_dweight, C * 4);
    /* coefficient = float(dot r^3 / C): the dot's double sums differ by <= 2 C 2^-53 sum|w dy x|, then a few
     * 2^-53 and one float rounding each (a ulp apart at most): |d coef| <= (2u + 2 (C + 6) 2^-53) M,
     * M = r^3 / C sum |w dy x| (>= |coef|). dx = dx0 + (r w dy - x coef): within gamma(4) of its magnitude on each
     * side (fused or not), plus |x| |d coef|. dweight: C's sum over rows in row order, the GPU's in 16 groups then
     * their 16 partials (N / 16 + 16 + 1 additions deep), each term dy x r two roundings: the two within
     * (gamma(N + 2) + gamma(N / 16 + 19)) (|dw0| + sum |dy x r|). */
    double *dinp_bound = bounds(n_elements), *dweight_bound = bounds(C), *column = bounds(C);
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C, *dy = dout + (size_t)n * C;
        double r = rstd[n], magnitude = 0.0;
        for (int c = 0; c < C; c++) magnitude += fabs((double)weight[c] * dy[c] * x[c]);
        magnitude *= r * r * r / C;
        double dcoef = (2.0 * U + 2.0 * (C + 6) * 0x1p-53) * magnitude * (1.0 + 4 * U);
        for (int c = 0; c < C; c++) {
            size_t at = (size_t)n * C + c;
            double m = fabs((double)dinp0[at]) + fabs(r * weight[c] * dy[c]) + fabs((double)x[c]) * magnitude;
            dinp_bound[at] = 2.0 * gamma_n(4) * m + fabs((double)x[c]) * dcoef + UNDERFLOW;
            column[c] += fabs((double)dy[c] * x[c] * r);
        }
    }
    for (int c = 0; c < C; c++)
        dweight_bound[c] =
            (gamma_n(N + 2) + gamma_n(N / 16.0 + 19)) * (fabs((double)dweight0[c]) + column[c]) + UNDERFLOW;
    snprintf(name, sizeof name, "rmsnorm_backward dinp N=%d C=%d", N, C);
    compare(name, dinp, g_dinp, dinp_bound, n_elements);
    snprintf(name, sizeof name, "rmsnorm_backward dweight N=%d C=%d", N, C);
    compare(name, dweight, g_dweight, dweight_bound, C);

    device_free(d_inp), device_free(d_weight), device_free(d_out), device_free(d_rstd), device_free(d_dout);
    device_free(d_dinp), device_free(d_dweight), device_free(d_dresidual);
    free(inp), free(weight), free(dout), free(dinp), free(dweight), free(dinp0), free(dweight0), free(out), free(rstd);
    free(g_out), free(g_rstd), free(rstd_bound), free(out_bound), free(g_dinp), free(g_dweight), free(dinp_bound);
    free(dweight_bound), free(column), free(garbage);
}

/* ---- linear ---- */

static void check_linear(int N, int IC, int OC, int with_bias, int with_dinp) {
    char name[96];
    size_t n_in = (size_t)N * IC, n_out = (size_t)N * OC, n_w = (size_t)OC * IC;
    float *inp = random_floats(n_in, 20, 1.0f), *weight = random_floats(n_w, 21, 0.2f);
    float *bias = with_bias ? random_floats(OC, 22, 1.0f) : NULL;
    float *dout = random_floats(n_out, 23, 1.0f), *dinp = random_floats(n_in, 24, 0.5f);
    float *dweight = random_floats(n_w, 25, 0.5f), *dbias = random_floats(OC, 26, 0.5f);
    float *dinp0 = copy_floats(dinp, n_in), *dweight0 = copy_floats(dweight, n_w), *dbias0 = copy_floats(dbias, OC);
    float *nans = nan_floats(n_in);
    buffer d_inp = to_device(inp, n_in * 4), d_weight = to_device(weight, n_w * 4);
    buffer d_bias = with_bias ? to_device(bias, OC * 4) : device_alloc(4), d_out = device_alloc(n_out * 4);
    buffer d_dout = to_device(dout, n_out * 4), d_dinp = to_device(with_dinp ? nans : dinp, n_in * 4);
    buffer d_dweight = to_device(dweight, n_w * 4), d_dbias = to_device(dbias, OC * 4);

    float *out = host_alloc(n_out * 4);
    linear_forward(out, inp, weight, bias, N, IC, OC);
    gpu.linear_forward(&gpu, d_out.ptr, d_inp.ptr, d_weight.ptr, with_bias ? d_bias.ptr : NULL, N, IC, OC);
    float *g_out = from_device(d_out, n_out * 4);
    /* out = bias + sum_k inp w: IC products and IC additions (bias first or last): each device within
     * gamma(IC + 1) (|bias| + sum_k |inp w|), whatever order or fusion. */
    double *out_bound = bounds(n_out);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double m = with_bias ? fabs((double)bias[o]) : 0.0;
            for (int k = 0; k < IC; k++) m += fabs((double)inp[(size_t)n * IC + k] * weight[(size_t)o * IC + k]);
            out_bound[(size_t)n * OC + o] = 2.0 * gamma_n(IC + 1) * m + UNDERFLOW;
        }
    snprintf(name, sizeof name, "linear_forward N=%d IC=%d OC=%d%s", N, IC, OC, with_bias ? " bias" : "");
    compare(name, out, g_out, out_bound, n_out);

    linear_backward(with_dinp ? dinp : NULL, dweight, with_bias ? dbias : NULL, dout, inp, weight, N, IC, OC);
    gpu.linear_backward(&gpu, with_dinp ? d_dinp.ptr : NULL, d_dweight.ptr, with_bias ? d_dbias.ptr : NULL, d_dout.ptr,
                        d_inp.ptr, d_weight.ptr, N, IC, OC);
    float *g_dinp = from_device(d_dinp, n_in * 4), *g_dweight = from_device(d_dweight, n_w * 4);
    float *g_dbias = from_device(d_dbias, OC * 4);
    /* dinp = dout w (written over NaN on the GPU, other numbers on the CPU): a dot of OC, 2 gamma(OC) sum_o |dout w|.
     * dweight += dout^T inp: a dot of N, plus dweight0: 2 gamma(N + 1) (|dw0| + sum_n |dout inp|).
     * dbias += column sums of dout: the CPU row by row, the GPU in 16 groups (as RMSNorm's dweight). */
    double *dinp_bound = bounds(n_in), *dweight_bound = bounds(n_w), *dbias_bound = bounds(OC);
    for (int n = 0; n < N; n++)
        for (int k = 0; k < IC; k++) {
            double m = 0.0;
            for (int o = 0; o < OC; o++) m += fabs((double)dout[(size_t)n * OC + o] * weight[(size_t)o * IC + k]);
            dinp_bound[(size_t)n * IC + k] = 2.0 * gamma_n(OC) * m + UNDERFLOW;
        }
    for (int o = 0; o < OC; o++) {
        for (int k = 0; k < IC; k++) {
            double m = fabs((double)dweight0[(size_t)o * IC + k]);
            for (int n = 0; n < N; n++) m += fabs((double)dout[(size_t)n * OC + o] * inp[(size_t)n * IC + k]);
            dweight_bound[(size_t)o * IC + k] = 2.0 * gamma_n(N + 1) * m + UNDERFLOW;
        }
        double m = fabs((double)dbias0[o]);
        for (int n = 0; n < N; n++) m += fabs((double)dout[(size_t)n * OC + o]);
        dbias_bound[o] = (gamma_n(N + 1) + gamma_n(N / 16.0 + 18)) * m + UNDERFLOW;
    }
    if (with_dinp) {
        snprintf(name, sizeof name, "linear_backward dinp N=%d IC=%d OC=%d", N, IC, OC);
        compare(name, dinp, g_dinp, dinp_bound, n_in);
    } else {
        snprintf(name, sizeof name, "linear_backward dinp=NULL leaves it N=%d IC=%d OC=%d", N, IC, OC);
        compare(name, dinp0, g_dinp, NULL, n_in);
    }
    snprintf(name, sizeof name, "linear_backward dweight N=%d IC=%d OC=%d", N, IC, OC);
    compare(name, dweight, g_dweight, dweight_bound, n_w);
    if (with_bias) {
        snprintf(name, sizeof name, "linear_backward dbias N=%d IC=%d OC=%d", N, IC, OC);
        compare(name, dbias, g_dbias, dbias_bound, OC);
    }
    device_free(d_inp), device_free(d_weight), device_free(d_bias), device_free(d_out), device_free(d_dout);
    device_free(d_dinp), device_free(d_dweight), device_free(d_dbias);
    free(inp), free(weight), free(bias), free(dout), free(dinp), free(dweight), free(dbias), free(dinp0);
    free(dweight0), free(dbias0), free(out), free(g_out), free(out_bound), free(g_dinp), free(g_dweight), free(g_dbias);
    free(dinp_bound), free(dweight_bound), free(dbias_bound), free(nans);
}

/* ---- RoPE ---- */

static void check_rope(int B, int T, int H, int D) {
    char name[96];
    size_t count = (size_t)B * T * H * D, table = (size_t)T * D;
    float *cos_table = host_alloc(table * 4), *sin_table = host_alloc(table * 4);
    rope_tables(cos_table, sin_table, T, D, 1000000.0f);
    buffer d_cos = device_alloc(table * 4), d_sin = device_alloc(table * 4);
    gpu.rope_tables(&gpu, d_cos.ptr, d_sin.ptr, T, D, 1000000.0f);
    float *g_cos = from_device(d_cos, table * 4), *g_sin = from_device(d_sin, table * 4);
    snprintf(name, sizeof name, "rope_tables T=%d D=%d (made on the host: bits)", T, D);
    compare(name, cos_table, g_cos, NULL, table);
    compare("rope_tables sin (bits)", sin_table, g_sin, NULL, table);

    for (int direction = 1; direction >= -1; direction -= 2) {
        float *x = random_floats(count, 30 + direction, 2.0f), *x0 = copy_floats(x, count);
        buffer d_x = to_device(x, count * 4);
        if (direction > 0) {
            rope_forward(x, cos_table, sin_table, B, T, H, D);
            gpu.rope_forward(&gpu, d_x.ptr, d_cos.ptr, d_sin.ptr, B, T, H, D);
        } else {
            rope_backward(x, cos_table, sin_table, B, T, H, D);
            gpu.rope_backward(&gpu, d_x.ptr, d_cos.ptr, d_sin.ptr, B, T, H, D);
        }
        float *g_x = from_device(d_x, count * 4);
        /* Per pair: x1 c -+ x2 s and x2 c +- x1 s, two products and a sum (or one fused): gamma(2) of
         * |x1 c| + |x2 s| on each side. */
        double *bound = bounds(count);
        int half = D / 2;
        for (size_t head = 0; head < count / D; head++) {
            int t = (int)(head / H % T);
            for (int i = 0; i < half; i++) {
                double x1 = x0[head * D + i], x2 = x0[head * D + i + half];
                double c = cos_table[(size_t)t * D + i], s = sin_table[(size_t)t * D + i];
                double m = fabs(x1 * c) + fabs(x2 * s), m2 = fabs(x2 * c) + fabs(x1 * s);
                bound[head * D + i] = 2.0 * gamma_n(2) * m + UNDERFLOW;
                bound[head * D + i + half] = 2.0 * gamma_n(2) * m2 + UNDERFLOW;
            }
        }
        snprintf(name, sizeof name, "rope_%s B=%d T=%d H=%d D=%d", direction > 0 ? "forward" : "backward", B, T, H, D);
        compare(name, x, g_x, bound, count);
        device_free(d_x);
        free(x), free(x0), free(g_x), free(bound);
    }
    device_free(d_cos), device_free(d_sin);
    free(cos_table), free(sin_table), free(g_cos), free(g_sin);
}

/* ---- attention ---- */

/* A count the emulator keeps: EMULATOR_COUNT(emulator_work_count), kernel launches and cuBLAS calls queued, or
 * EMULATOR_COUNT(emulator_host_stop_count), the host's waits for the GPU (stops); 0 on a GPU, which has no such
 * counts (the checks on them are left out there). The batched attention (core/cuda/cuda_ops.cu) queues a fixed number
 * whatever B and H: a per-head loop coming back fails here. */
#ifdef FSDPLAB_CUDA_EMULATOR
#define EMULATOR_COUNT(count) count()
#else
#define EMULATOR_COUNT(count) 0ULL
#endif
static unsigned long long work_count(void) { return EMULATOR_COUNT(emulator_work_count); }

/* One count the emulator keeps (work queued, host waits) against the count expected; left out on a GPU. */
static void check_count(const char *what, unsigned long long counted, unsigned long long expected) {
#ifdef FSDPLAB_CUDA_EMULATOR
    checks++;
    failures += counted != expected;
    printf("%-58s %11llu %11llu %9s  %s\n", what, counted, expected, "-", counted == expected ? "PASS" : "FAIL");
#else
    (void)what, (void)counted, (void)expected;
#endif
}

static void check_work(const char *what, unsigned long long before, unsigned long long expected) {
    check_count(what, work_count() - before, expected);
}

static device cpu_device(void);
static float *random_bf16(size_t count, uint64_t stream, float scale);

/* The backward's recompute (attention_probs, attention_probs_bf16): each device's forward probs to the bit, the CPU's
 * into a buffer of other numbers, the GPU's into NaN from a scratch of NaN (so it reads nothing it did not write). */
static void check_probs_again(int B, int T, int H, int KVH, int D, int bf16, const float *probs, const float *g_probs,
                              const float *q, const float *k, buffer d_q, buffer d_k) {
    char name[160];
    device host = cpu_device();
    size_t n_p = (size_t)B * H * T * T, n_scratch = device_attention_backward_scratch_floats(B, T, H, KVH, D);
    float *again = random_floats(n_p, 47, 1.0f), *nans = nan_floats(n_p > n_scratch ? n_p : n_scratch);
    buffer d_again = to_device(nans, n_p * 4), d_scratch = to_device(nans, n_scratch * 4);
    if (bf16) host.attention_probs_bf16(&host, again, NULL, q, k, B, T, H, KVH, D);
    else host.attention_probs(&host, again, NULL, q, k, B, T, H, KVH, D);
    snprintf(name, sizeof name, "attention_probs%s = the forward's, CPU B=%d T=%d H=%d KVH=%d", bf16 ? "_bf16" : "",
             B, T, H, KVH);
    compare(name, probs, again, NULL, n_p);
    unsigned long long work = work_count();
    if (bf16) gpu.attention_probs_bf16(&gpu, d_again.ptr, d_scratch.ptr, d_q.ptr, d_k.ptr, B, T, H, KVH, D);
    else gpu.attention_probs(&gpu, d_again.ptr, d_scratch.ptr, d_q.ptr, d_k.ptr, B, T, H, KVH, D);
    snprintf(name, sizeof name, "attention_probs%s launches B=%d T=%d H=%d KVH=%d", bf16 ? "_bf16" : "", B, T, H, KVH);
    check_work(name, work, bf16 ? 5 : 4); /* q, k laid out; the scores' GEMM, (bf16: their scaling,) the softmax */
    float *g_again = from_device(d_again, n_p * 4);
    snprintf(name, sizeof name, "attention_probs%s = the forward's, GPU B=%d T=%d H=%d KVH=%d", bf16 ? "_bf16" : "",
             B, T, H, KVH);
    compare(name, g_probs, g_again, NULL, n_p);
    device_free(d_again);
    device_free(d_scratch);
    free(again), free(nans), free(g_again);
}

static void check_attention(int B, int T, int past, int H, int KVH, int D, float scale_qk) {
    char name[128];
    int keys = past + T, group = H / KVH;
    size_t n_q = (size_t)B * T * H * D, n_kv = (size_t)B * keys * KVH * D, n_p = (size_t)B * H * T * keys;
    float *q = random_floats(n_q, 40, scale_qk), *k = random_floats(n_kv, 41, scale_qk),
          *v = random_floats(n_kv, 42, 1.0f);
    buffer d_q = to_device(q, n_q * 4), d_k = to_device(k, n_kv * 4), d_v = to_device(v, n_kv * 4);
    buffer d_out = device_alloc(n_q * 4), d_probs = device_alloc(n_p * 4);
    buffer d_forward_scratch = device_alloc(device_attention_forward_scratch_floats(B, T, past, H, KVH, D, 0) * 4);
    float *out = host_alloc(n_q * 4), *probs = host_alloc(n_p * 4);
    attention_forward_at(out, probs, q, k, v, B, T, past, H, KVH, D);
    unsigned long long work = work_count();
    gpu.attention_forward_at(&gpu, d_out.ptr, d_probs.ptr, d_forward_scratch.ptr, d_q.ptr, d_k.ptr, d_v.ptr, B, T, past,
                             H, KVH, D);
    snprintf(name, sizeof name, "attention_forward_at launches B=%d T=%d past=%d H=%d KVH=%d", B, T, past, H, KVH);
    check_work(name, work, 7);
    device_free(d_forward_scratch);
    float *g_out = from_device(d_out, n_q * 4), *g_probs = from_device(d_probs, n_p * 4);
    if (past == 0) check_probs_again(B, T, H, KVH, D, 0, probs, g_probs, q, k, d_q, d_k);

    /* Scores s_j = scale q.k_j: a dot of D, then the scale (alpha): each device within gamma(D + 1) scale
     * sum_d |q k_j|, so the two within ds_j = 2 gamma(D + 1) scale sum |q k_j|. Softmax: p_j = exp(s_j - max) / S.
     * A change ds in the scores changes p_j by at most p_j (|ds_j| + sum_k p_k |ds_k|) <= 2 p_j max ds (first
     * order; times 1.01 for the rest). Each device's own rounding: s_j - max (u |s_j - max| in the exponent),
     * expf (2 EXP_ULPS u), and the same for every term of the sum S (relative: 2 EXP_ULPS u + u range, range =
     * max - min of the row's scores), the inverse and the product (2u): p_j (2 u range + (4 EXP_ULPS + 2) u) on
     * each side, twice that between them.
     * Masked entries are 0 on both. out = sum_j p_j v_j: the p differences times |v|, plus a dot of `keys` on
     * each side: sum_j (|dp_j| + 2 gamma(keys) p_j) |v_j|. */
    double scale = 1.0 / sqrt((double)D);
    double *p_bound = bounds(n_p), *out_bound = bounds(n_q);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int t = 0; t < T; t++) {
                const float *q_row = q + (((size_t)b * T + t) * H + h) * D;
                const float *p_row = probs + (((size_t)b * H + h) * T + t) * keys;
                int last = past + t;
                double max_ds = 0.0, max_s = -INFINITY, min_s = INFINITY;
                for (int j = 0; j <= last; j++) {
                    const float *k_row = k + (((size_t)b * keys + j) * KVH + h / group) * D;
                    double m = 0.0, s = 0.0;
                    for (int d = 0; d < D; d++) {
                        m += fabs((double)q_row[d] * k_row[d]);
                        s += (double)q_row[d] * k_row[d];
                    }
                    max_ds = fmax(max_ds, 2.0 * gamma_n(D + 1) * scale * m);
                    max_s = fmax(max_s, s * scale), min_s = fmin(min_s, s * scale);
                }
                double relative =
                    1.01 * (2.0 * max_ds + 2.0 * (2.0 * U * (max_s - min_s) + (4.0 * EXP_ULPS + 2.0) * U));
                double *pb = p_bound + (((size_t)b * H + h) * T + t) * keys;
                for (int j = 0; j <= last; j++) pb[j] = relative * p_row[j] + UNDERFLOW;
                for (int d = 0; d < D; d++) {
                    double m = 0.0;
                    for (int j = 0; j <= last; j++) {
                        double vj = fabs((double)v[(((size_t)b * keys + j) * KVH + h / group) * D + d]);
                        m += (pb[j] + 2.0 * gamma_n(keys) * p_row[j]) * vj;
                    }
                    out_bound[(((size_t)b * T + t) * H + h) * D + d] = m + UNDERFLOW;
                }
            }
    snprintf(name, sizeof name, "attention_forward_at probs B=%d T=%d past=%d H=%d KVH=%d D=%d", B, T, past, H, KVH, D);
    compare(name, probs, g_probs, p_bound, n_p);
    snprintf(name, sizeof name, "attention_forward_at out B=%d T=%d past=%d H=%d KVH=%d D=%d", B, T, past, H, KVH, D);
    compare(name, out, g_out, out_bound, n_q);

    if (past == 0) {
        /* The backward from the CPU's probs on both. dq, dk, dv are written: the GPU's start as NaN, the CPU's as
         * other numbers (nan_floats). */
        gpu.copy(&gpu, d_probs.ptr, probs, n_p * 4, DEVICE_H2D);
        float *dout = random_floats(n_q, 43, 1.0f), *dq = random_floats(n_q, 44, 0.5f);
        float *dk = random_floats(n_kv, 45, 0.5f), *dv = random_floats(n_kv, 46, 0.5f);
        float *nans = nan_floats(n_q);
        float *scratch = host_alloc((size_t)T * T * 4);
        buffer d_dout = to_device(dout, n_q * 4), d_dq = to_device(nans, n_q * 4), d_dk = to_device(nans, n_kv * 4);
        buffer d_dv = to_device(nans, n_kv * 4);
        buffer d_scratch = device_alloc(device_attention_backward_scratch_floats(B, T, H, KVH, D) * 4);
        attention_backward(dq, dk, dv, scratch, dout, probs, q, k, v, B, T, H, KVH, D);
        work = work_count();
        gpu.attention_backward(&gpu, d_dq.ptr, d_dk.ptr, d_dv.ptr, d_scratch.ptr, d_dout.ptr, d_probs.ptr, d_q.ptr,
                               d_k.ptr, d_v.ptr, B, T, H, KVH, D);
        snprintf(name, sizeof name, "attention_backward launches B=%d T=%d H=%d KVH=%d", B, T, H, KVH);
        check_work(name, work, 12);
        float *g_dq = from_device(d_dq, n_q * 4), *g_dk = from_device(d_dk, n_kv * 4),
              *g_dv = from_device(d_dv, n_kv * 4);
        /* dv = sum over the group's heads and t of p dout: under G (T + 1) additions deep on either side:
         * 2 gamma(G (T + 1)) sum |p dout|.
         * dp_tj = dout_t . v_j: within gamma(D) A_tj, A_tj = sum_d |dout v_j| on each side. ds_tj = p_tj (dp_tj -
         * dot_t), dot_t = sum_j p_tj dp_tj: the dp differences move ds by p_tj (|ddp_tj| + sum_j p_tj |ddp_tj|),
         * each side's own three roundings gamma(3) p_tj (|dp_tj| + |dot_t|).
         * dq = scale sum_j ds_tj k_j: scale sum_j |dds_tj| |k_j| + 2 gamma(T + 2) scale sum |ds k| (T + 1 roundings
         * at most). dk = sum over heads and t of scale ds_tj q_t: the same with G (T + 2). */
        size_t n_ds = (size_t)B * H * T * T;
        double *ds_bound = bounds(n_ds), *ds_magnitude = bounds(n_ds), *dp = bounds(T), *a = bounds(T);
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++)
                for (int t = 0; t < T; t++) {
                    const float *p_row = probs + (((size_t)b * H + h) * T + t) * T;
                    const float *do_row = dout + (((size_t)b * T + t) * H + h) * D;
                    double dot = 0.0, weighted = 0.0;
                    for (int j = 0; j <= t; j++) {
                        const float *v_row = v + (((size_t)b * T + j) * KVH + h / group) * D;
                        dp[j] = 0.0, a[j] = 0.0;
                        for (int d = 0; d < D; d++) {
                            dp[j] += (double)do_row[d] * v_row[d];
                            a[j] += fabs((double)do_row[d] * v_row[d]);
                        }
                        dot += p_row[j] * dp[j];
                        weighted += p_row[j] * 2.0 * gamma_n(D) * a[j];
                    }
                    for (int j = 0; j <= t; j++) {
                        size_t at = (((size_t)b * H + h) * T + t) * T + j;
                        ds_bound[at] = p_row[j] * (2.0 * gamma_n(D) * a[j] + weighted) * 1.01 +
                                       2.0 * gamma_n(3) * p_row[j] * (fabs(dp[j]) + fabs(dot)) + UNDERFLOW;
                        ds_magnitude[at] = fabs(p_row[j] * (dp[j] - dot)) + ds_bound[at];
                    }
                }
        double *dq_bound = bounds(n_q), *dk_bound = bounds(n_kv), *dv_bound = bounds(n_kv);
        double *dk_m = bounds(n_kv), *dk_e = bounds(n_kv), *dv_m = bounds(n_kv);
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++) {
                int kv = h / group;
                for (int t = 0; t < T; t++)
                    for (int d = 0; d < D; d++) {
                        double error = 0.0, magnitude = 0.0;
                        for (int j = 0; j <= t; j++) {
                            size_t at = (((size_t)b * H + h) * T + t) * T + j;
                            double kj = fabs((double)k[(((size_t)b * T + j) * KVH + kv) * D + d]);
                            error += scale * ds_bound[at] * kj;
                            magnitude += scale * ds_magnitude[at] * kj;
                        }
                        size_t qi = (((size_t)b * T + t) * H + h) * D + d;
                        dq_bound[qi] = error + 2.0 * gamma_n(T + 2) * magnitude + UNDERFLOW;
                    }
                for (int j = 0; j < T; j++)
                    for (int d = 0; d < D; d++) {
                        size_t ki = (((size_t)b * T + j) * KVH + kv) * D + d;
                        for (int t = j; t < T; t++) {
                            size_t at = (((size_t)b * H + h) * T + t) * T + j;
                            double qt = fabs((double)q[(((size_t)b * T + t) * H + h) * D + d]);
                            dk_e[ki] += scale * ds_bound[at] * qt;
                            dk_m[ki] += scale * ds_magnitude[at] * qt;
                            dv_m[ki] += fabs((double)probs[at] * dout[(((size_t)b * T + t) * H + h) * D + d]);
                        }
                    }
            }
        for (size_t i = 0; i < n_kv; i++) {
            dk_bound[i] = dk_e[i] + 2.0 * gamma_n((double)group * (T + 2)) * dk_m[i] + UNDERFLOW;
            dv_bound[i] = 2.0 * gamma_n((double)group * (T + 1)) * dv_m[i] + UNDERFLOW;
        }
        snprintf(name, sizeof name, "attention_backward dq B=%d T=%d H=%d KVH=%d D=%d", B, T, H, KVH, D);
        compare(name, dq, g_dq, dq_bound, n_q);
        snprintf(name, sizeof name, "attention_backward dk B=%d T=%d H=%d KVH=%d D=%d", B, T, H, KVH, D);
        compare(name, dk, g_dk, dk_bound, n_kv);
        snprintf(name, sizeof name, "attention_backward dv B=%d T=%d H=%d KVH=%d D=%d", B, T, H, KVH, D);
        compare(name, dv, g_dv, dv_bound, n_kv);
        device_free(d_dout), device_free(d_dq), device_free(d_dk), device_free(d_dv), device_free(d_scratch);
        free(dout), free(dq), free(dk), free(dv), free(nans), free(scratch), free(g_dq);
        free(g_dk), free(g_dv), free(ds_bound), free(ds_magnitude), free(dq_bound), free(dk_bound), free(dv_bound);
        free(dk_m), free(dk_e), free(dv_m), free(dp), free(a);
    }
    device_free(d_q), device_free(d_k), device_free(d_v), device_free(d_out), device_free(d_probs);
    free(q), free(k), free(v), free(out), free(probs), free(g_out), free(g_probs), free(p_bound), free(out_bound);
}

/* ---- SwiGLU ---- */

static void check_swiglu(int N, int width) {
    char name[96];
    size_t n_out = (size_t)N * width, n_in = 2 * n_out;
    float *gate_up = random_floats(n_in, 50, 6.0f), *dout = random_floats(n_out, 51, 1.0f);
    float *dgate_up = random_floats(n_in, 52, 0.5f), *nans = nan_floats(n_in); /* written: NaN on the GPU */
    buffer d_gate_up = to_device(gate_up, n_in * 4), d_out = device_alloc(n_out * 4);
    buffer d_dout = to_device(dout, n_out * 4), d_dgate_up = to_device(nans, n_in * 4);
    float *out = host_alloc(n_out * 4);
    swiglu_forward(out, gate_up, N, width);
    gpu.swiglu_forward(&gpu, d_out.ptr, d_gate_up.ptr, N, width);
    float *g_out = from_device(d_out, n_out * 4);
    swiglu_backward(dgate_up, dout, gate_up, N, width);
    gpu.swiglu_backward(&gpu, d_dgate_up.ptr, d_dout.ptr, d_gate_up.ptr, N, width);
    float *g_dgate_up = from_device(d_dgate_up, n_in * 4);
    /* sigmoid = 1 / (1 + expf(-g)): expf (2 EXP_ULPS u), the add (u, relative to a sum of positives), the
     * reciprocal (u correctly rounded; under -ffast-math GCC uses rcpps, 12 bits, refined by one Newton step: its
     * square 2.25u plus the step's roundings, within 7u): each side's s within gamma(2 EXP_ULPS + 8) s.
     * out = g s up: two more roundings: 2 gamma(2 EXP_ULPS + 10) |g s up|.
     * dgate = dy up s (1 + g (1 - s)): the s difference ds = 2 gamma(2 EXP_ULPS + 3) s moves it by
     * |dy up| ds (|F| + |g| s), F = 1 + g (1 - s); each side's roundings (1 - s, g *, 1 +, three products: 6, within
     * gamma(7)) on the magnitude |dy up s| (1 + |g| (1 + s)). dup = dy g s: |dy g| ds plus 2 gamma(3) |dy g s|. */
    double *out_bound = bounds(n_out), *d_bound = bounds(n_in);
    for (int n = 0; n < N; n++)
        for (int i = 0; i < width; i++) {
            size_t o = (size_t)n * width + i, gi = (size_t)n * 2 * width + i, ui = gi + width;
            double g = gate_up[gi], up = gate_up[ui], dy = dout[o];
            double s = 1.0 / (1.0 + exp(-g)), ds = 2.0 * gamma_n(2 * EXP_ULPS + 8) * s;
            double F = 1.0 + g * (1.0 - s);
            out_bound[o] = 2.0 * gamma_n(2 * EXP_ULPS + 10) * fabs(g * s * up) + UNDERFLOW;
            d_bound[gi] =
                fabs(dy * up) * ds * (fabs(F) + fabs(g) * s) +
                2.0 * gamma_n(7) * fabs(dy * up * s) * (1.0 + fabs(g) * (1.0 + s)) + UNDERFLOW;
            d_bound[ui] = fabs(dy * g) * ds + 2.0 * gamma_n(3) * fabs(dy * g * s) + UNDERFLOW;
        }
    snprintf(name, sizeof name, "swiglu_forward N=%d width=%d", N, width);
    compare(name, out, g_out, out_bound, n_out);
    snprintf(name, sizeof name, "swiglu_backward N=%d width=%d", N, width);
    compare(name, dgate_up, g_dgate_up, d_bound, n_in);
    device_free(d_gate_up), device_free(d_out), device_free(d_dout), device_free(d_dgate_up);
    free(gate_up), free(dout), free(dgate_up), free(nans), free(out), free(g_out), free(g_dgate_up);
    free(out_bound), free(d_bound);
}

/* ---- cross-entropy ---- */

static void check_cross_entropy(int N, int V, int ignore_every, float scale) {
    char name[128];
    const int ignore_index = -100;
    size_t count_all = (size_t)N * V;
    float *logits = random_floats(count_all, 60, scale);
    /* Spread logits: one far above the rest in each row, placed away from the first threads of a block, so a max
     * that missed it would overflow the exps. */
    if (scale >= 1000.0f)
        for (int n = 0; n < N; n++) logits[(size_t)n * V + (40 + 97 * n) % V] = 3.0f * scale;
    int *targets = host_alloc((size_t)N * sizeof(int));
    for (int n = 0; n < N; n++)
        targets[n] = ignore_every > 0 && n % ignore_every == ignore_every - 1 ? ignore_index
                                                                              : (int)(rng_bits(7, 61, n) % (uint64_t)V);
    buffer d_logits = to_device(logits, count_all * 4), d_targets = to_device(targets, (size_t)N * 4);
    buffer d_dlogits = device_alloc(count_all * 4);
    float *dlogits = host_alloc(count_all * 4);
    int count = -1, g_count = -2;
    float loss = cross_entropy_forward_backward(dlogits, logits, targets, N, V, ignore_index, &count);
    /* Poison the GPU's dlogits first: ignored rows must be written (zeros), not left. */
    float *poison = random_floats(count_all, 62, 100.0f);
    gpu.copy(&gpu, d_dlogits.ptr, poison, count_all * 4, DEVICE_H2D);
    float g_loss = gpu.cross_entropy_forward_backward(&gpu, d_dlogits.ptr, d_logits.ptr, d_targets.ptr, N, V,
                                                      ignore_index, &g_count);
    float *g_dlogits = from_device(d_dlogits, count_all * 4);
    /* Per row both compute the same float max and the same float differences x_j - max; the exps (double, within
     * 4 ulp each: glibc's vectorised exp, which -ffast-math may pick), their sum (double, V terms in different
     * orders: V 2^-53) and log (an ulp): log_sum within dL = (V + 16) 2^-52 (1 + |log_sum|) of each other. The
     * loss: the mean of the rows' (double, summed in two orders: N 2^-52), rounded to float once on each side:
     * 2u |loss| + max dL. dlogit_j = float(exp(x_j - log_sum)) * (1 / count): the log_sum
     * difference (relative dL in the exp), two float roundings and the inverse's on each side: p_j ic (dL + 6u);
     * the target's entry minus ic: one more rounding each (2u ic). Ignored rows: 0 on both. */
    double *d_bound = bounds(count_all), max_dl = 0.0, ic = count > 0 ? 1.0 / count : 0.0;
    for (int n = 0; n < N; n++) {
        if (targets[n] == ignore_index) continue;
        const float *row = logits + (size_t)n * V;
        float max_value = row[0];
        for (int j = 1; j < V; j++) max_value = km_max(max_value, row[j]);
        double sum = 0.0;
        for (int j = 0; j < V; j++) sum += exp((double)(row[j] - max_value));
        double log_sum = log(sum) + max_value, dl = (V + 16) * 0x1p-52 * (1.0 + fabs(log_sum));
        max_dl = fmax(max_dl, dl);
        for (int j = 0; j < V; j++) {
            double p = exp((double)row[j] - log_sum);
            d_bound[(size_t)n * V + j] =
                p * ic * (dl * 1.01 + 6.0 * U) + (j == targets[n] ? 2.0 * U * ic : 0.0) + UNDERFLOW;
        }
    }
    snprintf(name, sizeof name, "cross_entropy loss N=%d V=%d ignoring %s%d (count %d)", N, V,
             ignore_every > 0 ? "1 in " : "", ignore_every, count);
    double loss_bound = (2.0 * U + N * 0x1p-52) * fabs((double)loss) + max_dl * 1.01;
    compare(name, &loss, &g_loss, &loss_bound, 1);
    checks++;
    if (count != g_count) failures++;
    snprintf(name, sizeof name, "cross_entropy count N=%d V=%d", N, V);
    printf("%-58s %11d %11s %9s  %s\n", name, g_count - count, "0", "-", count == g_count ? "PASS" : "FAIL");
    snprintf(name, sizeof name, "cross_entropy dlogits N=%d V=%d", N, V);
    compare(name, dlogits, g_dlogits, d_bound, count_all);
    device_free(d_logits), device_free(d_targets), device_free(d_dlogits);
    free(logits), free(targets), free(dlogits), free(poison), free(g_dlogits), free(d_bound);
}

/* ---- the loss slots: the loss kept on the device, read once a step ---- */

static unsigned long long host_wait_count(void) { return EMULATOR_COUNT(emulator_host_stop_count); }

/* The host's waits for the GPU since `before` (the emulator's stops: a poll until an event completes is one wait, as
 * a synchronize is), counted by the emulator (like check_work: left out on a GPU). */
static void check_waits(const char *what, unsigned long long before, unsigned long long expected) {
    check_count(what, host_wait_count() - before, expected);
}

/* A check of exact equality between two doubles (printed as their difference). */
static void check_exact(const char *what, double got, double expected) {
    checks++;
    failures += got != expected;
    printf("%-58s %11.3g %11s %9s  %s\n", what, got - expected, "0", "-", got == expected ? "PASS" : "FAIL");
}

/* cross_entropy_to_slot against the device's own cross_entropy_forward_backward (checked against the CPU above): the
 * same loss added into the slot as (double)mean * count (twice into one slot: they add), the same count, the same
 * dlogits times the scale with one float rounding, then rounded to dlogits_dtype (bits: the host's x * scale of the
 * unscaled ones, then dtype_round_to); 3 launches (the scale and the rounding fused into the loss's pass, no kernel
 * after it) and no host wait; loss_slots_read then reads two slots with one host wait and zeroes them (a second read
 * gives zeros), leaving its neighbour untouched. */
static void check_loss_slots(int N, int V, int ignore_every, float dlogits_scale, dtype dlogits_dtype) {
    char name[128];
    const int ignore_index = -100, slot = 5;
    size_t count_all = (size_t)N * V;
    float *logits = random_floats(count_all, 63, 3.0f);
    int *targets = host_alloc((size_t)N * sizeof(int));
    for (int n = 0; n < N; n++)
        targets[n] = ignore_every > 0 && n % ignore_every == 0 ? ignore_index : (int)(rng_bits(7, 64, n) % (uint64_t)V);
    buffer d_logits = to_device(logits, count_all * 4), d_targets = to_device(targets, (size_t)N * 4);
    buffer d_dlogits = device_alloc(count_all * 4);
    int count = -1;
    float loss = gpu.cross_entropy_forward_backward(&gpu, d_dlogits.ptr, d_logits.ptr, d_targets.ptr, N, V,
                                                    ignore_index, &count);
    float *unscaled = from_device(d_dlogits, count_all * 4);
    for (size_t i = 0; i < count_all; i++) unscaled[i] *= dlogits_scale;
    dtype_round_to(unscaled, count_all, dlogits_dtype);
    unsigned long long work = work_count(), waits = host_wait_count();
    gpu.cross_entropy_to_slot(&gpu, d_dlogits.ptr, d_logits.ptr, DTYPE_FLOAT32, d_targets.ptr, N, V, ignore_index,
                              dlogits_scale, dlogits_dtype, slot);
    snprintf(name, sizeof name, "cross_entropy_to_slot launches N=%d V=%d (scale, %s fused)", N, V,
             dtype_name(dlogits_dtype));
    check_work(name, work, 3);
    snprintf(name, sizeof name, "cross_entropy_to_slot host waits N=%d V=%d", N, V);
    check_waits(name, waits, 0);
    float *g_dlogits = from_device(d_dlogits, count_all * 4);
    snprintf(name, sizeof name, "cross_entropy_to_slot dlogits x %g as %s N=%d V=%d (bits)", dlogits_scale,
             dtype_name(dlogits_dtype), N, V);
    compare(name, unscaled, g_dlogits, NULL, count_all);
    gpu.cross_entropy_to_slot(&gpu, NULL, d_logits.ptr, DTYPE_FLOAT32, d_targets.ptr, N, V, ignore_index,
                              dlogits_scale, dlogits_dtype, slot);
    gpu.cross_entropy_to_slot(&gpu, NULL, d_logits.ptr, DTYPE_FLOAT32, d_targets.ptr, N, V, ignore_index,
                              dlogits_scale, dlogits_dtype, slot + 1);
    double sums[3] = {-1.0, -1.0, -1.0}, counts[3] = {-1.0, -1.0, -1.0};
    waits = host_wait_count();
    gpu.loss_slots_read(&gpu, sums, counts, slot, 2);
    check_waits("loss_slots_read of 2 slots: host waits", waits, 1);
    double one = (double)loss * count;
    snprintf(name, sizeof name, "loss slot N=%d V=%d: two losses added (sum)", N, V);
    check_exact(name, sums[0], one + one);
    snprintf(name, sizeof name, "loss slot N=%d V=%d: two losses added (count)", N, V);
    check_exact(name, counts[0], 2.0 * count);
    snprintf(name, sizeof name, "loss slot N=%d V=%d: its neighbour's one loss (sum)", N, V);
    check_exact(name, sums[1], one);
    snprintf(name, sizeof name, "loss slot N=%d V=%d: its neighbour's one loss (count)", N, V);
    check_exact(name, counts[1], (double)count);
    gpu.loss_slots_read(&gpu, sums, counts, slot - 1, 3);
    snprintf(name, sizeof name, "loss slots %d .. %d after their read: zero", slot - 1, slot + 1);
    check_exact(name, fabs(sums[0]) + fabs(sums[1]) + fabs(sums[2]) + counts[0] + counts[1] + counts[2], 0.0);
    device_free(d_logits), device_free(d_targets), device_free(d_dlogits);
    free(logits), free(targets), free(unscaled), free(g_dlogits);
}

/* The head's rounding done by the loss (LOSS_CHUNK under bfloat16 compute): cross_entropy_to_slot with logits_dtype
 * bfloat16 on float32 sums that are not bfloat16 values gives, on each device, the loss and dlogits it gives from
 * those sums rounded first (bits: the rounding is the same function, done as each logit is read), in the same 3
 * launches; and linear_forward_bf16_sums, rounded, is linear_forward_bf16 (bits, 1 launch where that takes 2). */
static void check_rounded_logits(int N, int V, int C, int ignore_every) {
    char name[128];
    const int ignore_index = -100;
    size_t count_all = (size_t)N * V;
    device host = cpu_device();
    float *logits = random_floats(count_all, 65, 4.0f), *rounded = copy_floats(logits, count_all);
    dtype_round_to(rounded, count_all, DTYPE_BFLOAT16);
    int *targets = host_alloc((size_t)N * sizeof(int));
    for (int n = 0; n < N; n++)
        targets[n] = ignore_every > 0 && n % ignore_every == 0 ? ignore_index : (int)(rng_bits(8, 64, n) % (uint64_t)V);
    float *read = host_alloc(count_all * 4), *first = host_alloc(count_all * 4);
    host.cross_entropy_to_slot(&host, read, logits, DTYPE_BFLOAT16, targets, N, V, ignore_index, 0.5f, DTYPE_BFLOAT16,
                               0);
    host.cross_entropy_to_slot(&host, first, rounded, DTYPE_FLOAT32, targets, N, V, ignore_index, 0.5f,
                               DTYPE_BFLOAT16, 1);
    double sums[2], counts[2];
    host.loss_slots_read(&host, sums, counts, 0, 2);
    snprintf(name, sizeof name, "CPU loss, logits rounded as read = rounded first N=%d V=%d", N, V);
    check_exact(name, sums[0], sums[1]);
    snprintf(name, sizeof name, "CPU dlogits, logits rounded as read = rounded first (bits)");
    compare(name, first, read, NULL, count_all);
    buffer d_logits = to_device(logits, count_all * 4), d_rounded = to_device(rounded, count_all * 4);
    buffer d_targets = to_device(targets, (size_t)N * 4), d_read = device_alloc(count_all * 4);
    buffer d_first = device_alloc(count_all * 4);
    unsigned long long work = work_count();
    gpu.cross_entropy_to_slot(&gpu, d_read.ptr, d_logits.ptr, DTYPE_BFLOAT16, d_targets.ptr, N, V, ignore_index, 0.5f,
                              DTYPE_BFLOAT16, 0);
    snprintf(name, sizeof name, "cross_entropy_to_slot launches, logits rounded as read");
    check_work(name, work, 3);
    gpu.cross_entropy_to_slot(&gpu, d_first.ptr, d_rounded.ptr, DTYPE_FLOAT32, d_targets.ptr, N, V, ignore_index,
                              0.5f, DTYPE_BFLOAT16, 1);
    gpu.loss_slots_read(&gpu, sums, counts, 0, 2);
    snprintf(name, sizeof name, "GPU loss, logits rounded as read = rounded first N=%d V=%d", N, V);
    check_exact(name, sums[0], sums[1]);
    float *g_read = from_device(d_read, count_all * 4), *g_first = from_device(d_first, count_all * 4);
    snprintf(name, sizeof name, "GPU dlogits, logits rounded as read = rounded first (bits)");
    compare(name, g_first, g_read, NULL, count_all);

    /* the head's GEMM: its sums, rounded, are linear_forward_bf16's output, on each device */
    float *inp = random_bf16((size_t)N * C, 66, 1.0f), *weight = random_bf16((size_t)V * C, 67, 0.1f);
    host.linear_forward_bf16_sums(&host, read, inp, weight, N, C, V);
    host.linear_forward_bf16(&host, first, inp, weight, NULL, N, C, V);
    dtype_round_to(read, count_all, DTYPE_BFLOAT16);
    snprintf(name, sizeof name, "CPU linear_forward_bf16_sums, rounded = linear_forward_bf16 (bits)");
    compare(name, first, read, NULL, count_all);
    buffer d_inp = to_device(inp, (size_t)N * C * 4), d_weight = to_device(weight, (size_t)V * C * 4);
    work = work_count();
    gpu.linear_forward_bf16_sums(&gpu, d_read.ptr, d_inp.ptr, d_weight.ptr, N, C, V);
    check_work("linear_forward_bf16_sums launches (the GEMM alone)", work, 1);
    gpu.linear_forward_bf16(&gpu, d_first.ptr, d_inp.ptr, d_weight.ptr, NULL, N, C, V);
    free(g_read), free(g_first);
    g_read = from_device(d_read, count_all * 4), g_first = from_device(d_first, count_all * 4);
    dtype_round_to(g_read, count_all, DTYPE_BFLOAT16);
    snprintf(name, sizeof name, "GPU linear_forward_bf16_sums, rounded = linear_forward_bf16 (bits)");
    compare(name, g_first, g_read, NULL, count_all);
    device_free(d_logits), device_free(d_rounded), device_free(d_targets), device_free(d_read), device_free(d_first);
    device_free(d_inp), device_free(d_weight);
    free(logits), free(rounded), free(targets), free(read), free(first), free(g_read), free(g_first), free(inp);
    free(weight);
}

/* ---- vectors ---- */

static void check_vectors(size_t count) {
    char name[96];
    float *x = random_floats(count, 70, 3.0f), *y = random_floats(count, 71, 1.0f);
    buffer d_x = to_device(x, count * 4), d_y = to_device(y, count * 4);

    /* out += inp, x *= factor: one correctly rounded operation per element on both sides: bits. */
    add_inplace(x, y, count);
    gpu.add_inplace(&gpu, d_x.ptr, d_y.ptr, count);
    float *g_x = from_device(d_x, count * 4);
    snprintf(name, sizeof name, "add_inplace count=%zu (bits)", count);
    compare(name, x, g_x, NULL, count);
    for (size_t i = 0; i < count; i++) x[i] *= 0.3f;
    gpu.scale(&gpu, d_x.ptr, 0.3f, count);
    free(g_x);
    g_x = from_device(d_x, count * 4);
    snprintf(name, sizeof name, "scale count=%zu (bits)", count);
    compare(name, x, g_x, NULL, count);

    /* out = bf16(bf16(out) + bf16(inp)) (add_bf16, kernel_math.h's km_bf16_add_rounded on both): bits, on values
     * that are not bfloat16 values yet (so both roundings of the inputs are exercised) and on ones that are. */
    float *sum16 = copy_floats(x, count);
    const char *kinds[2] = {"", " of bfloat16 values"};
    for (int k = 0; k < 2; k++) { /* x + y, then that sum added to itself */
        add_bf16(sum16, k == 0 ? y : sum16, count);
        gpu.add_inplace_bf16(&gpu, d_x.ptr, k == 0 ? d_y.ptr : d_x.ptr, count);
        free(g_x);
        g_x = from_device(d_x, count * 4);
        snprintf(name, sizeof name, "add_inplace_bf16%s count=%zu (bits)", kinds[k], count);
        compare(name, sum16, g_x, NULL, count);
    }
    memcpy(x, sum16, count * sizeof(float));
    free(sum16);

    /* out += bfloat16 widened (exact), then one float32 add: bits. The CPU device's accumulate is the reference. */
    bf16 *h = malloc(count * sizeof *h);
    if (h == NULL) abort();
    for (size_t i = 0; i < count; i++) h[i] = bf16_from_float(y[i] * 0.7f);
    buffer d_h = to_device(h, count * sizeof *h);
    device host;
    device_cpu_init(&host);
    const void *host_inputs[2] = {h, y}, *gpu_inputs[2] = {d_h.ptr, d_y.ptr};
    const dtype types[2] = {DTYPE_BFLOAT16, DTYPE_FLOAT32};
    for (int k = 0; k < 2; k++) {
        host.accumulate(&host, x, host_inputs[k], types[k], count);
        gpu.accumulate(&gpu, d_x.ptr, gpu_inputs[k], types[k], count);
        free(g_x);
        g_x = from_device(d_x, count * 4);
        snprintf(name, sizeof name, "accumulate %s count=%zu (bits)", dtype_name(types[k]), count);
        compare(name, x, g_x, NULL, count);
    }
    device_free(d_h);
    free(h);

    /* Sums in double of exact squares (or |x|) in two orders: each within (count - 1) 2^-53 of the exact sum:
     * the two within 2 count 2^-53 sum. */
    double squares = 0.0, absolutes = 0.0;
    for (size_t i = 0; i < count; i++) squares += (double)x[i] * x[i], absolutes += fabs((double)x[i]);
    double g_squares = gpu.sum_squares(&gpu, d_x.ptr, count), g_absolutes = gpu.sum_abs(&gpu, d_x.ptr, count);
    double bound_squares = 2.0 * count * 0x1p-53 * squares, bound_abs = 2.0 * count * 0x1p-53 * absolutes;
    checks += 2;
    int ok_squares = fabs(squares - g_squares) <= bound_squares, ok_abs = fabs(absolutes - g_absolutes) <= bound_abs;
    failures += !ok_squares + !ok_abs;
    snprintf(name, sizeof name, "sum_squares count=%zu", count);
    printf("%-58s %11.3e %11.3e %9.3f  %s\n", name, fabs(squares - g_squares), bound_squares,
           bound_squares > 0 ? fabs(squares - g_squares) / bound_squares : 0.0, ok_squares ? "PASS" : "FAIL");
    snprintf(name, sizeof name, "sum_abs count=%zu", count);
    printf("%-58s %11.3e %11.3e %9.3f  %s\n", name, fabs(absolutes - g_absolutes), bound_abs,
           bound_abs > 0 ? fabs(absolutes - g_absolutes) / bound_abs : 0.0, ok_abs ? "PASS" : "FAIL");

    /* first_nonfinite: none, then an inf and a NaN planted (the earlier one wins), exact indices. */
    size_t places[3] = {count, count > 3 ? count * 2 / 3 : count - 1, count > 3 ? count / 3 + 1 : 0};
    for (int plant = 0; plant < 3; plant++) {
        if (plant == 1) x[places[1]] = INFINITY;
        if (plant == 2) x[places[2]] = NAN;
        if (plant > 0) gpu.copy(&gpu, d_x.ptr, x, count * 4, DEVICE_H2D);
        size_t want = count;
        for (size_t i = 0; i < count; i++)
            if (!isfinite(x[i])) {
                want = i;
                break;
            }
        size_t got = gpu.first_nonfinite(&gpu, d_x.ptr, count);
        checks++;
        failures += got != want;
        snprintf(name, sizeof name, "first_nonfinite count=%zu (%s)", count,
                 plant == 0   ? "none"
                 : plant == 1 ? "inf"
                              : "inf, NaN before");
        printf("%-58s %11s %11s %9s  %s (want %zu, got %zu)\n", name, got == want ? "0" : "differ", "0", "-",
               got == want ? "PASS" : "FAIL", want, got);
        /* first_nonfinite_of: three arrays, the first two finite ones (a prefix and an empty one), then x: the
         * index of x's array when x holds a planted value, else 3 */
        size_t clean = places[2] > 0 ? places[2] : 0;
        const float *arrays[3] = {d_x.ptr, d_x.ptr, d_x.ptr};
        size_t counts[3] = {clean, 0, count};
        int want_of = want < count ? 2 : 3, got_of = gpu.first_nonfinite_of(&gpu, arrays, counts, 3);
        checks++;
        failures += got_of != want_of;
        printf("%-58s %11s %11s %9s  %s (want %d, got %d)\n", "first_nonfinite_of: the same, third of three arrays",
               got_of == want_of ? "0" : "differ", "0", "-", got_of == want_of ? "PASS" : "FAIL", want_of, got_of);
    }

    /* Casts and rounding, the shared RNE (kernel_math.h): bits. Inputs with ties and NaN/inf included. */
    uint32_t *bits = host_alloc(count * 4);
    for (size_t i = 0; i < count; i++) bits[i] = (uint32_t)rng_bits(7, 72, i);
    for (size_t i = 0; i < count; i += 5) bits[i] = (bits[i] & 0xffff0000u) | 0x8000u; /* ties */
    buffer d_bits = to_device(bits, count * 4), d_low = device_alloc(count * 2), d_wide = device_alloc(count * 4);
    bf16 *low = host_alloc(count * 2);
    float *wide = host_alloc(count * 4), *rounded = host_alloc(count * 4);
    dtype_convert(low, DTYPE_BFLOAT16, bits, DTYPE_FLOAT32, count);
    gpu.convert(&gpu, d_low.ptr, DTYPE_BFLOAT16, d_bits.ptr, DTYPE_FLOAT32, count);
    bf16 *g_low = from_device(d_low, count * 2);
    snprintf(name, sizeof name, "convert float32 -> bfloat16 count=%zu (bits)", count);
    compare_exact_bytes(name, low, g_low, count * 2);
    dtype_convert(wide, DTYPE_FLOAT32, low, DTYPE_BFLOAT16, count);
    gpu.convert(&gpu, d_wide.ptr, DTYPE_FLOAT32, d_low.ptr, DTYPE_BFLOAT16, count);
    float *g_wide = from_device(d_wide, count * 4);
    snprintf(name, sizeof name, "convert bfloat16 -> float32 count=%zu (bits)", count);
    compare_exact_bytes(name, wide, g_wide, count * 4);
    gpu.convert(&gpu, d_wide.ptr, DTYPE_FLOAT32, d_bits.ptr, DTYPE_FLOAT32, count);
    free(g_wide);
    g_wide = from_device(d_wide, count * 4);
    snprintf(name, sizeof name, "convert float32 -> float32 count=%zu (a copy, bits)", count);
    compare_exact_bytes(name, bits, g_wide, count * 4);
    memcpy(rounded, bits, count * 4);
    dtype_round_to(rounded, count, DTYPE_BFLOAT16);
    gpu.round_to(&gpu, d_bits.ptr, count, DTYPE_BFLOAT16);
    float *g_rounded = from_device(d_bits, count * 4);
    snprintf(name, sizeof name, "round_to bfloat16 count=%zu (bits)", count);
    compare_exact_bytes(name, rounded, g_rounded, count * 4);
    gpu.round_to(&gpu, d_bits.ptr, count, DTYPE_FLOAT32);
    free(g_rounded);
    g_rounded = from_device(d_bits, count * 4);
    snprintf(name, sizeof name, "round_to float32 count=%zu (nothing changes, bits)", count);
    compare_exact_bytes(name, rounded, g_rounded, count * 4);

    device_free(d_x), device_free(d_y), device_free(d_bits), device_free(d_low), device_free(d_wide);
    free(x), free(y), free(g_x), free(bits), free(low), free(wide), free(rounded), free(g_low), free(g_wide);
    free(g_rounded);
}

/* ---- FSDP2's rank-major copies ---- */

/* rows_copy on a made-up unit of param_count parameters (d0 from 1 to 13 rows, so at `world` ranks some pieces are
 * short and some all padding; rows of 1 to 5 elements) between its full buffer and the rank-major slices of ranks
 * [first_rank, first_rank + ranks): the copy-in (full -> slices, rounded to `type`, padding zeroed) and the copy-out
 * (slices -> full, widened), each to the bit against the CPU device on buffers filled alike beforehand (the slices
 * and the full buffer with all-ones bytes, NaN in either type: an element a device leaves alone stays NaN on both, one
 * it writes must agree). With every rank, the copy-out of the copy-in gives the full buffer back (rounded to `type`),
 * a check of the mapping itself. The GPU launches once per 32 parameters (kernels.cuh's KERNELS_ROWS_PARAMS). */
static void check_rows_copy(int param_count, int world, int first_rank, int ranks, dtype type) {
    char name[160];
    device host = cpu_device();
    device_rows_param *params = host_alloc((size_t)param_count * sizeof *params);
    size_t numel = 0, sharded_numel = 0, element = dtype_size(type);
    for (int i = 0; i < param_count; i++) {
        size_t rows = 1 + (size_t)(i * 7) % 13, row_numel = 1 + (size_t)i % 5, shard_rows = (rows + world - 1) / world;
        params[i] = (device_rows_param){numel, rows * row_numel, sharded_numel, shard_rows * row_numel};
        numel += rows * row_numel;
        sharded_numel += shard_rows * row_numel;
    }
    size_t slices_bytes = (size_t)ranks * sharded_numel * element;
    float *full = random_floats(numel, 80, 2.0f);
    void *slices = host_alloc(slices_bytes);
    memset(slices, 0xff, slices_bytes);
    buffer d_full = to_device(full, numel * 4), d_slices = to_device(slices, slices_bytes);

    unsigned long long work = work_count();
    host.rows_copy(&host, slices, type, full, 0, params, param_count, sharded_numel, first_rank, ranks);
    gpu.rows_copy(&gpu, d_slices.ptr, type, d_full.ptr, 0, params, param_count, sharded_numel, first_rank, ranks);
    snprintf(name, sizeof name, "rows_copy in: %d params, ranks %d-%d/%d, %s (launches)", param_count, first_rank,
             first_rank + ranks - 1, world, dtype_name(type));
    check_work(name, work, (unsigned long long)(param_count + 31) / 32);
    void *g_slices = from_device(d_slices, slices_bytes);
    snprintf(name, sizeof name, "rows_copy in: %d params, ranks %d-%d/%d, %s (bits)", param_count, first_rank,
             first_rank + ranks - 1, world, dtype_name(type));
    compare_exact_bytes(name, slices, g_slices, slices_bytes);

    float *back = host_alloc(numel * 4);
    memset(back, 0xff, numel * 4);
    buffer d_back = to_device(back, numel * 4);
    host.rows_copy(&host, slices, type, back, 1, params, param_count, sharded_numel, first_rank, ranks);
    gpu.rows_copy(&gpu, d_slices.ptr, type, d_back.ptr, 1, params, param_count, sharded_numel, first_rank, ranks);
    float *g_back = from_device(d_back, numel * 4);
    snprintf(name, sizeof name, "rows_copy out: %d params, ranks %d-%d/%d, %s (bits)", param_count, first_rank,
             first_rank + ranks - 1, world, dtype_name(type));
    compare_exact_bytes(name, back, g_back, numel * 4);
    if (first_rank == 0 && ranks == world) {
        dtype_round_to(full, numel, type);
        snprintf(name, sizeof name, "rows_copy out of in = rounded input: %d params, %s", param_count,
                 dtype_name(type));
        compare_exact_bytes(name, full, g_back, numel * 4);
    }
    device_free(d_full), device_free(d_slices), device_free(d_back);
    free(params), free(full), free(slices), free(g_slices), free(back), free(g_back);
}

/* ---- AdamW ---- */

static void check_adamw(size_t count, int step, float lerp_weight) {
    char name[96];
    float *param = random_floats(count, 80, 1.0f), *grad = random_floats(count, 81, 0.05f);
    float *exp_avg = random_floats(count, 82, 0.01f), *exp_avg_sq = random_floats(count, 83, 1e-4f);
    for (size_t i = 0; i < count; i++) exp_avg_sq[i] = fabsf(exp_avg_sq[i]);
    for (size_t i = 0; i < count; i += 97) param[i] = grad[i] = 0.0f; /* padding-like zeros */
    buffer d_param = to_device(param, count * 4), d_grad = to_device(grad, count * 4);
    buffer d_m = to_device(exp_avg, count * 4), d_v = to_device(exp_avg_sq, count * 4);
    /* The scalars as core/fsdp/optim.c derives them (lr 1e-3, betas 0.9 / 0.999, eps 1e-8, weight decay 0.01). */
    double lr = 1e-3, beta1 = 0.9, beta2 = 0.999;
    adamw_kernel_scalars s = {
        .decay = (float)(1.0 - lr * 0.01),
        .lerp_weight = lerp_weight,
        .beta2 = (float)beta2,
        .one_minus_beta2 = (float)(1.0 - beta2),
        .bias_correction2_sqrt = (float)pow(1.0 - pow(beta2, step), 0.5),
        .eps = 1e-8f,
        .negative_step_size = (float)(-lr / (1.0 - pow(beta1, step))),
    };
    /* The CPU: core/fsdp/optim.c's loop body, kernel_math.h's element (this file is built without contraction,
     * -std=c11, as optim.c is with -ffp-contract=off: the same bits). */
    for (size_t i = 0; i < count; i++) {
        km_adamw_result r =
            km_adamw_element(param[i], grad[i], exp_avg[i], exp_avg_sq[i], s.decay, s.lerp_weight, s.beta2,
                             s.one_minus_beta2, s.bias_correction2_sqrt, s.eps, s.negative_step_size);
        param[i] = r.param, exp_avg[i] = r.exp_avg, exp_avg_sq[i] = r.exp_avg_sq;
    }
    gpu.adamw_update(&gpu, d_param.ptr, d_grad.ptr, d_m.ptr, d_v.ptr, count, &s);
    float *g_param = from_device(d_param, count * 4), *g_m = from_device(d_m, count * 4),
          *g_v = from_device(d_v, count * 4);
    snprintf(name, sizeof name, "adamw_update param count=%zu step=%d w=%g (bits)", count, step, lerp_weight);
    compare(name, param, g_param, NULL, count);
    snprintf(name, sizeof name, "adamw_update exp_avg (bits)");
    compare(name, exp_avg, g_m, NULL, count);
    snprintf(name, sizeof name, "adamw_update exp_avg_sq (bits)");
    compare(name, exp_avg_sq, g_v, NULL, count);
    device_free(d_param), device_free(d_grad), device_free(d_m), device_free(d_v);
    free(param), free(grad), free(exp_avg), free(exp_avg_sq), free(g_param), free(g_m), free(g_v);
}

/* ---- the layers in bfloat16 (core/kernels/layers_bf16.h): intervals that hold both devices' values ----
 *
 * Both devices run each bfloat16 layer on the same bfloat16 inputs and round at the same places (kernel_math.h's
 * km_bf16_* on both), but take their float32 sums in other orders (the GPU's GEMMs on bfloat16 tensor cores), and on
 * a GPU expf is CUDA's. So the check follows every value of a layer, element by element, as an interval [lo, hi]
 * that holds what either device can compute there:
 *   - an input is a point (a bfloat16 value);
 *   - one correctly rounded float32 operation (a product, a sum, a quotient: each device rounds the exact result
 *     once, km_mul_unfused keeping nvcc from fusing) maps the exact result's range through the rounding, which is
 *     monotone: [fl(lo), fl(hi)]; from points it gives a point: both devices' bits;
 *   - a sum of K terms in any order (a GEMM, a column or a row sum) is within gamma(K) sum |terms| of the exact sum
 *     (Higham §3.1) with unit u for float32, 2^-53 for double, and 2u per addition for the tensor cores' float32
 *     accumulation (they may truncate the aligned addends: Blanchard et al. 2020; on the emulator it is OpenBLAS's u);
 *     the products of two bfloat16 values are exact in float32 (8 + 8 significant bits), so only the additions err;
 *   - a rounding to bfloat16 maps [lo, hi] to [bf16(lo), bf16(hi)] (monotone again): a point whenever no bfloat16
 *     rounding boundary lies inside, and then both devices hold the same bits from there on.
 * The check is |cpu - gpu| <= hi - lo at every output element: bit equality wherever the float32 differences could
 * not reach a rounding boundary, and one bfloat16 ulp of the result (2^-8 relative, or the few ulps a flipped
 * rounding upstream carries) on the elements where they could: the table's name says on how many of them ("flip
 * possible at F of N"), which is about sum_i (hi - lo before the rounding) / ulp_i, small. The intervals are
 * computed here in double from the inputs, before either device runs, with 2^-50 relative slack for this program's
 * own double roundings. Element-wise layers with no sums (RoPE) give points everywhere: bit equality. SwiGLU too on
 * the emulator (both devices call glibc's scalar expf there); on a GPU expf may differ by EXP_ULPS, which the
 * intervals carry. */

/* SwiGLU's expf: layers_bf16.c (no -ffast-math) calls glibc's scalar expf, and so do the emulator's kernels: the
 * same bits; CUDA's expf on a GPU. The softmax's expf is layers.c's (-ffast-math: maybe glibc's vectorised one) on
 * the CPU: EXP_ULPS on either device everywhere. */
#ifdef FSDPLAB_CUDA_EMULATOR
#define SWIGLU_EXP_SPREAD 0.0
#define GEMM_UNIT U /* OpenBLAS's sgemm on both sides: float32 additions */
#else
#define SWIGLU_EXP_SPREAD (2.0 * EXP_ULPS * U)
#define GEMM_UNIT (2.0 * U) /* the tensor cores' float32 accumulation may truncate: 2u per addition */
#endif
#define SOFTMAX_EXP_SPREAD (2.0 * EXP_ULPS * U)
#define DOUBLE_UNIT 0x1p-53

typedef struct interval {
    double lo, hi;
} interval;

static interval point(double x) { return (interval){x, x}; }
/* The nearest float (through a volatile: the conversion must happen, whatever the optimizer folds). */
static double nearest_float(double x) {
    volatile float f = (float)x;
    return f;
}
/* The float32 value either device holds when the exact result lies in [lo, hi]. */
static interval fl32(double lo, double hi) {
    return (interval){nearest_float(lo - fabs(lo) * 0x1p-50), nearest_float(hi + fabs(hi) * 0x1p-50)};
}
static interval iv_round16(interval a) { return (interval){km_bf16_round((float)a.lo), km_bf16_round((float)a.hi)}; }
static interval hull4(double a, double b, double c, double d) {
    return (interval){fmin(fmin(a, b), fmin(c, d)), fmax(fmax(a, b), fmax(c, d))};
}
static interval exact_mul(interval a, interval b) {
    return hull4(a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi);
}
/* One float32 operation: from two points, the operation itself in float (this file is ISO C11: no contraction),
 * the bits both devices get; else the exact range's float32 image. */
static int is_point(interval a) { return a.lo == a.hi; }
static interval iv_mul(interval a, interval b) {
    if (is_point(a) && is_point(b)) return point((float)a.lo * (float)b.lo);
    interval p = exact_mul(a, b);
    return fl32(p.lo, p.hi);
}
static interval iv_add(interval a, interval b) {
    if (is_point(a) && is_point(b)) return point((float)a.lo + (float)b.lo);
    return fl32(a.lo + b.lo, a.hi + b.hi);
}
static interval iv_sub(interval a, interval b) {
    if (is_point(a) && is_point(b)) return point((float)a.lo - (float)b.lo);
    return fl32(a.lo - b.hi, a.hi - b.lo);
}
/* a / b for b > 0 */
static interval iv_div(interval a, interval b) {
    if (is_point(a) && is_point(b)) return point((float)a.lo / (float)b.lo);
    interval q = hull4(a.lo / b.lo, a.lo / b.hi, a.hi / b.lo, a.hi / b.hi);
    return fl32(q.lo, q.hi);
}
/* expf of a float interval, either device's within `spread` (relative) of the host's. */
static interval iv_expf(interval a, double spread) {
    if (is_point(a) && spread == 0.0) return point(expf((float)a.lo));
    return fl32(expf((float)a.lo) * (1.0 - spread), expf((float)a.hi) * (1.0 + spread));
}
static double width(interval a) { return a.hi - a.lo; }

/* A sum of terms (intervals), the exact sum's range and its magnitude sum |term|. */
typedef struct interval_sum {
    double lo, hi, magnitude;
} interval_sum;
static void sum_add(interval_sum *s, interval term) {
    s->lo += term.lo, s->hi += term.hi, s->magnitude += fmax(fabs(term.lo), fabs(term.hi));
}
/* Either device's sum of `additions` additions in any order, each within `unit`: gamma(additions) magnitude
 * around the exact range (and additions 2^-53 magnitude for this program's own double sums), plus 2^-126 per
 * addition for a product or partial sum below FLT_MIN that a device rounds or flushes to zero (tensor cores may);
 * a sum of zeros is zero on any device. */
static interval sum_result(interval_sum s, double additions, double unit) {
    double g = additions * unit / (1.0 - additions * unit);
    double radius = s.magnitude > 0.0 ? (g + additions * 0x1p-53) * s.magnitude + additions * 0x1p-126 : 0.0;
    return (interval){s.lo - radius, s.hi + radius};
}
static interval sum_float(interval_sum s, double additions, double unit) {
    interval r = sum_result(s, additions, unit);
    return fl32(r.lo, r.hi);
}

/* Random inputs rounded to bfloat16 values (the layers' premise; the emulator refuses a GEMM of others). */
static float *random_bf16(size_t count, uint64_t stream, float scale) {
    float *x = random_floats(count, stream, scale);
    dtype_round_to(x, count, DTYPE_BFLOAT16);
    return x;
}

/* compare() with the intervals' widths as bounds, naming at how many elements the bound is not 0 (for a bfloat16
 * output: where a rounding could flip; elsewhere the check is bit equality). */
static void compare_intervals(const char *what, const float *cpu, const float *gpu_values, const interval *expected,
                              size_t count) {
    double *bound = bounds(count);
    size_t flips = 0;
    for (size_t i = 0; i < count; i++) {
        bound[i] = width(expected[i]);
        flips += bound[i] > 0.0;
    }
    char name[160];
    snprintf(name, sizeof name, "%s (bound > 0 at %zu of %zu)", what, flips, count);
    compare(name, cpu, gpu_values, bound, count);
    free(bound);
}

static interval *intervals(size_t count) {
    interval *x = host_alloc((count > 0 ? count : 1) * sizeof(interval));
    for (size_t i = 0; i < count; i++) x[i] = point(0.0);
    return x;
}

static device cpu_device(void) {
    device host;
    device_cpu_init(&host);
    return host;
}

/* ---- linear in bfloat16 ---- */

static void check_linear_bf16(int N, int IC, int OC, int with_bias, int with_dinp) {
    char name[128];
    device host = cpu_device();
    size_t n_in = (size_t)N * IC, n_out = (size_t)N * OC, n_w = (size_t)OC * IC;
    float *inp = random_bf16(n_in, 120, 1.0f), *weight = random_bf16(n_w, 121, 0.2f);
    float *bias = with_bias ? random_bf16(OC, 122, 1.0f) : NULL;
    float *dout = random_bf16(n_out, 123, 1.0f), *dinp = random_bf16(n_in, 124, 0.5f);
    float *dweight = random_floats(n_w, 125, 0.5f), *dbias = random_floats(OC, 126, 0.5f);
    float *dinp0 = copy_floats(dinp, n_in), *dweight0 = copy_floats(dweight, n_w), *dbias0 = copy_floats(dbias, OC);
    float *nans = nan_floats(n_in);
    buffer d_inp = to_device(inp, n_in * 4), d_weight = to_device(weight, n_w * 4);
    buffer d_bias = with_bias ? to_device(bias, OC * 4) : device_alloc(4), d_out = device_alloc(n_out * 4);
    buffer d_dout = to_device(dout, n_out * 4), d_dinp = to_device(with_dinp ? nans : dinp, n_in * 4);
    buffer d_dweight = to_device(dweight, n_w * 4), d_dbias = to_device(dbias, OC * 4);

    float *out = host_alloc(n_out * 4);
    host.linear_forward_bf16(&host, out, inp, weight, bias, N, IC, OC);
    gpu.linear_forward_bf16(&gpu, d_out.ptr, d_inp.ptr, d_weight.ptr, with_bias ? d_bias.ptr : NULL, N, IC, OC);
    float *g_out = from_device(d_out, n_out * 4);
    /* out = bf16(bias + sum_k inp w): IC exact products, IC additions (the bias added by beta on the GPU). */
    interval *out_iv = intervals(n_out);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            interval_sum s = {0, 0, 0};
            if (with_bias) sum_add(&s, point(bias[o]));
            for (int k = 0; k < IC; k++)
                sum_add(&s, point((double)inp[(size_t)n * IC + k] * weight[(size_t)o * IC + k]));
            out_iv[(size_t)n * OC + o] = iv_round16(sum_float(s, IC + 1, GEMM_UNIT));
        }
    snprintf(name, sizeof name, "linear_forward_bf16 N=%d IC=%d OC=%d%s", N, IC, OC, with_bias ? " bias" : "");
    compare_intervals(name, out, g_out, out_iv, n_out);

    host.linear_backward_bf16(&host, with_dinp ? dinp : NULL, dweight, with_bias ? dbias : NULL, dout, inp, weight, N,
                              IC, OC);
    gpu.linear_backward_bf16(&gpu, with_dinp ? d_dinp.ptr : NULL, d_dweight.ptr, with_bias ? d_dbias.ptr : NULL,
                             d_dout.ptr, d_inp.ptr, d_weight.ptr, N, IC, OC);
    float *g_dinp = from_device(d_dinp, n_in * 4), *g_dweight = from_device(d_dweight, n_w * 4);
    float *g_dbias = from_device(d_dbias, OC * 4);
    /* dinp = bf16(sum_o dout w): OC terms, written (over NaN on the GPU). dweight = dweight0 + sum_n dout inp
     * (float32, not rounded): N + 1 terms. dbias = dbias0 + column sums of dout: the CPU row by row (N additions),
     * the GPU 16 row groups and their 16 partials (N / 16 + 16): within N + 16 additions' gamma either way. */
    interval *dinp_iv = intervals(n_in), *dweight_iv = intervals(n_w), *dbias_iv = intervals(OC);
    for (int n = 0; n < N; n++)
        for (int k = 0; k < IC; k++) {
            interval_sum s = {0, 0, 0};
            for (int o = 0; o < OC; o++)
                sum_add(&s, point((double)dout[(size_t)n * OC + o] * weight[(size_t)o * IC + k]));
            dinp_iv[(size_t)n * IC + k] = iv_round16(sum_float(s, OC, GEMM_UNIT));
        }
    for (int o = 0; o < OC; o++) {
        for (int k = 0; k < IC; k++) {
            interval_sum s = {0, 0, 0};
            sum_add(&s, point(dweight0[(size_t)o * IC + k]));
            for (int n = 0; n < N; n++)
                sum_add(&s, point((double)dout[(size_t)n * OC + o] * inp[(size_t)n * IC + k]));
            dweight_iv[(size_t)o * IC + k] = sum_float(s, N + 1, GEMM_UNIT);
        }
        interval_sum s = {0, 0, 0};
        sum_add(&s, point(dbias0[o]));
        for (int n = 0; n < N; n++) sum_add(&s, point(dout[(size_t)n * OC + o]));
        dbias_iv[o] = sum_float(s, N + 16, U);
    }
    if (with_dinp) {
        snprintf(name, sizeof name, "linear_backward_bf16 dinp N=%d IC=%d OC=%d", N, IC, OC);
        compare_intervals(name, dinp, g_dinp, dinp_iv, n_in);
    } else {
        snprintf(name, sizeof name, "linear_backward_bf16 dinp=NULL leaves it N=%d IC=%d OC=%d", N, IC, OC);
        compare(name, dinp0, g_dinp, NULL, n_in);
    }
    snprintf(name, sizeof name, "linear_backward_bf16 dweight N=%d IC=%d OC=%d", N, IC, OC);
    compare_intervals(name, dweight, g_dweight, dweight_iv, n_w);
    if (with_bias) {
        snprintf(name, sizeof name, "linear_backward_bf16 dbias N=%d IC=%d OC=%d", N, IC, OC);
        compare_intervals(name, dbias, g_dbias, dbias_iv, OC);
    }
    device_free(d_inp), device_free(d_weight), device_free(d_bias), device_free(d_out), device_free(d_dout);
    device_free(d_dinp), device_free(d_dweight), device_free(d_dbias);
    free(inp), free(weight), free(bias), free(dout), free(dinp), free(dweight), free(dbias), free(dinp0), free(nans);
    free(dweight0), free(dbias0), free(out), free(g_out), free(out_iv), free(g_dinp), free(g_dweight), free(g_dbias);
    free(dinp_iv), free(dweight_iv), free(dbias_iv);
}

/* Two stacked modules' input gradient: dinp = bf16(bf16(dout_1 w_1) + bf16(dout_2 w_2)), each an OC-term GEMM. */
static void check_linear_stacked_bf16(int N, int IC, int OC) {
    char name[128];
    device host = cpu_device();
    size_t n_in = (size_t)N * IC, n_out = (size_t)N * 2 * OC, n_w = (size_t)2 * OC * IC;
    float *weight = random_bf16(n_w, 127, 0.2f), *dout = random_bf16(n_out, 128, 1.0f);
    float *dinp = random_floats(n_in, 129, 9.0f), *scratch = host_alloc(n_in * 4); /* overwritten */
    buffer d_weight = to_device(weight, n_w * 4), d_dout = to_device(dout, n_out * 4);
    buffer d_dinp = to_device(dinp, n_in * 4), d_scratch = device_alloc(n_in * 4);
    host.linear_backward_input_stacked_bf16(&host, dinp, scratch, dout, weight, N, IC, OC);
    gpu.linear_backward_input_stacked_bf16(&gpu, d_dinp.ptr, d_scratch.ptr, d_dout.ptr, d_weight.ptr, N, IC, OC);
    float *g_dinp = from_device(d_dinp, n_in * 4);
    interval *dinp_iv = intervals(n_in);
    for (int n = 0; n < N; n++)
        for (int k = 0; k < IC; k++) {
            interval part[2];
            for (int m = 0; m < 2; m++) {
                interval_sum s = {0, 0, 0};
                for (int o = 0; o < OC; o++)
                    sum_add(&s, point((double)dout[(size_t)n * 2 * OC + (size_t)m * OC + o] *
                                      weight[((size_t)m * OC + o) * IC + k]));
                part[m] = iv_round16(sum_float(s, OC, GEMM_UNIT));
            }
            dinp_iv[(size_t)n * IC + k] = iv_round16(iv_add(part[0], part[1]));
        }
    snprintf(name, sizeof name, "linear_backward_input_stacked_bf16 N=%d IC=%d OC=%d", N, IC, OC);
    compare_intervals(name, dinp, g_dinp, dinp_iv, n_in);
    device_free(d_weight), device_free(d_dout), device_free(d_dinp), device_free(d_scratch);
    free(weight), free(dout), free(dinp), free(scratch), free(g_dinp), free(dinp_iv);
}

/* ---- RMSNorm in bfloat16 ---- */

static void check_rmsnorm_bf16(int N, int C, float scale) {
    char name[128];
    device host = cpu_device();
    size_t n_elements = (size_t)N * C;
    float eps = 1e-6f;
    float *inp = random_bf16(n_elements, 130, scale), *weight = random_bf16(C, 131, 1.5f);
    float *dout = random_bf16(n_elements, 132, 1.0f), *dinp = random_bf16(n_elements, 133, 0.5f);
    float *dweight = random_floats(C, 134, 0.5f);
    float *dinp0 = copy_floats(dinp, n_elements), *dweight0 = copy_floats(dweight, C);
    buffer d_inp = to_device(inp, n_elements * 4), d_weight = to_device(weight, C * 4);
    buffer d_out = device_alloc(n_elements * 4), d_rstd = device_alloc((size_t)N * 4);
    /* dinp: as check_rmsnorm's, the GPU's overwritten from a separate dresidual, the CPU's accumulated in place */
    float *garbage = random_bf16(n_elements, 135, 0.5f);
    buffer d_dout = to_device(dout, n_elements * 4), d_dinp = to_device(garbage, n_elements * 4);
    buffer d_dweight = to_device(dweight, C * 4), d_dresidual = to_device(dinp, n_elements * 4);
    float *out = host_alloc(n_elements * 4), *rstd = host_alloc((size_t)N * 4);
    host.rmsnorm_forward_bf16(&host, out, rstd, inp, weight, N, C, eps);
    gpu.rmsnorm_forward_bf16(&gpu, d_out.ptr, d_rstd.ptr, d_inp.ptr, d_weight.ptr, N, C, eps);
    float *g_out = from_device(d_out, n_elements * 4), *g_rstd = from_device(d_rstd, (size_t)N * 4);
    /* rstd = float(1 / sqrt(S / C + eps)), S the double sum of the exact squares (C additions, double): decreasing
     * in S, the three double operations within 8 2^-53 (generous: layers.c's may be reassociated by -ffast-math);
     * out = bf16(w bf16(x r)): two products, two roundings, from r's interval. */
    interval *rstd_iv = intervals(N), *out_iv = intervals(n_elements);
    for (int n = 0; n < N; n++) {
        interval_sum s = {0, 0, 0};
        for (int c = 0; c < C; c++) sum_add(&s, point(km_square(inp[(size_t)n * C + c])));
        interval squares = sum_result(s, C, DOUBLE_UNIT);
        double slack = 1.0 + 8.0 * DOUBLE_UNIT;
        rstd_iv[n] = fl32(1.0 / sqrt(squares.hi / C + (double)eps) / slack,
                          1.0 / sqrt(squares.lo / C + (double)eps) * slack);
        for (int c = 0; c < C; c++) {
            size_t at = (size_t)n * C + c;
            out_iv[at] = iv_round16(iv_mul(point(weight[c]), iv_round16(iv_mul(point(inp[at]), rstd_iv[n]))));
        }
    }
    snprintf(name, sizeof name, "rmsnorm_forward_bf16 rstd N=%d C=%d", N, C);
    compare_intervals(name, rstd, g_rstd, rstd_iv, N);
    snprintf(name, sizeof name, "rmsnorm_forward_bf16 out N=%d C=%d", N, C);
    compare_intervals(name, out, g_out, out_iv, n_elements);

    /* Backward from the CPU's rstd on both (copied over the GPU's): r is a point. */
    gpu.copy(&gpu, d_rstd.ptr, rstd, (size_t)N * 4, DEVICE_H2D);
    host.rmsnorm_backward_bf16(&host, dinp, dinp, dweight, dout, inp, weight, rstd, N, C);
    gpu.rmsnorm_backward_bf16(&gpu, d_dinp.ptr, d_dresidual.ptr, d_dweight.ptr, d_dout.ptr, d_inp.ptr, d_weight.ptr,
                              d_rstd.ptr, N, C);
    float *g_dinp = from_device(d_dinp, n_elements * 4), *g_dweight = from_device(d_dweight, C * 4);
    /* dh = bf16(dy w): a point. dot = sum_c dh x in double (exact terms, C additions); coefficient =
     * float(dot r r r / C), four double operations (and this program's three for r^3 / C: 8 2^-53 more); dinp =
     * bf16(dinp0 + bf16(r dh - x coef)). dweight = dweight0 + bf16(float(sum_n bf16(dy bf16(x r)))): the terms points,
     * the double sum over N rows (the GPU's in 16 groups and their partials: N + 16 additions). */
    interval *dinp_iv = intervals(n_elements), *dweight_iv = intervals(C);
    for (int n = 0; n < N; n++) {
        interval r = point(rstd[n]);
        interval_sum s = {0, 0, 0};
        for (int c = 0; c < C; c++) {
            size_t at = (size_t)n * C + c;
            sum_add(&s, point((double)km_bf16_rmsnorm_dh(dout[at], weight[c]) * inp[at]));
        }
        interval dot = sum_result(s, C, DOUBLE_UNIT);
        double factor = (double)rstd[n] * rstd[n] * rstd[n] / C, slack = 8.0 * DOUBLE_UNIT;
        interval coefficient = hull4(dot.lo * factor, dot.hi * factor, dot.lo * factor, dot.hi * factor);
        coefficient =
            fl32(coefficient.lo - fabs(coefficient.lo) * slack, coefficient.hi + fabs(coefficient.hi) * slack);
        for (int c = 0; c < C; c++) {
            size_t at = (size_t)n * C + c;
            interval dh = point(km_bf16_rmsnorm_dh(dout[at], weight[c]));
            interval norm = iv_round16(iv_sub(iv_mul(r, dh), iv_mul(point(inp[at]), coefficient)));
            dinp_iv[at] = iv_round16(iv_add(point(dinp0[at]), norm));
        }
    }
    for (int c = 0; c < C; c++) {
        interval_sum s = {0, 0, 0};
        for (int n = 0; n < N; n++) {
            size_t at = (size_t)n * C + c;
            sum_add(&s, point(km_bf16_rmsnorm_dweight_term(dout[at], inp[at], rstd[n])));
        }
        interval column = sum_result(s, N + 16, DOUBLE_UNIT);
        dweight_iv[c] = iv_add(point(dweight0[c]), iv_round16(fl32(column.lo, column.hi)));
    }
    snprintf(name, sizeof name, "rmsnorm_backward_bf16 dinp N=%d C=%d", N, C);
    compare_intervals(name, dinp, g_dinp, dinp_iv, n_elements);
    snprintf(name, sizeof name, "rmsnorm_backward_bf16 dweight N=%d C=%d", N, C);
    compare_intervals(name, dweight, g_dweight, dweight_iv, C);
    device_free(d_inp), device_free(d_weight), device_free(d_out), device_free(d_rstd), device_free(d_dout);
    device_free(d_dinp), device_free(d_dweight), device_free(d_dresidual);
    free(inp), free(weight), free(dout), free(dinp), free(dweight), free(dinp0), free(dweight0), free(out), free(rstd);
    free(g_out), free(g_rstd), free(rstd_iv), free(out_iv), free(g_dinp), free(g_dweight), free(dinp_iv);
    free(dweight_iv), free(garbage);
}

/* ---- the residual add and the norm in one pass, and the norm's backward without a residual ----
 * residual_rmsnorm_forward is add_inplace (then round_to in bfloat16) and rmsnorm_forward in one kernel: the same
 * operations in the same order on each element and the same block reduction per row, so its three outputs equal the
 * two calls' in bits (the norm against the CPU is check_rmsnorm's and check_rmsnorm_bf16's); the residual equals the
 * CPU's in bits (one float addition, one rounding). One launch where there were two (three in bfloat16). The
 * backward without a residual (NULL) writes what it writes over a zero residual, in bits, with the 2 launches of
 * the norm's backward (the copy of the residual gradient it replaces is gone). */
static void check_residual_rmsnorm(int N, int C, int bf16) {
    char name[128];
    device host = cpu_device();
    size_t n_elements = (size_t)N * C;
    float eps = 1e-6f;
    const char *kind = bf16 ? "_bf16" : "";
    float *residual = random_floats(n_elements, 140, 3.0f), *inp = random_floats(n_elements, 141, 3.0f);
    float *weight = random_floats(C, 142, 1.5f), *dout = random_floats(n_elements, 143, 1.0f);
    if (bf16) {
        dtype_round_to(residual, n_elements, DTYPE_BFLOAT16), dtype_round_to(inp, n_elements, DTYPE_BFLOAT16);
        dtype_round_to(weight, C, DTYPE_BFLOAT16), dtype_round_to(dout, n_elements, DTYPE_BFLOAT16);
    }
    buffer d_fused = to_device(residual, n_elements * 4), d_apart = to_device(residual, n_elements * 4);
    buffer d_inp = to_device(inp, n_elements * 4), d_weight = to_device(weight, C * 4);
    buffer d_out = device_alloc(n_elements * 4), d_out_apart = device_alloc(n_elements * 4);
    buffer d_rstd = device_alloc((size_t)N * 4), d_rstd_apart = device_alloc((size_t)N * 4);
    unsigned long long work = work_count();
    (bf16 ? gpu.residual_rmsnorm_forward_bf16 : gpu.residual_rmsnorm_forward)(&gpu, d_fused.ptr, d_out.ptr,
                                                                               d_rstd.ptr, d_inp.ptr, d_weight.ptr, N,
                                                                               C, eps);
    snprintf(name, sizeof name, "residual_rmsnorm_forward%s launches N=%d C=%d", kind, N, C);
    check_work(name, work, 1);
    gpu.add_inplace(&gpu, d_apart.ptr, d_inp.ptr, n_elements);
    if (bf16) gpu.round_to(&gpu, d_apart.ptr, n_elements, DTYPE_BFLOAT16);
    (bf16 ? gpu.rmsnorm_forward_bf16 : gpu.rmsnorm_forward)(&gpu, d_out_apart.ptr, d_rstd_apart.ptr, d_apart.ptr,
                                                            d_weight.ptr, N, C, eps);
    float *g_fused = from_device(d_fused, n_elements * 4), *g_apart = from_device(d_apart, n_elements * 4);
    float *g_out = from_device(d_out, n_elements * 4), *g_out_apart = from_device(d_out_apart, n_elements * 4);
    float *g_rstd = from_device(d_rstd, (size_t)N * 4), *g_rstd_apart = from_device(d_rstd_apart, (size_t)N * 4);
    snprintf(name, sizeof name, "residual_rmsnorm_forward%s residual = add's N=%d C=%d (bits)", kind, N, C);
    compare(name, g_apart, g_fused, NULL, n_elements);
    snprintf(name, sizeof name, "residual_rmsnorm_forward%s out = rmsnorm's N=%d C=%d (bits)", kind, N, C);
    compare(name, g_out_apart, g_out, NULL, n_elements);
    snprintf(name, sizeof name, "residual_rmsnorm_forward%s rstd = rmsnorm's N=%d C=%d (bits)", kind, N, C);
    compare(name, g_rstd_apart, g_rstd, NULL, N);
    float *out = host_alloc(n_elements * 4), *rstd = host_alloc((size_t)N * 4);
    (bf16 ? host.residual_rmsnorm_forward_bf16 : host.residual_rmsnorm_forward)(&host, residual, out, rstd, inp,
                                                                                 weight, N, C, eps);
    snprintf(name, sizeof name, "residual_rmsnorm_forward%s residual = CPU's N=%d C=%d (bits)", kind, N, C);
    compare(name, residual, g_fused, NULL, n_elements);

    /* backward from the GPU's forward: no residual (NULL) against a zeroed one */
    float *garbage = random_floats(n_elements, 144, 1.0f);
    buffer d_dout = to_device(dout, n_elements * 4), d_zero = device_alloc(n_elements * 4);
    buffer d_dinp = to_device(garbage, n_elements * 4), d_dinp_zero = device_alloc(n_elements * 4);
    buffer d_dweight = device_alloc(C * 4), d_dweight_zero = device_alloc(C * 4);
    gpu.zero(&gpu, d_zero.ptr, n_elements * 4), gpu.zero(&gpu, d_dweight.ptr, C * 4);
    gpu.zero(&gpu, d_dweight_zero.ptr, C * 4);
    work = work_count();
    (bf16 ? gpu.rmsnorm_backward_bf16 : gpu.rmsnorm_backward)(&gpu, d_dinp.ptr, NULL, d_dweight.ptr, d_dout.ptr,
                                                              d_fused.ptr, d_weight.ptr, d_rstd.ptr, N, C);
    snprintf(name, sizeof name, "rmsnorm_backward%s without residual: launches N=%d C=%d", kind, N, C);
    check_work(name, work, 2);
    (bf16 ? gpu.rmsnorm_backward_bf16 : gpu.rmsnorm_backward)(&gpu, d_dinp_zero.ptr, d_zero.ptr, d_dweight_zero.ptr,
                                                              d_dout.ptr, d_fused.ptr, d_weight.ptr, d_rstd.ptr, N, C);
    float *g_dinp = from_device(d_dinp, n_elements * 4), *g_dinp_zero = from_device(d_dinp_zero, n_elements * 4);
    snprintf(name, sizeof name, "rmsnorm_backward%s without residual = zero's N=%d C=%d (bits)", kind, N, C);
    compare(name, g_dinp_zero, g_dinp, NULL, n_elements);

    device_free(d_fused), device_free(d_apart), device_free(d_inp), device_free(d_weight), device_free(d_out);
    device_free(d_out_apart), device_free(d_rstd), device_free(d_rstd_apart), device_free(d_dout), device_free(d_zero);
    device_free(d_dinp), device_free(d_dinp_zero), device_free(d_dweight), device_free(d_dweight_zero);
    free(residual), free(inp), free(weight), free(dout), free(g_fused), free(g_apart), free(g_out), free(g_out_apart);
    free(g_rstd), free(g_rstd_apart), free(out), free(rstd), free(garbage), free(g_dinp), free(g_dinp_zero);
}

/* ---- RoPE in bfloat16: products and sums rounded one by one, no reductions: bits ----
 * Twice: with layers.h's tables (HF's layout: the two halves of a row hold equal values) and with random tables
 * whose halves differ, so that a kernel reading the other half's cos or sin is seen too. */

static void check_rope_bf16(int B, int T, int H, int D) {
    char name[128];
    device host = cpu_device();
    size_t count = (size_t)B * T * H * D, table = (size_t)T * D;
    for (int random_tables = 0; random_tables <= 1; random_tables++) {
        float *cos_table = random_floats(table, 137, 1.0f), *sin_table = random_floats(table, 138, 1.0f);
        if (!random_tables) rope_tables(cos_table, sin_table, T, D, 1000000.0f);
        buffer d_cos = to_device(cos_table, table * 4), d_sin = to_device(sin_table, table * 4);
        for (int backward = 0; backward <= 1; backward++) {
            float *x = random_bf16(count, 135 + backward, 2.0f);
            buffer d_x = to_device(x, count * 4);
            if (backward) {
                host.rope_backward_bf16(&host, x, cos_table, sin_table, B, T, H, D);
                gpu.rope_backward_bf16(&gpu, d_x.ptr, d_cos.ptr, d_sin.ptr, B, T, H, D);
            } else {
                host.rope_forward_bf16(&host, x, cos_table, sin_table, B, T, H, D);
                gpu.rope_forward_bf16(&gpu, d_x.ptr, d_cos.ptr, d_sin.ptr, B, T, H, D);
            }
            float *g_x = from_device(d_x, count * 4);
            snprintf(name, sizeof name, "rope_%s_bf16 B=%d T=%d H=%d D=%d%s (bits)", backward ? "backward" : "forward",
                     B, T, H, D, random_tables ? " random tables" : "");
            compare(name, x, g_x, NULL, count);
            device_free(d_x);
            free(x), free(g_x);
        }
        device_free(d_cos), device_free(d_sin);
        free(cos_table), free(sin_table);
    }
}

/* ---- attention in bfloat16 ---- */

static void check_attention_bf16(int B, int T, int past, int H, int KVH, int D, float scale_qk) {
    char name[160];
    device host = cpu_device();
    int keys = past + T, group = H / KVH;
    size_t n_q = (size_t)B * T * H * D, n_kv = (size_t)B * keys * KVH * D, n_p = (size_t)B * H * T * keys;
    float *q = random_bf16(n_q, 140, scale_qk), *k = random_bf16(n_kv, 141, scale_qk), *v = random_bf16(n_kv, 142, 1);
    buffer d_q = to_device(q, n_q * 4), d_k = to_device(k, n_kv * 4), d_v = to_device(v, n_kv * 4);
    buffer d_out = device_alloc(n_q * 4), d_probs = device_alloc(n_p * 4);
    size_t forward_scratch = device_attention_forward_scratch_floats(B, T, past, H, KVH, D, 1);
    size_t backward_scratch = device_attention_backward_scratch_floats(B, T, H, KVH, D);
    buffer d_scratch = device_alloc((forward_scratch > backward_scratch ? forward_scratch : backward_scratch) * 4);
    float *out = host_alloc(n_q * 4), *probs = host_alloc(n_p * 4), *scratch = host_alloc((size_t)T * keys * 4);
    host.attention_forward_bf16(&host, out, probs, scratch, q, k, v, B, T, past, H, KVH, D);
    unsigned long long work = work_count();
    gpu.attention_forward_bf16(&gpu, d_out.ptr, d_probs.ptr, d_scratch.ptr, d_q.ptr, d_k.ptr, d_v.ptr, B, T, past, H,
                               KVH, D);
    snprintf(name, sizeof name, "attention_forward_bf16 launches B=%d T=%d past=%d H=%d KVH=%d", B, T, past, H, KVH);
    check_work(name, work, 9);
    float *g_out = from_device(d_out, n_q * 4), *g_probs = from_device(d_probs, n_p * 4);
    if (past == 0) check_probs_again(B, T, H, KVH, D, 1, probs, g_probs, q, k, d_q, d_k);
    /* Per row of a head: s_j = bf16(bf16(q.k_j) scale) (a D-term GEMM, two roundings); the float32 softmax:
     * max (exact of the s's), e_j = expf(fl(s_j - max)), S = their double sum (keys additions), p_j =
     * fl(e_j fl(1 / S)); saved float32 probs; out = bf16(sum_j bf16(p_j) v_j) (a keys-term GEMM). */
    float scale = (float)(1.0 / sqrt((double)D));
    interval *p_iv = intervals(n_p), *out_iv = intervals(n_q), *s = intervals(keys), *e = intervals(keys);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int t = 0; t < T; t++) {
                const float *q_row = q + (((size_t)b * T + t) * H + h) * D;
                int last = past + t;
                interval max_value = point(-INFINITY);
                for (int j = 0; j <= last; j++) {
                    const float *k_row = k + (((size_t)b * keys + j) * KVH + h / group) * D;
                    interval_sum dot = {0, 0, 0};
                    for (int d = 0; d < D; d++) sum_add(&dot, point((double)q_row[d] * k_row[d]));
                    s[j] = iv_round16(iv_mul(iv_round16(sum_float(dot, D, GEMM_UNIT)), point(scale)));
                    max_value.lo = fmax(max_value.lo, s[j].lo), max_value.hi = fmax(max_value.hi, s[j].hi);
                }
                interval_sum total = {0, 0, 0};
                for (int j = 0; j <= last; j++) {
                    e[j] = iv_expf(iv_sub(s[j], max_value), SOFTMAX_EXP_SPREAD);
                    sum_add(&total, e[j]);
                }
                interval sum = sum_result(total, last + 1, DOUBLE_UNIT);
                interval inverse =
                    fl32(1.0 / sum.hi * (1.0 - 2.0 * DOUBLE_UNIT), 1.0 / sum.lo * (1.0 + 2 * DOUBLE_UNIT));
                interval *p_row = p_iv + (((size_t)b * H + h) * T + t) * keys;
                for (int j = 0; j <= last; j++) p_row[j] = iv_mul(e[j], inverse);
                for (int d = 0; d < D; d++) {
                    interval_sum o = {0, 0, 0};
                    for (int j = 0; j <= last; j++)
                        sum_add(&o, exact_mul(iv_round16(p_row[j]),
                                              point(v[(((size_t)b * keys + j) * KVH + h / group) * D + d])));
                    out_iv[(((size_t)b * T + t) * H + h) * D + d] = iv_round16(sum_float(o, last + 1, GEMM_UNIT));
                }
            }
    snprintf(name, sizeof name, "attention_forward_bf16 probs B=%d T=%d past=%d H=%d KVH=%d D=%d", B, T, past, H, KVH,
             D);
    compare_intervals(name, probs, g_probs, p_iv, n_p);
    snprintf(name, sizeof name, "attention_forward_bf16 out B=%d T=%d past=%d H=%d KVH=%d D=%d", B, T, past, H, KVH, D);
    compare_intervals(name, out, g_out, out_iv, n_q);

    if (past == 0) {
        /* The backward from the CPU's probs on both (a point each). dq, dk, dv are written: the GPU's start as NaN,
         * the CPU's as other numbers (nan_floats). */
        gpu.copy(&gpu, d_probs.ptr, probs, n_p * 4, DEVICE_H2D);
        float *dout = random_bf16(n_q, 143, 1.0f), *dq = random_floats(n_q, 144, 0.5f);
        float *dk = random_floats(n_kv, 145, 0.5f), *dv = random_floats(n_kv, 146, 0.5f), *nans = nan_floats(n_q);
        float *bscratch = host_alloc((size_t)(2 * T * T + T * D) * 4);
        buffer d_dout = to_device(dout, n_q * 4), d_dq = to_device(nans, n_q * 4), d_dk = to_device(nans, n_kv * 4);
        buffer d_dv = to_device(nans, n_kv * 4);
        host.attention_backward_bf16(&host, dq, dk, dv, bscratch, dout, probs, q, k, v, B, T, H, KVH, D);
        work = work_count();
        gpu.attention_backward_bf16(&gpu, d_dq.ptr, d_dk.ptr, d_dv.ptr, d_scratch.ptr, d_dout.ptr, d_probs.ptr,
                                    d_q.ptr, d_k.ptr, d_v.ptr, B, T, H, KVH, D);
        snprintf(name, sizeof name, "attention_backward_bf16 launches B=%d T=%d H=%d KVH=%d", B, T, H, KVH);
        check_work(name, work, 13);
        float *g_dq = from_device(d_dq, n_q * 4), *g_dk = from_device(d_dk, n_kv * 4),
              *g_dv = from_device(d_dv, n_kv * 4);
        /* Per head: dp_tj = bf16(dout_t . v_j) (D terms); dot_t = sum_j p_tj dp_tj (double, t + 1 additions);
         * ds_tj = bf16(bf16(p_tj fl(dp_tj - float(dot_t))) scale); dq_t = bf16(sum_j ds_tj k_j) (T terms);
         * a head's dk_j term bf16(sum_t ds_tj q_t), its dv_j term bf16(sum_t bf16(p_tj) dout_t) (T terms each),
         * added over the group's heads in float32 in head order on both (fl per addition), rounded once. */
        interval *dq_iv = intervals(n_q), *dk_iv = intervals(n_kv), *dv_iv = intervals(n_kv);
        interval *ds = intervals((size_t)T * T), *dp = intervals(T);
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++) {
                int kv = h / group;
                const float *p = probs + ((size_t)b * H + h) * T * T;
                for (int t = 0; t < T; t++) {
                    const float *do_row = dout + (((size_t)b * T + t) * H + h) * D;
                    interval_sum dot = {0, 0, 0};
                    for (int j = 0; j <= t; j++) {
                        const float *v_row = v + (((size_t)b * T + j) * KVH + kv) * D;
                        interval_sum a = {0, 0, 0};
                        for (int d = 0; d < D; d++) sum_add(&a, point((double)do_row[d] * v_row[d]));
                        dp[j] = iv_round16(sum_float(a, D, GEMM_UNIT));
                        sum_add(&dot, exact_mul(point(p[(size_t)t * T + j]), dp[j]));
                    }
                    interval dot_value = sum_result(dot, t + 1, DOUBLE_UNIT);
                    dot_value = fl32(dot_value.lo, dot_value.hi);
                    for (int j = 0; j < T; j++)
                        ds[(size_t)t * T + j] =
                            j <= t ? iv_round16(iv_mul(
                                         iv_round16(iv_mul(point(p[(size_t)t * T + j]), iv_sub(dp[j], dot_value))),
                                         point(scale)))
                                   : point(0.0);
                }
                for (int t = 0; t < T; t++)
                    for (int d = 0; d < D; d++) {
                        interval_sum a = {0, 0, 0};
                        for (int j = 0; j <= t; j++)
                            sum_add(&a, exact_mul(ds[(size_t)t * T + j],
                                                  point(k[(((size_t)b * T + j) * KVH + kv) * D + d])));
                        dq_iv[(((size_t)b * T + t) * H + h) * D + d] = iv_round16(sum_float(a, T + 1, GEMM_UNIT));
                    }
                for (int j = 0; j < T; j++)
                    for (int d = 0; d < D; d++) {
                        interval_sum a = {0, 0, 0}, c = {0, 0, 0};
                        for (int t = j; t < T; t++) {
                            size_t qi = (((size_t)b * T + t) * H + h) * D + d;
                            sum_add(&a, exact_mul(ds[(size_t)t * T + j], point(q[qi])));
                            sum_add(&c, point((double)km_bf16_round(p[(size_t)t * T + j]) * dout[qi]));
                        }
                        size_t ki = (((size_t)b * T + j) * KVH + kv) * D + d;
                        dk_iv[ki] = iv_add(dk_iv[ki], iv_round16(sum_float(a, T, GEMM_UNIT)));
                        dv_iv[ki] = iv_add(dv_iv[ki], iv_round16(sum_float(c, T, GEMM_UNIT)));
                    }
            }
        for (size_t i = 0; i < n_kv; i++) dk_iv[i] = iv_round16(dk_iv[i]), dv_iv[i] = iv_round16(dv_iv[i]);
        snprintf(name, sizeof name, "attention_backward_bf16 dq B=%d T=%d H=%d KVH=%d D=%d", B, T, H, KVH, D);
        compare_intervals(name, dq, g_dq, dq_iv, n_q);
        snprintf(name, sizeof name, "attention_backward_bf16 dk B=%d T=%d H=%d KVH=%d D=%d", B, T, H, KVH, D);
        compare_intervals(name, dk, g_dk, dk_iv, n_kv);
        snprintf(name, sizeof name, "attention_backward_bf16 dv B=%d T=%d H=%d KVH=%d D=%d", B, T, H, KVH, D);
        compare_intervals(name, dv, g_dv, dv_iv, n_kv);
        device_free(d_dout), device_free(d_dq), device_free(d_dk), device_free(d_dv);
        free(dout), free(dq), free(dk), free(dv), free(bscratch), free(nans), free(g_dq), free(g_dk), free(g_dv);
        free(dq_iv), free(dk_iv), free(dv_iv), free(ds), free(dp);
    }
    device_free(d_q), device_free(d_k), device_free(d_v), device_free(d_out), device_free(d_probs);
    device_free(d_scratch);
    free(q), free(k), free(v), free(out), free(probs), free(scratch), free(g_out), free(g_probs), free(p_iv);
    free(out_iv), free(s), free(e);
}

/* ---- SwiGLU in bfloat16: element-wise, no reductions ---- */

static void check_swiglu_bf16(int N, int width) {
    char name[128];
    device host = cpu_device();
    size_t n_out = (size_t)N * width, n_in = 2 * n_out;
    float *gate_up = random_bf16(n_in, 150, 6.0f), *dout = random_bf16(n_out, 151, 1.0f);
    float *dgate_up = random_floats(n_in, 152, 0.5f), *nans = nan_floats(n_in); /* written: NaN on the GPU */
    buffer d_gate_up = to_device(gate_up, n_in * 4), d_out = device_alloc(n_out * 4);
    buffer d_dout = to_device(dout, n_out * 4), d_dgate_up = to_device(nans, n_in * 4);
    float *out = host_alloc(n_out * 4);
    host.swiglu_forward_bf16(&host, out, gate_up, N, width);
    gpu.swiglu_forward_bf16(&gpu, d_out.ptr, d_gate_up.ptr, N, width);
    float *g_out = from_device(d_out, n_out * 4);
    host.swiglu_backward_bf16(&host, dgate_up, dout, gate_up, N, width);
    gpu.swiglu_backward_bf16(&gpu, d_dgate_up.ptr, d_dout.ptr, d_gate_up.ptr, N, width);
    float *g_dgate_up = from_device(d_dgate_up, n_in * 4);
    /* silu(g) = fl(g / fl(1 + expf(-g))), s = fl(1 / fl(1 + expf(-g))): points on the emulator (the same expf),
     * within EXP_SPREAD on a GPU; then kernel_math.h's ops one by one (each rounded once on both). */
    interval *out_iv = intervals(n_out), *d_iv = intervals(n_in);
    for (int n = 0; n < N; n++)
        for (int i = 0; i < width; i++) {
            size_t o = (size_t)n * width + i, gi = (size_t)n * 2 * width + i, ui = gi + width;
            interval g = point(gate_up[gi]), up = point(gate_up[ui]), dy = point(dout[o]), one = point(1.0);
            interval denominator = iv_add(one, iv_expf(point(-gate_up[gi]), SWIGLU_EXP_SPREAD));
            interval silu = iv_round16(iv_div(g, denominator)), sigmoid = iv_div(one, denominator);
            out_iv[o] = iv_round16(iv_mul(silu, up));
            interval dact = iv_round16(iv_mul(dy, up));
            interval slope = iv_add(one, iv_mul(g, iv_sub(one, sigmoid)));
            d_iv[gi] = iv_round16(iv_mul(iv_mul(dact, sigmoid), slope));
            d_iv[ui] = iv_round16(iv_mul(dy, silu));
        }
#ifdef FSDPLAB_CUDA_EMULATOR
    /* The same expf on both sides: every interval above is a point, and the check is bit equality. */
    snprintf(name, sizeof name, "swiglu_forward_bf16 N=%d width=%d (bits)", N, width);
    compare(name, out, g_out, NULL, n_out);
    snprintf(name, sizeof name, "swiglu_backward_bf16 N=%d width=%d (bits)", N, width);
    compare(name, dgate_up, g_dgate_up, NULL, n_in);
#else
    snprintf(name, sizeof name, "swiglu_forward_bf16 N=%d width=%d", N, width);
    compare_intervals(name, out, g_out, out_iv, n_out);
    snprintf(name, sizeof name, "swiglu_backward_bf16 N=%d width=%d", N, width);
    compare_intervals(name, dgate_up, g_dgate_up, d_iv, n_in);
#endif
    device_free(d_gate_up), device_free(d_out), device_free(d_dout), device_free(d_dgate_up);
    free(gate_up), free(dout), free(dgate_up), free(nans), free(out), free(g_out), free(g_dgate_up);
    free(out_iv), free(d_iv);
}

#ifdef FSDPLAB_CUDA_EMULATOR
/* The emulator's GemmEx (tests/cuda_emulator/cublas_v2.h): other element or compute types (here a bfloat16 A beside
 * a float32 B) are refused with CUBLAS_STATUS_NOT_SUPPORTED, CUBLAS_COMPUTE_32F takes any float, and
 * CUBLAS_COMPUTE_32F_FAST_16BF aborts when an element it reads is not a bfloat16 value (in a child process: the abort
 * is the expected outcome). Its bfloat16-storage GEMMs are checked by tests/gpu_gemm_bench.c. */
static void check_emulator_gemm_ex(void) {
    cuda_device_state *state = (cuda_device_state *)gpu.impl;
    float host[4] = {1.0f, 0.5f, 0.25f, 1.0f + 0x1p-20f}; /* the last is not a bfloat16 value */
    buffer d_a = to_device(host, sizeof host), d_c = device_alloc(sizeof host);
    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t wrong_type = cublasGemmEx(state->cublas, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, d_a.ptr,
                                             CUDA_R_16BF, 2, d_a.ptr, CUDA_R_32F, 2, &zero, d_c.ptr, CUDA_R_32F, 2,
                                             CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    cublasStatus_t wrong_compute = cublasGemmEx(state->cublas, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, d_a.ptr,
                                                CUDA_R_32F, 2, d_a.ptr, CUDA_R_32F, 2, &zero, d_c.ptr, CUDA_R_32F, 2,
                                                CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT);
    cublasStatus_t plain = cublasGemmEx(state->cublas, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, d_a.ptr, CUDA_R_32F, 2,
                                        d_a.ptr, CUDA_R_32F, 2, &zero, d_c.ptr, CUDA_R_32F, 2, CUBLAS_COMPUTE_32F,
                                        CUBLAS_GEMM_DEFAULT);
    /* Under FAST_16BF a (1, 2) A with lda 2 reads elements 0 and 2, a (2, 1) B elements 0 and 1: all bfloat16
     * values, so it runs; the (2, 2) product below reads element 3 and aborts. */
    cublasStatus_t bf16_ok = cublasGemmEx(state->cublas, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 2, &one, d_a.ptr, CUDA_R_32F,
                                          2, d_a.ptr, CUDA_R_32F, 2, &zero, d_c.ptr, CUDA_R_32F, 1,
                                          CUBLAS_COMPUTE_32F_FAST_16BF, CUBLAS_GEMM_DEFAULT);
    /* The child's message (stderr, through a pipe) must name the call, the operand, the element and its value. */
    fflush(stdout);
    fflush(stderr);
    int pipe_ends[2];
    if (pipe(pipe_ends) != 0) {
        perror("gpu_layers: pipe");
        exit(2);
    }
    pid_t child = fork();
    if (child == 0) {
        dup2(pipe_ends[1], 2);
        close(pipe_ends[0]);
        cublasGemmEx(state->cublas, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, d_a.ptr, CUDA_R_32F, 2, d_a.ptr,
                     CUDA_R_32F, 2, &zero, d_c.ptr, CUDA_R_32F, 2, CUBLAS_COMPUTE_32F_FAST_16BF, CUBLAS_GEMM_DEFAULT);
        _exit(0); /* not reached when the emulator checks */
    }
    close(pipe_ends[1]);
    char message[4096] = {0};
    size_t used = 0;
    ssize_t got;
    while (used < sizeof message - 1 && (got = read(pipe_ends[0], message + used, sizeof message - 1 - used)) > 0)
        used += (size_t)got;
    close(pipe_ends[0]);
    int status = 0;
    int aborted = child > 0 && waitpid(child, &status, 0) == child && WIFSIGNALED(status) &&
                  WTERMSIG(status) == SIGABRT && strstr(message, "cublasGemmEx") != NULL &&
                  strstr(message, "operand A's element (row 1, column 1; index 3") != NULL &&
                  strstr(message, "1.00000095") != NULL;
    if (!aborted) fprintf(stderr, "gpu_layers: the emulator's message was: %s\n", message);
    int ok[5] = {wrong_type == CUBLAS_STATUS_NOT_SUPPORTED, wrong_compute == CUBLAS_STATUS_NOT_SUPPORTED,
                 plain == CUBLAS_STATUS_SUCCESS, bf16_ok == CUBLAS_STATUS_SUCCESS, aborted};
    const char *what[5] = {"emulator GemmEx: mixed 16BF A / 32F B refused", "emulator GemmEx: FAST_TF32 refused",
                           "emulator GemmEx: COMPUTE_32F takes any float",
                           "emulator GemmEx: FAST_16BF on bfloat16 values runs",
                           "emulator GemmEx: FAST_16BF aborts on a non-bfloat16 operand"};
    for (int i = 0; i < 5; i++) {
        checks++;
        failures += !ok[i];
        printf("%-58s %11s %11s %9s  %s\n", what[i], "-", "-", "-", ok[i] ? "PASS" : "FAIL");
    }
    device_free(d_a), device_free(d_c);
}
#endif

int main(void) {
    char error[256];
    if (cuda_device_init(&gpu, 0, 1, error, sizeof error) != 0) {
        printf("gpu_layers: no CUDA device: %s\n", error);
        return 77;
    }
#ifdef FSDPLAB_CUDA
    if (((cuda_device_state *)gpu.impl)->allow_tf32) {
        printf("gpu_layers: TF32 is allowed (ALLOW_TF32): the float32 GEMM bounds do not hold; run with it off\n");
        device_destroy(&gpu);
        return 1;
    }
#endif
    printf("%-58s %11s %11s %9s  %s\n", "check", "max|diff|", "bound", "diff/bnd", "result");

    check_embedding(300, 50, 37); /* tokens repeat: the gradient's order matters */
    check_embedding(7, 1000, 896);
    check_rmsnorm(13, 257, 1.0f);
    check_rmsnorm(64, 896, 30.0f);
    check_rmsnorm(3, 1, 1.0f);
    check_linear(37, 129, 70, 1, 1);
    check_linear(64, 64, 256, 0, 1);
    check_linear(5, 33, 7, 1, 0);
    check_rope(2, 7, 4, 8);
    check_rope(1, 33, 3, 64);
    check_attention(2, 7, 0, 4, 2, 8, 1.0f);   /* grouped-query, G = 2 */
    check_attention(1, 33, 0, 6, 1, 16, 2.0f); /* multi-query, G = 6 */
    check_attention(3, 16, 0, 4, 4, 32, 1.0f); /* plain multi-head */
    check_attention(2, 5, 11, 4, 2, 8, 1.0f);  /* a KV cache: past = 11 */
    check_attention(1, 1, 6, 14, 2, 64, 1.0f); /* one new token, Qwen2-0.5B's heads */
    check_attention(1, 40, 0, 2, 1, 16,
                    12.0f); /* scores spread over hundreds: expf overflows unless the max is right */
    check_residual_rmsnorm(13, 257, 0);
    check_residual_rmsnorm(64, 896, 0);
    check_swiglu(17, 123);
    check_swiglu(4, 4864);
    check_cross_entropy(29, 1000, 3, 4.0f);
    check_cross_entropy(4, 50000, 0, 10.0f);
    check_cross_entropy(300, 260, 7, 2.0f);   /* more rows than the reduction's blocks */
    check_cross_entropy(3, 5000, 0, 1000.0f); /* logits spread over thousands, one far above */
    check_cross_entropy(5, 17, 1, 1.0f);      /* every target ignored: loss 0, count 0, dlogits 0 */
    check_loss_slots(29, 1000, 4, 0.125f, DTYPE_FLOAT32);
    /* more rows than the reduction's blocks; a scale that rounds; then logits.float()'s gradient in bfloat16 */
    check_loss_slots(300, 260, 0, 1.0f / 3.0f, DTYPE_FLOAT32);
    check_loss_slots(300, 260, 7, 1.0f / 3.0f, DTYPE_BFLOAT16);
    check_rounded_logits(37, 700, 24, 5);
    check_vectors(1);
    check_vectors(1001);
    check_vectors((size_t)3 << 20);
    check_rows_copy(12, 3, 0, 3, DTYPE_FLOAT32);
    check_rows_copy(12, 3, 0, 3, DTYPE_BFLOAT16);
    check_rows_copy(40, 4, 1, 2, DTYPE_BFLOAT16); /* two launches; a subset of the ranks (reshard_after_forward=N) */
    check_rows_copy(40, 1, 0, 1, DTYPE_FLOAT32);
    check_adamw(100003, 1, 0.1f);
    check_adamw(4097, 1000, 0.1f);
    check_adamw(513, 3, 0.75f); /* lerp's other branch */
    /* the layers in bfloat16 (inputs rounded to bfloat16 first) */
    check_linear_bf16(37, 129, 70, 1, 1);
    check_linear_bf16(64, 64, 256, 0, 1);
    check_linear_bf16(5, 33, 7, 1, 0);
    check_linear_stacked_bf16(37, 129, 70);
    check_linear_stacked_bf16(8, 64, 200);
    check_rmsnorm_bf16(13, 257, 1.0f);
    check_rmsnorm_bf16(64, 896, 30.0f);
    check_rmsnorm_bf16(3, 1, 1.0f);
    check_rope_bf16(2, 7, 4, 8);
    check_rope_bf16(1, 33, 3, 64);
    check_attention_bf16(2, 7, 0, 4, 2, 8, 1.0f);   /* grouped-query, G = 2 */
    check_attention_bf16(1, 33, 0, 6, 1, 16, 2.0f); /* multi-query, G = 6 */
    check_attention_bf16(3, 16, 0, 4, 4, 32, 1.0f); /* plain multi-head */
    check_attention_bf16(2, 5, 11, 4, 2, 8, 1.0f);  /* a KV cache: past = 11 */
    check_attention_bf16(1, 1, 6, 14, 2, 64, 1.0f); /* one new token, Qwen2-0.5B's heads */
    check_attention_bf16(1, 40, 0, 2, 1, 16, 12.0f); /* scores spread over hundreds */
    check_residual_rmsnorm(13, 257, 1);
    check_residual_rmsnorm(64, 896, 1);
    check_swiglu_bf16(17, 123);
    check_swiglu_bf16(4, 4864);
#ifdef FSDPLAB_CUDA_EMULATOR
    check_emulator_gemm_ex();
#endif

    device_destroy(&gpu);
    printf("\n%d passed, %d failed\n", checks - failures, failures);
    return failures == 0 ? 0 : 1;
}
