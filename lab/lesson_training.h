/* lesson_training.h — the training setup labs 06 and 07 repeat for each of their runs: the memory model's check that
 * the run fits, the model (one unit per decoder layer, FULL_SHARD) from SEED, the FSDP runtime with the run's options,
 * AdamW per unit, the generated stories and the lab's token buffers; and its teardown, which leaves an empty cache so
 * the next run starts as the first did. */
#ifndef FSDPLAB_LESSON_TRAINING_H
#define FSDPLAB_LESSON_TRAINING_H

#include <stdlib.h>

#include "../core/data.h"
#include "../core/fsdp.h"
#include "../core/memory_model.h"
#include "../core/optim.h"
#include "../core/qwen2.h"

typedef struct lesson_training {
    qwen2_model model;
    module view;
    fsdp_runtime runtime;
    adamw_state *states;          /* one per unit */
    data_loader loader;
    int *tokens, *targets;        /* this rank's micro-batch, category data */
} lesson_training;

/* Everything for `steps` steps of MBS x SEQ under `options`; a run that cannot fit, or bad settings, stop every
 * rank. */
static inline void lesson_training_open(lesson_training *t, context *ctx, const fsdp_options *options, int micro_batch,
                                        int seq_len, uint64_t seed, int steps) {
    qwen2_config config;
    qwen2_config_from_env(ctx, &config, seq_len);
    /* A run that cannot fit is refused before the model is allocated (MEMORY_CHECK=0 skips it). */
    memory_prediction prediction;
    if (memory_model_predict_config(&prediction, ctx, &config, fsdp_wrap_by_type, (void *)QWEN2_DECODER_LAYER, options,
                                    micro_batch, seq_len, 0, steps) != 0)
        ctx_exit_all(ctx, 2, "%s", ctx->error);
    memory_model_require_fit(ctx, &prediction);
    qwen2_init_spec init = {.seed = seed, .std = (float)config.initializer_range};
    if (qwen2_model_init_wrapped(&t->model, ctx, &config, fsdp_wrap_by_type, (void *)QWEN2_DECODER_LAYER,
                                 FSDP_FULL_SHARD, &init) != 0)
        ctx_exit_all(ctx, 2, "%s", ctx->error);
    qwen2_as_module(&t->model, &t->view);
    if (fsdp_runtime_init(&t->runtime, ctx, &t->view, options) != 0) ctx_exit_all(ctx, 2, "%s", ctx->error);
    t->states = calloc((size_t)t->model.unit_count, sizeof *t->states);
    if (t->states == NULL) ctx_fatal(ctx, "out of memory");
    for (int unit = 0; unit < t->model.unit_count; unit++) adamw_init(&t->states[unit]);
    if (data_loader_open(&t->loader, ctx, NULL, config.vocab_size, micro_batch, seq_len, seed, 1) != 0)
        ctx_exit_all(ctx, 2, "%s", ctx->error);
    size_t batch = (size_t)micro_batch * (size_t)seq_len;
    t->tokens = mem_alloc(&ctx->mem, batch * sizeof(int), MEM_DATA, "batch.tokens_host");
    t->targets = mem_alloc(&ctx->mem, batch * sizeof(int), MEM_DATA, "batch.targets_host");
}

static inline void lesson_training_close(lesson_training *t, context *ctx) {
    mem_free(&ctx->mem, t->tokens);
    mem_free(&ctx->mem, t->targets);
    data_loader_close(&t->loader);
    for (int unit = 0; unit < t->model.unit_count; unit++) adamw_free(&t->states[unit]);
    free(t->states);
    fsdp_runtime_free(&t->runtime);
    qwen2_model_free(&t->model);
    mem_empty_cache(&ctx->mem); /* every run starts from an empty cache */
}

#endif
