/* qwen2_tool.c — the C side of the parity checks against HF transformers (tests/test_hf_parity.py), and a handy
 * way to look at a model from the shell. One rank (run it directly, no mpirun).
 *
 *   qwen2_tool params <preset>                        HF name and shape of every parameter, then "total N"
 *       (a preset is a name MODEL takes: tiny, qwen2-0.5b, or qwen2 for the same 0.5B config)
 *   qwen2_tool init <preset|config.json> <seed> <dir> [overrides]   fsdplab's init as an HF directory
 *       (config.json, model.safetensors); overrides as lab 05's CONFIG: hidden_size=512,num_hidden_layers=8
 *   qwen2_tool run <dir> <batch.json> <out.safetensors>
 *       batch.json = {"input_ids": [[...], ...], "targets": [[...], ...]} (targets already shifted, -100 ignored);
 *       writes logits [B,T,V], loss [1] and grad/<name> for every parameter after one forward + backward.
 *   qwen2_tool generate <dir> <seed> <temperature> <max_new> <token> [<token> ...]   prints the new token ids
 *   qwen2_tool compare <dir_a> <dir_b> <tolerance> [absolute|relative]   two checkpoints (or GRADS dumps) of one
 *       config: largest |a - b| over all parameters, or per tensor relative to max |b|; fails above tolerance or on
 *       a NaN/inf, refuses different configs
 *   qwen2_tool batches <seed> <global_batch> <seq> <micro_batches> <out.bin> [data]   (MODEL, CONFIG and TOKENIZER
 *       from the environment, as lab 05 reads them)
 *       the global micro-batches lab 05 trains on (data/loader.h, shuffled by seed), as int32: for each
 *       micro-batch, tokens then targets, each global_batch x seq; rank r of P takes rows r*MBS .. (r+1)*MBS-1.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/io/pretrained.h"
#include "core/runtime/context.h"
#include "core/data/data.h"
#include "core/fsdp/fsdp.h"
#include "core/models/qwen2.h"
#include "core/io/safetensors.h"
#include "core/runtime/world.h"
#include "core/runtime/session.h"

static int usage(void) {
    fprintf(stderr, "usage: qwen2_tool params <preset>\n"
                    "       qwen2_tool flops <preset|config.json> <B> <T>\n"
                    "       qwen2_tool init <preset|config.json> <seed> <out_dir> [field=value,...]\n"
                    "       qwen2_tool run <model_dir> <batch.json> <out.safetensors>   "
                    "(env MP=bf16: mixed precision)\n"
                    "       qwen2_tool generate <model_dir> <seed> <temperature> <max_new> <token>...\n"
                    "       qwen2_tool compare <model_dir_a> <model_dir_b> <tolerance> [absolute|relative]\n"
                    "       qwen2_tool batches <seed> <global_batch> <seq> <micro_batches> <out.bin> [data]\n");
    return 2;
}

/* A whole-number argument in [least, most], or exit naming the argument and its text (no atoi: 'x' is not 0). */
static long long integer_argument(context *ctx, const char *what, const char *text, long long least, long long most) {
    char *end = NULL;
    errno = 0;
    long long value = strtoll(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || value < least || value > most)
        world_exit_all(ctx, 2, "%s '%s' is not an integer in %lld..%lld", what, text, least, most);
    return value;
}

/* A preset name, or a path to a config.json. */
static void load_config(context *ctx, const char *what, qwen2_config *config) {
    int status = strstr(what, ".json") ? qwen2_config_load_json(config, what, ctx->error, sizeof ctx->error)
                                       : qwen2_config_preset(config, what, ctx->error, sizeof ctx->error);
    if (status != 0) world_exit_all(ctx, 2, "%s", ctx->error);
}

/* One unit per decoder layer, as lab 05 wraps it. */
static void make_model(context *ctx, qwen2_model *model, const qwen2_config *config, const qwen2_init_spec *init) {
    if (qwen2_model_init_wrapped(model, ctx, config, fsdp_wrap_by_type, (void *)QWEN2_DECODER_LAYER, FSDP_FULL_SHARD,
                                 init) != 0)
        world_fatal(ctx, "%s", ctx->error);
}

