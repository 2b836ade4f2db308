/* test_fsdp.c — the FSDP runtime's pieces that the lab 05 runs do not isolate: what each wrap policy makes units
 * of, the units' spans over the model's pieces, the refusal of an illegal state transition (with its message), and
 * that one micro-batch leaves every unit SHARDED and IDLE with no unsharded memory left. Runs at any world size. */
#include <stdlib.h>
#include <string.h>

#include "core/fsdp/fsdp.h"
#include "core/models/qwen2.h"
#include "core/runtime/session.h"
#include "mpi_check.h"

static context ctx; /* the one context of this test program */

static qwen2_config tiny(void) {
    qwen2_config config;
    qwen2_config_preset(&config, "tiny", ctx.error, sizeof ctx.error);
    return config;
}

START_TEST(test_transformer_policy_makes_one_unit_per_layer) {
    qwen2_config config = tiny();
    module_tree tree;
    ck_assert_int_eq(qwen2_module_tree(&config, &tree), 0);
    int unit_of_param[64];
    ck_assert_int_eq(fsdp_auto_wrap(&tree, fsdp_wrap_by_type, (void *)QWEN2_DECODER_LAYER, unit_of_param),
                     1 + config.num_hidden_layers);
    for (int p = 0; p < tree.param_count; p++) { /* layer l's parameters are used in piece 1 + l only */
        const module_param *param = &tree.params[p];
        int layer_piece = param->first_piece == param->last_piece && param->first_piece >= 1 &&
                          param->first_piece <= config.num_hidden_layers;
        ck_assert_int_eq(unit_of_param[p], layer_piece ? param->first_piece : 0);
    }
    module_tree_free(&tree);
}
END_TEST

START_TEST(test_size_policy_wraps_what_is_big_enough) {
    qwen2_config config = tiny();
    qwen2_model model;
    size_t min_params = 100000; /* a tiny MLP has 135,168; attention 66,048: only the MLPs are wrapped */
    qwen2_init_spec init = {.seed = 1, .std = 0.02f};
    ck_assert_msg(qwen2_model_init_wrapped(&model, &ctx, &config, fsdp_wrap_by_size, &min_params, FSDP_FULL_SHARD,
                                           &init) == 0,
                  "%s", ctx.error);
    ck_assert_int_eq(model.unit_count, 1 + config.num_hidden_layers);
    ck_assert_str_eq(model.units[0].unit, "root");
    ck_assert_str_eq(model.units[1].unit, "layers.0.mlp");
    ck_assert_str_eq(model.units[4].unit, "layers.3.mlp");
    ck_assert_int_eq(model.units[1].param_count, 3); /* gate, up, down */
    fsdp_options options = {.strategy = FSDP_FULL_SHARD, .accumulation_steps = 1};
    fsdp_runtime runtime;
    module view;
    qwen2_as_module(&model, &view);
    ck_assert_int_eq(fsdp_runtime_init(&runtime, &ctx, &view, &options), 0);
    ck_assert_int_eq(runtime.units[0].first_piece, 0);                  /* root: the whole model */
    ck_assert_int_eq(runtime.units[0].last_piece, config.num_hidden_layers + 1);
    ck_assert_int_eq(runtime.units[2].first_piece, 2);                  /* layers.1.mlp: layer 1's piece */
    ck_assert_int_eq(runtime.units[2].last_piece, 2);
    fsdp_runtime_free(&runtime);
    qwen2_model_free(&model);
    /* min 1 would wrap every module; whatever would leave the root empty stays in it (here the embedding) */
    module_tree tree;
    ck_assert_int_eq(qwen2_module_tree(&config, &tree), 0);
    int unit_of_param[64];
    min_params = 1;
    int units = fsdp_auto_wrap(&tree, fsdp_wrap_by_size, &min_params, unit_of_param);
    int modules_with_parameters = 0;
    for (int m = 0; m < tree.node_count; m++) {
        int owns = 0;
        for (int p = 0; p < tree.param_count; p++) owns |= tree.params[p].module == m;
        modules_with_parameters += owns;
    }
    /* every module that owns parameters is a unit, except the embedding, which is left to the root */
    ck_assert_int_eq(units, modules_with_parameters);
    ck_assert_int_eq(unit_of_param[0], 0); /* model.embed_tokens.weight stays with the root */
    for (int p = 1; p < tree.param_count; p++) ck_assert_int_ne(unit_of_param[p], 0);
    module_tree_free(&tree);
}
END_TEST

