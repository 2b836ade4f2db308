/* test_flat_param.c — FlatParameter at any world size (run under mpirun -np 1..4): for many shape lists, the
 * concatenated shards equal the flattened original; views alias the right offsets; the reduce-scattered gradient
 * shard equals the mean over ranks of their full gradients, restricted to the shard, and accumulates; FSDP2's
 * per-parameter rows hold the right rows, unshard whole and reduce to the mean. */
#include <math.h>
#include <string.h>

#include "core/fsdp/flat_param.h"
#include "core/base/rng.h"
#include "core/runtime/session.h"
#include "mpi_check.h"

static context ctx; /* the one context of this test program */

/* A shape list made from a seed: 1-6 tensors of 1-3 dims, each dim 1-9, so totals land on every residue. */
typedef struct shape_list {
    flat_param_tensor_spec specs[6];
    char names[6][32];
    int count;
} shape_list;

static void make_shape_list(shape_list *list, uint64_t seed) {
    list->count = 1 + (int)(rng_bits(seed, 1, 0) % 6);
    for (int i = 0; i < list->count; i++) {
        snprintf(list->names[i], sizeof list->names[i], "module.p%d.weight", i);
        flat_param_tensor_spec *spec = &list->specs[i];
        spec->name = list->names[i];
        spec->ndim = 1 + (int)(rng_bits(seed, 2, (uint64_t)i) % 3);
        for (int d = 0; d < spec->ndim; d++)
            spec->shape[d] = 1 + (int64_t)(rng_bits(seed, 3, (uint64_t)(4 * i + d)) % 9);
    }
}

/* Parameter values: (name, index) → a float, through the same RNG the model uses. */
static void fill_values(const char *name, size_t first, size_t count, float *out, void *user) {
    const uint64_t *seed = user;
    for (size_t i = 0; i < count; i++) out[i] = rng_uniform(*seed, rng_stream_of(name), first + i);
}

#define SHAPE_LISTS 40

START_TEST(test_shards_reassemble_to_the_original) {
    for (uint64_t seed = 0; seed < SHAPE_LISTS; seed++) {
        shape_list list;
        make_shape_list(&list, seed);
        flat_param fp;
        ck_assert_int_eq(flat_param_init(&fp, &ctx, "unit", list.specs, list.count), 0);
        size_t world = (size_t)ctx.world_size;
        ck_assert_uint_eq(fp.padded_unsharded_numel % world, 0);
        ck_assert_uint_lt(fp.pad_numel, world);
        ck_assert_uint_eq(fp.sharded_numel * world, fp.padded_unsharded_numel);

        flat_param_fill_local_shard(&fp, fill_values, &seed);
        float *gathered = mem_alloc(&ctx.mem, fp.padded_unsharded_numel * sizeof(float), MEM_WORKSPACE, "gathered");
        float *original = mem_alloc(&ctx.mem, fp.padded_unsharded_numel * sizeof(float), MEM_WORKSPACE, "original");
        ck_assert_int_eq(comm_all_gather(&ctx, fp.local_shard, gathered, fp.padded_unsharded_numel, "test"), 0);
        /* The original, flattened here without any sharding: each parameter in registration order, then zeros. */
        size_t offset = 0;
        for (int i = 0; i < list.count; i++) {
            fill_values(fp.params[i].name, 0, fp.params[i].numel, original + offset, &seed);
            offset += fp.params[i].numel;
        }
        int same = memcmp(gathered, original, fp.padded_unsharded_numel * sizeof(float)) == 0;
        CK_ASSERT_ALL(&ctx, same, "shape list %llu (%d tensors, %zu floats): shards do not reassemble",
                      (unsigned long long)seed, list.count, fp.unpadded_numel);

        /* Every element of every parameter is owned by exactly one rank. */
        for (int i = 0; i < list.count; i++) {
            size_t owned = 0, begin, end;
            for (int rank = 0; rank < ctx.world_size; rank++)
                if (flat_param_param_shard_overlap(&fp, i, rank, &begin, &end)) owned += end - begin;
            ck_assert_uint_eq(owned, fp.params[i].numel);
        }
        mem_free(&ctx.mem, gathered);
        mem_free(&ctx.mem, original);
        flat_param_free(&fp);
    }
}
END_TEST

