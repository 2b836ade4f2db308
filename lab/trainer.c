/* trainer.c — the labs' training machinery (lab/trainer.h says what each function is for). */
#include "trainer.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "core/io/pretrained.h"
#include "core/runtime/env.h"
#include "core/runtime/context.h"
#include "core/data/data.h"
#include "core/io/dcp.h"
#include "core/base/dtype.h"
#include "core/fsdp/flat_param.h"
#include "core/fsdp/fsdp.h"
#include "core/comm/group.h"
#include "core/memory/mem.h"
#include "core/models/memory_model.h"
#include "core/runtime/offload.h"
#include "core/fsdp/optim.h"
#include "core/models/qwen2.h"
#include "core/data/tokenizer.h"
#include "core/runtime/world.h"
#include "core/base/hash.h"

static fsdp_strategy strategy_of(const trainer_settings *s) {
    return (fsdp_strategy)fsdp_strategy_from_name(s->strategy);
}

static int is_set(const char *text) { return text != NULL && text[0] != '\0'; }

/* ---- Settings ---- */

/* SAVE, GRADS and CHECKPOINT_DIR are written during or after training: a directory that cannot be made or written
 * is refused now, before the model is built. */
static void check_save_directories(context *ctx, const trainer_settings *s) {
    const char *names[] = {"SAVE", "GRADS", "CHECKPOINT_DIR"};
    const char *values[] = {s->save, s->grads, s->checkpoint_every > 0 ? s->checkpoint_dir : NULL};
    for (int i = 0; i < 3; i++)
        if (values[i] != NULL && values[i][0] != '\0' && pretrained_check_writable(ctx, values[i]) != 0)
            world_exit_all(ctx, 2, "%s='%s': %s", names[i], values[i], ctx->error);
}

/* FSDP_VERSION=2 (fully_shard) runs FULL_SHARD and SHARD_GRAD_OP (torch's reshard_after_forward True and False),
 * with MP (MixedPrecisionPolicy) and OFFLOAD (CPUOffloadPolicy) as FSDP1; the other strategies are refused here,
 * naming the setting and its value. */
static void check_fsdp2(context *ctx, trainer_settings *s) {
    /* RESHARD_AFTER_FORWARD=N: torch's reshard_after_forward as an int (fully_shard's rule: a factor of the shard
     * world W; 1 is False, W is True; 1 < N < W reshards onto groups of N ranks, flat_param.h). */
    int n = s->reshard_after_forward, world = ctx->world_size;
    if (n != 0 && s->fsdp_version != 2)
        world_exit_all(ctx, 2, "rank %d: RESHARD_AFTER_FORWARD=%d (W=%d) is FSDP2's reshard_after_forward: set "
                       "FSDP_VERSION=2 (FSDP1's FlatParameter reshards fully or not at all)", ctx->rank, n, world);
    if (n != 0 && world % n != 0)
        world_exit_all(ctx, 2, "rank %d: RESHARD_AFTER_FORWARD=%d does not divide the world size W=%d: fully_shard "
                       "takes a factor of W", ctx->rank, n, world);
    if (n != 0 && strategy_of(s) != FSDP_FULL_SHARD)
        world_exit_all(ctx, 2, "rank %d: RESHARD_AFTER_FORWARD=%d (W=%d) with STRATEGY='%s': the int replaces "
                       "FULL_SHARD's True; use STRATEGY=FULL_SHARD", ctx->rank, n, world, s->strategy);
    if (n == 1) { /* torch warns and takes False */
        if (ctx->rank == 0)
            printf("RESHARD_AFTER_FORWARD=1 means resharding to world size 1: reshard_after_forward=False "
                   "(STRATEGY=SHARD_GRAD_OP)\n");
        s->strategy = "SHARD_GRAD_OP";
    }
    if (n == 1 || n == world) s->reshard_after_forward = 0; /* W: True, FULL_SHARD as it is */
    if (s->fsdp_version != 2) return;
    fsdp_strategy strategy = strategy_of(s);
    if (strategy != FSDP_FULL_SHARD && strategy != FSDP_SHARD_GRAD_OP)
        world_exit_all(ctx, 2, "FSDP_VERSION=2 with STRATEGY='%s' is not supported: fully_shard takes FULL_SHARD "
                       "(reshard_after_forward=True) or SHARD_GRAD_OP (reshard_after_forward=False)", s->strategy);
}

