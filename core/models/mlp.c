/* mlp.c — MlpLM: tree, units, and its pieces' forward and backward as the runtime calls them. See mlp.h. */
#include "core/models/mlp.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/kernels/layers.h"
#include "core/base/rng.h"
#include "core/runtime/world.h"
#include "core/base/error.h"

/* ---------------------------------------------------------------- config and tree */

int mlp_config_validate(const mlp_config *c, char *error, size_t error_size) {
    if (c->vocab_size < 1) return error_set(error, error_size, "mlp config: vocab_size %d, need >= 1", c->vocab_size);
    if (c->hidden_size < 1)
        return error_set(error, error_size, "mlp config: hidden_size %d, need >= 1", c->hidden_size);
    if (c->mlp_hidden < 1) return error_set(error, error_size, "mlp config: mlp_hidden %d, need >= 1", c->mlp_hidden);
    if (c->num_blocks < 0) return error_set(error, error_size, "mlp config: num_blocks %d, need >= 0", c->num_blocks);
    if (!(c->init_std >= 0.0f) || isinf(c->init_std))
        return error_set(error, error_size, "mlp config: init_std %g, need a finite value >= 0", (double)c->init_std);
    return 0;
}

/* Parameters per block (fc1.weight, fc1.bias, fc2.weight, fc2.bias) and the tree indices they take. */
enum { FC1_WEIGHT, FC1_BIAS, FC2_WEIGHT, FC2_BIAS, BLOCK_PARAM_COUNT };
static int embed_param(void) { return 0; }
static int block_param(int block, int k) { return 1 + BLOCK_PARAM_COUNT * block + k; }
static int head_weight_param(const mlp_config *c) { return 1 + BLOCK_PARAM_COUNT * c->num_blocks; }
static int head_bias_param(const mlp_config *c) { return 2 + BLOCK_PARAM_COUNT * c->num_blocks; }

static int add_node(module_tree *tree, const char *name, const char *type, int parent) {
    module_node *node = &tree->nodes[tree->node_count];
    snprintf(node->name, sizeof node->name, "%s", name);
    node->type = type;
    node->parent = parent;
    return tree->node_count++;
}

static void add_param(module_tree *tree, int node, const char *leaf, int64_t rows, int64_t columns, int piece) {
    module_param *param = &tree->params[tree->param_count++];
    snprintf(param->name, sizeof param->name, "%s.%s", tree->nodes[node].name, leaf);
    param->ndim = columns > 0 ? 2 : 1;
    param->shape[0] = rows;
    param->shape[1] = columns > 0 ? columns : 0;
    param->module = node;
    param->first_piece = param->last_piece = piece; /* nothing is tied: each parameter is read by one piece */
}

/* A Linear child with weight (out, in) and bias (out), read by `piece`. */
static void add_linear(module_tree *tree, int parent, const char *name, int out, int in, int piece) {
    int node = add_node(tree, name, "Linear", parent);
    add_param(tree, node, "weight", out, in, piece);
    add_param(tree, node, "bias", out, 0, piece);
}

int mlp_module_tree(const mlp_config *c, module_tree *out) {
    char error[256];
    memset(out, 0, sizeof *out);
    if (mlp_config_validate(c, error, sizeof error) != 0) return -1;
    int n = c->num_blocks, V = c->vocab_size, C = c->hidden_size, H = c->mlp_hidden;
    out->nodes = calloc((size_t)(4 + 3 * n), sizeof *out->nodes);
    out->params = calloc((size_t)(3 + BLOCK_PARAM_COUNT * n), sizeof *out->params);
    if (out->nodes == NULL || out->params == NULL) {
        module_tree_free(out);
        return -1;
    }
    int root = add_node(out, "", "MlpLM", -1);
    int embed = add_node(out, "embed", "Embedding", root);
    add_param(out, embed, "weight", V, C, 0);
    int blocks = add_node(out, "blocks", "ModuleList", root);
    for (int i = 0; i < n; i++) {
        char name[MODULE_NAME_MAX], child[MODULE_NAME_MAX];
        snprintf(name, sizeof name, "blocks.%d", i);
        int block = add_node(out, name, MLP_BLOCK, blocks);
        snprintf(child, sizeof child, "%s.fc1", name);
        add_linear(out, block, child, H, C, 1 + i);
        snprintf(child, sizeof child, "%s.fc2", name);
        add_linear(out, block, child, C, H, 1 + i);
    }
    add_linear(out, root, "head", V, C, n + 1);
    return 0;
}

