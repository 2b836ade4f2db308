/* pretrained.c — HF directories in and out (save_pretrained / from_pretrained). See pretrained.h. */
#include "core/io/pretrained.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/io/dcp.h"
#include "core/runtime/offload.h"
#include "core/io/safetensors.h"
#include "core/runtime/world.h"
#include "core/base/error.h"
#include "core/base/file.h"

static void path_in(char *out, size_t size, const char *directory, const char *file) {
    snprintf(out, size, "%s/%s", directory, file);
}

/* Rank 0 writes config.json and model.safetensors, each tensor from `tensor` (the unsharded parameters, or the
 * gathered gradients). */
static int write_files(qwen2_model *model, const char *directory, float *(*tensor)(const qwen2_model *, int)) {
    context *ctx = model->ctx;
    if (file_make_directories(directory) != 0) {
        snprintf(ctx->error, sizeof ctx->error, "rank %d: cannot create checkpoint directory %s", ctx->rank, directory);
        return -1;
    }
    /* Each file is written to <name>.tmp, flushed and renamed (file_commit): a full disk or a kill leaves no
     * truncated model.safetensors that looks whole. The weights first, so a config.json means they are complete. */
    char path[1200], tmp[1300];
    const qwen2_tree *tree = &model->tree;
    st_tensor_ref *refs = calloc((size_t)tree->param_count, sizeof *refs);
    if (refs == NULL) world_fatal(ctx, "out of memory listing %d tensors", tree->param_count);
    /* On a GPU the tensors are device memory: the file is written from a host copy of them (one staging buffer). */
    device *d = &ctx->device;
    size_t total = 0;
    for (int p = 0; p < tree->param_count; p++) total += qwen2_param_numel(&tree->params[p]);
    float *staging = d->kind == DEVICE_CPU ? NULL
                                           : mem_alloc_uninitialized(offload_host_pool(ctx), total * sizeof(float),
                                                                     MEM_WORKSPACE, "checkpoint.staging");
    size_t at = 0;
    for (int p = 0; p < tree->param_count; p++) {
        const qwen2_param *param = &tree->params[p];
        const float *data = tensor(model, p);
        if (staging != NULL) {
            size_t numel = qwen2_param_numel(param);
            d->copy(d, staging + at, data, numel * sizeof(float), DEVICE_D2H);
            data = staging + at;
            at += numel;
        }
        refs[p] = (st_tensor_ref){param->name, param->ndim, {param->shape[0], param->shape[1]}, data};
    }
    path_in(path, sizeof path, directory, "model.safetensors");
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int status = st_write(tmp, refs, tree->param_count, "pt", ctx->error, sizeof ctx->error);
    free(refs);
    if (staging != NULL) mem_free(offload_host_pool(ctx), staging);
    if (status == 0) status = file_commit(tmp, path, ctx->error, sizeof ctx->error);
    if (status == 0) {
        path_in(path, sizeof path, directory, "config.json");
        snprintf(tmp, sizeof tmp, "%s.tmp", path);
        status = qwen2_config_save_json(&model->config, tmp, ctx->error, sizeof ctx->error);
        if (status == 0) status = file_commit(tmp, path, ctx->error, sizeof ctx->error);
    }
    if (status != 0) unlink(tmp);
    return status;
}

int pretrained_save(qwen2_model *model, const char *directory) {
    context *ctx = model->ctx;
    int *was_sharded = calloc((size_t)model->unit_count, sizeof *was_sharded);
    if (was_sharded == NULL) world_fatal(ctx, "out of memory");
    int status = 0;
    for (int unit = 0; unit < model->unit_count && status == 0; unit++) {
        was_sharded[unit] = model->units[unit].shard_state == FLAT_PARAM_SHARDED;
        model->units[unit].force_full_precision = 1; /* the float32 master, not its bfloat16 cast (mixed precision) */
        status = flat_param_unshard(&model->units[unit], "state_dict");
        model->units[unit].force_full_precision = 0;
    }
    if (status == 0 && ctx->rank == 0) status = write_files(model, directory, qwen2_param_data);
    for (int unit = 0; unit < model->unit_count; unit++)
        if (was_sharded[unit]) flat_param_reshard(&model->units[unit], "state_dict");
    free(was_sharded);
    return world_all_true(ctx, status == 0) ? 0 : -1;
}

int pretrained_save_gradients(qwen2_model *model, const char *directory) {
    context *ctx = model->ctx;
    int status = 0;
    for (int unit = 0; unit < model->unit_count && status == 0; unit++)
        status = flat_param_gather_grad(&model->units[unit]);
    if (status == 0 && ctx->rank == 0) status = write_files(model, directory, qwen2_param_grad);
    for (int unit = 0; unit < model->unit_count; unit++)
        if (model->units[unit].full_grad_padded != NULL) flat_param_free_full_grad(&model->units[unit]);
    return world_all_true(ctx, status == 0) ? 0 : -1;
}

/* An flat_param_fill_fn reading a parameter's range from the open file; the first failure is kept for the caller. */
typedef struct file_source {
    const st_file *st;
    int failed;
    char error[1024];
} file_source;

static void fill_from_file(const char *name, size_t first, size_t count, float *out, void *user) {
    file_source *source = user;
    if (source->failed) return;
    if (st_read(source->st, name, first, count, out, source->error, sizeof source->error) != 0) source->failed = 1;
}

/* Whether the file's entry has the parameter's shape; if not, an error naming the tensor, both shapes and, for the
 * tied lm_head, the tensor whose shape it must have. */
