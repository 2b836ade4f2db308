/* optim.h — sharded AdamW: each rank steps only its own chunk of every FlatParameter.
 *
 * After backward, rank r holds chunk r of each unit's parameters (local_shard) and chunk r of the averaged gradient
 * (grad_shard). AdamW is element-wise, so updating the chunks separately gives exactly the update of the whole
 * buffer: no communication, and the optimizer state (exp_avg, exp_avg_sq: 2 floats per parameter, twice the
 * parameters themselves) exists only for the shard — 1/N of it per rank, which is most of FSDP's memory saving.
 *
 * The arithmetic is torch.optim.AdamW's single-tensor path (foreach=False) on float32 tensors, in its order and
 * precision: scalars (bias corrections, step size) in double as Python computes them, each rounded to float where
 * torch hands it to a float kernel; element math in float. Per step, for every element:
 *
 *   param      *= 1 - lr * weight_decay                       decoupled weight decay, before the moments
 *   exp_avg    += (grad - exp_avg) * (1 - beta1)              torch's lerp_
 *   exp_avg_sq  = exp_avg_sq * beta2 + (1 - beta2) * grad * grad
 *   denom       = sqrt(exp_avg_sq) / sqrt(1 - beta2^step) + eps
 *   param      -= lr / (1 - beta1^step) * exp_avg / denom      step counts from 1
 *
 * Gradient clipping is FSDP's clip_grad_norm_: the norm of the whole gradient from the shards, one all-reduce.
 */
#ifndef FSDPLAB_OPTIM_H
#define FSDPLAB_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "core/runtime/context.h"
#include "core/fsdp/flat_param.h"

typedef struct adamw_config {
    double lr;
    double beta1, beta2;
    double eps;
    double weight_decay;
} adamw_config;

/* torch's defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 1e-2 (amsgrad and maximize off). */
adamw_config adamw_default_config(void);
/* torch's constructor checks: 0 <= lr, 0 <= eps, 0 <= beta < 1, 0 <= weight_decay. Returns 0, or -1 with a message
 * naming the value. */
int adamw_config_check(const adamw_config *config, char *error, size_t error_size);

/* One FlatParameter's optimizer state (torch's optimizer.state[flat_param]), on this rank's shard only. */
typedef struct adamw_state {
    context *ctx;          /* set at the first step: the tracker the moments belong to */
    char unit[64];
    int64_t step;          /* steps taken; 0 until the first step with a gradient */
    size_t sharded_numel;  /* floats in each moment: the shard's, padding included */
    float *exp_avg;        /* "<unit>.exp_avg", category optim_state; NULL until the first step, as torch */
    float *exp_avg_sq;     /* "<unit>.exp_avg_sq" */
    mem_tracker *pool;     /* where the moments live: the shard's pool (flat_param_shard_pool: host under CPU offload,
                              so AdamW steps on the host there) */
} adamw_state;

/* An empty state: no memory until the first step that has a gradient. */
void adamw_init(adamw_state *state);

/* Sets every unit's sharded gradient to at most max_norm in total L2 norm, as FSDP's clip_grad_norm_: each rank
 * sums the squares of its grad shards, one all-reduce (op "all_reduce", unit "clip_grad_norm") adds them up,
 * total_norm = sqrt(sum); when max_norm / (total_norm + 1e-6) < 1 every grad shard is multiplied by it. Units with
 * no gradient (grad_shard NULL) count as zero and stay NULL. Returns total_norm (before clipping), the same on every
 * rank. A replicated unit (NO_SHARD) counts once, not once per rank. Collective: every rank calls it with the same
 * units. Aborts when max_norm is not a positive number. */
double adamw_clip_grad_norm(context *ctx, flat_param *units, int unit_count, double max_norm);

/* The first unit (in unit order: forward order) whose sharded gradient holds a NaN or an infinity on any rank, or -1
 * when every gradient is finite: what stops a diverged run before the optimizer writes NaN into the parameters.
 * Collective (one all-reduce of an int). */
int adamw_first_nonfinite_gradient(context *ctx, const flat_param *units, int unit_count);

/* One AdamW step of fp->local_shard from fp->grad_shard; allocates the moments at the first step. Does nothing when
 * grad_shard is NULL (torch skips a parameter whose .grad is None: no step counted, no state made). Writes a
 * `compute` event "<unit>.adamw", phase "optimizer". Local: no communication. Aborts, naming rank and unit, on a
 * bad config or a state that belongs to another shard size. */
void adamw_step(adamw_state *state, flat_param *fp, const adamw_config *config);

/* A state as a checkpoint restores it: zeroed moments for fp's shard (category optim_state, as the first step makes
 * them) and `step` steps already taken; the caller fills the moments. The state must be empty. */
void adamw_state_prepare(adamw_state *state, flat_param *fp, int64_t step);

/* Frees the moments (a no-op for a state that never stepped); the state is empty again. */
void adamw_free(adamw_state *state);
#endif