START_TEST(test_views_alias_the_right_offsets) {
    for (uint64_t seed = 100; seed < 100 + SHAPE_LISTS; seed++) {
        shape_list list;
        make_shape_list(&list, seed);
        flat_param fp;
        ck_assert_int_eq(flat_param_init(&fp, &ctx, "unit", list.specs, list.count), 0);
        flat_param_fill_local_shard(&fp, fill_values, &seed);
        size_t live_sharded = ctx.mem.live_bytes;
        ck_assert_int_eq(flat_param_unshard(&fp, "test"), 0);
        ck_assert_int_eq(fp.shard_state, FLAT_PARAM_UNSHARDED);
        ck_assert_uint_eq(ctx.mem.live_bytes, live_sharded + fp.padded_unsharded_numel * sizeof(float));
        int ok = 1;
        size_t expected_offset = 0;
        for (int i = 0; i < list.count; i++) {
            const float *view = flat_param_param_view(&fp, list.names[i]);
            ok &= view == fp.full_param_padded + expected_offset;
            float expected[9 * 9 * 9];
            fill_values(list.names[i], 0, fp.params[i].numel, expected, &seed);
            ok &= memcmp(view, expected, fp.params[i].numel * sizeof(float)) == 0;
            expected_offset += fp.params[i].numel;
        }
        for (size_t pad = fp.unpadded_numel; pad < fp.padded_unsharded_numel; pad++)
            ok &= fp.full_param_padded[pad] == 0.0f;
        CK_ASSERT_ALL(&ctx, ok, "shape list %llu: a view is at the wrong offset or holds wrong values",
                      (unsigned long long)seed);
        /* already unsharded: no second gather, no second buffer */
        ck_assert_int_eq(flat_param_unshard(&fp, "test"), 0);
        ck_assert_uint_eq(ctx.mem.live_bytes, live_sharded + fp.padded_unsharded_numel * sizeof(float));
        flat_param_reshard(&fp, "test");
        ck_assert_ptr_null(fp.full_param_padded);
        ck_assert_uint_eq(ctx.mem.live_bytes, live_sharded);
        flat_param_free(&fp);
    }
}
END_TEST

/* FSDP2 (ctx.per_parameter_sharding, FLAT_PARAM_ROWS): for many shape lists (dims 1-9, so d0 < W happens), the
 * local shard is this rank's rows [r c, min(d0, (r+1) c)) of each parameter then zero rows to c = ceil(d0 / W),
 * computed here from the shapes alone; unshard gives every parameter whole at FSDP1's offsets; the reduce-scattered
 * gradient of small integers (exact sums) is the mean, zero in the padding rows. */
