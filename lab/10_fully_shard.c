/* lab 10 — FSDP2 (fully_shard): every parameter sharded on dim 0, side by side with FSDP1's FlatParameter.
 *
 * What it teaches
 *   PyTorch's FSDP2 (torch.distributed.fsdp.fully_shard) drops the FlatParameter of labs 01-05. Each parameter is
 *   sharded on its first dimension (a DTensor with placement Shard(0)): rank r holds whole rows [r c, min(d0, (r+1) c))
 *   with c = ceil(d0 / W), padded with zero rows to c, so a rank's shard of a parameter is a tensor of its own,
 *   never a cut through the middle of one. The price is padding per parameter instead of per unit (up to W - 1 rows of
 *   each; a parameter of fewer rows than ranks leaves the last ranks padding only) and two copies per collective: the
 *   all-gather writes every rank's padded rows into one rank-major buffer ([r0: p0|p1|..][r1: p0|p1|..], torch's
 *   all_gather_output) which is then copied out into each parameter's own buffer (split_with_sizes_copy); the
 *   gradient is copied into the same rank-major layout (foreach_reduce's copy-in) before its reduce-scatter. The
 *   runtime is lab 05's, only the layout changes (core/fsdp/flat_param.h, FLAT_PARAM_ROWS): `make lab-05
 *   FSDP_VERSION=2` trains with it, bit for bit as FSDP1 on 2 ranks.
 *
 * What to run (from the repository root; `make lab-NN` builds the lab, then launches it through the Makefile's MPIRUN,
 * which adds the flags mpirun needs as root (--allow-run-as-root) and for more ranks than cores (--oversubscribe))
 *   make lab-10 NP=3                   one small decoder layer on 3 ranks: padding everywhere, k/v on two ranks only
 *   make lab-10                        2 ranks; then NP=4: watch c, the padding rows and the buffers change
 *   make lab-05 FSDP_VERSION=2         lab 05's training with per-parameter shards (STRATEGY=SHARD_GRAD_OP is
 *                                      fully_shard's reshard_after_forward=False)
 *   make lab-05 NP=3 FSDP_VERSION=2 COMM_STREAMS=1 FORWARD_PREFETCH_MODULES=2 BACKWARD_PREFETCH_MODULES=2
 *                                      FSDP2's explicit prefetch lists (set_modules_to_forward_prefetch), and each
 *                                      all-gather output kept until the next layer's copy-out (memory.html)
 *   mpirun --allow-run-as-root --oversubscribe -np 3 lab/10_fully_shard     the same by hand, after `make`
 *   env: OUT (output dir, default runs/10_fully_shard), SEED (the values; default 1234), NP (ranks, 2 to 8)
 *
 * What to look at
 *   The two tables: FSDP1's flat chunks cutting through parameters ("<- split across ranks") beside FSDP2's rows of
 *   every parameter on every rank, and where the padding goes (the unit's end; each parameter's last rows). Then the
 *   buffers and the bytes each collective moves, and the memory of one step of each: FSDP2's all-gather buffer and
 *   the unsharded parameters are alive together during the copy-out. In the trace (runs/10_fully_shard/trace.json,
 *   Perfetto UI): per rank two windows; in FSDP2's, layers.0.fsdp2.all_gather_output allocated at the all_gather and
 *   freed inside the all_gather_copy_out span, after _full_param_padded appeared; reduce_scatter_input likewise
 *   around the reduce_scatter_copy_in span.
 *
 * The check (`make check-10`): each rank's shard of every parameter equals the rows [r c, min(d0, (r+1) c)) of the
 * full parameter byte for byte, padding rows zero, at 2, 3 and 4 ranks (tests/check_lab10.py, from the shapes
 * alone); the all-gather moves W x sum_p c_p row_p floats (FSDP1: the padded unit) in the trace; unshard, mean and
 * the measured memory per category are exact, here; lab 05 with FSDP_VERSION=2 trains bit for bit as FSDP1 at 2
 * ranks, within check-05's bounds at 3 and 4, its memory model exact, its checkpoints written with no collective.
 */
#include <stdio.h>
#include <string.h>

