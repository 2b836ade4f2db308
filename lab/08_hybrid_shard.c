/* lab 08 — HYBRID_SHARD: shard inside a node, replicate across nodes; memory traded for traffic on the slow link.
 *
 * What it teaches
 *   FULL_SHARD spreads every unit over all W ranks: the least memory (shards of 1/W), but every all-gather and
 *   reduce-scatter is a ring through all of them, and on a cluster that ring crosses the links between nodes, which are
 *   several times slower than those inside one. HYBRID_SHARD (torch's ShardingStrategy.HYBRID_SHARD) lays the ranks out
 *   as a mesh (core/comm/group.h): shard groups of S ranks (a node), R = W / S of them, and replicate groups of the R
 *   ranks that hold the same shard, one per node.
 *     inside a shard group   FULL_SHARD as in lab 05: all-gather before forward and backward, reduce-scatter after
 *                            backward, shards of 1/S (S/W times FULL_SHARD's memory for parameters, gradients and
 *                            AdamW's moments)
 *     across the replicate   after each reduce-scatter, one all-reduce of the gradient shard (1/S of the unit)
 *     group                  among the R replicas: the only traffic between nodes, 2 (R-1)/R of a shard per rank
 *   Each collective divides by its group's size, so the gradient is the mean over all W ranks, as torch's
 *   pre- and post-divide factors make it. _HYBRID_SHARD_ZERO2 is SHARD_GRAD_OP inside the group: the unsharded
 *   parameters stay from forward to backward, one all-gather per unit per step instead of two.
 *   The lab runs the same steps as FULL_SHARD over all ranks, HYBRID_SHARD, _HYBRID_SHARD_ZERO2 and NO_SHARD (DDP:
 *   everything replicated, one all-reduce of every gradient), and prints per rank the bytes it sent inside its node
 *   and across nodes, and its memory.
 *
 * What to run (from the repository root; `make lab-NN` builds the lab, then launches it through the Makefile's MPIRUN,
 * which adds the flags mpirun needs as root (--allow-run-as-root) and for more ranks than cores (--oversubscribe))
 *   make lab-08 NP=4                   4 ranks as 2 pretend nodes of 2 (SHARD_GROUP=2 unless the machine
 *                                      really has several nodes)
 *   make lab-08 NP=4 SHARD_GROUP=1     shard groups of 1: HYBRID_SHARD becomes DDP (NO_SHARD)
 *   make lab-08 NP=4 SHARD_GROUP=4     one shard group: HYBRID_SHARD is FULL_SHARD, nothing crosses
 *   mpirun --allow-run-as-root --oversubscribe -np 4 lab/08_hybrid_shard     the same by hand, after `make`
 *   env: MODEL, CONFIG, MBS, SEQ, STEPS, SEED, THREADS, OUT, NP (as lab 05; every setting: docs/reference.md);
 *   SHARD_GROUP (ranks per shard group, a divisor of the world size; default the ranks per node, or half the ranks
 *   when all share one node)
 *
 * What to look at (runs/08_hybrid_shard/trace.json in Perfetto UI; the modes run one after the other, marked)
 *   In HYBRID_SHARD the collectives are named by group: "all_gather (shard)" and "reduce_scatter (shard)" with flow
 *   arrows only between the ranks of one shard group (0-1 and 2-3), and right after each reduce-scatter, on the same
 *   reduce_scatter stream, "all_reduce (replicate)" with arrows between the replicas (0-2, 1-3): each group its own
 *   colour. In FULL_SHARD every arrow joins all four ranks. The args of a slice give group, group_size, group_ranks.
 *
 * The check (`make check-08`): HYBRID_SHARD and _HYBRID_SHARD_ZERO2 train as 1 rank does (losses, gradients and
 * parameters within check-05's derived bounds); the bytes across groups are exactly the replicate all-reduces'
 * 2 (R-1)/R of each unit's shard; every collective runs in its group; the memory model equals the measured peak of
 * every category; PyTorch's HYBRID_SHARD on the same 2 x 2 mesh gives the same losses.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/runtime/env.h"
#include "core/runtime/context.h"
#include "core/fsdp/fsdp.h"
#include "core/comm/group.h"
#include "core/memory/mem.h"
#include "core/models/memory_model.h"
#include "trace/run.h"
#include "core/runtime/world.h"
#include "core/runtime/session.h"
#include "trainer.h"

static const fsdp_strategy modes[] = {FSDP_FULL_SHARD, FSDP_HYBRID_SHARD, FSDP_HYBRID_SHARD_ZERO2, FSDP_NO_SHARD};
enum { MODE_COUNT = sizeof modes / sizeof modes[0], MAX_STEPS = 64 };

typedef struct settings {
    int micro_batch, steps, seq_len, shard_group;
    uint64_t seed;
} settings;

typedef struct mode_result {
    double losses[MAX_STEPS];     /* mean over ranks */
    size_t measured[MEM_CATEGORY_COUNT];
    size_t predicted[MEM_CATEGORY_COUNT];
    size_t peak;
} mode_result;