START_TEST(test_illegal_transition_is_refused_with_names) {
    qwen2_config config = tiny();
    qwen2_model model;
    qwen2_init_spec init = {.seed = 1, .std = 0.02f};
    ck_assert_int_eq(qwen2_model_init_wrapped(&model, &ctx, &config, fsdp_wrap_by_type, (void *)QWEN2_DECODER_LAYER,
                                              FSDP_FULL_SHARD, &init), 0);
    fsdp_options options = {.strategy = FSDP_FULL_SHARD, .accumulation_steps = 1};
    fsdp_runtime runtime;
    module view;
    qwen2_as_module(&model, &view);
    ck_assert_int_eq(fsdp_runtime_init(&runtime, &ctx, &view, &options), 0);
    /* a post-backward hook on a unit that never ran forward */
    ck_assert_int_eq(fsdp_check_transition(&runtime, 3, HANDLE_BACKWARD_PRE, HANDLE_BACKWARD_POST,
                                           "_post_backward_hook"), -1);
    ck_assert_msg(strstr(ctx.error, "unit 'layers.2': illegal HandleTrainingState transition IDLE -> BACKWARD_POST in "
                                    "_post_backward_hook (expected from BACKWARD_PRE)"),
                  "%s", ctx.error);
    ck_assert_int_eq(fsdp_check_transition(&runtime, 3, HANDLE_IDLE, HANDLE_FORWARD, "_pre_forward"), 0);
    fsdp_runtime_free(&runtime);
    qwen2_model_free(&model);
}
END_TEST

START_TEST(test_a_micro_batch_leaves_everything_sharded_and_idle) {
    qwen2_config config = tiny();
    qwen2_model model;
    qwen2_init_spec init = {.seed = 3, .std = 0.02f};
    ck_assert_int_eq(qwen2_model_init_wrapped(&model, &ctx, &config, fsdp_wrap_by_type, (void *)QWEN2_DECODER_LAYER,
                                              FSDP_FULL_SHARD, &init), 0);
    fsdp_options options = {.strategy = FSDP_FULL_SHARD, .accumulation_steps = 1};
    fsdp_runtime runtime;
    module view;
    qwen2_as_module(&model, &view);
    ck_assert_int_eq(fsdp_runtime_init(&runtime, &ctx, &view, &options), 0);
    int tokens[2 * 9], targets[2 * 9];
    for (int i = 0; i < 18; i++) tokens[i] = (i * 7 + ctx.rank) % 256, targets[i] = (i * 5 + 1) % 256;
    float loss = fsdp_forward_backward(&runtime, tokens, targets, 2, 9, FSDP_MICRO_BATCH_LAST);
    CK_ASSERT_ALL(&ctx, loss > 5.0f && loss < 6.0f, "loss %g of an untrained model is not near ln(260) = 5.56", loss);
    for (int unit = 0; unit < model.unit_count; unit++) {
        ck_assert_int_eq(runtime.units[unit].handle_state, HANDLE_IDLE);
        ck_assert_int_eq(runtime.units[unit].training_state, TRAINING_STATE_IDLE);
        ck_assert_int_eq(model.units[unit].shard_state, FLAT_PARAM_SHARDED);
        ck_assert_ptr_nonnull(model.units[unit].grad_shard);
    }
    ck_assert_uint_eq(ctx.mem.category_live_bytes[MEM_PARAM_UNSHARDED], 0);
    ck_assert_uint_eq(ctx.mem.category_live_bytes[MEM_GRAD_UNSHARDED], 0);
    ck_assert_uint_eq(ctx.mem.category_live_bytes[MEM_ACTIVATION], 0);
    fsdp_runtime_free(&runtime);
    qwen2_model_free(&model);
}
END_TEST