#include "core/comm/comm.h"
#include "core/runtime/env.h"
#include "core/runtime/context.h"
#include "core/fsdp/flat_param.h"
#include "core/runtime/world.h"
#include "core/runtime/session.h"

/* One Qwen2-style decoder layer, small enough to print: hidden 8, 2 query heads and 1 key/value head of 4, MLP 20.
 * 704 floats: FSDP1 pads the unit to a multiple of W; FSDP2 pads each parameter to a multiple of W rows. */
static const flat_param_tensor_spec layer_params[] = {
    {"layers.0.input_layernorm.weight", 1, {8}},
    {"layers.0.self_attn.q_proj.weight", 2, {8, 8}},
    {"layers.0.self_attn.q_proj.bias", 1, {8}},
    {"layers.0.self_attn.k_proj.weight", 2, {4, 8}},
    {"layers.0.self_attn.k_proj.bias", 1, {4}},
    {"layers.0.self_attn.v_proj.weight", 2, {4, 8}},
    {"layers.0.self_attn.v_proj.bias", 1, {4}},
    {"layers.0.self_attn.o_proj.weight", 2, {8, 8}},
    {"layers.0.post_attention_layernorm.weight", 1, {8}},
    {"layers.0.mlp.gate_proj.weight", 2, {20, 8}},
    {"layers.0.mlp.up_proj.weight", 2, {20, 8}},
    {"layers.0.mlp.down_proj.weight", 2, {8, 20}},
};
#define LAYER_PARAM_COUNT ((int)(sizeof layer_params / sizeof layer_params[0]))

#define APPEND(buffer, ...) snprintf((buffer) + strlen(buffer), sizeof(buffer) - strlen(buffer), __VA_ARGS__)

/* What one version's step cost: bytes per collective and the step's peaks per category (this rank). */
typedef struct step_cost {
    uint64_t all_gather_bytes, reduce_scatter_bytes;
    size_t param_unsharded_peak, grad_unsharded_peak, peak;
    int exact; /* every view, every gradient element and every peak as expected */
} step_cost;

static void print_shards(context *ctx, const flat_param *fsdp1, const flat_param *fsdp2) {
    char report[8192] = "";
    size_t begin, end;
    flat_param_shard_range(fsdp1, ctx->rank, &begin, &end);
    APPEND(report, "rank %d — FSDP1: flat [%zu, %zu) of the unit's %zu (padded %zu)\n", ctx->rank, begin, end,
           fsdp1->unpadded_numel, fsdp1->padded_unsharded_numel);
    for (int i = 0; i < fsdp1->param_count; i++) {
        size_t first, last;
        if (!flat_param_param_shard_overlap(fsdp1, i, ctx->rank, &first, &last)) continue;
        APPEND(report, "    %-42s elements [%zu, %zu) of %zu%s\n", fsdp1->params[i].name, first, last,
               fsdp1->params[i].numel, last - first < fsdp1->params[i].numel ? "   <- split across ranks" : "");
    }
    APPEND(report, "rank %d — FSDP2: %zu floats, its rows of every parameter\n", ctx->rank, fsdp2->sharded_numel);
    for (int i = 0; i < fsdp2->param_count; i++) {
        const flat_param_param_info *info = &fsdp2->params[i];
        size_t first, last;
        flat_param_param_shard_overlap(fsdp2, i, ctx->rank, &first, &last);
        size_t rows = (last - first) / info->row_numel, padding = info->shard_rows - rows;
        APPEND(report, "    %-42s rows [%zu, %zu) of %lld", info->name, first / info->row_numel,
               last / info->row_numel, (long long)info->shape[0]);
        if (padding > 0) APPEND(report, " + %zu padding row%s", padding, padding == 1 ? "" : "s");
        APPEND(report, "%s\n", rows == 0 ? "   <- no rows here" : "");
    }
    world_print_ordered(ctx, report);
}

