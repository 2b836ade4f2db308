/* test_qwen2.c — the model in C alone (HF parity is tests/test_hf_parity.py): presets and config.json, the module
 * tree, init statistics, the whole model's gradient against finite differences of its loss, activation memory
 * returning to zero, checkpoint round trip and refusals, token checks, generation (the KV cache's tokens equal the
 * uncached reference's). One rank. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/io/pretrained.h"
#include "core/fsdp/fsdp.h"
#include "core/models/qwen2.h"
#include "core/base/rng.h"
#include "core/io/safetensors.h"
#include "core/runtime/session.h"
#include "mpi_check.h"

static context ctx; /* the one context of this test program */

/* A model small enough for finite differences over the whole network: 2 layers, GQA, odd sizes. */
static qwen2_config small_config(void) {
    qwen2_config config;
    qwen2_config_preset(&config, "tiny", ctx.error, sizeof ctx.error);
    snprintf(config.name, sizeof config.name, "small");
    config.vocab_size = 37;
    config.hidden_size = 16;
    config.intermediate_size = 24;
    config.num_hidden_layers = 2;
    config.num_attention_heads = 4;
    config.num_key_value_heads = 2;
    config.head_dim = 4;
    config.max_position_embeddings = 32;
    return config;
}

static void make_model_with_std(qwen2_model *model, const qwen2_config *config, uint64_t seed, float std) {
    qwen2_init_spec init = {.seed = seed, .std = std};
    ck_assert_msg(qwen2_model_init_wrapped(model, &ctx, config, fsdp_wrap_by_type, (void *)QWEN2_DECODER_LAYER,
                                           FSDP_FULL_SHARD, &init) == 0,
                  "%s", ctx.error);
    for (int unit = 0; unit < model->unit_count; unit++)
        ck_assert_int_eq(flat_param_unshard(&model->units[unit], "test"), 0);
}

static void make_model(qwen2_model *model, const qwen2_config *config, uint64_t seed) {
    make_model_with_std(model, config, seed, 0.02f);
}

static void make_batch(int *tokens, int *targets, int B, int T, int V) {
    for (int i = 0; i < B * T; i++) tokens[i] = (int)(rng_bits(3, 4, (uint64_t)i) % (uint64_t)V);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) targets[b * T + t] = t + 1 < T ? tokens[b * T + t + 1] : QWEN2_IGNORE_INDEX;
}

/* The loss alone (forward only, with targets), for finite differences. */
static double loss_of(qwen2_model *model, const int *tokens, const int *targets, int B, int T) {
    qwen2_activations acts;
    ck_assert_int_eq(qwen2_activations_begin(model, &acts, tokens, targets, B, T), 0);
    qwen2_embed_forward(model, &acts);
    for (int l = 0; l < model->config.num_hidden_layers; l++) qwen2_layer_forward(model, &acts, l);
    double loss = qwen2_head_forward(model, &acts);
    qwen2_activations_end(model, &acts);
    return loss;
}

