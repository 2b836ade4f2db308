/* qwen2.c — Qwen2 config, module tree, init, and the forward / backward cut at unit boundaries. See qwen2.h. */
#include "core/models/qwen2.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/runtime/env.h"
#include "core/kernels/layers.h"
#include "core/runtime/offload.h"
#include "core/base/rng.h"
#include "core/runtime/world.h"
#include "core/base/error.h"

/* Parameters of one decoder layer, in HF's registration order (self_attn, mlp, then the two norms). */
enum {
    Q_WEIGHT, Q_BIAS, K_WEIGHT, K_BIAS, V_WEIGHT, V_BIAS, O_WEIGHT, GATE_WEIGHT, UP_WEIGHT, DOWN_WEIGHT,
    INPUT_NORM_WEIGHT, POST_NORM_WEIGHT, LAYER_PARAM_COUNT
};

/* ---------------------------------------------------------------- config */

/* The numeric config fields by their HF names, in one place: what config.json holds, what qwen2_config_set (CONFIG=)
 * overrides. fallback: the value when config.json lacks the field (required ones have none); num_key_value_heads'
 * -1 means "as many as the attention heads", HF's rule. */
typedef struct config_field {
    const char *name;
    size_t offset;
    int is_integer, required;
    double fallback;
} config_field;
#define INTEGER_FIELD(name, required, fallback) {#name, offsetof(qwen2_config, name), 1, required, fallback}
#define REAL_FIELD(name, fallback) {#name, offsetof(qwen2_config, name), 0, 0, fallback}
static const config_field config_fields[] = {
    INTEGER_FIELD(vocab_size, 1, 0),          INTEGER_FIELD(hidden_size, 1, 0),
    INTEGER_FIELD(intermediate_size, 1, 0),   INTEGER_FIELD(num_hidden_layers, 1, 0),
    INTEGER_FIELD(num_attention_heads, 1, 0), INTEGER_FIELD(num_key_value_heads, 0, -1),
    INTEGER_FIELD(max_position_embeddings, 1, 0),
    REAL_FIELD(rope_theta, 10000.0),          REAL_FIELD(rms_norm_eps, 1e-6),
    REAL_FIELD(initializer_range, 0.02),      INTEGER_FIELD(bos_token_id, 0, 0),
    INTEGER_FIELD(eos_token_id, 0, 0),
};
#define CONFIG_FIELD_COUNT (sizeof config_fields / sizeof config_fields[0])

/* Whether a field can hold the value: finite, and for an integer field a whole number within int's range. Checked
 * before the value is converted: casting NaN, an infinity or 1e30 to int is undefined behaviour in C. */
static int field_value_ok(const config_field *field, double value) {
    if (!isfinite(value)) return 0;
    return !field->is_integer || (value == floor(value) && value >= (double)INT_MIN && value <= (double)INT_MAX);
}

/* What a value field_value_ok refused is not: the end of the message "num_hidden_layers=2.5 is not an integer ...". */
static const char *field_refusal(const config_field *field) {
    return field->is_integer ? "is not an integer in int's range" : "is not a finite number";
}

static void field_store(qwen2_config *c, const config_field *field, double value) {
    if (field->is_integer) *(int *)((char *)c + field->offset) = (int)value;
    else *(double *)((char *)c + field->offset) = value;
}

static double field_load(const qwen2_config *c, const config_field *field) {
    return field->is_integer ? *(const int *)((const char *)c + field->offset)
                             : *(const double *)((const char *)c + field->offset);
}

static const config_field *field_named(const char *name) {
    for (size_t i = 0; i < CONFIG_FIELD_COUNT; i++)
        if (strcmp(config_fields[i].name, name) == 0) return &config_fields[i];
    return NULL;
}

int qwen2_config_compare(const qwen2_config *a, const qwen2_config *b, char *out, size_t out_size) {
    for (size_t i = 0; i < CONFIG_FIELD_COUNT; i++) {
        const config_field *field = &config_fields[i];
        /* Neither changes a trained model's arithmetic: RoPE is computed per position, the init is overwritten. */
        if (strcmp(field->name, "initializer_range") == 0 || strcmp(field->name, "max_position_embeddings") == 0)
            continue;
        if (field_load(a, field) != field_load(b, field)) {
            snprintf(out, out_size, "%s %.10g, not %.10g", field->name, field_load(a, field), field_load(b, field));
            return 1;
        }
    }
    if (a->tie_word_embeddings != b->tie_word_embeddings) {
        snprintf(out, out_size, "tie_word_embeddings %d, not %d", a->tie_word_embeddings, b->tie_word_embeddings);
        return 1;
    }
    return 0;
}

/* The presets: HF's Qwen2-0.5B, and a tiny byte-level model (ids 0..255 are bytes, 256 <|endoftext|>, 257-259
 * reserved specials) with the same shape rules, fast on one core. */
static const qwen2_config presets[] = {
    {.name = "qwen2-0.5b", .vocab_size = 151936, .hidden_size = 896, .intermediate_size = 4864,
     .num_hidden_layers = 24, .num_attention_heads = 14, .num_key_value_heads = 2, .head_dim = 64,
     .max_position_embeddings = 131072, .rope_theta = 1000000.0, .rms_norm_eps = 1e-6, .initializer_range = 0.02,
     .tie_word_embeddings = 1, .bos_token_id = 151643, .eos_token_id = 151643},
    {.name = "tiny", .vocab_size = 260, .hidden_size = 128, .intermediate_size = 352, .num_hidden_layers = 4,
     .num_attention_heads = 4, .num_key_value_heads = 2, .head_dim = 32, .max_position_embeddings = 1024,
     .rope_theta = 10000.0, .rms_norm_eps = 1e-6, .initializer_range = 0.02, .tie_word_embeddings = 1,
     .bos_token_id = 256, .eos_token_id = 256},
};

/* Other names a preset answers to: the seed project's command line says MODEL=qwen2 for Qwen2-0.5B. A config made
 * from an alias carries the preset's own name, so logs and config.json say which model it really is. */
static const struct preset_alias {
    const char *alias, *preset;
} preset_aliases[] = {{"qwen2", "qwen2-0.5b"}};

int qwen2_config_preset(qwen2_config *config, const char *name, char *error, size_t error_size) {
    const char *preset_name = name;
    for (size_t i = 0; i < sizeof preset_aliases / sizeof preset_aliases[0]; i++)
        if (strcmp(preset_aliases[i].alias, name) == 0) preset_name = preset_aliases[i].preset;
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        if (strcmp(presets[i].name, preset_name) != 0) continue;
        *config = presets[i];
        return qwen2_config_validate(config, error, error_size); /* head_dim above must follow the rules too */
    }
    memset(config, 0, sizeof *config);
    /* Every accepted name, built from the tables so the message cannot fall behind them. */
    char accepted[256] = "";
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        size_t used = strlen(accepted);
        snprintf(accepted + used, sizeof accepted - used, "%s%s", i > 0 ? ", " : "", presets[i].name);
        for (size_t a = 0; a < sizeof preset_aliases / sizeof preset_aliases[0]; a++) {
            if (strcmp(preset_aliases[a].preset, presets[i].name) != 0) continue;
            used = strlen(accepted);
            snprintf(accepted + used, sizeof accepted - used, " (or %s)", preset_aliases[a].alias);
        }
    }
    return error_set(error, error_size, "MODEL='%s' is not a model; choose one of: %s", name, accepted);
}

int qwen2_config_set(qwen2_config *c, const char *name, const char *value, char *error, size_t error_size) {
    const config_field *field = field_named(name);
    if (field == NULL) return error_set(error, error_size, "'%s' is not a Qwen2 config field", name);
    char *end = NULL;
    double number = strtod(value, &end);
    if (end == value || *end != '\0' || !field_value_ok(field, number))
        return error_set(error, error_size, "config field %s=%s %s", name, value, field_refusal(field));
    field_store(c, field, number);
    snprintf(c->name, sizeof c->name, "custom");
    if (c->num_attention_heads > 0) c->head_dim = c->hidden_size / c->num_attention_heads;
    return 0;
}

int qwen2_config_apply(qwen2_config *config, const char *overrides, char *error, size_t error_size) {
    char copy[1024];
    if (snprintf(copy, sizeof copy, "%s", overrides) >= (int)sizeof copy)
        return error_set(error, error_size, "config overrides longer than %zu characters", sizeof copy - 1);
    for (char *item = strtok(copy, ","); item != NULL; item = strtok(NULL, ",")) {
        char *equals = strchr(item, '=');
        if (equals == NULL) return error_set(error, error_size, "config override '%s' is not field=value", item);
        *equals = '\0';
        if (qwen2_config_set(config, item, equals + 1, error, error_size) != 0) return -1;
    }
    return qwen2_config_validate(config, error, error_size);
}

void qwen2_config_from_env(context *ctx, qwen2_config *config, int seq_len) {
    const char *model = env_text(ctx, "MODEL");
    if (model == NULL || model[0] == '\0') model = "tiny";
    if (qwen2_config_preset(config, model, ctx->error, sizeof ctx->error) != 0)
        world_exit_all(ctx, 2, "%s", ctx->error);
    const char *overrides = env_text(ctx, "CONFIG");
    if (overrides != NULL && overrides[0] != '\0') {
        char preset[sizeof config->name];
        snprintf(preset, sizeof preset, "%s", config->name); /* the preset's own name, not an alias */
        if (qwen2_config_apply(config, overrides, ctx->error, sizeof ctx->error) != 0)
            world_exit_all(ctx, 2, "CONFIG='%s': %s", overrides, ctx->error);
        snprintf(config->name, sizeof config->name, "%s + CONFIG", preset);
    }
    if (seq_len > config->max_position_embeddings)
        world_exit_all(ctx, 2, "SEQ=%d is longer than MODEL=%s's max_position_embeddings %d", seq_len, model,
                     config->max_position_embeddings);
}

/* The largest tensor and the whole model must stay countable: every size is an int, but their products are not, and
 * 2^40 parameters (4 TiB of float32) is beyond any machine this runs on, so a product past it is a typo, refused
 * here naming the factors, before size_t arithmetic could wrap or an allocation be attempted. In doubles: exact to
 * 2^53, and no product of ints can overflow them. */
