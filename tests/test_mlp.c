/* test_mlp.c — MlpLM, the second model under the FSDP runtime: its tree and units, its gradient against finite
 * differences of its loss (through the module ops, every unit unsharded), and the runtime's gradients and losses
 * against the same model run through its ops directly, for every strategy, prefetch mode, activation checkpointing
 * and gradient accumulation. Every rank runs the same batch, so the runtime's average over ranks is the single
 * batch's gradient. Runs at any world size (the unit suite runs 1, 2 and 3). */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fsdp/fsdp.h"
#include "core/models/mlp.h"
#include "core/base/rng.h"
#include "core/runtime/session.h"
#include "mpi_check.h"

static context ctx; /* the one context of this test program */

/* Odd sizes, so no unit's numel divides by 2 or 3 by luck and the padding is exercised. */
static mlp_config small_config(void) {
    return (mlp_config){.vocab_size = 13, .hidden_size = 8, .mlp_hidden = 12, .num_blocks = 3, .init_std = 0.4f,
                        .seed = 7};
}

enum { B = 2, T = 5, N = B * T };

/* Micro-batch m's tokens and targets: the same on every rank; next-token targets, the last position ignored, and
 * one more ignored target in the middle so -100 is exercised. */
static void make_batch(int *tokens, int *targets, int V, int micro) {
    for (int i = 0; i < N; i++) tokens[i] = (int)(rng_bits(3, 100 + (uint64_t)micro, (uint64_t)i) % (uint64_t)V);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) targets[b * T + t] = t + 1 < T ? tokens[b * T + t + 1] : MLP_IGNORE_INDEX;
    targets[2] = MLP_IGNORE_INDEX;
}

static size_t total_numel(const module_tree *tree) {
    size_t total = 0;
    for (int p = 0; p < tree->param_count; p++) total += module_param_numel(&tree->params[p]);
    return total;
}

/* ---------------------------------------------------------------- the model through its ops, no runtime */

/* Forward of every piece (no checkpointing); with backward, then every piece's backward in reverse, adding into the
 * units' full gradients (which must exist). Returns the loss. */
static float run_ops(mlp_model *model, const int *tokens, const int *targets, int backward, float loss_scale) {
    module view;
    mlp_as_module(model, &view);
    void *batch = NULL;
    ck_assert_msg(view.ops->batch_begin(view.self, &batch, tokens, targets, B, T, NULL) == 0, "%s", ctx.error);
    for (int piece = 0; piece < view.piece_count; piece++) view.ops->forward(view.self, batch, piece, 0);
    if (backward) {
        if (loss_scale != 1.0f) view.ops->scale_loss_gradient(view.self, batch, loss_scale);
        for (int piece = view.piece_count - 1; piece >= 0; piece--) view.ops->backward(view.self, batch, piece);
    }
    float loss = view.ops->loss(view.self, batch);
    view.ops->batch_end(view.self, batch);
    return loss;
}

/* ---------------------------------------------------------------- tree, units, refusals */