START_TEST(test_presets_and_config_json_round_trip) {
    qwen2_config big, tiny, back;
    ck_assert_int_eq(qwen2_config_preset(&big, "qwen2-0.5b", ctx.error, sizeof ctx.error), 0);
    ck_assert_int_eq(big.head_dim, 64);
    ck_assert_int_eq(qwen2_config_validate(&big, ctx.error, sizeof ctx.error), 0);
    ck_assert_int_eq(qwen2_config_preset(&tiny, "tiny", ctx.error, sizeof ctx.error), 0);
    /* The seed's name for Qwen2-0.5B is the same preset, named as the preset. */
    qwen2_config alias;
    ck_assert_int_eq(qwen2_config_preset(&alias, "qwen2", ctx.error, sizeof ctx.error), 0);
    ck_assert(alias.vocab_size == big.vocab_size && alias.hidden_size == big.hidden_size &&
              alias.intermediate_size == big.intermediate_size && alias.num_hidden_layers == big.num_hidden_layers &&
              alias.num_attention_heads == big.num_attention_heads &&
              alias.num_key_value_heads == big.num_key_value_heads && alias.head_dim == big.head_dim &&
              alias.max_position_embeddings == big.max_position_embeddings && alias.rope_theta == big.rope_theta &&
              alias.rms_norm_eps == big.rms_norm_eps && alias.bos_token_id == big.bos_token_id);
    ck_assert_str_eq(alias.name, "qwen2-0.5b");
    ck_assert_int_eq(qwen2_config_preset(&back, "gpt2", ctx.error, sizeof ctx.error), -1);
    ck_assert_msg(strstr(ctx.error, "MODEL='gpt2'") && strstr(ctx.error, "qwen2-0.5b (or qwen2), tiny"), "%s",
                  ctx.error);
    char path[] = "/tmp/fsdplab_config_XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    ck_assert_int_eq(qwen2_config_save_json(&big, path, ctx.error, sizeof ctx.error), 0);
    ck_assert_msg(qwen2_config_load_json(&back, path, ctx.error, sizeof ctx.error) == 0, "%s", ctx.error);
    ck_assert_int_eq(back.vocab_size, 151936);
    ck_assert_int_eq(back.num_key_value_heads, 2);
    ck_assert_float_eq(back.rope_theta, 1e6f);
    ck_assert_float_eq(back.rms_norm_eps, 1e-6f);
    FILE *file = fopen(path, "w");
    fputs("{\"vocab_size\": 10, \"hidden_size\": 30, \"intermediate_size\": 8, \"num_hidden_layers\": 1, "
          "\"num_attention_heads\": 4, \"max_position_embeddings\": 8}", file);
    fclose(file);
    ck_assert_int_eq(qwen2_config_load_json(&back, path, ctx.error, sizeof ctx.error), -1);
    ck_assert_msg(strstr(ctx.error, "hidden_size 30 is not divisible by num_attention_heads 4"), "%s", ctx.error);
    unlink(path);
    /* overrides by HF field name */
    ck_assert_int_eq(qwen2_config_set(&tiny, "hidden_size", "256", ctx.error, sizeof ctx.error), 0);
    ck_assert_int_eq(tiny.head_dim, 64);
    ck_assert_int_eq(qwen2_config_set(&tiny, "rope_theta", "1e6", ctx.error, sizeof ctx.error), 0);
    ck_assert_double_eq(tiny.rope_theta, 1e6);
    ck_assert_int_eq(qwen2_config_set(&tiny, "num_hidden_layers", "2.5", ctx.error, sizeof ctx.error), -1);
    ck_assert_msg(strstr(ctx.error, "num_hidden_layers=2.5 is not an integer"), "%s", ctx.error);
    ck_assert_int_eq(qwen2_config_set(&tiny, "hiden_size", "8", ctx.error, sizeof ctx.error), -1);
    ck_assert_msg(strstr(ctx.error, "'hiden_size' is not a Qwen2 config field"), "%s", ctx.error);
}
END_TEST

START_TEST(test_tree_names_and_counts) {
    qwen2_config config;
    qwen2_config_preset(&config, "qwen2-0.5b", ctx.error, sizeof ctx.error);
    qwen2_tree tree;
    ck_assert_int_eq(qwen2_tree_build(&tree, &config), 0);
    ck_assert_int_eq(tree.param_count, 2 + 12 * 24);
    ck_assert_str_eq(tree.params[0].name, "model.embed_tokens.weight");
    ck_assert_str_eq(tree.params[1].name, "model.layers.0.self_attn.q_proj.weight");
    ck_assert_str_eq(tree.params[12].name, "model.layers.0.post_attention_layernorm.weight");
    ck_assert_str_eq(tree.params[tree.param_count - 1].name, "model.norm.weight");
    size_t total = 0;
    int decoder_layers = 0;
    for (int p = 0; p < tree.param_count; p++) total += qwen2_param_numel(&tree.params[p]);
    for (int m = 0; m < tree.module_count; m++)
        decoder_layers += strcmp(tree.modules[m].type, "Qwen2DecoderLayer") == 0;
    ck_assert_uint_eq(total, 494032768u); /* HF's Qwen2-0.5B, tied lm_head counted once */
    ck_assert_int_eq(decoder_layers, 24);
    qwen2_tree_free(&tree);
}
END_TEST