START_TEST(test_per_parameter_rows) {
    size_t world = (size_t)ctx.world_size;
    for (uint64_t seed = 200; seed < 200 + SHAPE_LISTS; seed++) {
        shape_list list;
        make_shape_list(&list, seed);
        flat_param fp;
        ctx.per_parameter_sharding = 1;
        ck_assert_int_eq(flat_param_init(&fp, &ctx, "unit", list.specs, list.count), 0);
        ctx.per_parameter_sharding = 0;
        ck_assert_int_eq(fp.layout, FLAT_PARAM_ROWS);
        flat_param_fill_local_shard(&fp, fill_values, &seed);
        float expected[6 * 9 * 9 * 9] = {0}, full[9 * 9 * 9];
        size_t at = 0, rank = (size_t)ctx.rank;
        for (int i = 0; i < list.count; i++) {
            size_t rows = (size_t)list.specs[i].shape[0], row = fp.params[i].numel / rows;
            size_t c = (rows + world - 1) / world, first = rank * c < rows ? rank * c : rows;
            size_t last = (rank + 1) * c < rows ? (rank + 1) * c : rows;
            fill_values(list.names[i], 0, fp.params[i].numel, full, &seed);
            memcpy(expected + at, full + first * row, (last - first) * row * sizeof(float));
            at += c * row;
        }
        ck_assert_uint_eq(at, fp.sharded_numel);
        ck_assert_uint_eq(fp.padded_unsharded_numel, world * at);
        int ok = memcmp(expected, fp.local_shard, at * sizeof(float)) == 0;
        ck_assert_int_eq(flat_param_unshard(&fp, "test"), 0);
        for (int i = 0; i < list.count; i++) {
            fill_values(list.names[i], 0, fp.params[i].numel, full, &seed);
            ok &= memcmp(flat_param_param_view(&fp, list.names[i]), full, fp.params[i].numel * sizeof(float)) == 0;
        }
        flat_param_reshard(&fp, "test");
        float *grad = flat_param_alloc_full_grad(&fp);
        for (size_t k = 0; k < fp.unpadded_numel; k++) grad[k] = (float)(k % 5 + rank);
        ck_assert_int_eq(flat_param_reduce_scatter_grad(&fp, COMM_AVG), 0);
        memset(expected, 0, sizeof expected);
        float factor = 1.0f / (float)world;
        for (int i = 0; i < list.count; i++) {
            size_t begin, end, offset = flat_param_param_shard_offset(&fp, i, ctx.rank);
            if (!flat_param_param_shard_overlap(&fp, i, ctx.rank, &begin, &end)) continue;
            for (size_t k = begin; k < end; k++) {
                float sum = 0.0f;
                for (size_t r = 0; r < world; r++) sum += (float)((fp.params[i].offset + k) % 5 + r);
                expected[offset + k - begin] = sum * factor;
            }
        }
        ok &= memcmp(expected, fp.grad_shard, fp.sharded_numel * sizeof(float)) == 0;
        CK_ASSERT_ALL(&ctx, ok, "shape list %llu (%d tensors): rows, views or the gradient mean are wrong",
                      (unsigned long long)seed, list.count);
        flat_param_free(&fp);
    }
}
END_TEST

/* Rank r's gradient for micro-batch m: any rank can compute it. */
typedef struct gradient_key {
    uint64_t seed;
    int rank, micro;
} gradient_key;
static void fill_gradient(const char *name, size_t first, size_t count, float *out, void *user) {
    const gradient_key *key = user;
    uint64_t stream = rng_stream_of(name) ^ (uint64_t)(key->rank * 7919 + key->micro * 104729);
    for (size_t i = 0; i < count; i++) out[i] = rng_uniform(key->seed, stream, first + i) - 0.5f;
}

START_TEST(test_reduce_scattered_gradient_is_the_mean_and_accumulates) {
    for (uint64_t seed = 200; seed < 200 + SHAPE_LISTS; seed++) {
        shape_list list;
        make_shape_list(&list, seed);
        flat_param fp;
        ck_assert_int_eq(flat_param_init(&fp, &ctx, "unit", list.specs, list.count), 0);
        size_t begin, end;
        flat_param_shard_range(&fp, ctx.rank, &begin, &end);
        double *expected = (double *)mem_alloc(&ctx.mem, fp.sharded_numel * sizeof(double), MEM_WORKSPACE, "mean");
        float *one = mem_alloc(&ctx.mem, fp.sharded_numel * sizeof(float), MEM_WORKSPACE, "one");
        double worst = 0.0;
        for (int micro = 0; micro < 2; micro++) {
            gradient_key mine = {seed, ctx.rank, micro};
            flat_param_fill_flat_range(&fp, fill_gradient, &mine, 0, fp.padded_unsharded_numel,
                                       flat_param_alloc_full_grad(&fp));
            ck_assert_int_eq(flat_param_reduce_scatter_grad(&fp, COMM_AVG), 0);
            ck_assert_ptr_null(fp.full_grad_padded); /* freed once reduced */
            for (int rank = 0; rank < ctx.world_size; rank++) {
                gradient_key theirs = {seed, rank, micro};
                flat_param_fill_flat_range(&fp, fill_gradient, &theirs, begin, end, one);
                for (size_t i = 0; i < fp.sharded_numel; i++) expected[i] += one[i] / (double)ctx.world_size;
            }
            for (size_t i = 0; i < fp.sharded_numel; i++)
                worst = fmax(worst, fabs((double)fp.grad_shard[i] - expected[i]));
        }
        CK_ASSERT_ALL(&ctx, worst <= 1e-6, "shape list %llu: gradient shard off the mean by %.3g",
                      (unsigned long long)seed, worst);
        ck_assert_uint_eq(ctx.mem.category_live_bytes[MEM_GRAD_SHARD], fp.sharded_numel * sizeof(float));
        ck_assert_uint_eq(ctx.mem.category_live_bytes[MEM_COMM_BUFFER], 0);
        flat_param_zero_grad(&fp);
        ck_assert_ptr_null(fp.grad_shard);
        mem_free(&ctx.mem, expected);
        mem_free(&ctx.mem, one);
        flat_param_free(&fp);
    }
}
END_TEST

