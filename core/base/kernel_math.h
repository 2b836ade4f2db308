/* kernel_math.h — the per-element arithmetic that both devices run: the CPU loops of core/kernels/layers.c and
 * core/fsdp/optim.c and the CUDA kernels of core/cuda/kernels.cu call these same functions, so the CPU tests
 * (tests/test_layers.c, test_optim.c, test_kernel_math.c, the parity checks) cover the arithmetic the GPU runs.
 *
 * Each function is one formula, written once, in the order of operations the CPU path has always used: its bits
 * are the CPU's. What a device may still do differently is stated where it matters:
 *   - the loops around these (the order of a sum, the GEMMs) are each device's own; the GPU check
 *     (tests/gpu_layers.c) bounds those differences;
 *   - transcendentals (expf, exp, log, sqrt of double) come from each device's math library: correctly rounded or
 *     within an ulp or two, not always the same bits;
 *   - a compiler may fuse a multiply and an add into one rounding (contraction). core/kernels/layers.c is built with
 *     -ffast-math (it may), core/fsdp/optim.c with -ffp-contract=off (it may not), nvcc fuses by default. Where the
 *     two devices must agree to the bit (AdamW: tests/gpu_layers.c compares it exactly), km_mul_unfused keeps the
 *     GPU from fusing a product into the add that follows.
 *
 * Plain C11 and CUDA C++ at once: KM_FN makes a function `static inline` for the host and `__host__ __device__`
 * under nvcc. Only <math.h> and <stdint.h>; nothing here allocates, loops over a tensor or knows a shape.
 */
#ifndef FSDPLAB_KERNEL_MATH_H
#define FSDPLAB_KERNEL_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define KM_FN __host__ __device__ static inline
#ifdef __USE_FAST_MATH__
/* -use_fast_math swaps expf, division and sqrtf for approximations and flushes denormals: AdamW would no longer be
 * the CPU's to the bit, and the GPU check's bounds assume the IEEE operations. */
#error "kernel_math.h: build the CUDA files without -use_fast_math"
#endif
#else
#define KM_FN static inline
#endif

/* ---- bits ---- */

KM_FN uint32_t km_float_bits(float value) {
#ifdef __CUDA_ARCH__
    return __float_as_uint(value);
#else
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    return bits;
#endif
}

KM_FN float km_bits_float(uint32_t bits) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(bits);
#else
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
#endif
}

/* Finite (not infinite, not NaN), read from the exponent bits: unlike isfinite, -ffast-math cannot fold it to 1. */
KM_FN int km_is_finite(float value) { return (km_float_bits(value) & 0x7f800000u) != 0x7f800000u; }

/* a * b rounded once and never fused into a following add (the GPU's __fmul_rn; on the host a plain product, as
 * the files using it are built without contraction or do not rely on its absence). */
KM_FN float km_mul_unfused(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}

/* ---- bfloat16 (dtype.h's conversions are these) ---- */

/* float32 -> bfloat16 bits, round to nearest, ties to even (c10::BFloat16's round_to_nearest_even): adding
 * 0x7fff plus the lowest kept bit carries into bit 16 exactly when the dropped half is above the tie, or at the tie
 * with an odd kept part. A NaN stays a quiet NaN with its sign (the carry could turn it into infinity); infinities
 * and overflow to infinity come out of the same addition. */
KM_FN uint16_t km_bf16_from_float(float value) {
    uint32_t bits = km_float_bits(value);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x0040u); /* NaN: keep it quiet NaN */
    uint32_t rounding_bias = 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)((bits + rounding_bias) >> 16);
}

/* bfloat16 bits -> float32, exact: the 16 bits become the top half. */
KM_FN float km_bf16_to_float(uint16_t value) { return km_bits_float((uint32_t)value << 16); }

/* The float32 nearest to value that bfloat16 can hold. */
KM_FN float km_bf16_round(float value) { return km_bf16_to_float(km_bf16_from_float(value)); }

