/* lab 09 — CPU offload and deferred initialisation: where the bytes live, when they move, and what it costs.
 *
 * What it teaches
 *   1. CPU offload (torch's CPUOffload(offload_params=True)). Lab 05's memory is "1/N of everything + the units in
 *      flight + activations", all of it on the device. Offload moves the 1/N part, the parameter shards, the
 *      gradient shards and AdamW's two moments, to host memory, and moves data every time the device needs it:
 *        h2d  before each all-gather, the shard is copied into this rank's chunk of the device's unsharded buffer,
 *             and the all-gather runs in place there;
 *        d2h  after each reduce-scatter, the gradient shard is copied to the host and accumulated there;
 *        AdamW steps on the host, where the shard, its gradient and its moments are.
 *      The device pool is left with the unsharded units in flight, their gradients, one gradient shard (the
 *      reduce-scatter's output until its copy) and the activations. On this CPU build the "device" is a caching
 *      allocator of its own beside the host's (core/memory/mem.h), with its own budget (DEVICE_MEMORY_MB), so the
 *      lesson runs on a laptop; on a GPU the same copies cross PCIe, and their time is the price. A copy is exact: the
 *      losses and the parameters are the same with and without offload, bit for bit.
 *   2. Deferred initialisation. torch without the meta device builds the whole model on every rank and then shards
 *      it: every rank's peak holds the whole model. fsdplab's initialisation draws each value from a counter-based
 *      RNG keyed by (seed, parameter name, index) (core/base/rng.h), so a rank can make its own shard and nothing else:
 *      the peak is the shard. The lab builds tiny and qwen2-0.5b both ways and shows the two peaks; the shards are
 *      the same bits either way.
 *
 * What to run (from the repository root; `make lab-NN` builds the lab, then launches it through the Makefile's MPIRUN,
 * which adds the flags mpirun needs as root (--allow-run-as-root) and for more ranks than cores (--oversubscribe))
 *   make lab-09                        tiny without and with offload, then both inits of tiny and qwen2-0.5b
 *                                      (about 3 GB per rank for qwen2's naive one)
 *   make lab-09 INIT_MODELS=tiny       the initialisation lesson on tiny alone (no 3 GB)
 *   make lab-05 OFFLOAD=1              lab 05 offloaded; its report gets a host pool table
 *   make lab-05 DEVICE_MEMORY_MB=40    fails: a device of 40 MiB is out of memory, naming the budget...
 *   make lab-05 DEVICE_MEMORY_MB=40 OFFLOAD=1    ...and with offload it fits
 *   mpirun --allow-run-as-root --oversubscribe -np 2 lab/09_offload_and_init     the same by hand, after `make`
 *   env: MODEL, CONFIG, MBS, ACC, SEQ, STEPS, SEED, THREADS, OUT, NP (as lab 05; every setting: docs/reference.md);
 *   INIT_MODELS (comma-separated presets, default tiny,qwen2-0.5b; "none" skips the initialisation lesson)
 *
 * What to look at (runs/09_offload_and_init/trace.json in Perfetto UI; the two runs one after the other, marked)
 *   In the offloaded run, on the compute track: an "h2d <unit>._local_shard" slice right before each all-gather is
 *   issued, and a "d2h <unit>.grad_shard" slice where each reduce-scatter is waited for (category "copy"); the
 *   adamw spans run on host buffers. The memory counter (the device pool) lacks param_shard, optim_state and most of
 *   grad_shard there. memory.html and summary.txt list the host pool separately; memory_snapshot.pickle stays the
 *   device allocator's state, as torch's is the CUDA allocator's.
 *
 * The check (`make check-09`): with offload the device pool's peak per category equals the memory model's (the
 * unsharded units in flight, their gradients, one gradient shard, activations; no shard, no optimizer state) and
 * the host pool's too; losses and parameters bit-identical with and without offload; one h2d copy per all-gather
 * and one d2h copy per reduce-scatter, each of the unit's shard size; deferred initialisation's peak is the shards
 * exactly (no workspace), the naive one's the shards plus the whole model, and both give bit-identical shards, for
 * tiny and qwen2-0.5b.
 */
#define _POSIX_C_SOURCE 200809L /* strtok_r */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/runtime/env.h"
#include "core/runtime/context.h"
#include "core/fsdp/flat_param.h"
#include "core/fsdp/fsdp.h"
#include "core/memory/mem.h"
#include "core/models/memory_model.h"
#include "core/fsdp/module.h"
#include "core/runtime/offload.h"
#include "core/models/qwen2.h"
#include "core/runtime/world.h"
#include "core/runtime/session.h"
#include "trainer.h"

