/* lab 04 — activation checkpointing: trade a second forward for most of the activation memory.
 *
 * What it teaches
 *   Backward needs what forward computed (normalised inputs, q/k/v, MLP activations...; the attention probabilities,
 *   B H T^2 a layer, it makes again from q and k, as torch's scaled_dot_product_attention does: this lab's trade in
 *   the small), so by the end of forward every layer's saved tensors are alive at once: activation memory grows with
 *   layers x batch x sequence, and often outweighs the sharded parameters. With checkpointing a layer keeps only its
 *   input (checkpoint_input) and drops the rest right after its forward; in backward, after the unit is unsharded
 *   again, the layer's forward runs a second time to rebuild them, then its backward. Same numbers, bit for bit: the
 *   recomputation is the same arithmetic on the same inputs. The price is one more forward of every layer: about a
 *   third more compute for a step (forward 1x + backward 2x becomes 2x + 2x, for the layers).
 *
 * What to run (from the repository root; `make lab-NN` builds the lab, then launches it through the Makefile's MPIRUN,
 * which adds the flags mpirun needs as root (--allow-run-as-root) and for more ranks than cores (--oversubscribe))
 *   make lab-04                        one micro-batch without and with checkpointing, compared
 *   make lab-04 NP=3
 *   mpirun --allow-run-as-root --oversubscribe -np 3 lab/04_checkpoint     the same by hand, after `make`
 *   env: MODEL, CONFIG, MBS, SEQ, SEED, OUT (default runs/04_checkpoint), NP
 *
 * What to look at (runs/04_checkpoint/trace.json)
 *   Three steps (a warm-up, then the two compared). In the second the memory counter's activation band climbs through
 *   all layers' forwards; in the third it stays low and a thin checkpoint_input band climbs instead, and on the compute
 *   track each layer's backward is preceded by a "recompute" span, inside the unit's unshard (the all_gather before
 *   it).
 *
 * The check (`make check-04`): peak activation memory drops and every gradient is identical, on 2 and 3 ranks.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/runtime/env.h"
#include "core/runtime/context.h"
#include "core/data/data.h"
#include "core/fsdp/fsdp.h"
#include "core/runtime/offload.h"
#include "core/models/qwen2.h"
#include "core/runtime/world.h"
#include "core/runtime/session.h"

typedef struct run_result {
    size_t activation_peak, checkpoint_input_peak, total_peak, reserved_peak;
    double seconds;
    float loss;
} run_result;

/* One micro-batch forward + backward with checkpointing on or off; the gradient shards stay in the model. */
static run_result run_once(context *ctx, qwen2_model *model, int checkpointing, const int *tokens, const int *targets,
                           int B, int T) {
    fsdp_options options = {.strategy = FSDP_FULL_SHARD, .activation_checkpointing = checkpointing,
                            .accumulation_steps = 1};
    fsdp_runtime runtime;
    module view;
    qwen2_as_module(model, &view);
    if (fsdp_runtime_init(&runtime, ctx, &view, &options) != 0) world_fatal(ctx, "%s", ctx->error);
    trace_mark(&ctx->trace, checkpointing ? "lab 04: with activation checkpointing" : "lab 04: without checkpointing");
    /* torch.cuda.empty_cache() + reset_peak_memory_stats(): the first run's cached blocks would otherwise count in
     * the second's reserved peak. */
    mem_empty_cache(&ctx->mem);
    trace_step(&ctx->trace, checkpointing + 1, 0, 0.0, ctx->mem.live_bytes, ctx->mem.reserved_bytes, 0.0);
    mem_reset_peak(&ctx->mem);
    double start = MPI_Wtime();
    run_result result = {.loss = fsdp_forward_backward(&runtime, tokens, targets, B, T, FSDP_MICRO_BATCH_LAST)};
    result.seconds = MPI_Wtime() - start;
    result.activation_peak = ctx->mem.category_peak_bytes[MEM_ACTIVATION];
    result.checkpoint_input_peak = ctx->mem.category_peak_bytes[MEM_CHECKPOINT_INPUT];
    result.total_peak = ctx->mem.peak_bytes;
    result.reserved_peak = ctx->mem.peak_reserved_bytes;
    fsdp_runtime_free(&runtime);
    return result;
}

/* This rank's gradient shards, concatenated, so the second run can be compared with the first. */
static float *copy_gradients(context *ctx, const qwen2_model *model, size_t *count) {
    *count = 0;
    for (int unit = 0; unit < model->unit_count; unit++) *count += model->units[unit].sharded_numel;
    float *copy = mem_alloc(&ctx->mem, *count * sizeof(float), MEM_WORKSPACE, "lab04.gradients_without");
    size_t offset = 0;
    for (int unit = 0; unit < model->unit_count; unit++) {
        const flat_param *fp = &model->units[unit];
        memcpy(copy + offset, fp->grad_shard, fp->sharded_numel * sizeof(float));
        offset += fp->sharded_numel;
    }
    return copy;
}

static int gradients_equal(const qwen2_model *model, const float *expected) {
    size_t offset = 0;
    int equal = 1;
    for (int unit = 0; unit < model->unit_count; unit++) {
        const flat_param *fp = &model->units[unit];
        equal &= memcmp(expected + offset, fp->grad_shard, fp->sharded_numel * sizeof(float)) == 0;
        offset += fp->sharded_numel;
    }
    return equal;
}