static int ends_with(const char *text, const char *suffix) {
    size_t length = strlen(text), suffix_length = strlen(suffix);
    return length >= suffix_length && strcmp(text + length - suffix_length, suffix) == 0;
}

void mlp_init_fill(const char *name, size_t first, size_t count, float *out, void *user) {
    const mlp_config *c = user;
    if (ends_with(name, ".bias")) memset(out, 0, count * sizeof(float));
    else rng_fill_normal(c->seed, rng_stream_of(name), first, count, 0.0f, c->init_std, out);
}

/* ---------------------------------------------------------------- model and units */

int mlp_model_init(mlp_model *model, context *ctx, const mlp_config *config, const int *unit_of_param, int unit_count,
                   int replicated) {
    memset(model, 0, sizeof *model);
    model->ctx = ctx;
    model->config = *config;
    layers_set_threads(ctx->threads);
    if (mlp_config_validate(config, ctx->error, sizeof ctx->error) != 0) return -1;
    if (mlp_module_tree(config, &model->tree) != 0) world_fatal(ctx, "out of memory building MlpLM's module tree");
    if (unit_count < 1) {
        snprintf(ctx->error, sizeof ctx->error, "rank %d: MlpLM: %d units, need at least the root", ctx->rank,
                 unit_count);
        return -1;
    }
    model->unit_count = unit_count;
    return module_units_build(ctx, &model->tree, unit_of_param, unit_count, replicated, NULL, mlp_init_fill,
                              &model->config, &model->units, &model->locations);
}

int mlp_model_init_wrapped(mlp_model *model, context *ctx, const mlp_config *config, fsdp_wrap_fn wrap, void *user,
                           fsdp_strategy strategy) {
    module_tree tree;
    memset(model, 0, sizeof *model);
    if (mlp_config_validate(config, ctx->error, sizeof ctx->error) != 0) return -1;
    if (mlp_module_tree(config, &tree) != 0) world_fatal(ctx, "out of memory building MlpLM's module tree");
    int *unit_of_param = calloc((size_t)tree.param_count, sizeof *unit_of_param);
    if (unit_of_param == NULL) world_fatal(ctx, "out of memory for %d parameters' units", tree.param_count);
    int unit_count = fsdp_auto_wrap(&tree, wrap, user, unit_of_param);
    int status = mlp_model_init(model, ctx, config, unit_of_param, unit_count, strategy == FSDP_NO_SHARD);
    free(unit_of_param);
    module_tree_free(&tree);
    return status;
}

void mlp_model_free(mlp_model *model) {
    module_units_free(model->units, model->unit_count, model->locations);
    module_tree_free(&model->tree);
    memset(model, 0, sizeof *model);
}

float *mlp_param_data(const mlp_model *model, int param) {
    module_location at = model->locations[param];
    const flat_param *unit = &model->units[at.unit];
    if (unit->shard_state != FLAT_PARAM_UNSHARDED)
        world_fatal(model->ctx, "unit '%s': parameter '%s' read while the unit is SHARDED; unshard it first",
                    unit->unit, model->tree.params[param].name);
    if (flat_param_unshard_pending(unit))
        world_fatal(model->ctx, "unit '%s': parameter '%s' read while its all-gather (seq %llu) is in flight",
                  unit->unit, model->tree.params[param].name, (unsigned long long)unit->unshard_handle.seq);
    return unit->full_param_padded + unit->params[at.index].offset;
}