#define QWEN2_MAX_PARAMETERS 1099511627776.0 /* 2^40 */
static int config_sizes_bounded(const qwen2_config *c, char *error, size_t error_size) {
    double C = c->hidden_size, V = c->vocab_size, I = c->intermediate_size, L = c->num_hidden_layers;
    double KV = (double)c->num_key_value_heads * c->head_dim;
    const struct {
        const char *what;
        double first, second;
        const char *first_name, *second_name;
    } tensors[] = {{"the embedding", V, C, "vocab_size", "hidden_size"},
                   {"an MLP projection", I, C, "intermediate_size", "hidden_size"},
                   {"an attention projection", C, C, "hidden_size", "hidden_size"},
                   {"a key/value projection", KV, C, "num_key_value_heads x head_dim", "hidden_size"}};
    for (size_t i = 0; i < sizeof tensors / sizeof tensors[0]; i++)
        if (tensors[i].first * tensors[i].second > QWEN2_MAX_PARAMETERS)
            return error_set(error, error_size, "config '%s': %s %.0f x %s %.0f = %.4g parameters in %s, beyond the "
                             "limit of 2^40", c->name, tensors[i].first_name, tensors[i].first,
                             tensors[i].second_name, tensors[i].second, tensors[i].first * tensors[i].second,
                             tensors[i].what);
    double layer = 2 * C * C + 2 * KV * C + C + 2 * KV + 3 * I * C + 2 * C, total = V * C + L * layer + C;
    if (total > QWEN2_MAX_PARAMETERS)
        return error_set(error, error_size, "config '%s': num_hidden_layers %.0f x %.4g parameters per layer = %.4g "
                         "parameters in all, beyond the limit of 2^40", c->name, L, layer, total);
    return 0;
}

int qwen2_config_validate(const qwen2_config *c, char *error, size_t error_size) {
    const struct {
        const char *name;
        int value, least;
    } sizes[] = {{"vocab_size", c->vocab_size, 1}, {"hidden_size", c->hidden_size, 1},
                 {"intermediate_size", c->intermediate_size, 1}, {"num_hidden_layers", c->num_hidden_layers, 0},
                 {"num_attention_heads", c->num_attention_heads, 1},
                 {"num_key_value_heads", c->num_key_value_heads, 1},
                 {"max_position_embeddings", c->max_position_embeddings, 1}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        if (sizes[i].value < sizes[i].least)
            return error_set(error, error_size, "config '%s': %s=%d must be %s", c->name, sizes[i].name, sizes[i].value,
                             sizes[i].least ? "positive" : "0 or more");
    if (c->hidden_size % c->num_attention_heads != 0)
        return error_set(error, error_size, "config '%s': hidden_size %d is not divisible by num_attention_heads %d",
                    c->name, c->hidden_size, c->num_attention_heads);
    if (c->num_attention_heads % c->num_key_value_heads != 0)
        return error_set(error, error_size,
                         "config '%s': num_attention_heads %d is not divisible by num_key_value_heads %d", c->name,
                         c->num_attention_heads, c->num_key_value_heads);
    if (c->head_dim != c->hidden_size / c->num_attention_heads || c->head_dim % 2 != 0)
        return error_set(error, error_size, "config '%s': head_dim %d must be hidden_size / heads = %d and even (RoPE)",
                    c->name, c->head_dim, c->hidden_size / c->num_attention_heads);
    if (!c->tie_word_embeddings)
        return error_set(error, error_size,
                         "config '%s': untied lm_head is not supported (tie_word_embeddings must be true)", c->name);
    if (!(c->rope_theta > 0.0 && isfinite(c->rope_theta)) || !(c->rms_norm_eps > 0.0 && isfinite(c->rms_norm_eps)))
        return error_set(error, error_size,
                         "config '%s': rope_theta=%g and rms_norm_eps=%g must be positive and finite", c->name,
                         c->rope_theta, c->rms_norm_eps);
    if (!(c->initializer_range >= 0.0 && isfinite(c->initializer_range))) /* the init's std */
        return error_set(error, error_size, "config '%s': initializer_range=%g must be a finite number >= 0 (the "
                         "init's standard deviation)", c->name, c->initializer_range);
    return config_sizes_bounded(c, error, error_size);
}

/* cJSON prints a double with 15 significant digits whenever that reads back within its tolerance, so a real field
 * could come back from config.json one ulp off (initializer_range 9007199254740993 came back ...990): the shortest
 * text of 15 to 17 digits that reads back exactly instead. Values are finite here (qwen2_config_validate). */
static cJSON *exact_number(double value) {
    char text[40];
    for (int digits = 15; digits <= 17; digits++) {
        snprintf(text, sizeof text, "%.*g", digits, value);
        if (strtod(text, NULL) == value) break;
    }
    return cJSON_CreateRaw(text);
}

int qwen2_config_save_json(const qwen2_config *c, const char *path, char *error, size_t error_size) {
    cJSON *json = cJSON_CreateObject();
    cJSON *architectures = cJSON_AddArrayToObject(json, "architectures");
    cJSON_AddItemToArray(architectures, cJSON_CreateString("Qwen2ForCausalLM"));
    cJSON_AddStringToObject(json, "model_type", "qwen2");
    for (size_t i = 0; i < CONFIG_FIELD_COUNT; i++)
        cJSON_AddItemToObject(json, config_fields[i].name, exact_number(field_load(c, &config_fields[i])));
    cJSON_AddBoolToObject(json, "tie_word_embeddings", c->tie_word_embeddings);
    cJSON_AddStringToObject(json, "hidden_act", "silu");
    cJSON_AddNumberToObject(json, "attention_dropout", 0.0);
    cJSON_AddBoolToObject(json, "use_sliding_window", 0);
    cJSON_AddBoolToObject(json, "use_cache", 1);
    cJSON_AddStringToObject(json, "torch_dtype", "float32");
    char *text = cJSON_Print(json);
    cJSON_Delete(json);
    FILE *file = fopen(path, "w");
    int ok = file != NULL && text != NULL && fprintf(file, "%s\n", text) > 0;
    if (file != NULL && fclose(file) != 0) ok = 0;
    cJSON_free(text);
    return ok ? 0 : error_set(error, error_size, "writing %s failed: %s", path, strerror(errno));
}

/* A number field; absent or null (HF writes "bos_token_id": null) keeps the default unless required. */
static int json_number(const cJSON *json, const char *key, double *value, int required, const char *path, char *error,
                       size_t error_size) {
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(json, key);
    if ((item == NULL || cJSON_IsNull(item)) && !required) return 0;
    if (!cJSON_IsNumber(item)) return error_set(error, error_size, "%s: \"%s\" is missing or not a number", path, key);
    *value = item->valuedouble;
    return 0;
}

int qwen2_config_load_json(qwen2_config *c, const char *path, char *error, size_t error_size) {
    FILE *file = fopen(path, "rb");
    if (file == NULL) return error_set(error, error_size, "cannot open %s: %s", path, strerror(errno));
    fseek(file, 0, SEEK_END);
    long size = ftell(file);
    fseek(file, 0, SEEK_SET);
    char *text = size >= 0 ? malloc((size_t)size + 1) : NULL;
    size_t read = text ? fread(text, 1, (size_t)size, file) : 0;
    fclose(file);
    if (text == NULL || read != (size_t)size) {
        free(text);
        return error_set(error, error_size, "reading %s failed", path);
    }
    text[size] = '\0';
    cJSON *json = cJSON_Parse(text);
    free(text);
    if (!cJSON_IsObject(json)) {
        cJSON_Delete(json);
        return error_set(error, error_size, "%s is not a JSON object", path);
    }
    memset(c, 0, sizeof *c);
    snprintf(c->name, sizeof c->name, "custom");
    int status = 0;
    for (size_t i = 0; i < CONFIG_FIELD_COUNT && status == 0; i++) {
        double value = config_fields[i].fallback;
        status = json_number(json, config_fields[i].name, &value, config_fields[i].required, path, error, error_size);
        if (status == 0 && !field_value_ok(&config_fields[i], value))
            status = error_set(error, error_size, "%s: %s=%.17g %s", path, config_fields[i].name, value,
                               field_refusal(&config_fields[i]));
        if (status == 0) field_store(c, &config_fields[i], value);
    }
    double head_dim = -1;
    if (status == 0) status = json_number(json, "head_dim", &head_dim, 0, path, error, error_size);
    /* transformers 5 moved rope_theta into "rope_parameters"; older files have it at the top level. */
    const cJSON *rope = cJSON_GetObjectItemCaseSensitive(json, "rope_parameters");
    if (status == 0 && cJSON_IsObject(rope) && cJSON_GetObjectItemCaseSensitive(json, "rope_theta") == NULL) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(rope, "rope_type");
        if (cJSON_IsString(type) && strcmp(type->valuestring, "default") != 0)
            status = error_set(error, error_size, "%s: rope_type \"%s\" is not supported (only default RoPE)", path,
                          type->valuestring);
        else status = json_number(rope, "rope_theta", &c->rope_theta, 1, path, error, error_size);
    }
    const cJSON *tie = cJSON_GetObjectItemCaseSensitive(json, "tie_word_embeddings");
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(json, "hidden_act");
    if (status == 0 && act != NULL && (!cJSON_IsString(act) || strcmp(act->valuestring, "silu") != 0))
        status = error_set(error, error_size, "%s: hidden_act must be \"silu\"", path);
    cJSON_Delete(json);
    if (status != 0) return -1;
    if (c->num_key_value_heads < 0) c->num_key_value_heads = c->num_attention_heads;
    c->head_dim = c->num_attention_heads > 0 ? c->hidden_size / c->num_attention_heads : 0;
    if (head_dim >= 0 && head_dim != (double)c->head_dim) /* compared as doubles: no cast of an unchecked value */
        return error_set(error, error_size, "%s: head_dim %g differs from hidden_size / num_attention_heads = %d", path,
                    head_dim, c->head_dim);
    /* HF's default for Qwen2 is false, but our presets tie */
    c->tie_word_embeddings = tie == NULL || cJSON_IsTrue(tie);
    if (tie != NULL && !cJSON_IsBool(tie))
        return error_set(error, error_size, "%s: tie_word_embeddings is not a bool", path);
    return qwen2_config_validate(c, error, error_size);
}

/* ---------------------------------------------------------------- module tree */

/* out = prefix.leaf (or leaf when prefix is empty). Our names are short; a too-long one is a bug, so abort. */
static void join_name(char *out, const char *prefix, const char *leaf) {
    int length = snprintf(out, QWEN2_NAME_MAX, "%s%s%s", prefix, prefix[0] ? "." : "", leaf);
    if (length < 0 || length >= QWEN2_NAME_MAX) {
        fprintf(stderr, "qwen2: name '%s.%s' longer than %d bytes\n", prefix, leaf, QWEN2_NAME_MAX - 1);
        abort();
    }
}

