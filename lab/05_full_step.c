/* lab 05 — the full FSDP training step: every unit, state, hook, collective and byte of a real training run.
 *
 * What it teaches
 *   Everything of labs 01-04 at once, on a Qwen2 model. The model is cut into FSDP units by a wrap policy (one per
 *   decoder layer, the root holding the embedding and the final norm). In each micro-batch every unit is unsharded
 *   just before its forward (_pre_forward: all-gather) and resharded right after (_post_forward), except the root;
 *   in backward each unit is unsharded again (_pre_backward_hook), its gradient reduce-scattered and its parameters
 *   freed (_post_backward_hook). After ACC micro-batches AdamW updates only this rank's shard, with optimizer
 *   state for the shard alone. Peak memory is "1/N of everything + the unsharded units in flight + activations".
 *   The bytes come from a caching allocator like PyTorch's (core/memory/allocator.h): a freed unit's buffer stays
 *   *reserved* and serves the next unit's all-gather, so after the first steps nothing is asked of the system;
 *   reserved - allocated is what the cache holds plus fragmentation.
 *
 * What to run
 *   mpirun -np 2 lab/05_full_step                      3 steps of the tiny model, ACC=2 (as root, OpenMPI also
 *                                                      wants --allow-run-as-root; `make run` adds it for you)
 *   STEPS=50 EVAL=25 mpirun -np 2 lab/05_full_step     watch the loss fall and the model start to write
 *   STRATEGY=SHARD_GRAD_OP CKPT=1 NO_SYNC=1 ...        compare the peaks (and the traces)
 *   ALLOC=malloc mpirun -np 2 lab/05_full_step         no caching: every buffer a fresh segment (PyTorch's
 *                                                      PYTORCH_NO_CUDA_MEMORY_CACHING=1); same numbers, more sys time
 *   STEPS=200 CHECKPOINT_EVERY=20 mpirun -np 2 lab/05_full_step     sharded checkpoints under OUT/checkpoints;
 *   STEPS=200 CHECKPOINT_EVERY=20 RESUME=auto mpirun -np 2 ...      after a crash, continue from the newest one:
 *                                                      the same losses, bit for bit, as if it had never stopped
 *   env: MODEL (tiny, qwen2-0.5b or its seed name qwen2), MBS (sequences per rank per micro-batch), ACC, STEPS, SEQ, EVAL (every N steps
 *   print a generated story; 0 off), STRATEGY (FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, and lab 08's HYBRID_SHARD and
 *   _HYBRID_SHARD_ZERO2 with SHARD_GROUP: ranks per shard group, default the ranks per node), CKPT (activation
 *   checkpointing 0/1), NO_SYNC (0/1),
 *   MP (mixed precision, torch's MixedPrecision: fp32, the default, off; bf16: bfloat16 parameters and gradient
 *   reduction; bf16,reduce=fp32; see lab 07), LR, CLIP (max grad norm, 0 off), SEED, DATA (text or .bin token file;
 *   default: generated stories), TOKENIZER (how text becomes ids: auto, the default, is Qwen2's BPE for qwen2-0.5b
 *   when data/qwen2/qwen.tiktoken is there and bytes for tiny; bytes; qwen2; or a vocabulary's path), OUT (run dir), SAVE (write an HF checkpoint there at the end), GRADS (write step 1's
 *   gradients there, as the optimizer sees them, in checkpoint form: what check-05 compares), THREADS, CONFIG
 *   (model fields by their HF names: CONFIG=hidden_size=512,num_hidden_layers=8), WRAP (layers, or size:<min params>
 *   for the size-based policy), PEAK (tracked: the tracked allocator's peak, the default; rss: the process's max RSS),
 *   ALLOC (caching, the default, or malloc), MAX_SPLIT_SIZE_MB (PyTorch's max_split_size_mb; 0: no limit),
 *   OFFLOAD (1: CPUOffload(offload_params=True), lab 09: shards, gradients and AdamW in the host pool),
 *   DEVICE_MEMORY_MB (the device pool's budget; 0, the default: none), LOSS_CHUNK (rows of the loss at a time, so
 *   the B x T x vocabulary logits never exist at once; 0: all at once, the CPU's default; 1024 on a GPU),
 *   DEVICE (cpu, the default; cuda: the GPU, in a `make CUDA=1` build) and BACKEND (mpi = gloo; nccl, on the GPU),
 *   MEMORY_CHECK (1, the default: refuse a run whose predicted peak exceeds the memory available; 0: skip);
 *   lab 06's overlap settings, off here: COMM_STREAMS (1: collectives on an all-gather and a reduce-scatter stream),
 *   BACKWARD_PREFETCH (NONE, BACKWARD_PRE, BACKWARD_POST), FORWARD_PREFETCH, LIMIT_ALL_GATHERS (scripts/train.sh turns
 *   on torch's defaults: comm streams, BACKWARD_PRE, limit_all_gathers);
 *   checkpoints (core/io/dcp.h, torch.distributed.checkpoint's layout): CHECKPOINT_EVERY (steps; 0 off, the default),
 *   CHECKPOINT_DIR (default OUT/checkpoints), CHECKPOINT_KEEP (newest kept, default 2), RESUME (a step_N directory,
 *   or auto: the newest committed one under CHECKPOINT_DIR, if any); STEPS counts from the start of training, so a
 *   resumed run ends where the uninterrupted one would; KILL_AT_STEP and KILL_RANK inject a kill -9 (for the check).
 *
 * What to look at (runs/05_full_step/trace.json in Perfetto UI)
 *   Per rank: on the comm track an all_gather before each layer's forward and again before its backward, and a
 *   reduce_scatter after each backward; on the compute track forward, backward (and recompute with CKPT=1); the
 *   state instants (_pre_forward, _post_backward_hook, ...) in PyTorch's order; the memory counter rising through
 *   forward (activations) and falling through backward, param_unsharded flickering one unit at a time, and the
 *   reserved counter above it: it climbs in the first steps, then stays flat. memory.html draws reserved over the
 *   bands and lists the segments holding the fragmentation at its peak; memory_snapshot.pickle is the allocator's
 *   own state for pytorch.org/memory_viz (segments, blocks, segment_alloc/alloc/free_completed/segment_free).
 *
 * The check (`make check-05`): losses and parameters on 2 and 4 ranks equal those of 1 rank without sharding, for
 * every strategy, both accumulation modes and checkpointing on/off; the state order equals PyTorch's; the memory
 * model equals the measured peak per category to the byte, and reserved lies between allocated and its bound; with
 * ALLOC=malloc everything is bit-identical.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>

#include "core/io/pretrained.h"
#include "core/runtime/env.h"
#include "core/runtime/context.h"
#include "core/data/data.h"
#include "core/io/dcp.h"
#include "core/fsdp/fsdp.h"
#include "core/comm/group.h"
#include "core/models/memory_model.h"
#include "core/runtime/offload.h"
#include "core/fsdp/optim.h"
#include "core/models/qwen2.h"
#include "core/runtime/world.h"
#include "core/runtime/session.h"

typedef struct settings {
    const char *strategy, *data, *save, *grads, *wrap, *peak, *checkpoint_dir, *resume;
    int micro_batch, accumulation, steps, seq_len, eval_every, checkpointing, no_sync;
    int checkpoint_every, checkpoint_keep, kill_at_step, kill_rank, shard_group, offload;
    double lr, clip;
    uint64_t seed;
} settings;

static settings read_settings(context *ctx) {
    static const char *const strategies[] = {"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD",
                                             "_HYBRID_SHARD_ZERO2", NULL};
    settings s = {
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
        /* Fault injection, for the resume check: rank KILL_RANK sends itself SIGKILL (kill -9) right after step
         * KILL_AT_STEP, its checkpoint included; 0: never. */
        .kill_at_step = (int)env_int(ctx, "KILL_AT_STEP", 0, 0, 1000000),
        .kill_rank = (int)env_int(ctx, "KILL_RANK", 0, 0, ctx->world_size - 1),
    };
    /* HYBRID_SHARD's shard group size (lab 08); unset: the ranks per node. Read whatever the strategy (settings are
     * collective), resolved and checked only for a hybrid one. */
    int hybrid = fsdp_strategy_is_hybrid((fsdp_strategy)fsdp_strategy_from_name(s.strategy));
    s.shard_group = group_shard_size_from_env(ctx, 0, hybrid);
    static char default_dir[600];
    if (s.checkpoint_dir == NULL || s.checkpoint_dir[0] == '\0') {
        snprintf(default_dir, sizeof default_dir, "%s/checkpoints", ctx->outdir);
        s.checkpoint_dir = default_dir;
    }
    return s;
}