float *mlp_param_grad(const mlp_model *model, int param) {
    module_location at = model->locations[param];
    const flat_param *unit = &model->units[at.unit];
    if (unit->full_grad_padded == NULL)
        world_fatal(model->ctx, "unit '%s': gradient of '%s' written before the unit's full gradient was allocated",
                  unit->unit, model->tree.params[param].name);
    return unit->full_grad_padded + unit->params[at.index].offset;
}

/* ---------------------------------------------------------------- GELU (tanh form), element-wise */

#define GELU_SCALE 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_CUBE 0.044715f

/* out (count) = 0.5 x (1 + tanh(s (x + a x^3))) for x in inp. */
static void gelu_forward(float *out, const float *inp, size_t count) {
    for (size_t i = 0; i < count; i++) {
        float x = inp[i];
        out[i] = 0.5f * x * (1.0f + tanhf(GELU_SCALE * (x + GELU_CUBE * x * x * x)));
    }
}

/* dinp = dout * gelu'(inp), gelu'(x) = 0.5 (1 + t) + 0.5 x (1 - t^2) s (1 + 3 a x^2), t = tanh(s (x + a x^3)). */
static void gelu_backward(float *dinp, const float *inp, const float *dout, size_t count) {
    for (size_t i = 0; i < count; i++) {
        float x = inp[i];
        float t = tanhf(GELU_SCALE * (x + GELU_CUBE * x * x * x));
        float local = 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * GELU_SCALE * (1.0f + 3.0f * GELU_CUBE * x * x);
        dinp[i] = dout[i] * local;
    }
}

/* ---------------------------------------------------------------- activations */

/* Tracked float buffers named "blocks.<i>.<owner>" (or "<owner>" outside the blocks), each written whole by the call
 * that fills it (a backward writes its input's gradient, layers.h), so each starts undefined: none is zeroed. */
static float *output_buffer(mlp_model *model, size_t count, const char *owner, int block, mem_category category) {
    char name[MEM_OWNER_MAX];
    if (block >= 0) snprintf(name, sizeof name, "blocks.%d.%s", block, owner);
    else snprintf(name, sizeof name, "%s", owner);
    return mem_alloc_uninitialized(&model->ctx->mem, count * sizeof(float), category, name);
}

static void release(mlp_model *model, float **buffer) {
    mem_free(&model->ctx->mem, *buffer);
    *buffer = NULL;
}

