/* test_optim.c — sharded AdamW and gradient clipping at any world size (run under mpirun -np 1..4): after steps on
 * known gradients every shard equals a double-precision AdamW of the whole buffer; the state exists only for the
 * shard and only once a gradient has come; the padding stays 0; the gathered params are the same bits whatever the
 * world size; clip_grad_norm finds the norm of the whole gradient and scales every shard by torch's coefficient. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/fsdp/flat_param.h"
#include "core/fsdp/optim.h"
#include "core/base/rng.h"
#include "core/runtime/session.h"
#include "mpi_check.h"

static context ctx; /* the one context of this test program */

/* Three units whose sizes (104, 1001, 1) leave padding at world sizes 2-4; at 4 ranks "norm" is one element and
 * three ranks hold nothing of it but padding. */
typedef struct unit_spec {
    const char *unit;
    flat_param_tensor_spec specs[2];
    int count;
} unit_spec;
static const unit_spec UNIT_SPECS[] = {
    {"layers.0", {{"layers.0.mlp.up_proj.weight", 2, {7, 13}}, {"layers.0.mlp.up_proj.bias", 1, {13}}}, 2},
    {"layers.1", {{"layers.1.self_attn.q_proj.weight", 2, {11, 91}}}, 1},
    {"norm", {{"norm.weight", 1, {1}}}, 1},
};
#define UNIT_COUNT 3
#define STEPS 6
#define TOLERANCE 1e-6

/* Parameter values in [-1, 1): (seed, name, index) → a float, so any rank can make any element. */
static void fill_params(const char *name, size_t first, size_t count, float *out, void *user) {
    const uint64_t *seed = user;
    for (size_t i = 0; i < count; i++) out[i] = 2.0f * rng_uniform(*seed, rng_stream_of(name), first + i) - 1.0f;
}

/* The gradient of step `step`, in [-0.5, 0.5): the same full gradient whatever the world size. */
typedef struct gradient_key {
    uint64_t seed;
    int step;
} gradient_key;
static void fill_gradient(const char *name, size_t first, size_t count, float *out, void *user) {
    const gradient_key *key = user;
    uint64_t stream = rng_stream_of(name) ^ ((uint64_t)key->step * 104729u + 1);
    for (size_t i = 0; i < count; i++) out[i] = rng_uniform(key->seed, stream, first + i) - 0.5f;
}

static void make_units(flat_param *units, uint64_t seed) {
    for (int u = 0; u < UNIT_COUNT; u++) {
        ck_assert_int_eq(flat_param_init(&units[u], &ctx, UNIT_SPECS[u].unit, UNIT_SPECS[u].specs,
                                         UNIT_SPECS[u].count), 0);
        flat_param_fill_local_shard(&units[u], fill_params, &seed);
    }
}

/* This rank's chunk of the step's gradient in grad_shard, as the reduce-scatter would leave it (padding 0). */
static void set_gradient(flat_param *fp, uint64_t seed, int step) {
    if (fp->grad_shard == NULL) {
        char owner[MEM_OWNER_MAX];
        snprintf(owner, sizeof owner, "%s.grad_shard", fp->unit);
        fp->grad_shard = mem_alloc(&ctx.mem, fp->sharded_numel * sizeof(float), MEM_GRAD_SHARD, owner);
    }
    size_t begin, end;
    flat_param_shard_range(fp, ctx.rank, &begin, &end);
    gradient_key key = {seed, step};
    flat_param_fill_flat_range(fp, fill_gradient, &key, begin, end, fp->grad_shard);
}