/* Mixed precision (bfloat16 param and reduce): the gathered unit is exactly the float32 master rounded to bfloat16
 * (not shifted, not left in float32), the master is untouched, the low-precision shard is gone after the unshard and
 * param_unsharded holds the 2-byte buffer plus the 4-byte copy; the gradient shard is, bit for bit, the ring's
 * bfloat16 mean of the ranks' bfloat16-rounded gradients (chunk r summed from rank r + 1 on, one rounding per hop,
 * times 1/N rounded once), widened and accumulated in float32 over two micro-batches. */
/* A unit of shape list `seed` (replicated: NO_SHARD's) with bfloat16 param_dtype and reduce_dtype, its master
 * filled. */
static void mixed_precision_unit(flat_param *fp, shape_list *list, uint64_t seed, int replicated) {
    flat_param_mixed_precision bf16_everywhere = {.param_dtype = DTYPE_BFLOAT16, .reduce_dtype = DTYPE_BFLOAT16};
    make_shape_list(list, seed);
    ck_assert_int_eq(replicated ? flat_param_init_replicated(fp, &ctx, "unit", list->specs, list->count)
                                : flat_param_init(fp, &ctx, "unit", list->specs, list->count), 0);
    ck_assert_int_eq(flat_param_set_mixed_precision(fp, &bf16_everywhere), 0);
    flat_param_fill_local_shard(fp, fill_values, &seed);
}