static int activations_begin(mlp_model *model, mlp_activations *acts, const int *tokens, const int *targets, int B,
                             int T, const int *checkpointed_pieces) {
    context *ctx = model->ctx;
    const mlp_config *c = &model->config;
    memset(acts, 0, sizeof *acts);
    if (B < 1 || T < 1 || (long long)B * T > INT_MAX) { /* the kernels take N = B*T as an int */
        snprintf(ctx->error, sizeof ctx->error, "rank %d: MlpLM: batch %d x %d: need B >= 1, T >= 1 and B*T <= %d",
                 ctx->rank, B, T, INT_MAX);
        return -1;
    }
    if (tokens == NULL) {
        snprintf(ctx->error, sizeof ctx->error, "rank %d: MlpLM: batch %d x %d without tokens", ctx->rank, B, T);
        return -1;
    }
    for (int i = 0; i < B * T; i++) {
        int bad_token = tokens[i] < 0 || tokens[i] >= c->vocab_size;
        int bad_target = targets != NULL && targets[i] != MLP_IGNORE_INDEX &&
                         (targets[i] < 0 || targets[i] >= c->vocab_size);
        if (bad_token || bad_target) {
            snprintf(ctx->error, sizeof ctx->error, "rank %d: MlpLM: %s %d at batch row %d, position %d is outside the "
                     "vocabulary 0..%d", ctx->rank, bad_token ? "token" : "target", bad_token ? tokens[i] : targets[i],
                     i / T, i % T, c->vocab_size - 1);
            return -1;
        }
    }
    acts->B = B, acts->T = T;
    size_t N = (size_t)B * T;
    int n = c->num_blocks;
    acts->tokens = mem_alloc_uninitialized(&ctx->mem, N * sizeof(int), MEM_DATA, "batch.tokens");
    memcpy(acts->tokens, tokens, N * sizeof(int));
    if (targets != NULL) {
        acts->targets = mem_alloc_uninitialized(&ctx->mem, N * sizeof(int), MEM_DATA, "batch.targets");
        memcpy(acts->targets, targets, N * sizeof(int));
    }
    /* pointer tables: metadata, not tensors (as the tracker's own table, not counted) */
    acts->residuals = calloc((size_t)n + 1, sizeof *acts->residuals);
    acts->dresiduals = calloc((size_t)n + 1, sizeof *acts->dresiduals);
    acts->blocks = calloc((size_t)(n > 0 ? n : 1), sizeof *acts->blocks);
    acts->checkpointed = calloc((size_t)(n > 0 ? n : 1), sizeof *acts->checkpointed);
    if (acts->residuals == NULL || acts->dresiduals == NULL || acts->blocks == NULL || acts->checkpointed == NULL)
        world_fatal(ctx, "MlpLM: out of memory for the activation tables of %d blocks", n);
    for (int i = 0; i < n && checkpointed_pieces != NULL; i++) acts->checkpointed[i] = checkpointed_pieces[1 + i];
    return 0;
}

static void block_activations_free(mlp_model *model, mlp_block_activations *a) {
    release(model, &a->pre);
    release(model, &a->act);
}

static void activations_end(mlp_model *model, mlp_activations *acts) {
    int n = model->config.num_blocks;
    for (int i = 0; i <= n; i++) {
        if (acts->residuals) release(model, &acts->residuals[i]);
        if (acts->dresiduals) release(model, &acts->dresiduals[i]);
        if (i < n && acts->blocks) block_activations_free(model, &acts->blocks[i]);
    }
    release(model, &acts->logits);
    release(model, &acts->dlogits);
    mem_free(&model->ctx->mem, acts->tokens);
    mem_free(&model->ctx->mem, acts->targets);
    free(acts->residuals);
    free(acts->dresiduals);
    free(acts->blocks);
    free(acts->checkpointed);
    memset(acts, 0, sizeof *acts);
}

/* The residual entering block `index` (or the head): checkpoint_input when that block is checkpointed, the one
 * tensor activation checkpointing keeps of it. */
static mem_category residual_category(const mlp_model *model, const mlp_activations *acts, int index) {
    return index < model->config.num_blocks && acts->checkpointed[index] ? MEM_CHECKPOINT_INPUT : MEM_ACTIVATION;
}

/* ---------------------------------------------------------------- forward */

/* piece 0.  residuals[0] (N, C) = embed.weight[tokens] */
static void embed_forward(mlp_model *model, mlp_activations *acts) {
    int N = acts->B * acts->T, C = model->config.hidden_size;
    if (acts->residuals[0] != NULL) world_fatal(model->ctx, "MlpLM: piece 0 (embed) forward run twice in one batch");
    acts->residuals[0] = output_buffer(model, (size_t)N * C, "embed.output", -1, residual_category(model, acts, 0));
    embedding_forward(acts->residuals[0], acts->tokens, mlp_param_data(model, embed_param()), N, C);
}

/* Block i's saved activations from its input x = residuals[i] (N, C):  pre (N, H) = x fc1^T + b1,
 * act (N, H) = gelu(pre). The forward and the recompute share it. */