/* torch's AdamW formula in double over flat elements [begin, end), from the same initial values and gradients. */
static void reference_adamw(const flat_param *fp, uint64_t seed, int steps, const adamw_config *config, size_t begin,
                            size_t end, double *param, double *exp_avg, double *exp_avg_sq) {
    size_t count = end - begin;
    float *values = mem_alloc(&ctx.mem, (count + 1) * sizeof(float), MEM_WORKSPACE, "reference.values");
    flat_param_fill_flat_range(fp, fill_params, &seed, begin, end, values);
    for (size_t i = 0; i < count; i++) param[i] = values[i], exp_avg[i] = 0.0, exp_avg_sq[i] = 0.0;
    for (int step = 1; step <= steps; step++) {
        gradient_key key = {seed, step};
        flat_param_fill_flat_range(fp, fill_gradient, &key, begin, end, values);
        double bias_correction1 = 1.0 - pow(config->beta1, step), bias_correction2 = 1.0 - pow(config->beta2, step);
        for (size_t i = 0; i < count; i++) {
            double grad = values[i];
            param[i] *= 1.0 - config->lr * config->weight_decay;
            exp_avg[i] += (grad - exp_avg[i]) * (1.0 - config->beta1);
            exp_avg_sq[i] = exp_avg_sq[i] * config->beta2 + (1.0 - config->beta2) * grad * grad;
            double denom = sqrt(exp_avg_sq[i]) / sqrt(bias_correction2) + config->eps;
            param[i] -= config->lr / bias_correction1 * exp_avg[i] / denom;
        }
    }
    mem_free(&ctx.mem, values);
}

/* max |ours - reference| / max |reference| (0 when both are all zeros). */
static double relative_error(const float *ours, const double *reference, size_t count) {
    double worst = 0.0, scale = 0.0;
    for (size_t i = 0; i < count; i++) {
        worst = fmax(worst, fabs((double)ours[i] - reference[i]));
        scale = fmax(scale, fabs(reference[i]));
    }
    return scale > 0.0 ? worst / scale : worst;
}

/* Does this rank's event file hold a compute event named `name` in phase `phase`? (The sink buffers events until a
 * step's end: flushed first.) */
static int trace_has_compute(const char *name, const char *phase) {
    trace_flush(&ctx.trace);
    FILE *file = fopen(ctx.trace.path, "r");
    if (file == NULL) return 0;
    char line[4096], want_name[160], want_phase[64];
    snprintf(want_name, sizeof want_name, "\"name\":\"%s\"", name);
    snprintf(want_phase, sizeof want_phase, "\"phase\":\"%s\"", phase);
    int found = 0;
    while (!found && fgets(line, sizeof line, file) != NULL)
        found = strstr(line, "\"kind\":\"compute\"") && strstr(line, want_name) && strstr(line, want_phase);
    fclose(file);
    return found;
}

START_TEST(test_steps_match_double_reference) {
    adamw_config configs[2] = {adamw_default_config(), adamw_default_config()};
    configs[1].lr = 0.05, configs[1].weight_decay = 0.1, configs[1].beta1 = 0.8, configs[1].beta2 = 0.95;
    configs[1].eps = 1e-6;
    for (int c = 0; c < 2; c++) {
        uint64_t seed = 11 + (uint64_t)c;
        flat_param units[UNIT_COUNT];
        adamw_state states[UNIT_COUNT];
        make_units(units, seed);
        for (int u = 0; u < UNIT_COUNT; u++) adamw_init(&states[u]);
        for (int step = 1; step <= STEPS; step++)
            for (int u = 0; u < UNIT_COUNT; u++) {
                set_gradient(&units[u], seed, step);
                adamw_step(&states[u], &units[u], &configs[c]);
            }
        for (int u = 0; u < UNIT_COUNT; u++) {
            flat_param *fp = &units[u];
            size_t begin, end, count = fp->sharded_numel;
            flat_param_shard_range(fp, ctx.rank, &begin, &end);
            double *param = mem_alloc(&ctx.mem, 3 * count * sizeof(double), MEM_WORKSPACE, "reference");
            double *exp_avg = param + count, *exp_avg_sq = exp_avg + count;
            reference_adamw(fp, seed, STEPS, &configs[c], begin, end, param, exp_avg, exp_avg_sq);
            double param_error = relative_error(fp->local_shard, param, count);
            double exp_avg_error = relative_error(states[u].exp_avg, exp_avg, count);
            double exp_avg_sq_error = relative_error(states[u].exp_avg_sq, exp_avg_sq, count);
            CK_ASSERT_ALL(&ctx, param_error <= TOLERANCE && exp_avg_error <= TOLERANCE && exp_avg_sq_error <= TOLERANCE,
                          "config %d, unit %s, rank %d, %d steps: relative error param %.3g, exp_avg %.3g, "
                          "exp_avg_sq %.3g (limit %g)", c, fp->unit, ctx.rank, STEPS, param_error, exp_avg_error,
                          exp_avg_sq_error, TOLERANCE);
            CK_ASSERT_ALL(&ctx, states[u].step == STEPS, "unit %s: step count %lld after %d steps", fp->unit,
                          (long long)states[u].step, STEPS);
            mem_free(&ctx.mem, param);
        }
        CK_ASSERT_ALL(&ctx, trace_has_compute("layers.1.adamw", "optimizer"),
                      "no compute event 'layers.1.adamw' (phase optimizer) in %s", ctx.trace.path);
        for (int u = 0; u < UNIT_COUNT; u++) adamw_free(&states[u]), flat_param_free(&units[u]);
    }
    ck_assert_uint_eq(ctx.mem.live_bytes, 0);
}
END_TEST

