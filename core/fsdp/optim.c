/* optim.c — sharded AdamW and gradient clipping over FlatParameter shards (see optim.h).
 *
 * The reference is torch/optim/adam.py, _single_tensor_adam with decoupled_weight_decay=True (what AdamW runs with
 * foreach=False), on float32 CPU tensors. Matching it to the bit, as far as we can, means copying its precision, not
 * just its formula:
 *   - step, bias corrections, step size and sqrt(bias_correction2) are Python floats: double here;
 *   - every scalar handed to a tensor op (mul_, lerp_, addcmul_, add_, addcdiv_) is converted to the tensor's dtype
 *     by ATen before the kernel runs: so each is rounded to float once, and the element math is float;
 *   - the element ops keep ATen's CPU kernels' order: addcmul is self + value * t1 * t2, addcdiv is
 *     self + value * t1 / t2, lerp with a weight below 0.5 is self + weight * (end - self);
 *   - ATen's vectorised (AVX2 / AVX-512) kernels do two of those as one fused multiply-add, rounding once: lerp
 *     explicitly (vec::fmadd), addcmul's last multiply and add by the compiler's contraction. fmaf does the same
 *     here, on any CPU (it is exact by definition; without the instruction libm emulates it).
 * With that the moments equal torch's bit for bit (tests/test_adamw_parity.py). The params can still differ in the
 * last bit: torch's CPU sqrt of a large tensor is not always correctly rounded as sqrtf is (measured with torch
 * 2.15: 10 of 1001 elements an ulp off; tensors of 64 and fewer match), and that ulp of denom reaches the param.
 */
#include "core/fsdp/optim.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/kernel_math.h"
#include "core/runtime/world.h"

adamw_config adamw_default_config(void) {
    return (adamw_config){.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 1e-2};
}

int adamw_config_check(const adamw_config *config, char *error, size_t error_size) {
    /* Written as !(x >= 0) so that NaN is refused too. */
    if (!(config->lr >= 0.0)) {
        snprintf(error, error_size, "AdamW lr %g: must be >= 0", config->lr);
    } else if (!(config->eps >= 0.0)) {
        snprintf(error, error_size, "AdamW eps %g: must be >= 0", config->eps);
    } else if (!(config->beta1 >= 0.0 && config->beta1 < 1.0)) {
        snprintf(error, error_size, "AdamW beta1 %g: must be in [0, 1)", config->beta1);
    } else if (!(config->beta2 >= 0.0 && config->beta2 < 1.0)) {
        snprintf(error, error_size, "AdamW beta2 %g: must be in [0, 1)", config->beta2);
    } else if (!(config->weight_decay >= 0.0)) {
        snprintf(error, error_size, "AdamW weight_decay %g: must be >= 0", config->weight_decay);
    } else {
        return 0;
    }
    return -1;
}

void adamw_init(adamw_state *state) {
    memset(state, 0, sizeof *state);
}

int adamw_first_nonfinite_gradient(context *ctx, const flat_param *units, int unit_count) {
    int first = unit_count; /* none */
    /* Every unit's gradient at once where they share a device (first_nonfinite_of: on a GPU one host wait a step,
     * not one per unit); unit by unit where CPU offload keeps some on the host. */
    const float **grads = calloc((size_t)unit_count + 1, sizeof *grads);
    size_t *counts = calloc((size_t)unit_count + 1, sizeof *counts);
    int *unit_of = calloc((size_t)unit_count + 1, sizeof *unit_of);
    if (grads == NULL || counts == NULL || unit_of == NULL) world_fatal(ctx, "out of memory checking %d gradients",
                                                                         unit_count);
    device *shared = NULL;
    int n = 0, one_device = 1;
    for (int unit = 0; unit < unit_count; unit++) {
        if (units[unit].grad_shard == NULL) continue;
        device *d = flat_param_shard_device(&units[unit]);
        if (shared != NULL && d != shared) one_device = 0;
        shared = d;
        grads[n] = units[unit].grad_shard, counts[n] = units[unit].sharded_numel, unit_of[n] = unit;
        n++;
    }
    if (n > 0 && one_device) {
        int bad = shared->first_nonfinite_of(shared, grads, counts, n);
        if (bad < n) first = unit_of[bad];
    } else {
        for (int i = 0; i < n && first == unit_count; i++) {
            device *d = flat_param_shard_device(&units[unit_of[i]]);
            if (d->first_nonfinite(d, grads[i], counts[i]) < counts[i]) first = unit_of[i];
        }
    }
    free(grads);
    free(counts);
    free(unit_of);
    world_allreduce(ctx, &first, 1, MPI_INT, MPI_MIN, "first non-finite gradient");
    return first < unit_count ? first : -1;
}