START_TEST(test_init_matches_hf_rules_and_any_shard) {
    qwen2_config config = small_config();
    qwen2_model model;
    make_model(&model, &config, 11);
    double sum = 0, squares = 0;
    size_t count = 0;
    for (int p = 0; p < model.tree.param_count; p++) {
        const char *name = model.tree.params[p].name;
        const float *data = qwen2_param_data(&model, p);
        size_t numel = qwen2_param_numel(&model.tree.params[p]);
        for (size_t i = 0; i < numel; i++) {
            if (strstr(name, "norm.weight")) ck_assert_float_eq(data[i], 1.0f);
            else if (strstr(name, ".bias")) ck_assert_float_eq(data[i], 0.0f);
            else sum += data[i], squares += (double)data[i] * data[i], count++;
        }
        /* a value depends only on (seed, name, index): recompute element 5 alone */
        float alone;
        qwen2_init_spec init = {.seed = 11, .std = 0.02f};
        qwen2_init_fill(name, numel > 5 ? 5 : 0, 1, &alone, &init);
        ck_assert_float_eq(alone, data[numel > 5 ? 5 : 0]);
    }
    double mean = sum / count, std = sqrt(squares / count - mean * mean);
    ck_assert_msg(fabs(mean) < 0.002 && fabs(std - 0.02) < 0.001, "init mean %g std %g", mean, std);
    qwen2_model_free(&model);
}
END_TEST

START_TEST(test_model_gradient_matches_finite_differences) {
    qwen2_config config = small_config();
    qwen2_model model;
    make_model(&model, &config, 5);
    /* Larger weights than 0.02 so every layer matters to the loss. */
    for (int unit = 0; unit < model.unit_count; unit++) {
        flat_param *fp = &model.units[unit];
        for (size_t i = 0; i < fp->unpadded_numel; i++)
            fp->full_param_padded[i] += 0.3f * (rng_uniform(9, (uint64_t)unit, i) - 0.5f);
    }
    enum { B = 2, T = 7 };
    int tokens[B * T], targets[B * T];
    make_batch(tokens, targets, B, T, config.vocab_size);
    targets[3] = QWEN2_IGNORE_INDEX;
    qwen2_forward_backward(&model, tokens, targets, B, T);
    const char *checked[] = {"model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
                             "model.layers.0.self_attn.k_proj.bias", "model.layers.1.self_attn.v_proj.weight",
                             "model.layers.1.self_attn.o_proj.weight", "model.layers.0.mlp.gate_proj.weight",
                             "model.layers.1.mlp.down_proj.weight", "model.layers.0.input_layernorm.weight",
                             "model.layers.1.post_attention_layernorm.weight", "model.norm.weight"};
    const float eps = 1e-2f;
    for (size_t c = 0; c < sizeof checked / sizeof checked[0]; c++) {
        int p = qwen2_find_param(&model, checked[c]);
        ck_assert_int_ge(p, 0);
        float *data = qwen2_param_data(&model, p), *grad = qwen2_param_grad(&model, p);
        size_t numel = qwen2_param_numel(&model.tree.params[p]);
        for (int s = 0; s < 6; s++) {
            size_t i = (size_t)(rng_bits(1, (uint64_t)c, (uint64_t)s) % numel);
            float saved = data[i];
            data[i] = saved + eps;
            double plus = loss_of(&model, tokens, targets, B, T);
            data[i] = saved - eps;
            double minus = loss_of(&model, tokens, targets, B, T);
            data[i] = saved;
            double numeric = (plus - minus) / (2 * eps);
            ck_assert_msg(fabs(numeric - grad[i]) <= 2e-3 * fmax(1e-1, fabs(numeric)) + 2e-5,
                          "%s[%zu]: analytic %.6g vs numeric %.6g", checked[c], i, grad[i], numeric);
        }
    }
    ck_assert_uint_eq(ctx.mem.category_live_bytes[MEM_ACTIVATION], 0); /* backward freed every activation */
    ck_assert_uint_eq(ctx.mem.category_live_bytes[MEM_DATA], 0);
    qwen2_model_free(&model);
}
END_TEST

/* Units with mixed precision (before their first unshard), unsharded: as an FSDP runtime sets them up. */
static void unshard_units(qwen2_model *model, int bf16) {
    flat_param_mixed_precision mixed_precision = {.param_dtype = bf16 ? DTYPE_BFLOAT16 : DTYPE_FLOAT32,
                                          .reduce_dtype = bf16 ? DTYPE_BFLOAT16 : DTYPE_FLOAT32};
    for (int unit = 0; unit < model->unit_count; unit++) {
        ck_assert_msg(flat_param_set_mixed_precision(&model->units[unit], &mixed_precision) == 0, "%s", ctx.error);
        ck_assert_int_eq(flat_param_unshard(&model->units[unit], "test"), 0);
    }
}

