/* layers_bf16.h — the layers of layers.h as torch computes them on bfloat16 tensors: what Qwen2 under
 * MixedPrecision(param_dtype=bfloat16) runs (HF's Qwen2ForCausalLM, eager attention, CPU).
 *
 * In such a run every tensor autograd holds is bfloat16: parameters, activations and their gradients. Each op reads
 * bfloat16 values, computes in float32 (torch's "opmath": a GEMM accumulates in float32, an element-wise op widens its
 * inputs) and rounds its output to bfloat16 once. So a value is rounded wherever torch's graph ends an op, also inside
 * what layers.h computes as one function: RMSNorm is `weight * (x * rstd).to(bfloat16)` (two roundings), RoPE
 * `q * cos + rotate_half(q) * sin` (three), attention rounds its scores, their scaling, the float32 softmax's result
 * and the output. Here the values live in float32 buffers holding bfloat16 values (the CPU has no bfloat16 GEMM;
 * core/fsdp/flat_param.h): inputs must be bfloat16 values, outputs are. What torch does, op by op, was read off torch
 * 2.x on CPU (tests/check_torch_bf16.py asserts each rule below against torch itself):
 *
 *   GEMM (+ bias)       float32 sum of the products (and the bias), rounded once: linear_forward, then round
 *   x * scalar, a * b,  computed in float32 from the bfloat16 inputs, rounded once
 *   a + b, silu(x)
 *   softmax(dtype=float32)  the float32 softmax of the widened scores; its backward is float32 from the float32
 *                       probabilities, rounded once to the scores' dtype
 *   a tensor used twice its gradients are added in bfloat16 (rounded per addition), in autograd's order
 *   expand (GQA)        the gradient's sum over the query heads of a key/value head: float32, rounded once
 *
 * Gradients of weights are not rounded here: each is one float32 sum over the tokens (a GEMM), rounded when the
 * FlatParameter casts the gradient for its reduce (flat_param.c) — the same single rounding. Conventions as layers.h:
 * outputs first, shapes last, backward WRITES an input's gradient (rounded) and ADDS into weights' (in float32); an
 * input several ops read gets their bfloat16 gradients added by the caller (rounded per addition, as autograd's
 * bfloat16 sum). Every `scratch` is the caller's, sizes stated per function.
 */
#ifndef FSDPLAB_LAYERS_BF16_H
#define FSDPLAB_LAYERS_BF16_H

#include <stddef.h>

/* HF's Qwen2RMSNorm on a bfloat16 input: r = 1/sqrt(mean(x^2) + eps) in float32, h = bf16(x * r) (`.to(input_dtype)`),
 * out = bf16(weight * h). Saves rstd (float32, as layers.h's; h is recomputed from x and rstd in backward). */
void rmsnorm_forward_bf16(float *out, float *rstd, const float *inp, const float *weight, int N, int C, float eps);
/* residual = bf16(residual + inp) (the residual connection's add), then rmsnorm_forward_bf16(out, rstd, residual). */
void residual_rmsnorm_forward_bf16(float *residual, float *out, float *rstd, const float *inp, const float *weight,
                                   int N, int C, float eps);
/* The backward of the above as autograd runs it: dh = bf16(dout * weight); dweight += bf16(sum over rows of
 * bf16(dout * h)) (mul's backward, then the broadcast's sum); the float32 norm's backward from dh, rounded to
 * bfloat16 (the cast's backward); dinp = bf16(dresidual + that) (the residual's gradient and the norm's, added;
 * dresidual as layers.h's rmsnorm_backward: NULL for none, dinp for +=). */
void rmsnorm_backward_bf16(float *dinp, const float *dresidual, float *dweight, const float *dout, const float *inp,
                           const float *weight, const float *rstd, int N, int C);

/* RoPE in place as HF on bfloat16 q or k: cos and sin rounded to bfloat16 (HF's `cos.to(x.dtype)`; the tables
 * given are layers.h's float32 ones), then bf16(bf16(x * cos) + bf16(rotate_half(x) * sin)). */
void rope_forward_bf16(float *x, const float *cos_table, const float *sin_table, int B, int T, int H, int D);
/* Its backward in place on dx: x feeds `x * cos` and rotate_half(x): dx = bf16(bf16(dy * cos) + rotate_half's
 * transpose of bf16(dy * sin)). */
void rope_backward_bf16(float *dx, const float *cos_table, const float *sin_table, int B, int T, int H, int D);

/* HF's eager attention on bfloat16 q (B, T, H, D), k and v (B, past + T, KVH, D), per head: scores bf16(q k^T),
 * scaled bf16(scores * D^-1/2), the causal mask (adding 0 keeps a score; masked ones are out), the float32 softmax
 * written to probs (B, H, T, past + T) as float32 (what its backward reads, made again: attention_probs_bf16), rounded
 * to bfloat16 for the product with v:
 * out = bf16(bf16(probs) v). scratch: T * (past + T) floats. */
void attention_forward_bf16(float *out, float *probs, float *scratch, const float *q, const float *k, const float *v,
                            int B, int T, int past, int H, int KVH, int D);
/* Its probs alone, by the same lines (the backward's recompute, as layers.h's attention_probs_at). */
void attention_probs_bf16(float *probs, const float *q, const float *k, int B, int T, int past, int H, int KVH,
                          int D);
/* Its backward (past = 0): dv_head = bf16(bf16(probs)^T dout), dp = bf16(dout v^T), ds = bf16(softmax backward in
 * float32), ds = bf16(ds * D^-1/2), dq = bf16(ds k), dk_head = bf16(ds^T q); a key/value head's dk and dv are the
 * float32 sums of its query heads' (repeat_kv's backward), rounded once. dq, dk, dv are written (the first gradient
 * of these tensors). scratch: 2 T T + T D floats. */
void attention_backward_bf16(float *dq, float *dk, float *dv, float *scratch, const float *dout, const float *probs,
                             const float *q, const float *k, const float *v, int B, int T, int H, int KVH, int D);

/* HF's Qwen2MLP middle on gate_up (N, 2 width) as layers.h: out = bf16(bf16(silu(gate)) * up). */
void swiglu_forward_bf16(float *out, const float *gate_up, int N, int width);
/* dgate_up (N, 2 width) = [bf16(bf16(dout * up) * silu'(gate)), bf16(dout * bf16(silu(gate)))]. */
void swiglu_backward_bf16(float *dgate_up, const float *dout, const float *gate_up, int N, int width);

/* out = bf16(bf16(out) + bf16(inp)): two bfloat16 tensors added (a residual connection's add, autograd's sum of an
 * input's two gradients), one rounding. */
void add_bf16(float *out, const float *inp, size_t count);

/* The input gradient of two Linear modules reading the same input whose weights are stacked as in layers.h's
 * SwiGLU (weight (2 OC, IC): the first OC rows one module's, the next OC the other's; dout (N, 2 OC) likewise):
 * dinp (N, IC) = bf16(bf16(dout_first weight_first) + bf16(dout_second weight_second)), autograd's sum of the
 * two modules' bfloat16 input gradients. Overwrites dinp. scratch: N IC floats. The weights' gradient is
 * layers.h's linear_backward (one float32 GEMM: each row of the stack is its own sum). */
void linear_backward_input_stacked_bf16(float *dinp, float *scratch, const float *dout, const float *weight, int N,
                                        int IC, int OC);

#endif