/* ---- RMSNorm: y = w * (x * r), r = 1 / sqrt(mean(x^2) + eps) ---- */

/* A row's square, summed in double: a float squared is exact in double (24 + 24 bits < 53). */
KM_FN double km_square(float x) { return (double)x * x; }

/* r from the row's sum of squares (in double, as the sum), rounded to float once. */
KM_FN float km_rmsnorm_rstd(double sum_squares, int C, float eps) {
    return (float)(1.0 / sqrt(sum_squares / C + (double)eps));
}

/* HF's order: weight * (x * rstd). */
KM_FN float km_rmsnorm_scale(float x, float weight, float rstd) { return weight * (x * rstd); }

/* Backward. dx_c = r w_c dy_c - x_c r^3 / C * sum_j (w_j dy_j x_j); dw_c += dy_c x_c r.
 * The sum's term, in double; the coefficient r^3 / C * sum, rounded to float once; each dx_c and dw_c term. */
KM_FN double km_rmsnorm_dot_term(float weight, float dy, float x) { return (double)weight * dy * x; }
KM_FN float km_rmsnorm_coefficient(double dot, float rstd, int C) { return (float)(dot * rstd * rstd * rstd / C); }
KM_FN float km_rmsnorm_dinp(float rstd, float weight, float dy, float x, float coefficient) {
    return rstd * weight * dy - x * coefficient;
}
KM_FN float km_rmsnorm_dweight(float dy, float x, float rstd) { return dy * x * rstd; }

/* ---- RoPE: one pair (x1, x2) = (x[i], x[i + D/2]) of a head vector at one position ---- */

/* Forward (direction +1) rotates by +angle: [x1 cos - x2 sin, x2 cos + x1 sin] (x*cos + rotate_half(x)*sin);
 * backward (direction -1) by -angle, the transpose. The table holds cos and sin at i and i + D/2 (equal values,
 * HF's layout); each half reads its own. */
KM_FN float km_rope_first(float x1, float x2, float cos_first, float sin_first, float direction) {
    return x1 * cos_first - direction * x2 * sin_first;
}
KM_FN float km_rope_second(float x1, float x2, float cos_second, float sin_second, float direction) {
    return x2 * cos_second + direction * x1 * sin_second;
}

/* ---- SiLU and SwiGLU ---- */

KM_FN float km_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
KM_FN float km_silu(float x) { return x * km_sigmoid(x); }
/* SwiGLU's forward is km_silu(gate) * up, written so at the call site: a helper taking (gate, up) loads up before
 * the exp, and under -ffast-math GCC then associates the three products differently (other bits). */
/* With s = sigmoid(gate) (one exp serves both): d silu/d gate = s (1 + gate (1 - s)). */
KM_FN float km_swiglu_dgate(float dy, float up, float s, float gate) {
    return dy * up * s * (1.0f + gate * (1.0f - s));
}
KM_FN float km_swiglu_dup(float dy, float gate, float s) { return dy * gate * s; }

/* ---- softmax (attention, float) and cross-entropy (double) ---- */

/* fmaxf without the library call (no NaNs reach it: NaN scores or logits would already be a bug upstream). */
KM_FN float km_max(float a, float b) { return a > b ? a : b; }

/* Attention's causal softmax of a row: e_j = expf(s_j - max), summed in double, each e_j times the inverse sum
 * rounded to float once. */
KM_FN float km_softmax_exp(float score, float max_value) { return expf(score - max_value); }
KM_FN float km_softmax_inverse(double sum) { return (float)(1.0 / sum); }
/* Its backward per element: ds_j = p_j (dp_j - sum_k p_k dp_k); the sum in double, its terms p_k dp_k. */
KM_FN double km_softmax_dot_term(float p, float dp) { return (double)p * dp; }
KM_FN float km_softmax_backward(float p, float dp, double dot) { return p * (dp - (float)dot); }