static void block_hidden_forward(mlp_model *model, mlp_activations *acts, int i) {
    const mlp_config *c = &model->config;
    int N = acts->B * acts->T, C = c->hidden_size, H = c->mlp_hidden;
    mlp_block_activations *a = &acts->blocks[i];
    const float *x = acts->residuals[i];
    if (x == NULL) world_fatal(model->ctx, "MlpLM: block %d (piece %d) run without its input (piece %d's output)", i,
                             1 + i, i);
    if (a->pre != NULL || a->act != NULL)
        world_fatal(model->ctx, "MlpLM: block %d (piece %d): saved activations computed twice", i, 1 + i);
    a->pre = output_buffer(model, (size_t)N * H, "fc1.output", i, MEM_ACTIVATION);
    linear_forward(a->pre, x, mlp_param_data(model, block_param(i, FC1_WEIGHT)),
                   mlp_param_data(model, block_param(i, FC1_BIAS)), N, C, H);
    a->act = output_buffer(model, (size_t)N * H, "gelu.output", i, MEM_ACTIVATION);
    gelu_forward(a->act, a->pre, (size_t)N * H);
}

/* piece 1 + i.  residuals[i + 1] (N, C) = x + act fc2^T + b2. checkpoint: keep only x (drop pre and act). */
static void block_forward(mlp_model *model, mlp_activations *acts, int i, int checkpoint) {
    const mlp_config *c = &model->config;
    int N = acts->B * acts->T, C = c->hidden_size, H = c->mlp_hidden;
    block_hidden_forward(model, acts, i);
    mlp_block_activations *a = &acts->blocks[i];
    float *out = acts->residuals[i + 1] =
        output_buffer(model, (size_t)N * C, "output", i, residual_category(model, acts, i + 1));
    linear_forward(out, a->act, mlp_param_data(model, block_param(i, FC2_WEIGHT)),
                   mlp_param_data(model, block_param(i, FC2_BIAS)), N, H, C);
    add_inplace(out, acts->residuals[i], (size_t)N * C);
    if (checkpoint) block_activations_free(model, a);
}

/* piece n + 1.  logits (N, V) = residuals[n] head^T + bh; with targets, the mean cross-entropy and dlogits (N, V). */
static void head_forward(mlp_model *model, mlp_activations *acts) {
    const mlp_config *c = &model->config;
    int N = acts->B * acts->T, C = c->hidden_size, V = c->vocab_size, n = c->num_blocks;
    if (acts->residuals[n] == NULL) world_fatal(model->ctx, "MlpLM: head (piece %d) run without its input", n + 1);
    if (acts->logits != NULL) world_fatal(model->ctx, "MlpLM: head (piece %d) forward run twice in one batch", n + 1);
    acts->logits = output_buffer(model, (size_t)N * V, "head.logits", -1, MEM_ACTIVATION);
    linear_forward(acts->logits, acts->residuals[n], mlp_param_data(model, head_weight_param(c)),
                   mlp_param_data(model, head_bias_param(c)), N, C, V);
    if (acts->targets == NULL) return;
    acts->dlogits = output_buffer(model, (size_t)N * V, "head.dlogits", -1, MEM_ACTIVATION);
    acts->loss = cross_entropy_forward_backward(acts->dlogits, acts->logits, acts->targets, N, V, MLP_IGNORE_INDEX,
                                                &acts->target_count);
}

/* ---------------------------------------------------- backward: each writes its input's gradient, ADDS into the
 * full gradients of its parameters */