static void unshard_all(qwen2_model *model) {
    for (int unit = 0; unit < model->unit_count; unit++)
        if (flat_param_unshard(&model->units[unit], "tool") != 0) world_fatal(model->ctx, "%s", model->ctx->error);
}

static void load_model(context *ctx, qwen2_model *model, const char *directory) {
    char path[1200];
    snprintf(path, sizeof path, "%s/config.json", directory);
    qwen2_config config;
    load_config(ctx, path, &config);
    make_model(ctx, model, &config, NULL);
    if (pretrained_load(model, directory) != 0) world_exit_all(ctx, 1, "%s", ctx->error);
    /* MP (as lab 05's, e.g. bf16): the units gather and the layers compute as under torch's MixedPrecision */
    fsdp_options options = {0};
    fsdp_mixed_precision_from_env(ctx, &options);
    for (int unit = 0; unit < model->unit_count; unit++)
        if (flat_param_set_mixed_precision(&model->units[unit], &options.mixed_precision) != 0)
            world_exit_all(ctx, 2, "%s", ctx->error);
    unshard_all(model);
}

static int command_params(context *ctx, const char *preset) {
    qwen2_config config;
    load_config(ctx, preset, &config);
    qwen2_tree tree;
    if (qwen2_tree_build(&tree, &config) != 0) world_fatal(ctx, "out of memory");
    size_t total = 0;
    for (int p = 0; p < tree.param_count; p++) {
        const qwen2_param *param = &tree.params[p];
        if (param->ndim == 2)
            printf("%s %lldx%lld\n", param->name, (long long)param->shape[0], (long long)param->shape[1]);
        else printf("%s %lld\n", param->name, (long long)param->shape[0]);
        total += qwen2_param_numel(param);
    }
    printf("total %zu\n", total);
    qwen2_tree_free(&tree);
    return 0;
}

/* One training step's matrix-multiply FLOPs over B x T tokens (forward + backward = 3 x qwen2_forward_flops), and
 * 6 x params x tokens beside it: what gpu_check.sh and the benchmarks divide by the step time. */
static int command_flops(context *ctx, const char *what, const char *B_text, const char *T_text) {
    qwen2_config config;
    load_config(ctx, what, &config);
    int B = (int)integer_argument(ctx, "flops: B", B_text, 1, 1 << 20);
    int T = (int)integer_argument(ctx, "flops: T", T_text, 1, 1 << 24);
    qwen2_tree tree;
    if (qwen2_tree_build(&tree, &config) != 0) world_fatal(ctx, "out of memory");
    size_t params = 0;
    for (int p = 0; p < tree.param_count; p++) params += qwen2_param_numel(&tree.params[p]);
    qwen2_tree_free(&tree);
    printf("step_flops %.0f\nsix_n_tokens %.0f\nparams %zu\n", 3.0 * qwen2_forward_flops(&config, B, T, 0),
           6.0 * (double)params * B * T, params);
    return 0;
}

static int command_init(context *ctx, const char *what, const char *seed_text, const char *directory,
                        const char *overrides) {
    qwen2_config config;
    load_config(ctx, what, &config);
    if (overrides != NULL && overrides[0] && qwen2_config_apply(&config, overrides, ctx->error, sizeof ctx->error) != 0)
        world_exit_all(ctx, 2, "%s", ctx->error);
    uint64_t seed = (uint64_t)integer_argument(ctx, "init: seed", seed_text, 0, INT64_MAX);
    qwen2_init_spec init = {.seed = seed, .std = (float)config.initializer_range};
    qwen2_model model;
    make_model(ctx, &model, &config, &init);
    int status = pretrained_save(&model, directory);
    if (status != 0) fprintf(stderr, "qwen2_tool: %s\n", ctx->error);
    qwen2_model_free(&model);
    return status == 0 ? 0 : 1;
}