enum { MAX_STEPS = 32, MAX_INIT_MODELS = 4 };

typedef struct settings {
    int micro_batch, accumulation, steps, seq_len;
    uint64_t seed;
    const char *init_models;
} settings;

typedef struct pool_peaks {
    size_t category[MEM_CATEGORY_COUNT], total, reserved;
} pool_peaks;

typedef struct run_result {
    double losses[MAX_STEPS];
    uint64_t checksum;
    pool_peaks device, host;
    memory_prediction predicted;
    uint64_t copies[2], copy_bytes[2]; /* during the steps, per direction */
    double copy_us[2];
} run_result;

typedef struct init_result {
    size_t peak, shard_bytes, model_bytes, workspace_peak;
    double seconds;
    uint64_t checksum;
} init_result;

static settings read_settings(context *ctx);
static run_result run_training(context *ctx, const settings *s, int offload);
static void print_memory_tables(context *ctx, const run_result *r, int offload);
static int print_same_arithmetic(context *ctx, const settings *s, const run_result *plain,
                                 const run_result *offloaded);
static void print_offload_lesson(context *ctx, const settings *s, const run_result *plain,
                                 const run_result *offloaded);
static int run_init_lessons(context *ctx, const settings *s);

int main(int argc, char **argv) {
    context ctx;
    session_open(&ctx, &argc, &argv, "09_offload_and_init", "runs/09_offload_and_init");
    session_require_cpu(&ctx, "the parameters it builds to compare the ways to initialise them");
    settings s = read_settings(&ctx);
    if (ctx.rank == 0) {
        printf("Ranks = %d, lab 09: the same %d steps (ACC %d) without and with CPU offload; the memory model per pool "
               "and rank first\n", ctx.world_size, s.steps, s.accumulation);
        fflush(stdout);
    }
    /* 1. CPU offload: the same steps without and with it, from the same parameters and batches. */
    run_result plain = run_training(&ctx, &s, 0);
    print_memory_tables(&ctx, &plain, 0);
    run_result offloaded = run_training(&ctx, &s, 1);
    print_memory_tables(&ctx, &offloaded, 1);
    int same = print_same_arithmetic(&ctx, &s, &plain, &offloaded);
    print_offload_lesson(&ctx, &s, &plain, &offloaded); /* what lives where, what moves, what it costs */
    int status = world_all_true(&ctx, same) ? 0 : 1;
    if (ctx.rank == 0)
        printf("losses and parameters with and without offload: %s\n",
               status == 0 ? "the same, bit for bit" : "DIFFERENT (a copy lost or changed bytes)");

    /* 2. Deferred initialisation: each model built both ways, its peak and its shards compared. */
    if (run_init_lessons(&ctx, &s) != 0) status = 1;
    int finished = session_close(&ctx);
    return status != 0 ? status : finished;
}

/* MBS, ACC, STEPS, SEQ, SEED, and INIT_MODELS (the presets of the initialisation lesson). */
static settings read_settings(context *ctx) {
    settings s = {
        .micro_batch = (int)env_int(ctx, "MBS", 4, 1, 4096),
        .accumulation = (int)env_int(ctx, "ACC", 2, 1, 4096),
        .steps = (int)env_int(ctx, "STEPS", 3, 1, MAX_STEPS),
        .seq_len = (int)env_int(ctx, "SEQ", 128, 2, 32768),
        .seed = env_seed(ctx),
        .init_models = env_text(ctx, "INIT_MODELS"),
    };
    if (s.init_models == NULL || s.init_models[0] == '\0') s.init_models = "tiny,qwen2-0.5b";
    /* Refused now, not after the training part: every name a preset, at most MAX_INIT_MODELS of them. */
    char copy[256], error[512];
    snprintf(copy, sizeof copy, "%s", s.init_models);
    int count = 0;
    qwen2_config config;
    for (char *save = NULL, *name = strtok_r(copy, ",", &save); name && strcmp(s.init_models, "none") != 0;
         name = strtok_r(NULL, ",", &save)) {
        if (qwen2_config_preset(&config, name, error, sizeof error) != 0)
            world_exit_all(ctx, 2, "INIT_MODELS='%s': %s", s.init_models, error);
        if (++count > MAX_INIT_MODELS)
            world_exit_all(ctx, 2, "INIT_MODELS='%s': at most %d models", s.init_models, MAX_INIT_MODELS);
    }
    return s;
}

static pool_peaks peaks_of(const mem_tracker *pool) {
    pool_peaks peaks = {.total = pool->peak_bytes, .reserved = pool->peak_reserved_bytes};
    memcpy(peaks.category, pool->category_peak_bytes, sizeof peaks.category);
    return peaks;
}