static int add_module(qwen2_tree *tree, const char *name, const char *type, int parent, int layer) {
    qwen2_module *module = &tree->modules[tree->module_count];
    snprintf(module->name, sizeof module->name, "%s", name);
    module->type = type;
    module->parent = parent;
    module->layer = layer;
    return tree->module_count++;
}

static void add_param(qwen2_tree *tree, int module, const char *leaf, int64_t rows, int64_t columns) {
    qwen2_param *param = &tree->params[tree->param_count++];
    join_name(param->name, tree->modules[module].name, leaf);
    param->ndim = columns > 0 ? 2 : 1;
    param->shape[0] = rows;
    param->shape[1] = columns > 0 ? columns : 0;
    param->module = module;
    param->layer = tree->modules[module].layer;
}

/* A Linear child of `parent` with its weight (out, in) and optional bias. */
static void add_linear(qwen2_tree *tree, int parent, const char *leaf, int out, int in, int bias, int layer) {
    char name[QWEN2_NAME_MAX];
    join_name(name, tree->modules[parent].name, leaf);
    int module = add_module(tree, name, "Linear", parent, layer);
    add_param(tree, module, "weight", out, in);
    if (bias) add_param(tree, module, "bias", out, 0);
}

static void add_norm(qwen2_tree *tree, int parent, const char *leaf, int size, int layer) {
    char name[QWEN2_NAME_MAX];
    join_name(name, tree->modules[parent].name, leaf);
    int module = add_module(tree, name, "Qwen2RMSNorm", parent, layer);
    add_param(tree, module, "weight", size, 0);
}

int qwen2_tree_build(qwen2_tree *tree, const qwen2_config *c) {
    memset(tree, 0, sizeof *tree);
    int L = c->num_hidden_layers, C = c->hidden_size, D = c->head_dim;
    tree->modules = calloc((size_t)(6 + 12 * L), sizeof *tree->modules);
    tree->params = calloc((size_t)(2 + LAYER_PARAM_COUNT * L), sizeof *tree->params);
    if (tree->modules == NULL || tree->params == NULL) {
        qwen2_tree_free(tree);
        return -1;
    }
    int root = add_module(tree, "", "Qwen2ForCausalLM", -1, -1);
    int model = add_module(tree, "model", "Qwen2Model", root, -1);
    int embed = add_module(tree, "model.embed_tokens", "Embedding", model, -1);
    add_param(tree, embed, "weight", c->vocab_size, C);
    int layers = add_module(tree, "model.layers", "ModuleList", model, -1);
    for (int l = 0; l < L; l++) {
        char name[QWEN2_NAME_MAX];
        snprintf(name, sizeof name, "model.layers.%d", l);
        int layer = add_module(tree, name, "Qwen2DecoderLayer", layers, l);
        snprintf(name, sizeof name, "model.layers.%d.self_attn", l);
        int attention = add_module(tree, name, "Qwen2Attention", layer, l);
        add_linear(tree, attention, "q_proj", c->num_attention_heads * D, C, 1, l);
        add_linear(tree, attention, "k_proj", c->num_key_value_heads * D, C, 1, l);
        add_linear(tree, attention, "v_proj", c->num_key_value_heads * D, C, 1, l);
        add_linear(tree, attention, "o_proj", C, c->num_attention_heads * D, 0, l);
        snprintf(name, sizeof name, "model.layers.%d.mlp", l);
        int mlp = add_module(tree, name, "Qwen2MLP", layer, l);
        add_linear(tree, mlp, "gate_proj", c->intermediate_size, C, 0, l);
        add_linear(tree, mlp, "up_proj", c->intermediate_size, C, 0, l);
        add_linear(tree, mlp, "down_proj", C, c->intermediate_size, 0, l);
        add_norm(tree, layer, "input_layernorm", C, l);
        add_norm(tree, layer, "post_attention_layernorm", C, l);
    }
    add_norm(tree, model, "norm", C, -1);
    add_module(tree, "lm_head", "Linear", root, -1); /* tied: its weight is model.embed_tokens.weight */
    return 0;
}

void qwen2_tree_free(qwen2_tree *tree) {
    free(tree->modules);
    free(tree->params);
    memset(tree, 0, sizeof *tree);
}

size_t qwen2_param_numel(const qwen2_param *param) {
    return (size_t)param->shape[0] * (param->ndim == 2 ? (size_t)param->shape[1] : 1);
}

static int ends_with(const char *text, const char *suffix) {
    size_t length = strlen(text), suffix_length = strlen(suffix);
    return length >= suffix_length && strcmp(text + length - suffix_length, suffix) == 0;
}

void qwen2_init_fill(const char *name, size_t first, size_t count, float *out, void *user) {
    const qwen2_init_spec *init = user;
    if (ends_with(name, "norm.weight")) { /* input_layernorm, post_attention_layernorm, model.norm */
        for (size_t i = 0; i < count; i++) out[i] = 1.0f;
    } else if (ends_with(name, ".bias")) {
        memset(out, 0, count * sizeof(float));
    } else {
        rng_fill_normal(init->seed, rng_stream_of(name), first, count, 0.0f, init->std, out);
    }
}

double qwen2_forward_flops(const qwen2_config *c, int B, int T, int layers_only) {
    double N = (double)B * T, C = c->hidden_size, D = c->head_dim, H = c->num_attention_heads;
    double KVH = c->num_key_value_heads, inter = c->intermediate_size;
    double per_layer = 2 * N * C * (H * D + 2 * KVH * D) + 2 * N * H * D * C + 3 * 2 * N * C * inter +
                       2 * 2 * (double)B * H * T * (double)T * D;
    return c->num_hidden_layers * per_layer + (layers_only ? 0.0 : 2 * N * C * c->vocab_size);
}

/* ---------------------------------------------------------------- model and units */

int qwen2_module_tree(const qwen2_config *config, module_tree *out) {
    qwen2_tree tree;
    memset(out, 0, sizeof *out);
    if (qwen2_tree_build(&tree, config) != 0) return -1;
    out->nodes = calloc((size_t)tree.module_count, sizeof *out->nodes);
    out->params = calloc((size_t)tree.param_count, sizeof *out->params);
    if (out->nodes == NULL || out->params == NULL) {
        qwen2_tree_free(&tree);
        module_tree_free(out);
        return -1;
    }
    out->node_count = tree.module_count, out->param_count = tree.param_count;
    for (int m = 0; m < tree.module_count; m++) {
        snprintf(out->nodes[m].name, sizeof out->nodes[m].name, "%s", tree.modules[m].name);
        out->nodes[m].type = tree.modules[m].type;
        out->nodes[m].parent = tree.modules[m].parent;
    }
    int head = config->num_hidden_layers + 1;
    for (int p = 0; p < tree.param_count; p++) {
        const qwen2_param *param = &tree.params[p];
        module_param *to = &out->params[p];
        snprintf(to->name, sizeof to->name, "%s", param->name);
        to->ndim = param->ndim;
        to->shape[0] = param->shape[0], to->shape[1] = param->shape[1];
        to->module = param->module;
        if (param->layer >= 0) to->first_piece = to->last_piece = 1 + param->layer;
        else if (p == 0) to->first_piece = 0, to->last_piece = head; /* model.embed_tokens.weight, tied to lm_head */
        else to->first_piece = to->last_piece = head;                /* model.norm.weight */
    }
    qwen2_tree_free(&tree);
    return 0;
}

int qwen2_model_init(qwen2_model *model, context *ctx, const qwen2_config *config, const int *unit_of_param,
                     int unit_count, int replicated, const qwen2_init_spec *init) {
    memset(model, 0, sizeof *model);
    model->ctx = ctx;
    model->config = *config;
    layers_set_threads(ctx->threads);
    if (qwen2_config_validate(config, ctx->error, sizeof ctx->error) != 0) return -1;
    if (qwen2_tree_build(&model->tree, config) != 0 || qwen2_module_tree(config, &model->module_tree) != 0)
        world_fatal(ctx, "out of memory building the module tree");
    model->unit_count = unit_count;
    return module_units_build(ctx, &model->module_tree, unit_of_param, unit_count, replicated, "model.",
                              init ? qwen2_init_fill : NULL, (void *)init, &model->units, &model->locations);
}

int qwen2_model_init_wrapped(qwen2_model *model, context *ctx, const qwen2_config *config, fsdp_wrap_fn wrap,
                             void *user, fsdp_strategy strategy, const qwen2_init_spec *init) {
    module_tree tree;
    if (qwen2_config_validate(config, ctx->error, sizeof ctx->error) != 0) return -1;
    if (qwen2_module_tree(config, &tree) != 0) world_fatal(ctx, "out of memory building the module tree");
    int *unit_of_param = calloc((size_t)tree.param_count, sizeof *unit_of_param);
    if (unit_of_param == NULL) world_fatal(ctx, "out of memory");
    int unit_count = fsdp_auto_wrap(&tree, wrap, user, unit_of_param);
    int status = qwen2_model_init(model, ctx, config, unit_of_param, unit_count, strategy == FSDP_NO_SHARD, init);
    free(unit_of_param);
    module_tree_free(&tree);
    return status;
}

void qwen2_model_free(qwen2_model *model) {
    module_units_free(model->units, model->unit_count, model->locations);
    model->units = NULL, model->locations = NULL;
    module_tree_free(&model->module_tree);
    mem_free(&model->ctx->mem, model->rope_cos);
    mem_free(&model->ctx->mem, model->rope_sin);
    free(model->units);
    free(model->locations);
    qwen2_tree_free(&model->tree);
    memset(model, 0, sizeof *model);
}

int qwen2_find_param(const qwen2_model *model, const char *name) {
    for (int p = 0; p < model->tree.param_count; p++)
        if (strcmp(model->tree.params[p].name, name) == 0) return p;
    return -1;
}

float *qwen2_param_data(const qwen2_model *model, int param) {
    qwen2_location at = model->locations[param];
    const flat_param *unit = &model->units[at.unit];
    if (unit->shard_state != FLAT_PARAM_UNSHARDED)
        world_fatal(model->ctx, "unit '%s': parameter '%s' used while SHARDED; unshard the unit first", unit->unit,
                  model->tree.params[param].name);
    if (flat_param_unshard_pending(unit))
        world_fatal(model->ctx, "unit '%s': parameter '%s' used while its all-gather is in flight; wait for it first",
                  unit->unit, model->tree.params[param].name);
    return unit->full_param_padded + unit->params[at.index].offset;
}

float *qwen2_param_grad(const qwen2_model *model, int param) {
    qwen2_location at = model->locations[param];
    const flat_param *unit = &model->units[at.unit];
    if (unit->full_grad_padded == NULL)
        world_fatal(model->ctx, "unit '%s': gradient of '%s' written before the unit's full gradient was allocated",
                  unit->unit, model->tree.params[param].name);
    return unit->full_grad_padded + unit->params[at.index].offset;
}