/* Any unit assignment computes the same thing: here layer 0's up_proj sits alone in a unit of its own, so gate_proj
 * and up_proj are not back to back and the layer takes its stacked-copy path. Losses and gradients must equal the
 * default units' exactly (the same GEMMs on the same numbers), in float32 and with bfloat16 compute. */
START_TEST(test_unit_assignment_does_not_change_the_math) {
    for (int bf16 = 0; bf16 <= 1; bf16++) {
        qwen2_config config = small_config();
        qwen2_model standard, split;
        qwen2_init_spec init = {.seed = 31, .std = 0.02f};
        ck_assert_msg(qwen2_model_init_wrapped(&standard, &ctx, &config, fsdp_wrap_by_type,
                                               (void *)QWEN2_DECODER_LAYER, FSDP_FULL_SHARD, &init) == 0,
                      "%s", ctx.error);
        unshard_units(&standard, bf16);
        qwen2_tree tree;
        ck_assert_int_eq(qwen2_tree_build(&tree, &config), 0);
        int unit_of_param[64];
        for (int p = 0; p < tree.param_count; p++)
            unit_of_param[p] = strcmp(tree.params[p].name, "model.layers.0.mlp.up_proj.weight") == 0;
        ck_assert_msg(qwen2_model_init(&split, &ctx, &config, unit_of_param, 2, 0, &init) == 0, "%s", ctx.error);
        ck_assert_str_eq(split.units[1].unit, "layers.0.mlp.up_proj"); /* named after the module holding it */
        unshard_units(&split, bf16);
        enum { B = 2, T = 5 };
        int tokens[B * T], targets[B * T];
        make_batch(tokens, targets, B, T, config.vocab_size);
        float loss_standard = qwen2_forward_backward(&standard, tokens, targets, B, T);
        float loss_split = qwen2_forward_backward(&split, tokens, targets, B, T);
        ck_assert_float_eq(loss_standard, loss_split);
        for (int p = 0; p < tree.param_count; p++)
            ck_assert_msg(memcmp(qwen2_param_grad(&standard, p), qwen2_param_grad(&split, p),
                                 qwen2_param_numel(&tree.params[p]) * sizeof(float)) == 0,
                          "gradient of %s differs between unit assignments (bf16 %d)", tree.params[p].name, bf16);
        ck_assert_uint_eq(ctx.mem.category_live_bytes[MEM_WORKSPACE], standard.rope_positions * config.head_dim * 8u +
                                                                         split.rope_positions * config.head_dim * 8u);
        qwen2_tree_free(&tree);
        qwen2_model_free(&standard);
        qwen2_model_free(&split);
    }
}
END_TEST

/* The index of the first element of values that is not a bfloat16 value (bf16_round changes it), or count. */
static size_t first_not_bfloat16(const float *values, size_t count) {
    for (size_t i = 0; i < count; i++)
        if (bf16_round(values[i]) != values[i]) return i;
    return count;
}

#define EXPECT_BFLOAT16(buffer, count, what, layer)                                                              \
    do {                                                                                                          \
        size_t bad_ = first_not_bfloat16((buffer), (count));                                                      \
        ck_assert_msg(bad_ == (count), "MP=bf16: %s (layer %d) element %zu = %.9g is not a bfloat16 value", (what), \
                      (layer), bad_, bad_ < (count) ? (double)(buffer)[bad_] : 0.0);                              \
    } while (0)

/* Under MixedPrecision(param_dtype=bfloat16) every tensor torch's graph holds is bfloat16 (core/kernels/layers_bf16.h):
 * each activation the forward saves, the logits, and each activation gradient the backward hands on are bfloat16 values
 * (the float32 softmax probabilities and 1/rms excepted, which torch keeps in float32 too). A skipped rounding leaves
 * float32 values in one of them. The loss stays near the float32 model's (bfloat16's 2^-8 per rounding). */
