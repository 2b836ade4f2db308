/* lab 03 — reduce-scatter: how FSDP averages gradients and keeps only its shard of the result.
 *
 * What it teaches
 *   Each rank ran backward on its own data, so each holds a different full gradient of the unit. Data parallelism
 *   needs their mean. DDP all-reduces: every rank ends with the whole mean gradient. FSDP only needs the part of the
 *   mean that matches its parameter shard (its optimizer updates only that), so it reduce-scatters: rank r receives
 *   chunk r of the sum, divided by the world size. Each rank then keeps 1/N of the gradient instead of all of it,
 *   and a ring reduce-scatter moves half the bytes of a ring all-reduce ((N-1)/N vs 2(N-1)/N of the gradient),
 *   because an all-reduce *is* a reduce-scatter followed by an all-gather.
 *
 * What to run (from the repository root; `make lab-NN` builds the lab, then launches it through the Makefile's MPIRUN,
 * which adds the flags mpirun needs as root (--allow-run-as-root) and for more ranks than cores (--oversubscribe))
 *   make lab-03                        then NP=4: the kept shard shrinks as 1/N
 *   make lab-03 NP=4 BW_MB=0           (BW_MB=0: no bandwidth table)
 *   mpirun --allow-run-as-root --oversubscribe -np 4 lab/03_reduce_scatter     the same by hand, after `make`
 *   env: OUT (default runs/03_reduce_scatter), SEED (default 1234), REPEAT (timed repetitions, default 5),
 *        BW_MB (largest buffer of the bandwidth table in MiB, default 64; 0 skips the table), NP (ranks, 2 to 8)
 *
 * What to look at
 *   The printed comparison of reduce_scatter and all_reduce: bytes sent, median time, and what each rank keeps. In
 *   the trace: the grad_unsharded band freed right after the reduce_scatter, leaving the small grad_shard; then the
 *   all_reduce for comparison and its full-size buffer that stays; then REPEAT timed pairs (unit "timing") on the
 *   comm track. The first collective of a run also pays for MPI's connection set-up, hence the repetitions.
 *   Last, the bandwidth table: all_gather and reduce_scatter of 1 MiB .. BW_MB buffers, each as "bus bandwidth" (the
 *   bytes this rank sends, (N-1)/N of the buffer, over the median time, NCCL's busbw) beside this machine's memcpy
 *   bandwidth for the same bytes, measured on every rank at once (the ranks share the memory bus, as in the
 *   collective). On one machine a collective is memory copies, so memcpy is its ceiling; a good one reaches half.
 *
 * The check (`make check-03`): each rank's gradient shard equals the mean over ranks of their full gradients,
 * restricted to its shard, and equals the matching slice of the all-reduced gradient.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/comm/comm.h"
#include "core/runtime/env.h"
#include "core/runtime/context.h"
#include "core/fsdp/flat_param.h"
#include "core/runtime/world.h"
#include "core/runtime/session.h"
#include "lesson_layer.h"

/* Rank r's gradient comes from its own "data": the same RNG with a per-rank seed. Any rank can recompute it. */
static flat_param_normal_init gradient_of_rank(uint64_t seed, int rank) {
    return (flat_param_normal_init){.seed = seed + 1000 + (uint64_t)rank, .std = 1.0f};
}

/* Largest |actual - expected| over the shard, expected = mean over ranks of their gradients (summed in double). */
static double max_error_vs_mean(context *ctx, const flat_param *fp, uint64_t seed, const float *actual) {
    size_t begin, end;
    flat_param_shard_range(fp, ctx->rank, &begin, &end);
    float *one_rank = mem_alloc(&ctx->mem, fp->sharded_numel * sizeof(float), MEM_WORKSPACE, "lab03.one_rank_grad");
    double *sum = (double *)mem_alloc(&ctx->mem, fp->sharded_numel * sizeof(double), MEM_WORKSPACE, "lab03.mean");
    for (int rank = 0; rank < ctx->world_size; rank++) {
        flat_param_normal_init gradient = gradient_of_rank(seed, rank);
        flat_param_fill_flat_range(fp, flat_param_fill_normal, &gradient, begin, end, one_rank);
        for (size_t i = 0; i < fp->sharded_numel; i++) sum[i] += one_rank[i];
    }
    double max_error = 0.0;
    for (size_t i = 0; i < fp->sharded_numel; i++) {
        double error = fabs((double)actual[i] - sum[i] / ctx->world_size);
        if (error > max_error) max_error = error;
    }
    mem_free(&ctx->mem, one_rank);
    mem_free(&ctx->mem, sum);
    return max_error;
}

/* Fills this rank's full (padded) gradient, as its backward would have. */
static void fill_my_full_gradient(const context *ctx, const flat_param *fp, uint64_t seed, float *full) {
    flat_param_normal_init gradient = gradient_of_rank(seed, ctx->rank);
    flat_param_fill_flat_range(fp, flat_param_fill_normal, &gradient, 0, fp->padded_unsharded_numel, full);
}