/* Tree index of layer l's parameter k, of the embedding and of the final norm (HF order: embed, layers, norm). */
static int layer_param(int layer, int k) { return 1 + LAYER_PARAM_COUNT * layer + k; }
static int embed_param(void) { return 0; }
static int norm_param(const qwen2_model *model) { return 1 + LAYER_PARAM_COUNT * model->config.num_hidden_layers; }

/* ---------------------------------------------------------------- activations */

/* Tracked float buffers named "layers.<l>.<owner>" (or "<owner>" outside the layers), in two kinds that say what
 * the code does with them: an output buffer is written whole by the call that fills it, so it starts undefined (no
 * time spent zeroing: every activation gradient, since a backward writes its input's gradient); a sum buffer is
 * what kernels add into (+=), so it starts at zero (a weight gradient outside the FlatParameter, the rows of dnorm
 * that a chunk with no targets leaves). */
static float *tracked_buffer(qwen2_model *model, size_t count, const char *owner, int layer, mem_category category,
                             int zeroed) {
    char name[MEM_OWNER_MAX];
    if (layer >= 0) snprintf(name, sizeof name, "layers.%d.%s", layer, owner);
    else snprintf(name, sizeof name, "%s", owner);
    return zeroed ? mem_alloc(&model->ctx->mem, count * sizeof(float), category, name)
                  : mem_alloc_uninitialized(&model->ctx->mem, count * sizeof(float), category, name);
}

static float *output_buffer(qwen2_model *model, size_t count, const char *owner, int layer, mem_category category) {
    return tracked_buffer(model, count, owner, layer, category, 0);
}

static float *sum_buffer(qwen2_model *model, size_t count, const char *owner, int layer, mem_category category) {
    return tracked_buffer(model, count, owner, layer, category, 1);
}

static void release(qwen2_model *model, float **buffer) {
    mem_free(&model->ctx->mem, *buffer);
    *buffer = NULL;
}

/* Two weight matrices (each `count` floats) as one stacked matrix, for one GEMM instead of two. In a FlatParameter
 * consecutive parameters sit back to back, so gate_proj and up_proj already are stacked whenever one unit holds
 * both; only a wrap policy that puts the two Linear modules in different units needs the copy made here (returned
 * in *copy, released by the caller). */
static const float *stacked_pair(qwen2_model *model, const float *first, const float *second, size_t count,
                                 float **copy, int layer) {
    if (second == first + count) return first;
    *copy = output_buffer(model, 2 * count, "mlp.gate_up_weight", layer, MEM_WORKSPACE);
    device *d = &model->ctx->device;
    d->copy(d, *copy, first, count * sizeof(float), DEVICE_D2D);
    d->copy(d, *copy + count, second, count * sizeof(float), DEVICE_D2D);
    return *copy;
}

/* RoPE tables cover at least T positions. */
static void ensure_rope(qwen2_model *model, int T) {
    device *d = &model->ctx->device;
    if (T <= model->rope_positions) return;
    release(model, &model->rope_cos);
    release(model, &model->rope_sin);
    size_t count = (size_t)T * model->config.head_dim;
    model->rope_cos = output_buffer(model, count, "rope.cos", -1, MEM_WORKSPACE);
    model->rope_sin = output_buffer(model, count, "rope.sin", -1, MEM_WORKSPACE);
    d->rope_tables(d, model->rope_cos, model->rope_sin, T, model->config.head_dim, (float)model->config.rope_theta);
    model->rope_positions = T;
}

/* ---------------------------------------------------------------- mixed precision compute (MP=bf16)
 * Under MixedPrecision(param_dtype=bfloat16) torch runs every op on bfloat16 tensors: each op's output is rounded to
 * bfloat16 (core/kernels/layers_bf16.h says where, op by op). The model does the same when its units gather in
 * bfloat16: it calls the device's bfloat16 layers (device.h's *_bf16 entries: the `if (bf16_compute(model))` branches
 * and model_linear_forward / model_linear_backward below); the other ops round their outputs as they write them
 * (add_activation's add, the loss's gradient: logits_gradient_dtype). The float32 path is untouched. */

/* What the layers compute in: the gathered parameters' dtype (the root unit's param_dtype; float32 without mixed
 * precision, and for a model outside FSDP). */
static dtype compute_dtype(const qwen2_model *model) {
    return model->unit_count > 0 ? model->units[0].mixed_precision.param_dtype : DTYPE_FLOAT32;
}

static int bf16_compute(const qwen2_model *model) { return compute_dtype(model) == DTYPE_BFLOAT16; }


/* FSDP2's MixedPrecisionPolicy(output_dtype=bfloat16) over float32 compute: every fully_shard module's forward
 * output is cast to bfloat16: each decoder layer's output (the next layer's input, cast back to float32 by its
 * cast_forward_inputs) and the root's, the logits (read by the loss as logits.float()). In backward those casts
 * round the gradients: of a layer's input when it came from a layer (not the embedding's, which the root computes
 * inside itself), and of the logits. With bfloat16 compute the values are bfloat16 already and an output_dtype of
 * either kind changes nothing, nor does float32 over float32. Units are the decoder layers (the trainer refuses
 * another wrap with it). */
static int output_rounds(const qwen2_model *model) {
    return model->unit_count > 0 && model->units[0].mixed_precision.output_dtype == DTYPE_BFLOAT16 &&
           !bf16_compute(model);
}

static void round_output(qwen2_model *model, float *buffer, size_t count) {
    device *d = &model->ctx->device;
    if (output_rounds(model)) d->round_to(d, buffer, count, DTYPE_BFLOAT16);
}

/* out += inp, then rounded: a residual add, or autograd's sum of two gradients, in the compute dtype (in bfloat16
 * the add and its rounding are one pass). */
static void add_activation(qwen2_model *model, float *out, const float *inp, size_t count) {
    device *d = &model->ctx->device;
    if (bf16_compute(model)) d->add_inplace_bf16(d, out, inp, count);
    else d->add_inplace(d, out, inp, count);
}

/* A Linear module's GEMM in the compute dtype: in bfloat16 its inputs hold bfloat16 values and its output is rounded
 * (the device's linear_*_bf16: bfloat16 tensor cores on a GPU), else float32's. Backward: dinp (when not NULL) is
 * written, rounded; weight and bias gradients are float32 sums added in either way. */
static void model_linear_forward(qwen2_model *model, float *out, const float *inp, const float *weight,
                                 const float *bias, int N, int IC, int OC) {
    device *d = &model->ctx->device;
    if (bf16_compute(model)) d->linear_forward_bf16(d, out, inp, weight, bias, N, IC, OC);
    else d->linear_forward(d, out, inp, weight, bias, N, IC, OC);
}

static void model_linear_backward(qwen2_model *model, float *dinp, float *dweight, float *dbias, const float *dout,
                                  const float *inp, const float *weight, int N, int IC, int OC) {
    device *d = &model->ctx->device;
    if (bf16_compute(model)) d->linear_backward_bf16(d, dinp, dweight, dbias, dout, inp, weight, N, IC, OC);
    else d->linear_backward(d, dinp, dweight, dbias, dout, inp, weight, N, IC, OC);
}

int qwen2_activations_begin(qwen2_model *model, qwen2_activations *acts, const int *tokens, const int *targets, int B,
                            int T) {
    context *ctx = model->ctx;
    const qwen2_config *c = &model->config;
    memset(acts, 0, sizeof *acts);
    if (B < 1 || T < 1 || T > c->max_position_embeddings) {
        snprintf(ctx->error, sizeof ctx->error, "rank %d: batch %d x %d: need B >= 1 and 1 <= T <= %d", ctx->rank, B, T,
                 c->max_position_embeddings);
        return -1;
    }
    for (int i = 0; i < B * T; i++) {
        int bad_token = tokens[i] < 0 || tokens[i] >= c->vocab_size;
        int bad_target =
            targets != NULL && targets[i] != QWEN2_IGNORE_INDEX && (targets[i] < 0 || targets[i] >= c->vocab_size);
        if (bad_token || bad_target) {
            snprintf(ctx->error, sizeof ctx->error, "rank %d: %s %d at batch row %d, position %d is outside the "
                     "vocabulary 0..%d", ctx->rank, bad_token ? "token" : "target", bad_token ? tokens[i] : targets[i],
                     i / T, i % T, c->vocab_size - 1);
            return -1;
        }
        acts->counted_targets += targets != NULL && targets[i] != QWEN2_IGNORE_INDEX;
    }
    acts->B = B;
    acts->T = T;
    acts->loss_gradient_scale = 1.0f;
    acts->loss_slot = -1;
    /* chunked_loss's condition: each chunk's count, for its share of the gradient's scale */
    if (targets != NULL && model->loss_chunk > 0 && model->loss_chunk < B * T) {
        int rows = model->loss_chunk, chunks = (B * T + rows - 1) / rows;
        acts->chunk_counts = calloc((size_t)chunks, sizeof *acts->chunk_counts); /* metadata, not a tensor */
        if (acts->chunk_counts == NULL) world_fatal(ctx, "out of memory for the counts of %d loss chunks", chunks);
        for (int i = 0; i < B * T; i++) acts->chunk_counts[i / rows] += targets[i] != QWEN2_IGNORE_INDEX;
    }
    size_t N = (size_t)B * T;
    acts->tokens = mem_alloc(&ctx->mem, N * sizeof(int), MEM_DATA, "batch.tokens");
    device *d = &ctx->device;
    /* queued, not waited for: the caller waits (pinned_copies_wait) before it writes the next batch there */
    d->copy_from_pinned(d, acts->tokens, tokens, N * sizeof(int));
    if (targets != NULL) {
        acts->targets = mem_alloc(&ctx->mem, N * sizeof(int), MEM_DATA, "batch.targets");
        d->copy_from_pinned(d, acts->targets, targets, N * sizeof(int));
    }
    int L = c->num_hidden_layers;
    acts->residuals = calloc((size_t)L + 1, sizeof *acts->residuals); /* pointer tables: metadata, not tensors */
    acts->dresiduals = calloc((size_t)L + 1, sizeof *acts->dresiduals);
    acts->layers = calloc((size_t)(L > 0 ? L : 1), sizeof *acts->layers);
    if (acts->residuals == NULL || acts->dresiduals == NULL || acts->layers == NULL)
        world_fatal(ctx, "out of memory for the activation tables of %d layers", L);
    ensure_rope(model, T);
    return 0;
}

