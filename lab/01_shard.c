/* lab 01 — sharding: one FSDP unit's parameters become one flat buffer, padded, cut into one chunk per rank.
 *
 * What it teaches
 *   FSDP does not shard parameters one by one. A unit's parameters are concatenated in registration order into a
 *   FlatParameter, padded with zeros until the length divides by the world size, and rank r keeps chunk r. So a
 *   chunk boundary can fall in the middle of a tensor, and one rank may own the tail of one parameter and the head
 *   of the next. Each rank holds 1/N of the bytes (plus at most N-1 floats of padding).
 *
 * What to run (from the repository root; `make lab-NN` builds the lab, then launches it through the Makefile's MPIRUN,
 * which adds the flags mpirun needs as root (--allow-run-as-root) and for more ranks than cores (--oversubscribe))
 *   make lab-01                        2 ranks
 *   make lab-01 NP=3                   then 4: watch the padding and the boundaries move
 *   make lab-01 NP=4
 *   mpirun --allow-run-as-root --oversubscribe -np 3 lab/01_shard     the same by hand, after `make` (as a user
 *                                      other than root with 3 cores, plain `mpirun -np 3 lab/01_shard`)
 *   env: OUT (output dir, default runs/01_shard), SEED (the values; default 1234), NP (ranks, 2 to 8)
 *
 * What to look at
 *   The table: for each rank, which elements of which parameter it owns; its bytes: its data as a share of the
 *   unpadded unit (the shares of all ranks add up to 100%), and its padding apart.
 *   In the trace (runs/01_shard/trace.json, in Perfetto UI): the memory counter of each rank grows
 *   by only its shard (param_shard), and the one all-gather the lab uses to check that the shards reassemble.
 *
 * The check (`make check-01`): the concatenated shards equal the flattened original, and the ranks' shares add up
 * to 100%, for 2, 3 and 4 ranks.
 */
#include <stdio.h>
#include <string.h>

#include "core/comm/comm.h"
#include "core/runtime/env.h"
#include "core/runtime/context.h"
#include "core/fsdp/flat_param.h"
#include "core/runtime/world.h"
#include "core/runtime/session.h"

/* A small module with tensors of uneven sizes: 65 floats, so 2, 3 and 4 ranks all need padding. */
static const flat_param_tensor_spec module_params[] = {
    {"embed_tokens.weight", 2, {11, 4}},
    {"norm.weight", 1, {4}},
    {"q_proj.weight", 2, {3, 4}},
    {"q_proj.bias", 1, {3}},
    {"score.bias", 1, {2}},
};
#define MODULE_PARAM_COUNT ((int)(sizeof module_params / sizeof module_params[0]))

/* Appends to a fixed text buffer (for the per-rank report that rank 0 prints in order). */
#define APPEND(buffer, ...) \
    snprintf((buffer) + strlen(buffer), sizeof(buffer) - strlen(buffer), __VA_ARGS__)

static void print_layout(const context *ctx, const flat_param *fp) {
    if (ctx->rank != 0) return;
    printf("lab 01 — sharding a FlatParameter across %d ranks\n\n", ctx->world_size);
    printf("unit '%s': %d parameters, %zu floats, padded to %zu (%zu padding), %zu floats per rank\n\n", fp->unit,
           fp->param_count, fp->unpadded_numel, fp->padded_unsharded_numel, fp->pad_numel, fp->sharded_numel);
    printf("  %-22s %-9s %6s  %s\n", "parameter", "shape", "numel", "flat range");
    for (int i = 0; i < fp->param_count; i++) {
        const flat_param_param_info *info = &fp->params[i];
        char shape[32] = "[";
        for (int d = 0; d < info->ndim; d++) APPEND(shape, "%s%lld", d ? ", " : "", (long long)info->shape[d]);
        APPEND(shape, "]");
        printf("  %-22s %-9s %6zu  [%zu, %zu)\n", info->name, shape, info->numel, info->offset,
               info->offset + info->numel);
    }
    if (fp->pad_numel > 0)
        printf("  %-22s %-9s %6zu  [%zu, %zu)\n", "(padding)", "", fp->pad_numel, fp->unpadded_numel,
               fp->padded_unsharded_numel);
    printf("\n");
    fflush(stdout);
}