static void print_collective(const char *label, const trace_collective_info *info, double median_us,
                             size_t kept_bytes) {
    char sent[32], kept[32];
    printf("  %-15s %12s %10.3f ms %14s\n", label, mem_format_bytes(info->bytes_sent, sent, sizeof sent),
           median_us / 1000.0, mem_format_bytes(kept_bytes, kept, sizeof kept));
}

static int compare_doubles(const void *left, const void *right) {
    double a = *(const double *)left, b = *(const double *)right;
    return (a > b) - (a < b);
}

/* Median duration over `repeat` runs of reduce_scatter and of all_reduce on the same full gradient (rank 0's
 * clock; every rank takes part). */
static void time_both(context *ctx, const flat_param *fp, const float *gradient, int repeat, double *reduce_scatter_us,
                      double *all_reduce_us) {
    size_t full_count = fp->padded_unsharded_numel;
    float *shard = mem_alloc(&ctx->mem, fp->sharded_numel * sizeof(float), MEM_COMM_BUFFER, "lab03.timing_shard");
    float *full = mem_alloc(&ctx->mem, full_count * sizeof(float), MEM_COMM_BUFFER, "lab03.timing_full");
    double durations[2][64];
    for (int i = 0; i < repeat; i++) {
        COMM_CHECK(ctx, comm_reduce_scatter(ctx, gradient, shard, full_count, COMM_AVG, "timing"));
        durations[0][i] = ctx->last_collective.dur_us;
        memcpy(full, gradient, full_count * sizeof(float));
        COMM_CHECK(ctx, comm_all_reduce(ctx, full, full_count, COMM_AVG, "timing"));
        durations[1][i] = ctx->last_collective.dur_us;
    }
    qsort(durations[0], (size_t)repeat, sizeof(double), compare_doubles);
    qsort(durations[1], (size_t)repeat, sizeof(double), compare_doubles);
    *reduce_scatter_us = durations[0][repeat / 2];
    *all_reduce_us = durations[1][repeat / 2];
    mem_free(&ctx->mem, shard);
    mem_free(&ctx->mem, full);
}

static double median_of(double *values, int count) {
    qsort(values, (size_t)count, sizeof *values, compare_doubles);
    return values[count / 2];
}

/* Median seconds of copying `bytes` on every rank at once (a barrier lines them up), after one untimed copy that
 * touches both buffers. */
static double memcpy_seconds(context *ctx, size_t bytes, int repeat) {
    char *from = mem_alloc(&ctx->mem, bytes, MEM_WORKSPACE, "lab03.memcpy_from");
    char *to = mem_alloc(&ctx->mem, bytes, MEM_WORKSPACE, "lab03.memcpy_to");
    double seconds[64];
    memcpy(to, from, bytes);
    for (int i = 0; i < repeat; i++) {
        COMM_CHECK(ctx, comm_barrier(ctx, "bandwidth"));
        double start = trace_now_us(&ctx->trace);
        memcpy(to, from, bytes);
        seconds[i] = (trace_now_us(&ctx->trace) - start) * 1e-6;
    }
    mem_free(&ctx->mem, from);
    mem_free(&ctx->mem, to);
    return median_of(seconds, repeat);
}

/* One row per (buffer size, op): median time, bus bandwidth, memcpy bandwidth of the same bytes, and their ratio. */
static void bandwidth_table(context *ctx, int repeat, long largest_mib) {
    if (ctx->rank == 0)
        printf("\nbandwidth (rank 0; busbw = bytes sent / median time; memcpy of the same bytes on every rank at "
               "once)\n"
               "  %10s %-15s %10s %12s %12s %8s\n", "buffer", "op", "time ms", "busbw GB/s", "memcpy GB/s",
               "ratio");
    for (long mib = 1; mib <= largest_mib; mib *= 4) {
        size_t count = (size_t)mib * (1u << 20) / sizeof(float) / (size_t)ctx->world_size * (size_t)ctx->world_size;
        size_t shard_count = count / (size_t)ctx->world_size;
        float *full = mem_alloc(&ctx->mem, count * sizeof(float), MEM_COMM_BUFFER, "lab03.bandwidth_full");
        float *shard = mem_alloc(&ctx->mem, shard_count * sizeof(float), MEM_COMM_BUFFER, "lab03.bandwidth_shard");
        for (size_t i = 0; i < count; i++) full[i] = 1.0f;
        size_t sent = (count - shard_count) * sizeof(float);  /* (N-1)/N of the buffer, both ops */
        double copy = memcpy_seconds(ctx, sent, repeat);
        for (int op = 0; op < 2; op++) {
            double seconds[64];
            for (int i = -1; i < repeat; i++) {  /* i = -1: a warm-up, untimed */
                if (op == 0) COMM_CHECK(ctx, comm_all_gather(ctx, shard, full, count, "bandwidth"));
                else COMM_CHECK(ctx, comm_reduce_scatter(ctx, full, shard, count, COMM_SUM, "bandwidth"));
                if (i >= 0) seconds[i] = ctx->last_collective.dur_us * 1e-6;
            }
            double time = median_of(seconds, repeat);
            if (ctx->rank == 0) {
                char buffer[32];
                printf("  %10s %-15s %10.3f %12.2f %12.2f %7.0f%%\n",
                       mem_format_bytes(count * sizeof(float), buffer, sizeof buffer),
                       op == 0 ? "all_gather" : "reduce_scatter", time * 1e3, (double)sent / time / 1e9,
                       (double)sent / copy / 1e9, 100.0 * copy / time);
            }
        }
        mem_free(&ctx->mem, shard);
        mem_free(&ctx->mem, full);
    }
}