START_TEST(test_mixed_precision_unshard_and_reduce) {
    int world = ctx.world_size;
    for (uint64_t seed = 300; seed < 300 + SHAPE_LISTS; seed++) {
        shape_list list;
        flat_param fp;
        mixed_precision_unit(&fp, &list, seed, 0);
        size_t live_sharded = ctx.mem.live_bytes;
        ck_assert_int_eq(flat_param_unshard(&fp, "test"), 0);
        ck_assert_uint_eq(ctx.mem.live_bytes, live_sharded + fp.padded_unsharded_numel * (2 + sizeof(float)));
        ck_assert_uint_eq(ctx.mem.category_live_bytes[MEM_PARAM_SHARD_LOW_PRECISION], 0);
        int ok = 1;
        for (int i = 0; i < list.count; i++) {
            float expected[9 * 9 * 9];
            fill_values(list.names[i], 0, fp.params[i].numel, expected, &seed);
            const float *view = flat_param_param_view(&fp, list.names[i]);
            const bf16 *low = (const bf16 *)fp.low_precision_full_param + fp.params[i].offset;
            for (size_t k = 0; k < fp.params[i].numel; k++)
                ok &= view[k] == bf16_round(expected[k]) && low[k] == bf16_from_float(expected[k]);
        }
        size_t begin, end;
        flat_param_shard_range(&fp, ctx.rank, &begin, &end);
        float *master = mem_alloc(&ctx.mem, fp.sharded_numel * sizeof(float), MEM_WORKSPACE, "master");
        flat_param_fill_flat_range(&fp, fill_values, &seed, begin, end, master);
        ok &= memcmp(master, fp.local_shard, fp.sharded_numel * sizeof(float)) == 0;
        CK_ASSERT_ALL(&ctx, ok, "shape list %llu: the gathered unit is not the bfloat16-rounded master",
                      (unsigned long long)seed);
        flat_param_reshard(&fp, "test");
        ck_assert_uint_eq(ctx.mem.live_bytes, live_sharded + fp.sharded_numel * sizeof(float));
        mem_free(&ctx.mem, master);

        float *expected = mem_alloc(&ctx.mem, fp.sharded_numel * sizeof(float), MEM_WORKSPACE, "expected");
        float *theirs = mem_alloc(&ctx.mem, fp.padded_unsharded_numel * (size_t)world * sizeof(float), MEM_WORKSPACE,
                                  "every rank's gradient");
        for (int micro = 0; micro < 2; micro++) {
            gradient_key mine = {seed, ctx.rank, micro};
            flat_param_fill_flat_range(&fp, fill_gradient, &mine, 0, fp.padded_unsharded_numel,
                                       flat_param_alloc_full_grad(&fp));
            ck_assert_int_eq(flat_param_reduce_scatter_grad(&fp, COMM_AVG), 0);
            for (int rank = 0; rank < world; rank++) {
                gradient_key key = {seed, rank, micro};
                flat_param_fill_flat_range(&fp, fill_gradient, &key, 0, fp.padded_unsharded_numel,
                                   theirs + (size_t)rank * fp.padded_unsharded_numel);
            }
            for (size_t i = 0; i < fp.sharded_numel; i++) {
                size_t at = begin + i;
                bf16 sum = bf16_from_float(theirs[(size_t)((ctx.rank + 1) % world) * fp.padded_unsharded_numel + at]);
                for (int k = 2; k <= world; k++)
                    sum = bf16_add(sum, bf16_from_float(theirs[(size_t)((ctx.rank + k) % world) *
                                                               fp.padded_unsharded_numel + at]));
                if (world > 1) sum = bf16_from_float(bf16_to_float(sum) * (1.0f / (float)world));
                expected[i] = micro == 0 ? 0.0f + bf16_to_float(sum) : expected[i] + bf16_to_float(sum);
            }
        }
        CK_ASSERT_ALL(&ctx, memcmp(expected, fp.grad_shard, fp.sharded_numel * sizeof(float)) == 0,
                      "shape list %llu: the gradient shard is not the ring's bfloat16 mean, accumulated in float32",
                      (unsigned long long)seed);
        ck_assert_uint_eq(ctx.mem.category_live_bytes[MEM_COMM_BUFFER], 0);
        ck_assert_uint_eq(ctx.mem.category_live_bytes[MEM_GRAD_UNSHARDED], 0);
        mem_free(&ctx.mem, expected);
        mem_free(&ctx.mem, theirs);
        flat_param_free(&fp);
    }
}
END_TEST

START_TEST(test_bad_specs_are_refused_with_names) {
    flat_param fp;
    flat_param_tensor_spec repeated[] = {{"a.weight", 1, {3}}, {"a.weight", 1, {4}}};
    ck_assert_int_eq(flat_param_init(&fp, &ctx, "layers.2", repeated, 2), -1);
    ck_assert_msg(strstr(ctx.error, "layers.2") && strstr(ctx.error, "registered twice"), "%s", ctx.error);
    flat_param_tensor_spec empty_dim[] = {{"b.weight", 2, {3, 0}}};
    ck_assert_int_eq(flat_param_init(&fp, &ctx, "layers.2", empty_dim, 1), -1);
    ck_assert_msg(strstr(ctx.error, "dimension"), "%s", ctx.error);
    ck_assert_int_eq(flat_param_init(&fp, &ctx, "layers.2", repeated, 0), -1);
    ck_assert_uint_eq(ctx.mem.live_bytes, 0); /* nothing allocated by a refused spec */
}
END_TEST

/* Mixed precision on a NO_SHARD (replicated) unit: nothing is gathered; the _mp_shard is the whole unit, rounded from
 * the master, and stays (param_shard_low_precision) beside the float32 compute copy until the reshard frees both;
 * the gradient is all-reduced in bfloat16 in place, bit for bit the ring's mean of chunk c (chunks of numel / N, the
 * first numel % N one more; chunk c summed from rank c + 1 on, one rounding per hop, times 1/N rounded once). */