/* rows x columns of ints from a JSON array of arrays; all rows the same length. */
static int *read_matrix(const cJSON *json, const char *key, int *rows, int *columns) {
    const cJSON *matrix = cJSON_GetObjectItemCaseSensitive(json, key);
    if (!cJSON_IsArray(matrix) || cJSON_GetArraySize(matrix) < 1) return NULL;
    *rows = cJSON_GetArraySize(matrix);
    *columns = cJSON_GetArraySize(cJSON_GetArrayItem(matrix, 0));
    int *values = calloc((size_t)*rows * (size_t)*columns, sizeof *values);
    for (int r = 0; values && r < *rows; r++) {
        const cJSON *row = cJSON_GetArrayItem(matrix, r);
        if (!cJSON_IsArray(row) || cJSON_GetArraySize(row) != *columns) {
            free(values);
            return NULL;
        }
        for (int c = 0; c < *columns; c++) values[r * *columns + c] = (int)cJSON_GetArrayItem(row, c)->valuedouble;
    }
    return values;
}

/* The parsed file, or NULL with errno set when it cannot be read (0 when it is read but is not JSON). */
static cJSON *read_json(const char *path) {
    FILE *file = fopen(path, "rb");
    if (file == NULL) return NULL;
    errno = 0;
    fseek(file, 0, SEEK_END);
    long size = ftell(file);
    fseek(file, 0, SEEK_SET);
    char *text = malloc((size_t)size + 1);
    size_t read = text ? fread(text, 1, (size_t)size, file) : 0;
    fclose(file);
    if (text == NULL || read != (size_t)size) {
        free(text);
        return NULL;
    }
    text[size] = '\0';
    cJSON *json = cJSON_Parse(text);
    free(text);
    return json;
}

static int command_run(context *ctx, const char *directory, const char *batch_path, const char *out_path) {
    cJSON *batch = read_json(batch_path);
    int B = 0, T = 0, target_rows = 0, target_columns = 0;
    int *tokens = batch ? read_matrix(batch, "input_ids", &B, &T) : NULL;
    int *targets = batch ? read_matrix(batch, "targets", &target_rows, &target_columns) : NULL;
    cJSON_Delete(batch);
    if (tokens == NULL || targets == NULL || target_rows != B || target_columns != T)
        world_exit_all(ctx, 2, "%s: needs input_ids and targets, equal-length rows of the same shape", batch_path);
    qwen2_model model;
    load_model(ctx, &model, directory);
    int V = model.config.vocab_size, L = model.config.num_hidden_layers;

    qwen2_activations acts;
    if (qwen2_activations_begin(&model, &acts, tokens, targets, B, T) != 0) world_exit_all(ctx, 1, "%s", ctx->error);
    acts.backward_follows = 1; /* the head's forward keeps dlogits */
    qwen2_embed_forward(&model, &acts);
    for (int l = 0; l < L; l++) qwen2_layer_forward(&model, &acts, l);
    float loss = qwen2_head_forward(&model, &acts);
    float *logits = mem_alloc(&ctx->mem, (size_t)B * T * V * sizeof(float), MEM_WORKSPACE, "tool.logits");
    memcpy(logits, acts.logits, (size_t)B * T * V * sizeof(float));
    for (int unit = 0; unit < model.unit_count; unit++) flat_param_alloc_full_grad(&model.units[unit]);
    qwen2_head_backward(&model, &acts);
    for (int l = L - 1; l >= 0; l--) qwen2_layer_backward(&model, &acts, l);
    qwen2_embed_backward(&model, &acts);
    int target_count = acts.target_count;
    qwen2_activations_end(&model, &acts);

    int count = model.tree.param_count + 2;
    st_tensor_ref *refs = calloc((size_t)count, sizeof *refs);
    char (*names)[QWEN2_NAME_MAX + 8] = calloc((size_t)count, sizeof *names);
    refs[0] = (st_tensor_ref){"logits", 3, {B, T, V}, logits};
    refs[1] = (st_tensor_ref){"loss", 1, {1}, &loss};
    for (int p = 0; p < model.tree.param_count; p++) {
        const qwen2_param *param = &model.tree.params[p];
        snprintf(names[p], sizeof names[p], "grad/%s", param->name);
        refs[p + 2] =
            (st_tensor_ref){names[p], param->ndim, {param->shape[0], param->shape[1]}, qwen2_param_grad(&model, p)};
    }
    int status = st_write(out_path, refs, count, NULL, ctx->error, sizeof ctx->error);
    if (status != 0) fprintf(stderr, "qwen2_tool: %s\n", ctx->error);
    else printf("loss %.7f over %d targets; wrote %s\n", loss, target_count, out_path);
    free(refs);
    free(names);
    free(tokens);
    free(targets);
    mem_free(&ctx->mem, logits);
    qwen2_model_free(&model);
    return status == 0 ? 0 : 1;
}

