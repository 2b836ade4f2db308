/* kernels.cu — the compute device's CUDA kernels (see kernels.cuh): every element loop of core/kernels/layers.c and of
 * the runtime's vectors, on the GPU, calling core/base/kernel_math.h for the arithmetic.
 *
 * Shapes and layouts are core/kernels/layers.h's. Each kernel says how its work is split and in which order it sums:
 *   - element-wise kernels (RoPE, SwiGLU, add, scale, casts, AdamW): one thread per element (per pair for RoPE),
 *     grid-stride, each element's formula the CPU's;
 *   - row kernels (RMSNorm, the softmaxes, cross-entropy): one block per row, a block reduction (warp shuffles,
 *     then one warp over the warps' results) for the row's max or its double sum;
 *   - column sums into a weight gradient (RMSNorm's dweight, a bias's gradient): 16 row groups per column each sum
 *     their rows in order, then one thread adds the 16 partials in order: no atomics, the same bits every run;
 *   - the bfloat16 layers (core/kernels/layers_bf16.h): the same splits, each element's formula kernel_math.h's
 *     km_bf16_* (the CPU's layers_bf16.c calls them too), so every rounding sits where the CPU's does;
 *   - the embedding's gradient: each destination row is summed by one thread in the order of the tokens, exactly
 *     the CPU's order (the same bits as the CPU).
 * Nothing here uses atomics; every result is deterministic run to run.
 */
#include <float.h>
#include <math.h>

#include "core/base/kernel_math.h"
#include "core/cuda/kernels.cuh"

#define THREADS 256
#define FULL_MASK 0xffffffffu

/* Blocks for a grid-stride loop over count items: enough to fill the GPU, capped so the grid stays legal. */
static unsigned grid_for(size_t count, unsigned threads) {
    size_t blocks = (count + threads - 1) / threads;
    if (blocks < 1) blocks = 1;
    if (blocks > (1u << 20)) blocks = 1u << 20;
    return (unsigned)blocks;
}

/* A grid-stride kernel over `count` elements that splits each index into coordinates, launched with its index type
 * chosen here: 32 bits below 2^31 elements (an index plus the grid's stride, at most 2^28, then stays below 2^32), a
 * 64-bit size_t beyond. A GPU divides 64-bit integers in a long software routine and 32-bit ones in a few
 * instructions. The kernel is a template on that type and takes `count`, in it, as its first argument; offsets that
 * may pass the count (a row times its width, a group's terms) are computed in size_t. */
#define LAUNCH_INDEXED(kernel, count, stream, ...)                                                                   \
    do {                                                                                                             \
        if ((count) < ((size_t)1 << 31))                                                                             \
            kernel<<<grid_for(count, THREADS), THREADS, 0, stream>>>((uint32_t)(count), __VA_ARGS__);                 \
        else                                                                                                         \
            kernel<<<grid_for(count, THREADS), THREADS, 0, stream>>>((size_t)(count), __VA_ARGS__);                   \
    } while (0)

/* ---- block reductions (blockDim.x a multiple of 32, at most 1024) ---- */

/* The block's reduction of `value` by `combine` (identity: what a missing lane contributes), returned to every
 * thread: each warp by shuffles, then warp 0 over the warps' results. The first __syncthreads lets a second call in
 * the same kernel reuse the shared words only once every thread has read the previous result. */
template <typename T, typename Combine>
__device__ T block_reduce(T value, T identity, Combine combine) {
    __shared__ T partial[32];
    __shared__ T total;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    for (int offset = 16; offset > 0; offset >>= 1) value = combine(value, __shfl_down_sync(FULL_MASK, value, offset));
    __syncthreads();
    if (lane == 0) partial[warp] = value;
    __syncthreads();
    if (warp == 0) {
        T w = lane < warps ? partial[lane] : identity;
        for (int offset = 16; offset > 0; offset >>= 1) w = combine(w, __shfl_down_sync(FULL_MASK, w, offset));
        if (lane == 0) total = w;
    }
    __syncthreads();
    return total;
}

struct sum_of {
    __device__ double operator()(double a, double b) const { return a + b; }
};
struct max_of { /* km_max: no NaNs reach it */
    __device__ float operator()(float a, float b) const { return km_max(a, b); }
};
struct min_of {
    __device__ uint64_t operator()(uint64_t a, uint64_t b) const { return b < a ? b : a; }
};

__device__ double block_sum(double value) { return block_reduce(value, 0.0, sum_of()); }
__device__ float block_max(float value) { return block_reduce(value, -INFINITY, max_of()); }
__device__ uint64_t block_min_index(uint64_t value) { return block_reduce(value, (uint64_t)UINT64_MAX, min_of()); }

/* The scratch's parts: the result, then the partial doubles, then the partial indices / counts. */
__device__ __host__ static inline kernels_result *scratch_result(void *scratch) { return (kernels_result *)scratch; }
__device__ __host__ static inline double *scratch_partials(void *scratch) {
    return (double *)((char *)scratch + KERNELS_RESULT_BYTES);
}
__device__ __host__ static inline uint64_t *scratch_indices(void *scratch) {
    return (uint64_t *)((char *)scratch + KERNELS_RESULT_BYTES + KERNELS_REDUCE_BLOCKS * sizeof(double));
}

/* ---- embedding ---- */

/* One block per token row: out[n] = weight[tokens[n]]. */
__global__ void embedding_forward_kernel(floatX *out, const int *tokens, const floatX *weight, int C) {
    int n = blockIdx.x;
    const floatX *row = weight + (size_t)tokens[n] * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) out[(size_t)n * C + c] = row[c];
}

cudaError_t embedding_forward_launch(floatX *out, const int *tokens, const floatX *weight, int N, int C,
                                     cudaStream_t stream) {
    if (N <= 0 || C <= 0) return cudaSuccess;
    embedding_forward_kernel<<<N, THREADS, 0, stream>>>(out, tokens, weight, C);
    return cudaGetLastError();
}

/* dweight[tokens[n]] += dout[n] for every n, in the order of n per destination row (the CPU's order, so the CPU's
 * bits): thread (column c, token class s) takes the rows whose token is s modulo EMBEDDING_CLASSES, in increasing
 * n. All rows with one token fall in one class, so each destination element has one writer, which adds in order.
 * The tokens pass through shared memory a block's width at a time; a warp shares its class, so it branches alike. */
