/* gpu_gemm_bench.c — what 2-byte storage would buy the GEMMs: Qwen2-0.5B's GEMMs timed on the GPU in four storages.
 *
 *   build/cuda/tests/bin/gpu_gemm_bench [small]        (scripts/gpu_lease.sh runs it; `small`: every size / 32)
 *
 * MP=bf16 today keeps every tensor in float32 buffers that hold bfloat16 values and runs cublasGemmEx with
 * CUBLAS_COMPUTE_32F_FAST_16BF, so cuBLAS converts A and B to bfloat16 before its tensor cores. Issue 30's next step,
 * 2-byte tensors (llm.c's floatX), changes every layer's buffers; this program measures first what it would change for
 * the GEMMs, the arithmetic of a step. Per shape, the same bfloat16-valued inputs in four storages:
 *   fp32        A, B, C float32, CUBLAS_COMPUTE_32F (exact float32 products; what MP=fp32 runs)
 *   fp32->bf16  A, B, C float32, CUBLAS_COMPUTE_32F_FAST_16BF (what MP=bf16 runs now)
 *   bf16, f32 C A, B bfloat16, C float32, CUBLAS_COMPUTE_32F (2-byte operands: the weight gradients' float32 sums)
 *   bf16        A, B, C bfloat16, CUBLAS_COMPUTE_32F (2-byte everything: torch's bfloat16 nn.Linear)
 * The shapes are core/cuda/cuda_ops.cu's calls for Qwen2-0.5B at the seed's MBS=8 SEQ=256 (N = 2048 tokens; the
 * vocabulary head in LOSS_CHUNK=1024 rows): each Linear's forward (m = OC, n = N, k = IC, A transposed), its input
 * gradient (m = IC, n = N, k = OC) and its weight gradient (m = IC, n = OC, k = N, B transposed). Each is timed by a
 * CUDA event pair over REPS calls after WARMUP (cuBLAS picks its kernel in the first); prints milliseconds per call,
 * TFLOP/s (2 m n k per call) and each storage's time over fp32->bf16's, then the sum over one decoder layer's 18
 * Linear GEMMs (gate_up's input gradient as one call; MP=bf16 makes it two, one per half).
 *
 * Each result is also checked, so a fast wrong call cannot pass for a fast right one: SAMPLES output elements against
 * a double dot product on the host. The inputs are bfloat16 values in [-1, 1], so every storage multiplies the same
 * numbers and each product is exact in float32; a float32 sum of k terms in any order is within gamma(k) sum |terms|
 * of the exact one (Higham §3.1, gamma(k) = k u / (1 - k u), u = 2^-24), and a bfloat16 C adds its rounding, at most
 * 2^-8 of the value (8 significant bits, round to nearest; the bound is |exact| + that sum, the worst the float32 sum
 * may be). Prints one PASS or FAIL row per shape and storage; exits 1 on any FAIL, 77 without a CUDA device.
 * On the emulator (make CUDA=emulated) it runs `small` to check this program and the emulator's bfloat16 GEMMs; its
 * times say nothing about a GPU.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/dtype.h"
#include "core/base/rng.h"

#ifdef FSDPLAB_CUDA
#include <cublas_v2.h>
#include <cuda_runtime.h>

#define WARMUP 3
#define REPS 20
#define SAMPLES 256
#define U 0x1p-24

static void cuda_check(cudaError_t status, const char *what) {
    if (status == cudaSuccess) return;
    fprintf(stderr, "gpu_gemm_bench: %s: %s\n", what, cudaGetErrorString(status));
    exit(1);
}
static void cublas_check(cublasStatus_t status, const char *what) {
    if (status == CUBLAS_STATUS_SUCCESS) return;
    fprintf(stderr, "gpu_gemm_bench: %s: cuBLAS status %d\n", what, (int)status);
    exit(1);
}

typedef struct gemm_shape {
    const char *name; /* the Linear and the pass */
    cublasOperation_t transa, transb;
    int m, n, k;
    int per_layer; /* calls in one decoder layer's forward and backward (0: not a layer's) */
} gemm_shape;

typedef struct storage {
    const char *name;
    cudaDataType_t ab, c;
    cublasComputeType_t compute;
} storage;