/* One run: a fresh model from SEED, the same batches, STEPS AdamW steps of ACC micro-batches, torch's default FSDP
 * options (comm streams, BACKWARD_PRE), with or without offload. */
static run_result run_training(context *ctx, const settings *s, int offload) {
    run_result result = {0};
    fsdp_options options = fsdp_default_options();
    options.accumulation_steps = s->accumulation;
    options.offload_params = offload;
    trainer t;
    trainer_open_mode(&t, ctx, &options, s->micro_batch, s->seq_len, s->seed, s->steps);

    /* The window the check reads: after the runtime moved the shards to the host (a one-time d2h per unit), before
     * the first step. */
    trainer_begin_window(ctx, offload ? "lab 09 offload=1" : "lab 09 offload=0");
    uint64_t copies_before[2] = {ctx->copies[0], ctx->copies[1]};
    uint64_t bytes_before[2] = {ctx->copy_bytes[0], ctx->copy_bytes[1]};
    double us_before[2] = {ctx->copy_us[0], ctx->copy_us[1]};
    if (offload) mem_reset_peak(offload_host_pool(ctx));
    for (int step = 1; step <= s->steps; step++) {
        double start = MPI_Wtime(), loss_sum = 0.0;
        for (int micro = 0; micro < s->accumulation; micro++) loss_sum += trainer_forward_backward(&t, micro);
        trainer_optimizer_step(&t);
        result.losses[step - 1] = loss_sum / s->accumulation;
        trace_step(&ctx->trace, step, -1, result.losses[step - 1], ctx->mem.peak_bytes, ctx->mem.peak_reserved_bytes,
                   MPI_Wtime() - start);
    }
    trace_mark(&ctx->trace, "lab 09 run end");
    for (int direction = 0; direction < 2; direction++) {
        result.copies[direction] = ctx->copies[direction] - copies_before[direction];
        result.copy_bytes[direction] = ctx->copy_bytes[direction] - bytes_before[direction];
        result.copy_us[direction] = ctx->copy_us[direction] - us_before[direction];
    }
    result.device = peaks_of(&ctx->mem);
    if (offload) result.host = peaks_of(&ctx->host_mem);
    result.checksum = trainer_shards_checksum(t.model.units, t.model.unit_count);
    trainer_predict_memory(&t, &result.predicted);
    trainer_close(&t);
    trainer_empty_caches(ctx); /* the second run starts from an empty cache */
    return result;
}

/* The memory model's tables for a run, per rank: the device pool, and with offload the host pool. */
static void print_memory_tables(context *ctx, const run_result *r, int offload) {
    char report[4096], block[9000];
    memory_model_report(&r->predicted, r->device.category, r->device.total, r->device.reserved, report, sizeof report);
    int used = snprintf(block, sizeof block, "rank %d, offload=%d, device pool: %s", ctx->rank, offload, report);
    if (offload) {
        memory_prediction host = memory_model_host_part(&r->predicted);
        memory_model_report(&host, r->host.category, r->host.total, r->host.reserved, report, sizeof report);
        snprintf(block + used, sizeof block - (size_t)used, "rank %d, offload=%d, host pool: %s", ctx->rank, offload,
                 report);
    }
    world_print_ordered(ctx, block);
}

/* Offload moves bytes, never changes them: losses and parameter bits per rank (check-09 compares the lines).
 * Returns whether this rank's are the same with and without offload. */
static int print_same_arithmetic(context *ctx, const settings *s, const run_result *plain,
                                 const run_result *offloaded) {
    char lines[4096];
    int used = 0, same = plain->checksum == offloaded->checksum;
    for (int run = 0; run < 2; run++) {
        const run_result *r = run ? offloaded : plain;
        used += snprintf(lines + used, sizeof lines - (size_t)used, "rank %d offload %d parameters %016llx losses",
                         ctx->rank, run, (unsigned long long)r->checksum);
        for (int step = 0; step < s->steps; step++) {
            used += snprintf(lines + used, sizeof lines - (size_t)used, " %.9g", r->losses[step]);
            same = same && plain->losses[step] == offloaded->losses[step];
        }
        used += snprintf(lines + used, sizeof lines - (size_t)used, " copies h2d %llu %llu d2h %llu %llu\n",
                         (unsigned long long)r->copies[0], (unsigned long long)r->copy_bytes[0],
                         (unsigned long long)r->copies[1], (unsigned long long)r->copy_bytes[1]);
    }
    world_print_ordered(ctx, lines);
    return same;
}