#define EMBEDDING_CLASSES 32
__global__ void embedding_backward_kernel(floatX *dweight, const floatX *dout, const int *tokens, int N, int C) {
    __shared__ int chunk[THREADS];
    int c = blockIdx.x * blockDim.x + threadIdx.x, token_class = blockIdx.y;
    for (int first = 0; first < N; first += blockDim.x) {
        int count = min((int)blockDim.x, N - first);
        __syncthreads();
        if ((int)threadIdx.x < count) chunk[threadIdx.x] = tokens[first + threadIdx.x];
        __syncthreads();
        if (c >= C) continue;
        for (int k = 0; k < count; k++) {
            int token = chunk[k];
            if (token % EMBEDDING_CLASSES != token_class) continue;
            size_t at = (size_t)token * C + c;
            dweight[at] = (floatX)((float)dweight[at] + (float)dout[(size_t)(first + k) * C + c]);
        }
    }
}

cudaError_t embedding_backward_launch(floatX *dweight, const floatX *dout, const int *tokens, int N, int C,
                                      cudaStream_t stream) {
    if (N <= 0 || C <= 0) return cudaSuccess;
    dim3 grid((unsigned)((C + THREADS - 1) / THREADS), EMBEDDING_CLASSES);
    embedding_backward_kernel<<<grid, THREADS, 0, stream>>>(dweight, dout, tokens, N, C);
    return cudaGetLastError();
}

/* ---- RMSNorm ---- */

/* One row's norm, in its block, from each thread's share of the sum of squares (its columns c = threadIdx.x, +
 * blockDim.x, ...): the block's sum in double (other order than the CPU's loop, each square exact), rstd from it,
 * then each element's scale (the CPU's formula: float32's, or bfloat16's two roundings when bf16). */
__device__ void rmsnorm_row(floatX *y, float *rstd, const floatX *x, const floatX *weight, int C, float eps, int bf16,
                            double sum_squares) {
    sum_squares = block_sum(sum_squares);
    float r = km_rmsnorm_rstd(sum_squares, C, eps);
    if (threadIdx.x == 0) rstd[blockIdx.x] = r;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        y[c] = (floatX)(bf16 ? km_bf16_rmsnorm_scale((float)x[c], (float)weight[c], r)
                             : km_rmsnorm_scale((float)x[c], (float)weight[c], r));
}

/* One block per row. */
__global__ void rmsnorm_forward_kernel(floatX *out, float *rstd, const floatX *inp, const floatX *weight, int C,
                                       float eps, int bf16) {
    const floatX *x = inp + (size_t)blockIdx.x * C;
    double sum_squares = 0.0;
    for (int c = threadIdx.x; c < C; c += blockDim.x) sum_squares += km_square((float)x[c]);
    rmsnorm_row(out + (size_t)blockIdx.x * C, rstd, x, weight, C, eps, bf16, sum_squares);
}

static cudaError_t rmsnorm_forward_any(floatX *out, float *rstd, const floatX *inp, const floatX *weight, int N, int C,
                                       float eps, int bf16, cudaStream_t stream) {
    if (N <= 0 || C <= 0) return cudaSuccess;
    rmsnorm_forward_kernel<<<N, THREADS, 0, stream>>>(out, rstd, inp, weight, C, eps, bf16);
    return cudaGetLastError();
}

cudaError_t rmsnorm_forward_launch(floatX *out, float *rstd, const floatX *inp, const floatX *weight, int N, int C,
                                   float eps, cudaStream_t stream) {
    return rmsnorm_forward_any(out, rstd, inp, weight, N, C, eps, 0, stream);
}

cudaError_t rmsnorm_forward_bf16_launch(floatX *out, float *rstd, const floatX *inp, const floatX *weight, int N,
                                        int C, float eps, cudaStream_t stream) {
    return rmsnorm_forward_any(out, rstd, inp, weight, N, C, eps, 1, stream);
}

/* The residual add and the norm in one pass, one block per row: each thread adds its columns (rounded to bfloat16
 * when bf16, as add_inplace then round_to), writes them back and sums their squares; rmsnorm_row reads back only
 * the columns the same thread wrote (and block_sum's barrier lies between). */
__global__ void residual_rmsnorm_forward_kernel(floatX *residual, floatX *out, float *rstd, const floatX *inp,
                                                const floatX *weight, int C, float eps, int bf16) {
    floatX *x = residual + (size_t)blockIdx.x * C;
    const floatX *add = inp + (size_t)blockIdx.x * C;
    double sum_squares = 0.0;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float value = (float)x[c] + (float)add[c];
        if (bf16) value = km_bf16_round(value);
        x[c] = (floatX)value;
        sum_squares += km_square(value);
    }
    rmsnorm_row(out + (size_t)blockIdx.x * C, rstd, x, weight, C, eps, bf16, sum_squares);
}

cudaError_t residual_rmsnorm_forward_launch(floatX *residual, floatX *out, float *rstd, const floatX *inp,
                                            const floatX *weight, int N, int C, float eps, int bf16,
                                            cudaStream_t stream) {
    if (N <= 0 || C <= 0) return cudaSuccess;
    residual_rmsnorm_forward_kernel<<<N, THREADS, 0, stream>>>(residual, out, rstd, inp, weight, C, eps, bf16);
    return cudaGetLastError();
}

/* One block per row: the dot sum_j w_j dy_j x_j in double, the coefficient r^3 / C * dot, then dx = dres + ...
 * (dres NULL: 0; it may be dinp: each element read before the same thread writes it). */
__global__ void rmsnorm_backward_dinp_kernel(floatX *dinp, const floatX *dresidual, const floatX *dout,
                                             const floatX *inp, const floatX *weight, const float *rstd, int C) {
    int n = blockIdx.x;
    const floatX *x = inp + (size_t)n * C, *dy = dout + (size_t)n * C;
    const floatX *dres = dresidual != NULL ? dresidual + (size_t)n * C : NULL;
    floatX *dx = dinp + (size_t)n * C;
    float r = rstd[n];
    double dot = 0.0;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        dot += km_rmsnorm_dot_term((float)weight[c], (float)dy[c], (float)x[c]);
    dot = block_sum(dot);
    float coefficient = km_rmsnorm_coefficient(dot, r, C);
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        dx[c] = (floatX)((dres != NULL ? (float)dres[c] : 0.0f) +
                         km_rmsnorm_dinp(r, (float)weight[c], (float)dy[c], (float)x[c], coefficient));
}

/* Column sums into a weight gradient without atomics: a block covers 32 columns (threadIdx.x) and 16 row groups
 * (threadIdx.y); group g sums rows g, g + 16, ... in order, in the type Term(n, c) returns (float; double for the
 * bfloat16 RMSNorm's, as its CPU loop), then thread (c, 0) adds the 16 partials in order and Finish folds that
 * into out[c]. */
