/* layers.h — the Qwen2 layers, each an explicit forward and backward (llm.c style, no autograd).
 *
 * Conventions (from llm.c): outputs first, then what forward saves for backward, then inputs, weights, and the
 * shapes last. Row-major; N = B*T rows of tokens. Every *_backward WRITES the gradient of its input (=: a fresh
 * tensor, as torch's autograd makes one and llm.c's CUDA matmul_backward sets it, so no buffer is zeroed first) and
 * ADDS (+=) into the gradients of its weights, which accumulate across uses (the tied embedding) and micro-batches
 * (the caller zeroes them). An input read by several ops gets their gradients added by the caller (add_inplace).
 * Matrix products go to OpenBLAS cblas_sgemm. Math per element is core/base/kernel_math.h's, shared with the CUDA
 * kernels.
 */
#ifndef FSDPLAB_LAYERS_H
#define FSDPLAB_LAYERS_H

#include <stddef.h>

/* How many threads OpenBLAS may use (per process). */
void layers_set_threads(int threads);
/* Debian's OpenBLAS (0.3.21) picks its kernels by CPU model number; on a CPU newer than it knows it falls back to
 * "Prescott" kernels, 5x slower than the AVX-512 ones on the same machine. The choice is made when the library
 * loads, so when that fallback happened and the CPU has AVX2 / AVX-512, this sets OPENBLAS_CORETYPE (Haswell /
 * SkylakeX) and re-executes the program once, before MPI starts. An OPENBLAS_CORETYPE you set is left alone. */
void layers_choose_blas_core(char **argv);

/* out (N, C) = weight[tokens] (weight is (V, C)). Tokens outside [0, V) are an error caught by the caller. */
void embedding_forward(float *out, const int *tokens, const float *weight, int N, int C);
void embedding_backward(float *dweight, const float *dout, const int *tokens, int N, int C);

/* RMSNorm as HF's Qwen2RMSNorm: out = weight * x / sqrt(mean(x^2) + eps). Saves rstd (N): 1/sqrt(mean + eps). */
void rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int N, int C, float eps);
/* A residual connection's add and the norm after it: residual += inp, then rmsnorm_forward(out, rstd, residual). */
void residual_rmsnorm_forward(float *residual, float *out, float *rstd, const float *inp, const float *weight, int N,
                              int C, float eps);
/* dinp = dresidual + the norm's input gradient: the gradient of a residual stream that also feeds the norm (dresidual
 * NULL: none; dresidual == dinp: dinp +=). dweight += the weight's gradient. */
void rmsnorm_backward(float *dinp, const float *dresidual, float *dweight, const float *dout, const float *inp,
                      const float *weight, const float *rstd, int N, int C);

/* out (N, OC) = inp (N, IC) @ weight^T + bias; weight is (OC, IC) like torch's nn.Linear; bias may be NULL. */
void linear_forward(float *out, const float *inp, const float *weight, const float *bias, int N, int IC, int OC);
/* dinp = dout @ weight; dweight += dout^T @ inp; dbias += column sums of dout. dinp or dbias may be NULL. */
void linear_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                     const float *weight, int N, int IC, int OC);

/* RoPE tables as HF: inv_freq[i] = theta^(-2i/D), angle = position * inv_freq[i mod D/2]; cos, sin are (T, D). */
void rope_tables(float *cos_table, float *sin_table, int T, int D, float theta);
/* In place on x (B, T, H, D) at positions 0..T-1: x*cos + rotate_half(x)*sin, rotate_half(x) = [-x2, x1]. */
void rope_forward(float *x, const float *cos_table, const float *sin_table, int B, int T, int H, int D);
/* In place on dx: the transpose of the rotation (RoPE is linear and orthogonal per pair). */
void rope_backward(float *dx, const float *cos_table, const float *sin_table, int B, int T, int H, int D);

/* Causal grouped-query attention. q (B, T, H, D), k and v (B, T, KVH, D), query head h reads key/value head
 * h / (H / KVH) (HF's repeat_kv). out (B, T, H, D) = softmax(q k^T / sqrt(D), causal) v, with probs (B, H, T, T)
 * the softmax. The model keeps no probs for backward: attention_probs_at makes them again there, by the same lines
 * (torch's scaled_dot_product_attention keeps none either). */
void attention_forward(float *out, float *probs, const float *q, const float *k, const float *v, int B, int T, int H,
                       int KVH, int D);
/* The same for T new positions after `past` earlier ones (a KV cache): q (B, T, H, D) at positions past .. past+T-1,
 * k and v (B, past + T, KVH, D) every position so far; query t sees keys 0 .. past + t. probs (B, H, T, past + T).
 * past = 0 is attention_forward, computed by the same lines. */
void attention_forward_at(float *out, float *probs, const float *q, const float *k, const float *v, int B, int T,
                          int past, int H, int KVH, int D);
/* Its probabilities alone: probs (B, H, T, past + T) = softmax(q k^T / sqrt(D), causal), the lines the forward runs
 * (the same values to the bit), for the backward's recompute (past = 0). */
void attention_probs_at(float *probs, const float *q, const float *k, int B, int T, int past, int H, int KVH, int D);
/* In place on scores (T, past + T): row t (query position past + t) becomes the softmax of its columns 0 .. past + t,
 * the rest 0 (the causal mask). The attention's own; layers_bf16.c's bfloat16 attention shares it. */
void causal_softmax_rows(float *scores, int T, int past);
/* dq, dk, dv = ... (a key/value head's: its query heads' terms summed in head order); scratch is (T, T) floats. */
void attention_backward(float *dq, float *dk, float *dv, float *scratch, const float *dout, const float *probs,
                        const float *q, const float *k, const float *v, int B, int T, int H, int KVH, int D);

/* SwiGLU's middle on the output of one GEMM against gate_proj and up_proj stacked: gate_up is (N, 2*width), each
 * row the width gate values then the width up values (width = intermediate_size). out (N, width) = silu(gate) * up. */
void swiglu_forward(float *out, const float *gate_up, int N, int width);
/* dgate_up (N, 2*width) = the gradients of gate and up, same layout. */
void swiglu_backward(float *dgate_up, const float *dout, const float *gate_up, int N, int width);

/* Mean cross-entropy over tokens whose target != ignore_index (HF's -100). logits (N, V). Returns the loss; writes
 * dlogits (N, V) = d(loss)/d(logits) (overwrites, not +=: it starts the backward pass). Returns 0 when every
 * target is ignored (and dlogits = 0), like HF's nan-free path. count_out: tokens counted. */
float cross_entropy_forward_backward(float *dlogits, const float *logits, const int *targets, int N, int V,
                                     int ignore_index, int *count_out);
/* The same on logits read as their bfloat16 rounding when logits_bf16 is set: float32 sums a GEMM left unrounded,
 * the rounding of bfloat16 compute's lm_head done as the loss reads them, not in a pass of its own (the same loss and
 * dlogits as from the rounded logits, to the bit). */
float cross_entropy_forward_backward_of(float *dlogits, const float *logits, int logits_bf16, const int *targets,
                                        int N, int V, int ignore_index, int *count_out);

/* out[i] += inp[i]: the residual connections' backward and forward. */
void add_inplace(float *out, const float *inp, size_t count);

#endif