void qwen2_layer_activations_free(qwen2_model *model, qwen2_layer_activations *a) {
    float **buffers[] = {&a->ln1, &a->ln1_rstd, &a->q, &a->k, &a->v, &a->attention, &a->mid,
                         &a->ln2, &a->ln2_rstd, &a->gate_up, &a->swiglu};
    for (size_t i = 0; i < sizeof buffers / sizeof buffers[0]; i++) release(model, buffers[i]);
}

void qwen2_activations_end(qwen2_model *model, qwen2_activations *acts) {
    int L = model->config.num_hidden_layers;
    for (int l = 0; l <= L; l++) {
        if (acts->residuals) release(model, &acts->residuals[l]);
        if (acts->dresiduals) release(model, &acts->dresiduals[l]);
        if (l < L && acts->layers) qwen2_layer_activations_free(model, &acts->layers[l]);
    }
    release(model, &acts->final_norm);
    release(model, &acts->final_rstd);
    release(model, &acts->logits);
    release(model, &acts->dlogits);
    release(model, &acts->dnorm);
    mem_free(&model->ctx->mem, acts->tokens);
    mem_free(&model->ctx->mem, acts->targets);
    free(acts->residuals);
    free(acts->dresiduals);
    free(acts->layers);
    free(acts->chunk_counts);
    memset(acts, 0, sizeof *acts);
}

/* ---------------------------------------------------------------- forward */

/* The residual stream entering layer `index` (or the final norm): checkpoint_input when that layer is checkpointed. */
static mem_category residual_category(const qwen2_model *model, const qwen2_activations *acts, int index) {
    int is_layer_input = index < model->config.num_hidden_layers;
    return is_layer_input && acts->checkpointed && acts->checkpointed[index] ? MEM_CHECKPOINT_INPUT : MEM_ACTIVATION;
}

void qwen2_embed_forward(qwen2_model *model, qwen2_activations *acts) {
    device *d = &model->ctx->device;
    size_t N = (size_t)acts->B * acts->T;
    int C = model->config.hidden_size;
    acts->residuals[0] = output_buffer(model, N * C, "embed_tokens.output", -1, residual_category(model, acts, 0));
    d->embedding_forward(d, acts->residuals[0], acts->tokens, qwen2_param_data(model, embed_param()), (int)N, C);
}

void qwen2_layer_forward(qwen2_model *model, qwen2_activations *acts, int l) {
    device *d = &model->ctx->device;
    const qwen2_config *c = &model->config;
    int B = acts->B, T = acts->T, N = B * T, C = c->hidden_size, I = c->intermediate_size, D = c->head_dim;
    int H = c->num_attention_heads, KVH = c->num_key_value_heads;
    qwen2_layer_activations *a = &acts->layers[l];
    const float *x = acts->residuals[l];
    float *w[LAYER_PARAM_COUNT];
    for (int k = 0; k < LAYER_PARAM_COUNT; k++) w[k] = qwen2_param_data(model, layer_param(l, k));

    a->ln1 = output_buffer(model, (size_t)N * C, "input_layernorm.output", l, MEM_ACTIVATION);
    a->ln1_rstd = output_buffer(model, (size_t)N, "input_layernorm.rstd", l, MEM_ACTIVATION);
    float eps = (float)c->rms_norm_eps;
    if (bf16_compute(model)) d->rmsnorm_forward_bf16(d, a->ln1, a->ln1_rstd, x, w[INPUT_NORM_WEIGHT], N, C, eps);
    else d->rmsnorm_forward(d, a->ln1, a->ln1_rstd, x, w[INPUT_NORM_WEIGHT], N, C, eps);
    a->q = output_buffer(model, (size_t)N * H * D, "self_attn.q", l, MEM_ACTIVATION);
    a->k = output_buffer(model, (size_t)N * KVH * D, "self_attn.k", l, MEM_ACTIVATION);
    a->v = output_buffer(model, (size_t)N * KVH * D, "self_attn.v", l, MEM_ACTIVATION);
    model_linear_forward(model, a->q, a->ln1, w[Q_WEIGHT], w[Q_BIAS], N, C, H * D);
    model_linear_forward(model, a->k, a->ln1, w[K_WEIGHT], w[K_BIAS], N, C, KVH * D);
    model_linear_forward(model, a->v, a->ln1, w[V_WEIGHT], w[V_BIAS], N, C, KVH * D);
    /* With a KV cache these T tokens are positions past .. past + T - 1: RoPE from there, and attention over every
     * cached position (this batch's k, v appended first). */
    qwen2_kv_cache *cache = acts->cache;
    int past = cache != NULL ? cache->length : 0;
    const float *rope_cos = model->rope_cos + (size_t)past * D, *rope_sin = model->rope_sin + (size_t)past * D;
    if (bf16_compute(model)) {
        d->rope_forward_bf16(d, a->q, rope_cos, rope_sin, B, T, H, D);
        d->rope_forward_bf16(d, a->k, rope_cos, rope_sin, B, T, KVH, D);
    } else {
        d->rope_forward(d, a->q, rope_cos, rope_sin, B, T, H, D);
        d->rope_forward(d, a->k, rope_cos, rope_sin, B, T, KVH, D);
    }
    const float *keys = a->k, *values = a->v;
    if (cache != NULL) {
        size_t at = (size_t)past * KVH * D, count = (size_t)T * KVH * D;
        d->copy(d, cache->k[l] + at, a->k, count * sizeof(float), DEVICE_D2D);
        d->copy(d, cache->v[l] + at, a->v, count * sizeof(float), DEVICE_D2D);
        keys = cache->k[l];
        values = cache->v[l];
    }
    a->attention = output_buffer(model, (size_t)N * H * D, "self_attn.output", l, MEM_ACTIVATION);
    /* The probabilities (B, H, T, past + T) are not kept for backward: it makes them again from q and k
     * (attention_probs), as torch's scaled_dot_product_attention does, so B H T^2 floats a layer are not held from
     * the forward to the backward. The scratch: the heads transposed for the GPU's batched GEMMs (and the bfloat16
     * probabilities multiplying v). */
    float *probs = output_buffer(model, (size_t)B * H * T * (past + T), "self_attn.probs", l, MEM_WORKSPACE);
    size_t scratch_floats = device_attention_forward_scratch_floats(B, T, past, H, KVH, D, bf16_compute(model));
    float *scratch = output_buffer(model, scratch_floats, "self_attn.scratch", l, MEM_WORKSPACE);
    if (bf16_compute(model))
        d->attention_forward_bf16(d, a->attention, probs, scratch, a->q, keys, values, B, T, past, H, KVH, D);
    else d->attention_forward_at(d, a->attention, probs, scratch, a->q, keys, values, B, T, past, H, KVH, D);
    release(model, &scratch);
    release(model, &probs);
    a->mid = output_buffer(model, (size_t)N * C, "residual_mid", l, MEM_ACTIVATION);
    model_linear_forward(model, a->mid, a->attention, w[O_WEIGHT], NULL, N, H * D, C);

    /* mid += x (the residual, rounded as add_activation's), then ln2 = norm(mid): one pass over mid */
    a->ln2 = output_buffer(model, (size_t)N * C, "post_attention_layernorm.output", l, MEM_ACTIVATION);
    a->ln2_rstd = output_buffer(model, (size_t)N, "post_attention_layernorm.rstd", l, MEM_ACTIVATION);
    if (bf16_compute(model))
        d->residual_rmsnorm_forward_bf16(d, a->mid, a->ln2, a->ln2_rstd, x, w[POST_NORM_WEIGHT], N, C, eps);
    else d->residual_rmsnorm_forward(d, a->mid, a->ln2, a->ln2_rstd, x, w[POST_NORM_WEIGHT], N, C, eps);
    a->gate_up = output_buffer(model, (size_t)N * 2 * I, "mlp.gate_up", l, MEM_ACTIVATION);
    a->swiglu = output_buffer(model, (size_t)N * I, "mlp.act", l, MEM_ACTIVATION);
    float *stacked = NULL;
    model_linear_forward(model, a->gate_up, a->ln2,
                         stacked_pair(model, w[GATE_WEIGHT], w[UP_WEIGHT], (size_t)I * C, &stacked, l), NULL, N, C,
                         2 * I);
    release(model, &stacked);
    if (bf16_compute(model)) d->swiglu_forward_bf16(d, a->swiglu, a->gate_up, N, I);
    else d->swiglu_forward(d, a->swiglu, a->gate_up, N, I);
    float *out = acts->residuals[l + 1] =
        output_buffer(model, (size_t)N * C, "output", l, residual_category(model, acts, l + 1));
    model_linear_forward(model, out, a->swiglu, w[DOWN_WEIGHT], NULL, N, I, C);
    add_activation(model, out, a->mid, (size_t)N * C);
    round_output(model, out, (size_t)N * C); /* output_dtype: the layer's output */
}

/* The loss in chunks (model->loss_chunk rows at a time; LOSS_CHUNK): N x V logits never exist at once. Each chunk's
 * logits, its loss and, when backward follows, its gradient and the lm_head's two backward GEMMs (into dnorm's rows
 * and the tied embedding's gradient) all happen in the head's forward, while the chunk's logits exist: no chunk is
 * computed twice (llm.c's fused classifier). The gradient's scale must be known then: the chunk's mean becomes its
 * share of the batch's mean (count_c / count, the batch's count counted on the host before), times the accumulation
 * factor the runtime hands qwen2_begin_backward_in_forward before the forward. The numbers are the ones the
 * backward computed before (the same logits, the same factor, the same GEMMs in the same chunk order into the same
 * zeroed dnorm and the same gradient buffer, before the embedding's backward adds its share): bit for bit. */
static int chunked_loss(const qwen2_model *model, const qwen2_activations *acts) {
    return acts->targets != NULL && model->loss_chunk > 0 && model->loss_chunk < acts->B * acts->T;
}

/* The loss slot the head's loss goes to: the runtime's (module_ops.loss_to_slot), or the last one, the model's own,
 * read when the head's forward ends. */
static int head_slot(const qwen2_activations *acts) {
    return acts->loss_slot >= 0 ? acts->loss_slot : DEVICE_LOSS_SLOTS - 1;
}

/* Slots first .. first + count - 1 read (one copy, one host wait) into their means, each slot's count checked against
 * the targets the host counted for it; the slots and their host counts start again from zero. */