trainer_settings trainer_read_settings(context *ctx) {
    static const char *const strategies[] = {"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD",
                                             "_HYBRID_SHARD_ZERO2", NULL};
    trainer_settings s = {
        .strategy = env_choice(ctx, "STRATEGY", "FULL_SHARD", strategies),
        .micro_batch = (int)env_int(ctx, "MBS", 4, 1, 4096),
        .accumulation = (int)env_int(ctx, "ACC", 2, 1, 4096),
        .steps = (int)env_int(ctx, "STEPS", 3, 1, 1000000),
        .seq_len = (int)env_int(ctx, "SEQ", 128, 2, 32768),
        .eval_every = (int)env_int(ctx, "EVAL", 0, 0, 1000000),
        .checkpointing = (int)env_int(ctx, "CKPT", 0, 0, 1),
        .no_sync = (int)env_int(ctx, "NO_SYNC", 0, 0, 1),
        .offload = (int)env_int(ctx, "OFFLOAD", 0, 0, 1),
        .lr = env_real(ctx, "LR", 1e-3, 0.0, 10.0),
        .clip = env_real(ctx, "CLIP", 0.0, 0.0, 1e9),
        .seed = env_seed(ctx),
        .data = env_text(ctx, "DATA"),
        .save = env_text(ctx, "SAVE"),
        .grads = env_text(ctx, "GRADS"),
        .wrap = env_text(ctx, "WRAP"),
        .peak = env_choice(ctx, "PEAK", "tracked", (const char *const[]){"tracked", "rss", NULL}),
        .checkpoint_every = (int)env_int(ctx, "CHECKPOINT_EVERY", 0, 0, 1000000),
        .checkpoint_keep = (int)env_int(ctx, "CHECKPOINT_KEEP", 2, 1, 1000000),
        .checkpoint_dir = env_text(ctx, "CHECKPOINT_DIR"),
        .resume = env_text(ctx, "RESUME"),
        .kill_at_step = (int)env_int(ctx, "KILL_AT_STEP", 0, 0, 1000000),
        .kill_rank = (int)env_int(ctx, "KILL_RANK", 0, 0, ctx->world_size - 1),
        .fsdp_version = env_choice(ctx, "FSDP_VERSION", "1", (const char *const[]){"1", "2", NULL})[0] - '0',
        .reshard_after_forward = (int)env_int(ctx, "RESHARD_AFTER_FORWARD", 0, 0, 1 << 20),
    };
    /* HYBRID_SHARD's shard group size (lab 08); unset: the ranks per node. Read whatever the strategy (settings are
     * collective), resolved and checked only for a hybrid one. */
    s.shard_group = group_shard_size_from_env(ctx, 0, fsdp_strategy_is_hybrid(strategy_of(&s)));
    static char default_dir[600];
    if (!is_set(s.checkpoint_dir)) {
        snprintf(default_dir, sizeof default_dir, "%s/checkpoints", ctx->outdir);
        s.checkpoint_dir = default_dir;
    }
    check_save_directories(ctx, &s);
    check_fsdp2(ctx, &s);
    return s;
}

/* ---- Building a run ---- */

/* The FSDP options the settings ask for (and lab 06's prefetch settings, off by default). Collective. */
static fsdp_options options_from_settings(context *ctx, const trainer_settings *s) {
    fsdp_options options = {.strategy = strategy_of(s), .activation_checkpointing = s->checkpointing,
                            .no_sync = s->no_sync, .accumulation_steps = s->accumulation,
                            .offload_params = s->offload};
    fsdp_prefetch_options_from_env(ctx, &options);
    fsdp_mixed_precision_from_env(ctx, &options);
    options.reshard_after_forward = s->reshard_after_forward;
    /* LOSS_CHUNK: the loss this many rows at a time (core/models/qwen2.h); on a GPU 1024 by default, so the B x T x
     * V logits of a 151,936-word vocabulary never exist at once; on the CPU 0, all at once. */
    options.loss_chunk = (int)env_int(ctx, "LOSS_CHUNK", ctx->device.kind == DEVICE_CPU ? 0 : 1024, 0, 1 << 30);
    return options;
}

/* WRAP: "layers" (transformer_auto_wrap_policy, the default: one unit per decoder layer) or "size:<min params>"
 * (size_based_auto_wrap_policy). *min_params holds the size policy's argument, so it must outlive the wrap. */
static void wrap_policy(context *ctx, const char *text, fsdp_wrap_fn *wrap, void **wrap_user, size_t *min_params) {
    *wrap = fsdp_wrap_by_type, *wrap_user = (void *)QWEN2_DECODER_LAYER;
    if (!is_set(text) || strcmp(text, "layers") == 0) return;
    char *end = NULL;
    errno = 0; /* digits only: strtoull would take "-5" as 2^64 - 5, and saturate past 2^64 */
    if (strncmp(text, "size:", 5) != 0 || !isdigit((unsigned char)text[5]) ||
        (*min_params = strtoull(text + 5, &end, 10)) == 0 || errno != 0 || *end != '\0')
        world_exit_all(ctx, 2, "WRAP='%s' is not a wrap policy; choose layers or size:<min params>, e.g. size:100000",
                     text);
    *wrap = fsdp_wrap_by_size, *wrap_user = min_params;
}

/* What DATA's token stream will take in memory, for the memory model: a .bin at most one id per 2 bytes, text at most
 * one per byte; each id 2 or 4 bytes in memory by the vocabulary. 0 for the generated stories (a few MB). */
static size_t data_bytes_bound(const char *data, int vocab_size) {
    struct stat info;
    if (!is_set(data) || stat(data, &info) != 0 || !S_ISREG(info.st_mode)) return 0;
    size_t length = strlen(data);
    int bin = length > 4 && strcmp(data + length - 4, ".bin") == 0;
    size_t width = (size_t)data_token_width(vocab_size); /* the in-memory id: 2 or 4 bytes */
    return bin ? width * ((size_t)info.st_size / 2) : width * (size_t)info.st_size;
}

/* What both openings share: before anything is allocated, the analytic memory model's peak for these options, from
 * the config and the wrap alone, against the memory this rank may use (MEMORY_CHECK=0 skips it); then the model
 * from SEED, its runtime and AdamW's states, in that order. t->options and t->settings are set. */