#define COLUMN_GROUPS 16
template <typename Term, typename Finish>
__global__ void column_sum_kernel(floatX *out, int N, int C, Term term, Finish finish) {
    typedef decltype(term(0, 0)) Sum;
    __shared__ Sum partial[COLUMN_GROUPS][32];
    int c = blockIdx.x * 32 + threadIdx.x;
    Sum sum = 0;
    if (c < C)
        for (int n = threadIdx.y; n < N; n += COLUMN_GROUPS) sum += term(n, c);
    partial[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        Sum total = partial[0][threadIdx.x];
        for (int g = 1; g < COLUMN_GROUPS; g++) total += partial[g][threadIdx.x];
        out[c] = finish((float)out[c], total);
    }
}

/* out[c] + total, in float (a float32 gradient). */
struct add_total {
    __device__ floatX operator()(float old, float total) const { return (floatX)(old + total); }
};

struct rmsnorm_dweight_term {
    const floatX *dout, *inp;
    const float *rstd;
    int C;
    __device__ float operator()(int n, int c) const {
        size_t at = (size_t)n * C + c;
        return km_rmsnorm_dweight((float)dout[at], (float)inp[at], rstd[n]);
    }
};

struct column_term {
    const floatX *values;
    int C;
    __device__ float operator()(int n, int c) const { return (float)values[(size_t)n * C + c]; }
};

template <typename Term, typename Finish = add_total>
static cudaError_t column_sum_launch(floatX *out, int N, int C, Term term, cudaStream_t stream,
                                     Finish finish = Finish()) {
    if (N <= 0 || C <= 0) return cudaSuccess;
    column_sum_kernel<<<(unsigned)((C + 31) / 32), dim3(32, COLUMN_GROUPS), 0, stream>>>(out, N, C, term, finish);
    return cudaGetLastError();
}

cudaError_t rmsnorm_backward_launch(floatX *dinp, const floatX *dresidual, floatX *dweight, const floatX *dout,
                                    const floatX *inp, const floatX *weight, const float *rstd, int N, int C,
                                    cudaStream_t stream) {
    if (N <= 0 || C <= 0) return cudaSuccess;
    rmsnorm_backward_dinp_kernel<<<N, THREADS, 0, stream>>>(dinp, dresidual, dout, inp, weight, rstd, C);
    cudaError_t status = cudaGetLastError();
    if (status != cudaSuccess) return status;
    rmsnorm_dweight_term term = {dout, inp, rstd, C};
    return column_sum_launch(dweight, N, C, term, stream);
}

/* The bfloat16 backward (layers_bf16.h): one block per row, dh = bf16(dy w), the dot sum_c dh_c x_c in double,
 * the coefficient (the float32 one's), dinp = bf16(dres + bf16(r dh - x coef)) (dres as the float32 kernel's). */
__global__ void rmsnorm_backward_bf16_dinp_kernel(floatX *dinp, const floatX *dresidual, const floatX *dout,
                                                  const floatX *inp, const floatX *weight, const float *rstd, int C) {
    int n = blockIdx.x;
    const floatX *x = inp + (size_t)n * C, *dy = dout + (size_t)n * C;
    const floatX *dres = dresidual != NULL ? dresidual + (size_t)n * C : NULL;
    floatX *dx = dinp + (size_t)n * C;
    float r = rstd[n];
    double dot = 0.0;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        dot += km_bf16_rmsnorm_dot_term(km_bf16_rmsnorm_dh((float)dy[c], (float)weight[c]), (float)x[c]);
    dot = block_sum(dot);
    float coefficient = km_rmsnorm_coefficient(dot, r, C);
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        dx[c] = (floatX)km_bf16_rmsnorm_dinp(dres != NULL ? (float)dres[c] : 0.0f, r,
                                             km_bf16_rmsnorm_dh((float)dy[c], (float)weight[c]), (float)x[c],
                                             coefficient);
}

/* dweight's term bf16(dy bf16(x r)), summed over the rows in double (the CPU's loop does), and the column's sum
 * rounded once before the float32 add: dweight += bf16(float(sum)). */
struct rmsnorm_bf16_dweight_term {
    const floatX *dout, *inp;
    const float *rstd;
    int C;
    __device__ double operator()(int n, int c) const {
        size_t at = (size_t)n * C + c;
        return km_bf16_rmsnorm_dweight_term((float)dout[at], (float)inp[at], rstd[n]);
    }
};

struct add_rounded_total {
    __device__ floatX operator()(float old, double total) const { return (floatX)(old + km_bf16_round((float)total)); }
};

cudaError_t rmsnorm_backward_bf16_launch(floatX *dinp, const floatX *dresidual, floatX *dweight, const floatX *dout,
                                         const floatX *inp, const floatX *weight, const float *rstd, int N, int C,
                                         cudaStream_t stream) {
    if (N <= 0 || C <= 0) return cudaSuccess;
    rmsnorm_backward_bf16_dinp_kernel<<<N, THREADS, 0, stream>>>(dinp, dresidual, dout, inp, weight, rstd, C);
    cudaError_t status = cudaGetLastError();
    if (status != cudaSuccess) return status;
    rmsnorm_bf16_dweight_term term = {dout, inp, rstd, C};
    return column_sum_launch(dweight, N, C, term, stream, add_rounded_total());
}

/* ---- linear's bias ---- */

template <typename Index> __global__ void bias_broadcast_kernel(Index count, floatX *out, const floatX *bias, int OC) {
    for (Index i = blockIdx.x * (Index)blockDim.x + threadIdx.x; i < count; i += (Index)gridDim.x * blockDim.x)
        out[i] = bias[i % (Index)OC];
}

cudaError_t bias_broadcast_launch(floatX *out, const floatX *bias, int N, int OC, cudaStream_t stream) {
    size_t count = (size_t)N * OC;
    if (count == 0) return cudaSuccess;
    LAUNCH_INDEXED(bias_broadcast_kernel, count, stream, out, bias, OC);
    return cudaGetLastError();
}

template <typename Index> __global__ void bias_add_bf16_kernel(Index count, floatX *out, const floatX *bias, int OC) {
    for (Index i = blockIdx.x * (Index)blockDim.x + threadIdx.x; i < count; i += (Index)gridDim.x * blockDim.x)
        out[i] = (floatX)km_bf16_round((float)out[i] + (float)bias[i % (Index)OC]);
}