/* Cross-entropy of a row: sum_j exp(x_j - max) in double, log_sum = log(sum) + max, loss = log_sum - x_target. */
KM_FN double km_cross_entropy_exp(float logit, float max_value) { return exp((double)(logit - max_value)); }
KM_FN double km_cross_entropy_log_sum(double sum, float max_value) { return log(sum) + max_value; }
/* d(mean loss)/d(logit_j) = (softmax_j - [j == target]) / count: softmax_j / count here, with inverse_count =
 * 1 / count in float; the target's entry then has inverse_count subtracted. */
KM_FN float km_cross_entropy_inverse_count(int count) { return 1.0f / (float)count; }
KM_FN float km_cross_entropy_dlogit(float logit, double log_sum, float inverse_count) {
    return (float)exp((double)logit - log_sum) * inverse_count;
}

/* ---- the layers in bfloat16 (core/kernels/layers_bf16.h's rules: what torch rounds, op by op) ----
 * The CPU's layers_bf16.c (built with -ffp-contract=off) and the GPU's bfloat16 kernels call these, so both round
 * at the same places. Every input is a bfloat16 value held in a float; each op computes in float32 and its result
 * is rounded (km_bf16_round) where torch's graph ends the op. A product that torch rounds before an addition goes
 * through km_mul_unfused, so nvcc cannot fuse it into the add. */

/* RMSNorm's output: h = bf16(x r) (`.to(input_dtype)`), out = bf16(w h). */
KM_FN float km_bf16_rmsnorm_scale(float x, float weight, float rstd) {
    return km_bf16_round(weight * km_bf16_round(x * rstd));
}
/* Its backward: dh = bf16(dy w) (mul's backward toward h); dweight's term bf16(dy h) (toward w, before the sum over
 * the rows); the dot sum_c dh_c x_c in double (each term exact: 8 + 24 bits); the norm's gradient bf16(r dh - x coef)
 * (the cast's backward) added to the residual's: dinp = bf16(dinp + that). */
KM_FN float km_bf16_rmsnorm_dh(float dy, float weight) { return km_bf16_round(dy * weight); }
KM_FN float km_bf16_rmsnorm_dweight_term(float dy, float x, float rstd) {
    return km_bf16_round(dy * km_bf16_round(x * rstd));
}
KM_FN double km_bf16_rmsnorm_dot_term(float dh, float x) { return (double)dh * x; }
KM_FN float km_bf16_rmsnorm_dinp(float dinp, float rstd, float dh, float x, float coefficient) {
    return km_bf16_round(dinp + km_bf16_round(km_mul_unfused(rstd, dh) - km_mul_unfused(x, coefficient)));
}

/* RoPE on one pair: cos and sin rounded to bfloat16 (HF's `cos.to(x.dtype)`), each product rounded, then the sum
 * or difference rounded: bf16(bf16(a c) + bf16(b s)) and bf16(bf16(a c) - bf16(b s)). Forward (rotate_half(x) =
 * [-x2, x1]): x1' = difference(x1, c1, x2, s1), x2' = sum(x2, c2, x1, s2); backward: dx1 = sum(dy1, c1, dy2, s2),
 * dx2 = difference(dy2, c2, dy1, s1) (c1, s1 the first half's table entries, c2, s2 the second's). */
KM_FN float km_bf16_rope_sum(float a, float cos_value, float b, float sin_value) {
    return km_bf16_round(km_bf16_round(a * km_bf16_round(cos_value)) + km_bf16_round(b * km_bf16_round(sin_value)));
}
KM_FN float km_bf16_rope_difference(float a, float cos_value, float b, float sin_value) {
    return km_bf16_round(km_bf16_round(a * km_bf16_round(cos_value)) - km_bf16_round(b * km_bf16_round(sin_value)));
}

/* torch's silu on CPU, x / (1 + exp(-x)) in float32 (not km_silu's x * sigmoid(x): other bits). SwiGLU's
 * forward bf16(bf16(silu(gate)) up); its backward toward gate bf16(bf16(dy up) s (1 + gate (1 - s))) (mul's
 * backward toward silu(gate), then silu's in float32), toward up bf16(dy bf16(silu(gate))). */
