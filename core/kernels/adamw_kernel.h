/* adamw_kernel.h — AdamW's element loop on host memory: the CPU device's adamw_update (core/device/device.h), and
 * the host's under CPU offload. core/fsdp/optim.h is the optimizer around it (state, steps, clipping). */
#ifndef FSDPLAB_ADAMW_KERNEL_H
#define FSDPLAB_ADAMW_KERNEL_H

#include <stddef.h>

/* AdamW's per-step scalars, as core/fsdp/optim.c derives them from the config and the step (torch's
 * _single_tensor_adamw). */
typedef struct adamw_kernel_scalars {
    float decay;                  /* 1 - lr * weight_decay */
    float lerp_weight;            /* 1 - beta1 */
    float beta2, one_minus_beta2;
    float bias_correction2_sqrt;
    float eps;
    float negative_step_size;     /* -lr / bias_correction1 */
} adamw_kernel_scalars;

/* One AdamW step on `count` elements: torch's ops per element, in their order, every one correctly rounded, so any
 * instruction set gives the same bits (kernel_math.h's km_adamw_element, which the GPU's kernel calls too). The
 * definition declares the four arrays restrict (they never overlap); this declaration leaves it out, so C++ (the
 * CUDA files, through core/device/device.h) reads it too. */
void adamw_kernel_update(float *param, const float *grad, float *exp_avg, float *exp_avg_sq, size_t count,
                         const adamw_kernel_scalars *scalars);

#endif