static void print_layout(const context *ctx, const flat_param *fsdp2) {
    if (ctx->rank != 0) return;
    int world = ctx->world_size;
    printf("lab 10 — FSDP2 (fully_shard) beside FSDP1, one decoder layer on %d ranks\n\n", world);
    printf("  %-42s %-8s  c = ceil(d0/%d)  padded rows per parameter\n", "parameter", "shape", world);
    for (int i = 0; i < fsdp2->param_count; i++) {
        const flat_param_param_info *info = &fsdp2->params[i];
        char shape[32];
        snprintf(shape, sizeof shape, info->ndim == 1 ? "[%lld]" : "[%lld, %lld]", (long long)info->shape[0],
                 (long long)info->shape[info->ndim - 1]);
        printf("  %-42s %-8s  %15zu  %zu\n", info->name, shape, info->shard_rows,
               info->shard_rows * (size_t)world - (size_t)info->shape[0]);
    }
    printf("\n");
    fflush(stdout);
}

/* The shard FSDP2 must hold, written for tests/check_lab10.py to compare with the full parameters it recomputes the
 * rows of: OUT/fsdp2_shard_rank<r>.bin (this rank's local shard, float32), and from rank 0 OUT/layer.json (names
 * and shapes in registration order, W) and OUT/full_params.bin (every parameter whole, in that order). */
static void write_layout_files(context *ctx, const flat_param *fsdp2, flat_param_normal_init *init) {
    char path[700];
    snprintf(path, sizeof path, "%s/fsdp2_shard_rank%d.bin", ctx->outdir, ctx->rank);
    FILE *file = fopen(path, "wb");
    if (file == NULL || fwrite(fsdp2->local_shard, sizeof(float), fsdp2->sharded_numel, file) != fsdp2->sharded_numel
        || fclose(file) != 0)
        world_fatal(ctx, "cannot write %s", path);
    if (ctx->rank != 0) return;
    snprintf(path, sizeof path, "%s/full_params.bin", ctx->outdir);
    file = fopen(path, "wb");
    if (file == NULL) world_fatal(ctx, "cannot write %s", path);
    for (int i = 0; i < fsdp2->param_count; i++) {
        const flat_param_param_info *info = &fsdp2->params[i];
        float *full = mem_alloc(&ctx->mem, info->numel * sizeof(float), MEM_WORKSPACE, "lab10.full_param");
        flat_param_fill_normal(info->name, 0, info->numel, full, init);
        if (fwrite(full, sizeof(float), info->numel, file) != info->numel) world_fatal(ctx, "cannot write %s", path);
        mem_free(&ctx->mem, full);
    }
    if (fclose(file) != 0) world_fatal(ctx, "cannot write %s", path);
    snprintf(path, sizeof path, "%s/layer.json", ctx->outdir);
    file = fopen(path, "w");
    if (file == NULL) world_fatal(ctx, "cannot write %s", path);
    fprintf(file, "{\"world\": %d, \"params\": [", ctx->world_size);
    for (int i = 0; i < fsdp2->param_count; i++) {
        const flat_param_param_info *info = &fsdp2->params[i];
        fprintf(file, "%s\n  {\"name\": \"%s\", \"shape\": [%lld", i ? "," : "", info->name, (long long)info->shape[0]);
        for (int d = 1; d < info->ndim; d++) fprintf(file, ", %lld", (long long)info->shape[d]);
        fprintf(file, "]}");
    }
    fprintf(file, "\n]}\n");
    if (fclose(file) != 0) world_fatal(ctx, "cannot write %s", path);
}

/* A gradient of small integers, (index mod 7) + rank: every sum over ranks is exact in float32 in any order, so the
 * mean is sum x (1/W) exactly as the reduce-scatter computes it, whatever the layout. */
static float gradient_value(size_t index, int rank) { return (float)(index % 7 + (size_t)rank); }

/* This rank's expected gradient shard: the mean of every rank's gradient at its elements, 0 in the padding. */
static void expected_grad_shard(const context *ctx, const flat_param *fp, float *out) {
    memset(out, 0, fp->sharded_numel * sizeof *out);
    float factor = 1.0f / (float)ctx->world_size;
    for (int i = 0; i < fp->param_count; i++) {
        size_t first, last, at = flat_param_param_shard_offset(fp, i, ctx->rank);
        if (!flat_param_param_shard_overlap(fp, i, ctx->rank, &first, &last)) continue;
        for (size_t k = first; k < last; k++) {
            float sum = 0.0f;
            for (int rank = 0; rank < ctx->world_size; rank++) sum += gradient_value(k, rank);
            out[at + k - first] = sum * factor;
        }
    }
}

