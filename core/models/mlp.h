/* mlp.h — MlpLM, a tiny token MLP language model: the second model the FSDP runtime runs (the first is Qwen2).
 *
 *   tokens → embed (Embedding V x C) → [ block 0 … block n-1 ] → head (Linear C → V, own weight, bias)
 *          → mean cross-entropy over the targets (-100 ignored, as HF)
 *   block:  x → fc1 (Linear C → H, bias) → GELU → fc2 (Linear H → C, bias) → + x
 *
 * It exists to show that the runtime knows no model (core/fsdp/module.h): a module tree, named parameters, units built
 * by module_units_build from any wrap assignment, and pieces — 0 the embedding, 1 + i block i, n + 1 the head and
 * the loss — each an explicit forward and backward in llm.c's style (core/kernels/layers.h's kernels for the products).
 *
 * GELU (tanh form, as GPT-2 and llm.c), not ReLU: the activation is smooth, so the whole-model finite-difference
 * check is valid at every point. With ReLU, a pre-activation within the step h of its kink makes the central
 * difference an average of the two one-sided slopes, a spurious mismatch the tolerance would have to hide.
 *
 * Module tree and parameter names are what torch would print for the same nn.Module:
 *   ""            MlpLM
 *   "embed"       Embedding     embed.weight (V, C)                     piece 0
 *   "blocks"      ModuleList
 *   "blocks.i"    MlpBlock                                              piece 1 + i
 *   "blocks.i.fc1" Linear       blocks.i.fc1.weight (H, C), .bias (H)
 *   "blocks.i.fc2" Linear       blocks.i.fc2.weight (C, H), .bias (C)
 *   "head"        Linear        head.weight (V, C), head.bias (V)       piece n + 1 (with the loss)
 */
#ifndef FSDPLAB_MLP_H
#define FSDPLAB_MLP_H

#include <stddef.h>
#include <stdint.h>

#include "core/runtime/context.h"
#include "core/fsdp/flat_param.h"
#include "core/fsdp/fsdp.h"
#include "core/fsdp/module.h"

#define MLP_IGNORE_INDEX (-100)
#define MLP_BLOCK "MlpBlock" /* the class transformer_auto_wrap_policy wraps (fsdp_wrap_by_type) */

typedef struct mlp_config {
    int vocab_size;               /* V */
    int hidden_size;              /* C: the residual stream's width */
    int mlp_hidden;               /* H: fc1's output width */
    int num_blocks;               /* n (0 is allowed: embed → head) */
    float init_std;               /* weights normal(0, init_std); biases 0 */
    uint64_t seed;                /* of the counter-based RNG: a value depends on (seed, parameter name, index) */
} mlp_config;

/* Every size >= 1 (num_blocks >= 0), init_std finite and >= 0. Returns -1 with a message naming the field and value. */
int mlp_config_validate(const mlp_config *config, char *error, size_t error_size);

/* The tree as the runtime sees it, with first_piece / last_piece per parameter. Returns -1 on a bad config or
 * out of memory (out is left empty). */
int mlp_module_tree(const mlp_config *config, module_tree *out);

/* An flat_param_fill_fn: weights normal(0, init_std) from the RNG keyed by (seed, name, index), biases 0. `user` points
 * to the mlp_config. */
void mlp_init_fill(const char *name, size_t first, size_t count, float *out, void *user);

typedef struct mlp_model {
    context *ctx;
    mlp_config config;
    module_tree tree;             /* parameters in registration order: embed, blocks.0.fc1.weight, .bias, fc2 ...,
                                     head */
    int unit_count;
    flat_param *units;            /* units[0] is the root */
    module_location *locations;   /* per tree parameter */
} mlp_model;

/* Builds the tree and one FlatParameter per unit of the assignment (unit_of_param[p]: the unit of tree parameter p,
 * 0 the root), filled by mlp_init_fill. replicated: whole units on every rank (NO_SHARD). Every rank must call it.
 * Returns -1 with ctx->error on a bad config or assignment; mlp_model_free frees what was made either way. */
int mlp_model_init(mlp_model *model, context *ctx, const mlp_config *config, const int *unit_of_param, int unit_count,
                   int replicated);
/* The model wrapped by `wrap` (fsdp_auto_wrap over its tree; fsdp_wrap_by_type with MLP_BLOCK: one unit per block
 * and the root holding embed and head). NO_SHARD keeps whole units on every rank. -1 with ctx->error on a bad
 * config. */
int mlp_model_init_wrapped(mlp_model *model, context *ctx, const mlp_config *config, fsdp_wrap_fn wrap, void *user,
                           fsdp_strategy strategy);
void mlp_model_free(mlp_model *model);
/* The model as the FSDP runtime sees it: n + 2 pieces, the blocks checkpointable. Valid while the model lives. */
void mlp_as_module(mlp_model *model, module *out);

/* The parameter's values (its unit UNSHARDED, no all-gather in flight) and its gradient (the unit's full gradient
 * allocated); otherwise they stop the run naming rank, unit and parameter. */
float *mlp_param_data(const mlp_model *model, int param);
float *mlp_param_grad(const mlp_model *model, int param);

/* ---- What forward saves for backward (N = B*T rows), all tracked memory, all freed by backward or batch_end ---- */
typedef struct mlp_block_activations {
    float *pre;                   /* (N, H) fc1's output, GELU's input: GELU's backward needs it */
    float *act;                   /* (N, H) GELU's output, fc2's input: fc2's weight gradient needs it */
} mlp_block_activations;          /* the block's input x is residuals[i] (fc1's weight gradient needs it) */

typedef struct mlp_activations {
    int B, T;
    int *tokens, *targets;        /* (N), category data; targets NULL: forward only, no loss */
    int *checkpointed;            /* per block: forward keeps only its input (residuals[i] as checkpoint_input) */
    float **residuals;            /* n + 1 of (N, C): [0] the embedding, [i + 1] block i's output (the head's input
                                     is residuals[n]); category activation, or checkpoint_input for a checkpointed
                                     block's input */
    mlp_block_activations *blocks;
    float *logits;                /* (N, V) */
    float *dlogits;               /* (N, V) d(loss)/d(logits), written by the head's forward */
    float **dresiduals;           /* n + 1 of (N, C): [i] the gradient of residuals[i], alive between the backward of
                                     the piece that reads residuals[i] and the one that wrote it */
    float loss;
    int target_count;
} mlp_activations;

#endif
