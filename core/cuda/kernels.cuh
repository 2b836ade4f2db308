/* kernels.cuh — the CUDA kernels of the compute device (core/cuda/kernels.cu), for core/cuda/cuda_ops.cu only.
 *
 * One launcher per kernel family, llm.c's way: the CPU function's signature (core/kernels/layers.h) plus the stream
 * last, returning cudaGetLastError() of its launches so the caller checks it with CUDA_CHECK (which names the rank, the
 * launcher and the line). Every launcher only queues work on `stream`; none waits. The GEMMs are not here: the
 * table functions in cuda_ops.cu call cuBLAS around these kernels.
 *
 * floatX is the element type of the tensors the kernels read and write (llm.c's name): float now. The per-element
 * math takes float (core/base/kernel_math.h), and every load widens to float and every store narrows from it, so a
 * bfloat16 floatX changes the loads, the stores and the table's pointer types, not the arithmetic. Reductions
 * (sums of squares, softmax and cross-entropy sums, RMSNorm's dot) accumulate in double, as the CPU's do.
 */
#ifndef FSDPLAB_CUDA_KERNELS_CUH
#define FSDPLAB_CUDA_KERNELS_CUH

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "core/device/device.h"

typedef float floatX;

/* The reductions that return a value to the host (sum_squares, sum_abs, first_nonfinite, cross-entropy's loss) run
 * in two passes on a fixed grid: KERNELS_REDUCE_BLOCKS blocks each write a partial into the device scratch
 * (cuda_device_state.scratch), one block then combines the partials in a fixed order and writes the result at the
 * scratch's start. The same input gives the same bits every run. The scratch must hold KERNELS_SCRATCH_BYTES. */
#define KERNELS_REDUCE_BLOCKS 256
#define KERNELS_RESULT_BYTES 64
#define KERNELS_SCRATCH_BYTES (KERNELS_RESULT_BYTES + KERNELS_REDUCE_BLOCKS * (sizeof(double) + sizeof(uint64_t)))

/* What the reductions leave at the scratch's start (copied to the host scratch by the caller). */
typedef struct kernels_result {
    double value;    /* sum_squares, sum_abs; cross-entropy's summed loss */
    uint64_t index;  /* first_nonfinite */
    float mean_loss; /* cross-entropy: loss / count, or 0 when count is 0 */
    int count;       /* cross-entropy: the targets counted */
} kernels_result;

/* ---- layers (core/kernels/layers.h's meaning, device pointers) ---- */
cudaError_t embedding_forward_launch(floatX *out, const int *tokens, const floatX *weight, int N, int C,
                                     cudaStream_t stream);
cudaError_t embedding_backward_launch(floatX *dweight, const floatX *dout, const int *tokens, int N, int C,
                                      cudaStream_t stream);
cudaError_t rmsnorm_forward_launch(floatX *out, float *rstd, const floatX *inp, const floatX *weight, int N, int C,
                                   float eps, cudaStream_t stream);
/* residual += inp (rounded to bfloat16 when bf16), then the norm of it (bf16: the bfloat16 norm): one kernel. */
cudaError_t residual_rmsnorm_forward_launch(floatX *residual, floatX *out, float *rstd, const floatX *inp,
                                            const floatX *weight, int N, int C, float eps, int bf16,
                                            cudaStream_t stream);
/* dinp = dresidual (NULL: 0) + the norm's input gradient; dresidual may be dinp. */
cudaError_t rmsnorm_backward_launch(floatX *dinp, const floatX *dresidual, floatX *dweight, const floatX *dout,
                                    const floatX *inp, const floatX *weight, const float *rstd, int N, int C,
                                    cudaStream_t stream);
/* out (N, OC) = bias in every row (before a GEMM with beta = 1). */
cudaError_t bias_broadcast_launch(floatX *out, const floatX *bias, int N, int OC, cudaStream_t stream);
/* out (N, OC) = bf16(out + bias in every row) (after a GEMM with beta = 0: the bias and the rounding in one pass). */
cudaError_t bias_add_bf16_launch(floatX *out, const floatX *bias, int N, int OC, cudaStream_t stream);
/* dbias (OC) += column sums of dout (N, OC). */
cudaError_t bias_backward_launch(floatX *dbias, const floatX *dout, int N, int OC, cudaStream_t stream);
/* direction +1: forward; -1: backward (the transpose). */
cudaError_t rope_launch(floatX *x, const float *cos_table, const float *sin_table, int B, int T, int H, int D,
                        float direction, cudaStream_t stream);
/* In place on scores (rows, T, past + T) laid as `rows` blocks of T rows: row t keeps columns 0 .. past + t. */
cudaError_t causal_softmax_launch(float *scores, int blocks, int T, int past, cudaStream_t stream);
/* In place on dp (blocks, T, T): dp = p * (dp - rowsum(p * dp)), causal (columns past the diagonal 0). */
cudaError_t softmax_backward_launch(float *dp, const float *probs, int blocks, int T, cudaStream_t stream);
/* The attention's head layouts for its batched GEMMs: (B, T, heads, D) as the projections write it, and
 * (B, heads, T, D), each head's (T, D) block contiguous. HEADS_TO_MAJOR: dst (B, heads, T, D) = src (B, T, heads, D);
 * HEADS_FROM_MAJOR: dst (B, T, heads, D) = src (B, heads, T, D); HEADS_FROM_MAJOR_BF16: the same, rounded to
 * bfloat16 (the bfloat16 attention's output and dq: the rounding fused into the move). */