static int command_generate(context *ctx, int argc, char **argv) {
    qwen2_model model;
    load_model(ctx, &model, argv[2]);
    uint64_t seed = (uint64_t)integer_argument(ctx, "generate: seed", argv[3], 0, INT64_MAX);
    char *end = NULL;
    float temperature = strtof(argv[4], &end);
    if (end == argv[4] || *end != '\0' || !isfinite(temperature) || temperature < 0.0f)
        world_exit_all(ctx, 2, "generate: temperature '%s' is not a finite number >= 0", argv[4]);
    int max_new = (int)integer_argument(ctx, "generate: max_new", argv[5], 0, 1 << 20), prompt_length = argc - 6;
    int *prompt = calloc((size_t)prompt_length, sizeof *prompt),
        *out = calloc((size_t)(max_new > 0 ? max_new : 1), sizeof *out);
    for (int i = 0; i < prompt_length; i++)
        prompt[i] = (int)integer_argument(ctx, "generate: token", argv[6 + i], 0, model.config.vocab_size - 1);
    int produced = qwen2_generate(&model, prompt, prompt_length, max_new, temperature, seed, out);
    if (produced < 0) {
        fprintf(stderr, "qwen2_tool generate: %s\n", ctx->error);
        free(prompt);
        free(out);
        qwen2_model_free(&model);
        return 2;
    }
    for (int i = 0; i < produced; i++) printf("%d%c", out[i], i + 1 < produced ? ' ' : '\n');
    free(prompt);
    free(out);
    qwen2_model_free(&model);
    return 0;
}

/* The first key whose value differs between two config.json files (either side may lack it), or NULL when they are
 * equal: a comparison of two checkpoints means something only for one config, and tensors of different shapes
 * would be read past their ends. */
static const char *config_difference(const cJSON *a, const cJSON *b, char *detail, size_t size) {
    const cJSON *sides[2] = {a, b};
    for (int side = 0; side < 2; side++) {
        const cJSON *item;
        cJSON_ArrayForEach(item, sides[side]) {
            const cJSON *other = cJSON_GetObjectItemCaseSensitive(sides[1 - side], item->string);
            if (other != NULL && cJSON_Compare(item, other, 1)) continue;
            const cJSON *in_a = side == 0 ? item : other, *in_b = side == 0 ? other : item;
            char *text_a = in_a ? cJSON_PrintUnformatted(in_a) : NULL;
            char *text_b = in_b ? cJSON_PrintUnformatted(in_b) : NULL;
            snprintf(detail, size, "%s (%s vs %s)", item->string, text_a ? text_a : "absent",
                     text_b ? text_b : "absent");
            free(text_a);
            free(text_b);
            return item->string;
        }
    }
    return NULL;
}

static cJSON *read_config_json(context *ctx, const char *directory) {
    char path[1200];
    snprintf(path, sizeof path, "%s/config.json", directory);
    cJSON *json = read_json(path);
    if (json == NULL && errno != 0) world_exit_all(ctx, 2, "compare: cannot read %s: %s", path, strerror(errno));
    if (!cJSON_IsObject(json)) world_exit_all(ctx, 2, "compare: %s is not a JSON object", path);
    return json;
}