static void build_model(trainer *t, const qwen2_config *config, fsdp_wrap_fn wrap, void *wrap_user,
                        size_t data_bytes) {
    context *ctx = t->ctx;
    const trainer_settings *s = &t->settings;
    memory_prediction prediction;
    if (memory_model_predict_config(&prediction, ctx, config, wrap, wrap_user, &t->options, s->micro_batch,
                                    s->seq_len, data_bytes, s->steps * s->accumulation) != 0)
        world_exit_all(ctx, 2, "%s", ctx->error);
    memory_model_require_fit(ctx, &prediction);
    qwen2_init_spec init = {.seed = s->seed, .std = (float)config->initializer_range};
    if (qwen2_model_init_wrapped(&t->model, ctx, config, wrap, wrap_user, t->options.strategy, &init) != 0)
        world_exit_all(ctx, 2, "%s", ctx->error);
    t->model.loss_chunk = t->options.loss_chunk;
    qwen2_as_module(&t->model, &t->view);
    if (fsdp_runtime_init(&t->runtime, ctx, &t->view, &t->options) != 0) world_exit_all(ctx, 2, "%s", ctx->error);
    t->optimizer = adamw_default_config();
    t->optimizer.lr = s->lr;
    t->states = calloc((size_t)t->model.unit_count, sizeof *t->states);
    if (t->states == NULL) world_fatal(ctx, "out of memory");
    for (int unit = 0; unit < t->model.unit_count; unit++) adamw_init(&t->states[unit]);
}

/* The batch buffers, where the host writes each micro-batch's ids (the data pool: host memory). */
static void allocate_batch(trainer *t) {
    size_t batch = (size_t)t->settings.micro_batch * (size_t)t->settings.seq_len;
    t->tokens = mem_alloc(offload_data_pool(t->ctx), batch * sizeof(int), MEM_DATA, "batch.tokens_host");
    t->targets = mem_alloc(offload_data_pool(t->ctx), batch * sizeof(int), MEM_DATA, "batch.targets_host");
}

/* Rank 0: what was built, the first lines of lab 05's log (scripts/train.sh and the checks read them). */
static void print_setup(const trainer *t) {
    const context *ctx = t->ctx;
    const trainer_settings *s = &t->settings;
    if (ctx->rank != 0) return;
    printf("Ranks = %d, FSDP = fsdplab, Acc = %d\n", ctx->world_size, s->accumulation);
    if (s->fsdp_version == 2)
        printf("(FSDP2: fully_shard, every parameter sharded on dim 0, reshard_after_forward=%s)\n",
               strategy_of(s) == FSDP_FULL_SHARD ? "True" : "False");
    const flat_param_mixed_precision *mp = &t->options.mixed_precision;
    if (flat_param_mixed_precision_enabled(mp))
        printf("(mixed precision: param_dtype %s, reduce_dtype %s; float32 master shards and AdamW)\n",
               dtype_name(mp->param_dtype), dtype_name(mp->reduce_dtype));
    char mesh_text[64] = "";
    if (ctx->mesh) snprintf(mesh_text, sizeof mesh_text, " (%d replicate x %d shard ranks)", t->mesh.replicate_size,
                            t->mesh.shard_size);
    printf("(model %s, %d units, %s%s%s%s, micro-batch %d x %d tokens per rank, data: %s)\n", t->model.config.name,
           t->model.unit_count, s->strategy, mesh_text, s->checkpointing ? ", activation checkpointing" : "",
           s->no_sync ? ", no_sync" : "", s->micro_batch, s->seq_len, t->loader.source);
    if (t->model.config.vocab_size > DATA_EOT + 1)
        printf("(%s: %zu tokens)\n", t->tokenizer_note, t->loader.token_count);
    fflush(stdout);
}

void trainer_open(trainer *t, context *ctx, const trainer_settings *settings) {
    memset(t, 0, sizeof *t);
    t->ctx = ctx, t->settings = *settings, t->first_step = 1;
    const trainer_settings *s = &t->settings;
    /* HYBRID_SHARD: shard groups of SHARD_GROUP ranks x replicate groups (lab 08), before the model */
    if (fsdp_strategy_is_hybrid(strategy_of(s))) {
        if (group_mesh_init(&t->mesh, ctx, s->shard_group) != 0) world_exit_all(ctx, 2, "SHARD_GROUP: %s", ctx->error);
        ctx->mesh = &t->mesh, t->owns_mesh = 1;
    }
    qwen2_config config;
    qwen2_config_from_env(ctx, &config, s->seq_len);
    fsdp_wrap_fn wrap;
    void *wrap_user;
    size_t min_params = 0; /* the size policy's argument, read while the model is built */
    wrap_policy(ctx, s->wrap, &wrap, &wrap_user, &min_params);
    t->options = options_from_settings(ctx, s);
    t->options.fsdp_version = s->fsdp_version;
    char mp_label[64];
    if (s->fsdp_version == 2 && t->options.mixed_precision.keep_low_precision_grads)
        world_exit_all(ctx, 2, "FSDP_VERSION=2 with MP='%s' is not supported: fully_shard's MixedPrecisionPolicy has "
                       "param_dtype and reduce_dtype, no keep_low_precision_grads",
                       fsdp_mixed_precision_label(&t->options.mixed_precision, mp_label, sizeof mp_label));
    int layer_units = !is_set(s->wrap) || strcmp(s->wrap, "layers") == 0;
    if (t->options.mixed_precision.output_dtype != DTYPE_FLOAT32 && (s->fsdp_version != 2 || !layer_units))
        world_exit_all(ctx, 2, "MP='%s' with FSDP_VERSION=%d%s%s: output_dtype is FSDP2's MixedPrecisionPolicy's "
                       "(FSDP_VERSION=2), cast at each decoder layer's output (WRAP=layers)",
                       fsdp_mixed_precision_label(&t->options.mixed_precision, mp_label, sizeof mp_label),
                       s->fsdp_version, layer_units ? "" : " WRAP=", layer_units ? "" : s->wrap);
    ctx->per_parameter_sharding = s->fsdp_version == 2; /* the units below: FSDP2's rows or FSDP1's chunks */
    build_model(t, &config, wrap, wrap_user, data_bytes_bound(s->data, config.vocab_size));
    /* GRADS with mixed precision also writes local_grad_l1.json (save_local_grad_l1): its sums only when asked */
    if (is_set(s->grads) && flat_param_mixed_precision_enabled(&t->options.mixed_precision))
        for (int unit = 0; unit < t->model.unit_count; unit++) flat_param_track_grad_l1(&t->model.units[unit]);
    t->tokenizer = data_tokenizer_from_env(ctx, t->model.config.vocab_size, t->tokenizer_note,
                                           sizeof t->tokenizer_note);
    if (data_loader_open_tokenized(&t->loader, ctx, s->data, t->tokenizer, t->model.config.vocab_size,
                                   s->micro_batch, s->seq_len, s->seed, 1) != 0)
        world_exit_all(ctx, 2, "DATA: %s", ctx->error);
    allocate_batch(t);
    print_setup(t);
}