cudaError_t bias_add_bf16_launch(floatX *out, const floatX *bias, int N, int OC, cudaStream_t stream) {
    size_t count = (size_t)N * OC;
    if (count == 0) return cudaSuccess;
    LAUNCH_INDEXED(bias_add_bf16_kernel, count, stream, out, bias, OC);
    return cudaGetLastError();
}

cudaError_t bias_backward_launch(floatX *dbias, const floatX *dout, int N, int OC, cudaStream_t stream) {
    column_term term = {dout, OC};
    return column_sum_launch(dbias, N, OC, term, stream);
}

/* ---- RoPE ---- */

/* One thread per pair (x[i], x[i + D/2]) of one head at one position: x is (B, T, H, D), the tables (T, D).
 * float32 (bf16 0): km_rope_first / second, direction +1 forward, -1 backward. bfloat16 (bf16 1, layers_bf16.h):
 * forward x1' = bf16(bf16(x1 c1) - bf16(x2 s1)), x2' = bf16(bf16(x2 c2) + bf16(x1 s2)); backward
 * dx1 = bf16(bf16(dy1 c1) + bf16(dy2 s2)), dx2 = bf16(bf16(dy2 c2) - bf16(dy1 s1)); the tables rounded to bfloat16 as
 * read (kernel_math.h). */
template <typename Index>
__global__ void rope_kernel(Index pairs, floatX *x, const float *cos_table, const float *sin_table, int T, int H, int D,
                            float direction, int bf16) {
    Index half = (Index)(D / 2);
    for (Index p = blockIdx.x * (Index)blockDim.x + threadIdx.x; p < pairs; p += (Index)gridDim.x * blockDim.x) {
        int i = (int)(p % half);
        Index head = p / half; /* (b, t, h) flattened */
        int t = (int)(head / (Index)H % (Index)T);
        floatX *v = x + (size_t)head * D;
        const float *cos_row = cos_table + (size_t)t * D, *sin_row = sin_table + (size_t)t * D;
        float x1 = (float)v[i], x2 = (float)v[i + half];
        if (!bf16) {
            v[i] = (floatX)km_rope_first(x1, x2, cos_row[i], sin_row[i], direction);
            v[i + half] = (floatX)km_rope_second(x1, x2, cos_row[i + half], sin_row[i + half], direction);
        } else if (direction < 0.0f) {
            v[i] = (floatX)km_bf16_rope_sum(x1, cos_row[i], x2, sin_row[i + half]);
            v[i + half] = (floatX)km_bf16_rope_difference(x2, cos_row[i + half], x1, sin_row[i]);
        } else {
            v[i] = (floatX)km_bf16_rope_difference(x1, cos_row[i], x2, sin_row[i]);
            v[i + half] = (floatX)km_bf16_rope_sum(x2, cos_row[i + half], x1, sin_row[i + half]);
        }
    }
}

static cudaError_t rope_any_launch(floatX *x, const float *cos_table, const float *sin_table, int B, int T, int H,
                                   int D, float direction, int bf16, cudaStream_t stream) {
    size_t pairs = (size_t)B * T * H * (D / 2);
    if (pairs == 0) return cudaSuccess;
    LAUNCH_INDEXED(rope_kernel, pairs, stream, x, cos_table, sin_table, T, H, D, direction, bf16);
    return cudaGetLastError();
}

cudaError_t rope_launch(floatX *x, const float *cos_table, const float *sin_table, int B, int T, int H, int D,
                        float direction, cudaStream_t stream) {
    return rope_any_launch(x, cos_table, sin_table, B, T, H, D, direction, 0, stream);
}

cudaError_t rope_bf16_launch(floatX *x, const float *cos_table, const float *sin_table, int B, int T, int H, int D,
                             int backward, cudaStream_t stream) {
    return rope_any_launch(x, cos_table, sin_table, B, T, H, D, backward ? -1.0f : 1.0f, 1, stream);
}

/* ---- attention's softmaxes ---- */

/* One block per row of scores (blocks * T rows of width past + T): row t is query position past + t and keeps
 * columns 0 .. past + t. The max (exact whatever the order), the exps and their double sum, then the scale. */
__global__ void causal_softmax_kernel(float *scores, int T, int past) {
    int width = past + T;
    size_t row_index = blockIdx.x;
    int t = (int)(row_index % T), last = past + t;
    float *row = scores + row_index * width;
    float max_value = -INFINITY;
    for (int j = threadIdx.x; j <= last; j += blockDim.x) max_value = km_max(max_value, row[j]);
    max_value = block_max(max_value);
    double sum = 0.0;
    for (int j = threadIdx.x; j <= last; j += blockDim.x) {
        float e = km_softmax_exp(row[j], max_value);
        row[j] = e;
        sum += e;
    }
    float inverse = km_softmax_inverse(block_sum(sum));
    for (int j = threadIdx.x; j < width; j += blockDim.x) row[j] = j <= last ? row[j] * inverse : 0.0f;
}

cudaError_t causal_softmax_launch(float *scores, int blocks, int T, int past, cudaStream_t stream) {
    size_t rows = (size_t)blocks * T;
    if (rows == 0) return cudaSuccess;
    causal_softmax_kernel<<<(unsigned)rows, THREADS, 0, stream>>>(scores, T, past);
    return cudaGetLastError();
}

/* One block per row of dp (blocks, T, T), row t of its block: ds_j = p_j (dp_j - sum_k p_k dp_k) for j <= t, 0
 * after. */
__global__ void softmax_backward_kernel(float *dp, const float *probs, int T) {
    size_t row_index = blockIdx.x;
    int t = (int)(row_index % T);
    float *row = dp + row_index * T;
    const float *p_row = probs + row_index * T;
    double dot = 0.0;
    for (int j = threadIdx.x; j <= t; j += blockDim.x) dot += km_softmax_dot_term(p_row[j], row[j]);
    dot = block_sum(dot);
    for (int j = threadIdx.x; j < T; j += blockDim.x)
        row[j] = j <= t ? km_softmax_backward(p_row[j], row[j], dot) : 0.0f;
}

cudaError_t softmax_backward_launch(float *dp, const float *probs, int blocks, int T, cudaStream_t stream) {
    size_t rows = (size_t)blocks * T;
    if (rows == 0) return cudaSuccess;
    softmax_backward_kernel<<<(unsigned)rows, THREADS, 0, stream>>>(dp, probs, T);
    return cudaGetLastError();
}

