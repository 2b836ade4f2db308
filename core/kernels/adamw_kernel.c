/* adamw_kernel.c — see adamw_kernel.h. */
#include "core/kernels/adamw_kernel.h"

#include "core/base/kernel_math.h"

/* The element loop: one pass over the shard's four arrays (read param, grad, exp_avg, exp_avg_sq; write three), all
 * of torch's ops per element in their order. Every op in it is correctly rounded by IEEE 754 (multiply, divide,
 * sqrtf, fmaf), so any instruction set gives the same bits: where the CPU has AVX2 and FMA (x86-64-v3), GCC builds a
 * second copy with fmaf as one instruction, eight elements at a time, and picks it at load time; elsewhere fmaf is
 * libm's (exact by definition too). The Makefile compiles this file with -O3 (the vectoriser), -fno-math-errno (so
 * sqrtf is an instruction, not a call that may set errno) and -ffp-contract=off (no fused multiply-add the source
 * does not write: `param * decay + ...` must round twice, as torch's separate mul_ and addcdiv_ do). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define ADAMW_TARGETS __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define ADAMW_TARGETS
#endif
ADAMW_TARGETS
void adamw_kernel_update(float *restrict param, const float *restrict grad, float *restrict exp_avg,
                         float *restrict exp_avg_sq, size_t count, const adamw_kernel_scalars *scalars) {
    const float decay = scalars->decay, lerp_weight = scalars->lerp_weight, beta2 = scalars->beta2;
    const float one_minus_beta2 = scalars->one_minus_beta2, bias_correction2_sqrt = scalars->bias_correction2_sqrt;
    const float eps = scalars->eps, negative_step_size = scalars->negative_step_size;
    for (size_t i = 0; i < count; i++) {
        /* Every torch op is a separate pass over the tensor; per element they compose in the same order, so one
         * pass here gives the same numbers (kernel_math.h, the GPU's kernel too). */
        km_adamw_result r = km_adamw_element(param[i], grad[i], exp_avg[i], exp_avg_sq[i], decay, lerp_weight, beta2,
                                             one_minus_beta2, bias_correction2_sqrt, eps, negative_step_size);
        param[i] = r.param;
        exp_avg[i] = r.exp_avg;
        exp_avg_sq[i] = r.exp_avg_sq;
    }
}