START_TEST(test_tree_names_pieces_and_units) {
    mlp_config config = small_config();
    module_tree tree;
    ck_assert_int_eq(mlp_module_tree(&config, &tree), 0);
    int n = config.num_blocks;
    ck_assert_int_eq(tree.node_count, 4 + 3 * n);
    ck_assert_int_eq(tree.param_count, 3 + 4 * n);
    ck_assert_str_eq(tree.nodes[0].name, "");
    ck_assert_str_eq(tree.nodes[0].type, "MlpLM");
    ck_assert_str_eq(tree.params[0].name, "embed.weight");
    ck_assert_str_eq(tree.params[1].name, "blocks.0.fc1.weight");
    ck_assert_str_eq(tree.params[2].name, "blocks.0.fc1.bias");
    ck_assert_str_eq(tree.params[4].name, "blocks.0.fc2.bias");
    ck_assert_str_eq(tree.params[5].name, "blocks.1.fc1.weight");
    ck_assert_str_eq(tree.params[tree.param_count - 2].name, "head.weight");
    ck_assert_str_eq(tree.params[tree.param_count - 1].name, "head.bias");
    ck_assert_int_eq(tree.params[3].shape[0], config.hidden_size); /* fc2.weight (C, H), as torch's Linear(H, C) */
    ck_assert_int_eq(tree.params[3].shape[1], config.mlp_hidden);
    for (int p = 0; p < tree.param_count; p++) {
        const module_param *param = &tree.params[p];
        const char *owner = tree.nodes[param->module].name;
        ck_assert_msg(strncmp(param->name, owner, strlen(owner)) == 0, "%s not under %s", param->name, owner);
        ck_assert_int_eq(param->first_piece, param->last_piece);
        int expected = p == 0 ? 0 : p >= tree.param_count - 2 ? n + 1 : 1 + (p - 1) / 4;
        ck_assert_msg(param->first_piece == expected, "%s: piece %d, expected %d", param->name, param->first_piece,
                      expected);
    }
    size_t V = 13, C = 8, H = 12;
    ck_assert_uint_eq(total_numel(&tree), 2 * V * C + V + n * (2 * H * C + H + C));
    /* wrapped by type: the root keeps embed and head, each block is a unit spanning its own piece */
    int unit_of_param[64];
    ck_assert_int_eq(fsdp_auto_wrap(&tree, fsdp_wrap_by_type, (void *)MLP_BLOCK, unit_of_param), 1 + n);
    mlp_model model;
    ck_assert_msg(mlp_model_init(&model, &ctx, &config, unit_of_param, 1 + n, 0) == 0, "%s", ctx.error);
    ck_assert_str_eq(model.units[0].unit, "root");
    ck_assert_str_eq(model.units[2].unit, "blocks.1");
    ck_assert_int_eq(model.units[0].param_count, 3);
    module view;
    mlp_as_module(&model, &view);
    fsdp_options options = {.strategy = FSDP_FULL_SHARD, .accumulation_steps = 1, .activation_checkpointing = 1};
    fsdp_runtime runtime;
    ck_assert_int_eq(fsdp_runtime_init(&runtime, &ctx, &view, &options), 0);
    ck_assert_int_eq(runtime.units[0].first_piece, 0);
    ck_assert_int_eq(runtime.units[0].last_piece, n + 1);
    for (int i = 0; i < n; i++) {
        ck_assert_int_eq(runtime.units[1 + i].first_piece, 1 + i);
        ck_assert_int_eq(runtime.units[1 + i].last_piece, 1 + i);
        ck_assert_int_eq(runtime.checkpointed[1 + i], 1);
    }
    ck_assert_int_eq(runtime.checkpointed[0], 0);
    ck_assert_int_eq(runtime.checkpointed[n + 1], 0);
    fsdp_runtime_free(&runtime);
    mlp_model_free(&model);
    /* the size policy with a threshold between a Linear (C*H + H = 108 or 104) and a block (212): one unit per block */
    size_t min_params = 150;
    ck_assert_int_eq(fsdp_auto_wrap(&tree, fsdp_wrap_by_size, &min_params, unit_of_param), 1 + n);
    module_tree_free(&tree);
}
END_TEST