void trainer_open_mode(trainer *t, context *ctx, const fsdp_options *options, int micro_batch, int seq_len,
                       uint64_t seed, int steps) {
    memset(t, 0, sizeof *t);
    t->ctx = ctx, t->options = *options, t->first_step = 1;
    t->settings = (trainer_settings){.micro_batch = micro_batch, .accumulation = options->accumulation_steps,
                                     .steps = steps, .seq_len = seq_len, .seed = seed,
                                     .lr = adamw_default_config().lr};
    qwen2_config config;
    qwen2_config_from_env(ctx, &config, seq_len);
    build_model(t, &config, fsdp_wrap_by_type, (void *)QWEN2_DECODER_LAYER, 0);
    if (data_loader_open(&t->loader, ctx, NULL, config.vocab_size, micro_batch, seq_len, seed, 1) != 0)
        world_exit_all(ctx, 2, "%s", ctx->error);
    allocate_batch(t);
}

/* ---- Sharded checkpoints (core/io/dcp.h): CHECKPOINT_EVERY, RESUME ---- */

/* What a checkpoint records of the settings, so a resume can say what it changed. */
static void record_settings(const trainer *t, dcp_progress *p) {
    const trainer_settings *s = &t->settings;
    snprintf(p->strategy, sizeof p->strategy, "%s", s->strategy);
    dcp_progress_set(p, "MODEL", "%s", t->model.config.name);
    dcp_progress_set(p, "MBS", "%d", s->micro_batch);
    dcp_progress_set(p, "ACC", "%d", s->accumulation);
    dcp_progress_set(p, "SEQ", "%d", s->seq_len);
    dcp_progress_set(p, "LR", "%.17g", s->lr);
    dcp_progress_set(p, "CLIP", "%.17g", s->clip);
    dcp_progress_set(p, "SEED", "%llu", (unsigned long long)s->seed);
    dcp_progress_set(p, "DATA", "%s", t->loader.source); /* names the tokenizer too */
    dcp_progress_set(p, "NO_SYNC", "%d", s->no_sync);
    dcp_progress_set(p, "FSDP_VERSION", "%d", s->fsdp_version); /* may change: the ranges are the same elements */
    if (fsdp_strategy_is_hybrid(strategy_of(s))) /* the mesh: may change */
        dcp_progress_set(p, "SHARD_GROUP", "%d", s->shard_group);
}

/* The checkpoint's config.json, beside the shards: what a resume checks the model against. */
static int write_config(const char *directory, void *user, char *error, size_t error_size) {
    char path[1200];
    snprintf(path, sizeof path, "%s/config.json", directory);
    return qwen2_config_save_json(&((const qwen2_model *)user)->config, path, error, error_size);
}

static void save_checkpoint(trainer *t, int step) {
    context *ctx = t->ctx;
    const trainer_settings *s = &t->settings;
    double start = MPI_Wtime();
    dcp_progress progress = {.step = step,
                             .data_windows = t->loader.next_global_micro * (uint64_t)ctx->world_size * s->micro_batch};
    record_settings(t, &progress);
    char directory[1200];
    uint64_t bytes = 0;
    if (dcp_save(ctx, s->checkpoint_dir, t->model.units, t->states, t->model.unit_count, &progress,
                 s->checkpoint_keep, write_config, &t->model, directory, sizeof directory, &bytes) != 0)
        world_exit_all(ctx, 2, "CHECKPOINT_DIR='%s': %s (training stopped at step %d; earlier checkpoints are "
                       "untouched)", s->checkpoint_dir, ctx->error, step);
    if (ctx->rank == 0) {
        /* who writes (core/io/dcp.c): rank 0 alone for NO_SHARD, the first shard group for HYBRID_SHARD, else all */
        int files = t->model.units[0].replicated ? 1 : ctx->mesh ? ctx->mesh->shard_size : ctx->world_size;
        printf("    checkpoint: %s (%.1f MB in %d files, %.2f s)\n", directory, (double)bytes / 1e6, files,
               MPI_Wtime() - start);
        fflush(stdout);
    }
}

/* RESUME=auto: the newest committed checkpoint under CHECKPOINT_DIR into directory; 0 when there is none. Rank 0
 * looks, everyone takes its answer: the ranks must not start from different steps. */
static int find_latest(trainer *t, char *directory, size_t directory_size) {
    context *ctx = t->ctx;
    int found = ctx->rank == 0 ? dcp_find_latest(t->settings.checkpoint_dir, directory, directory_size) : 0;
    WORLD_MPI(ctx, MPI_Bcast(&found, 1, MPI_INT, 0, ctx->comm));
    WORLD_MPI(ctx, MPI_Bcast(directory, (int)directory_size, MPI_CHAR, 0, ctx->comm));
    return found == 0;
}