START_TEST(test_bf16_compute_keeps_bfloat16_tensors) {
    qwen2_config config = small_config();
    qwen2_model model, reference;
    make_model(&reference, &config, 11);
    qwen2_init_spec init = {.seed = 11, .std = 0.02f};
    ck_assert_msg(qwen2_model_init_wrapped(&model, &ctx, &config, fsdp_wrap_by_type, (void *)QWEN2_DECODER_LAYER,
                                           FSDP_FULL_SHARD, &init) == 0, "%s", ctx.error);
    flat_param_mixed_precision bf16 = {.param_dtype = DTYPE_BFLOAT16, .reduce_dtype = DTYPE_BFLOAT16};
    for (int unit = 0; unit < model.unit_count; unit++) {
        ck_assert_msg(flat_param_set_mixed_precision(&model.units[unit], &bf16) == 0, "%s", ctx.error);
        ck_assert_int_eq(flat_param_unshard(&model.units[unit], "test"), 0);
    }
    enum { B = 2, T = 7 };
    int tokens[B * T], targets[B * T];
    make_batch(tokens, targets, B, T, config.vocab_size);
    int L = config.num_hidden_layers, C = config.hidden_size, I = config.intermediate_size, V = config.vocab_size;
    size_t N = (size_t)B * T, q_width = (size_t)config.num_attention_heads * config.head_dim;
    size_t kv_width = (size_t)config.num_key_value_heads * config.head_dim;
    qwen2_activations acts;
    ck_assert_int_eq(qwen2_activations_begin(&model, &acts, tokens, targets, B, T), 0);
    acts.backward_follows = 1; /* the head's forward keeps dlogits */
    qwen2_embed_forward(&model, &acts);
    for (int l = 0; l < L; l++) qwen2_layer_forward(&model, &acts, l);
    float loss = qwen2_head_forward(&model, &acts);
    for (int l = 0; l < L; l++) {
        const qwen2_layer_activations *a = &acts.layers[l];
        EXPECT_BFLOAT16(acts.residuals[l], N * C, "layer input", l);
        EXPECT_BFLOAT16(a->ln1, N * C, "input_layernorm output", l);
        EXPECT_BFLOAT16(a->q, N * q_width, "q after RoPE", l);
        EXPECT_BFLOAT16(a->k, N * kv_width, "k after RoPE", l);
        EXPECT_BFLOAT16(a->v, N * kv_width, "v", l);
        EXPECT_BFLOAT16(a->attention, N * q_width, "attention output", l);
        EXPECT_BFLOAT16(a->mid, N * C, "residual_mid", l);
        EXPECT_BFLOAT16(a->ln2, N * C, "post_attention_layernorm output", l);
        EXPECT_BFLOAT16(a->gate_up, N * 2 * I, "gate_up", l);
        EXPECT_BFLOAT16(a->swiglu, N * I, "silu(gate) * up", l);
    }
    EXPECT_BFLOAT16(acts.residuals[L], N * C, "last layer output", L);
    EXPECT_BFLOAT16(acts.final_norm, N * C, "norm output", -1);
    EXPECT_BFLOAT16(acts.logits, N * V, "logits", -1);
    for (int unit = 0; unit < model.unit_count; unit++) flat_param_alloc_full_grad(&model.units[unit]);
    qwen2_head_backward(&model, &acts);
    EXPECT_BFLOAT16(acts.dresiduals[L], N * C, "gradient into the norm", L);
    for (int l = L - 1; l >= 0; l--) {
        qwen2_layer_backward(&model, &acts, l);
        EXPECT_BFLOAT16(acts.dresiduals[l], N * C, "gradient of the layer input", l);
    }
    qwen2_embed_backward(&model, &acts);
    qwen2_activations_end(&model, &acts);
    /* the norms' weight gradients are sums of rounded products, rounded once */
    for (int p = 0; p < model.tree.param_count; p++)
        if (strstr(model.tree.params[p].name, "norm.weight") != NULL)
            EXPECT_BFLOAT16(qwen2_param_grad(&model, p), qwen2_param_numel(&model.tree.params[p]),
                            model.tree.params[p].name, -1);
    double reference_loss = loss_of(&reference, tokens, targets, B, T);
    ck_assert_msg(fabs(loss - reference_loss) <= 0.05 * reference_loss, "MP=bf16 loss %.6f, float32 %.6f", loss,
                  reference_loss);
    qwen2_model_free(&model);
    qwen2_model_free(&reference);
}
END_TEST