/* The FSDP options the settings ask for (and lab 06's prefetch settings, off by default). Collective. */
static fsdp_options make_options(context *ctx, const settings *s) {
    fsdp_options options = {.strategy = (fsdp_strategy)fsdp_strategy_from_name(s->strategy),
                            .activation_checkpointing = s->checkpointing, .no_sync = s->no_sync,
                            .accumulation_steps = s->accumulation, .offload_params = s->offload};
    fsdp_prefetch_options_from_env(ctx, &options);
    fsdp_mixed_precision_from_env(ctx, &options);
    /* LOSS_CHUNK: the loss this many rows at a time (core/models/qwen2.h); on a GPU 1024 by default, so the B x T x V logits
     * of a 151,936-word vocabulary never exist at once; on the CPU 0, all at once. */
    options.loss_chunk = (int)env_int(ctx, "LOSS_CHUNK", ctx->device.kind == DEVICE_CPU ? 0 : 1024, 0, 1 << 30);
    return options;
}

/* SAVE, GRADS and CHECKPOINT_DIR are written during or after training: a directory that cannot be made or written
 * is refused now, before the model is built. */
static void check_save_directories(context *ctx, const settings *s) {
    const char *names[] = {"SAVE", "GRADS", "CHECKPOINT_DIR"};
    const char *values[] = {s->save, s->grads, s->checkpoint_every > 0 ? s->checkpoint_dir : NULL};
    for (int i = 0; i < 3; i++)
        if (values[i] != NULL && values[i][0] != '\0' && pretrained_check_writable(ctx, values[i]) != 0)
            world_exit_all(ctx, 2, "%s='%s': %s", names[i], values[i], ctx->error);
}