/* One thread per element, indexed in the (B, T, heads, D) layout. */
template <typename Index>
__global__ void heads_layout_kernel(Index count, float *dst, const float *src, int T, int heads, int D,
                                    heads_layout_op op) {
    for (Index i = blockIdx.x * (Index)blockDim.x + threadIdx.x; i < count; i += (Index)gridDim.x * blockDim.x) {
        Index row = i / (Index)D, d = i - row * (Index)D; /* row: (b, t, h) */
        Index h = row % (Index)heads, bt = row / (Index)heads, t = bt % (Index)T, b = bt / (Index)T;
        Index major = ((b * (Index)heads + h) * (Index)T + t) * (Index)D + d; /* a permutation: below count */
        if (op == HEADS_TO_MAJOR)
            dst[major] = src[i];
        else if (op == HEADS_FROM_MAJOR)
            dst[i] = src[major];
        else
            dst[i] = km_bf16_round(src[major]);
    }
}

cudaError_t heads_layout_launch(float *dst, const float *src, int B, int T, int heads, int D, heads_layout_op op,
                                cudaStream_t stream) {
    size_t count = (size_t)B * T * heads * D;
    if (count == 0) return cudaSuccess;
    LAUNCH_INDEXED(heads_layout_kernel, count, stream, dst, src, T, heads, D, op);
    return cudaGetLastError();
}

/* One thread per element of dst, its group's terms added in head order. */
template <typename Index>
__global__ void group_sum_kernel(Index count, float *dst, const float *terms, int T, int KVH, int group, int D,
                                 int round) {
    for (Index i = blockIdx.x * (Index)blockDim.x + threadIdx.x; i < count; i += (Index)gridDim.x * blockDim.x) {
        Index row = i / (Index)D, d = i - row * (Index)D; /* row: (b, t, kv) */
        Index kv = row % (Index)KVH, bt = row / (Index)KVH, t = bt % (Index)T, b = bt / (Index)T;
        size_t H = (size_t)KVH * group; /* terms holds group x count elements: size_t offsets */
        const float *term = terms + ((b * H + (size_t)kv * group) * T + t) * D + d; /* head g's: g T D further */
        float sum = round ? km_bf16_round(term[0]) : term[0];
        for (int g = 1; g < group; g++) {
            float next = term[(size_t)g * T * D];
            sum = sum + (round ? km_bf16_round(next) : next);
        }
        dst[i] = round ? km_bf16_round(sum) : sum;
    }
}

cudaError_t group_sum_launch(float *dst, const float *terms, int B, int T, int KVH, int group, int D, int round,
                             cudaStream_t stream) {
    size_t count = (size_t)B * T * KVH * D;
    if (count == 0) return cudaSuccess;
    LAUNCH_INDEXED(group_sum_kernel, count, stream, dst, terms, T, KVH, group, D, round);
    return cudaGetLastError();
}

/* The bfloat16 attention's element steps (layers_bf16.h).
 * Scores in place: s = bf16(bf16(q.k) * scale) on every entry (the softmax masks the future ones after). */
__global__ void attention_scores_bf16_kernel(float *scores, size_t count, float scale) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x)
        scores[i] = km_bf16_attention_score(scores[i], scale);
}

cudaError_t attention_scores_bf16_launch(float *scores, size_t count, float scale, cudaStream_t stream) {
    if (count == 0) return cudaSuccess;
    attention_scores_bf16_kernel<<<grid_for(count, THREADS), THREADS, 0, stream>>>(scores, count, scale);
    return cudaGetLastError();
}

/* One block per row of dp (blocks, T, T), row t of its block: dot = sum_{j <= t} p_j bf16(dp_j) in double, then
 * ds_j = bf16(bf16(p_j (bf16(dp_j) - dot)) * scale) for j <= t, 0 after. */
__global__ void softmax_backward_bf16_kernel(float *dp, const float *probs, int T, float scale) {
    size_t row_index = blockIdx.x;
    int t = (int)(row_index % T);
    float *row = dp + row_index * T;
    const float *p_row = probs + row_index * T;
    double dot = 0.0;
    for (int j = threadIdx.x; j <= t; j += blockDim.x) dot += km_softmax_dot_term(p_row[j], km_bf16_round(row[j]));
    dot = block_sum(dot);
    for (int j = threadIdx.x; j < T; j += blockDim.x)
        row[j] = j <= t ? km_bf16_softmax_backward(p_row[j], row[j], dot, scale) : 0.0f;
}

cudaError_t softmax_backward_bf16_launch(float *dp, const float *probs, int blocks, int T, float scale,
                                         cudaStream_t stream) {
    size_t rows = (size_t)blocks * T;
    if (rows == 0) return cudaSuccess;
    softmax_backward_bf16_kernel<<<(unsigned)rows, THREADS, 0, stream>>>(dp, probs, T, scale);
    return cudaGetLastError();
}

/* ---- SwiGLU ---- */

/* One thread per output element. float32 (bf16 0): silu(gate) up and its derivatives (kernel_math.h); bfloat16
 * (bf16 1, layers_bf16.h): out = bf16(bf16(silu(gate)) up); dgate = bf16(bf16(dy up) silu'(gate)),
 * dup = bf16(dy bf16(silu(gate))). */
template <typename Index>
__global__ void swiglu_forward_kernel(Index count, floatX *out, const floatX *gate_up, int width, int bf16) {
    for (Index i = blockIdx.x * (Index)blockDim.x + threadIdx.x; i < count; i += (Index)gridDim.x * blockDim.x) {
        Index n = i / (Index)width, k = i - n * (Index)width;
        const floatX *gate = gate_up + (size_t)n * 2 * width, *up = gate + width;
        out[i] = (floatX)(bf16 ? km_bf16_swiglu((float)gate[k], (float)up[k]) : km_silu((float)gate[k]) * (float)up[k]);
    }
}

template <typename Index>
__global__ void swiglu_backward_kernel(Index count, floatX *dgate_up, const floatX *dout, const floatX *gate_up,
                                       int width, int bf16) {
    for (Index i = blockIdx.x * (Index)blockDim.x + threadIdx.x; i < count; i += (Index)gridDim.x * blockDim.x) {
        Index n = i / (Index)width, k = i - n * (Index)width;
        const floatX *gate = gate_up + (size_t)n * 2 * width, *up = gate + width;
        floatX *dgate = dgate_up + (size_t)n * 2 * width, *dup = dgate + width;
        float g = (float)gate[k], u = (float)up[k], dy = (float)dout[i];
        if (bf16) {
            dgate[k] = (floatX)km_bf16_swiglu_dgate(dy, u, g);
            dup[k] = (floatX)km_bf16_swiglu_dup(dy, g);
        } else {
            float s = km_sigmoid(g); /* one exp serves silu and its derivative */
            dgate[k] = (floatX)km_swiglu_dgate(dy, u, s, g);
            dup[k] = (floatX)km_swiglu_dup(dy, g, s);
        }
    }
}

