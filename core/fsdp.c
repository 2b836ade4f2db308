/* fsdp.c — FSDP units, states, hooks and the micro-batch step. See fsdp.h. */
#include "fsdp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const training_state_names[] = {"IDLE", "FORWARD_BACKWARD"};
static const char *const handle_state_names[] = {"IDLE", "FORWARD", "BACKWARD_PRE", "BACKWARD_POST"};
static const char *const strategy_names[] = {"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD"};

const char *fsdp_training_state_name(fsdp_training_state state) { return training_state_names[state]; }
const char *fsdp_handle_state_name(fsdp_handle_state state) { return handle_state_names[state]; }
const char *fsdp_strategy_name(fsdp_strategy strategy) { return strategy_names[strategy]; }

int fsdp_strategy_from_name(const char *name) {
    for (int strategy = 0; strategy < 3; strategy++)
        if (strcmp(strategy_names[strategy], name) == 0) return strategy;
    return -1;
}

/* ---------------------------------------------------------------- wrap policy */

int fsdp_wrap_decoder_layers(const qwen2_module *module, size_t unwrapped_numel, void *user) {
    (void)unwrapped_numel, (void)user;
    return strcmp(module->type, "Qwen2DecoderLayer") == 0;
}

int fsdp_wrap_by_size(const qwen2_module *module, size_t unwrapped_numel, void *user) {
    return strcmp(module->type, "ModuleList") != 0 && unwrapped_numel >= *(const size_t *)user;
}

int fsdp_auto_wrap(const qwen2_tree *tree, fsdp_wrap_fn wrap, void *user, int *unit_of_param) {
    int modules = tree->module_count;
    size_t *unwrapped = calloc((size_t)modules, sizeof *unwrapped);
    int *unit_of_module = calloc((size_t)modules, sizeof *unit_of_module); /* 0: not wrapped */
    if (unwrapped == NULL || unit_of_module == NULL) {
        fprintf(stderr, "fsdp_auto_wrap: out of memory for %d modules\n", modules);
        abort();
    }
    size_t total = 0;
    for (int p = 0; p < tree->param_count; p++) {
        unwrapped[tree->params[p].module] += qwen2_param_numel(&tree->params[p]);
        total += qwen2_param_numel(&tree->params[p]);
    }
    /* Children come after their parents in the tree, so walking backwards visits children first (post-order). A
     * module that would take every parameter left (Qwen2Model, around everything but the tied lm_head) is the root
     * itself: wrapping it would leave the root unit empty. */
    size_t claimed = 0;
    for (int m = modules - 1; m >= 1; m--) {
        int takes_the_rest = claimed + unwrapped[m] == total;
        if (unwrapped[m] > 0 && !takes_the_rest && wrap(&tree->modules[m], unwrapped[m], user)) {
            unit_of_module[m] = 1;
            claimed += unwrapped[m];
        } else {
            unwrapped[tree->modules[m].parent] += unwrapped[m];
        }
    }
    /* Number the wrapped modules in module (forward) order; the root is unit 0. */
    int units = 1;
    for (int m = 1; m < modules; m++)
        if (unit_of_module[m]) unit_of_module[m] = units++;
    for (int p = 0; p < tree->param_count; p++) {
        int m = tree->params[p].module;
        while (m > 0 && unit_of_module[m] == 0) m = tree->modules[m].parent; /* nearest wrapped ancestor */
        unit_of_param[p] = m > 0 ? unit_of_module[m] : 0;
    }
    free(unwrapped);
    free(unit_of_module);
    return units;
}

int fsdp_model_init(qwen2_model *model, context *ctx, const qwen2_config *config, fsdp_wrap_fn wrap, void *user,
                    fsdp_strategy strategy, const qwen2_init_spec *init) {
    qwen2_tree tree;
    if (qwen2_config_validate(config, ctx->error, sizeof ctx->error) != 0) return -1;
    if (qwen2_tree_build(&tree, config) != 0) ctx_fatal(ctx, "out of memory building the module tree");
    int *unit_of_param = calloc((size_t)tree.param_count, sizeof *unit_of_param);
    if (unit_of_param == NULL) ctx_fatal(ctx, "out of memory");
    int unit_count = fsdp_auto_wrap(&tree, wrap, user, unit_of_param);
    int status = qwen2_model_init(model, ctx, config, unit_of_param, unit_count, strategy == FSDP_NO_SHARD, init);
    free(unit_of_param);
    qwen2_tree_free(&tree);
    return status;
}