/* piece n + 1.  dresiduals[n] = dlogits head;  dhead += dlogits^T x;  dbh += column sums of dlogits. */
static void head_backward(mlp_model *model, mlp_activations *acts) {
    const mlp_config *c = &model->config;
    int N = acts->B * acts->T, C = c->hidden_size, V = c->vocab_size, n = c->num_blocks;
    if (acts->dlogits == NULL)
        world_fatal(model->ctx, "MlpLM: head (piece %d) backward without the loss's gradient (%s)", n + 1,
                  acts->targets == NULL ? "a forward-only batch: no targets" : "forward not run");
    acts->dresiduals[n] = output_buffer(model, (size_t)N * C, "head.dinput", -1, MEM_ACTIVATION);
    linear_backward(acts->dresiduals[n], mlp_param_grad(model, head_weight_param(c)),
                    mlp_param_grad(model, head_bias_param(c)), acts->dlogits, acts->residuals[n],
                    mlp_param_data(model, head_weight_param(c)), N, C, V);
    release(model, &acts->dlogits);
    release(model, &acts->logits);
    release(model, &acts->residuals[n]);
}

/* piece 1 + i, out = x + fc2(gelu(fc1(x))):
 *   dact = dout fc2;  dfc2 += dout^T act;  db2 += sums of dout
 *   dpre = gelu'(pre) * dact
 *   dx = dpre fc1 + dout (the residual path);  dfc1 += dpre^T x;  db1 += sums of dpre */
static void block_backward(mlp_model *model, mlp_activations *acts, int i) {
    const mlp_config *c = &model->config;
    int N = acts->B * acts->T, C = c->hidden_size, H = c->mlp_hidden;
    mlp_block_activations *a = &acts->blocks[i];
    const float *x = acts->residuals[i], *dout = acts->dresiduals[i + 1];
    if (a->pre == NULL || a->act == NULL || x == NULL || dout == NULL)
        world_fatal(model->ctx, "MlpLM: block %d (piece %d) backward without its %s", i, 1 + i,
                  dout == NULL ? "output's gradient"
                  : x == NULL  ? "input"
                               : "saved activations (checkpointed and not recomputed?)");
    float *w[BLOCK_PARAM_COUNT], *g[BLOCK_PARAM_COUNT];
    for (int k = 0; k < BLOCK_PARAM_COUNT; k++) {
        w[k] = mlp_param_data(model, block_param(i, k));
        g[k] = mlp_param_grad(model, block_param(i, k));
    }
    float *dact = output_buffer(model, (size_t)N * H, "gelu.doutput", i, MEM_WORKSPACE);
    linear_backward(dact, g[FC2_WEIGHT], g[FC2_BIAS], dout, a->act, w[FC2_WEIGHT], N, H, C);
    float *dpre = output_buffer(model, (size_t)N * H, "fc1.doutput", i, MEM_WORKSPACE);
    gelu_backward(dpre, a->pre, dact, (size_t)N * H);
    release(model, &dact);
    float *dx = acts->dresiduals[i] = output_buffer(model, (size_t)N * C, "dinput", i, MEM_ACTIVATION);
    linear_backward(dx, g[FC1_WEIGHT], g[FC1_BIAS], dpre, x, w[FC1_WEIGHT], N, C, H);
    add_inplace(dx, dout, (size_t)N * C);
    release(model, &dpre);
    release(model, &acts->dresiduals[i + 1]);
    block_activations_free(model, a);
    release(model, &acts->residuals[i]);
}

/* piece 0.  dembed[tokens] += dresiduals[0] */
static void embed_backward(mlp_model *model, mlp_activations *acts) {
    int N = acts->B * acts->T;
    if (acts->dresiduals[0] == NULL) world_fatal(model->ctx, "MlpLM: embed (piece 0) backward before piece 1's");
    embedding_backward(mlp_param_grad(model, embed_param()), acts->dresiduals[0], acts->tokens, N,
                       model->config.hidden_size);
    release(model, &acts->dresiduals[0]);
    release(model, &acts->residuals[0]);
}

/* ---------------------------------------------------------------- the model as the runtime sees it */

static void check_piece(const mlp_model *model, int piece, const char *what) {
    if (piece < 0 || piece > model->config.num_blocks + 1)
        world_fatal(model->ctx, "MlpLM: %s of piece %d; pieces are 0..%d", what, piece, model->config.num_blocks + 1);
}