START_TEST(test_state_exists_only_for_the_shard) {
    uint64_t seed = 21;
    flat_param units[UNIT_COUNT];
    adamw_state states[UNIT_COUNT];
    make_units(units, seed);
    adamw_config config = adamw_default_config();
    size_t expected = 0;
    for (int u = 0; u < UNIT_COUNT; u++) {
        adamw_init(&states[u]);
        ck_assert_uint_eq(ctx.mem.category_live_bytes[MEM_OPTIM_STATE], expected); /* lazily, at the first step */
        set_gradient(&units[u], seed, 1);
        adamw_step(&states[u], &units[u], &config);
        expected += 2 * units[u].sharded_numel * sizeof(float);
        CK_ASSERT_ALL(&ctx, ctx.mem.category_live_bytes[MEM_OPTIM_STATE] == expected,
                      "rank %d, unit %s: optim_state holds %zu bytes, expected 2 x %zu floats per unit so far = %zu",
                      ctx.rank, units[u].unit, ctx.mem.category_live_bytes[MEM_OPTIM_STATE], units[u].sharded_numel,
                      expected);
        char owner[MEM_OWNER_MAX];
        snprintf(owner, sizeof owner, "%s.exp_avg_sq", units[u].unit);
        const mem_block *block = mem_find(&ctx.mem, states[u].exp_avg_sq);
        ck_assert_ptr_nonnull(block);
        ck_assert_str_eq(block->owner, owner);
        ck_assert_int_eq(block->category, MEM_OPTIM_STATE);
    }
    /* More steps make no more state. */
    set_gradient(&units[0], seed, 2);
    adamw_step(&states[0], &units[0], &config);
    ck_assert_uint_eq(ctx.mem.category_live_bytes[MEM_OPTIM_STATE], expected);
    for (int u = 0; u < UNIT_COUNT; u++) adamw_free(&states[u]);
    ck_assert_uint_eq(ctx.mem.category_live_bytes[MEM_OPTIM_STATE], 0);
    adamw_free(&states[0]); /* an emptied state frees nothing twice */
    for (int u = 0; u < UNIT_COUNT; u++) flat_param_free(&units[u]);
}
END_TEST

START_TEST(test_no_gradient_no_update_no_state) {
    uint64_t seed = 31;
    flat_param units[UNIT_COUNT];
    make_units(units, seed);
    flat_param *fp = &units[1];
    adamw_state state;
    adamw_init(&state);
    adamw_config config = adamw_default_config();
    size_t bytes = fp->sharded_numel * sizeof(float);
    float *before = mem_alloc(&ctx.mem, bytes, MEM_WORKSPACE, "before");
    memcpy(before, fp->local_shard, bytes);

    adamw_step(&state, fp, &config); /* never had a gradient */
    ck_assert_int_eq(memcmp(before, fp->local_shard, bytes), 0);
    ck_assert_ptr_null(state.exp_avg);
    ck_assert_int_eq(state.step, 0);
    ck_assert_uint_eq(ctx.mem.category_live_bytes[MEM_OPTIM_STATE], 0);

    set_gradient(fp, seed, 1);
    adamw_step(&state, fp, &config);
    flat_param_zero_grad(fp); /* set_to_none: the next step skips this unit */
    memcpy(before, fp->local_shard, bytes);
    float first_moment = state.exp_avg[0];
    adamw_step(&state, fp, &config);
    ck_assert_int_eq(memcmp(before, fp->local_shard, bytes), 0);
    ck_assert_int_eq(state.step, 1);
    ck_assert(state.exp_avg[0] == first_moment);

    ck_assert_int_eq(adamw_config_check(&config, ctx.error, sizeof ctx.error), 0);
    adamw_config bad = config;
    bad.beta1 = 1.0;
    ck_assert_int_eq(adamw_config_check(&bad, ctx.error, sizeof ctx.error), -1);
    ck_assert_msg(strstr(ctx.error, "beta1"), "%s", ctx.error);
    bad = config;
    bad.lr = NAN;
    ck_assert_int_eq(adamw_config_check(&bad, ctx.error, sizeof ctx.error), -1);
    ck_assert_msg(strstr(ctx.error, "lr"), "%s", ctx.error);

    mem_free(&ctx.mem, before);
    adamw_free(&state);
    for (int u = 0; u < UNIT_COUNT; u++) flat_param_free(&units[u]);
}
END_TEST