/* Rank 0, after a resume: later checkpoints that this run's first commit will remove, and settings that changed. */
static void print_resume_notes(trainer *t, const char *directory, const dcp_progress *progress) {
    const trainer_settings *s = &t->settings;
    char latest[1200];
    if (s->checkpoint_every > 0 && dcp_find_latest(s->checkpoint_dir, latest, sizeof latest) == 0 &&
        strcmp(latest, directory) != 0 && strrchr(latest, '_') != NULL &&
        strtoll(strrchr(latest, '_') + 1, NULL, 10) > progress->step)
        printf("    note: %s holds checkpoints after step %lld (up to %s); this run's first checkpoint removes "
               "them\n", s->checkpoint_dir, (long long)progress->step, latest);
    dcp_progress now = {0};
    record_settings(t, &now);
    for (int i = 0; i < now.setting_count; i++) {
        const char *before = dcp_progress_get(progress, now.settings[i].name);
        if (before != NULL && strcmp(before, now.settings[i].value) != 0)
            printf("    note: %s was %s in the checkpoint, is %s now\n", now.settings[i].name, before,
                   now.settings[i].value);
    }
}

/* Committed and readable first, then the model: config.json says what the checkpoint's model was. */
static void check_checkpoint(trainer *t, const char *directory) {
    context *ctx = t->ctx;
    char path[1300], difference[256] = "";
    qwen2_config saved;
    dcp_metadata metadata;
    int ok = dcp_read_metadata(directory, &metadata, ctx->error, sizeof ctx->error) == 0;
    if (ok) dcp_metadata_free(&metadata);
    snprintf(path, sizeof path, "%s/config.json", directory);
    ok = ok && qwen2_config_load_json(&saved, path, ctx->error, sizeof ctx->error) == 0;
    if (ok && qwen2_config_compare(&saved, &t->model.config, difference, sizeof difference) != 0) {
        snprintf(ctx->error, sizeof ctx->error, "%s: the checkpoint's model has %s: set MODEL and CONFIG as when it "
                 "was saved", path, difference);
        ok = 0;
    }
    if (!world_all_true(ctx, ok)) world_exit_all(ctx, 2, "RESUME='%s': %s", t->settings.resume, ctx->error);
}

/* The checkpoint's parameters, optimizer state and data position; returns the first step still to run. */
static int load_checkpoint(trainer *t) {
    context *ctx = t->ctx;
    const trainer_settings *s = &t->settings;
    char directory[1200] = "";
    if (strcmp(s->resume, "auto") == 0) {
        if (!find_latest(t, directory, sizeof directory)) {
            if (ctx->rank == 0) printf("RESUME=auto: no committed checkpoint under %s; starting at step 1\n",
                                       s->checkpoint_dir);
            return 1;
        }
    } else {
        snprintf(directory, sizeof directory, "%s", s->resume);
    }
    check_checkpoint(t, directory);
    dcp_progress progress = {0};
    snprintf(progress.strategy, sizeof progress.strategy, "%s", s->strategy);
    if (dcp_load(ctx, directory, t->model.units, t->states, t->model.unit_count, &progress) != 0)
        world_exit_all(ctx, 2, "RESUME='%s': %s", s->resume, ctx->error);
    uint64_t per_micro = (uint64_t)ctx->world_size * s->micro_batch;
    if (progress.data_windows % per_micro != 0)
        world_exit_all(ctx, 2, "RESUME='%s': the checkpoint had read %llu data windows, not a whole number of this "
                       "run's global micro-batches (%d ranks x MBS %d = %llu windows): choose MBS so that ranks x MBS "
                       "divides it", s->resume, (unsigned long long)progress.data_windows, ctx->world_size,
                       s->micro_batch, (unsigned long long)per_micro);
    t->loader.next_global_micro = progress.data_windows / per_micro;
    if (ctx->rank == 0) {
        printf("resumed from %s: step %lld done, data position %llu windows\n", directory, (long long)progress.step,
               (unsigned long long)progress.data_windows);
        print_resume_notes(t, directory, &progress);
        fflush(stdout);
    }
    return (int)progress.step + 1;
}

int trainer_resume(trainer *t) {
    const trainer_settings *s = &t->settings;
    t->first_step = is_set(s->resume) ? load_checkpoint(t) : 1;
    if (t->first_step > s->steps && t->ctx->rank == 0)
        printf("nothing to train: the checkpoint is at step %d and STEPS=%d\n", t->first_step - 1, s->steps);
    t->last_checkpoint = t->first_step - 1;
    return t->first_step;
}

void trainer_maybe_checkpoint(trainer *t, int step) {
    const trainer_settings *s = &t->settings;
    if (s->checkpoint_every > 0 && (step % s->checkpoint_every == 0 || step == s->steps)) {
        save_checkpoint(t, step);
        t->last_checkpoint = step;
    }
}

void trainer_maybe_kill(trainer *t, int step) {
    if (step != t->settings.kill_at_step || t->ctx->rank != t->settings.kill_rank) return;
    fprintf(stderr, "rank %d: KILL_AT_STEP=%d: killing myself with SIGKILL (fault injection)\n", t->ctx->rank, step);
    fflush(stderr);
    raise(SIGKILL);
}

/* ---- The step ---- */

void trainer_begin_step(trainer *t) {
    mem_reset_peak(&t->ctx->mem);
    t->step_start = MPI_Wtime();
}

/* Micro-batch `micro`'s tokens into t->tokens / t->targets; whether it is the step's last (it syncs the gradients). */
static fsdp_micro_batch next_micro_batch(trainer *t, int micro) {
    /* the last batch's copies to the device (queued, from the pinned batch buffers) must have read them first */
    t->ctx->device.pinned_copies_wait(&t->ctx->device);
    data_next_batch(&t->loader, t->tokens, t->targets);
    return micro == t->settings.accumulation - 1 ? FSDP_MICRO_BATCH_LAST : FSDP_MICRO_BATCH_ACCUMULATE;
}