static void read_losses(qwen2_model *model, float *losses, int first, int count) {
    device *d = &model->ctx->device;
    double sums[DEVICE_LOSS_SLOTS], counts[DEVICE_LOSS_SLOTS];
    if (first < 0 || count < 0 || first + count > DEVICE_LOSS_SLOTS)
        world_fatal(model->ctx, "lm_head: loss slots %d .. %d outside the device's 0 .. %d", first, first + count - 1,
                    DEVICE_LOSS_SLOTS - 1);
    d->loss_slots_read(d, sums, counts, first, count);
    for (int i = 0; i < count; i++) {
        int expected = model->loss_slot_targets[first + i];
        model->loss_slot_targets[first + i] = 0;
        if (counts[i] != (double)expected)
            world_fatal(model->ctx, "lm_head: loss slot %d counted %.0f targets on the device, the host %d", first + i,
                        counts[i], expected);
        losses[i] = counts[i] > 0.0 ? (float)(sums[i] / counts[i]) : 0.0f;
    }
}

/* The head's loss queued into `slot`: returned now (one host wait) when no runtime slot was given, else 0 and read with
 * the step's other micro-batches. */
static float finish_loss(qwen2_model *model, qwen2_activations *acts, int slot) {
    model->loss_slot_targets[slot] += acts->counted_targets;
    acts->target_count = acts->counted_targets;
    acts->loss = 0.0f;
    if (acts->loss_slot < 0) read_losses(model, &acts->loss, slot, 1);
    return acts->loss;
}

/* The logits of `rows` rows: lm_head (tied: norm.output @ embed_tokens.weight^T; rounded in bfloat16 under mixed
 * precision, HF's loss then reads logits.float()), then output_dtype's cast, the root's output. */
static void head_logits(qwen2_model *model, float *logits, const float *final_norm, int rows) {
    model_linear_forward(model, logits, final_norm, qwen2_param_data(model, embed_param()), NULL, rows,
                         model->config.hidden_size, model->config.vocab_size);
    round_output(model, logits, (size_t)rows * model->config.vocab_size);
}

/* The dtype of the loss's gradient as it reaches lm_head: logits.float()'s backward rounds it to the compute dtype,
 * output_dtype's cast to bfloat16 (float32: neither). The loss's kernel rounds it as it writes it. The logits
 * themselves are rounded to the same dtype (lm_head's output, output_dtype's cast): under LOSS_CHUNK by the loss's
 * kernel as it reads them. */
static dtype logits_gradient_dtype(const qwen2_model *model) {
    return bf16_compute(model) || output_rounds(model) ? DTYPE_BFLOAT16 : DTYPE_FLOAT32;
}

/* The chunk's gradient into dnorm's rows and the tied embedding's gradient: dlogits (scaled and rounded by the loss's
 * kernel), then the lm_head's two backward GEMMs. */
static void head_chunk_backward(qwen2_model *model, qwen2_activations *acts, const float *dlogits, int first,
                                int rows) {
    int C = model->config.hidden_size, V = model->config.vocab_size;
    model_linear_backward(model, acts->dnorm + (size_t)first * C, qwen2_param_grad(model, embed_param()), NULL, dlogits,
                          acts->final_norm + (size_t)first * C, qwen2_param_data(model, embed_param()), rows, C, V);
}

static float head_forward_chunked(qwen2_model *model, qwen2_activations *acts) {
    device *d = &model->ctx->device;
    int N = acts->B * acts->T, C = model->config.hidden_size, V = model->config.vocab_size, rows = model->loss_chunk;
    float *logits = output_buffer(model, (size_t)rows * V, "lm_head.logits_chunk", -1, MEM_WORKSPACE);
    float *dlogits = NULL;
    if (acts->backward_follows) {
        dlogits = output_buffer(model, (size_t)rows * V, "lm_head.dlogits_chunk", -1, MEM_WORKSPACE);
        /* zeroed: a chunk with no targets writes none of its rows */
        acts->dnorm = sum_buffer(model, (size_t)N * C, "norm.doutput", -1, MEM_WORKSPACE);
    }
    int slot = head_slot(acts);
    /* A chunk's logits are read by the loss alone: they are left as the GEMM's float32 sums, and the loss's kernel
     * rounds each as it reads it (bfloat16 compute's lm_head, output_dtype's cast), not a pass over rows x V. */
    dtype rounding = logits_gradient_dtype(model);
    const float *embed = qwen2_param_data(model, embed_param());
    for (int first = 0, chunk = 0; first < N; first += rows, chunk++) {
        int n = N - first < rows ? N - first : rows, chunk_count = acts->chunk_counts[chunk];
        const float *normed = acts->final_norm + (size_t)first * C;
        if (bf16_compute(model)) d->linear_forward_bf16_sums(d, logits, normed, embed, n, C, V);
        else d->linear_forward(d, logits, normed, embed, NULL, n, C, V);
        /* the chunk's mean -> its share of the batch's mean (count_c / count, both counted on the host), times the
         * accumulation factor: applied by the loss's own kernel as it writes dlogits */
        float factor = dlogits != NULL && chunk_count > 0
                           ? (float)((double)chunk_count / acts->counted_targets) * acts->loss_gradient_scale
                           : 1.0f;
        d->cross_entropy_to_slot(d, dlogits, logits, rounding, acts->targets + first, n, V, QWEN2_IGNORE_INDEX, factor,
                                 rounding, slot);
        if (dlogits != NULL && chunk_count > 0) head_chunk_backward(model, acts, dlogits, first, n);
    }
    release(model, &logits);
    release(model, &dlogits);
    return finish_loss(model, acts, slot);
}

float qwen2_head_forward(qwen2_model *model, qwen2_activations *acts) {
    device *d = &model->ctx->device;
    const qwen2_config *c = &model->config;
    int N = acts->B * acts->T, C = c->hidden_size, V = c->vocab_size;
    acts->final_norm = output_buffer(model, (size_t)N * C, "norm.output", -1, MEM_ACTIVATION);
    acts->final_rstd = output_buffer(model, (size_t)N, "norm.rstd", -1, MEM_ACTIVATION);
    if (bf16_compute(model))
        d->rmsnorm_forward_bf16(d, acts->final_norm, acts->final_rstd, acts->residuals[c->num_hidden_layers],
                                qwen2_param_data(model, norm_param(model)), N, C, (float)c->rms_norm_eps);
    else
        d->rmsnorm_forward(d, acts->final_norm, acts->final_rstd, acts->residuals[c->num_hidden_layers],
                        qwen2_param_data(model, norm_param(model)), N, C, (float)c->rms_norm_eps);
    if (chunked_loss(model, acts)) return head_forward_chunked(model, acts);
    acts->logits = output_buffer(model, (size_t)N * V, "lm_head.logits", -1, MEM_ACTIVATION);
    head_logits(model, acts->logits, acts->final_norm, N);
    if (acts->targets == NULL) return 0.0f;
    if (acts->backward_follows)
        acts->dlogits = output_buffer(model, (size_t)N * V, "lm_head.dlogits", -1, MEM_ACTIVATION);
    /* (loss / accumulation_steps).backward()'s factor, applied by the loss's kernel as it writes dlogits (x * 1.0f is
     * x without accumulation) */
    int slot = head_slot(acts);
    d->cross_entropy_to_slot(d, acts->dlogits, acts->logits, DTYPE_FLOAT32, acts->targets, N, V, QWEN2_IGNORE_INDEX,
                             acts->loss_gradient_scale, logits_gradient_dtype(model), slot); /* logits rounded above */
    return finish_loss(model, acts, slot);
}

void qwen2_layer_recompute(qwen2_model *model, qwen2_activations *acts, int l) {
    /* EXERCISE 04-recompute BEGIN: rebuild layer l's saved activations for its backward (its output is not needed) */
    qwen2_layer_forward(model, acts, l);
    release(model, &acts->residuals[l + 1]);
    /* EXERCISE 04-recompute END */
}

/* ---------------------------------------------------------------- backward */

void qwen2_head_backward(qwen2_model *model, qwen2_activations *acts) {
    device *d = &model->ctx->device;
    const qwen2_config *c = &model->config;
    int N = acts->B * acts->T, C = c->hidden_size, V = c->vocab_size, L = c->num_hidden_layers;
    int chunked = chunked_loss(model, acts);
    if (chunked ? acts->dnorm == NULL : acts->dlogits == NULL)
        world_fatal(model->ctx, "head backward after a forward-only head (no targets, or backward_follows unset)");
    float *dnorm = acts->dnorm;
    acts->dnorm = NULL;
    if (!chunked) { /* (chunked: the head's forward did the lm_head's backward, into dnorm) */
        dnorm = output_buffer(model, (size_t)N * C, "norm.doutput", -1, MEM_WORKSPACE);
        /* (the loss's kernel wrote dlogits scaled for accumulation and in the compute dtype: logits_gradient_dtype) */
        /* lm_head's share of the tied gradient stays float32 until the embedding's is added to it: one rounding, at
         * the reduce (torch rounds each share and their sum; that would need a vocabulary-sized buffer here) */
        model_linear_backward(model, dnorm, qwen2_param_grad(model, embed_param()), NULL, acts->dlogits,
                              acts->final_norm, qwen2_param_data(model, embed_param()), N, C, V);
    }
    release(model, &acts->dlogits);
    release(model, &acts->logits);
    acts->dresiduals[L] = output_buffer(model, (size_t)N * C, "dresidual", L - 1, MEM_ACTIVATION);
    if (bf16_compute(model))
        d->rmsnorm_backward_bf16(d, acts->dresiduals[L], NULL, qwen2_param_grad(model, norm_param(model)), dnorm,
                                 acts->residuals[L], qwen2_param_data(model, norm_param(model)), acts->final_rstd, N,
                                 C);
    else
        d->rmsnorm_backward(d, acts->dresiduals[L], NULL, qwen2_param_grad(model, norm_param(model)), dnorm,
                            acts->residuals[L], qwen2_param_data(model, norm_param(model)), acts->final_rstd, N, C);
    release(model, &dnorm);
    release(model, &acts->final_norm);
    release(model, &acts->final_rstd);
    release(model, &acts->residuals[L]);
}

