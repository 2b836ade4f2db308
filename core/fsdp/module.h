/* module.h — a model as the FSDP runtime sees it: a module tree, named parameters, FlatParameters, and pieces.
 *
 * The runtime (core/fsdp/fsdp.h) knows no model. What it needs of one is this header:
 *
 *   the module tree      nodes with a name ("model.layers.3.mlp"), a class name ("Qwen2DecoderLayer") and a parent,
 *                        for the wrap policy to walk (torch's auto_wrap_policy walks nn.Module children the same way)
 *   the parameters       in registration order, each with its module and the span of pieces that use it
 *   the units            one FlatParameter per FSDP unit (units[0] is the root), holding every parameter
 *   the pieces           the model's forward cut into an ordered list (Qwen2: embed, layer 0..L-1, head); the runtime
 *                        runs forward piece by piece and backward in reverse, and fires a unit's hooks around the span
 *                        of pieces that use its parameters (torch fires them around the wrapped module's forward)
 *
 * A model provides the tree (before the units exist, so the wrap policy can choose them), builds its units from the
 * policy's assignment with module_units_build, and fills a `module` with its ops. core/qwen2_module.c is Qwen2's;
 * core/models/mlp.c is a small second model that runs under the same runtime in the tests.
 */
#ifndef FSDPLAB_MODULE_H
#define FSDPLAB_MODULE_H

#include <stddef.h>
#include <stdint.h>

#include "core/runtime/context.h"
#include "core/fsdp/flat_param.h"

#define MODULE_NAME_MAX 128
/* Loss slots a step may queue (module_ops.loss_to_slot): the device's but the last, which a model keeps for a loss it
 * reads at once (a forward outside the runtime's step). */
#define MODULE_LOSS_SLOTS (DEVICE_LOSS_SLOTS - 1)

typedef struct module_node {
    char name[MODULE_NAME_MAX];   /* dotted path from the root ("" is the root itself) */
    const char *type;             /* class name: "Qwen2DecoderLayer", "Linear", "ModuleList", ... */
    int parent;                   /* index of the parent node; -1 for the root; parents come before children */
} module_node;

typedef struct module_param {
    char name[MODULE_NAME_MAX];   /* "model.layers.3.self_attn.q_proj.weight" */
    int ndim;
    int64_t shape[FLAT_PARAM_MAX_DIMS];
    int module;                   /* owning node */
    int first_piece, last_piece;  /* the pieces whose forward/backward read it (a tied weight spans several) */
} module_param;

typedef struct module_tree {
    int node_count, param_count;
    module_node *nodes;
    module_param *params;
} module_tree;

/* Where a parameter lives: which unit, which of its FlatParameter's params. */
typedef struct module_location {
    int unit, index;
} module_location;

size_t module_param_numel(const module_param *param);
void module_tree_free(module_tree *tree);

/* One FlatParameter per unit of the assignment (unit_of_param[p]: the unit of parameter p; 0 the root), each named
 * after the deepest node holding all its parameters with `strip` removed from the front ("model." for Qwen2):
 * "root" for unit 0, "layers.3", "layers.3.mlp", or "layers.3-5" when only a ModuleList holds them all. Fills every
 * rank's shard from `fill` (NULL: zeros). replicated: whole units on every rank (NO_SHARD). *units and *locations
 * are calloc'ed here (freed by module_units_free, which also frees what a failed build made). Returns -1 with
 * ctx->error on a bad assignment or spec. */
int module_units_build(context *ctx, const module_tree *tree, const int *unit_of_param, int unit_count,
                       int replicated, const char *strip, flat_param_fill_fn fill, void *fill_user, flat_param **units,
                       module_location **locations);
void module_units_free(flat_param *units, int unit_count, module_location *locations);

/* What the runtime calls. `self` is the model; `batch` what batch_begin made (the model's activations). */
typedef struct module_ops {
    /* The piece's name for the trace: "embed_tokens", "layers.3", "norm_lm_head_loss". */
    void (*piece_name)(const void *self, int piece, char *name, size_t size);
    /* Whether activation checkpointing applies to the piece (Qwen2: the decoder layers). */
    int (*piece_checkpointable)(const void *self, int piece);
    /* Allocates the batch's buffers for B x T tokens (targets may be NULL: no loss). checkpointed: per piece, whether
     * forward will run it with checkpoint = 1 (the model may keep its input apart), or NULL. -1 with ctx->error on
     * bad input. */
    int (*batch_begin)(void *self, void **batch, const int *tokens, const int *targets, int B, int T,
                       const int *checkpointed);
    void (*batch_end)(void *self, void *batch);
    /* Forward of one piece; `checkpoint`: keep only what recompute needs (the piece's input). The last piece computes
     * the loss and the loss's gradient. */
    void (*forward)(void *self, void *batch, int piece, int checkpoint);
    /* Activation checkpointing's second forward, in backward, of a piece run with checkpoint = 1. */
    void (*recompute)(void *self, void *batch, int piece);
    /* Backward of one piece, adding into its units' full gradients. */
    void (*backward)(void *self, void *batch, int piece);
    float (*loss)(const void *self, const void *batch);
    /* Optional (NULL: the runtime reads `loss` after each micro-batch, as a model that computes it on the host). The
     * batch's loss stays on the device, added into loss slot `slot` (0 .. MODULE_LOSS_SLOTS - 1; device.h's loss
     * slots), not read back: a micro-batch then has no host wait for its loss. Called after batch_begin; `loss` is
     * then not called. */
    void (*loss_to_slot)(void *self, void *batch, int slot);
    /* The means of slots first .. first + count - 1 into losses (one copy and one host wait for them all), the slots
     * zeroed for the next step. */
    void (*losses_read)(void *self, float *losses, int first, int count);
    /* Multiplies the loss's gradient by factor (1 / accumulation steps), between forward and backward. */
    void (*scale_loss_gradient)(void *self, void *batch, float factor);
    /* Optional (NULL: the model does all its backward in backward). Called after batch_begin, before the forward of a
     * micro-batch that backward will follow, with scale_loss_gradient's factor (1 / accumulation steps, 1 without
     * accumulation), which is then not called: a model that starts its loss's backward in forward (Qwen2 under
     * LOSS_CHUNK: each chunk's gradient while its logits exist) takes the factor here. Returns the piece whose forward
     * adds into its units' full gradients (the runtime allocates them before that piece runs; the units'
     * _post_backward_hook still reduces them after their last backward piece), or -1 for none. */
    int (*begin_backward_in_forward)(void *self, void *batch, float factor);
} module_ops;

typedef struct module {
    const char *name;             /* "Qwen2ForCausalLM" */
    const module_tree *tree;      /* the model's; parameters in the order the units were built from */
    int piece_count;
    int unit_count;
    flat_param *units;            /* units[0] is the root */
    const module_location *locations; /* per tree parameter */
    const module_ops *ops;
    void *self;
} module;

#endif