START_TEST(test_bad_tokens_are_refused_with_position) {
    qwen2_config config = small_config();
    qwen2_model model;
    make_model(&model, &config, 1);
    int tokens[6] = {1, 2, 3, 4, 37, 5}, targets[6] = {2, 3, 4, 5, 6, -100};
    qwen2_activations acts;
    ck_assert_int_eq(qwen2_activations_begin(&model, &acts, tokens, targets, 2, 3), -1);
    ck_assert_msg(strstr(ctx.error, "token 37 at batch row 1, position 1 is outside the vocabulary 0..36"), "%s",
                  ctx.error);
    ck_assert_int_eq(qwen2_activations_begin(&model, &acts, tokens, targets, 1, 33), -1);
    ck_assert_msg(strstr(ctx.error, "1 <= T <= 32"), "%s", ctx.error);
    qwen2_model_free(&model);
}
END_TEST

START_TEST(test_checkpoint_round_trip_and_refusals) {
    qwen2_config config = small_config();
    qwen2_model model, loaded;
    make_model(&model, &config, 21);
    char directory[] = "/tmp/fsdplab_ckpt_XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(directory));
    ck_assert_msg(pretrained_save(&model, directory) == 0, "%s", ctx.error);
    char path[256];
    snprintf(path, sizeof path, "%s/config.json", directory);
    qwen2_config read_back;
    ck_assert_msg(qwen2_config_load_json(&read_back, path, ctx.error, sizeof ctx.error) == 0, "%s", ctx.error);
    ck_assert_msg(qwen2_model_init(&loaded, &ctx, &read_back, (int[64]){0}, 1, 0, NULL) == 0, "%s", ctx.error);
    ck_assert_msg(pretrained_load(&loaded, directory) == 0, "%s", ctx.error);
    ck_assert_int_eq(flat_param_unshard(&loaded.units[0], "test"), 0);
    for (int p = 0; p < model.tree.param_count; p++)
        ck_assert_mem_eq(qwen2_param_data(&loaded, p), qwen2_param_data(&model, p),
                         qwen2_param_numel(&model.tree.params[p]) * sizeof(float));
    qwen2_model_free(&loaded);

    /* a config with one more layer than the file has: the missing tensor is named */
    qwen2_config deeper = small_config();
    deeper.num_hidden_layers = 3;
    ck_assert_int_eq(qwen2_model_init(&loaded, &ctx, &deeper, (int[64]){0}, 1, 0, NULL), 0);
    ck_assert_int_eq(pretrained_load(&loaded, directory), -1);
    ck_assert_msg(strstr(ctx.error, "missing tensor 'model.layers.2.self_attn.q_proj.weight'"), "%s", ctx.error);
    qwen2_model_free(&loaded);
    qwen2_config wider = small_config();
    wider.intermediate_size = 28;
    ck_assert_int_eq(qwen2_model_init(&loaded, &ctx, &wider, (int[64]){0}, 1, 0, NULL), 0);
    ck_assert_int_eq(pretrained_load(&loaded, directory), -1);
    ck_assert_msg(strstr(ctx.error, "'model.layers.0.mlp.gate_proj.weight' has shape [24, 16]"), "%s", ctx.error);
    qwen2_model_free(&loaded);
    qwen2_model_free(&model);
    snprintf(path, sizeof path, "%s/model.safetensors", directory);
    unlink(path);
    snprintf(path, sizeof path, "%s/config.json", directory);
    unlink(path);
    rmdir(directory);
}
END_TEST

START_TEST(test_generation_is_deterministic) {
    qwen2_config config = small_config();
    qwen2_model model;
    make_model(&model, &config, 8);
    int prompt[3] = {1, 2, 3}, first[8], second[8], sampled[8], sampled_again[8];
    int n1 = qwen2_generate(&model, prompt, 3, 8, 0.0f, 0, first);
    int n2 = qwen2_generate(&model, prompt, 3, 8, 0.0f, 99, second);
    ck_assert_int_eq(n1, n2);
    ck_assert_mem_eq(first, second, (size_t)n1 * sizeof(int)); /* greedy ignores the seed */
    int n3 = qwen2_generate(&model, prompt, 3, 8, 1.0f, 42, sampled);
    int n4 = qwen2_generate(&model, prompt, 3, 8, 1.0f, 42, sampled_again);
    ck_assert_int_eq(n3, n4);
    ck_assert_mem_eq(sampled, sampled_again, (size_t)n3 * sizeof(int));
    for (int i = 0; i < n3; i++) ck_assert(sampled[i] >= 0 && sampled[i] < config.vocab_size);
    ck_assert_uint_eq(ctx.mem.category_live_bytes[MEM_ACTIVATION], 0);
    qwen2_model_free(&model);
}
END_TEST