/* Before the model is allocated: the analytic memory model's peak for these settings, from the config and the wrap
 * alone, against the memory this rank may use (MEMORY_CHECK=0 skips it). The token stream is bounded from DATA's
 * size (a .bin at most one id per 2 bytes, text at most one per byte; each id 2 or 4 bytes in memory by the
 * vocabulary); the generated stories are a few MB. */
static void require_memory_fit(context *ctx, const settings *s, const qwen2_config *config, fsdp_wrap_fn wrap,
                               void *wrap_user) {
    fsdp_options options = make_options(ctx, s);
    struct stat info;
    size_t data_bytes = 0;
    if (s->data != NULL && s->data[0] != '\0' && stat(s->data, &info) == 0 && S_ISREG(info.st_mode)) {
        size_t length = strlen(s->data);
        int bin = length > 4 && strcmp(s->data + length - 4, ".bin") == 0;
        size_t width = (size_t)data_token_width(config->vocab_size); /* the in-memory id: 2 or 4 bytes */
        data_bytes = bin ? width * ((size_t)info.st_size / 2) : width * (size_t)info.st_size;
    }
    memory_prediction prediction;
    if (memory_model_predict_config(&prediction, ctx, config, wrap, wrap_user, &options, s->micro_batch, s->seq_len,
                                    data_bytes, s->steps * s->accumulation) != 0)
        world_exit_all(ctx, 2, "%s", ctx->error);
    memory_model_require_fit(ctx, &prediction);
}

/* The model, one unit per decoder layer (transformer_auto_wrap_policy), initialised from SEED. */
static void build_model(context *ctx, const settings *s, qwen2_model *model) {
    qwen2_config config;
    qwen2_config_from_env(ctx, &config, s->seq_len);
    /* WRAP: "layers" (transformer_auto_wrap_policy, the default) or "size:<min params>" (size_based_auto_wrap_policy) */
    fsdp_wrap_fn wrap = fsdp_wrap_by_type;
    void *wrap_user = (void *)QWEN2_DECODER_LAYER;
    size_t min_params = 0;
    if (s->wrap != NULL && s->wrap[0] != '\0' && strcmp(s->wrap, "layers") != 0) {
        char *end = NULL;
        errno = 0; /* digits only: strtoull would take "-5" as 2^64 - 5, and saturate past 2^64 */
        if (strncmp(s->wrap, "size:", 5) != 0 || !isdigit((unsigned char)s->wrap[5]) ||
            (min_params = strtoull(s->wrap + 5, &end, 10)) == 0 || errno != 0 || *end != '\0')
            world_exit_all(ctx, 2, "WRAP='%s' is not a wrap policy; choose layers or size:<min params>, e.g. size:100000",
                         s->wrap);
        wrap = fsdp_wrap_by_size, wrap_user = &min_params;
    }
    require_memory_fit(ctx, s, &config, wrap, wrap_user);
    qwen2_init_spec init = {.seed = s->seed, .std = (float)config.initializer_range};
    if (qwen2_model_init_wrapped(model, ctx, &config, wrap, wrap_user, (fsdp_strategy)fsdp_strategy_from_name(s->strategy),
                        &init) != 0)
        world_exit_all(ctx, 2, "%s", ctx->error);
}