START_TEST(test_padding_stays_zero) {
    uint64_t seed = 41;
    flat_param units[UNIT_COUNT];
    adamw_state states[UNIT_COUNT];
    make_units(units, seed);
    adamw_config config = adamw_default_config();
    config.lr = 0.1, config.weight_decay = 0.5; /* large, so a leak into the padding would show */
    for (int u = 0; u < UNIT_COUNT; u++) adamw_init(&states[u]);
    for (int step = 1; step <= STEPS; step++)
        for (int u = 0; u < UNIT_COUNT; u++) {
            set_gradient(&units[u], seed, step);
            adamw_step(&states[u], &units[u], &config);
        }
    int ok = 1;
    size_t padding_seen = 0;
    for (int u = 0; u < UNIT_COUNT; u++) {
        size_t begin, end;
        flat_param_shard_range(&units[u], ctx.rank, &begin, &end);
        for (size_t flat = begin > units[u].unpadded_numel ? begin : units[u].unpadded_numel; flat < end; flat++) {
            size_t i = flat - begin;
            ok &= units[u].local_shard[i] == 0.0f && states[u].exp_avg[i] == 0.0f && states[u].exp_avg_sq[i] == 0.0f;
            padding_seen++;
        }
    }
    CK_ASSERT_ALL(&ctx, ok, "rank %d: a padding element became non-zero after %d steps", ctx.rank, STEPS);
    /* The padding exists to be tested: at 2-4 ranks each unit pads (104, 1001, 1 floats). */
    size_t padding_total = 0;
    for (int u = 0; u < UNIT_COUNT; u++) padding_total += units[u].pad_numel;
    float seen = (float)padding_seen;
    ck_assert_int_eq(comm_all_reduce(&ctx, &seen, 1, COMM_SUM, "test"), 0);
    ck_assert_uint_eq((size_t)seen, padding_total);
    if (ctx.world_size > 1) ck_assert_uint_gt(padding_total, 0);
    for (int u = 0; u < UNIT_COUNT; u++) adamw_free(&states[u]), flat_param_free(&units[u]);
}
END_TEST

/* Gathers the unpadded params of a unit into `out` (unpadded_numel floats). */
static void gather_params(flat_param *fp, float *out) {
    float *full = mem_alloc(&ctx.mem, fp->padded_unsharded_numel * sizeof(float), MEM_WORKSPACE, "gathered");
    ck_assert_int_eq(comm_all_gather(&ctx, fp->local_shard, full, fp->padded_unsharded_numel, fp->unit), 0);
    memcpy(out, full, fp->unpadded_numel * sizeof(float));
    mem_free(&ctx.mem, full);
}