/* Generation with the KV cache gives the tokens of the uncached reference, token for token: the cache holds the same
 * k (after RoPE at the same positions) and v rows that the full forward recomputes, and the new position's row goes
 * through the same kernels (attention_forward_at is attention_forward's code), so the last row's logits come out
 * bit-identical on this machine and so do the samples. Greedy and sampled, several seeds and prompt lengths, on the
 * small model (up to its 32 positions) and the tiny preset. The cache is kv_cache memory while it lives: 2 (k, v) x
 * layers x positions x KV heads x head_dim floats, freed after. */
static void expect_cached_equals_uncached(qwen2_model *model, const int *prompt, int prompt_length, int max_new,
                                          float temperature, uint64_t seed) {
    int cached[256], uncached[256];
    ck_assert_int_le(max_new, 256);
    mem_reset_peak(&ctx.mem);
    int n_cached = qwen2_generate(model, prompt, prompt_length, max_new, temperature, seed, cached);
    size_t cache_peak = ctx.mem.category_peak_bytes[MEM_KV_CACHE];
    int n_uncached = qwen2_generate_uncached(model, prompt, prompt_length, max_new, temperature, seed, uncached);
    ck_assert_msg(n_cached == n_uncached, "%s prompt %d, T %.1f, seed %llu: %d tokens cached, %d uncached",
                  model->config.name, prompt_length, temperature, (unsigned long long)seed, n_cached, n_uncached);
    for (int i = 0; i < n_cached; i++)
        ck_assert_msg(cached[i] == uncached[i], "%s prompt %d, T %.1f, seed %llu: token %d is %d cached, %d uncached",
                      model->config.name, prompt_length, temperature, (unsigned long long)seed, i, cached[i],
                      uncached[i]);
    const qwen2_config *c = &model->config;
    int capacity = prompt_length + (max_new < c->max_position_embeddings - prompt_length
                                        ? max_new : c->max_position_embeddings - prompt_length);
    ck_assert_uint_eq(cache_peak, 2 * sizeof(float) * (size_t)c->num_hidden_layers * (size_t)capacity *
                                      (size_t)c->num_key_value_heads * (size_t)c->head_dim);
    ck_assert_uint_eq(ctx.mem.category_live_bytes[MEM_KV_CACHE], 0);
    ck_assert_uint_eq(ctx.mem.category_live_bytes[MEM_ACTIVATION], 0);
}

START_TEST(test_cached_generation_equals_uncached) {
    qwen2_config small = small_config(), tiny;
    ck_assert_int_eq(qwen2_config_preset(&tiny, "tiny", ctx.error, sizeof ctx.error), 0);
    int prompt[40];
    for (int i = 0; i < 40; i++) prompt[i] = (int)(rng_bits(5, 6, (uint64_t)i) % 37);
    const float temperatures[] = {0.0f, 0.5f, 1.0f, 2.0f};
    qwen2_model model;
    /* weights of std 0.3, not HF's 0.02: attention then shapes the logits enough that a wrong cache changes tokens */
    make_model_with_std(&model, &small, 11, 0.3f);
    const int small_prompts[] = {1, 3, 10, 31};
    for (size_t p = 0; p < sizeof small_prompts / sizeof small_prompts[0]; p++)
        for (size_t t = 0; t < sizeof temperatures / sizeof temperatures[0]; t++)
            for (uint64_t seed = 0; seed < 3; seed++)
                expect_cached_equals_uncached(&model, prompt, small_prompts[p], 40, temperatures[t], seed);
    qwen2_model_free(&model);
    make_model_with_std(&model, &tiny, 12, 0.3f);
    const int tiny_prompts[] = {1, 17};
    for (size_t p = 0; p < sizeof tiny_prompts / sizeof tiny_prompts[0]; p++)
        for (size_t t = 0; t < sizeof temperatures / sizeof temperatures[0]; t++)
            expect_cached_equals_uncached(&model, prompt, tiny_prompts[p], 48, temperatures[t], 100 + t);
    qwen2_model_free(&model);
}
END_TEST

/* Values that parse but cannot be held are refused before any conversion (casting NaN, an infinity or 1e30 to int is
 * undefined behaviour; 64.5 heads would be truncated silently), from CONFIG overrides and from config.json alike. */