/* ---------------------------------------------------------------- states */

static const char *unit_name(const fsdp_runtime *runtime, int unit) { return runtime->model->units[unit].unit; }

int fsdp_check_transition(fsdp_runtime *runtime, int unit, fsdp_handle_state expected, fsdp_handle_state to,
                          const char *hook) {
    fsdp_handle_state now = runtime->units[unit].handle_state;
    if (now == expected) return 0;
    snprintf(runtime->ctx->error, sizeof runtime->ctx->error,
             "rank %d: unit '%s': illegal HandleTrainingState transition %s -> %s in %s (expected from %s)",
             runtime->ctx->rank, unit_name(runtime, unit), handle_state_names[now], handle_state_names[to], hook,
             handle_state_names[expected]);
    return -1;
}

static void set_handle_state(fsdp_runtime *runtime, int unit, fsdp_handle_state expected, fsdp_handle_state to,
                             const char *hook) {
    fsdp_unit *u = &runtime->units[unit];
    if (fsdp_check_transition(runtime, unit, expected, to, hook) != 0) ctx_fatal(runtime->ctx, "%s", runtime->ctx->error);
    trace_state(&runtime->ctx->trace, unit_name(runtime, unit), "HandleTrainingState", handle_state_names[expected],
                handle_state_names[to], hook);
    u->handle_state = to;
}

static void set_training_state(fsdp_runtime *runtime, int unit, fsdp_training_state to, const char *hook) {
    fsdp_unit *u = &runtime->units[unit];
    if (u->training_state == to) return; /* FORWARD_BACKWARD stays so for the whole pass */
    trace_state(&runtime->ctx->trace, unit_name(runtime, unit), "TrainingState", training_state_names[u->training_state],
                training_state_names[to], hook);
    u->training_state = to;
}

static void unshard(fsdp_runtime *runtime, int unit, const char *hook) {
    if (fp_unshard(&runtime->model->units[unit], hook) != 0) ctx_fatal(runtime->ctx, "%s", runtime->ctx->error);
}

/* ---------------------------------------------------------------- hooks */

void fsdp_pre_forward(fsdp_runtime *runtime, int unit) {
    set_training_state(runtime, unit, TRAINING_STATE_FORWARD_BACKWARD, "_pre_forward");
    set_handle_state(runtime, unit, HANDLE_IDLE, HANDLE_FORWARD, "_pre_forward");
    unshard(runtime, unit, "_pre_forward");
}

void fsdp_post_forward(fsdp_runtime *runtime, int unit) {
    /* The root keeps its parameters for backward, which starts with it; SHARD_GRAD_OP keeps every unit's. */
    int keep = unit == 0 || runtime->options.strategy != FSDP_FULL_SHARD;
    if (!keep) fp_reshard(&runtime->model->units[unit], "_post_forward");
    set_handle_state(runtime, unit, HANDLE_FORWARD, HANDLE_IDLE, "_post_forward");
}

void fsdp_pre_backward_hook(fsdp_runtime *runtime, int unit) {
    set_handle_state(runtime, unit, HANDLE_IDLE, HANDLE_BACKWARD_PRE, "_pre_backward_hook");
    unshard(runtime, unit, "_pre_backward_hook");
    fp_alloc_full_grad(&runtime->model->units[unit]); /* kept from the last micro-batch under no_sync */
}

void fsdp_post_backward_hook(fsdp_runtime *runtime, int unit) {
    flat_param *fp = &runtime->model->units[unit];
    if (runtime->sync_gradients && fp_reduce_scatter_grad(fp, COMM_AVG) != 0)
        ctx_fatal(runtime->ctx, "%s", runtime->ctx->error);
    fp_reshard(fp, "_post_backward_hook");
    set_handle_state(runtime, unit, HANDLE_BACKWARD_PRE, HANDLE_BACKWARD_POST, "_post_backward_hook");
}

void fsdp_post_backward_final_callback(fsdp_runtime *runtime) {
    for (int unit = 0; unit < runtime->model->unit_count; unit++) {
        set_handle_state(runtime, unit, HANDLE_BACKWARD_POST, HANDLE_IDLE, "_post_backward_final_callback");
        set_training_state(runtime, unit, TRAINING_STATE_IDLE, "_post_backward_final_callback");
    }
}