float trainer_forward_backward(trainer *t, int micro) {
    fsdp_micro_batch kind = next_micro_batch(t, micro);
    return fsdp_forward_backward(&t->runtime, t->tokens, t->targets, t->settings.micro_batch, t->settings.seq_len,
                                 kind);
}

/* The queued micro-batches' losses (micro_read .. micro_queued - 1, whose slots are consecutive: the slots are read
 * whenever the last one fills), each one's step event with the time and peaks of its end. */
static void read_queued_losses(trainer *t, int step) {
    int first = t->micro_read, count = t->micro_queued - t->micro_read;
    if (count <= 0) return;
    float losses[MODULE_LOSS_SLOTS];
    fsdp_losses_read(&t->runtime, losses, first % MODULE_LOSS_SLOTS, count);
    for (int i = 0; i < count; i++) {
        const struct trainer_micro *m = &t->micro[first + i];
        trace_step(&t->ctx->trace, step, first + i, losses[i], m->peak_bytes, m->peak_reserved_bytes, m->seconds);
        t->loss_sum += losses[i];
    }
    t->micro_read = t->micro_queued;
}

void trainer_forward_backward_queued(trainer *t, int step, int micro) {
    context *ctx = t->ctx;
    const trainer_settings *s = &t->settings;
    if (t->micro == NULL && (t->micro = calloc((size_t)s->accumulation, sizeof *t->micro)) == NULL)
        world_fatal(ctx, "out of memory for %d micro-batches' records", s->accumulation);
    if (micro == 0) t->micro_queued = t->micro_read = 0, t->loss_sum = 0.0;
    if (micro != t->micro_queued || micro >= s->accumulation)
        world_fatal(ctx, "step %d: micro-batch %d queued after %d of ACC=%d", step, micro, t->micro_queued,
                    s->accumulation);
    fsdp_micro_batch kind = next_micro_batch(t, micro);
    int slot = micro % MODULE_LOSS_SLOTS;
    fsdp_forward_backward_queued(&t->runtime, t->tokens, t->targets, s->micro_batch, s->seq_len, kind, slot);
    t->micro[micro] = (struct trainer_micro){MPI_Wtime() - t->step_start, ctx->mem.peak_bytes,
                                             ctx->mem.peak_reserved_bytes};
    t->micro_queued = micro + 1;
    /* the CPU's loss is on the host already: read now, its event where the micro-batch ends; elsewhere when the slots
     * are full, or at the step's end */
    if (ctx->device.kind == DEVICE_CPU || slot == MODULE_LOSS_SLOTS - 1) read_queued_losses(t, step);
}

double trainer_read_losses(trainer *t, int step) {
    read_queued_losses(t, step);
    double loss_sum = t->loss_sum;
    t->micro_queued = t->micro_read = 0, t->loss_sum = 0.0;
    return loss_sum;
}

/* Mixed precision: every parameter's sum over ranks of |local gradient| as it went into the reduce (sum_r ||t_r||_1,
 * flat_param's local_grad_l1), beside GRADS' gradients in local_grad_l1.json: what the bound of a bfloat16 sum over
 * ranks needs (tests/check_mixed_grads.py). Collective. */
static void save_local_grad_l1(trainer *t, const char *directory) {
    context *ctx = t->ctx;
    qwen2_model *model = &t->model;
    for (int unit = 0; unit < model->unit_count; unit++)
        world_allreduce(ctx, model->units[unit].local_grad_l1, model->units[unit].param_count, MPI_DOUBLE, MPI_SUM,
                      "the local gradients' sums");
    if (ctx->rank != 0) return;
    char path[1200];
    snprintf(path, sizeof path, "%s/local_grad_l1.json", directory);
    FILE *file = fopen(path, "w");
    if (file == NULL) world_fatal(ctx, "GRADS='%s': cannot write %s", directory, path);
    /* The reduction's levels, in the order they run: one ring over the world (a reduce-scatter, or NO_SHARD's
     * all-reduce), or HYBRID_SHARD's reduce-scatter in the shard group then all-reduce across the replicate group. */
    const flat_param *root = &model->units[0];
    char levels[64];
    if (root->shard_group != NULL)
        snprintf(levels, sizeof levels, "%d, %d", root->shard_group->size, root->replicate_group->size);
    else snprintf(levels, sizeof levels, "%d", ctx->world_size);
    const flat_param_mixed_precision *mp = &t->options.mixed_precision;
    fprintf(file, "{\"world\": %d, \"levels\": [%s], \"param_dtype\": \"%s\", \"reduce_dtype\": \"%s\", "
            "\"local_grad_l1\": {", ctx->world_size, levels, dtype_name(mp->param_dtype), dtype_name(mp->reduce_dtype));
    for (int p = 0; p < model->tree.param_count; p++) {
        qwen2_location at = model->locations[p];
        fprintf(file, "%s\n  \"%s\": %.17g", p ? "," : "", model->tree.params[p].name,
                model->units[at.unit].local_grad_l1[at.index]);
    }
    fprintf(file, "\n}}\n");
    if (fclose(file) != 0) world_fatal(ctx, "GRADS='%s': writing %s failed", directory, path);
}