START_TEST(test_bad_config_and_batch_are_refused_with_values) {
    mlp_config config = small_config();
    mlp_model model;
    config.mlp_hidden = 0;
    ck_assert_int_eq(mlp_model_init_wrapped(&model, &ctx, &config, fsdp_wrap_by_type, (void *)MLP_BLOCK,
                                            FSDP_FULL_SHARD), -1);
    ck_assert_msg(strstr(ctx.error, "mlp_hidden 0, need >= 1"), "%s", ctx.error);
    mlp_model_free(&model);
    config = small_config();
    config.init_std = -1.0f;
    ck_assert_int_eq(mlp_model_init_wrapped(&model, &ctx, &config, fsdp_wrap_by_type, (void *)MLP_BLOCK,
                                            FSDP_FULL_SHARD), -1);
    ck_assert_msg(strstr(ctx.error, "init_std -1"), "%s", ctx.error);
    mlp_model_free(&model);
    config = small_config();
    ck_assert_int_eq(mlp_model_init_wrapped(&model, &ctx, &config, fsdp_wrap_by_type, (void *)MLP_BLOCK,
                                            FSDP_FULL_SHARD), 0);
    module view;
    mlp_as_module(&model, &view);
    int tokens[N], targets[N];
    make_batch(tokens, targets, config.vocab_size, 0);
    void *batch = NULL;
    tokens[7] = 13;
    ck_assert_int_eq(view.ops->batch_begin(view.self, &batch, tokens, targets, B, T, NULL), -1);
    char expected[128];
    snprintf(expected, sizeof expected, "rank %d: MlpLM: token 13 at batch row 1, position 2 is outside the vocabulary "
             "0..12", ctx.rank);
    ck_assert_msg(strstr(ctx.error, expected), "%s", ctx.error);
    tokens[7] = 0, targets[4] = -1;
    ck_assert_int_eq(view.ops->batch_begin(view.self, &batch, tokens, targets, B, T, NULL), -1);
    ck_assert_msg(strstr(ctx.error, "target -1 at batch row 0, position 4"), "%s", ctx.error);
    ck_assert_int_eq(view.ops->batch_begin(view.self, &batch, tokens, targets, 0, T, NULL), -1);
    ck_assert_msg(strstr(ctx.error, "batch 0 x 5"), "%s", ctx.error);
    ck_assert_uint_eq(ctx.mem.category_live_bytes[MEM_DATA], 0); /* a refused batch leaves nothing behind */
    mlp_model_free(&model);
}
END_TEST

/* ---------------------------------------------------------------- finite differences */

/* The loss is a float32 pipeline (embedding, GEMMs, GELU; the cross-entropy sums in double and returns a float), so
 * a central difference along a unit direction e with step h,
 *     D(h) = (f(x + h e) - f(x - h e)) / (2h),
 * differs from the exact directional derivative g.e by at most
 *     truncation  h^2/6 * |f'''_e|     (Taylor: the even terms cancel)
 *   + rounding    2 delta_f / (2h) = delta_f / h,   delta_f the absolute error of one evaluation of f.
 * delta_f: the returned float is rounded once (u |f|, u = 2^-24); each logit it reads carries the roundings of about
 * K = (C + H)(n + 1) + 1 float operations on terms of magnitude <= 3, and the mean cross-entropy moves by at most
 * 2 max|d logit| (sum_j |p_j - y_j| <= 2). The worst case adds the K roundings in line (2 * 3 K u); independent
 * roundings add like sqrt(K) (Higham, Accuracy and Stability, 2.8), which we take: delta_f = u (|f| + 2 * 3 sqrt(K)).
 * Here K = 81, f ~ 3: delta_f = 3.4e-6.
 * f''': the step moves one coordinate (or a unit random-sign direction) of weights of ~0.4 through at most 3 blocks
 * and the softmax (whose third derivative is <= 0.1); we take |f'''_e| <= M3 = 5 and CHECK it on every direction:
 * Richardson's D(2h) - D(h) = 3 h^2 f'''_e / 6 + O(h^4), so |D(2h) - D(h)| <= 3 h^2 M3 / 6 + 3 delta_f / (2h).
 * h = 1e-2 is near the optimum (3 delta_f / M3)^(1/3) = 1.3e-2: tolerance = 8.3e-5 + 3.4e-4 = 4.2e-4, against
 * gradients of 3e-3 .. 4e-1. Measured (this config, x86 OpenBLAS): largest error 1.8e-5, the quantum of f's float
 * rounding (ulp(3) / 2h = 1.2e-5); the test prints the largest error / tolerance it saw. */
#define FD_STEP 1e-2
#define FD_M3 5.0