/* Two checkpoints (or gradient dumps, lab 05's GRADS) of the same config, tensor by tensor.
 *   absolute: max |a - b| over every element of every tensor must be <= tolerance.
 *   relative: per tensor, max |a - b| / max |b| must be <= tolerance (for gradients: tests/tolerances.py derives it).
 * A NaN or infinity on either side fails, naming the tensor. Prints the worst tensors, then OK or FAIL. */
static int command_compare(context *ctx, const char *first, const char *second, const char *tolerance_text,
                           const char *mode) {
    char *end = NULL;
    double tolerance = strtod(tolerance_text, &end);
    if (end == tolerance_text || *end != '\0' || !isfinite(tolerance) || tolerance < 0.0)
        world_exit_all(ctx, 2, "compare: tolerance '%s' is not a finite number >= 0", tolerance_text);
    int relative = strcmp(mode, "relative") == 0;
    if (!relative && strcmp(mode, "absolute") != 0)
        world_exit_all(ctx, 2, "compare: mode '%s' is neither absolute nor relative", mode);
    cJSON *config_a = read_config_json(ctx, first), *config_b = read_config_json(ctx, second);
    char detail[512];
    if (config_difference(config_a, config_b, detail, sizeof detail) != NULL)
        world_exit_all(ctx, 2, "compare: %s and %s have different configs: %s", first, second, detail);
    cJSON_Delete(config_a);
    cJSON_Delete(config_b);

    qwen2_model a, b;
    load_model(ctx, &a, first);
    load_model(ctx, &b, second);
    int count = a.tree.param_count, status = 0;
    double *error = calloc((size_t)count, sizeof *error), *scale = calloc((size_t)count, sizeof *scale);
    if (error == NULL || scale == NULL) world_fatal(ctx, "out of memory");
    for (int p = 0; p < count && status == 0; p++) {
        const float *x = qwen2_param_data(&a, p), *y = qwen2_param_data(&b, p);
        for (size_t i = 0; i < qwen2_param_numel(&a.tree.params[p]); i++) {
            if (!isfinite(x[i]) || !isfinite(y[i])) {
                printf("FAIL: %s[%zu] is %g in %s and %g in %s\n", a.tree.params[p].name, i, x[i], first, y[i], second);
                status = 1;
                break;
            }
            error[p] = fmax(error[p], fabs((double)x[i] - (double)y[i]));
            scale[p] = fmax(scale[p], fabs((double)y[i]));
        }
    }
    if (status == 0) {
        double *measure = calloc((size_t)count, sizeof *measure);
        int *order = calloc((size_t)count, sizeof *order);
        if (measure == NULL || order == NULL) world_fatal(ctx, "out of memory");
        for (int p = 0; p < count; p++) {
            double s = relative ? scale[p] : 1.0;
            measure[p] = s > 0.0 ? error[p] / s : (error[p] > 0.0 ? INFINITY : 0.0);
            int at = p; /* insertion sort, worst first: a few hundred tensors */
            for (; at > 0 && measure[order[at - 1]] < measure[p]; at--) order[at] = order[at - 1];
            order[at] = p;
        }
        for (int shown = 0; shown < 5 && shown < count; shown++) {
            int p = order[shown];
            printf("  %-48s max |a - b| %.3e, max |b| %.3e", a.tree.params[p].name, error[p], scale[p]);
            if (relative) printf(", relative %.3e", measure[p]);
            printf("\n");
        }
        double value = measure[order[0]];
        status = value <= tolerance ? 0 : 1;
        printf("%s: worst %s %.3e (%s), tolerance %.3e\n", status == 0 ? "OK" : "FAIL",
               relative ? "max |a - b| / max |b| of a tensor" : "max |a - b|", value, a.tree.params[order[0]].name,
               tolerance);
        free(measure);
        free(order);
    }
    free(error);
    free(scale);
    qwen2_model_free(&a);
    qwen2_model_free(&b);
    return status;
}