/* ---------------------------------------------------------------- runtime */

/* The pieces a parameter is used in: embed_tokens in the embedding and (tied) the head; norm in the head. */
static void param_pieces(const qwen2_model *model, int param, int *first, int *last) {
    int layer = model->tree.params[param].layer, head = model->config.num_hidden_layers + 1;
    if (layer >= 0) *first = *last = 1 + layer;
    else if (param == 0) *first = 0, *last = head; /* model.embed_tokens.weight */
    else *first = *last = head;                    /* model.norm.weight */
}

int fsdp_runtime_init(fsdp_runtime *runtime, context *ctx, qwen2_model *model, const fsdp_options *options) {
    memset(runtime, 0, sizeof *runtime);
    runtime->ctx = ctx;
    runtime->model = model;
    runtime->options = *options;
    if (options->accumulation_steps < 1) {
        snprintf(ctx->error, sizeof ctx->error, "accumulation steps must be >= 1, got %d", options->accumulation_steps);
        return -1;
    }
    int L = model->config.num_hidden_layers;
    runtime->piece_count = L + 2;
    runtime->sync_gradients = 1;
    runtime->units = calloc((size_t)model->unit_count, sizeof *runtime->units);
    runtime->checkpointed_layers = calloc((size_t)(L > 0 ? L : 1), sizeof *runtime->checkpointed_layers);
    if (runtime->units == NULL || runtime->checkpointed_layers == NULL) ctx_fatal(ctx, "out of memory");
    for (int unit = 0; unit < model->unit_count; unit++)
        runtime->units[unit].first_piece = runtime->piece_count, runtime->units[unit].last_piece = -1;
    for (int p = 0; p < model->tree.param_count; p++) {
        fsdp_unit *u = &runtime->units[model->locations[p].unit];
        int first, last;
        param_pieces(model, p, &first, &last);
        if (first < u->first_piece) u->first_piece = first;
        if (last > u->last_piece) u->last_piece = last;
    }
    runtime->units[0].first_piece = 0; /* the root wraps the whole model, parameters or not */
    runtime->units[0].last_piece = runtime->piece_count - 1;
    for (int l = 0; l < L; l++) runtime->checkpointed_layers[l] = options->activation_checkpointing;
    return 0;
}

void fsdp_runtime_free(fsdp_runtime *runtime) {
    free(runtime->units);
    free(runtime->checkpointed_layers);
    memset(runtime, 0, sizeof *runtime);
}

/* Units whose span starts (or ends) at `piece`, outer (wider span) first, or inner first when `inner_first`. */
static int units_at(const fsdp_runtime *runtime, int piece, int at_start, int inner_first, int *out) {
    int count = 0;
    for (int unit = 0; unit < runtime->model->unit_count; unit++) {
        const fsdp_unit *u = &runtime->units[unit];
        if ((at_start ? u->first_piece : u->last_piece) == piece) out[count++] = unit;
    }
    for (int i = 1; i < count; i++) /* insertion sort by span width: a handful of units */
        for (int j = i; j > 0; j--) {
            const fsdp_unit *a = &runtime->units[out[j - 1]], *b = &runtime->units[out[j]];
            int width_a = a->last_piece - a->first_piece, width_b = b->last_piece - b->first_piece;
            if (inner_first ? width_a > width_b : width_a < width_b) {
                int swap = out[j];
                out[j] = out[j - 1];
                out[j - 1] = swap;
            }
        }
    return count;
}

static void piece_name(const fsdp_runtime *runtime, int piece, const char *what, char *name, size_t size) {
    int L = runtime->model->config.num_hidden_layers;
    if (piece == 0) snprintf(name, size, "embed_tokens.%s", what);
    else if (piece == L + 1) snprintf(name, size, "norm_lm_head_loss.%s", what);
    else snprintf(name, size, "layers.%d.%s", piece - 1, what);
}

/* The unit a piece's compute span is labelled with: the innermost unit covering it. */
static const char *piece_unit(const fsdp_runtime *runtime, int piece) {
    int best = 0;
    for (int unit = 1; unit < runtime->model->unit_count; unit++) {
        const fsdp_unit *u = &runtime->units[unit], *b = &runtime->units[best];
        if (u->first_piece <= piece && piece <= u->last_piece &&
            u->last_piece - u->first_piece < b->last_piece - b->first_piece)
            best = unit;
    }
    return unit_name(runtime, best);
}