/* A story from "Once upon a time", every unit unsharded for the moment (collective), printed by rank 0; in and out
 * through the tokenizer the data went through (bytes when NULL). */
static void print_story(context *ctx, qwen2_model *model, tok_tokenizer *tokenizer, uint64_t seed) {
    const char *prompt_text = "Once upon a time";
    int prompt[64], generated[200], prompt_length;
    if (tokenizer == NULL) {
        prompt_length = (int)data_encode(prompt_text, strlen(prompt_text), prompt);
    } else {
        tok_ids ids = {0};
        if (tok_encode(tokenizer, prompt_text, strlen(prompt_text), &ids, ctx->error, sizeof ctx->error) != 0)
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
        if (tokenizer == NULL) data_decode(generated, (size_t)count, text, sizeof text);
        else tok_decode(tokenizer, generated, (size_t)count, text, sizeof text);
        printf("    --- %s%s\n", prompt_text, text);
        fflush(stdout);
    }
}

/* ---- Sharded checkpoints (core/io/dcp.h): CHECKPOINT_EVERY, RESUME ---- */

/* What a checkpoint records of the settings, so a resume can say what it changed. */
static void record_settings(const settings *s, const qwen2_model *model, const data_loader *loader, dcp_progress *p) {
    snprintf(p->strategy, sizeof p->strategy, "%s", s->strategy);
    dcp_progress_set(p, "MODEL", "%s", model->config.name);
    dcp_progress_set(p, "MBS", "%d", s->micro_batch);
    dcp_progress_set(p, "ACC", "%d", s->accumulation);
    dcp_progress_set(p, "SEQ", "%d", s->seq_len);
    dcp_progress_set(p, "LR", "%.17g", s->lr);
    dcp_progress_set(p, "CLIP", "%.17g", s->clip);
    dcp_progress_set(p, "SEED", "%llu", (unsigned long long)s->seed);
    dcp_progress_set(p, "DATA", "%s", loader->source); /* names the tokenizer too */
    dcp_progress_set(p, "NO_SYNC", "%d", s->no_sync);
    if (fsdp_strategy_is_hybrid((fsdp_strategy)fsdp_strategy_from_name(s->strategy))) /* the mesh: may change */
        dcp_progress_set(p, "SHARD_GROUP", "%d", s->shard_group);
}

static int write_config(const char *directory, void *user, char *error, size_t error_size) {
    char path[1200];
    snprintf(path, sizeof path, "%s/config.json", directory);
    return qwen2_config_save_json(&((const qwen2_model *)user)->config, path, error, error_size);
}

static void save_checkpoint(context *ctx, const settings *s, qwen2_model *model, const adamw_state *states,
                            const data_loader *loader, int step) {
    double start = MPI_Wtime();
    dcp_progress progress = {.step = step,
                             .data_windows = loader->next_global_micro * (uint64_t)ctx->world_size * s->micro_batch};
    record_settings(s, model, loader, &progress);
    char directory[1200];
    uint64_t bytes = 0;
    if (dcp_save(ctx, s->checkpoint_dir, model->units, states, model->unit_count, &progress, s->checkpoint_keep,
                 write_config, model, directory, sizeof directory, &bytes) != 0)
        world_exit_all(ctx, 2, "CHECKPOINT_DIR='%s': %s (training stopped at step %d; earlier checkpoints are untouched)",
                     s->checkpoint_dir, ctx->error, step);
    if (ctx->rank == 0) {
        /* who writes (core/io/dcp.c): rank 0 alone for NO_SHARD, the first shard group for HYBRID_SHARD, else all */
        int files = model->units[0].replicated ? 1 : ctx->mesh ? ctx->mesh->shard_size : ctx->world_size;
        printf("    checkpoint: %s (%.1f MB in %d files, %.2f s)\n", directory, (double)bytes / 1e6, files,
               MPI_Wtime() - start);
        fflush(stdout);
    }
}