START_TEST(test_mixed_precision_no_shard) {
    int world = ctx.world_size;
    for (uint64_t seed = 400; seed < 400 + SHAPE_LISTS; seed++) {
        shape_list list;
        flat_param fp;
        mixed_precision_unit(&fp, &list, seed, 1);
        size_t live = ctx.mem.live_bytes, numel = fp.padded_unsharded_numel;
        ck_assert_int_eq(flat_param_unshard(&fp, "test"), 0);
        ck_assert_uint_eq(ctx.mem.category_live_bytes[MEM_PARAM_SHARD_LOW_PRECISION], numel * 2);
        ck_assert_uint_eq(ctx.mem.live_bytes, live + numel * (2 + sizeof(float)));
        int ok = 1;
        for (size_t i = 0; i < numel; i++) ok &= fp.full_param_padded[i] == bf16_round(fp.local_shard[i]);
        ck_assert_msg(ok, "shape list %llu: the unit is not the bfloat16-rounded master", (unsigned long long)seed);
        flat_param_reshard(&fp, "test");
        ck_assert_uint_eq(ctx.mem.live_bytes, live);
        float *theirs = mem_alloc(&ctx.mem, numel * (size_t)world * sizeof(float), MEM_WORKSPACE, "every rank's");
        gradient_key mine = {seed, ctx.rank, 0};
        flat_param_fill_flat_range(&fp, fill_gradient, &mine, 0, numel, flat_param_alloc_full_grad(&fp));
        ck_assert_int_eq(flat_param_reduce_scatter_grad(&fp, COMM_AVG), 0);
        for (int rank = 0; rank < world; rank++) {
            gradient_key key = {seed, rank, 0};
            flat_param_fill_flat_range(&fp, fill_gradient, &key, 0, numel, theirs + (size_t)rank * numel);
        }
        size_t base = numel / (size_t)world, extra = numel % (size_t)world;
        int exact = 1;
        for (size_t i = 0; i < numel; i++) {
            size_t chunk = i < extra * (base + 1) ? i / (base + 1) : extra + (i - extra * (base + 1)) / base;
            bf16 sum = bf16_from_float(theirs[((chunk + 1) % (size_t)world) * numel + i]);
            for (int k = 2; k <= world; k++)
                sum = bf16_add(sum, bf16_from_float(theirs[((chunk + (size_t)k) % (size_t)world) * numel + i]));
            if (world > 1) sum = bf16_from_float(bf16_to_float(sum) * (1.0f / (float)world));
            exact &= fp.grad_shard[i] == bf16_to_float(sum);
        }
        CK_ASSERT_ALL(&ctx, exact, "shape list %llu: NO_SHARD's gradient is not the bfloat16 ring's mean",
                      (unsigned long long)seed);
        ck_assert_uint_eq(ctx.mem.category_live_bytes[MEM_COMM_BUFFER], 0);
        ck_assert_uint_eq(ctx.mem.category_live_bytes[MEM_GRAD_UNSHARDED], 0);
        mem_free(&ctx.mem, theirs);
        flat_param_free(&fp);
    }
}
END_TEST

int main(int argc, char **argv) {
    session_open(&ctx, &argc, &argv, "test_flat_param", "runs/check/test_flat_param");
    Suite *suite = suite_create("flat_param");
    TCase *tc = tcase_create("FlatParameter");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_shards_reassemble_to_the_original);
    tcase_add_test(tc, test_views_alias_the_right_offsets);
    tcase_add_test(tc, test_per_parameter_rows);
    tcase_add_test(tc, test_reduce_scattered_gradient_is_the_mean_and_accumulates);
    tcase_add_test(tc, test_bad_specs_are_refused_with_names);
    tcase_add_test(tc, test_mixed_precision_unshard_and_reduce);
    tcase_add_test(tc, test_mixed_precision_no_shard);
    suite_add_tcase(suite, tc);
    return mpi_check_run(&ctx, suite);
}