static void forward_piece(fsdp_runtime *runtime, qwen2_activations *acts, int piece) {
    qwen2_model *model = runtime->model;
    int L = model->config.num_hidden_layers;
    char name[64];
    double start = trace_now_us(&runtime->ctx->trace);
    if (piece == 0) qwen2_embed_forward(model, acts);
    else if (piece <= L) {
        qwen2_layer_forward(model, acts, piece - 1);
        /* checkpointing keeps only the layer's input (allocated as checkpoint_input by the piece before) */
        if (runtime->checkpointed_layers[piece - 1]) qwen2_layer_activations_free(model, &acts->layers[piece - 1]);
    } else qwen2_head_forward(model, acts);
    piece_name(runtime, piece, "forward", name, sizeof name);
    trace_compute(&runtime->ctx->trace, name, piece_unit(runtime, piece), "forward", start,
                  trace_now_us(&runtime->ctx->trace) - start);
}

static void backward_piece(fsdp_runtime *runtime, qwen2_activations *acts, int piece) {
    qwen2_model *model = runtime->model;
    int L = model->config.num_hidden_layers;
    char name[64];
    if (piece >= 1 && piece <= L && runtime->checkpointed_layers[piece - 1]) {
        double start = trace_now_us(&runtime->ctx->trace);
        qwen2_layer_recompute(model, acts, piece - 1);
        piece_name(runtime, piece, "recompute", name, sizeof name);
        trace_compute(&runtime->ctx->trace, name, piece_unit(runtime, piece), "recompute", start,
                      trace_now_us(&runtime->ctx->trace) - start);
    }
    double start = trace_now_us(&runtime->ctx->trace);
    if (piece == 0) qwen2_embed_backward(model, acts);
    else if (piece <= L) qwen2_layer_backward(model, acts, piece - 1);
    else qwen2_head_backward(model, acts);
    piece_name(runtime, piece, "backward", name, sizeof name);
    trace_compute(&runtime->ctx->trace, name, piece_unit(runtime, piece), "backward", start,
                  trace_now_us(&runtime->ctx->trace) - start);
}

float fsdp_forward_backward(fsdp_runtime *runtime, const int *tokens, const int *targets, int B, int T,
                            int last_micro) {
    qwen2_model *model = runtime->model;
    int *order = calloc((size_t)model->unit_count, sizeof *order);
    if (order == NULL) ctx_fatal(runtime->ctx, "out of memory");
    qwen2_activations acts;
    if (qwen2_activations_begin(model, &acts, tokens, targets, B, T) != 0) ctx_fatal(runtime->ctx, "%s", runtime->ctx->error);
    acts.checkpointed = runtime->checkpointed_layers;
    runtime->sync_gradients = !runtime->options.no_sync || last_micro;

    for (int piece = 0; piece < runtime->piece_count; piece++) {
        for (int i = 0, n = units_at(runtime, piece, 1, 0, order); i < n; i++) fsdp_pre_forward(runtime, order[i]);
        forward_piece(runtime, &acts, piece);
        for (int i = 0, n = units_at(runtime, piece, 0, 1, order); i < n; i++) fsdp_post_forward(runtime, order[i]);
    }
    /* Each micro-batch contributes 1/ACC of the step's gradient, as `(loss / accumulation_steps).backward()`. With
     * ACC = 1 the factor is 1.0f, and x * 1.0f is x: the pass over the B x T x vocab logits would change nothing. */
    if (runtime->options.accumulation_steps > 1) {
        size_t logits = (size_t)B * T * model->config.vocab_size;
        float scale = 1.0f / (float)runtime->options.accumulation_steps;
        for (size_t i = 0; i < logits; i++) acts.dlogits[i] *= scale;
    }

    for (int piece = runtime->piece_count - 1; piece >= 0; piece--) {
        for (int i = 0, n = units_at(runtime, piece, 0, 0, order); i < n; i++) fsdp_pre_backward_hook(runtime, order[i]);
        backward_piece(runtime, &acts, piece);
        for (int i = 0, n = units_at(runtime, piece, 1, 1, order); i < n; i++) fsdp_post_backward_hook(runtime, order[i]);
    }
    fsdp_post_backward_final_callback(runtime);
    float loss = acts.loss;
    qwen2_activations_end(model, &acts);
    free(order);
    return loss;
}