static int check_shape(const st_file *st, const st_entry *entry, const qwen2_param *param, const char *tied_to,
                       char *error, size_t error_size) {
    int same = entry->ndim == param->ndim && entry->shape[0] == param->shape[0] &&
               (param->ndim == 1 || entry->shape[1] == param->shape[1]);
    if (same) return 0;
    snprintf(error, error_size, "%s: tensor '%s' has shape [%lld%s%lld] (%d dims), the model needs [%lld, %lld]%s%s%s",
             st->path, entry->name, (long long)entry->shape[0], entry->ndim > 1 ? ", " : " ",
             entry->ndim > 1 ? (long long)entry->shape[1] : 0LL, entry->ndim, (long long)param->shape[0],
             param->ndim > 1 ? (long long)param->shape[1] : 1LL, tied_to ? " (tied: the shape of " : "",
             tied_to ? tied_to : "", tied_to ? ")" : "");
    return -1;
}

/* Every tensor of the file is one of ours (or the tied lm_head, with the embedding's shape) with our shape, and every
 * one of ours is there. */
static int check_names_and_shapes(const qwen2_model *model, const st_file *st, char *error, size_t error_size) {
    const qwen2_tree *tree = &model->tree;
    for (int p = 0; p < tree->param_count; p++) {
        const qwen2_param *param = &tree->params[p];
        const st_entry *entry = st_find(st, param->name);
        if (entry == NULL) {
            snprintf(error, error_size, "%s: missing tensor '%s'", st->path, param->name);
            return -1;
        }
        if (check_shape(st, entry, param, NULL, error, error_size) != 0) return -1;
    }
    for (int i = 0; i < st->count; i++) {
        const char *name = st->entries[i].name;
        if (strcmp(name, "lm_head.weight") == 0) { /* tied: the embedding is the lm_head, read from there */
            int embedding = qwen2_find_param(model, "model.embed_tokens.weight");
            if (check_shape(st, &st->entries[i], &tree->params[embedding], tree->params[embedding].name, error,
                            error_size) != 0)
                return -1;
        } else if (qwen2_find_param(model, name) < 0) {
            snprintf(error, error_size, "%s: unexpected tensor '%s' (not a parameter of this Qwen2 config)", st->path,
                     name);
            return -1;
        }
    }
    return 0;
}

int pretrained_load(qwen2_model *model, const char *directory) {
    context *ctx = model->ctx;
    char path[1200];
    path_in(path, sizeof path, directory, "model.safetensors");
    file_source source = {0};
    st_file st;
    int status = st_open(&st, path, source.error, sizeof source.error);
    if (status == 0) {
        source.st = &st;
        status = check_names_and_shapes(model, &st, source.error, sizeof source.error);
        for (int unit = 0; unit < model->unit_count && status == 0; unit++) {
            flat_param_fill_local_shard(&model->units[unit], fill_from_file, &source);
            status = source.failed ? -1 : 0;
        }
        st_close(&st);
    }
    if (status != 0) snprintf(ctx->error, sizeof ctx->error, "rank %d: %s", ctx->rank, source.error);
    return world_all_true(ctx, status == 0) ? 0 : -1;
}

/* Rank 0's probe of `directory`: made if missing (mkdir -p), a file created, written and removed in it, then every
 * directory the probe made removed again, so a run that stops early leaves nothing behind. */
static int probe_writable(const char *directory, char *error, size_t error_size) {
    char partial[1024];
    size_t length = strlen(directory);
    if (length == 0 || length >= sizeof partial - 64)
        return error_set(error, error_size, "the path is empty or longer than %zu characters", sizeof partial - 64);
    memcpy(partial, directory, length + 1);
    size_t first_missing = length + 1; /* where the first directory that does not exist yet ends */
    for (size_t i = 1; i <= length && first_missing > length; i++) {
        if (partial[i] != '/' && partial[i] != '\0') continue;
        char saved = partial[i];
        partial[i] = '\0';
        struct stat info;
        if (stat(partial, &info) != 0) first_missing = i;
        partial[i] = saved;
    }
    if (file_make_directories(directory) != 0)
        return error_set(error, error_size, "cannot create directory: %s", strerror(errno));
    char probe[1100];
    snprintf(probe, sizeof probe, "%s/.fsdplab-write-probe-%ld", directory, (long)getpid());
    FILE *file = fopen(probe, "wb");
    int written = file != NULL && fputc('x', file) != EOF;
    int saved_errno = errno;
    if (file != NULL && fclose(file) != 0 && written) written = 0, saved_errno = errno;
    if (file != NULL) unlink(probe);
    for (size_t i = length; i >= first_missing && i > 0; i--) { /* the directories made above, deepest first */
        if (partial[i] != '/' && partial[i] != '\0') continue;
        partial[i] = '\0';
        rmdir(partial);
    }
    return written ? 0 : error_set(error, error_size, "cannot write in the directory: %s", strerror(saved_errno));
}

int pretrained_check_writable(context *ctx, const char *directory) {
    char error[sizeof ctx->error] = "";
    int ok = ctx->rank != 0 || probe_writable(directory, error, sizeof error) == 0;
    WORLD_MPI(ctx, MPI_Bcast(&ok, 1, MPI_INT, 0, ctx->comm));
    if (ok) return 0;
    WORLD_MPI(ctx, MPI_Bcast(error, (int)sizeof error, MPI_CHAR, 0, ctx->comm));
    snprintf(ctx->error, sizeof ctx->error, "%s", error);
    return -1;
}