/* One step's worth of FSDP for a unit: unshard (views checked against the originals), reshard, a gradient
 * reduce-scattered (its mean checked); the collectives' bytes and the step's peaks per category. */
static step_cost run_step(context *ctx, flat_param *fp, flat_param_normal_init *init, const char *label) {
    step_cost cost = {.exact = 1};
    WORLD_MPI(ctx, MPI_Barrier(ctx->comm));
    trace_mark(&ctx->trace, label);
    mem_reset_peak(&ctx->mem);
    if (flat_param_unshard(fp, "_pre_forward") != 0) world_fatal(ctx, "%s", ctx->error);
    cost.all_gather_bytes = ctx->last_collective.bytes;
    for (int i = 0; i < fp->param_count; i++) {
        const flat_param_param_info *info = &fp->params[i];
        float *expected = mem_alloc(&ctx->mem, info->numel * sizeof(float), MEM_WORKSPACE, "lab10.expected");
        flat_param_fill_normal(info->name, 0, info->numel, expected, init);
        if (memcmp(flat_param_param_view(fp, info->name), expected, info->numel * sizeof(float)) != 0) {
            fprintf(stderr, "rank %d: unit '%s': unsharded '%s' differs from the original\n", ctx->rank, fp->unit,
                    info->name);
            cost.exact = 0;
        }
        mem_free(&ctx->mem, expected);
    }
    flat_param_reshard(fp, "_post_forward");
    flat_param_alloc_full_grad(fp);
    for (int i = 0; i < fp->param_count; i++) {
        float *grad = flat_param_grad_view(fp, fp->params[i].name);
        for (size_t k = 0; k < fp->params[i].numel; k++) grad[k] = gradient_value(k, ctx->rank);
    }
    if (flat_param_reduce_scatter_grad(fp, COMM_AVG) != 0) world_fatal(ctx, "%s", ctx->error);
    cost.reduce_scatter_bytes = ctx->last_collective.bytes;
    cost.param_unsharded_peak = ctx->mem.category_peak_bytes[MEM_PARAM_UNSHARDED];
    cost.grad_unsharded_peak = ctx->mem.category_peak_bytes[MEM_GRAD_UNSHARDED];
    cost.peak = ctx->mem.peak_bytes;
    float *expected = mem_alloc(&ctx->mem, fp->sharded_numel * sizeof(float), MEM_WORKSPACE, "lab10.expected_grad");
    expected_grad_shard(ctx, fp, expected);
    if (memcmp(expected, fp->grad_shard, fp->sharded_numel * sizeof(float)) != 0) {
        fprintf(stderr, "rank %d: unit '%s': the reduce-scattered gradient shard is not the mean, 0 in the padding\n",
                ctx->rank, fp->unit);
        cost.exact = 0;
    }
    mem_free(&ctx->mem, expected);
    flat_param_zero_grad(fp);
    /* The peaks each layout must reach, to the byte. FSDP1: the padded unit, unsharded, once for the parameters and
     * once for the gradient. FSDP2: the rank-major buffer (padded) and the unpadded parameters together during the
     * copy-out; the unpadded gradient and the rank-major reduce_scatter_input together during the copy-in. */
    size_t padded = fp->padded_unsharded_numel * sizeof(float), full = fp->full_numel * sizeof(float);
    size_t expected_peak = fp->layout == FLAT_PARAM_ROWS ? padded + full : padded;
    if (cost.param_unsharded_peak != expected_peak || cost.grad_unsharded_peak != expected_peak) {
        fprintf(stderr, "rank %d: unit '%s': peaks param_unsharded %zu B, grad_unsharded %zu B; expected %zu B each\n",
                ctx->rank, fp->unit, cost.param_unsharded_peak, cost.grad_unsharded_peak, expected_peak);
        cost.exact = 0;
    }
    return cost;
}