/* The lesson's tables, rank 0's figures: what lives where, what moves, what it costs. */
static void print_offload_lesson(context *ctx, const settings *s, const run_result *plain,
                                 const run_result *offloaded) {
    if (ctx->rank != 0) return;
    char a[32], b[32], c[32];
    printf("\nwhat lives where (rank 0, each category at its peak during the steps):\n");
    printf("  %-17s %16s   %16s %16s\n", "category", "without: device", "offload: device", "offload: host");
    for (int category = 0; category < MEM_CATEGORY_COUNT; category++) {
        if (plain->device.category[category] == 0 && offloaded->device.category[category] == 0 &&
            offloaded->host.category[category] == 0)
            continue;
        printf("  %-17s %16s   %16s %16s\n", mem_category_name((mem_category)category),
               mem_format_bytes(plain->device.category[category], a, sizeof a),
               mem_format_bytes(offloaded->device.category[category], b, sizeof b),
               mem_format_bytes(offloaded->host.category[category], c, sizeof c));
    }
    printf("  %-17s %16s   %16s %16s\n", "peak (allocated)", mem_format_bytes(plain->device.total, a, sizeof a),
           mem_format_bytes(offloaded->device.total, b, sizeof b),
           mem_format_bytes(offloaded->host.total, c, sizeof c));
    printf("  %-17s %16s   %16s %16s\n", "peak (reserved)", mem_format_bytes(plain->device.reserved, a, sizeof a),
           mem_format_bytes(offloaded->device.reserved, b, sizeof b),
           mem_format_bytes(offloaded->host.reserved, c, sizeof c));
    printf("\nwhat moves, per optimizer step (%d micro-batches; rank 0):\n", s->accumulation);
    const char *what[2] = {"h2d: a shard before its all-gather", "d2h: a gradient shard after its reduce-scatter"};
    for (int direction = 0; direction < 2; direction++)
        printf("  %-48s %6.1f copies %12s %9.3f ms\n", what[direction],
               (double)offloaded->copies[direction] / s->steps,
               mem_format_bytes(offloaded->copy_bytes[direction] / (uint64_t)s->steps, a, sizeof a),
               offloaded->copy_us[direction] / s->steps / 1e3);
    printf("  (a memcpy between two host pools here; on a GPU they cross PCIe at ~25 GB/s, on their own stream)\n");
    printf("\ndevice pool peak: %s without offload, %s with it (%.0f%%); the host holds %s\n",
           mem_format_bytes(plain->device.total, a, sizeof a), mem_format_bytes(offloaded->device.total, b, sizeof b),
           100.0 * (double)offloaded->device.total / (double)plain->device.total,
           mem_format_bytes(offloaded->host.total, c, sizeof c));
    fflush(stdout);
}

/* ---- deferred initialisation ---- */

/* Builds one model's FlatParameters (one per decoder layer, the root) on this rank and measures the device pool's peak
 * during it. deferred: each rank draws its own shard (flat_param_fill_local_shard, inside module_units_build).
 * naive: torch without the meta device: every unit's whole padded flat buffer is materialised first (the whole model
 * on every rank), then each is sharded (flat_param_shard_from_full) and freed. */
static init_result build_units(context *ctx, const qwen2_config *config, uint64_t seed, int naive) {
    init_result result = {0};
    module_tree tree;
    if (qwen2_module_tree(config, &tree) != 0) world_fatal(ctx, "out of memory building the module tree");
    int *unit_of_param = calloc((size_t)tree.param_count, sizeof *unit_of_param);
    if (unit_of_param == NULL) world_fatal(ctx, "out of memory");
    int unit_count = fsdp_auto_wrap(&tree, fsdp_wrap_by_type, (void *)QWEN2_DECODER_LAYER, unit_of_param);
    qwen2_init_spec init = {.seed = seed, .std = (float)config->initializer_range};
    WORLD_MPI(ctx, MPI_Barrier(ctx->comm));
    size_t live_before = ctx->mem.live_bytes;
    mem_reset_peak(&ctx->mem);
    double start = MPI_Wtime();
    flat_param *units = NULL;
    module_location *locations = NULL;
    if (module_units_build(ctx, &tree, unit_of_param, unit_count, 0, "model.", naive ? NULL : qwen2_init_fill, &init,
                           &units, &locations) != 0)
        world_exit_all(ctx, 2, "%s", ctx->error);
    if (naive) {
        float **full = calloc((size_t)unit_count, sizeof *full);
        if (full == NULL) world_fatal(ctx, "out of memory");
        char owner[MEM_OWNER_MAX];
        for (int unit = 0; unit < unit_count; unit++) { /* the whole model, on this rank */
            snprintf(owner, sizeof owner, "%s.unsharded_init", units[unit].unit);
            size_t numel = units[unit].padded_unsharded_numel;
            full[unit] = mem_alloc_uninitialized(&ctx->mem, numel * sizeof(float), MEM_PARAM_UNSHARDED, owner);
            flat_param_fill_flat_range(&units[unit], qwen2_init_fill, &init, 0, numel, full[unit]);
            result.model_bytes += numel * sizeof(float);
        }
        for (int unit = 0; unit < unit_count; unit++) { /* then sharded, unit by unit */
            flat_param_shard_from_full(&units[unit], full[unit]);
            mem_free(&ctx->mem, full[unit]);
        }
        free(full);
    }
    result.seconds = MPI_Wtime() - start;
    result.peak = ctx->mem.peak_bytes - live_before;
    result.workspace_peak = ctx->mem.category_peak_bytes[MEM_WORKSPACE];
    for (int unit = 0; unit < unit_count; unit++) result.shard_bytes += units[unit].sharded_numel * sizeof(float);
    result.checksum = trainer_shards_checksum(units, unit_count);
    module_units_free(units, unit_count, locations);
    mem_empty_cache(&ctx->mem); /* the next build starts from an empty cache */
    free(unit_of_param);
    module_tree_free(&tree);
    return result;
}