void qwen2_layer_backward(qwen2_model *model, qwen2_activations *acts, int l) {
    device *d = &model->ctx->device;
    const qwen2_config *c = &model->config;
    int B = acts->B, T = acts->T, N = B * T, C = c->hidden_size, I = c->intermediate_size, D = c->head_dim;
    int H = c->num_attention_heads, KVH = c->num_key_value_heads;
    qwen2_layer_activations *a = &acts->layers[l];
    const float *x = acts->residuals[l], *dout = acts->dresiduals[l + 1];
    float *w[LAYER_PARAM_COUNT], *g[LAYER_PARAM_COUNT];
    for (int k = 0; k < LAYER_PARAM_COUNT; k++) {
        w[k] = qwen2_param_data(model, layer_param(l, k));
        g[k] = qwen2_param_grad(model, layer_param(l, k));
    }
    /* MLP half: out = mid + down(swiglu(gate(ln2), up(ln2))), ln2 = norm(mid) */
    float *dmid = output_buffer(model, (size_t)N * C, "dresidual_mid", l, MEM_WORKSPACE); /* = dout + the norm's */
    float *dswiglu = output_buffer(model, (size_t)N * I, "mlp.dact", l, MEM_WORKSPACE);
    model_linear_backward(model, dswiglu, g[DOWN_WEIGHT], NULL, dout, a->swiglu, w[DOWN_WEIGHT], N, I, C);
    float *dgate_up = output_buffer(model, (size_t)N * 2 * I, "mlp.dgate_up", l, MEM_WORKSPACE);
    if (bf16_compute(model)) d->swiglu_backward_bf16(d, dgate_up, dswiglu, a->gate_up, N, I);
    else d->swiglu_backward(d, dgate_up, dswiglu, a->gate_up, N, I);
    release(model, &dswiglu);
    float *dln2 = output_buffer(model, (size_t)N * C, "post_attention_layernorm.doutput", l, MEM_WORKSPACE);
    float *stacked = NULL, *stacked_grad = NULL;
    const float *gate_up_weight = stacked_pair(model, w[GATE_WEIGHT], w[UP_WEIGHT], (size_t)I * C, &stacked, l);
    float *gate_up_grad = g[UP_WEIGHT] == g[GATE_WEIGHT] + (size_t)I * C
                              ? g[GATE_WEIGHT]
                              : (stacked_grad = sum_buffer(model, (size_t)2 * I * C, "mlp.gate_up_grad", l,
                                                           MEM_WORKSPACE));
    if (bf16_compute(model)) { /* gate_proj and up_proj are two modules: their input gradients add in bfloat16 */
        float *scratch = output_buffer(model, (size_t)N * C, "mlp.dinput_up", l, MEM_WORKSPACE);
        d->linear_backward_bf16(d, NULL, gate_up_grad, NULL, dgate_up, a->ln2, gate_up_weight, N, C, 2 * I);
        d->linear_backward_input_stacked_bf16(d, dln2, scratch, dgate_up, gate_up_weight, N, C, I);
        release(model, &scratch);
    } else {
        d->linear_backward(d, dln2, gate_up_grad, NULL, dgate_up, a->ln2, gate_up_weight, N, C, 2 * I);
    }
    if (stacked_grad != NULL) { /* the rare split case: hand each half back */
        d->add_inplace(d, g[GATE_WEIGHT], stacked_grad, (size_t)I * C);
        d->add_inplace(d, g[UP_WEIGHT], stacked_grad + (size_t)I * C, (size_t)I * C);
    }
    release(model, &stacked);
    release(model, &stacked_grad);
    release(model, &dgate_up);
    if (bf16_compute(model))
        d->rmsnorm_backward_bf16(d, dmid, dout, g[POST_NORM_WEIGHT], dln2, a->mid, w[POST_NORM_WEIGHT], a->ln2_rstd,
                                 N, C);
    else
        d->rmsnorm_backward(d, dmid, dout, g[POST_NORM_WEIGHT], dln2, a->mid, w[POST_NORM_WEIGHT], a->ln2_rstd, N, C);
    release(model, &dln2);

    /* attention half: mid = x + o_proj(attention(rope(q), rope(k), v)), q,k,v = proj(ln1), ln1 = norm(x) */
    float *dattention = output_buffer(model, (size_t)N * H * D, "self_attn.doutput", l, MEM_WORKSPACE);
    model_linear_backward(model, dattention, g[O_WEIGHT], NULL, dmid, a->attention, w[O_WEIGHT], N, H * D, C);
    float *dq = output_buffer(model, (size_t)N * H * D, "self_attn.dq", l, MEM_WORKSPACE);
    float *dk = output_buffer(model, (size_t)N * KVH * D, "self_attn.dk", l, MEM_WORKSPACE);
    float *dv = output_buffer(model, (size_t)N * KVH * D, "self_attn.dv", l, MEM_WORKSPACE);
    float *scratch = output_buffer(model, device_attention_backward_scratch_floats(B, T, H, KVH, D),
                                   "self_attn.dscores", l, MEM_WORKSPACE);
    /* the forward's probabilities made again, the same values (the forward kept none) */
    float *probs = output_buffer(model, (size_t)B * H * T * T, "self_attn.probs", l, MEM_WORKSPACE);
    if (bf16_compute(model)) {
        d->attention_probs_bf16(d, probs, scratch, a->q, a->k, B, T, H, KVH, D);
        d->attention_backward_bf16(d, dq, dk, dv, scratch, dattention, probs, a->q, a->k, a->v, B, T, H, KVH, D);
    } else {
        d->attention_probs(d, probs, scratch, a->q, a->k, B, T, H, KVH, D);
        d->attention_backward(d, dq, dk, dv, scratch, dattention, probs, a->q, a->k, a->v, B, T, H, KVH, D);
    }
    release(model, &probs);
    release(model, &scratch);
    if (bf16_compute(model)) {
        d->rope_backward_bf16(d, dq, model->rope_cos, model->rope_sin, B, T, H, D);
        d->rope_backward_bf16(d, dk, model->rope_cos, model->rope_sin, B, T, KVH, D);
    } else {
        d->rope_backward(d, dq, model->rope_cos, model->rope_sin, B, T, H, D);
        d->rope_backward(d, dk, model->rope_cos, model->rope_sin, B, T, KVH, D);
    }
    release(model, &dattention);
    /* three modules read ln1: autograd adds their input gradients (in bfloat16 rounded per addition) as k_proj's +
     * v_proj's, then q_proj's (the order torch's engine runs them in; tests/check_torch_bf16.py) */
    float *dln1 = output_buffer(model, (size_t)N * C, "input_layernorm.doutput", l, MEM_WORKSPACE);
    float *share = output_buffer(model, (size_t)N * C, "input_layernorm.doutput_share", l, MEM_WORKSPACE);
    model_linear_backward(model, share, g[K_WEIGHT], g[K_BIAS], dk, a->ln1, w[K_WEIGHT], N, C, KVH * D);
    model_linear_backward(model, dln1, g[V_WEIGHT], g[V_BIAS], dv, a->ln1, w[V_WEIGHT], N, C, KVH * D);
    add_activation(model, dln1, share, (size_t)N * C);
    model_linear_backward(model, share, g[Q_WEIGHT], g[Q_BIAS], dq, a->ln1, w[Q_WEIGHT], N, C, H * D);
    add_activation(model, dln1, share, (size_t)N * C);
    release(model, &share);
    release(model, &dq);
    release(model, &dk);
    release(model, &dv);
    /* dx = dmid (the residual path) + the norm's backward, added in the norm's pass */
    float *dx = acts->dresiduals[l] = output_buffer(model, (size_t)N * C, "dresidual", l - 1, MEM_ACTIVATION);
    if (bf16_compute(model))
        d->rmsnorm_backward_bf16(d, dx, dmid, g[INPUT_NORM_WEIGHT], dln1, x, w[INPUT_NORM_WEIGHT], a->ln1_rstd, N, C);
    else d->rmsnorm_backward(d, dx, dmid, g[INPUT_NORM_WEIGHT], dln1, x, w[INPUT_NORM_WEIGHT], a->ln1_rstd, N, C);
    if (l > 0) round_output(model, dx, (size_t)N * C); /* output_dtype: the cast of the layer's input, backward */
    release(model, &dln1);
    release(model, &dmid);
    release(model, &acts->dresiduals[l + 1]);
    qwen2_layer_activations_free(model, a);
    release(model, &acts->residuals[l]);
}

void qwen2_embed_backward(qwen2_model *model, qwen2_activations *acts) {
    device *d = &model->ctx->device;
    int N = acts->B * acts->T;
    d->embedding_backward(d, qwen2_param_grad(model, embed_param()), acts->dresiduals[0], acts->tokens, N,
                       model->config.hidden_size);
    release(model, &acts->dresiduals[0]);
    release(model, &acts->residuals[0]);
}

/* ---------------------------------------------------------------- whole passes */

/* The whole forward; with a cache (B = 1) the tokens continue the cached positions, and the cache grows by T. */
static int forward_all(qwen2_model *model, qwen2_activations *acts, const int *tokens, const int *targets, int B,
                       int T, qwen2_kv_cache *cache, int backward_follows) {
    if (qwen2_activations_begin(model, acts, tokens, targets, B, T) != 0) return -1;
    acts->backward_follows = backward_follows;
    if (cache != NULL) {
        if (B != 1 || T > cache->capacity - cache->length)
            world_fatal(model->ctx, "KV cache of %d positions holding %d: no room for a batch of %d x %d",
                      cache->capacity, cache->length, B, T);
        acts->cache = cache;
        ensure_rope(model, cache->length + T);
    }
    qwen2_embed_forward(model, acts);
    for (int l = 0; l < model->config.num_hidden_layers; l++) qwen2_layer_forward(model, acts, l);
    qwen2_head_forward(model, acts);
    if (cache != NULL) cache->length += T;
    return 0;
}

float qwen2_forward_backward(qwen2_model *model, const int *tokens, const int *targets, int B, int T) {
    qwen2_activations acts;
    /* the gradients first: under LOSS_CHUNK the head's forward writes the tied embedding's */
    for (int unit = 0; unit < model->unit_count; unit++) flat_param_alloc_full_grad(&model->units[unit]);
    if (forward_all(model, &acts, tokens, targets, B, T, NULL, 1) != 0)
        world_fatal(model->ctx, "%s", model->ctx->error);
    qwen2_head_backward(model, &acts);
    for (int l = model->config.num_hidden_layers - 1; l >= 0; l--) qwen2_layer_backward(model, &acts, l);
    qwen2_embed_backward(model, &acts);
    float loss = acts.loss;
    qwen2_activations_end(model, &acts);
    return loss;
}

/* The next token from the last position's logits: argmax, or a sample from softmax(logits / temperature). */
static int next_token(const float *logits, int V, float temperature, uint64_t seed, uint64_t step) {
    int best = 0;
    for (int j = 1; j < V; j++)
        if (logits[j] > logits[best]) best = j;
    if (temperature <= 0.0f) return best;
    double sum = 0.0;
    for (int j = 0; j < V; j++) sum += exp((double)(logits[j] - logits[best]) / temperature);
    double threshold = (double)rng_uniform(seed, 0x5a3b1e, step) * sum, running = 0.0;
    for (int j = 0; j < V; j++) {
        running += exp((double)(logits[j] - logits[best]) / temperature);
        if (running > threshold) return j;
    }
    return best;
}