static cudaError_t swiglu_forward_any(floatX *out, const floatX *gate_up, int N, int width, int bf16,
                                      cudaStream_t stream) {
    size_t count = (size_t)N * width;
    if (count == 0) return cudaSuccess;
    LAUNCH_INDEXED(swiglu_forward_kernel, count, stream, out, gate_up, width, bf16);
    return cudaGetLastError();
}

static cudaError_t swiglu_backward_any(floatX *dgate_up, const floatX *dout, const floatX *gate_up, int N, int width,
                                       int bf16, cudaStream_t stream) {
    size_t count = (size_t)N * width;
    if (count == 0) return cudaSuccess;
    LAUNCH_INDEXED(swiglu_backward_kernel, count, stream, dgate_up, dout, gate_up, width, bf16);
    return cudaGetLastError();
}

cudaError_t swiglu_forward_launch(floatX *out, const floatX *gate_up, int N, int width, cudaStream_t stream) {
    return swiglu_forward_any(out, gate_up, N, width, 0, stream);
}

cudaError_t swiglu_backward_launch(floatX *dgate_up, const floatX *dout, const floatX *gate_up, int N, int width,
                                   cudaStream_t stream) {
    return swiglu_backward_any(dgate_up, dout, gate_up, N, width, 0, stream);
}

cudaError_t swiglu_forward_bf16_launch(floatX *out, const floatX *gate_up, int N, int width, cudaStream_t stream) {
    return swiglu_forward_any(out, gate_up, N, width, 1, stream);
}

cudaError_t swiglu_backward_bf16_launch(floatX *dgate_up, const floatX *dout, const floatX *gate_up, int N, int width,
                                        cudaStream_t stream) {
    return swiglu_backward_any(dgate_up, dout, gate_up, N, width, 1, stream);
}

/* out = bf16(bf16(out) + bf16(other)): two modules' bfloat16 input gradients added (kernel_math.h). */
__global__ void add_rounded_bf16_kernel(floatX *out, const floatX *other, size_t count) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x)
        out[i] = (floatX)km_bf16_add_rounded((float)out[i], (float)other[i]);
}

cudaError_t add_rounded_bf16_launch(floatX *out, const floatX *other, size_t count, cudaStream_t stream) {
    if (count == 0) return cudaSuccess;
    add_rounded_bf16_kernel<<<grid_for(count, THREADS), THREADS, 0, stream>>>(out, other, count);
    return cudaGetLastError();
}

/* ---- cross-entropy ---- */

/* One block: the count of targets that are not ignore_index (an integer sum: any order gives the same). */
__global__ void __launch_bounds__(1024)
    cross_entropy_count_kernel(const int *targets, int N, int ignore_index, void *scratch) {
    double counted = 0.0; /* exact: N < 2^53 */
    for (int n = threadIdx.x; n < N; n += blockDim.x) counted += targets[n] != ignore_index;
    counted = block_sum(counted);
    if (threadIdx.x == 0) scratch_result(scratch)->count = (int)counted;
}

/* A logit as the loss reads it: its bfloat16 rounding when `bf16` (layers.c's read_logit). */
__device__ float read_logit(const floatX *row, int j, int bf16) {
    return bf16 ? km_bf16_round((float)row[j]) : (float)row[j];
}

/* Block b takes rows b, b + gridDim.x, ... in order: per row the max, the double sum of exps, log_sum, the row's
 * loss (log_sum - x_target) added to the block's partial, and the row's dlogits (the CPU's formulas) times
 * dlogits_scale (one float multiply: what a `scale` kernel after it would do, without a second pass), rounded to
 * bfloat16 when round_bf16 is set (the same: no pass of its own). Each logit is read as its bfloat16 rounding when
 * logits_bf16 is set (the head's rounding, no pass of its own either). An ignored row's dlogits are 0. */
__global__ void __launch_bounds__(1024)
    cross_entropy_rows_kernel(floatX *dlogits, const floatX *logits, int logits_bf16, const int *targets, int N, int V,
                              int ignore_index, float dlogits_scale, int round_bf16, void *scratch) {
    int count = scratch_result(scratch)->count;
    double block_loss = 0.0;
    for (int n = blockIdx.x; n < N; n += gridDim.x) {
        const floatX *row = logits + (size_t)n * V;
        floatX *drow = dlogits != NULL ? dlogits + (size_t)n * V : NULL;
        int target = targets[n];
        if (target == ignore_index) {
            if (drow != NULL)
                for (int j = threadIdx.x; j < V; j += blockDim.x) drow[j] = (floatX)0.0f;
            continue;
        }
        float max_value = -INFINITY;
        for (int j = threadIdx.x; j < V; j += blockDim.x)
            max_value = km_max(max_value, read_logit(row, j, logits_bf16));
        max_value = block_max(max_value);
        double sum = 0.0;
        for (int j = threadIdx.x; j < V; j += blockDim.x)
            sum += km_cross_entropy_exp(read_logit(row, j, logits_bf16), max_value);
        double log_sum = km_cross_entropy_log_sum(block_sum(sum), max_value);
        block_loss += log_sum - read_logit(row, target, logits_bf16);
        if (drow != NULL) {
            float inverse_count = km_cross_entropy_inverse_count(count);
            for (int j = threadIdx.x; j < V; j += blockDim.x) {
                float d = km_cross_entropy_dlogit(read_logit(row, j, logits_bf16), log_sum, inverse_count);
                if (j == target) d -= inverse_count;
                float scaled = d * dlogits_scale;
                drow[j] = (floatX)(round_bf16 ? km_bf16_round(scaled) : scaled);
            }
        }
    }
    if (threadIdx.x == 0) scratch_partials(scratch)[blockIdx.x] = block_loss;
}

/* One block: the partial losses summed in block order, the mean; with a loss slot (sum, count), the mean added into
 * it as (double)mean * count and the count beside it (device.h's cross_entropy_to_slot). */
