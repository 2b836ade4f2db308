/* lab 02 — unshard and reshard: the all-gather that makes a unit whole for a moment, and the free that ends it.
 *
 * What it teaches
 *   Between uses, a rank holds only its shard of a unit (lab 01). To compute with the unit, FSDP all-gathers every
 *   rank's shard into one padded full buffer (`_full_param_padded`, category param_unsharded) and points each parameter
 *   at its slice of it; right after, it frees that buffer again (reshard). So the peak memory of FSDP is "all shards +
 *   one (or two) unsharded units", and every unshard costs an all-gather in which each rank sends its shard to the N-1
 *   others and receives theirs: (N-1)/N of the unit's bytes each way. Freed is not returned: like PyTorch's caching
 *   allocator, fsdplab's (core/memory/allocator.h) keeps the freed buffer's segment *reserved*, so `live` (allocated)
 *   drops at reshard but `reserved` does not, and the next unshard gets the very same block back without asking the
 *   system for memory: why torch.cuda.memory_reserved() exceeds memory_allocated(), and why after the first step FSDP
 *   costs no more system allocations.
 *
 * What to run (from the repository root; `make lab-NN` builds the lab, then launches it through the Makefile's MPIRUN,
 * which adds the flags mpirun needs as root (--allow-run-as-root) and for more ranks than cores (--oversubscribe))
 *   make lab-02                        then NP=4: the shard shrinks, the unsharded buffer does not
 *   make lab-02 NP=4
 *   make lab-02 ALLOC=malloc           no caching: reserved falls with live, the second unshard maps anew
 *   mpirun --allow-run-as-root --oversubscribe -np 4 lab/02_gather     the same by hand, after `make`
 *   env: OUT (default runs/02_gather), SEED (default 1234), ALLOC (caching or malloc), NP (ranks, 2 to 8)
 *
 * What to look at
 *   The printed memory table (before / during / after, twice): live and reserved side by side. In the trace: on the
 *   memory track the param_unsharded band appears at the all_gather on the comm track and vanishes at reshard, while
 *   the reserved counter stays up; the ShardState instants SHARDED -> UNSHARDED -> SHARDED; the flow arrows joining
 *   the same all_gather on every rank. In memory_snapshot.pickle (pytorch.org/memory_viz): one segment_alloc, then
 *   the same block address allocated and freed twice.
 *
 * The check (`make check-02`): every parameter view equals the original, live memory after reshard equals the
 * shard-only level before unshard, and (caching) the second unshard reuses the first one's block: same address,
 * reserved unchanged, no new segment; on every rank.
 */
#include <stdio.h>
#include <string.h>

#include "core/comm/comm.h"
#include "core/runtime/env.h"
#include "core/runtime/context.h"
#include "core/fsdp/flat_param.h"
#include "core/runtime/world.h"
#include "core/runtime/session.h"
#include "lesson_layer.h"

typedef struct memory_row {
    const char *moment;
    size_t live, param_shard, param_unsharded, reserved, segment_allocs;
} memory_row;

static memory_row memory_now(const context *ctx, const char *moment) {
    return (memory_row){moment, ctx->mem.live_bytes, ctx->mem.category_live_bytes[MEM_PARAM_SHARD],
                        ctx->mem.category_live_bytes[MEM_PARAM_UNSHARDED], ctx->mem.reserved_bytes,
                        ctx->mem.allocator.segment_allocs};
}

static void print_memory_table(const memory_row *rows, int count) {
    char live[32], shard[32], unsharded[32], reserved[32];
    printf("  %-17s %12s %14s %16s %12s %9s\n", "rank 0", "live", "param_shard", "param_unsharded", "reserved",
           "segments");
    for (int i = 0; i < count; i++)
        printf("  %-17s %12s %14s %16s %12s %9zu\n", rows[i].moment, mem_format_bytes(rows[i].live, live, sizeof live),
               mem_format_bytes(rows[i].param_shard, shard, sizeof shard),
               mem_format_bytes(rows[i].param_unsharded, unsharded, sizeof unsharded),
               mem_format_bytes(rows[i].reserved, reserved, sizeof reserved), rows[i].segment_allocs);
}

/* Compares every parameter's view in the unsharded buffer with the values it was initialised with. */
static int views_match_original(context *ctx, const flat_param *fp, flat_param_normal_init *init) {
    int all_match = 1;
    for (int i = 0; i < fp->param_count; i++) {
        const flat_param_param_info *info = &fp->params[i];
        float *expected = mem_alloc(&ctx->mem, info->numel * sizeof(float), MEM_WORKSPACE, "lab02.expected");
        flat_param_fill_normal(info->name, 0, info->numel, expected, init);
        const float *view = flat_param_param_view(fp, info->name);
        if (memcmp(view, expected, info->numel * sizeof(float)) != 0) {
            fprintf(stderr, "rank %d: unit '%s': gathered '%s' differs from the original\n", ctx->rank, fp->unit,
                    info->name);
            all_match = 0;
        }
        mem_free(&ctx->mem, expected);
    }
    return all_match;
}