static const storage STORAGES[4] = {
    {"fp32", CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F},
    {"fp32->bf16", CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_16BF},
    {"bf16, f32 C", CUDA_R_16BF, CUDA_R_32F, CUBLAS_COMPUTE_32F},
    {"bf16", CUDA_R_16BF, CUDA_R_16BF, CUBLAS_COMPUTE_32F},
};
#define STORAGE_COUNT 4
#define BASELINE 1 /* fp32->bf16: what MP=bf16 runs now */

static size_t type_size(cudaDataType_t type) { return type == CUDA_R_16BF ? 2 : 4; }

/* The column-major operand op(X) of a (rows, depth) product: X is (rows, depth) untransposed, (depth, rows) when
 * transposed, stored with leading dimension = its first extent. */
static int operand_rows(cublasOperation_t op, int rows, int depth) { return op == CUBLAS_OP_N ? rows : depth; }

typedef struct operands {
    size_t a_count, b_count, c_count;
    bf16 *a, *b;         /* host, bfloat16 values */
    void *d_a[2], *d_b[2]; /* device: [0] float32 copies, [1] bfloat16 */
    void *d_c;             /* device, float32-sized (a bfloat16 C uses its first half) */
} operands;

static double element(const bf16 *x, size_t at) { return (double)bf16_to_float(x[at]); }

/* Sampled elements of C against double dot products of the host inputs; returns the worst |error| / bound. */
static double check_samples(const gemm_shape *g, const operands *o, const storage *st, cudaStream_t stream) {
    size_t bytes = o->c_count * type_size(st->c);
    void *host = malloc(bytes);
    if (host == NULL) {
        fprintf(stderr, "gpu_gemm_bench: out of memory for %zu bytes\n", bytes);
        exit(1);
    }
    cuda_check(cudaMemcpyAsync(host, o->d_c, bytes, cudaMemcpyDeviceToHost, stream), "copy C to the host");
    cuda_check(cudaStreamSynchronize(stream), "wait for C");
    int lda = operand_rows(g->transa, g->m, g->k), ldb = operand_rows(g->transb, g->k, g->n);
    double worst = 0.0;
    for (int s = 0; s < SAMPLES; s++) {
        size_t index = (size_t)s * 2654435761u % o->c_count; /* spread over C */
        int row = (int)(index % (size_t)g->m), column = (int)(index / (size_t)g->m);
        double exact = 0.0, magnitude = 0.0;
        for (int p = 0; p < g->k; p++) {
            size_t a_at = g->transa == CUBLAS_OP_N ? (size_t)p * lda + row : (size_t)row * lda + p;
            size_t b_at = g->transb == CUBLAS_OP_N ? (size_t)column * ldb + p : (size_t)p * ldb + column;
            double term = element(o->a, a_at) * element(o->b, b_at);
            exact += term;
            magnitude += fabs(term);
        }
        double sum_bound = g->k * U / (1.0 - g->k * U) * magnitude;
        double got, bound = sum_bound;
        if (st->c == CUDA_R_16BF) {
            got = (double)bf16_to_float(((const bf16 *)host)[index]);
            bound += 0x1p-8 * (fabs(exact) + sum_bound);
        } else {
            got = (double)((const float *)host)[index];
        }
        double ratio = fabs(got - exact) / (bound > 0.0 ? bound : 0x1p-149);
        if (ratio > worst) worst = ratio;
    }
    free(host);
    return worst;
}

/* Milliseconds per call of one shape in one storage, and its check. */
static double time_gemm(cublasHandle_t handle, cudaStream_t stream, const gemm_shape *g, const operands *o,
                        const storage *st, int reps, double *worst) {
    int lda = operand_rows(g->transa, g->m, g->k), ldb = operand_rows(g->transb, g->k, g->n);
    int bf = st->ab == CUDA_R_16BF;
    const float one = 1.0f, zero = 0.0f;
    cudaEvent_t start, stop;
    cuda_check(cudaEventCreate(&start), "cudaEventCreate");
    cuda_check(cudaEventCreate(&stop), "cudaEventCreate");
    char what[160];
    snprintf(what, sizeof what, "cublasGemmEx %s %s (m %d, n %d, k %d)", g->name, st->name, g->m, g->n, g->k);
    for (int i = 0; i < WARMUP + reps; i++) {
        if (i == WARMUP) cuda_check(cudaEventRecord(start, stream), "cudaEventRecord");
        cublas_check(cublasGemmEx(handle, g->transa, g->transb, g->m, g->n, g->k, &one, o->d_a[bf], st->ab, lda,
                                  o->d_b[bf], st->ab, ldb, &zero, o->d_c, st->c, g->m, st->compute,
                                  CUBLAS_GEMM_DEFAULT),
                     what);
    }
    cuda_check(cudaEventRecord(stop, stream), "cudaEventRecord");
    cuda_check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0.0f;
    cuda_check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    cuda_check(cudaEventDestroy(start), "cudaEventDestroy");
    cuda_check(cudaEventDestroy(stop), "cudaEventDestroy");
    *worst = check_samples(g, o, st, stream);
    return ms / reps;
}

