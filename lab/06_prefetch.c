/* lab 06 — prefetch and overlap: run the next unit's all-gather under this unit's compute, and pay for it in memory.
 *
 * What it teaches
 *   In lab 05 every collective blocks: the host waits for each all-gather before a unit computes and for each
 *   reduce-scatter after, so communication adds to the step. FSDP hides it with streams (core/comm/stream.h):
 *   collectives run on an all-gather stream and a reduce-scatter stream while the compute stream works, and the hooks
 *   *issue* a collective early and *wait* for it late. Which all-gather is issued early is FSDP1's prefetch policy:
 *     backward_prefetch=None           unit i's all-gather is issued in its own _pre_backward_hook: nothing to hide
 *                                      it under (the reduce-scatters still overlap: they run on their own stream)
 *     backward_prefetch=BACKWARD_PRE   in unit i's _pre_backward_hook, before i computes, issue unit i-1's: it runs
 *                                      under i's backward, so two units are unsharded at once (the memory price)
 *     backward_prefetch=BACKWARD_POST  in unit i's _post_backward_hook, after i resharded: under i's reduce-scatter
 *                                      only, and never two units' parameters at once
 *     forward_prefetch=True            in unit i's _pre_forward, issue unit i+1's (from the second forward on: the
 *                                      order comes from the first, as torch's _ExecOrderData)
 *     limit_all_gathers                the rate limiter: at most 2 unsharded buffers issued ahead of the frees the
 *                                      compute stream has done (torch's _FreeEventQueue). Here the compute stream is
 *                                      the host itself, so a free is done when recorded and the limiter never waits;
 *                                      on a GPU the host runs ahead of the compute stream and it binds.
 *   Prefetch changes *when*, never *what*: every mode computes the same losses and parameters, bit for bit.
 *
 * What to run (from the repository root; `make lab-NN` builds the lab, then launches it through the Makefile's MPIRUN,
 * which adds the flags mpirun needs as root (--allow-run-as-root) and for more ranks than cores (--oversubscribe))
 *   make lab-06                        every mode on the tiny model, 4 steps each, one table
 *   make lab-06 MODES=none,BACKWARD_PRE     some modes (blocking, none, BACKWARD_PRE, BACKWARD_POST, forward,
 *                                      no_limit)
 *   make lab-06 CONFIG=hidden_size=512,num_hidden_layers=8 SEQ=256    long: minutes on 2 cores; a bigger model,
 *                                      more to hide
 *   mpirun --allow-run-as-root --oversubscribe -np 2 lab/06_prefetch     the same by hand, after `make`
 *   env: MODEL, CONFIG, MBS, SEQ, STEPS, SEED, THREADS, OUT, NP (as lab 05; every setting: docs/reference.md)
 *
 * What to look at (runs/06_prefetch/trace.json in Perfetto UI; the modes run one after the other, marked)
 *   Per rank three tracks: compute, the all_gather stream and the reduce_scatter stream. In "blocking" they take
 *   turns. From "none" on, each reduce_scatter sits under the next layer's backward. With BACKWARD_PRE the next
 *   layer's all_gather sits under this layer's backward, and the `wait` slices (exposed communication: the compute
 *   stream blocked on a collective) shrink; in memory.html param_unsharded steps up to two units during backward.
 *
 * The check (`make check-06`): losses and parameters bit-identical across modes; with prefetch, all-gather spans
 * intersect compute spans and exposed comm < total comm; with a comm stream, compute runs while a collective is in
 * flight; blocking has no overlap at all and "none" no all-gather overlap; never more than 2 all-gathers in flight; the
 * measured peak of every category equals the memory model's prediction for the mode.
 */
#define _POSIX_C_SOURCE 200809L /* strtok_r */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/runtime/env.h"
#include "core/runtime/context.h"
#include "core/fsdp/fsdp.h"
#include "core/models/memory_model.h"
#include "trace/run.h"
#include "trace/summary.h"
#include "core/runtime/world.h"
#include "core/runtime/session.h"
#include "trainer.h"

typedef struct mode {
    const char *name;
    int comm_streams, forward_prefetch, limit_all_gathers;
    fsdp_backward_prefetch backward_prefetch;
} mode;

static const mode all_modes[] = {
    {"blocking", 0, 0, 1, BACKWARD_PREFETCH_NONE},
    {"none", 1, 0, 1, BACKWARD_PREFETCH_NONE},
    {"BACKWARD_PRE", 1, 0, 1, BACKWARD_PRE},
    {"BACKWARD_POST", 1, 0, 1, BACKWARD_POST},
    {"forward", 1, 1, 1, BACKWARD_PRE},
    {"no_limit", 1, 0, 0, BACKWARD_PRE},
};
enum { MODE_COUNT = sizeof all_modes / sizeof all_modes[0] };

typedef struct settings {
    int micro_batch, steps, seq_len;
    uint64_t seed;
    int selected[MODE_COUNT];
} settings;