/* The same loader lab 05 uses, at world size 1 with the global batch: the loader's batches do not depend on the
 * world size, so these are exactly the windows every rank of a P-rank run reads, side by side. */
static int command_batches(context *ctx, int argc, char **argv) {
    uint64_t seed = (uint64_t)integer_argument(ctx, "batches: seed", argv[2], 0, INT64_MAX);
    int global_batch = (int)integer_argument(ctx, "batches: global_batch", argv[3], 1, 1 << 20);
    int seq_len = (int)integer_argument(ctx, "batches: seq", argv[4], 2, 1 << 20);
    int micro_batches = (int)integer_argument(ctx, "batches: micro_batches", argv[5], 1, 1 << 20);
    const char *out_path = argv[6], *data = argc > 7 ? argv[7] : NULL;
    qwen2_config config; /* MODEL and CONFIG as lab 05 reads them: the vocabulary, and so the tokenizer */
    qwen2_config_from_env(ctx, &config, seq_len);
    char note[1024];
    tok_tokenizer *tokenizer = data_tokenizer_from_env(ctx, config.vocab_size, note, sizeof note);
    data_loader loader;
    if (data_loader_open_tokenized(&loader, ctx, data, tokenizer, config.vocab_size, global_batch, seq_len, seed, 1)
        != 0)
        world_exit_all(ctx, 1, "%s", ctx->error);
    size_t count = (size_t)global_batch * seq_len;
    int *tokens = mem_alloc(&ctx->mem, count * sizeof(int), MEM_DATA, "tool.tokens");
    int *targets = mem_alloc(&ctx->mem, count * sizeof(int), MEM_DATA, "tool.targets");
    FILE *file = fopen(out_path, "wb");
    int ok = file != NULL;
    for (int micro = 0; ok && micro < micro_batches; micro++) {
        data_next_batch(&loader, tokens, targets);
        ok = fwrite(tokens, sizeof(int), count, file) == count && fwrite(targets, sizeof(int), count, file) == count;
    }
    if (file != NULL && fclose(file) != 0) ok = 0;
    if (!ok) fprintf(stderr, "qwen2_tool: writing %s failed\n", out_path);
    mem_free(&ctx->mem, tokens);
    mem_free(&ctx->mem, targets);
    data_loader_close(&loader);
    if (tokenizer != NULL) tok_free(tokenizer);
    free(tokenizer);
    return ok ? 0 : 1;
}

int main(int argc, char **argv) {
    context ctx;
    session_open(&ctx, &argc, &argv, "qwen2_tool", "runs/qwen2_tool");
    world_require_size(&ctx, 1, 1);
    int status;
    if (argc == 3 && strcmp(argv[1], "params") == 0) status = command_params(&ctx, argv[2]);
    else if (argc == 5 && strcmp(argv[1], "flops") == 0) status = command_flops(&ctx, argv[2], argv[3], argv[4]);
    else if ((argc == 5 || argc == 6) && strcmp(argv[1], "init") == 0)
        status = command_init(&ctx, argv[2], argv[3], argv[4], argc == 6 ? argv[5] : NULL);
    else if (argc == 5 && strcmp(argv[1], "run") == 0) status = command_run(&ctx, argv[2], argv[3], argv[4]);
    else if (argc >= 7 && strcmp(argv[1], "generate") == 0) status = command_generate(&ctx, argc, argv);
    else if ((argc == 7 || argc == 8) && strcmp(argv[1], "batches") == 0) status = command_batches(&ctx, argc, argv);
    else if ((argc == 5 || argc == 6) && strcmp(argv[1], "compare") == 0)
        status = command_compare(&ctx, argv[2], argv[3], argv[4], argc == 6 ? argv[5] : "absolute");
    else status = usage();
    trace_close(&ctx.trace);
    size_t leaks = mem_shutdown(&ctx.mem);
    MPI_Finalize();
    return status != 0 ? status : (leaks ? 1 : 0);
}