START_TEST(test_config_refuses_values_it_cannot_hold) {
    qwen2_config config;
    ck_assert_int_eq(qwen2_config_preset(&config, "tiny", ctx.error, sizeof ctx.error), 0);
    const char *bad[][2] = {{"hidden_size", "1e30"}, {"hidden_size", "64.5"}, {"hidden_size", "nan"},
                            {"num_attention_heads", "-inf"}, {"rope_theta", "inf"}, {"rms_norm_eps", "nan"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_int_eq(qwen2_config_set(&config, bad[i][0], bad[i][1], ctx.error, sizeof ctx.error), -1);
        ck_assert_msg(strstr(ctx.error, bad[i][0]) != NULL && strstr(ctx.error, bad[i][1]) != NULL, "%s", ctx.error);
    }
    char path[] = "/tmp/fsdplab_config_XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    FILE *file = fdopen(fd, "w");
    fputs("{\"vocab_size\": 260, \"hidden_size\": 64.5, \"intermediate_size\": 128, \"num_hidden_layers\": 2, "
          "\"num_attention_heads\": 4, \"max_position_embeddings\": 1e300}", file);
    fclose(file);
    ck_assert_int_eq(qwen2_config_load_json(&config, path, ctx.error, sizeof ctx.error), -1);
    ck_assert_msg(strstr(ctx.error, "hidden_size=64.5 is not an integer") != NULL, "%s", ctx.error);
    unlink(path);
}
END_TEST

/* A prompt longer than max_position_embeddings (reachable from lab 05's EVAL with a small CONFIG) once overflowed
 * the sequence buffer; a negative max_new wrapped to a huge allocation. Both are refused, naming the values; a
 * prompt that fills the positions but one generates exactly one token. */
START_TEST(test_generation_refuses_what_does_not_fit) {
    qwen2_config config = small_config();
    qwen2_model model;
    make_model(&model, &config, 8);
    int positions = config.max_position_embeddings;
    int *prompt = calloc((size_t)positions + 1, sizeof *prompt), out[4];
    size_t data_before = ctx.mem.category_live_bytes[MEM_DATA];
    ck_assert_ptr_nonnull(prompt);
    for (int i = 0; i <= positions; i++) prompt[i] = 1 + i % 5;
    ck_assert_int_eq(qwen2_generate(&model, prompt, positions + 1, 4, 0.0f, 0, out), -1);
    ck_assert_msg(strstr(ctx.error, "the prompt must hold 1..") != NULL, "%s", ctx.error);
    ck_assert_int_eq(qwen2_generate(&model, prompt, 3, -1, 0.0f, 0, out), -1);
    ck_assert_msg(strstr(ctx.error, "and -1 new ones") != NULL, "%s", ctx.error);
    ck_assert_int_eq(qwen2_generate(&model, prompt, 0, 4, 0.0f, 0, out), -1);
    int produced = qwen2_generate(&model, prompt, positions - 1, 4, 0.0f, 0, out);
    ck_assert_msg(produced == 1, "a prompt one short of the positions made %d tokens, expected 1", produced);
    ck_assert_uint_eq(ctx.mem.category_live_bytes[MEM_DATA], data_before);
    free(prompt);
    qwen2_model_free(&model);
}
END_TEST

int main(int argc, char **argv) {
    session_open(&ctx, &argc, &argv, "test_qwen2", "runs/check/test_qwen2");
    Suite *suite = suite_create("qwen2");
    TCase *tc = tcase_create("model");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_presets_and_config_json_round_trip);
    tcase_add_test(tc, test_tree_names_and_counts);
    tcase_add_test(tc, test_init_matches_hf_rules_and_any_shard);
    tcase_add_test(tc, test_model_gradient_matches_finite_differences);
    tcase_add_test(tc, test_unit_assignment_does_not_change_the_math);
    tcase_add_test(tc, test_bf16_compute_keeps_bfloat16_tensors);
    tcase_add_test(tc, test_bad_tokens_are_refused_with_position);
    tcase_add_test(tc, test_checkpoint_round_trip_and_refusals);
    tcase_add_test(tc, test_generation_is_deterministic);
    tcase_add_test(tc, test_cached_generation_equals_uncached);
    tcase_add_test(tc, test_generation_refuses_what_does_not_fit);
    tcase_add_test(tc, test_config_refuses_values_it_cannot_hold);
    suite_add_tcase(suite, tc);
    return mpi_check_run(&ctx, suite);
}