static double fd_delta_f(const mlp_config *c, double f) {
    double K = (double)(c->hidden_size + c->mlp_hidden) * (c->num_blocks + 1) + 1;
    return ldexp(1.0, -24) * (fabs(f) + 2.0 * 3.0 * sqrt(K));
}

/* f at x + step * direction, where direction lists (param, index, weight) triples over the unsharded units. */
typedef struct fd_direction {
    int count;
    float **at;                   /* element addresses in the unsharded buffers */
    double *weight;               /* unit norm over the listed elements */
} fd_direction;

static double loss_along(mlp_model *model, const fd_direction *d, double step, const int *tokens, const int *targets) {
    float *saved = malloc((size_t)d->count * sizeof *saved);
    ck_assert_ptr_nonnull(saved);
    for (int k = 0; k < d->count; k++) saved[k] = *d->at[k], *d->at[k] = (float)(saved[k] + step * d->weight[k]);
    double loss = run_ops(model, tokens, targets, 0, 1.0f);
    for (int k = 0; k < d->count; k++) *d->at[k] = saved[k];
    free(saved);
    return loss;
}

START_TEST(test_gradient_matches_finite_differences) {
    mlp_config config = small_config();
    mlp_model model;
    ck_assert_msg(mlp_model_init_wrapped(&model, &ctx, &config, fsdp_wrap_by_type, (void *)MLP_BLOCK,
                                         FSDP_FULL_SHARD) == 0,
                  "%s", ctx.error);
    for (int unit = 0; unit < model.unit_count; unit++) {
        flat_param *fp = &model.units[unit];
        ck_assert_int_eq(flat_param_unshard(fp, "test"), 0);
        /* noise on everything, so the biases are not 0 and no weight sits at a special point */
        for (size_t i = 0; i < fp->unpadded_numel; i++)
            fp->full_param_padded[i] += 0.2f * (rng_uniform(9, (uint64_t)unit, i) - 0.5f);
        flat_param_alloc_full_grad(fp);
    }
    int tokens[N], targets[N];
    make_batch(tokens, targets, config.vocab_size, 0);
    double f = run_ops(&model, tokens, targets, 1, 1.0f);
    ck_assert_msg(isfinite(f) && f > 1.0 && f < 5.0, "loss %g", f);
    /* the rounding of f at the perturbed points is the same order: |f| varies by far less than 1 over the steps */
    double h = FD_STEP, delta_f = fd_delta_f(&config, f);
    double tolerance = h * h / 6 * FD_M3 + delta_f / h;
    double richardson_tolerance = 3 * h * h / 6 * FD_M3 + 3 * delta_f / (2 * h);
    double worst_ratio = 0, worst_richardson = 0;
    int failures = 0, checks = 0;
    char first_failure[256] = "";
    for (int p = 0; p < model.tree.param_count; p++) {
        const module_param *param = &model.tree.params[p];
        size_t numel = module_param_numel(param);
        float *data = mlp_param_data(&model, p);
        const float *grad = mlp_param_grad(&model, p);
        /* directions: 3 single elements, then the whole tensor with random signs (unit norm) */
        for (int s = 0; s < 4; s++) {
            fd_direction d;
            int whole = s == 3;
            d.count = whole ? (int)numel : 1;
            d.at = malloc((size_t)d.count * sizeof *d.at);
            d.weight = malloc((size_t)d.count * sizeof *d.weight);
            ck_assert(d.at != NULL && d.weight != NULL);
            double analytic = 0;
            for (int k = 0; k < d.count; k++) {
                size_t i = whole ? (size_t)k : (size_t)(rng_bits(1, (uint64_t)p, (uint64_t)s) % numel);
                if (!whole && p == 0) /* an embedding row the batch reads (the others' gradient is 0 = 0) */
                    i = (size_t)tokens[(3 * s + 1) % N] * (size_t)config.hidden_size + i % (size_t)config.hidden_size;
                d.at[k] = data + i;
                d.weight[k] = whole ? ((rng_bits(2, (uint64_t)p, i) & 1) ? 1.0 : -1.0) / sqrt((double)numel) : 1.0;
                analytic += d.weight[k] * grad[i];
            }
            double numeric = (loss_along(&model, &d, h, tokens, targets) -
                              loss_along(&model, &d, -h, tokens, targets)) / (2 * h);
            double numeric2 = (loss_along(&model, &d, 2 * h, tokens, targets) -
                               loss_along(&model, &d, -2 * h, tokens, targets)) / (4 * h);
            double error = fabs(numeric - analytic), richardson = fabs(numeric2 - numeric);
            if (error / tolerance > worst_ratio) worst_ratio = error / tolerance;
            if (richardson / richardson_tolerance > worst_richardson)
                worst_richardson = richardson / richardson_tolerance;
            checks++;
            if ((error > tolerance || richardson > richardson_tolerance) && failures++ == 0)
                snprintf(first_failure, sizeof first_failure, "%s %s: analytic %.6g, numeric %.6g (h) %.6g (2h); "
                         "tolerance %.3g, Richardson %.3g", param->name, whole ? "random-sign direction" : "element",
                         analytic, numeric, numeric2, tolerance, richardson_tolerance);
            free(d.at);
            free(d.weight);
        }
    }
    if (ctx.rank == 0)
        printf("finite differences: %d directions, loss %.6f, tolerance %.3g; largest error / tolerance %.3f, largest "
               "|D(2h) - D(h)| / its bound %.3f\n", checks, f, tolerance, worst_ratio, worst_richardson);
    mlp_model_free(&model); /* before asserting: a failure here must not leave unsharded units to the next test */
    CK_ASSERT_ALL(&ctx, failures == 0, "%d of %d directions off; first: %s", failures, checks, first_failure);
    ck_assert_uint_eq(ctx.mem.category_live_bytes[MEM_ACTIVATION], 0); /* backward and batch_end freed everything */
    ck_assert_uint_eq(ctx.mem.category_live_bytes[MEM_WORKSPACE], 0);
    ck_assert_uint_eq(ctx.mem.category_live_bytes[MEM_DATA], 0);
}
END_TEST