int main(int argc, char **argv) {
    context ctx;
    session_open(&ctx, &argc, &argv, "03_reduce_scatter", "runs/03_reduce_scatter");
    session_require_cpu(&ctx, "the gradients it fills and compares");
    world_require_size(&ctx, 2, 8);
    uint64_t seed = env_seed(&ctx);
    int repeat = (int)env_int(&ctx, "REPEAT", 5, 1, 64);
    long bandwidth_mib = env_int(&ctx, "BW_MB", 64, 0, 4096);
    /* float32 sums of N values of size ~1 in a different order than the double reference: far below 1e-5. */
    const double tolerance = 1e-5;

    flat_param fp;
    if (flat_param_init(&fp, &ctx, "layers.0", lesson_layer_params, LESSON_LAYER_PARAM_COUNT) != 0)
        world_fatal(&ctx, "%s", ctx.error);

    /* FSDP's way: full gradient → reduce-scatter (mean) → this rank's shard; the full gradient is freed. */
    trace_mark(&ctx.trace, "lab 03: backward produced a full gradient");
    fill_my_full_gradient(&ctx, &fp, seed, flat_param_alloc_full_grad(&fp));
    if (flat_param_reduce_scatter_grad(&fp, COMM_AVG) != 0) world_fatal(&ctx, "%s", ctx.error);
    trace_collective_info reduce_scatter = ctx.last_collective;
    double shard_error = max_error_vs_mean(&ctx, &fp, seed, fp.grad_shard);

    /* DDP's way, for comparison: all-reduce (mean) the full gradient; every rank keeps all of it. */
    trace_mark(&ctx.trace, "lab 03: the same gradient, all-reduced");
    float *all_reduced =
        mem_alloc(&ctx.mem, fp.padded_unsharded_numel * sizeof(float), MEM_GRAD_UNSHARDED, "lab03.all_reduced_grad");
    fill_my_full_gradient(&ctx, &fp, seed, all_reduced);
    COMM_CHECK(&ctx, comm_all_reduce(&ctx, all_reduced, fp.padded_unsharded_numel, COMM_AVG, "layers.0"));
    trace_collective_info all_reduce = ctx.last_collective;
    size_t begin, end;
    flat_param_shard_range(&fp, ctx.rank, &begin, &end);
    double slice_error = 0.0;
    for (size_t i = begin; i < end; i++)
        slice_error = fmax(slice_error, fabs((double)all_reduced[i] - (double)fp.grad_shard[i - begin]));

    double reduce_scatter_us, all_reduce_us;
    fill_my_full_gradient(&ctx, &fp, seed, all_reduced);
    time_both(&ctx, &fp, all_reduced, repeat, &reduce_scatter_us, &all_reduce_us);

    int mean_ok = world_all_true(&ctx, shard_error <= tolerance);
    int slice_ok = world_all_true(&ctx, slice_error <= tolerance);
    if (ctx.rank == 0) {
        char full_text[32];
        printf("lab 03 — reduce-scatter vs all-reduce of a %s gradient across %d ranks\n\n",
               mem_format_bytes(fp.padded_unsharded_numel * sizeof(float), full_text, sizeof full_text),
               ctx.world_size);
        printf("  %-15s %12s %13s %14s\n", "rank 0", "bytes sent", "median time", "grad kept");
        print_collective("reduce_scatter", &reduce_scatter, reduce_scatter_us, fp.sharded_numel * sizeof(float));
        print_collective("all_reduce", &all_reduce, all_reduce_us, fp.padded_unsharded_numel * sizeof(float));
        printf("\nreduce_scatter sends (N-1)/N and keeps 1/N of the gradient; all_reduce sends 2(N-1)/N and keeps "
               "all of it.\nbytes sent, all_reduce / reduce_scatter = %.2f\n\n",
               (double)all_reduce.bytes_sent / (double)reduce_scatter.bytes_sent);
        printf("check: grad shard == mean over ranks of their gradients, on its range (max error %.2e, all ranks): "
               "%s\n",
               shard_error, mean_ok ? "OK" : "MISMATCH");
        printf("check: grad shard == its slice of the all-reduced gradient (max error %.2e, all ranks): %s\n",
               slice_error, slice_ok ? "OK" : "MISMATCH");
    }
    mem_free(&ctx.mem, all_reduced);
    flat_param_free(&fp);
    bandwidth_table(&ctx, repeat, bandwidth_mib);
    int status = session_close(&ctx);
    return mean_ok && slice_ok ? status : 1;
}