static void print_my_shard(context *ctx, const flat_param *fp) {
    char report[4096] = "";
    size_t begin, end;
    flat_param_shard_range(fp, ctx->rank, &begin, &end);
    /* The padding counted once, apart: each rank's data bytes as a share of the unpadded unit, so the shares of all
     * ranks add up to 100%, and the zeros it holds beside them. */
    size_t data_end = begin > fp->unpadded_numel ? begin : fp->unpadded_numel; /* where this rank's padding starts */
    size_t padding_here = end > fp->unpadded_numel ? end - data_end : 0;
    size_t shard_bytes = fp->sharded_numel * sizeof(float), full_bytes = fp->unpadded_numel * sizeof(float);
    size_t data_bytes = shard_bytes - padding_here * sizeof(float);
    APPEND(report, "rank %d owns flat [%zu, %zu): %zu B = %zu B of the unit's %zu B (%.1f%%) + %zu B of padding\n",
           ctx->rank, begin, end, shard_bytes, data_bytes, full_bytes, 100.0 * (double)data_bytes / (double)full_bytes,
           padding_here * sizeof(float));
    for (int i = 0; i < fp->param_count; i++) {
        size_t first, last;
        if (!flat_param_param_shard_overlap(fp, i, ctx->rank, &first, &last)) continue;
        APPEND(report, "    %-22s elements [%zu, %zu) of %zu%s\n", fp->params[i].name, first, last,
               fp->params[i].numel, last - first < fp->params[i].numel ? "   <- split across ranks" : "");
    }
    if (padding_here > 0) APPEND(report, "    %-22s %zu float%s of zeros\n", "(padding)", padding_here,
                                 padding_here == 1 ? "" : "s");
    world_print_ordered(ctx, report);
}

int main(int argc, char **argv) {
    context ctx;
    session_open(&ctx, &argc, &argv, "01_shard", "runs/01_shard");
    session_require_cpu(&ctx, "the shards it fills and prints");
    world_require_size(&ctx, 2, 8);
    flat_param_normal_init init = {.seed = env_seed(&ctx), .std = 1.0f};

    flat_param fp;
    if (flat_param_init(&fp, &ctx, "block", module_params, MODULE_PARAM_COUNT) != 0) world_fatal(&ctx, "%s", ctx.error);
    /* Every rank fills only its own chunk, computing values from (seed, name, index): no rank ever holds the whole. */
    flat_param_fill_local_shard(&fp, flat_param_fill_normal, &init);
    trace_mark(&ctx.trace, "lab 01: local shard filled");

    print_layout(&ctx, &fp);
    print_my_shard(&ctx, &fp);

    /* The check: gather every shard (the all-gather of lab 02, used here only as a witness) and compare with the
     * flattened original that each rank can compute alone. Exact equality: nothing was computed, only moved. */
    float *gathered = mem_alloc(&ctx.mem, fp.padded_unsharded_numel * sizeof(float), MEM_WORKSPACE, "lab01.gathered");
    float *original = mem_alloc(&ctx.mem, fp.padded_unsharded_numel * sizeof(float), MEM_WORKSPACE, "lab01.original");
    COMM_CHECK(&ctx, comm_all_gather(&ctx, fp.local_shard, gathered, fp.padded_unsharded_numel, "check"));
    flat_param_fill_flat_range(&fp, flat_param_fill_normal, &init, 0, fp.padded_unsharded_numel, original);
    int same = memcmp(gathered, original, fp.padded_unsharded_numel * sizeof(float)) == 0;
    int all_same = world_all_true(&ctx, same);
    if (ctx.rank == 0)
        printf("\ncheck: concatenated shards == flattened original (%zu floats, %d ranks): %s\n",
               fp.padded_unsharded_numel, ctx.world_size, all_same ? "OK" : "MISMATCH");
    mem_free(&ctx.mem, gathered);
    mem_free(&ctx.mem, original);
    flat_param_free(&fp);

    int status = session_close(&ctx);
    return all_same ? status : 1;
}