typedef enum heads_layout_op { HEADS_TO_MAJOR, HEADS_FROM_MAJOR, HEADS_FROM_MAJOR_BF16 } heads_layout_op;
cudaError_t heads_layout_launch(float *dst, const float *src, int B, int T, int heads, int D, heads_layout_op op,
                                cudaStream_t stream);
/* repeat_kv's backward: dst (B, T, KVH, D) = the sum of the G = H / KVH query heads' terms of each key/value head,
 * terms (B, H, T, D), added one head after another in head order (t_0 + t_1 + ...: one float32 add each, the CPU's
 * order of adding the heads); round 1 rounds each term to bfloat16 first and the sum once at the end
 * (layers_bf16.h). One thread per element of dst: no two threads write one element, so the sum is the same every
 * run. */
cudaError_t group_sum_launch(float *dst, const float *terms, int B, int T, int KVH, int group, int D, int round,
                             cudaStream_t stream);
cudaError_t swiglu_forward_launch(floatX *out, const floatX *gate_up, int N, int width, cudaStream_t stream);
cudaError_t swiglu_backward_launch(floatX *dgate_up, const floatX *dout, const floatX *gate_up, int N, int width,
                                   cudaStream_t stream);
/* Leaves the mean loss and the count in the scratch's kernels_result; the logits read as their bfloat16 rounding
 * when logits_bf16 is set; dlogits (may be NULL) times dlogits_scale in the same kernel, then rounded to bfloat16
 * when round_bf16 is set; slot (NULL: none) a device (sum, count) pair the mean and count are added into.
 * 3 launches. */
cudaError_t cross_entropy_launch(floatX *dlogits, const floatX *logits, int logits_bf16, const int *targets, int N,
                                 int V, int ignore_index, float dlogits_scale, int round_bf16, double *slot,
                                 void *scratch, cudaStream_t stream);

/* ---- the layers in bfloat16 (core/kernels/layers_bf16.h's rules; every input a bfloat16 value in a float) ---- */
cudaError_t rmsnorm_forward_bf16_launch(floatX *out, float *rstd, const floatX *inp, const floatX *weight, int N,
                                        int C, float eps, cudaStream_t stream);
cudaError_t rmsnorm_backward_bf16_launch(floatX *dinp, const floatX *dresidual, floatX *dweight, const floatX *dout,
                                         const floatX *inp, const floatX *weight, const float *rstd, int N, int C,
                                         cudaStream_t stream);
/* backward 0: forward; 1: backward. */
cudaError_t rope_bf16_launch(floatX *x, const float *cos_table, const float *sin_table, int B, int T, int H, int D,
                             int backward, cudaStream_t stream);
/* In place on count raw scores: bf16(bf16(s) * scale). */
cudaError_t attention_scores_bf16_launch(float *scores, size_t count, float scale, cudaStream_t stream);
/* In place on dp (blocks, T, T) from the float32 probs: the softmax's backward and the scaling's, rounded as torch. */
cudaError_t softmax_backward_bf16_launch(float *dp, const float *probs, int blocks, int T, float scale,
                                         cudaStream_t stream);
cudaError_t swiglu_forward_bf16_launch(floatX *out, const floatX *gate_up, int N, int width, cudaStream_t stream);
cudaError_t swiglu_backward_bf16_launch(floatX *dgate_up, const floatX *dout, const floatX *gate_up, int N, int width,
                                        cudaStream_t stream);
/* out = bf16(bf16(out) + bf16(other)). */
cudaError_t add_rounded_bf16_launch(floatX *out, const floatX *other, size_t count, cudaStream_t stream);
/* dst = bf16(src). */
cudaError_t round_copy_bf16_launch(float *dst, const float *src, size_t count, cudaStream_t stream);

/* ---- vectors ---- */
cudaError_t add_inplace_launch(floatX *out, const floatX *inp, size_t count, cudaStream_t stream);
cudaError_t accumulate_bf16_launch(float *out, const uint16_t *inp, size_t count, cudaStream_t stream);
cudaError_t scale_launch(floatX *x, float factor, size_t count, cudaStream_t stream);
/* squares = 1: sum of x^2; 0: sum of |x|. Leaves the double in the scratch's kernels_result. */
cudaError_t sum_launch(const floatX *x, size_t count, int squares, void *scratch, cudaStream_t stream);
cudaError_t first_nonfinite_launch(const floatX *x, size_t count, void *scratch, cudaStream_t stream);
cudaError_t float_to_bf16_launch(uint16_t *dst, const float *src, size_t count, cudaStream_t stream);
cudaError_t bf16_to_float_launch(float *dst, const uint16_t *src, size_t count, cudaStream_t stream);
cudaError_t round_to_bf16_launch(float *x, size_t count, cudaStream_t stream);
/* device.h's rows_copy; bf16: rank_major holds bfloat16 elements (else float32). One launch per KERNELS_ROWS_PARAMS
 * parameters. */
#define KERNELS_ROWS_PARAMS 32
cudaError_t rows_copy_launch(void *rank_major, int bf16, float *full, int to_full, const device_rows_param *params,
                             int param_count, size_t sharded_numel, int first_rank, int ranks, cudaStream_t stream);
cudaError_t adamw_launch(float *param, const float *grad, float *exp_avg, float *exp_avg_sq, size_t count,
                         adamw_kernel_scalars scalars, cudaStream_t stream);

#endif
