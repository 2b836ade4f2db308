/* fsdp.h — the FSDP runtime: units from a wrap policy, PyTorch FSDP1's state machine and hooks, gradient
 * accumulation, activation checkpointing, and the training step that calls it all at PyTorch's moments.
 *
 *   step:  for each micro-batch:
 *            for each piece (embed, layer 0..L-1, head) in order:
 *                _pre_forward (unshard)  →  piece forward  →  _post_forward (reshard, except the root)
 *            for each piece in reverse:
 *                _pre_backward_hook (unshard)  →  [recompute]  →  piece backward  →  _post_backward_hook
 *                                                                (reduce-scatter the gradient, reshard)
 *          _post_backward_final_callback (root: every unit back to IDLE)  →  clip  →  AdamW on the shards
 *
 * A unit's hooks fire around the span of pieces that use its parameters (the root's span is the whole model), so
 * nested units behave as in torch: outer pre-hooks first, inner post-hooks first. Names follow
 * torch/distributed/fsdp/_runtime_utils.py, so the two read side by side.
 */
#ifndef FSDPLAB_FSDP_H
#define FSDPLAB_FSDP_H

#include <stddef.h>

#include "context.h"
#include "qwen2.h"

/* TrainingState (per FSDP unit) */
typedef enum fsdp_training_state { TRAINING_STATE_IDLE, TRAINING_STATE_FORWARD_BACKWARD } fsdp_training_state;
/* HandleTrainingState (per FlatParameter handle) */
typedef enum fsdp_handle_state {
    HANDLE_IDLE,
    HANDLE_FORWARD,
    HANDLE_BACKWARD_PRE,
    HANDLE_BACKWARD_POST
} fsdp_handle_state;
typedef enum fsdp_strategy { FSDP_FULL_SHARD, FSDP_SHARD_GRAD_OP, FSDP_NO_SHARD } fsdp_strategy;

const char *fsdp_training_state_name(fsdp_training_state state);
const char *fsdp_handle_state_name(fsdp_handle_state state);
const char *fsdp_strategy_name(fsdp_strategy strategy);
/* "FULL_SHARD" ... → strategy; -1 when unknown. */
int fsdp_strategy_from_name(const char *name);

/* ---- wrap policy: which modules become FSDP units (torch's auto_wrap_policy) ---- */

/* Return 1 to wrap `module` in its own unit. unwrapped_numel counts the parameters of the module and of its
 * descendants that no descendant unit has claimed (torch's nonwrapped_numel). */
typedef int (*fsdp_wrap_fn)(const qwen2_module *module, size_t unwrapped_numel, void *user);
/* transformer_auto_wrap_policy({Qwen2DecoderLayer}): the default. */
int fsdp_wrap_decoder_layers(const qwen2_module *module, size_t unwrapped_numel, void *user);
/* size_based_auto_wrap_policy: user points to a size_t min_num_params; ModuleList is never wrapped (torch excludes it). */
int fsdp_wrap_by_size(const qwen2_module *module, size_t unwrapped_numel, void *user);
/* Walks the tree children-first; every parameter goes to the unit of its nearest wrapped ancestor, else the root
 * (unit 0). A module holding every parameter not yet claimed is never wrapped: it is the root. Units are numbered
 * in module order (the order forward meets them). Returns the unit count. */
int fsdp_auto_wrap(const qwen2_tree *tree, fsdp_wrap_fn wrap, void *user, int *unit_of_param);

/* The model, wrapped by `wrap` into units and initialised from `init`; NO_SHARD keeps whole units on every rank.
 * Returns -1 with ctx->error on a bad config. */
int fsdp_model_init(qwen2_model *model, context *ctx, const qwen2_config *config, fsdp_wrap_fn wrap, void *user,
                    fsdp_strategy strategy, const qwen2_init_spec *init);

/* ---- the runtime ---- */

typedef struct fsdp_options {
    fsdp_strategy strategy;
    int activation_checkpointing; /* keep only each decoder layer's input; recompute its forward in backward */
    int no_sync;                  /* accumulate unsharded gradients, reduce-scatter on the last micro-batch only */
    int accumulation_steps;       /* micro-batches per optimizer step (ACC) */
} fsdp_options;

typedef struct fsdp_unit {
    fsdp_training_state training_state;
    fsdp_handle_state handle_state;
    int first_piece, last_piece;  /* span of pieces (0 embed, 1+l layer l, L+1 head) that use its parameters */
} fsdp_unit;

typedef struct fsdp_runtime {
    context *ctx;
    qwen2_model *model;
    fsdp_options options;
    fsdp_unit *units;             /* parallel to model->units; units[0] is the root */
    int piece_count;              /* L + 2 */
    int *checkpointed_layers;     /* per decoder layer, handed to the activations */
    int sync_gradients;           /* 0 inside no_sync micro-batches */
} fsdp_runtime;

/* Wraps an initialised model (its units from fsdp_auto_wrap). Returns -1 with ctx->error on bad options. */
int fsdp_runtime_init(fsdp_runtime *runtime, context *ctx, qwen2_model *model, const fsdp_options *options);
void fsdp_runtime_free(fsdp_runtime *runtime);

/* Whether unit's HandleTrainingState may go from `expected` (its state now must be that) to `to` in `hook`:
 * 0, or -1 with ctx->error naming rank, unit, the actual and expected states, the target and the hook. */
int fsdp_check_transition(fsdp_runtime *runtime, int unit, fsdp_handle_state expected, fsdp_handle_state to,
                          const char *hook);

/* The hooks, by PyTorch's names; each checks and records the state transitions it makes. */
void fsdp_pre_forward(fsdp_runtime *runtime, int unit);
void fsdp_post_forward(fsdp_runtime *runtime, int unit);
void fsdp_pre_backward_hook(fsdp_runtime *runtime, int unit);
void fsdp_post_backward_hook(fsdp_runtime *runtime, int unit);
void fsdp_post_backward_final_callback(fsdp_runtime *runtime);

/* One micro-batch forward + backward (tokens, targets: this rank's B x T). The loss gradient is scaled by
 * 1 / accumulation_steps; on the last micro-batch (last_micro) gradients are synchronised even under no_sync.
 * Returns this rank's loss. */
float fsdp_forward_backward(fsdp_runtime *runtime, const int *tokens, const int *targets, int B, int T,
                            int last_micro);

#endif