__global__ void cross_entropy_mean_kernel(int blocks, void *scratch, double *slot) {
    double loss = 0.0;
    for (int b = threadIdx.x; b < blocks; b += blockDim.x) loss += scratch_partials(scratch)[b];
    loss = block_sum(loss);
    if (threadIdx.x == 0) {
        kernels_result *result = scratch_result(scratch);
        result->value = loss;
        result->mean_loss = result->count > 0 ? (float)(loss / result->count) : 0.0f;
        if (slot != NULL) {
            slot[0] += (double)result->mean_loss * result->count;
            slot[1] += result->count;
        }
    }
}

cudaError_t cross_entropy_launch(floatX *dlogits, const floatX *logits, int logits_bf16, const int *targets, int N,
                                 int V, int ignore_index, float dlogits_scale, int round_bf16, double *slot,
                                 void *scratch, cudaStream_t stream) {
    int blocks = N < KERNELS_REDUCE_BLOCKS ? (N > 0 ? N : 1) : KERNELS_REDUCE_BLOCKS;
    cross_entropy_count_kernel<<<1, 1024, 0, stream>>>(targets, N, ignore_index, scratch);
    cudaError_t status = cudaGetLastError();
    if (status != cudaSuccess) return status;
    cross_entropy_rows_kernel<<<blocks, 1024, 0, stream>>>(dlogits, logits, logits_bf16, targets, N, V, ignore_index,
                                                           dlogits_scale, round_bf16, scratch);
    status = cudaGetLastError();
    if (status != cudaSuccess) return status;
    cross_entropy_mean_kernel<<<1, THREADS, 0, stream>>>(blocks, scratch, slot);
    return cudaGetLastError();
}

/* ---- vectors ---- */

__global__ void add_inplace_kernel(floatX *out, const floatX *inp, size_t count) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x)
        out[i] = (floatX)((float)out[i] + (float)inp[i]);
}

cudaError_t add_inplace_launch(floatX *out, const floatX *inp, size_t count, cudaStream_t stream) {
    if (count == 0) return cudaSuccess;
    add_inplace_kernel<<<grid_for(count, THREADS), THREADS, 0, stream>>>(out, inp, count);
    return cudaGetLastError();
}

__global__ void scale_kernel(floatX *x, float factor, size_t count) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x)
        x[i] = (floatX)((float)x[i] * factor);
}

cudaError_t scale_launch(floatX *x, float factor, size_t count, cudaStream_t stream) {
    if (count == 0) return cudaSuccess;
    scale_kernel<<<grid_for(count, THREADS), THREADS, 0, stream>>>(x, factor, count);
    return cudaGetLastError();
}

/* Pass 1: block b sums its grid-stride share in double into partial b. Pass 2: one block sums the partials. */
__global__ void sum_partials_kernel(const floatX *x, size_t count, int squares, void *scratch) {
    double sum = 0.0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x) {
        float v = (float)x[i];
        sum += squares ? km_square(v) : fabs((double)v);
    }
    sum = block_sum(sum);
    if (threadIdx.x == 0) scratch_partials(scratch)[blockIdx.x] = sum;
}

__global__ void sum_final_kernel(int blocks, void *scratch) {
    double sum = 0.0;
    for (int b = threadIdx.x; b < blocks; b += blockDim.x) sum += scratch_partials(scratch)[b];
    sum = block_sum(sum);
    if (threadIdx.x == 0) scratch_result(scratch)->value = sum;
}

static int reduce_blocks(size_t count) {
    unsigned blocks = grid_for(count, THREADS);
    return blocks < KERNELS_REDUCE_BLOCKS ? (int)blocks : KERNELS_REDUCE_BLOCKS;
}

cudaError_t sum_launch(const floatX *x, size_t count, int squares, void *scratch, cudaStream_t stream) {
    int blocks = reduce_blocks(count);
    sum_partials_kernel<<<blocks, THREADS, 0, stream>>>(x, count, squares, scratch);
    cudaError_t status = cudaGetLastError();
    if (status != cudaSuccess) return status;
    sum_final_kernel<<<1, THREADS, 0, stream>>>(blocks, scratch);
    return cudaGetLastError();
}

/* The first index whose value is not finite (km_is_finite: the exponent bits), or count. */
__global__ void nonfinite_partials_kernel(const floatX *x, size_t count, void *scratch) {
    uint64_t first = count;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count && first == count;
         i += (size_t)gridDim.x * blockDim.x)
        if (!km_is_finite((float)x[i])) first = i;
    first = block_min_index(first);
    if (threadIdx.x == 0) scratch_indices(scratch)[blockIdx.x] = first;
}

__global__ void nonfinite_final_kernel(int blocks, size_t count, void *scratch) {
    uint64_t first = count;
    for (int b = threadIdx.x; b < blocks; b += blockDim.x) {
        uint64_t candidate = scratch_indices(scratch)[b];
        first = candidate < first ? candidate : first;
    }
    first = block_min_index(first);
    if (threadIdx.x == 0) scratch_result(scratch)->index = first;
}

cudaError_t first_nonfinite_launch(const floatX *x, size_t count, void *scratch, cudaStream_t stream) {
    int blocks = reduce_blocks(count);
    nonfinite_partials_kernel<<<blocks, THREADS, 0, stream>>>(x, count, scratch);
    cudaError_t status = cudaGetLastError();
    if (status != cudaSuccess) return status;
    nonfinite_final_kernel<<<1, THREADS, 0, stream>>>(blocks, count, scratch);
    return cudaGetLastError();
}

__global__ void float_to_bf16_kernel(uint16_t *dst, const float *src, size_t count) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = km_bf16_from_float(src[i]);
}

__global__ void bf16_to_float_kernel(float *dst, const uint16_t *src, size_t count) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = km_bf16_to_float(src[i]);
}

__global__ void round_to_bf16_kernel(float *x, size_t count) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x)
        x[i] = km_bf16_round(x[i]);
}

/* dst = bf16(src), float32 to float32 (a rounded copy: the probabilities as the GEMM with V reads them). */
__global__ void round_copy_bf16_kernel(float *dst, const float *src, size_t count) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = km_bf16_round(src[i]);
}

cudaError_t round_copy_bf16_launch(float *dst, const float *src, size_t count, cudaStream_t stream) {
    if (count == 0) return cudaSuccess;
    round_copy_bf16_kernel<<<grid_for(count, THREADS), THREADS, 0, stream>>>(dst, src, count);
    return cudaGetLastError();
}

cudaError_t float_to_bf16_launch(uint16_t *dst, const float *src, size_t count, cudaStream_t stream) {
    if (count == 0) return cudaSuccess;
    float_to_bf16_kernel<<<grid_for(count, THREADS), THREADS, 0, stream>>>(dst, src, count);
    return cudaGetLastError();
}