static void *device_copy(const void *host, size_t bytes, cudaStream_t stream) {
    void *d = NULL;
    cuda_check(cudaMalloc(&d, bytes), "cudaMalloc");
    cuda_check(cudaMemcpyAsync(d, host, bytes, cudaMemcpyHostToDevice, stream), "copy to the device");
    return d;
}

/* Random bfloat16 values in [-1, 1] on the host, their float32 and bfloat16 copies on the device. */
static void make_operands(operands *o, const gemm_shape *g, uint64_t stream_id, cudaStream_t stream) {
    o->a_count = (size_t)g->m * g->k, o->b_count = (size_t)g->k * g->n, o->c_count = (size_t)g->m * g->n;
    bf16 **host[2] = {&o->a, &o->b};
    size_t counts[2] = {o->a_count, o->b_count};
    void **dev[2][2] = {{&o->d_a[0], &o->d_a[1]}, {&o->d_b[0], &o->d_b[1]}};
    for (int x = 0; x < 2; x++) {
        *host[x] = malloc(counts[x] * sizeof(bf16));
        float *wide = malloc(counts[x] * sizeof(float));
        if (*host[x] == NULL || wide == NULL) {
            fprintf(stderr, "gpu_gemm_bench: out of memory for %zu elements\n", counts[x]);
            exit(1);
        }
        for (size_t i = 0; i < counts[x]; i++) {
            (*host[x])[i] = bf16_from_float(2.0f * rng_uniform(1234, stream_id + (uint64_t)x, i) - 1.0f);
            wide[i] = bf16_to_float((*host[x])[i]);
        }
        *dev[x][0] = device_copy(wide, counts[x] * sizeof(float), stream);
        *dev[x][1] = device_copy(*host[x], counts[x] * sizeof(bf16), stream);
        cuda_check(cudaStreamSynchronize(stream), "wait for the copies");
        free(wide);
    }
    cuda_check(cudaMalloc(&o->d_c, o->c_count * sizeof(float)), "cudaMalloc C");
}

static void free_operands(operands *o) {
    for (int i = 0; i < 2; i++) {
        cuda_check(cudaFree(o->d_a[i]), "cudaFree");
        cuda_check(cudaFree(o->d_b[i]), "cudaFree");
    }
    cuda_check(cudaFree(o->d_c), "cudaFree");
    free(o->a), free(o->b);
}

