/* bench_model.c — forward + backward speed of the fsdplab Qwen2 on one CPU thread (no FSDP: one rank, one unit per
 * layer, all unsharded), and the achieved GFLOP/s against a measured cblas_sgemm peak. scripts/bench_model.sh runs
 * it beside the same model in PyTorch; see there.
 *
 *   scripts/bench_model model=tiny B=4 T=128 iterations=5 [hidden_size=512 num_hidden_layers=8 ...]
 * (any other key=value is a config field by its HF name, applied on top of the preset)
 * prints one JSON line: tokens_per_s, median step seconds, model GFLOP/s, sgemm peak GFLOP/s.
 *
 *   mpirun -np 2 scripts/bench_model probe=1 model=qwen2-0.5b B=1 T=64 [key=value ...]
 * builds no model: every rank measures its cblas_sgemm peak at the same time as the others (as lab 05's ranks share
 * the machine, THREADS OpenBLAS threads each, default 1) and rank 0 prints one JSON line per rank: the matmul FLOPs
 * of one micro-batch of B x T tokens per rank (qwen2_forward_flops: forward; the step is 3x that, backward costing
 * twice forward; element-wise work not counted) and that rank's peak. scripts/bench.sh uses it for GFLOP/s.
 */
#define _POSIX_C_SOURCE 200809L
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/runtime/context.h"
#include "core/fsdp/fsdp.h"
#include "core/kernels/layers.h"
#include "core/models/qwen2.h"
#include "core/base/rng.h"
#include "core/runtime/world.h"
#include "core/runtime/session.h"

static double now_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Single-thread sgemm GFLOP/s on 1024^3, best of `repeats`: the ceiling any model step could reach here. */
static double sgemm_peak_gflops(context *ctx, int repeats) {
    const int n = 1024;
    float *a = mem_alloc(&ctx->mem, (size_t)n * n * sizeof(float), MEM_WORKSPACE, "bench.a");
    float *b = mem_alloc(&ctx->mem, (size_t)n * n * sizeof(float), MEM_WORKSPACE, "bench.b");
    float *c = mem_alloc(&ctx->mem, (size_t)n * n * sizeof(float), MEM_WORKSPACE, "bench.c");
    for (size_t i = 0; i < (size_t)n * n; i++) a[i] = rng_uniform(1, 1, i), b[i] = rng_uniform(1, 2, i);
    double best = 1e30;
    for (int repeat = 0; repeat < repeats; repeat++) {
        double start = now_seconds();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        double elapsed = now_seconds() - start;
        if (elapsed < best) best = elapsed;
    }
    mem_free(&ctx->mem, a);
    mem_free(&ctx->mem, b);
    mem_free(&ctx->mem, c);
    return 2.0 * n * n * n / best / 1e9;
}

static const char *argument(int argc, char **argv, const char *key, const char *fallback) {
    size_t length = strlen(key);
    for (int i = 1; i < argc; i++)
        if (strncmp(argv[i], key, length) == 0 && argv[i][length] == '=') return argv[i] + length + 1;
    return fallback;
}