/* RESUME: the checkpoint's parameters, optimizer state and data position; returns the first step still to run. */
static int resume(context *ctx, const settings *s, qwen2_model *model, adamw_state *states, data_loader *loader) {
    char directory[1200] = "";
    if (strcmp(s->resume, "auto") == 0) {
        /* rank 0 looks, everyone takes its answer: the ranks must not start from different steps */
        int found = ctx->rank == 0 ? dcp_find_latest(s->checkpoint_dir, directory, sizeof directory) : 0;
        WORLD_MPI(ctx, MPI_Bcast(&found, 1, MPI_INT, 0, ctx->comm));
        WORLD_MPI(ctx, MPI_Bcast(directory, (int)sizeof directory, MPI_CHAR, 0, ctx->comm));
        if (found != 0) {
            if (ctx->rank == 0) printf("RESUME=auto: no committed checkpoint under %s; starting at step 1\n",
                                       s->checkpoint_dir);
            return 1;
        }
    } else {
        snprintf(directory, sizeof directory, "%s", s->resume);
    }
    /* Committed and readable first, then the model: config.json says what the checkpoint's model was. */
    char path[1300], difference[256] = "";
    qwen2_config saved;
    dcp_metadata metadata;
    int ok = dcp_read_metadata(directory, &metadata, ctx->error, sizeof ctx->error) == 0;
    if (ok) dcp_metadata_free(&metadata);
    snprintf(path, sizeof path, "%s/config.json", directory);
    ok = ok && qwen2_config_load_json(&saved, path, ctx->error, sizeof ctx->error) == 0;
    if (ok && qwen2_config_compare(&saved, &model->config, difference, sizeof difference) != 0) {
        snprintf(ctx->error, sizeof ctx->error, "%s: the checkpoint's model has %s: set MODEL and CONFIG as when it "
                 "was saved", path, difference);
        ok = 0;
    }
    if (!world_all_true(ctx, ok)) world_exit_all(ctx, 2, "RESUME='%s': %s", s->resume, ctx->error);
    dcp_progress progress = {0};
    snprintf(progress.strategy, sizeof progress.strategy, "%s", s->strategy);
    if (dcp_load(ctx, directory, model->units, states, model->unit_count, &progress) != 0)
        world_exit_all(ctx, 2, "RESUME='%s': %s", s->resume, ctx->error);
    uint64_t per_micro = (uint64_t)ctx->world_size * s->micro_batch;
    if (progress.data_windows % per_micro != 0)
        world_exit_all(ctx, 2, "RESUME='%s': the checkpoint had read %llu data windows, not a whole number of this run's "
                     "global micro-batches (%d ranks x MBS %d = %llu windows): choose MBS so that ranks x MBS divides "
                     "it", s->resume, (unsigned long long)progress.data_windows, ctx->world_size, s->micro_batch,
                     (unsigned long long)per_micro);
    loader->next_global_micro = progress.data_windows / per_micro;
    if (ctx->rank == 0) {
        printf("resumed from %s: step %lld done, data position %llu windows\n", directory, (long long)progress.step,
               (unsigned long long)progress.data_windows);
        char latest[1200];
        if (s->checkpoint_every > 0 && dcp_find_latest(s->checkpoint_dir, latest, sizeof latest) == 0 &&
            strcmp(latest, directory) != 0 && strrchr(latest, '_') != NULL &&
            strtoll(strrchr(latest, '_') + 1, NULL, 10) > progress.step)
            printf("    note: %s holds checkpoints after step %lld (up to %s); this run's first checkpoint removes "
                   "them\n", s->checkpoint_dir, (long long)progress.step, latest);
        dcp_progress now = {0};
        record_settings(s, model, loader, &now);
        for (int i = 0; i < now.setting_count; i++) {
            const char *before = dcp_progress_get(&progress, now.settings[i].name);
            if (before != NULL && strcmp(before, now.settings[i].value) != 0)
                printf("    note: %s was %s in the checkpoint, is %s now\n", now.settings[i].name, before,
                       now.settings[i].value);
        }
        fflush(stdout);
    }
    return (int)progress.step + 1;
}