static void mlp_piece_name(const void *self, int piece, char *name, size_t size) {
    const mlp_model *model = self;
    int n = model->config.num_blocks;
    if (piece == 0) snprintf(name, size, "embed");
    else if (piece == n + 1) snprintf(name, size, "head_loss");
    else snprintf(name, size, "blocks.%d", piece - 1);
}

static int mlp_piece_checkpointable(const void *self, int piece) {
    const mlp_model *model = self;
    return piece >= 1 && piece <= model->config.num_blocks;
}

static int mlp_batch_begin(void *self, void **out, const int *tokens, const int *targets, int B, int T,
                           const int *checkpointed) {
    mlp_model *model = self;
    mlp_activations *acts = calloc(1, sizeof *acts);
    if (acts == NULL) world_fatal(model->ctx, "MlpLM: out of memory for a batch");
    if (activations_begin(model, acts, tokens, targets, B, T, checkpointed) != 0) {
        free(acts);
        return -1;
    }
    *out = acts;
    return 0;
}

static void mlp_batch_end(void *self, void *batch) {
    activations_end(self, batch);
    free(batch);
}

static void mlp_piece_forward(void *self, void *batch, int piece, int checkpoint) {
    mlp_model *model = self;
    int n = model->config.num_blocks;
    check_piece(model, piece, "forward");
    if (piece == 0) embed_forward(model, batch);
    else if (piece <= n) block_forward(model, batch, piece - 1, checkpoint);
    else head_forward(model, batch);
}

/* Backward needs x (kept), pre and act: only fc1 and GELU run again. fc2 and the residual add are not recomputed:
 * their output, the next block's input, was kept (it is that block's checkpoint) and backward never reads it here. */
static void mlp_piece_recompute(void *self, void *batch, int piece) {
    mlp_model *model = self;
    check_piece(model, piece, "recompute");
    if (!mlp_piece_checkpointable(model, piece))
        world_fatal(model->ctx, "MlpLM: recompute of piece %d, which is not a block", piece);
    block_hidden_forward(model, batch, piece - 1);
}

static void mlp_piece_backward(void *self, void *batch, int piece) {
    mlp_model *model = self;
    int n = model->config.num_blocks;
    check_piece(model, piece, "backward");
    if (piece == 0) embed_backward(model, batch);
    else if (piece <= n) block_backward(model, batch, piece - 1);
    else head_backward(model, batch);
}

static float mlp_batch_loss(const void *self, const void *batch) {
    (void)self;
    return ((const mlp_activations *)batch)->loss;
}

static void mlp_scale_loss_gradient(void *self, void *batch, float factor) {
    mlp_model *model = self;
    mlp_activations *acts = batch;
    if (acts->dlogits == NULL) world_fatal(model->ctx, "MlpLM: loss gradient scaled by %g before the head's forward",
                                         (double)factor);
    size_t count = (size_t)acts->B * (size_t)acts->T * (size_t)model->config.vocab_size;
    for (size_t i = 0; i < count; i++) acts->dlogits[i] *= factor;
}

static const module_ops mlp_module_ops = {
    .piece_name = mlp_piece_name,
    .piece_checkpointable = mlp_piece_checkpointable,
    .batch_begin = mlp_batch_begin,
    .batch_end = mlp_batch_end,
    .forward = mlp_piece_forward,
    .recompute = mlp_piece_recompute,
    .backward = mlp_piece_backward,
    .loss = mlp_batch_loss,
    .scale_loss_gradient = mlp_scale_loss_gradient,
};

void mlp_as_module(mlp_model *model, module *out) {
    *out = (module){
        .name = "MlpLM",
        .tree = &model->tree,
        .piece_count = model->config.num_blocks + 2,
        .unit_count = model->unit_count,
        .units = model->units,
        .locations = model->locations,
        .ops = &mlp_module_ops,
        .self = model,
    };
}