int main(int argc, char **argv) {
    context ctx;
    session_open(&ctx, &argc, &argv, "02_gather", "runs/02_gather");
    session_require_cpu(&ctx, "the gathered parameters it compares with the originals");
    world_require_size(&ctx, 2, 8);
    flat_param_normal_init init = {.seed = env_seed(&ctx), .std = 0.02f};

    flat_param fp;
    if (flat_param_init(&fp, &ctx, "layers.0", lesson_layer_params, LESSON_LAYER_PARAM_COUNT) != 0)
        world_fatal(&ctx, "%s", ctx.error);
    flat_param_fill_local_shard(&fp, flat_param_fill_normal, &init);

    char unsharded_text[32], shard_text[32];
    if (ctx.rank == 0) {
        printf("lab 02 — unshard (all-gather) and reshard across %d ranks\n\n", ctx.world_size);
        printf("unit '%s': %d parameters, %zu floats = %s unsharded; each rank keeps %zu floats = %s\n\n", fp.unit,
               fp.param_count, fp.unpadded_numel,
               mem_format_bytes(fp.padded_unsharded_numel * sizeof(float), unsharded_text, sizeof unsharded_text),
               fp.sharded_numel, mem_format_bytes(fp.sharded_numel * sizeof(float), shard_text, sizeof shard_text));
    }

    memory_row rows[5];
    rows[0] = memory_now(&ctx, "before unshard");
    trace_mark(&ctx.trace, "lab 02: before unshard");
    if (flat_param_unshard(&fp, "lab02.unshard") != 0) world_fatal(&ctx, "%s", ctx.error);
    trace_collective_info gather = ctx.last_collective;
    const float *first_buffer = fp.full_param_padded;
    rows[1] = memory_now(&ctx, "after unshard");
    int views_ok = world_all_true(&ctx, views_match_original(&ctx, &fp, &init));
    flat_param_reshard(&fp, "lab02.reshard");
    rows[2] = memory_now(&ctx, "after reshard");
    trace_mark(&ctx.trace, "lab 02: after reshard");
    int memory_ok = world_all_true(&ctx, rows[2].live == rows[0].live && rows[2].param_unsharded == 0);

    /* Once more: the cache hands the freed block back. */
    if (flat_param_unshard(&fp, "lab02.unshard_again") != 0) world_fatal(&ctx, "%s", ctx.error);
    int same_block = fp.full_param_padded == first_buffer;
    rows[3] = memory_now(&ctx, "unshard again");
    views_ok = world_all_true(&ctx, views_match_original(&ctx, &fp, &init)) && views_ok;
    flat_param_reshard(&fp, "lab02.reshard_again");
    rows[4] = memory_now(&ctx, "reshard again");
    trace_mark(&ctx.trace, "lab 02: after the second reshard");
    int caching = ctx.mem.allocator.settings.caching;
    /* (The view check between the rows allocates scratch buffers of its own, hence rows 2 and 3 are compared.) */
    int cache_ok = world_all_true(&ctx, !caching || (same_block && rows[2].reserved >= rows[1].reserved &&
                                                   rows[3].reserved == rows[2].reserved &&
                                                   rows[3].segment_allocs == rows[2].segment_allocs));

    if (ctx.rank == 0) {
        char sent[32], received[32];
        print_memory_table(rows, 5);
        printf("\nall_gather of %s: rank 0 sent %s and received %s ((N-1)/N of the unit each way) in %.3f ms\n",
               unsharded_text, mem_format_bytes(gather.bytes_sent, sent, sizeof sent),
               mem_format_bytes(gather.bytes_recv, received, sizeof received), gather.dur_us / 1000.0);
        printf("\ncheck: every parameter view equals the original values (%d parameters, all ranks): %s\n",
               fp.param_count, views_ok ? "OK" : "MISMATCH");
        printf("check: live memory after reshard == before unshard, nothing unsharded left (all ranks): %s\n",
               memory_ok ? "OK" : "MISMATCH");
        if (caching)
            printf("check: the second unshard reuses the cached block (same address, reserved unchanged, no new "
                   "segment; all ranks): %s\n", cache_ok ? "OK" : "MISMATCH");
        else
            printf("ALLOC=malloc: no cache, so reserved falls with live and the second unshard takes a new segment\n");
    }
    flat_param_free(&fp);
    int status = session_close(&ctx);
    return views_ok && memory_ok && cache_ok ? status : 1;
}