static settings read_settings(context *ctx);
static void print_mesh(context *ctx, const settings *s, const group_mesh *mesh);
static mode_result run_mode(context *ctx, const settings *s, fsdp_strategy strategy, group_mesh *mesh);
static void print_losses(context *ctx, const settings *s, const mode_result *results);
static void print_memory(context *ctx, const mode_result *results);
static int print_traffic(const char *outdir, const settings *s);

int main(int argc, char **argv) {
    context ctx;
    session_open(&ctx, &argc, &argv, "08_hybrid_shard", "runs/08_hybrid_shard");
    world_require_size(&ctx, 2, 1024);
    settings s = read_settings(&ctx);
    group_mesh mesh; /* shard groups of SHARD_GROUP ranks (a node) x replicate groups (the ranks of one shard) */
    if (group_mesh_init(&mesh, &ctx, s.shard_group) != 0) world_exit_all(&ctx, 2, "SHARD_GROUP: %s", ctx.error);
    print_mesh(&ctx, &s, &mesh);

    /* The same steps under each strategy, from the same parameters and batches. */
    mode_result results[MODE_COUNT];
    for (int m = 0; m < MODE_COUNT; m++) results[m] = run_mode(&ctx, &s, modes[m], &mesh);
    print_losses(&ctx, &s, results); /* the same training in every mode */
    print_memory(&ctx, results);     /* what each rank keeps: shards of 1/S instead of 1/W */
    group_mesh_free(&mesh);

    /* From the trace, once it is written: what each rank sent inside its node and across nodes. */
    int rank = ctx.rank, world_size = ctx.world_size;
    char outdir[sizeof ctx.outdir];
    snprintf(outdir, sizeof outdir, "%s", ctx.outdir);
    int status = session_close(&ctx);
    if (rank == 0 && status == 0) {
        if (print_traffic(outdir, &s) != 0) status = 1;
        printf("\nthe lesson: HYBRID_SHARD keeps shards of 1/%d of each unit instead of FULL_SHARD's 1/%d (the "
               "'sharded' column), and in exchange only the all-reduce of the gradient shard crosses between nodes "
               "(the 'across nodes' column); NO_SHARD keeps everything and sends every gradient across.\n",
               s.shard_group, world_size);
    }
    return status;
}

/* SHARD_GROUP's default here: the ranks per node when there are several nodes, else half the ranks (the largest
 * proper divisor of the world size), so one machine shows two pretend nodes. Collective. */
static int default_shard_group(context *ctx) {
    int per_node = group_ranks_per_node(ctx);
    if (per_node > 0 && per_node < ctx->world_size && ctx->world_size % per_node == 0) return per_node;
    for (int divisor = 2; divisor <= ctx->world_size; divisor++)
        if (ctx->world_size % divisor == 0) return ctx->world_size / divisor;
    return 1;
}

/* MBS, STEPS, SEQ, SEED, and SHARD_GROUP (its default: default_shard_group). */
static settings read_settings(context *ctx) {
    settings s = {
        .micro_batch = (int)env_int(ctx, "MBS", 2, 1, 4096),
        .steps = (int)env_int(ctx, "STEPS", 3, 1, MAX_STEPS),
        .seq_len = (int)env_int(ctx, "SEQ", 128, 2, 32768),
        .seed = env_seed(ctx),
    };
    s.shard_group = group_shard_size_from_env(ctx, default_shard_group(ctx), 1);
    return s;
}