int main(int argc, char **argv) {
    int small = argc > 1 && strcmp(argv[1], "small") == 0, devices = 0;
    if (argc > 1 && !small) {
        fprintf(stderr, "usage: gpu_gemm_bench [small]\n");
        return 2;
    }
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        printf("gpu_gemm_bench: no CUDA device here\n");
        return 77;
    }
    /* Qwen2-0.5B: hidden 896, 14 query heads and 2 key/value heads of 64, MLP 4864 (gate and up stacked: 9728), the
     * vocabulary 151,936; N = MBS x SEQ = 2048 tokens, the head's chunk 1024 rows. `small`: every size / 32. */
    int d = small ? 32 : 1, N = 2048 / d, H = 896 / d, KV = 128 / d, F = 4864 / d, V = 151936 / d, chunk = 1024 / d;
    /* Per decoder layer: q, k, v, o, gate_up (stacked), down; each forward, input gradient and weight gradient. */
    const gemm_shape shapes[] = {
        {"q, o forward", CUBLAS_OP_T, CUBLAS_OP_N, H, N, H, 2},
        {"k, v forward", CUBLAS_OP_T, CUBLAS_OP_N, KV, N, H, 2},
        {"gate_up forward", CUBLAS_OP_T, CUBLAS_OP_N, 2 * F, N, H, 1},
        {"down forward", CUBLAS_OP_T, CUBLAS_OP_N, H, N, F, 1},
        {"q, o input grad", CUBLAS_OP_N, CUBLAS_OP_N, H, N, H, 2},
        {"k, v input grad", CUBLAS_OP_N, CUBLAS_OP_N, H, N, KV, 2},
        {"gate_up input grad", CUBLAS_OP_N, CUBLAS_OP_N, H, N, 2 * F, 1},
        {"down input grad", CUBLAS_OP_N, CUBLAS_OP_N, F, N, H, 1},
        {"q, o weight grad", CUBLAS_OP_N, CUBLAS_OP_T, H, H, N, 2},
        {"k, v weight grad", CUBLAS_OP_N, CUBLAS_OP_T, H, KV, N, 2},
        {"gate_up weight grad", CUBLAS_OP_N, CUBLAS_OP_T, H, 2 * F, N, 1},
        {"down weight grad", CUBLAS_OP_N, CUBLAS_OP_T, F, H, N, 1},
        {"lm_head chunk forward", CUBLAS_OP_T, CUBLAS_OP_N, V, chunk, H, 0},
        {"lm_head chunk weight grad", CUBLAS_OP_N, CUBLAS_OP_T, H, V, chunk, 0},
    };
    int shape_count = (int)(sizeof shapes / sizeof shapes[0]), reps = small ? 1 : REPS;
    cuda_check(cudaSetDevice(0), "cudaSetDevice");
    cudaStream_t stream;
    cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    cublasHandle_t handle;
    cublas_check(cublasCreate(&handle), "cublasCreate");
    cublas_check(cublasSetStream(handle, stream), "cublasSetStream");
    cublas_check(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH), "cublasSetMathMode"); /* no TF32 */
    printf("# gpu_gemm_bench%s: Qwen2-0.5B's GEMMs (N = %d tokens), ms per call over %d calls, TFLOP/s, and time / "
           "fp32->bf16's (MP=bf16 now)\n",
           small ? " small (every size / 32; the emulator's times say nothing)" : "", N, reps);
    printf("%-27s %-12s %6s %6s %6s %10s %8s %7s  %s\n", "GEMM", "storage", "m", "n", "k", "ms", "TFLOP/s", "ratio",
           "check: worst |error| / bound");
    double layer_ms[STORAGE_COUNT] = {0};
    int failures = 0;
    for (int i = 0; i < shape_count; i++) {
        const gemm_shape *g = &shapes[i];
        operands o;
        make_operands(&o, g, 2 * (uint64_t)i, stream);
        double ms[STORAGE_COUNT], worst[STORAGE_COUNT];
        for (int s = 0; s < STORAGE_COUNT; s++) {
            ms[s] = time_gemm(handle, stream, g, &o, &STORAGES[s], reps, &worst[s]);
            layer_ms[s] += g->per_layer * ms[s];
        }
        for (int s = 0; s < STORAGE_COUNT; s++) {
            int pass = worst[s] <= 1.0;
            failures += !pass;
            printf("%-27s %-12s %6d %6d %6d %10.4f %8.1f %6.2fx  %.3g %s\n", g->name, STORAGES[s].name, g->m, g->n,
                   g->k, ms[s], 2.0 * g->m * g->n * g->k / (ms[s] * 1e-3) / 1e12, ms[s] / ms[BASELINE], worst[s],
                   pass ? "PASS" : "FAIL");
        }
        free_operands(&o);
    }
    printf("one decoder layer's 18 Linear GEMMs, forward and backward (attention's batched products not included):\n");
    for (int s = 0; s < STORAGE_COUNT; s++)
        printf("  %-12s %9.4f ms  %.2fx fp32->bf16's\n", STORAGES[s].name, layer_ms[s],
               layer_ms[s] / layer_ms[BASELINE]);
    cublas_check(cublasDestroy(handle), "cublasDestroy");
    cuda_check(cudaStreamDestroy(stream), "cudaStreamDestroy");
    printf("gpu_gemm_bench: %d failed\n", failures);
    return failures > 0;
}
#else
int main(void) {
    printf("gpu_gemm_bench: this build has no CUDA device (make CUDA=1, or CUDA=emulated)\n");
    return 77;
}
#endif