START_TEST(test_gathered_params_do_not_depend_on_world_size) {
    /* AdamW is element-wise, so sharding must not change a single bit. Each run compares its gathered params with a
     * replicated copy of the unit (the whole buffer on one rank, as at world size 1) stepped on the same gradients;
     * equal to world 1 at every world size means equal across world sizes. */
    uint64_t seed = 51;
    adamw_config config = adamw_default_config();
    config.lr = 0.02;
    for (int u = 0; u < UNIT_COUNT; u++) {
        flat_param sharded, whole;
        const unit_spec *spec = &UNIT_SPECS[u];
        ck_assert_int_eq(flat_param_init(&sharded, &ctx, spec->unit, spec->specs, spec->count), 0);
        ck_assert_int_eq(flat_param_init_replicated(&whole, &ctx, spec->unit, spec->specs, spec->count), 0);
        flat_param_fill_local_shard(&sharded, fill_params, &seed);
        flat_param_fill_local_shard(&whole, fill_params, &seed);
        adamw_state sharded_state, whole_state;
        adamw_init(&sharded_state);
        adamw_init(&whole_state);
        for (int step = 1; step <= STEPS; step++) {
            set_gradient(&sharded, seed, step);
            set_gradient(&whole, seed, step);
            adamw_step(&sharded_state, &sharded, &config);
            adamw_step(&whole_state, &whole, &config);
        }
        float *gathered = mem_alloc(&ctx.mem, sharded.unpadded_numel * sizeof(float), MEM_WORKSPACE, "params");
        gather_params(&sharded, gathered);
        int same = memcmp(gathered, whole.local_shard, sharded.unpadded_numel * sizeof(float)) == 0;
        CK_ASSERT_ALL(&ctx, same, "unit %s: params gathered from %d shards differ from one whole buffer's after %d "
                      "steps", spec->unit, ctx.world_size, STEPS);
        mem_free(&ctx.mem, gathered);
        adamw_free(&sharded_state);
        adamw_free(&whole_state);
        flat_param_free(&sharded);
        flat_param_free(&whole);
    }
}
END_TEST

/* The L2 norm of the whole step-`step` gradient of the given units, in double, from nothing but the fill function:
 * what every rank can compute alone. */
static double full_gradient_norm(flat_param *units, int unit_count, uint64_t seed, int step) {
    double sum = 0.0;
    for (int u = 0; u < unit_count; u++) {
        float *full = mem_alloc(&ctx.mem, units[u].unpadded_numel * sizeof(float), MEM_WORKSPACE, "full_grad");
        gradient_key key = {seed, step};
        flat_param_fill_flat_range(&units[u], fill_gradient, &key, 0, units[u].unpadded_numel, full);
        for (size_t i = 0; i < units[u].unpadded_numel; i++) sum += (double)full[i] * full[i];
        mem_free(&ctx.mem, full);
    }
    return sqrt(sum);
}