void qwen2_kv_cache_init(qwen2_model *model, qwen2_kv_cache *cache, int capacity) {
    const qwen2_config *c = &model->config;
    int L = c->num_hidden_layers;
    size_t count = (size_t)capacity * c->num_key_value_heads * c->head_dim;
    cache->capacity = capacity;
    cache->length = 0;
    cache->k = calloc((size_t)(L > 0 ? L : 1), sizeof *cache->k); /* pointer tables: metadata, not tensors */
    cache->v = calloc((size_t)(L > 0 ? L : 1), sizeof *cache->v);
    if (cache->k == NULL || cache->v == NULL) world_fatal(model->ctx, "out of memory for the KV cache tables");
    for (int l = 0; l < L; l++) { /* read only where written: no zeroing */
        cache->k[l] = output_buffer(model, count, "self_attn.k_cache", l, MEM_KV_CACHE);
        cache->v[l] = output_buffer(model, count, "self_attn.v_cache", l, MEM_KV_CACHE);
    }
}

void qwen2_kv_cache_free(qwen2_model *model, qwen2_kv_cache *cache) {
    for (int l = 0; l < model->config.num_hidden_layers; l++) {
        if (cache->k) release(model, &cache->k[l]);
        if (cache->v) release(model, &cache->v[l]);
    }
    free(cache->k);
    free(cache->v);
    memset(cache, 0, sizeof *cache);
}

/* Both generations: cached, each forward runs only the positions the cache lacks (the prompt, then one); uncached,
 * every forward reruns the whole sequence. Either way the next token comes from the last row's logits. */
static int generate(qwen2_model *model, const int *prompt, int prompt_length, int max_new, float temperature,
                    uint64_t seed, int *out, int cached) {
    int positions = model->config.max_position_embeddings, V = model->config.vocab_size;
    if (max_new < 0 || prompt_length < 1 || prompt_length > positions)
        return error_set(model->ctx->error, sizeof model->ctx->error,
                         "rank %d: generate: a prompt of %d tokens and %d new ones; the prompt must hold 1..%d tokens "
                         "(max_position_embeddings) and the new ones be >= 0", model->ctx->rank, prompt_length,
                         max_new, positions);
    /* prompt + new tokens stop at max_position_embeddings (computed without adding, so no int overflows) */
    int capacity = prompt_length + (max_new < positions - prompt_length ? max_new : positions - prompt_length);
    /* The tokens so far are the host's (the sampler reads them): offload_data_pool, the device's pool on the CPU. */
    device *d = &model->ctx->device;
    mem_tracker *host = offload_data_pool(model->ctx);
    int *sequence = mem_alloc(host, (size_t)capacity * sizeof(int), MEM_DATA, "generate.sequence");
    float *last_logits = d->kind == DEVICE_CPU ? NULL : mem_alloc(host, (size_t)V * sizeof(float), MEM_WORKSPACE,
                                                                  "generate.last_logits");
    memcpy(sequence, prompt, (size_t)prompt_length * sizeof(int));
    qwen2_kv_cache cache = {0};
    if (cached) qwen2_kv_cache_init(model, &cache, capacity);
    int length = prompt_length, produced = 0;
    while (length < capacity) {
        qwen2_activations acts;
        int first = cache.length; /* 0 without a cache */
        if (forward_all(model, &acts, sequence + first, NULL, 1, length - first, cached ? &cache : NULL, 0) != 0)
            world_fatal(model->ctx, "%s", model->ctx->error);
        const float *row = acts.logits + (size_t)(length - first - 1) * V;
        if (last_logits != NULL) { /* the last position's logits, to the host */
            d->copy(d, last_logits, row, (size_t)V * sizeof(float), DEVICE_D2H);
            row = last_logits;
        }
        int token = next_token(row, V, temperature, seed, (uint64_t)produced);
        qwen2_activations_end(model, &acts);
        out[produced++] = token;
        sequence[length++] = token;
        if (token == model->config.eos_token_id) break;
    }
    if (cached) qwen2_kv_cache_free(model, &cache);
    mem_free(host, sequence);
    mem_free(host, last_logits);
    return produced;
}

int qwen2_generate(qwen2_model *model, const int *prompt, int prompt_length, int max_new, float temperature,
                   uint64_t seed, int *out) {
    return generate(model, prompt, prompt_length, max_new, temperature, seed, out, 1);
}

int qwen2_generate_uncached(qwen2_model *model, const int *prompt, int prompt_length, int max_new, float temperature,
                            uint64_t seed, int *out) {
    return generate(model, prompt, prompt_length, max_new, temperature, seed, out, 0);
}

/* ---------------------------------------------------------------- the model as the runtime sees it */

/* A batch: the activations, and which layers keep only their input (activation checkpointing). */
typedef struct qwen2_batch {
    qwen2_activations acts;
    int *checkpointed_layers;
} qwen2_batch;

static void qwen2_piece_name(const void *self, int piece, char *name, size_t size) {
    const qwen2_model *model = self;
    int L = model->config.num_hidden_layers;
    if (piece == 0) snprintf(name, size, "embed_tokens");
    else if (piece == L + 1) snprintf(name, size, "norm_lm_head_loss");
    else snprintf(name, size, "layers.%d", piece - 1);
}

static int qwen2_piece_checkpointable(const void *self, int piece) {
    const qwen2_model *model = self;
    return piece >= 1 && piece <= model->config.num_hidden_layers;
}

static int qwen2_batch_begin(void *self, void **out, const int *tokens, const int *targets, int B, int T,
                             const int *checkpointed) {
    qwen2_model *model = self;
    int L = model->config.num_hidden_layers;
    qwen2_batch *batch = calloc(1, sizeof *batch);
    if (batch == NULL || (batch->checkpointed_layers = calloc((size_t)(L > 0 ? L : 1), sizeof(int))) == NULL)
        world_fatal(model->ctx, "out of memory");
    for (int l = 0; l < L && checkpointed; l++) batch->checkpointed_layers[l] = checkpointed[1 + l];
    if (qwen2_activations_begin(model, &batch->acts, tokens, targets, B, T) != 0) {
        free(batch->checkpointed_layers);
        free(batch);
        return -1;
    }
    batch->acts.checkpointed = batch->checkpointed_layers;
    *out = batch;
    return 0;
}

static void qwen2_batch_end(void *self, void *batch_pointer) {
    qwen2_batch *batch = batch_pointer;
    qwen2_activations_end(self, &batch->acts);
    free(batch->checkpointed_layers);
    free(batch);
}

static void qwen2_piece_forward(void *self, void *batch_pointer, int piece, int checkpoint) {
    qwen2_model *model = self;
    qwen2_activations *acts = &((qwen2_batch *)batch_pointer)->acts;
    int L = model->config.num_hidden_layers;
    if (piece == 0) qwen2_embed_forward(model, acts);
    else if (piece <= L) {
        qwen2_layer_forward(model, acts, piece - 1);
        /* checkpointing keeps only the layer's input (allocated as checkpoint_input by the piece before) */
        if (checkpoint) qwen2_layer_activations_free(model, &acts->layers[piece - 1]);
    } else qwen2_head_forward(model, acts);
}

static void qwen2_piece_recompute(void *self, void *batch_pointer, int piece) {
    qwen2_layer_recompute(self, &((qwen2_batch *)batch_pointer)->acts, piece - 1);
}

static void qwen2_piece_backward(void *self, void *batch_pointer, int piece) {
    qwen2_model *model = self;
    qwen2_activations *acts = &((qwen2_batch *)batch_pointer)->acts;
    int L = model->config.num_hidden_layers;
    if (piece == 0) qwen2_embed_backward(model, acts);
    else if (piece <= L) qwen2_layer_backward(model, acts, piece - 1);
    else qwen2_head_backward(model, acts);
}

static float qwen2_batch_loss(const void *self, const void *batch_pointer) {
    (void)self;
    return ((const qwen2_batch *)batch_pointer)->acts.loss;
}

static void qwen2_loss_to_slot(void *self, void *batch_pointer, int slot) {
    qwen2_model *model = self;
    if (slot < 0 || slot >= MODULE_LOSS_SLOTS)
        world_fatal(model->ctx, "loss slot %d outside the runtime's 0 .. %d", slot, MODULE_LOSS_SLOTS - 1);
    ((qwen2_batch *)batch_pointer)->acts.loss_slot = slot;
}

static void qwen2_losses_read(void *self, float *losses, int first, int count) {
    read_losses(self, losses, first, count);
}

/* Before a training micro-batch's forward: backward follows, with the accumulation factor; under LOSS_CHUNK the head's
 * forward (the last piece) writes the root's gradient. */
static int qwen2_begin_backward_in_forward(void *self, void *batch_pointer, float factor) {
    qwen2_model *model = self;
    qwen2_activations *acts = &((qwen2_batch *)batch_pointer)->acts;
    acts->backward_follows = 1;
    acts->loss_gradient_scale = factor;
    return chunked_loss(model, acts) ? model->config.num_hidden_layers + 1 : -1;
}

static void qwen2_scale_loss_gradient(void *self, void *batch_pointer, float factor) {
    qwen2_model *model = self;
    qwen2_activations *acts = &((qwen2_batch *)batch_pointer)->acts;
    if (chunked_loss(model, acts)) { /* no dlogits are kept: the backward applies the factor chunk by chunk */
        acts->loss_gradient_scale *= factor;
        return;
    }
    size_t logits = (size_t)acts->B * (size_t)acts->T * (size_t)model->config.vocab_size;
    device *d = &model->ctx->device;
    d->scale(d, acts->dlogits, factor, logits);
}

static const module_ops qwen2_module_ops = {
    .piece_name = qwen2_piece_name,
    .piece_checkpointable = qwen2_piece_checkpointable,
    .batch_begin = qwen2_batch_begin,
    .batch_end = qwen2_batch_end,
    .forward = qwen2_piece_forward,
    .recompute = qwen2_piece_recompute,
    .backward = qwen2_piece_backward,
    .loss = qwen2_batch_loss,
    .loss_to_slot = qwen2_loss_to_slot,
    .losses_read = qwen2_losses_read,
    .scale_loss_gradient = qwen2_scale_loss_gradient,
    .begin_backward_in_forward = qwen2_begin_backward_in_forward,
};

void qwen2_as_module(qwen2_model *model, module *out) {
    *out = (module){
        .name = "Qwen2ForCausalLM",
        .tree = &model->module_tree,
        .piece_count = model->config.num_hidden_layers + 2,
        .unit_count = model->unit_count,
        .units = model->units,
        .locations = model->locations,
        .ops = &qwen2_module_ops,
        .self = model,
    };
}