double adamw_clip_grad_norm(context *ctx, flat_param *units, int unit_count, double max_norm) {
    if (!(max_norm > 0.0) || isinf(max_norm))
        world_fatal(ctx, "clip_grad_norm: max_norm %g, expected a positive finite number", max_norm);

    /* Each rank's part of the squared norm. Summed in double: a shard can hold millions of elements, and a float
     * running sum would drift by more than the tolerance the checks allow. A replicated unit (NO_SHARD) has the
     * whole gradient on every rank: it is added after the all-reduce, or it would count world-size times (FSDP
     * treats its "nonsharded" params the same way). */
    double start_us = trace_now_us(&ctx->trace);
    double sharded_sum_of_squares = 0.0, replicated_sum_of_squares = 0.0;
    for (int unit = 0; unit < unit_count; unit++) {
        const float *grad = units[unit].grad_shard;
        if (grad == NULL) continue;
        device *d = flat_param_shard_device(&units[unit]);
        double sum = d->sum_squares(d, grad, units[unit].sharded_numel);
        if (units[unit].replicated) replicated_sum_of_squares += sum;
        else sharded_sum_of_squares += sum;
    }
    trace_compute(&ctx->trace, "clip_grad_norm.sum_of_squares", NULL, "optimizer", start_us,
                  trace_now_us(&ctx->trace) - start_us);

    /* One float on the wire, as FSDP's clip_grad_norm_ all-reduces local_norm ** 2 as a float32 tensor: comm works
     * on floats, and the norm only sets a scale factor, so float's 7 digits are plenty. The padding's gradient is 0
     * and adds nothing, so the sum is the squared norm of the whole unpadded gradient. */
    float sum_of_squares = (float)sharded_sum_of_squares;
    /* The collectives move the device's memory (NCCL reads only GPU memory; BACKEND=mpi on a GPU stages from it), so
     * the float goes through a buffer of the device, as torch's total_norm is a tensor on the GPU. */
    device *d = &ctx->device;
    float *on_device = mem_alloc_uninitialized(&ctx->mem, sizeof(float), MEM_WORKSPACE, "clip_grad_norm.norm_squared");
    d->copy(d, on_device, &sum_of_squares, sizeof(float), device_from_host(d));
    /* HYBRID_SHARD: every replicate group holds the same shards, so the sum runs over one shard group (torch
     * all-reduces over the FSDP state's process_group, the shard group, too). */
    const comm_group *group = unit_count > 0 ? units[0].shard_group : NULL;
    if (group != NULL) {
        comm_handle handle;
        COMM_CHECK(ctx, comm_all_reduce_group_start(ctx, group, NULL, on_device, 1, COMM_SUM, "clip_grad_norm",
                                                    &handle));
        COMM_CHECK(ctx, comm_wait(ctx, &handle, NULL));
    } else {
        COMM_CHECK(ctx, comm_all_reduce(ctx, on_device, 1, COMM_SUM, "clip_grad_norm"));
    }
    d->copy(d, &sum_of_squares, on_device, sizeof(float), device_to_host(d));
    mem_free(&ctx->mem, on_device);
    double total_norm = sqrt((double)sum_of_squares + replicated_sum_of_squares);

    /* torch multiplies by min(clip_coef, 1); multiplying by 1 changes nothing, so only a real clip touches memory. */
    double clip_coef = max_norm / (total_norm + 1e-6);
    if (clip_coef < 1.0) {
        start_us = trace_now_us(&ctx->trace);
        float scale = (float)clip_coef;
        for (int unit = 0; unit < unit_count; unit++) {
            float *grad = units[unit].grad_shard;
            if (grad == NULL) continue;
            device *d = flat_param_shard_device(&units[unit]);
            d->scale(d, grad, scale, units[unit].sharded_numel);
        }
        trace_compute(&ctx->trace, "clip_grad_norm.scale", NULL, "optimizer", start_us,
                      trace_now_us(&ctx->trace) - start_us);
    }
    return total_norm;
}