/* ---------------------------------------------------------------- under the runtime */

/* Every parameter's gradient in tree order, one array (the total numel). */
typedef struct gradients {
    float *values;
    double *magnitudes;           /* the reference's: sum over micro-batches of |gradient| (for the tolerance) */
    float losses[2];
} gradients;

static void copy_gradients(const mlp_model *model, float *out) {
    size_t offset = 0;
    for (int p = 0; p < model->tree.param_count; p++) {
        size_t numel = module_param_numel(&model->tree.params[p]);
        memcpy(out + offset, mlp_param_grad(model, p), numel * sizeof(float));
        offset += numel;
    }
}

/* The reference: one replicated unit holding everything (no collective, no runtime), each micro-batch's gradient
 * computed into a zeroed buffer and then added to the total, in the order the runtime's gradient shard adds them.
 * The runtime scales the loss's gradient by 1/M (M micro-batches) through the model's scale_loss_gradient; the
 * reference does not use it (it is under test) but scales each micro-batch's gradient afterwards. For M a power of
 * two that is the same bits: every op of backward (products, sums, GELU's dact * gelu') commutes exactly with a
 * power-of-two factor, barring underflow. */
static gradients reference_gradients(const mlp_config *config, int micro_batches) {
    mlp_model model;
    int unit_of_param[64] = {0};
    ck_assert_msg(mlp_model_init(&model, &ctx, config, unit_of_param, 1, 1) == 0, "%s", ctx.error);
    ck_assert_int_eq(flat_param_unshard(&model.units[0], "reference"), 0);
    size_t total = total_numel(&model.tree);
    gradients out = {.values = calloc(total, sizeof(float)), .magnitudes = calloc(total, sizeof(double))};
    float *micro = malloc(total * sizeof(float));
    ck_assert(out.values != NULL && out.magnitudes != NULL && micro != NULL);
    for (int m = 0; m < micro_batches; m++) {
        int tokens[N], targets[N];
        make_batch(tokens, targets, config->vocab_size, m);
        flat_param_alloc_full_grad(&model.units[0]);
        out.losses[m] = run_ops(&model, tokens, targets, 1, 1.0f);
        copy_gradients(&model, micro);
        for (size_t i = 0; i < total; i++) micro[i] *= 1.0f / (float)micro_batches;
        flat_param_free_full_grad(&model.units[0]);
        for (size_t i = 0; i < total; i++) {
            out.values[i] = m == 0 ? micro[i] : out.values[i] + micro[i];
            out.magnitudes[i] += fabs(micro[i]);
        }
    }
    free(micro);
    mlp_model_free(&model);
    return out;
}

