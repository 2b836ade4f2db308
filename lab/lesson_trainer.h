/* lesson_trainer.h — what labs 06, 07 and 08 build for each mode they compare: a fresh tiny (or CONFIG) Qwen2 from SEED,
 * one FSDP unit per decoder layer under the given options, its runtime, AdamW on the shards and the generated
 * stories; then optimizer steps of one micro-batch each. Each mode starts from the same parameters and batches, so
 * the modes differ only in what the lab compares. */
#ifndef FSDPLAB_LESSON_TRAINER_H
#define FSDPLAB_LESSON_TRAINER_H

#include <stdlib.h>

#include "core/runtime/env.h"
#include "core/data/data.h"
#include "core/fsdp/fsdp.h"
#include "core/models/memory_model.h"
#include "core/runtime/offload.h"
#include "core/fsdp/optim.h"
#include "core/models/qwen2.h"
#include "core/runtime/world.h"

typedef struct lesson_trainer {
    context *ctx;
    fsdp_options options;
    qwen2_model model;
    module view;
    fsdp_runtime runtime;
    adamw_config optimizer;
    adamw_state *states;
    data_loader loader;
    int *tokens, *targets;
    int micro_batch, seq_len, steps;
} lesson_trainer;

/* Refuses (every rank exits) a run the memory model says cannot fit, before anything is allocated (MEMORY_CHECK=0
 * skips it); then builds everything. A hybrid strategy shards over ctx->mesh's shard group, so set it first. */
static inline void lesson_trainer_open(lesson_trainer *t, context *ctx, const fsdp_options *options,
                                       int micro_batch, int seq_len, uint64_t seed, int steps) {
    *t = (lesson_trainer){.ctx = ctx, .options = *options, .micro_batch = micro_batch, .seq_len = seq_len,
                          .steps = steps};
    qwen2_config config;
    qwen2_config_from_env(ctx, &config, seq_len);
    memory_prediction prediction;
    if (memory_model_predict_config(&prediction, ctx, &config, fsdp_wrap_by_type, (void *)QWEN2_DECODER_LAYER, options,
                                    micro_batch, seq_len, 0, steps) != 0)
        world_exit_all(ctx, 2, "%s", ctx->error);
    memory_model_require_fit(ctx, &prediction);
    qwen2_init_spec init = {.seed = seed, .std = (float)config.initializer_range};
    if (qwen2_model_init_wrapped(&t->model, ctx, &config, fsdp_wrap_by_type, (void *)QWEN2_DECODER_LAYER,
                                 options->strategy, &init) != 0)
        world_exit_all(ctx, 2, "%s", ctx->error);
    qwen2_as_module(&t->model, &t->view);
    if (fsdp_runtime_init(&t->runtime, ctx, &t->view, options) != 0) world_exit_all(ctx, 2, "%s", ctx->error);
    t->optimizer = adamw_default_config();
    t->states = calloc((size_t)t->model.unit_count, sizeof *t->states);
    if (t->states == NULL) world_fatal(ctx, "out of memory");
    for (int unit = 0; unit < t->model.unit_count; unit++) adamw_init(&t->states[unit]);
    if (data_loader_open(&t->loader, ctx, NULL, config.vocab_size, micro_batch, seq_len, seed, 1) != 0)
        world_exit_all(ctx, 2, "%s", ctx->error);
    size_t batch = (size_t)micro_batch * (size_t)seq_len;
    t->tokens = mem_alloc(offload_data_pool(ctx), batch * sizeof(int), MEM_DATA, "batch.tokens_host");
    t->targets = mem_alloc(offload_data_pool(ctx), batch * sizeof(int), MEM_DATA, "batch.targets_host");
}

/* One optimizer step of one micro-batch: the next batch, forward and backward with the FSDP hooks, AdamW on every
 * unit's shard, zero_grad. Returns this rank's loss. */
static inline float lesson_trainer_step(lesson_trainer *t) {
    data_next_batch(&t->loader, t->tokens, t->targets);
    float loss = fsdp_forward_backward(&t->runtime, t->tokens, t->targets, t->micro_batch, t->seq_len,
                                       FSDP_MICRO_BATCH_LAST);
    for (int unit = 0; unit < t->model.unit_count; unit++) {
        adamw_step(&t->states[unit], &t->model.units[unit], &t->optimizer);
        flat_param_zero_grad(&t->model.units[unit]);
    }
    return loss;
}

/* The memory model's prediction for what ran (per category, to set beside the measured peaks). */
static inline void lesson_trainer_predict(const lesson_trainer *t, memory_prediction *predicted) {
    memory_model_predict(predicted, &t->model, &t->options, t->ctx->world_size, t->micro_batch, t->seq_len,
                         t->loader.token_bytes, t->steps);
}

/* Frees everything, and empties the allocator's cache: the next mode starts from nothing reserved. */
static inline void lesson_trainer_close(lesson_trainer *t) {
    context *ctx = t->ctx;
    mem_free(offload_data_pool(ctx), t->tokens);
    mem_free(offload_data_pool(ctx), t->targets);
    data_loader_close(&t->loader);
    for (int unit = 0; unit < t->model.unit_count; unit++) adamw_free(&t->states[unit]);
    free(t->states);
    fsdp_runtime_free(&t->runtime);
    qwen2_model_free(&t->model);
    mem_empty_cache(&ctx->mem);
}

#endif