typedef struct mode_result {
    double step_seconds;          /* mean over steps 2..STEPS (the first fills the allocator's cache) */
    double losses[64];
    uint64_t checksum;
    uint64_t limiter_waits;
} mode_result;

static settings read_settings(context *ctx);
static mode_result run_mode(context *ctx, const settings *s, const mode *m);
static void print_same_arithmetic(context *ctx, const settings *s, const mode_result *results);
static int print_table(const char *outdir, const settings *s, const mode_result *results);

int main(int argc, char **argv) {
    context ctx;
    session_open(&ctx, &argc, &argv, "06_prefetch", "runs/06_prefetch");
    settings s = read_settings(&ctx);
    if (ctx.rank == 0) {
        printf("Ranks = %d, lab 06: the same %d steps in each mode; the memory model per mode and rank first\n",
               ctx.world_size, s.steps);
        fflush(stdout);
    }
    /* The same steps in each mode, from the same parameters and batches: only when each collective is issued and
     * waited for differs. */
    mode_result results[MODE_COUNT] = {{0}};
    for (int m = 0; m < MODE_COUNT; m++)
        if (s.selected[m]) results[m] = run_mode(&ctx, &s, &all_modes[m]);
    print_same_arithmetic(&ctx, &s, results); /* prefetch changes when, never what */

    /* From the trace, once it is written: per mode the communication hidden under compute, and its memory price. */
    int rank = ctx.rank;
    char outdir[sizeof ctx.outdir];
    snprintf(outdir, sizeof outdir, "%s", ctx.outdir);
    int status = session_close(&ctx);
    if (rank == 0 && status == 0 && print_table(outdir, &s, results) != 0) status = 1;
    return status;
}

/* MBS, STEPS, SEQ, SEED, and MODES: the modes to run (every one when unset). */
static settings read_settings(context *ctx) {
    settings s = {
        .micro_batch = (int)env_int(ctx, "MBS", 4, 1, 4096),
        .steps = (int)env_int(ctx, "STEPS", 4, 2, 100000),
        .seq_len = (int)env_int(ctx, "SEQ", 128, 2, 32768),
        .seed = env_seed(ctx),
    };
    const char *modes = env_text(ctx, "MODES");
    char copy[256];
    snprintf(copy, sizeof copy, "%s", modes != NULL ? modes : "");
    if (copy[0] == '\0')
        for (int m = 0; m < MODE_COUNT; m++) s.selected[m] = 1; /* unset: every mode */
    for (char *save = NULL, *name = strtok_r(copy, ",", &save); name; name = strtok_r(NULL, ",", &save)) {
        int found = -1;
        for (int m = 0; m < MODE_COUNT; m++)
            if (strcmp(all_modes[m].name, name) == 0) found = m;
        if (found < 0)
            world_exit_all(ctx, 2, "MODES='%s': no mode '%s'; choose from blocking, none, BACKWARD_PRE, BACKWARD_POST, "
                         "forward, no_limit", modes, name);
        s.selected[found] = 1;
    }
    if (s.steps > 64) world_exit_all(ctx, 2, "STEPS='%d': lab 06 keeps at most 64 steps' losses per mode", s.steps);
    return s;
}

/* One mode: a fresh model from SEED, the same batches, STEPS AdamW steps, in a window of the trace. Prints the memory
 * model's table. */
static mode_result run_mode(context *ctx, const settings *s, const mode *m) {
    mode_result result = {0};
    fsdp_options options = fsdp_default_options();
    options.comm_streams = m->comm_streams;
    options.backward_prefetch = m->backward_prefetch;
    options.forward_prefetch = m->forward_prefetch;
    options.limit_all_gathers = m->limit_all_gathers;
    trainer t; /* refuses a run that cannot fit before it allocates (MEMORY_CHECK=0 skips it) */
    trainer_open_mode(&t, ctx, &options, s->micro_batch, s->seq_len, s->seed, s->steps);

    char text[128];
    snprintf(text, sizeof text, "lab 06 mode %s", m->name);
    trainer_begin_window(ctx, text);
    double timed = 0.0;
    for (int step = 1; step <= s->steps; step++) {
        double start = MPI_Wtime();
        float loss = trainer_forward_backward(&t, 0);
        trainer_optimizer_step(&t);
        double elapsed = MPI_Wtime() - start;
        world_allreduce(ctx, &elapsed, 1, MPI_DOUBLE, MPI_MAX, "the step time");
        if (step > 1) timed += elapsed;
        if (step <= 64) result.losses[step - 1] = loss;
        trace_step(&ctx->trace, step, -1, loss, ctx->mem.peak_bytes, ctx->mem.peak_reserved_bytes, elapsed);
    }
    trace_mark(&ctx->trace, "lab 06 mode end");
    result.step_seconds = timed / (s->steps - 1);
    result.checksum = trainer_shards_checksum(t.model.units, t.model.unit_count);
    result.limiter_waits = t.runtime.free_event_queue.waits;

    snprintf(text, sizeof text, "mode %s", m->name);
    trainer_print_memory_model(&t, text);
    trainer_close(&t);
    trainer_empty_caches(ctx); /* every mode starts from an empty cache */
    return result;
}