/* The mesh: rank 0 says its shape, then every rank its shard group and replicate group, in rank order. */
static void print_mesh(context *ctx, const settings *s, const group_mesh *mesh) {
    if (ctx->rank == 0) {
        printf("Ranks = %d as %d shard groups of %d (HYBRID_SHARD's mesh: replicate x shard = %d x %d), %d steps per "
               "mode, micro-batch %d x %d tokens per rank\n", ctx->world_size, mesh->replicate_size, mesh->shard_size,
               mesh->replicate_size, mesh->shard_size, s->steps, s->micro_batch, s->seq_len);
        fflush(stdout);
    }
    char groups[256];
    snprintf(groups, sizeof groups, "rank %d: shard group %d (ranks %s), ", ctx->rank, mesh->shard.index,
             group_ranks_text(&mesh->shard, (char[96]){0}, 96));
    snprintf(groups + strlen(groups), sizeof groups - strlen(groups), "replicate group %d (ranks %s)\n",
             mesh->replicate.index, group_ranks_text(&mesh->replicate, (char[96]){0}, 96));
    world_print_ordered(ctx, groups);
}

/* One mode: a fresh model from SEED, the same batches, STEPS AdamW steps, between two marks in the trace. */
static mode_result run_mode(context *ctx, const settings *s, fsdp_strategy strategy, group_mesh *mesh) {
    mode_result result;
    memset(&result, 0, sizeof result);
    ctx->mesh = fsdp_strategy_is_hybrid(strategy) ? mesh : NULL; /* the units are sharded over its shard group */
    fsdp_options options = fsdp_default_options(); /* torch's: comm streams, BACKWARD_PRE, limit_all_gathers */
    options.strategy = strategy;
    trainer t;
    trainer_open_mode(&t, ctx, &options, s->micro_batch, s->seq_len, s->seed, s->steps);

    char text[128];
    snprintf(text, sizeof text, "lab 08 mode %s", fsdp_strategy_name(strategy));
    trainer_begin_window(ctx, text);
    for (int step = 1; step <= s->steps; step++) {
        double start = MPI_Wtime();
        double loss = trainer_forward_backward(&t, 0);
        trainer_optimizer_step(&t);
        trace_step(&ctx->trace, step, -1, loss, ctx->mem.peak_bytes, ctx->mem.peak_reserved_bytes,
                   MPI_Wtime() - start);
        world_allreduce(ctx, &loss, 1, MPI_DOUBLE, MPI_SUM, "the step's loss");
        result.losses[step - 1] = loss / ctx->world_size;
    }
    trace_mark(&ctx->trace, "lab 08 mode end");
    for (int category = 0; category < MEM_CATEGORY_COUNT; category++)
        result.measured[category] = ctx->mem.category_peak_bytes[category];
    result.peak = ctx->mem.peak_bytes;
    memory_prediction predicted;
    trainer_predict_memory(&t, &predicted);
    memcpy(result.predicted, predicted.category_peak, sizeof result.predicted);
    trainer_close(&t);
    trainer_empty_caches(ctx); /* every mode starts from an empty cache */
    ctx->mesh = NULL;
    return result;
}

/* Rank 0: each mode's losses, step by step (mean over ranks). */
static void print_losses(context *ctx, const settings *s, const mode_result *results) {
    if (ctx->rank != 0) return;
    printf("\nloss per step (mean over ranks; the same training in every mode, up to float rounding):\n");
    for (int m = 0; m < MODE_COUNT; m++) {
        printf("  %-20s", fsdp_strategy_name(modes[m]));
        for (int step = 0; step < s->steps; step++) printf(" %.6f", results[m].losses[step]);
        printf("\n");
    }
    fflush(stdout);
}

/* Memory per rank: the sharded state (parameters, gradients, AdamW's moments), the unsharded buffers, the peak, and
 * whether the memory model predicted every category to the byte. */
static void print_memory(context *ctx, const mode_result *results) {
    char block[2048];
    size_t used = 0;
    for (int m = 0; m < MODE_COUNT; m++) {
        const mode_result *r = &results[m];
        size_t sharded = r->measured[MEM_PARAM_SHARD] + r->measured[MEM_GRAD_SHARD] + r->measured[MEM_OPTIM_STATE];
        size_t unsharded = r->measured[MEM_PARAM_UNSHARDED] + r->measured[MEM_GRAD_UNSHARDED];
        long long off = 0;
        for (int category = 0; category < MEM_CATEGORY_COUNT; category++)
            off += llabs((long long)r->measured[category] - (long long)r->predicted[category]);
        char model_text[64];
        if (off == 0) snprintf(model_text, sizeof model_text, "exact");
        else snprintf(model_text, sizeof model_text, "off by %lld B", off);
        used += (size_t)snprintf(block + used, sizeof block - used, "  %-20s %4d %12.2f %12.2f %10.2f   %s\n",
                                 fsdp_strategy_name(modes[m]), ctx->rank, (double)sharded / 1e6,
                                 (double)unsharded / 1e6, (double)r->peak / 1e6, model_text);
        if (used >= sizeof block) break;
    }
    if (ctx->rank == 0) {
        printf("\nmemory per rank (MB; sharded = param + grad shards + AdamW moments; unsharded = the gathered "
               "parameters and full gradients at their peaks; memory model = predicted vs measured, every category):\n"
               "  %-20s %4s %12s %12s %10s   %s\n", "mode", "rank", "sharded", "unsharded", "peak", "memory model");
        fflush(stdout);
    }
    world_print_ordered(ctx, block);
}