int main(int argc, char **argv) {
    context ctx;
    session_open(&ctx, &argc, &argv, "bench_model", "runs/bench_model");
    qwen2_config config;
    if (qwen2_config_preset(&config, argument(argc, argv, "model", "tiny"), ctx.error, sizeof ctx.error) != 0)
        world_exit_all(&ctx, 2, "%s", ctx.error);
    for (int i = 1; i < argc; i++) {
        char key[64];
        const char *equals = strchr(argv[i], '=');
        if (equals == NULL || (size_t)(equals - argv[i]) >= sizeof key)
            world_exit_all(&ctx, 2, "'%s' is not key=value", argv[i]);
        snprintf(key, sizeof key, "%.*s", (int)(equals - argv[i]), argv[i]);
        if (strcmp(key, "model") == 0 || strcmp(key, "B") == 0 || strcmp(key, "T") == 0 ||
            strcmp(key, "iterations") == 0 || strcmp(key, "probe") == 0)
            continue;
        if (qwen2_config_set(&config, key, equals + 1, ctx.error, sizeof ctx.error) != 0)
            world_exit_all(&ctx, 2, "%s", ctx.error);
    }
    if (qwen2_config_validate(&config, ctx.error, sizeof ctx.error) != 0) world_exit_all(&ctx, 2, "%s", ctx.error);
    int B = atoi(argument(argc, argv, "B", "4")), T = atoi(argument(argc, argv, "T", "128"));
    int iterations = atoi(argument(argc, argv, "iterations", "5"));
    if (B < 1 || T < 1 || iterations < 1) world_exit_all(&ctx, 2, "B, T and iterations must be positive");

    if (atoi(argument(argc, argv, "probe", "0")) != 0) {
        /* The peak under the lab's load: every rank multiplies at once, after a barrier. */
        layers_set_threads(ctx.threads);
        WORLD_MPI(&ctx, MPI_Barrier(ctx.comm));
        double peak = sgemm_peak_gflops(&ctx, 10), forward = qwen2_forward_flops(&config, B, T, 0);
        char line[512];
        snprintf(line, sizeof line, "{\"rank\": %d, \"threads\": %d, \"B\": %d, \"T\": %d, \"forward_flops\": %.0f, "
                 "\"step_flops\": %.0f, \"sgemm_peak_gflops\": %.2f}\n", ctx.rank, ctx.threads, B, T, forward,
                 3.0 * forward, peak);
        world_print_ordered(&ctx, line);
        trace_close(&ctx.trace);
        size_t leaks = mem_shutdown(&ctx.mem);
        MPI_Finalize();
        return leaks ? 1 : 0;
    }
    qwen2_init_spec init = {.seed = 1, .std = (float)config.initializer_range};
    qwen2_model model;
    if (qwen2_model_init_wrapped(&model, &ctx, &config, fsdp_wrap_by_type, (void *)QWEN2_DECODER_LAYER, FSDP_FULL_SHARD,
                                 &init) != 0)
        world_exit_all(&ctx, 2, "%s", ctx.error);
    for (int unit = 0; unit < model.unit_count; unit++)
        if (flat_param_unshard(&model.units[unit], "bench") != 0) world_fatal(&ctx, "%s", ctx.error);

    int *tokens = calloc((size_t)B * T, sizeof *tokens), *targets = calloc((size_t)B * T, sizeof *targets);
    for (int i = 0; i < B * T; i++) tokens[i] = (int)(rng_bits(2, 3, (uint64_t)i) % (uint64_t)config.vocab_size);
    for (int i = 0; i < B * T; i++) targets[i] = (i + 1) % T ? tokens[i + 1] : QWEN2_IGNORE_INDEX;

    double *seconds = calloc((size_t)iterations, sizeof *seconds);
    qwen2_forward_backward(&model, tokens, targets, B, T); /* warm-up: first-touch of every buffer */
    for (int i = 0; i < iterations; i++) {
        double start = now_seconds();
        qwen2_forward_backward(&model, tokens, targets, B, T);
        seconds[i] = now_seconds() - start;
    }
    qsort(seconds, (size_t)iterations, sizeof *seconds, compare_doubles);
    double median = seconds[iterations / 2], flops = 3.0 * qwen2_forward_flops(&config, B, T, 0);
    size_t params = 0;
    for (int p = 0; p < model.tree.param_count; p++) params += qwen2_param_numel(&model.tree.params[p]);
    printf("{\"impl\": \"fsdplab\", \"tokens_per_s\": %.1f, \"step_s\": %.5f, \"gflops\": %.2f, "
           "\"sgemm_peak_gflops\": %.2f, \"params\": %zu}\n",
           B * T / median, median, flops / median / 1e9, sgemm_peak_gflops(&ctx, 3), params);
    free(seconds);
    free(tokens);
    free(targets);
    qwen2_model_free(&model);
    trace_close(&ctx.trace);
    size_t leaks = mem_shutdown(&ctx.mem);
    MPI_Finalize();
    return leaks ? 1 : 0;
}