void trainer_save_gradients(trainer *t, int step) {
    context *ctx = t->ctx;
    const char *grads = t->settings.grads;
    if (step != 1 || !is_set(grads)) return;
    /* GRADS gathers every unit's gradient at once (<unit>.full_grad_padded, in the trace) to write them; the step's
     * peaks leave it out, so the memory table and Peak are the training's, with or without GRADS */
    mem_peaks before = mem_peaks_now(&ctx->mem);
    if (pretrained_save_gradients(&t->model, grads) != 0) world_fatal(ctx, "GRADS='%s': %s", grads, ctx->error);
    mem_peaks_restore(&ctx->mem, &before);
    if (flat_param_mixed_precision_enabled(&t->options.mixed_precision)) save_local_grad_l1(t, grads);
}

int trainer_diverged(trainer *t, int step, double loss_sum) {
    context *ctx = t->ctx;
    const trainer_settings *s = &t->settings;
    double step_loss = loss_sum;
    world_allreduce(ctx, &step_loss, 1, MPI_DOUBLE, MPI_SUM, "the step's loss");
    int bad_unit = adamw_first_nonfinite_gradient(ctx, t->model.units, t->model.unit_count);
    if (isfinite(step_loss) && bad_unit < 0) return 0;
    char kept[700] = "";
    if (t->last_checkpoint > 0)
        snprintf(kept, sizeof kept, "; the last checkpoint (step %d, under %s) is untouched: RESUME from it "
                 "with a lower LR", t->last_checkpoint, s->checkpoint_dir);
    snprintf(t->diverged, sizeof t->diverged, "step %d diverged: loss %g, %s%s%s; stopped before its optimizer step, "
             "so the parameters are those after step %d%s%s", step, step_loss / s->accumulation / ctx->world_size,
             bad_unit >= 0 ? "first non-finite gradient in unit '" : "every gradient finite",
             bad_unit >= 0 ? t->model.units[bad_unit].unit : "", bad_unit >= 0 ? "'" : "", step - 1,
             is_set(s->save) ? "; SAVE skipped: nothing was written" : "", kept);
    trace_mark(&ctx->trace, t->diverged);
    return 1;
}

void trainer_optimizer_step(trainer *t) {
    qwen2_model *model = &t->model;
    if (t->settings.clip > 0.0) adamw_clip_grad_norm(t->ctx, model->units, model->unit_count, t->settings.clip);
    for (int unit = 0; unit < model->unit_count; unit++) {
        adamw_step(&t->states[unit], &model->units[unit], &t->optimizer);
        flat_param_zero_grad(&model->units[unit]);
    }
    fsdp_trace_compute_spans(&t->runtime); /* the step's compute spans (on CUDA its timers are read here, once) */
}

void trainer_log_step(trainer *t, int step, double loss_sum) {
    context *ctx = t->ctx;
    const trainer_settings *s = &t->settings;
    double elapsed = MPI_Wtime() - t->step_start;
    /* PEAK=rss reports the process's max resident set instead of the tracked peak: the measure a PyTorch run can
     * be given too (scripts/train.sh FSDP=both), though it counts the program, libraries and MPI as well. */
    struct rusage usage;
    getrusage(RUSAGE_SELF, &usage);
    double peak = strcmp(s->peak, "rss") == 0 ? (double)usage.ru_maxrss * 1024.0 : (double)ctx->mem.peak_bytes;
    /* The step's loss: the mean over micro-batches and ranks (every rank saw a different slice). */
    double loss = loss_sum / s->accumulation, slowest = elapsed;
    world_allreduce(ctx, &loss, 1, MPI_DOUBLE, MPI_SUM, "the step's loss");
    world_allreduce(ctx, &peak, 1, MPI_DOUBLE, MPI_MAX, "the step's peak");
    world_allreduce(ctx, &slowest, 1, MPI_DOUBLE, MPI_MAX, "the step's time");
    loss /= ctx->world_size;
    trace_step(&ctx->trace, step, -1, loss, ctx->mem.peak_bytes, ctx->mem.peak_reserved_bytes, elapsed);
    /* The run's peaks, for trainer_report_memory: the largest of every step's. */
    for (int category = 0; category < MEM_CATEGORY_COUNT; category++)
        if (ctx->mem.category_peak_bytes[category] > t->measured_peak[category])
            t->measured_peak[category] = ctx->mem.category_peak_bytes[category];
    if (ctx->mem.peak_bytes > t->measured_total_peak) t->measured_total_peak = ctx->mem.peak_bytes;
    if (ctx->mem.peak_reserved_bytes > t->measured_reserved_peak)
        t->measured_reserved_peak = ctx->mem.peak_reserved_bytes;
    if (ctx->rank == 0) {
        printf("%d/%d: Loss = %.6f, Peak = %.1f MB, Time = %.4fs\n", step, s->steps, loss, peak / 1e6, slowest);
        fflush(stdout);
    }
}

/* A story from "Once upon a time", every unit unsharded for the moment (collective), printed by rank 0; in and out
 * through the tokenizer the data went through (bytes when NULL). */
static void print_story(trainer *t, uint64_t seed) {
    context *ctx = t->ctx;
    qwen2_model *model = &t->model;
    const char *prompt_text = "Once upon a time";
    int prompt[64], generated[200], prompt_length;
    if (t->tokenizer == NULL) {
        prompt_length = (int)data_encode(prompt_text, strlen(prompt_text), prompt);
    } else {
        tok_ids ids = {0};
        if (tok_encode(t->tokenizer, prompt_text, strlen(prompt_text), &ids, ctx->error, sizeof ctx->error) != 0)
            world_fatal(ctx, "EVAL: %s", ctx->error);
        prompt_length = (int)ids.count;
        memcpy(prompt, ids.ids, ids.count * sizeof *prompt); /* 4 tokens: well within 64 */
        tok_ids_free(&ids);
    }
    for (int unit = 0; unit < model->unit_count; unit++)
        if (flat_param_unshard(&model->units[unit], "eval") != 0) world_fatal(ctx, "%s", ctx->error);
    int count = qwen2_generate(model, prompt, prompt_length, 200, 0.8f, seed, generated);
    if (count < 0) world_exit_all(ctx, 2, "EVAL: %s", ctx->error); /* the same on every rank */
    for (int unit = 0; unit < model->unit_count; unit++) flat_param_reshard(&model->units[unit], "eval");
    if (ctx->rank == 0) {
        char text[2048];
        if (t->tokenizer == NULL) data_decode(generated, (size_t)count, text, sizeof text);
        else tok_decode(t->tokenizer, generated, (size_t)count, text, sizeof text);
        printf("    --- %s%s\n", prompt_text, text);
        fflush(stdout);
    }
}