START_TEST(test_clip_grad_norm_is_the_full_norm_and_scales) {
    uint64_t seed = 61;
    flat_param units[UNIT_COUNT];
    make_units(units, seed);
    for (int u = 0; u < UNIT_COUNT; u++) set_gradient(&units[u], seed, 1);
    double expected = full_gradient_norm(units, UNIT_COUNT, seed, 1);

    /* max_norm above the norm: the norm is reported, nothing changes. */
    size_t total_numel = 0;
    for (int u = 0; u < UNIT_COUNT; u++) total_numel += units[u].sharded_numel;
    float *before = mem_alloc(&ctx.mem, total_numel * sizeof(float), MEM_WORKSPACE, "before");
    for (size_t u = 0, at = 0; u < UNIT_COUNT; at += units[u].sharded_numel, u++)
        memcpy(before + at, units[u].grad_shard, units[u].sharded_numel * sizeof(float));
    double norm = adamw_clip_grad_norm(&ctx, units, UNIT_COUNT, 2.0 * expected);
    CK_ASSERT_ALL(&ctx, fabs(norm - expected) <= TOLERANCE * expected,
                  "rank %d: clip_grad_norm returned %.9g, the full gradient's norm is %.9g", ctx.rank, norm, expected);
    CK_ASSERT_ALL(&ctx, strcmp(ctx.last_collective.op, "all_reduce") == 0 && ctx.last_collective.count == 1,
                  "clip_grad_norm's collective was %s of %llu floats, expected all_reduce of 1", ctx.last_collective.op,
                  (unsigned long long)ctx.last_collective.count);
    int unchanged = 1;
    for (size_t u = 0, at = 0; u < UNIT_COUNT; at += units[u].sharded_numel, u++)
        unchanged &= memcmp(before + at, units[u].grad_shard, units[u].sharded_numel * sizeof(float)) == 0;
    CK_ASSERT_ALL(&ctx, unchanged, "rank %d: max_norm above the norm still changed the gradient", ctx.rank);

    /* max_norm a quarter of the norm: every shard scaled by max_norm / (norm + 1e-6), the new norm is max_norm. */
    double max_norm = expected / 4.0;
    norm = adamw_clip_grad_norm(&ctx, units, UNIT_COUNT, max_norm);
    double coefficient = max_norm / (norm + 1e-6);
    double worst = 0.0;
    for (size_t u = 0, at = 0; u < UNIT_COUNT; at += units[u].sharded_numel, u++)
        for (size_t i = 0; i < units[u].sharded_numel; i++)
            worst = fmax(worst, fabs(units[u].grad_shard[i] - before[at + i] * coefficient));
    CK_ASSERT_ALL(&ctx, worst <= 1e-7, "rank %d: clipped gradient off grad * %.6g by %.3g", ctx.rank, coefficient,
                  worst);
    double clipped = adamw_clip_grad_norm(&ctx, units, UNIT_COUNT, 1e30);
    CK_ASSERT_ALL(&ctx, fabs(clipped - max_norm) <= 1e-5 * max_norm, "rank %d: norm after clipping %.9g, expected %.9g",
                  ctx.rank, clipped, max_norm);
    CK_ASSERT_ALL(&ctx, trace_has_compute("clip_grad_norm.scale", "optimizer"), "no clip_grad_norm.scale event");

    /* A unit without a gradient counts as zero and keeps none: the norm is that of the other two, as clipped. */
    flat_param_zero_grad(&units[1]);
    expected =
        coefficient * hypot(full_gradient_norm(&units[0], 1, seed, 1), full_gradient_norm(&units[2], 1, seed, 1));
    norm = adamw_clip_grad_norm(&ctx, units, UNIT_COUNT, 1e30);
    CK_ASSERT_ALL(&ctx, fabs(norm - expected) <= 1e-5 * expected && units[1].grad_shard == NULL,
                  "rank %d: with layers.1 gradient-less the norm is %.9g, expected %.9g", ctx.rank, norm, expected);
    mem_free(&ctx.mem, before);
    for (int u = 0; u < UNIT_COUNT; u++) flat_param_free(&units[u]);
}
END_TEST

START_TEST(test_clip_grad_norm_counts_a_replicated_unit_once) {
    /* NO_SHARD: every rank holds the whole gradient; all-reducing it would count it world-size times. */
    uint64_t seed = 71;
    flat_param units[2];
    ck_assert_int_eq(flat_param_init(&units[0], &ctx, UNIT_SPECS[0].unit, UNIT_SPECS[0].specs, UNIT_SPECS[0].count), 0);
    ck_assert_int_eq(flat_param_init_replicated(&units[1], &ctx, UNIT_SPECS[1].unit, UNIT_SPECS[1].specs,
                                                UNIT_SPECS[1].count), 0);
    for (int u = 0; u < 2; u++) set_gradient(&units[u], seed, 1);
    double expected = full_gradient_norm(units, 2, seed, 1);
    double norm = adamw_clip_grad_norm(&ctx, units, 2, 1e30);
    CK_ASSERT_ALL(&ctx, fabs(norm - expected) <= TOLERANCE * expected,
                  "rank %d: sharded + replicated units: norm %.9g, expected %.9g", ctx.rank, norm, expected);
    for (int u = 0; u < 2; u++) flat_param_free(&units[u]);
}
END_TEST

int main(int argc, char **argv) {
    session_open(&ctx, &argc, &argv, "test_optim", "runs/check/test_optim");
    Suite *suite = suite_create("optim");
    TCase *tc = tcase_create("AdamW");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_steps_match_double_reference);
    tcase_add_test(tc, test_state_exists_only_for_the_shard);
    tcase_add_test(tc, test_no_gradient_no_update_no_state);
    tcase_add_test(tc, test_padding_stays_zero);
    tcase_add_test(tc, test_gathered_params_do_not_depend_on_world_size);
    tcase_add_test(tc, test_clip_grad_norm_is_the_full_norm_and_scales);
    tcase_add_test(tc, test_clip_grad_norm_counts_a_replicated_unit_once);
    suite_add_tcase(suite, tc);
    return mpi_check_run(&ctx, suite);
}