/* out += the bfloat16 input widened (exact), one float32 add per element: the CPU's accumulate. */
__global__ void accumulate_bf16_kernel(float *out, const uint16_t *inp, size_t count) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x)
        out[i] = out[i] + km_bf16_to_float(inp[i]);
}

cudaError_t accumulate_bf16_launch(float *out, const uint16_t *inp, size_t count, cudaStream_t stream) {
    if (count == 0) return cudaSuccess;
    accumulate_bf16_kernel<<<grid_for(count, THREADS), THREADS, 0, stream>>>(out, inp, count);
    return cudaGetLastError();
}

cudaError_t bf16_to_float_launch(float *dst, const uint16_t *src, size_t count, cudaStream_t stream) {
    if (count == 0) return cudaSuccess;
    bf16_to_float_kernel<<<grid_for(count, THREADS), THREADS, 0, stream>>>(dst, src, count);
    return cudaGetLastError();
}

cudaError_t round_to_bf16_launch(float *x, size_t count, cudaStream_t stream) {
    if (count == 0) return cudaSuccess;
    round_to_bf16_kernel<<<grid_for(count, THREADS), THREADS, 0, stream>>>(x, count);
    return cudaGetLastError();
}

/* ---- FSDP2's rank-major copies (device.h's rows_copy) ---- */

/* A launch's share: up to KERNELS_ROWS_PARAMS parameters of `ranks` ranks, passed by value (1 KB of the kernel's
 * 4 KB of arguments), so nothing is copied to the device first. */
typedef struct rows_batch {
    device_rows_param params[KERNELS_ROWS_PARAMS];
    int count, first_rank;
    size_t sharded_numel;
} rows_batch;

__device__ static inline float rows_load(float x) { return x; }
__device__ static inline float rows_load(uint16_t x) { return km_bf16_to_float(x); }
__device__ static inline void rows_store(float *to, float x) { *to = x; }
__device__ static inline void rows_store(uint16_t *to, float x) { *to = km_bf16_from_float(x); }

/* Block row y = r count + i: parameter i's piece in rank r's slice (no search, no division per element); the x blocks
 * stride over the piece's shard_numel elements, as the CPU's copy, conversion and zero fill of it. */
template <typename T>
__global__ void rows_copy_kernel(T *rank_major, float *full, int to_full, rows_batch b) {
    int i = (int)(blockIdx.y % (unsigned)b.count), r = (int)(blockIdx.y / (unsigned)b.count);
    const device_rows_param p = b.params[i];
    size_t begin = (size_t)(b.first_rank + r) * p.shard_numel; /* the parameter's first element the piece holds */
    size_t held = begin >= p.numel ? 0 : p.numel - begin < p.shard_numel ? p.numel - begin : p.shard_numel;
    T *piece = rank_major + (size_t)r * b.sharded_numel + p.shard_offset;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x; j < p.shard_numel; j += stride) {
        if (to_full && j < held) full[p.offset + begin + j] = rows_load(piece[j]);
        else if (!to_full) rows_store(&piece[j], j < held ? full[p.offset + begin + j] : 0.0f);
    }
}

/* Launches of at most KERNELS_ROWS_PARAMS parameters and as many ranks as the grid's y dimension (65,535 rows)
 * takes; the x blocks are enough for the largest piece, at most 1,024 (each thread then strides). */
template <typename T>
static cudaError_t rows_copy_typed(T *rank_major, float *full, int to_full, const device_rows_param *params,
                                   int param_count, size_t sharded_numel, int first_rank, int ranks,
                                   cudaStream_t stream) {
    for (int first = 0; first < param_count; first += KERNELS_ROWS_PARAMS) {
        rows_batch b;
        b.count = param_count - first < KERNELS_ROWS_PARAMS ? param_count - first : KERNELS_ROWS_PARAMS;
        b.sharded_numel = sharded_numel;
        size_t largest = 0;
        for (int i = 0; i < b.count; i++) {
            b.params[i] = params[first + i];
            largest = params[first + i].shard_numel > largest ? params[first + i].shard_numel : largest;
        }
        unsigned blocks = grid_for(largest, THREADS);
        blocks = blocks < 1024 ? blocks : 1024;
        int ranks_per_launch = 65535 / b.count;
        for (int r = 0; r < ranks; r += ranks_per_launch) {
            int these = ranks - r < ranks_per_launch ? ranks - r : ranks_per_launch;
            b.first_rank = first_rank + r;
            dim3 grid(blocks, (unsigned)(these * b.count));
            rows_copy_kernel<<<grid, THREADS, 0, stream>>>(rank_major + (size_t)r * sharded_numel, full, to_full, b);
            cudaError_t status = cudaGetLastError();
            if (status != cudaSuccess) return status;
        }
    }
    return cudaSuccess;
}

cudaError_t rows_copy_launch(void *rank_major, int bf16, float *full, int to_full, const device_rows_param *params,
                             int param_count, size_t sharded_numel, int first_rank, int ranks, cudaStream_t stream) {
    if (param_count < 1 || ranks < 1) return cudaSuccess;
    if (bf16)
        return rows_copy_typed((uint16_t *)rank_major, full, to_full, params, param_count, sharded_numel, first_rank,
                               ranks, stream);
    return rows_copy_typed((float *)rank_major, full, to_full, params, param_count, sharded_numel, first_rank, ranks,
                           stream);
}

/* ---- AdamW: the CPU's element (kernel_math.h), to the bit ---- */

__global__ void adamw_kernel(float *param, const float *grad, float *exp_avg, float *exp_avg_sq, size_t count,
                             adamw_kernel_scalars s) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x) {
        km_adamw_result r =
            km_adamw_element(param[i], grad[i], exp_avg[i], exp_avg_sq[i], s.decay, s.lerp_weight, s.beta2,
                             s.one_minus_beta2, s.bias_correction2_sqrt, s.eps, s.negative_step_size);
        param[i] = r.param;
        exp_avg[i] = r.exp_avg;
        exp_avg_sq[i] = r.exp_avg_sq;
    }
}

cudaError_t adamw_launch(float *param, const float *grad, float *exp_avg, float *exp_avg_sq, size_t count,
                         adamw_kernel_scalars scalars, cudaStream_t stream) {
    if (count == 0) return cudaSuccess;
    adamw_kernel<<<grid_for(count, THREADS), THREADS, 0, stream>>>(param, grad, exp_avg, exp_avg_sq, count, scalars);
    return cudaGetLastError();
}