/* Both inits of one preset; 0 when the shards are the same bits and the deferred peak is the shards alone. */
static int init_lesson(context *ctx, const char *preset, uint64_t seed) {
    qwen2_config config;
    if (qwen2_config_preset(&config, preset, ctx->error, sizeof ctx->error) != 0) /* read_settings checked it */
        world_fatal(ctx, "INIT_MODELS: %s", ctx->error);
    init_result deferred = build_units(ctx, &config, seed, 0);
    init_result naive = build_units(ctx, &config, seed, 1);
    /* Deferred init writes each value straight into the shard (flat_param_fill_flat_range into local_shard): no
     * workspace, so its peak is the shards, to the byte. The naive peak: the shards (allocated first, zeroed) plus
     * every unit's whole padded buffer, alive together before the first is sharded. */
    size_t deferred_bound = deferred.shard_bytes + 0;
    int same_bits = deferred.checksum == naive.checksum;
    int deferred_ok = deferred.peak <= deferred_bound && deferred.peak == deferred.shard_bytes;
    int naive_ok = naive.peak == naive.shard_bytes + naive.model_bytes;
    char line[1024], a[32], b[32];
    snprintf(line, sizeof line,
             "init %s rank %d: deferred peak %zu B (shards %zu B, workspace %zu B) %.3f s checksum %016llx; naive peak "
             "%zu B (shards + whole model %zu B) %.3f s checksum %016llx; %s, %s, %s\n",
             preset, ctx->rank, deferred.peak, deferred.shard_bytes, deferred.workspace_peak, deferred.seconds,
             (unsigned long long)deferred.checksum, naive.peak, naive.model_bytes, naive.seconds,
             (unsigned long long)naive.checksum, same_bits ? "same shards" : "SHARDS DIFFER",
             deferred_ok ? "deferred peak = shards" : "DEFERRED PEAK IS NOT THE SHARDS",
             naive_ok ? "naive peak = shards + model" : "NAIVE PEAK UNEXPECTED");
    world_print_ordered(ctx, line);
    if (ctx->rank == 0) {
        printf("  %s: deferred init peaks at %s per rank (its shard), the naive one at %s (%.1fx): the whole model on "
               "every rank; deferred %.2f s, naive %.2f s\n", preset, mem_format_bytes(deferred.peak, a, sizeof a),
               mem_format_bytes(naive.peak, b, sizeof b), (double)naive.peak / (double)deferred.peak, deferred.seconds,
               naive.seconds);
        fflush(stdout);
    }
    return world_all_true(ctx, same_bits && deferred_ok && naive_ok) ? 0 : -1;
}

/* Both inits of every preset in INIT_MODELS ("none": the lesson is skipped); 0 when every one held. */
static int run_init_lessons(context *ctx, const settings *s) {
    if (strcmp(s->init_models, "none") == 0) return 0;
    if (ctx->rank == 0) printf("\ninitialisation: deferred (each rank draws its shard) vs naive (every rank builds "
                               "the whole model, then shards it):\n");
    int status = 0;
    char copy[256];
    snprintf(copy, sizeof copy, "%s", s->init_models);
    for (char *save = NULL, *name = strtok_r(copy, ",", &save); name; name = strtok_r(NULL, ",", &save))
        if (init_lesson(ctx, name, s->seed) != 0) status = 1;
    return status;
}