void trainer_maybe_eval(trainer *t, int step) {
    if (t->settings.eval_every > 0 && step % t->settings.eval_every == 0)
        print_story(t, t->settings.seed + (uint64_t)step);
}

/* ---- After the steps ---- */

void trainer_predict_memory(const trainer *t, memory_prediction *predicted) {
    const trainer_settings *s = &t->settings;
    int steps_run = s->steps - t->first_step + 1;
    memory_model_predict(predicted, &t->model, &t->options, t->ctx->world_size, s->micro_batch, s->seq_len,
                         t->loader.token_bytes, steps_run * s->accumulation);
}

void trainer_report_memory(trainer *t) {
    context *ctx = t->ctx;
    int steps_run = t->settings.steps - t->first_step + 1;
    memory_prediction predicted;
    trainer_predict_memory(t, &predicted);
    char report[4096];
    memory_model_report(&predicted, t->measured_peak, t->measured_total_peak, t->measured_reserved_peak, report,
                        sizeof report);
    if (ctx->rank == 0 && steps_run > 0) printf("\n%s", report);
    if (t->settings.offload && ctx->host_mem_ready) { /* the host pool's table (its peaks over the whole run) */
        memory_prediction host = memory_model_host_part(&predicted);
        memory_model_report(&host, ctx->host_mem.category_peak_bytes, ctx->host_mem.peak_bytes,
                            ctx->host_mem.peak_reserved_bytes, report, sizeof report);
        if (ctx->rank == 0 && steps_run > 0) printf("\nhost pool (CPU offload): %s", report);
    }
}

void trainer_save(trainer *t) {
    context *ctx = t->ctx;
    const char *save = t->settings.save;
    if (t->diverged[0]) {
        if (ctx->rank == 0) fprintf(stderr, "%s: error: %s (lower LR, or CLIP)\n", ctx->program, t->diverged);
    } else if (is_set(save)) {
        if (pretrained_save(&t->model, save) != 0) world_fatal(ctx, "SAVE='%s': %s", save, ctx->error);
        if (ctx->rank == 0) printf("checkpoint: %s (config.json, model.safetensors)\n", save);
    }
}

/* ---- Labs 06-09's modes ---- */

void trainer_begin_window(context *ctx, const char *label) {
    WORLD_MPI(ctx, MPI_Barrier(ctx->comm));
    trace_mark(&ctx->trace, label);
    mem_reset_peak(&ctx->mem);
}

void trainer_print_memory_model(trainer *t, const char *window) {
    context *ctx = t->ctx;
    memory_prediction predicted;
    trainer_predict_memory(t, &predicted);
    char report[4096], block[4400];
    memory_model_report(&predicted, ctx->mem.category_peak_bytes, ctx->mem.peak_bytes, ctx->mem.peak_reserved_bytes,
                        report, sizeof report);
    snprintf(block, sizeof block, "rank %d, %s: %s", ctx->rank, window, report);
    world_print_ordered(ctx, block);
}

uint64_t trainer_shards_checksum(const flat_param *units, int unit_count) {
    uint64_t hash = HASH_START;
    for (int unit = 0; unit < unit_count; unit++) {
        const flat_param *fp = &units[unit];
        size_t bytes = fp->sharded_numel * sizeof(float);
        device *d = flat_param_shard_device(fp);
        if (d->kind == DEVICE_CPU) {
            hash = hash_bytes(hash, fp->local_shard, bytes);
            continue;
        }
        float *host = malloc(bytes > 0 ? bytes : 1); /* a GPU's shard, read on the host */
        if (host == NULL) world_fatal(fp->ctx, "out of memory for unit %d's shard checksum (%zu bytes)", unit, bytes);
        d->copy(d, host, fp->local_shard, bytes, DEVICE_D2H);
        hash = hash_bytes(hash, host, bytes);
        free(host);
    }
    return hash;
}

/* ---- Closing ---- */

void trainer_close(trainer *t) {
    context *ctx = t->ctx;
    ctx->device.pinned_copies_wait(&ctx->device); /* no copy may still read the batch buffers */
    mem_free(offload_data_pool(ctx), t->tokens);
    mem_free(offload_data_pool(ctx), t->targets);
    data_loader_close(&t->loader);
    if (t->tokenizer != NULL) tok_free(t->tokenizer);
    free(t->tokenizer);
    for (int unit = 0; unit < t->model.unit_count; unit++) adamw_free(&t->states[unit]);
    free(t->states);
    free(t->micro);
    fsdp_runtime_free(&t->runtime);
    qwen2_model_free(&t->model);
    ctx->per_parameter_sharding = 0;
    if (t->owns_mesh) {
        group_mesh_free(&t->mesh);
        ctx->mesh = NULL, t->owns_mesh = 0;
    }
}

void trainer_empty_caches(context *ctx) {
    mem_empty_cache(&ctx->mem);
    if (ctx->host_mem_ready) mem_empty_cache(&ctx->host_mem);
}