/* Mixed precision: every parameter's sum over ranks of |local gradient| as it went into the reduce (sum_r ||t_r||_1,
 * flat_param's local_grad_l1), beside GRADS' gradients in local_grad_l1.json: what the bound of a bfloat16 sum over
 * ranks needs (tests/check_mixed_grads.py). Collective. */
static void save_local_grad_l1(context *ctx, qwen2_model *model, const fsdp_options *options, const char *directory) {
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
    fprintf(file, "{\"world\": %d, \"levels\": [%s], \"param_dtype\": \"%s\", \"reduce_dtype\": \"%s\", "
            "\"local_grad_l1\": {", ctx->world_size, levels,
            dtype_name(options->mixed_precision.param_dtype), dtype_name(options->mixed_precision.reduce_dtype));
    for (int p = 0; p < model->tree.param_count; p++) {
        qwen2_location at = model->locations[p];
        fprintf(file, "%s\n  \"%s\": %.17g", p ? "," : "", model->tree.params[p].name,
                model->units[at.unit].local_grad_l1[at.index]);
    }
    fprintf(file, "\n}}\n");
    if (fclose(file) != 0) world_fatal(ctx, "GRADS='%s': writing %s failed", directory, path);
}

int main(int argc, char **argv) {
    context ctx;
    session_open(&ctx, &argc, &argv, "05_full_step", "runs/05_full_step");
    settings s = read_settings(&ctx);
    check_save_directories(&ctx, &s);
    group_mesh mesh; /* HYBRID_SHARD: shard groups of SHARD_GROUP ranks x replicate groups (lab 08), before the model */
    if (fsdp_strategy_is_hybrid((fsdp_strategy)fsdp_strategy_from_name(s.strategy))) {
        if (group_mesh_init(&mesh, &ctx, s.shard_group) != 0) world_exit_all(&ctx, 2, "SHARD_GROUP: %s", ctx.error);
        ctx.mesh = &mesh;
    }
    qwen2_model model;
    build_model(&ctx, &s, &model);
    fsdp_options options = make_options(&ctx, &s);
    model.loss_chunk = options.loss_chunk;
    fsdp_runtime runtime;
    module view;
    qwen2_as_module(&model, &view);
    if (fsdp_runtime_init(&runtime, &ctx, &view, &options) != 0) world_exit_all(&ctx, 2, "%s", ctx.error);
    adamw_config optimizer = adamw_default_config();
    optimizer.lr = s.lr;
    adamw_state *states = calloc((size_t)model.unit_count, sizeof *states);
    for (int unit = 0; unit < model.unit_count; unit++) adamw_init(&states[unit]);
    char tokenizer_note[1024];
    tok_tokenizer *tokenizer = data_tokenizer_from_env(&ctx, model.config.vocab_size, tokenizer_note,
                                                       sizeof tokenizer_note);
    data_loader loader;
    if (data_loader_open_tokenized(&loader, &ctx, s.data, tokenizer, model.config.vocab_size, s.micro_batch,
                                   s.seq_len, s.seed, 1) != 0)
        world_exit_all(&ctx, 2, "DATA: %s", ctx.error);

    size_t batch = (size_t)s.micro_batch * s.seq_len;
    int *tokens = mem_alloc(offload_data_pool(&ctx), batch * sizeof(int), MEM_DATA, "batch.tokens_host");
    int *targets = mem_alloc(offload_data_pool(&ctx), batch * sizeof(int), MEM_DATA, "batch.targets_host");
    if (ctx.rank == 0) {
        printf("Ranks = %d, FSDP = fsdplab, Acc = %d\n", ctx.world_size, s.accumulation);
        if (flat_param_mixed_precision_enabled(&options.mixed_precision))
            printf("(mixed precision: param_dtype %s, reduce_dtype %s; float32 master shards and AdamW)\n",
                   dtype_name(options.mixed_precision.param_dtype), dtype_name(options.mixed_precision.reduce_dtype));
        char mesh_text[64] = "";
        if (ctx.mesh) snprintf(mesh_text, sizeof mesh_text, " (%d replicate x %d shard ranks)", mesh.replicate_size,
                               mesh.shard_size);
        printf("(model %s, %d units, %s%s%s%s, micro-batch %d x %d tokens per rank, data: %s)\n", model.config.name,
               model.unit_count, s.strategy, mesh_text, s.checkpointing ? ", activation checkpointing" : "",
               s.no_sync ? ", no_sync" : "", s.micro_batch, s.seq_len, loader.source);
        if (model.config.vocab_size > DATA_EOT + 1) printf("(%s: %zu tokens)\n", tokenizer_note, loader.token_count);
        fflush(stdout);
    }
    int first_step = s.resume != NULL && s.resume[0] != '\0' ? resume(&ctx, &s, &model, states, &loader) : 1;
    size_t measured_peak[MEM_CATEGORY_COUNT] = {0}, measured_total_peak = 0, measured_reserved_peak = 0;
    char diverged[1500] = "";
    if (first_step > s.steps && ctx.rank == 0)
        printf("nothing to train: the checkpoint is at step %d and STEPS=%d\n", first_step - 1, s.steps);
    int last_checkpoint = first_step - 1; /* 0: none */
    for (int step = first_step; step <= s.steps; step++) {
        mem_reset_peak(&ctx.mem);
        double start = MPI_Wtime(), loss_sum = 0.0;
        for (int micro = 0; micro < s.accumulation; micro++) {
            data_next_batch(&loader, tokens, targets);
            float loss = fsdp_forward_backward(&runtime, tokens, targets, s.micro_batch, s.seq_len,
                                               micro == s.accumulation - 1 ? FSDP_MICRO_BATCH_LAST
                                                                               : FSDP_MICRO_BATCH_ACCUMULATE);
            trace_step(&ctx.trace, step, micro, loss, ctx.mem.peak_bytes, ctx.mem.peak_reserved_bytes, MPI_Wtime() - start);
            loss_sum += loss;
        }
        if (step == 1 && s.grads != NULL && s.grads[0] != '\0') {
            /* GRADS is a diagnostic outside FSDP: it gathers every unit's gradient at once (<unit>.full_grad_padded,
             * in the trace) to write them; the step's peaks leave it out, so the memory table and Peak are the
             * training's, with or without GRADS */
            mem_peaks before = mem_peaks_now(&ctx.mem);
            if (pretrained_save_gradients(&model, s.grads) != 0) world_fatal(&ctx, "GRADS='%s': %s", s.grads, ctx.error);
            mem_peaks_restore(&ctx.mem, &before);
        }
        if (step == 1 && s.grads != NULL && s.grads[0] != '\0' && flat_param_mixed_precision_enabled(&options.mixed_precision))
            save_local_grad_l1(&ctx, &model, &options, s.grads);
        /* Divergence stops the run before the optimizer writes NaN into the parameters (and before SAVE). */
        double step_loss = loss_sum;
        world_allreduce(&ctx, &step_loss, 1, MPI_DOUBLE, MPI_SUM, "the step's loss");
        int bad_unit = adamw_first_nonfinite_gradient(&ctx, model.units, model.unit_count);
        if (!isfinite(step_loss) || bad_unit >= 0) {
            char kept[700] = "";
            if (last_checkpoint > 0)
                snprintf(kept, sizeof kept, "; the last checkpoint (step %d, under %s) is untouched: RESUME from it "
                         "with a lower LR", last_checkpoint, s.checkpoint_dir);
            snprintf(diverged, sizeof diverged, "step %d diverged: loss %g, %s%s%s; stopped before its optimizer step, "
                     "so the parameters are those after step %d%s%s", step, step_loss / s.accumulation / ctx.world_size,
                     bad_unit >= 0 ? "first non-finite gradient in unit '" : "every gradient finite",
                     bad_unit >= 0 ? model.units[bad_unit].unit : "", bad_unit >= 0 ? "'" : "", step - 1,
                     s.save && s.save[0] ? "; SAVE skipped: nothing was written" : "", kept);
            trace_mark(&ctx.trace, diverged);
            break;
        }
        if (s.clip > 0.0) adamw_clip_grad_norm(&ctx, model.units, model.unit_count, s.clip);
        for (int unit = 0; unit < model.unit_count; unit++) {
            adamw_step(&states[unit], &model.units[unit], &optimizer);
            flat_param_zero_grad(&model.units[unit]);
        }
        double elapsed = MPI_Wtime() - start;
        /* The step's loss: the mean over micro-batches and ranks (every rank saw a different slice). */
        /* PEAK=rss reports the process's max resident set instead of the tracked peak: the measure a PyTorch run can
         * be given too (scripts/train.sh FSDP=both), though it counts the program, libraries and MPI as well. */
        struct rusage usage;
        getrusage(RUSAGE_SELF, &usage);
        double peak = strcmp(s.peak, "rss") == 0 ? (double)usage.ru_maxrss * 1024.0 : (double)ctx.mem.peak_bytes;
        double loss = loss_sum / s.accumulation, slowest = elapsed;
        world_allreduce(&ctx, &loss, 1, MPI_DOUBLE, MPI_SUM, "the step's loss");
        world_allreduce(&ctx, &peak, 1, MPI_DOUBLE, MPI_MAX, "the step's peak");
        world_allreduce(&ctx, &slowest, 1, MPI_DOUBLE, MPI_MAX, "the step's time");
        loss /= ctx.world_size;
        trace_step(&ctx.trace, step, -1, loss, ctx.mem.peak_bytes, ctx.mem.peak_reserved_bytes, elapsed);
        for (int category = 0; category < MEM_CATEGORY_COUNT; category++)
            if (ctx.mem.category_peak_bytes[category] > measured_peak[category])
                measured_peak[category] = ctx.mem.category_peak_bytes[category];
        if (ctx.mem.peak_bytes > measured_total_peak) measured_total_peak = ctx.mem.peak_bytes;
        if (ctx.mem.peak_reserved_bytes > measured_reserved_peak) measured_reserved_peak = ctx.mem.peak_reserved_bytes;
        if (ctx.rank == 0) {
            printf("%d/%d: Loss = %.6f, Peak = %.1f MB, Time = %.4fs\n", step, s.steps, loss, peak / 1e6, slowest);
            fflush(stdout);
        }
        if (s.eval_every > 0 && step % s.eval_every == 0) print_story(&ctx, &model, tokenizer, s.seed + (uint64_t)step);
        if (s.checkpoint_every > 0 && (step % s.checkpoint_every == 0 || step == s.steps)) {
            save_checkpoint(&ctx, &s, &model, states, &loader, step);
            last_checkpoint = step;
        }
        if (step == s.kill_at_step && ctx.rank == s.kill_rank) {
            fprintf(stderr, "rank %d: KILL_AT_STEP=%d: killing myself with SIGKILL (fault injection)\n", ctx.rank, step);
            fflush(stderr);
            raise(SIGKILL);
        }
    }

    int steps_run = s.steps - first_step + 1;
    memory_prediction predicted;
    memory_model_predict(&predicted, &model, &options, ctx.world_size, s.micro_batch, s.seq_len,
                         loader.token_bytes, steps_run * s.accumulation);
    char report[4096];
    memory_model_report(&predicted, measured_peak, measured_total_peak, measured_reserved_peak, report, sizeof report);
    if (ctx.rank == 0 && steps_run > 0) printf("\n%s", report);
    if (s.offload && ctx.host_mem_ready) { /* the host pool's table (its peaks over the whole run) */
        memory_prediction host = memory_model_host_part(&predicted);
        memory_model_report(&host, ctx.host_mem.category_peak_bytes, ctx.host_mem.peak_bytes,
                            ctx.host_mem.peak_reserved_bytes, report, sizeof report);
        if (ctx.rank == 0 && steps_run > 0) printf("\nhost pool (CPU offload): %s", report);
    }

    if (diverged[0]) {
        if (ctx.rank == 0) fprintf(stderr, "05_full_step: error: %s (lower LR, or CLIP)\n", diverged);
    } else if (s.save != NULL && s.save[0] != '\0') {
        if (pretrained_save(&model, s.save) != 0) world_fatal(&ctx, "SAVE='%s': %s", s.save, ctx.error);
        if (ctx.rank == 0) printf("checkpoint: %s (config.json, model.safetensors)\n", s.save);
    }
    mem_free(offload_data_pool(&ctx), tokens);
    mem_free(offload_data_pool(&ctx), targets);
    data_loader_close(&loader);
    if (tokenizer != NULL) tok_free(tokenizer);
    free(tokenizer);
    for (int unit = 0; unit < model.unit_count; unit++) adamw_free(&states[unit]);
    free(states);
    fsdp_runtime_free(&runtime);
    qwen2_model_free(&model);
    if (ctx.mesh) group_mesh_free(&mesh);
    ctx.mesh = NULL;
    int status = session_close(&ctx);
    return diverged[0] ? 3 : status; /* the views are written either way: they load a diverged run */
}