/* Gradient shards after two accumulated micro-batches under `options`, concatenated (malloc'ed). */
static float *gradients_after(const fsdp_options *options, size_t *count) {
    qwen2_config config = tiny();
    qwen2_model model;
    qwen2_init_spec init = {.seed = 5, .std = 0.02f};
    ck_assert_int_eq(qwen2_model_init_wrapped(&model, &ctx, &config, fsdp_wrap_by_type, (void *)QWEN2_DECODER_LAYER,
                                              options->strategy, &init), 0);
    module view;
    qwen2_as_module(&model, &view);
    fsdp_runtime runtime;
    ck_assert_msg(fsdp_runtime_init(&runtime, &ctx, &view, options) == 0, "%s", ctx.error);
    int tokens[2 * 9], targets[2 * 9];
    for (int micro = 0; micro < 2; micro++) {
        for (int i = 0; i < 18; i++) tokens[i] = (i * 7 + ctx.rank + micro) % 256, targets[i] = (i * 5 + micro) % 256;
        fsdp_forward_backward(&runtime, tokens, targets, 2, 9,
                              micro == 1 ? FSDP_MICRO_BATCH_LAST : FSDP_MICRO_BATCH_ACCUMULATE);
    }
    *count = 0;
    for (int unit = 0; unit < model.unit_count; unit++) *count += model.units[unit].sharded_numel;
    float *copy = malloc(*count * sizeof *copy);
    ck_assert_ptr_nonnull(copy);
    size_t offset = 0;
    for (int unit = 0; unit < model.unit_count; unit++) {
        ck_assert_msg(!flat_param_unshard_pending(&model.units[unit]) && !model.units[unit].reduce_handle.active,
                      "unit %d: a collective is still in flight after the micro-batch", unit);
        memcpy(copy + offset, model.units[unit].grad_shard, model.units[unit].sharded_numel * sizeof(float));
        offset += model.units[unit].sharded_numel;
    }
    ck_assert_uint_eq(ctx.mem.category_live_bytes[MEM_PARAM_UNSHARDED], 0);
    ck_assert_uint_eq(ctx.mem.category_live_bytes[MEM_GRAD_UNSHARDED], 0);
    fsdp_runtime_free(&runtime);
    qwen2_model_free(&model);
    return copy;
}

/* Prefetch and streams change when collectives run, never what they compute: every mode's gradients equal the
 * blocking runtime's bit for bit, for every strategy (NO_SHARD's all-reduce runs on the stream too). */
START_TEST(test_prefetch_modes_give_the_same_gradients) {
    for (int strategy = FSDP_FULL_SHARD; strategy <= FSDP_NO_SHARD; strategy++) {
        fsdp_options blocking = {.strategy = (fsdp_strategy)strategy, .accumulation_steps = 2};
        size_t expected_count, count;
        float *expected = gradients_after(&blocking, &expected_count);
        fsdp_options modes[4];
        for (int m = 0; m < 4; m++) {
            modes[m] = fsdp_default_options();
            modes[m].strategy = (fsdp_strategy)strategy;
            modes[m].accumulation_steps = 2;
        }
        modes[1].backward_prefetch = BACKWARD_PREFETCH_NONE;
        modes[2].backward_prefetch = BACKWARD_POST;
        modes[3].forward_prefetch = 1, modes[3].limit_all_gathers = 0;
        for (int m = 0; m < 4; m++) {
            float *got = gradients_after(&modes[m], &count);
            CK_ASSERT_ALL(&ctx, count == expected_count && memcmp(got, expected, count * sizeof(float)) == 0,
                          "%s, mode %d (backward_prefetch %s, forward_prefetch %d): gradients differ from the "
                          "blocking runtime's", fsdp_strategy_name((fsdp_strategy)strategy), m,
                          fsdp_backward_prefetch_name(modes[m].backward_prefetch), modes[m].forward_prefetch);
            free(got);
        }
        free(expected);
    }
}
END_TEST

int main(int argc, char **argv) {
    session_open(&ctx, &argc, &argv, "test_fsdp", "runs/check/test_fsdp");
    Suite *suite = suite_create("fsdp");
    TCase *tc = tcase_create("runtime");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_transformer_policy_makes_one_unit_per_layer);
    tcase_add_test(tc, test_size_policy_wraps_what_is_big_enough);
    tcase_add_test(tc, test_illegal_transition_is_refused_with_names);
    tcase_add_test(tc, test_a_micro_batch_leaves_everything_sharded_and_idle);
    tcase_add_test(tc, test_prefetch_modes_give_the_same_gradients);
    suite_add_tcase(suite, tc);
    return mpi_check_run(&ctx, suite);
}