/* The runtime's: wrapped by type (one unit per block), `micro_batches` micro-batches, then every unit's gradient
 * shard all-gathered (flat_param_gather_grad). Checks that the step left every unit SHARDED and IDLE and no model
 * memory. */
static gradients runtime_gradients(const mlp_config *config, const fsdp_options *options, int micro_batches,
                                   size_t *checkpoint_peak, size_t *activation_peak) {
    mlp_model model;
    ck_assert_msg(mlp_model_init_wrapped(&model, &ctx, config, fsdp_wrap_by_type, (void *)MLP_BLOCK,
                                         options->strategy) == 0, "%s", ctx.error);
    ck_assert_int_eq(model.unit_count, 1 + config->num_blocks);
    module view;
    mlp_as_module(&model, &view);
    fsdp_runtime runtime;
    ck_assert_msg(fsdp_runtime_init(&runtime, &ctx, &view, options) == 0, "%s", ctx.error);
    gradients out = {.values = calloc(total_numel(&model.tree), sizeof(float))};
    ck_assert_ptr_nonnull(out.values);
    mem_reset_peak(&ctx.mem);
    for (int m = 0; m < micro_batches; m++) {
        int tokens[N], targets[N];
        make_batch(tokens, targets, config->vocab_size, m);
        out.losses[m] =
            fsdp_forward_backward(&runtime, tokens, targets, B, T,
                                  m == micro_batches - 1 ? FSDP_MICRO_BATCH_LAST : FSDP_MICRO_BATCH_ACCUMULATE);
    }
    *checkpoint_peak = ctx.mem.category_peak_bytes[MEM_CHECKPOINT_INPUT];
    *activation_peak = ctx.mem.category_peak_bytes[MEM_ACTIVATION];
    for (int unit = 0; unit < model.unit_count; unit++) {
        ck_assert_int_eq(runtime.units[unit].handle_state, HANDLE_IDLE);
        ck_assert_int_eq(runtime.units[unit].training_state, TRAINING_STATE_IDLE);
        ck_assert_int_eq(model.units[unit].shard_state, FLAT_PARAM_SHARDED);
    }
    for (int category = MEM_PARAM_UNSHARDED; category < MEM_CATEGORY_COUNT; category++)
        if (category != MEM_GRAD_SHARD && category != MEM_OPTIM_STATE)
            ck_assert_msg(ctx.mem.category_live_bytes[category] == 0, "%s: %zu bytes live after the step",
                          mem_category_name((mem_category)category), ctx.mem.category_live_bytes[category]);
    for (int unit = 0; unit < model.unit_count; unit++) ck_assert_int_eq(flat_param_gather_grad(&model.units[unit]), 0);
    copy_gradients(&model, out.values);
    for (int unit = 0; unit < model.unit_count; unit++) flat_param_free_full_grad(&model.units[unit]);
    fsdp_runtime_free(&runtime);
    mlp_model_free(&model);
    return out;
}