static void print_costs(const context *ctx, const flat_param *fsdp1, const flat_param *fsdp2, const step_cost *one,
                        const step_cost *two) {
    if (ctx->rank != 0) return;
    int world = ctx->world_size;
    printf("\nbuffers (floats)                    FSDP1                      FSDP2\n");
    printf("  local shard                       %-26zu %zu (sum of c x row over the parameters)\n",
           fsdp1->sharded_numel, fsdp2->sharded_numel);
    printf("  all-gather output                 %-26s %zu (rank-major, %d x %zu)\n", "(the unsharded buffer)",
           fsdp2->padded_unsharded_numel, world, fsdp2->sharded_numel);
    printf("  unsharded parameters              %-26zu %zu (each parameter unpadded)\n",
           fsdp1->padded_unsharded_numel, fsdp2->full_numel);
    printf("  padding                           %-26zu %zu\n", fsdp1->pad_numel, fsdp2->pad_numel);
    printf("\nbytes per collective                FSDP1                      FSDP2\n");
    printf("  all_gather                        %-26llu %llu\n", (unsigned long long)one->all_gather_bytes,
           (unsigned long long)two->all_gather_bytes);
    printf("  reduce_scatter                    %-26llu %llu\n", (unsigned long long)one->reduce_scatter_bytes,
           (unsigned long long)two->reduce_scatter_bytes);
    printf("\nmemory of one step, rank 0 (bytes) FSDP1                      FSDP2\n");
    printf("  param_unsharded peak              %-26zu %zu (all_gather_output + parameters at the copy-out)\n",
           one->param_unsharded_peak, two->param_unsharded_peak);
    printf("  grad_unsharded peak               %-26zu %zu (gradient + reduce_scatter_input at the copy-in)\n",
           one->grad_unsharded_peak, two->grad_unsharded_peak);
    printf("  live peak                         %-26zu %zu\n", one->peak, two->peak);
    fflush(stdout);
}

int main(int argc, char **argv) {
    context ctx;
    session_open(&ctx, &argc, &argv, "10_fully_shard", "runs/10_fully_shard");
    session_require_cpu(&ctx, "the parameters' layout it writes");
    world_require_size(&ctx, 2, 8);
    flat_param_normal_init init = {.seed = env_seed(&ctx), .std = 1.0f};

    /* The same layer twice: FSDP1's FlatParameter, and (ctx.per_parameter_sharding) FSDP2's rows. Every rank fills
     * only what it holds, from (seed, name, index). */
    flat_param fsdp1, fsdp2;
    if (flat_param_init(&fsdp1, &ctx, "layers.0.fsdp1", layer_params, LAYER_PARAM_COUNT) != 0)
        world_fatal(&ctx, "%s", ctx.error);
    ctx.per_parameter_sharding = 1;
    if (flat_param_init(&fsdp2, &ctx, "layers.0.fsdp2", layer_params, LAYER_PARAM_COUNT) != 0)
        world_fatal(&ctx, "%s", ctx.error);
    ctx.per_parameter_sharding = 0;
    flat_param_fill_local_shard(&fsdp1, flat_param_fill_normal, &init);
    flat_param_fill_local_shard(&fsdp2, flat_param_fill_normal, &init);

    print_layout(&ctx, &fsdp2);
    print_shards(&ctx, &fsdp1, &fsdp2);
    write_layout_files(&ctx, &fsdp2, &init);

    step_cost one = run_step(&ctx, &fsdp1, &init, "lab 10: FSDP1 step");
    step_cost two = run_step(&ctx, &fsdp2, &init, "lab 10: FSDP2 step");
    print_costs(&ctx, &fsdp1, &fsdp2, &one, &two);

    int exact = world_all_true(&ctx, one.exact && two.exact);
    if (ctx.rank == 0)
        printf("\ncheck: unsharded views, gradient means and per-category peaks of both layouts (%d ranks): %s\n",
               ctx.world_size, exact ? "OK" : "MISMATCH");
    flat_param_free(&fsdp1);
    flat_param_free(&fsdp2);
    int status = session_close(&ctx);
    return exact ? status : 1;
}