/* The traffic of each mode's window, per rank, from the events: what it sent in each group, and what of it crossed
 * between nodes (node = the block of SHARD_GROUP consecutive ranks a shard group is). Under a ring each member sends
 * to the next member of its group, so its bytes_sent cross when that neighbour is on another node. */
static int print_traffic(const char *outdir, const settings *s) {
    trace_run run;
    char error[1024];
    if (run_load(&run, outdir, error, sizeof error) != 0) {
        fprintf(stderr, "08_hybrid_shard: reading %s: %s\n", outdir, error);
        return -1;
    }
    printf("\nbytes each rank sent per step (MB; node = %d consecutive ranks; a ring sends to the next rank of its "
           "group, across when that rank is on another node):\n", s->shard_group);
    printf("  %-20s %4s %9s %9s %11s %13s %13s\n", "mode", "rank", "world", "shard", "replicate", "inside node",
           "across nodes");
    double total_across[MODE_COUNT] = {0}, most_across[MODE_COUNT] = {0};
    for (int m = 0; m < MODE_COUNT; m++) {
        char wanted[64];
        snprintf(wanted, sizeof wanted, "lab 08 mode %s", fsdp_strategy_name(modes[m]));
        for (int r = 0; r < run.world; r++) {
            const run_rank *rank = &run.ranks[r];
            double world = 0, shard = 0, replicate = 0, inside = 0, across = 0;
            int inside_window = 0;
            for (size_t i = 0; i < rank->event_count; i++) {
                const run_event *event = &rank->events[i];
                if (event->kind == RUN_MARK) {
                    const char *text = run_string(&run, event->label);
                    if (strcmp(text, wanted) == 0) inside_window = 1;
                    else if (strcmp(text, "lab 08 mode end") == 0) inside_window = 0;
                    continue;
                }
                if (!inside_window || event->kind != RUN_COLLECTIVE) continue;
                const char *group = event->group == RUN_NONE ? "world" : run_string(&run, event->group);
                double bytes = (double)event->bytes_sent;
                if (strcmp(group, "shard") == 0) shard += bytes;
                else if (strcmp(group, "replicate") == 0) replicate += bytes;
                else world += bytes;
                /* the next member of the ring: group_ranks in order (world: every rank) */
                int next = (r + 1) % run.world;
                if (event->group_ranks != RUN_NONE) {
                    const char *members = run_string(&run, event->group_ranks);
                    int list[1024], count = 0;
                    for (const char *p = members; *p && count < 1024;) {
                        char *end = NULL;
                        list[count++] = (int)strtol(p, &end, 10);
                        p = *end == ',' ? end + 1 : end;
                    }
                    for (int k = 0; k < count; k++)
                        if (list[k] == r) next = list[(k + 1) % count];
                }
                if (next / s->shard_group == r / s->shard_group) inside += bytes;
                else across += bytes;
            }
            printf("  %-20s %4d %9.3f %9.3f %11.3f %13.3f %13.3f\n", fsdp_strategy_name(modes[m]), r,
                   world / s->steps / 1e6, shard / s->steps / 1e6, replicate / s->steps / 1e6,
                   inside / s->steps / 1e6, across / s->steps / 1e6);
            total_across[m] += across / s->steps;
            if (across / s->steps > most_across[m]) most_across[m] = across / s->steps;
        }
    }
    printf("\nacross nodes per step (MB): all ranks together, and the most one rank sends (its link sets the pace):\n");
    for (int m = 0; m < MODE_COUNT; m++)
        printf("  %-20s %9.3f total %9.3f most\n", fsdp_strategy_name(modes[m]), total_across[m] / 1e6,
               most_across[m] / 1e6);
    run_free(&run);
    return 0;
}