/* The runtime averages the W ranks' equal gradients g: a ring sum then a product by the float 1/W. At W <= 2 that
 * is exact (g + g = 2g exactly, 1/2 and 2g * 0.5 exact), so the gradients must be bit-identical. At W >= 3 the sum
 * rounds W - 2 times (g + g is exact), 1/W rounds once and the product once: |error| <= W u |g|, plus W * FLT_TRUE_MIN
 * for the product's underflow when g is subnormal. With M accumulated micro-batches each average errs so, and the
 * M - 1 additions into the gradient shard, the same as the reference's but on those perturbed values, may each round
 * to a neighbour: W u sum_m |g_m| + (M - 1) u |g| + M W FLT_TRUE_MIN. Losses are this rank's forward on the same
 * numbers: identical at any W. */
static double average_tolerance(double magnitude, float total, int micro_batches) {
    if (ctx.world_size <= 2) return 0.0;
    double u = ldexp(1.0, -24);
    return ctx.world_size * u * magnitude + (micro_batches - 1) * u * fabs(total) +
           micro_batches * ctx.world_size * (double)FLT_TRUE_MIN;
}

static double worst_average_ratio; /* the largest |runtime - reference| / tolerance seen at W >= 3, printed */

static int compare(const mlp_config *config, const gradients *expected, const gradients *got, int micro_batches,
                   int exact, char *message, size_t size) {
    module_tree tree;
    ck_assert_int_eq(mlp_module_tree(config, &tree), 0);
    int bad = 0;
    for (int m = 0; m < micro_batches && !bad; m++)
        if (memcmp(&expected->losses[m], &got->losses[m], sizeof(float)) != 0)
            bad = 1, snprintf(message, size, "micro-batch %d: loss %.9g, expected %.9g", m, got->losses[m],
                              expected->losses[m]);
    size_t offset = 0;
    for (int p = 0; p < tree.param_count && !bad; p++) {
        size_t numel = module_param_numel(&tree.params[p]);
        for (size_t i = 0; i < numel && !bad; i++) {
            float e = expected->values[offset + i], g = got->values[offset + i];
            double tolerance = exact ? 0.0 : average_tolerance(expected->magnitudes[offset + i], e, micro_batches);
            int same = tolerance == 0.0 ? memcmp(&e, &g, sizeof e) == 0 : fabs((double)g - e) <= tolerance;
            if (tolerance > 0.0 && fabs((double)g - e) / tolerance > worst_average_ratio)
                worst_average_ratio = fabs((double)g - e) / tolerance;
            if (!same)
                bad = 1, snprintf(message, size, "%s[%zu]: %.9g, expected %.9g (tolerance %.3g)", tree.params[p].name,
                                  i, g, e, tolerance);
        }
        offset += numel;
    }
    module_tree_free(&tree);
    return bad;
}