static void print_row(const char *label, const run_result *r) {
    char activation[32], kept[32], total[32], reserved[32];
    printf("  %-26s %12s %18s %12s %12s %9.1f ms\n", label,
           mem_format_bytes(r->activation_peak, activation, sizeof activation),
           mem_format_bytes(r->checkpoint_input_peak, kept, sizeof kept),
           mem_format_bytes(r->total_peak, total, sizeof total),
           mem_format_bytes(r->reserved_peak, reserved, sizeof reserved), r->seconds * 1000.0);
}

int main(int argc, char **argv) {
    context ctx;
    session_open(&ctx, &argc, &argv, "04_checkpoint", "runs/04_checkpoint");
    session_require_cpu(&ctx, "the gradients and shards it saves and compares");
    world_require_size(&ctx, 1, 8);
    int B = (int)env_int(&ctx, "MBS", 4, 1, 4096), T = (int)env_int(&ctx, "SEQ", 128, 2, 32768);
    uint64_t seed = env_seed(&ctx);
    qwen2_config config;
    qwen2_config_from_env(&ctx, &config, T);

    qwen2_model model;
    qwen2_init_spec init = {.seed = seed, .std = (float)config.initializer_range};
    if (qwen2_model_init_wrapped(&model, &ctx, &config, fsdp_wrap_by_type, (void *)QWEN2_DECODER_LAYER, FSDP_FULL_SHARD,
                                 &init) != 0)
        world_exit_all(&ctx, 2, "%s", ctx.error);
    const char *data = env_text(&ctx, "DATA");
    char tokenizer_note[1024]; /* TOKENIZER as in lab 05: Qwen2's BPE for qwen2-0.5b's vocabulary, bytes for tiny */
    tok_tokenizer *tokenizer = data_tokenizer_from_env(&ctx, config.vocab_size, tokenizer_note, sizeof tokenizer_note);
    data_loader loader;
    if (data_loader_open_tokenized(&loader, &ctx, data, tokenizer, config.vocab_size, B, T, seed, 1) != 0)
        world_exit_all(&ctx, 2, "DATA: %s", ctx.error);
    int *tokens = mem_alloc(offload_data_pool(&ctx), (size_t)B * T * sizeof(int), MEM_DATA, "batch.tokens_host");
    int *targets = mem_alloc(offload_data_pool(&ctx), (size_t)B * T * sizeof(int), MEM_DATA, "batch.targets_host");
    data_next_batch(&loader, tokens, targets);

    run_once(&ctx, &model, 0, tokens, targets, B, T); /* warm-up: the first touch of every buffer is not the lesson */
    for (int unit = 0; unit < model.unit_count; unit++) flat_param_zero_grad(&model.units[unit]);
    run_result without = run_once(&ctx, &model, 0, tokens, targets, B, T);
    size_t gradient_count;
    float *gradients = copy_gradients(&ctx, &model, &gradient_count);
    for (int unit = 0; unit < model.unit_count; unit++) flat_param_zero_grad(&model.units[unit]);
    run_result with = run_once(&ctx, &model, 1, tokens, targets, B, T);
    int identical = world_all_true(&ctx, gradients_equal(&model, gradients) && with.loss == without.loss);
    int smaller = world_all_true(&ctx, with.activation_peak + with.checkpoint_input_peak < without.activation_peak);

    if (ctx.rank == 0) {
        double layer_flops = qwen2_forward_flops(&config, B, T, 1);
        double step_flops = 3.0 * qwen2_forward_flops(&config, B, T, 0);
        printf("lab 04 — activation checkpointing, %s (%d layers), micro-batch %d x %d per rank, %d ranks\n\n",
               config.name, config.num_hidden_layers, B, T, ctx.world_size);
        printf("  %-26s %12s %18s %12s %12s %12s\n", "rank 0", "activation", "checkpoint_input", "peak",
               "reserved", "time");
        print_row("without checkpointing", &without);
        print_row("with checkpointing", &with);
        printf("\nactivation memory kept: %.1f%% of what it was; extra forward work: %.2f GFLOP on %.2f GFLOP "
               "(+%.0f%%)\n",
               100.0 * (double)(with.activation_peak + with.checkpoint_input_peak) / (double)without.activation_peak,
               layer_flops / 1e9, step_flops / 1e9, 100.0 * layer_flops / step_flops);
        printf("\ncheck: peak activation memory (activation + checkpoint_input) drops, all ranks: %s\n",
               smaller ? "OK" : "NO");
        printf("check: loss and every gradient identical with and without (%zu floats per rank), all ranks: %s\n",
               gradient_count, identical ? "OK" : "MISMATCH");
    }
    mem_free(&ctx.mem, gradients);
    mem_free(offload_data_pool(&ctx), tokens);
    mem_free(offload_data_pool(&ctx), targets);
    data_loader_close(&loader);
    if (tokenizer != NULL) tok_free(tokenizer);
    free(tokenizer);
    qwen2_model_free(&model);
    int status = session_close(&ctx);
    return identical && smaller ? status : 1;
}