KM_FN float km_silu_like_torch(float x) { return x / (1.0f + expf(-x)); }
KM_FN float km_bf16_swiglu(float gate, float up) {
    return km_bf16_round(km_bf16_round(km_silu_like_torch(gate)) * up);
}
KM_FN float km_bf16_swiglu_dgate(float dy, float up, float gate) {
    float s = km_sigmoid(gate), dact = km_bf16_round(dy * up);
    return km_bf16_round(dact * s * (1.0f + km_mul_unfused(gate, 1.0f - s)));
}
KM_FN float km_bf16_swiglu_dup(float dy, float gate) {
    return km_bf16_round(dy * km_bf16_round(km_silu_like_torch(gate)));
}

/* Attention: a score is bf16(bf16(q.k) * scale) (matmul, then * scaling); the softmax's backward per element
 * bf16(bf16(p (bf16(dp) - dot)) * scale), dot = sum_k p_k bf16(dp_k) in double (km_softmax_dot_term), from the
 * float32 probabilities. */
/* Two bfloat16 gradients of one input added as autograd adds them: bf16(bf16(a) + bf16(b)). */
KM_FN float km_bf16_add_rounded(float a, float b) { return km_bf16_round(km_bf16_round(a) + km_bf16_round(b)); }
KM_FN float km_bf16_attention_score(float raw, float scale) { return km_bf16_round(km_bf16_round(raw) * scale); }
KM_FN float km_bf16_softmax_backward(float p, float dp, double dot, float scale) {
    return km_bf16_round(km_bf16_round(p * (km_bf16_round(dp) - (float)dot)) * scale);
}

/* ---- AdamW (torch's _single_tensor_adam, decoupled weight decay; core/fsdp/optim.c derives the scalars) ---- */

/* torch.lerp(start, end, weight) as ATen's vectorised kernel computes it: from whichever end is nearer, so a weight
 * near 1 does not lose the small difference (end - start) to rounding, in one fused multiply-add. AdamW's weight is
 * 1 - beta1 = 0.1: the first branch. */
KM_FN float km_lerp_like_torch(float start, float end, float weight) {
    return fabsf(weight) < 0.5f ? fmaf(weight, end - start, start) : fmaf(weight - 1.0f, end - start, end);
}

typedef struct km_adamw_result {
    float param, exp_avg, exp_avg_sq;
} km_adamw_result;

/* One element, all of torch's ops in their order (each a separate pass over the tensor there; per element they
 * compose the same way). Every op is correctly rounded by IEEE 754 (multiply, divide, sqrtf, fmaf) and the only
 * fused multiply-adds are the two fmaf's torch's vectorised kernels run (lerp and addcmul), so the result has the
 * same bits on any CPU and on the GPU: `param * decay` must round before the add (torch's separate mul_ and
 * addcdiv_), which km_mul_unfused makes sure of under nvcc, and -ffp-contract=off on the host. The padding
 * (grad 0, param 0) stays 0: 0 * decay + step * 0 / eps. */
KM_FN km_adamw_result km_adamw_element(float param, float grad, float exp_avg, float exp_avg_sq, float decay,
                                       float lerp_weight, float beta2, float one_minus_beta2,
                                       float bias_correction2_sqrt, float eps, float negative_step_size) {
    km_adamw_result r;
    float p = km_mul_unfused(param, decay);
    float m = km_lerp_like_torch(exp_avg, grad, lerp_weight);
    float v = fmaf(one_minus_beta2 * grad, grad, exp_avg_sq * beta2); /* addcmul, fused */
    float denom = sqrtf(v) / bias_correction2_sqrt + eps;
    r.param = p + negative_step_size * m / denom;
    r.exp_avg = m;
    r.exp_avg_sq = v;
    return r;
}

#endif