START_TEST(test_runtime_matches_the_model_alone) {
    mlp_config config = small_config();
    typedef struct mode {
        const char *name;
        fsdp_options options;
    } mode;
    fsdp_options blocking = {.strategy = FSDP_FULL_SHARD, .accumulation_steps = 1}; /* lab 05's runtime */
    fsdp_options prefetch = fsdp_default_options();                                    /* BACKWARD_PRE, streams */
    prefetch.forward_prefetch = 1;
    fsdp_options post = fsdp_default_options();
    post.backward_prefetch = BACKWARD_POST;
    fsdp_options checkpointing = fsdp_default_options();
    checkpointing.activation_checkpointing = 1;
    fsdp_options shard_grad_op = fsdp_default_options();
    shard_grad_op.strategy = FSDP_SHARD_GRAD_OP;
    fsdp_options no_shard = fsdp_default_options();
    no_shard.strategy = FSDP_NO_SHARD;
    fsdp_options accumulate = fsdp_default_options();
    accumulate.accumulation_steps = 2;
    mode modes[] = {
        {"FULL_SHARD blocking, no prefetch", blocking},
        {"FULL_SHARD BACKWARD_PRE + forward_prefetch on comm streams", prefetch},
        {"FULL_SHARD BACKWARD_POST", post},
        {"FULL_SHARD activation checkpointing", checkpointing},
        {"SHARD_GRAD_OP", shard_grad_op},
        {"NO_SHARD", no_shard},
        {"FULL_SHARD 2 accumulated micro-batches", accumulate},
    };
    int mode_count = (int)(sizeof modes / sizeof modes[0]);
    gradients reference[3] = {{0}};
    reference[1] = reference_gradients(&config, 1);
    reference[2] = reference_gradients(&config, 2);
    gradients no_prefetch = {0};
    for (int m = 0; m < mode_count; m++) {
        int micro_batches = modes[m].options.accumulation_steps;
        size_t checkpoint_peak, activation_peak;
        gradients got =
            runtime_gradients(&config, &modes[m].options, micro_batches, &checkpoint_peak, &activation_peak);
        char message[256] = "";
        int bad = compare(&config, &reference[micro_batches], &got, micro_batches, 0, message, sizeof message);
        CK_ASSERT_ALL(&ctx, !bad, "%s, world %d: differs from the model run alone: %s", modes[m].name,
                      ctx.world_size, message);
        /* prefetch and streams change when collectives run, never what they compute: bit for bit at any W */
        if (m == 0) no_prefetch = got;
        else {
            if (m <= 2) {
                bad = compare(&config, &no_prefetch, &got, 1, 1, message, sizeof message);
                CK_ASSERT_ALL(&ctx, !bad, "%s: differs from the blocking runtime's: %s", modes[m].name, message);
            }
            free(got.values);
        }
        /* The activation memory plan, in floats (n blocks, N x C residuals, N x H fc1 and GELU outputs, N x V
         * logits and their gradient). Without checkpointing the peak is at the head's backward: every residual
         * (n + 1) NC, every block's pre and act 2nNH, logits and dlogits 2NV, and the head's input gradient NC.
         * Checkpointing keeps each block's input apart (checkpoint_input, nNC) and one block's pre and act at a
         * time: the peak is the larger of the head's backward (its input, logits, dlogits, its input gradient:
         * 2NC + 2NV) and a block's backward (recomputed pre and act, the gradients of its output and input:
         * 2NH + 2NC). */
        size_t n = (size_t)config.num_blocks, C = (size_t)config.hidden_size, H = (size_t)config.mlp_hidden;
        size_t V = (size_t)config.vocab_size, floats = sizeof(float);
        size_t plain_peak = ((n + 2) * N * C + 2 * n * N * H + 2 * N * V) * floats;
        size_t checkpointed_peak = (2 * N * C + 2 * N * (V > H ? V : H)) * floats;
        if (m == 3) {
            ck_assert_uint_eq(checkpoint_peak, n * N * C * floats);
            ck_assert_msg(activation_peak == checkpointed_peak, "activation peak %zu bytes with checkpointing, "
                          "expected %zu (%zu without)", activation_peak, checkpointed_peak, plain_peak);
        } else {
            ck_assert_uint_eq(checkpoint_peak, 0);
            ck_assert_msg(activation_peak == plain_peak, "%s: activation peak %zu bytes, expected %zu", modes[m].name,
                          activation_peak, plain_peak);
        }
    }
    if (ctx.rank == 0)
        printf("runtime vs the model alone, world %d: %s\n", ctx.world_size, ctx.world_size <= 2
               ? "bit-identical in every mode" : "within tolerance");
    if (ctx.rank == 0 && ctx.world_size > 2)
        printf("largest |difference| / tolerance %.3f\n", worst_average_ratio);
    free(no_prefetch.values);
    for (int m = 1; m <= 2; m++) free(reference[m].values), free(reference[m].magnitudes);
}
END_TEST

int main(int argc, char **argv) {
    session_open(&ctx, &argc, &argv, "test_mlp", "runs/check/test_mlp");
    Suite *suite = suite_create("mlp");
    TCase *tc = tcase_create("mlp");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_tree_names_pieces_and_units);
    tcase_add_test(tc, test_bad_config_and_batch_are_refused_with_values);
    tcase_add_test(tc, test_gradient_matches_finite_differences);
    tcase_add_test(tc, test_runtime_matches_the_model_alone);
    suite_add_tcase(suite, tc);
    return mpi_check_run(&ctx, suite);
}