/* The first step makes the moments, zeroed, for this shard only (torch's lazy state init in _init_group). */
static void adamw_make_state(adamw_state *state, flat_param *fp) {
    context *ctx = fp->ctx;
    char owner[MEM_OWNER_MAX];
    size_t bytes = fp->sharded_numel * sizeof(float);
    state->ctx = ctx;
    snprintf(state->unit, sizeof state->unit, "%s", fp->unit);
    state->sharded_numel = fp->sharded_numel;
    state->step = 0;
    state->pool = flat_param_shard_pool(fp);
    snprintf(owner, sizeof owner, "%s.exp_avg", fp->unit);
    state->exp_avg = mem_alloc(state->pool, bytes, MEM_OPTIM_STATE, owner);
    snprintf(owner, sizeof owner, "%s.exp_avg_sq", fp->unit);
    state->exp_avg_sq = mem_alloc(state->pool, bytes, MEM_OPTIM_STATE, owner);
}

void adamw_state_prepare(adamw_state *state, flat_param *fp, int64_t step) {
    if (state->exp_avg != NULL)
        world_fatal(fp->ctx, "unit '%s': restoring an AdamW state that already has moments", fp->unit);
    adamw_make_state(state, fp);
    state->step = step;
}

void adamw_step(adamw_state *state, flat_param *fp, const adamw_config *config) {
    context *ctx = fp->ctx;
    char problem[256];
    if (adamw_config_check(config, problem, sizeof problem) != 0) world_fatal(ctx, "unit '%s': %s", fp->unit, problem);
    if (fp->grad_shard == NULL) return; /* torch: `if p.grad is not None` — no step, no state */

    if (state->exp_avg == NULL) {
        adamw_make_state(state, fp);
    } else if (state->sharded_numel != fp->sharded_numel || strcmp(state->unit, fp->unit) != 0) {
        world_fatal(ctx, "unit '%s': AdamW state of unit '%s' holds %zu floats per moment, the shard has %zu", fp->unit,
                  state->unit, state->sharded_numel, fp->sharded_numel);
    }

    double start_us = trace_now_us(&ctx->trace);
    state->step += 1;

    /* The scalars, in double as Python computes them. */
    double step = (double)state->step;
    double bias_correction1 = 1.0 - pow(config->beta1, step);
    double bias_correction2 = 1.0 - pow(config->beta2, step);
    double step_size = config->lr / bias_correction1;
    double bias_correction2_sqrt = pow(bias_correction2, 0.5); /* Python: bias_correction2 ** 0.5 */

    /* Each rounded to float once, where torch passes it to a float32 kernel. */
    adamw_kernel_scalars scalars = {
        .decay = (float)(1.0 - config->lr * config->weight_decay), /* param.mul_(1 - lr * weight_decay) */
        .lerp_weight = (float)(1.0 - config->beta1),                /* exp_avg.lerp_(grad, 1 - beta1) */
        .beta2 = (float)config->beta2,                              /* exp_avg_sq.mul_(beta2) */
        .one_minus_beta2 = (float)(1.0 - config->beta2),            /* .addcmul_(grad, grad, value=1 - beta2) */
        .bias_correction2_sqrt = (float)bias_correction2_sqrt,      /* exp_avg_sq.sqrt() / bias_correction2_sqrt */
        .eps = (float)config->eps,                                  /* .add_(eps) */
        .negative_step_size = (float)-step_size,                    /* addcdiv_(exp_avg, denom, value=-step_size) */
    };
    device *d = flat_param_shard_device(fp);
    d->adamw_update(d, fp->local_shard, fp->grad_shard, state->exp_avg, state->exp_avg_sq, fp->sharded_numel,
                    &scalars);

    char name[96];
    snprintf(name, sizeof name, "%s.adamw", fp->unit);
    trace_compute(&ctx->trace, name, fp->unit, "optimizer", start_us, trace_now_us(&ctx->trace) - start_us);
}

void adamw_free(adamw_state *state) {
    if (state->ctx != NULL) {
        mem_free(state->pool, state->exp_avg);
        mem_free(state->pool, state->exp_avg_sq);
    }
    adamw_init(state);
}