/* Same arithmetic in every mode: losses and parameter bits, per rank (printed for check-06 to compare). */
static void print_same_arithmetic(context *ctx, const settings *s, const mode_result *results) {
    char lines[8192];
    size_t used = 0;
    for (int m = 0; m < MODE_COUNT && used < sizeof lines; m++) {
        if (!s->selected[m]) continue;
        used += (size_t)snprintf(lines + used, sizeof lines - used, "rank %d mode %-14s parameters %016llx losses",
                                 ctx->rank, all_modes[m].name, (unsigned long long)results[m].checksum);
        for (int step = 0; step < s->steps && step < 64 && used < sizeof lines; step++)
            used += (size_t)snprintf(lines + used, sizeof lines - used, " %.9g", results[m].losses[step]);
        if (used < sizeof lines)
            used += (size_t)snprintf(lines + used, sizeof lines - used, " limiter_waits %llu\n",
                                     (unsigned long long)results[m].limiter_waits);
    }
    world_print_ordered(ctx, lines);
}

/* The window's allocated peak (the step events carry the peak since the mode began) and the units unsharded at it:
 * param_unsharded blocks live at the moment live bytes were highest (replayed from the window's alloc/free events;
 * a mode starts with none unsharded). */
static uint64_t window_peak(const run_rank *rank, size_t begin, size_t end) {
    uint64_t peak = 0;
    for (size_t i = begin; i < end; i++)
        if (rank->events[i].kind == RUN_STEP && rank->events[i].peak_bytes > peak) peak = rank->events[i].peak_bytes;
    return peak;
}

static int units_unsharded_at_peak(const run_rank *rank, size_t begin, size_t end) {
    int unsharded = -1;
    for (int c = 0; c < RUN_CATEGORY_COUNT; c++)
        if (strcmp(run_categories[c], "param_unsharded") == 0) unsharded = c;
    long long live = 0, peak = 0;
    int units = 0, units_at_peak = 0;
    for (size_t i = begin; i < end; i++) {
        const run_event *event = &rank->events[i];
        if (event->kind != RUN_ALLOC && event->kind != RUN_FREE) continue;
        int sign = event->kind == RUN_ALLOC ? 1 : -1;
        live += sign * (long long)event->bytes;
        if (event->category == unsharded) units += sign;
        if (live > peak) peak = live, units_at_peak = units;
    }
    return units_at_peak;
}

/* After the run: each mode's figures per rank, from the events between its marks (trace/summary.h's time figures:
 * comm = the comm streams' busy time, exposed = the compute stream blocked on them, overlap as HTA). */
static int print_table(const char *outdir, const settings *s, const mode_result *results) {
    trace_run run;
    char error[1024];
    if (run_load(&run, outdir, error, sizeof error) != 0) {
        fprintf(stderr, "06_prefetch: reading %s: %s\n", outdir, error);
        return -1;
    }
    printf("\nper mode and rank (step: mean of steps 2..%d, slowest rank; comm: time collectives ran; exposed: the "
           "compute stream blocked on them; overlap: comm under compute):\n", s->steps);
    printf("  %-14s %4s %8s %9s %9s %8s %9s %6s %8s %7s\n", "mode", "rank", "step ms", "comm ms", "exposed", "overlap",
           "peak MB", "units", "AG max", "limiter");
    int status = 0;
    for (int r = 0; r < run.world; r++) {
        const run_rank *rank = &run.ranks[r];
        for (size_t i = 0; i < rank->event_count; i++) {
            const run_event *mark = &rank->events[i];
            const char *text = mark->kind == RUN_MARK ? run_string(&run, mark->label) : "";
            if (strncmp(text, "lab 06 mode ", 12) != 0 || strcmp(text, "lab 06 mode end") == 0) continue;
            size_t end = i + 1;
            while (end < rank->event_count &&
                   !(rank->events[end].kind == RUN_MARK &&
                     strcmp(run_string(&run, rank->events[end].label), "lab 06 mode end") == 0))
                end++;
            int m = 0;
            while (m < MODE_COUNT && strcmp(all_modes[m].name, text + 12) != 0) m++;
            summary_time time;
            if (m == MODE_COUNT || summary_time_between(&run, rank, i + 1, end, &time) != 0) {
                fprintf(stderr, "06_prefetch: rank %d: no figures for '%s'\n", rank->rank, text);
                status = -1;
                continue;
            }
            printf("  %-14s %4d %8.2f %9.2f %9.2f %7.1f%% %9.2f %6d %8d %7llu\n", all_modes[m].name, rank->rank,
                   results[m].step_seconds * 1e3, time.comm / 1e3, time.exposed / 1e3,
                   time.comm > 0 ? 100.0 * time.overlap / time.comm : 0.0, (double)window_peak(rank, i + 1, end) / 1e6,
                   units_unsharded_at_peak(rank, i + 1, end), time.max_all_gathers_in_flight,
                   (unsigned long long)results[m].limiter_waits);
        }
    }
    run_free(&run);
    return status;
}
