/* dcp.c — sharded checkpoints and exact resume. See dcp.h. */
#define _POSIX_C_SOURCE 200809L
#include "core/io/dcp.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/base/file.h"
#include "core/base/hash.h"
#include "core/io/safetensors.h"
#include "core/runtime/world.h"
#include "core/base/error.h"

void dcp_progress_set(dcp_progress *progress, const char *name, const char *format, ...) {
    int index = 0;
    while (index < progress->setting_count && strcmp(progress->settings[index].name, name) != 0) index++;
    if (index == DCP_MAX_SETTINGS) {
        fprintf(stderr, "dcp_progress_set: more than %d settings (adding '%s')\n", DCP_MAX_SETTINGS, name);
        abort();
    }
    if (index == progress->setting_count) progress->setting_count++;
    dcp_setting *setting = &progress->settings[index];
    snprintf(setting->name, sizeof setting->name, "%s", name);
    va_list args;
    va_start(args, format);
    vsnprintf(setting->value, sizeof setting->value, format, args);
    va_end(args);
}

const char *dcp_progress_get(const dcp_progress *progress, const char *name) {
    for (int i = 0; i < progress->setting_count; i++)
        if (strcmp(progress->settings[i].name, name) == 0) return progress->settings[i].value;
    return NULL;
}

/* ---- Files: written whole or not at all ---- */

/* Size and checksum of a file, read back from the disk. */
static int checksum_file(const char *path, uint64_t *bytes, uint64_t *checksum, char *error, size_t error_size) {
    FILE *file = fopen(path, "rb");
    if (file == NULL) return error_set(error, error_size, "cannot open %s: %s", path, strerror(errno));
    enum { CHUNK = 1 << 20 };
    unsigned char *buffer = malloc(CHUNK);
    if (buffer == NULL) {
        fclose(file);
        return error_set(error, error_size, "out of memory checking %s", path);
    }
    uint64_t total = 0, state = HASH_START;
    size_t got;
    while ((got = fread(buffer, 1, CHUNK, file)) > 0) {
        state = hash_words(state, buffer, got); /* CHUNK is a multiple of 8: the words are the file's words */
        total += got;
    }
    int failed = ferror(file);
    free(buffer);
    fclose(file);
    if (failed) return error_set(error, error_size, "reading %s failed", path);
    *bytes = total, *checksum = state;
    return 0;
}

static void step_directory(char *out, size_t size, const char *root, int64_t step) {
    snprintf(out, size, "%s/step_%08" PRId64, root, step);
}

/* Step number of a "step_N" directory name, or -1. */
static int64_t step_of_name(const char *name) {
    if (strncmp(name, "step_", 5) != 0 || name[5] == '\0') return -1;
    int64_t step = 0;
    for (const char *c = name + 5; *c; c++) {
        if (*c < '0' || *c > '9' || step > INT64_MAX / 10 - 10) return -1;
        step = step * 10 + (*c - '0');
    }
    return step;
}

static int is_committed(const char *directory) {
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", directory, DCP_METADATA);
    struct stat info;
    return stat(path, &info) == 0 && S_ISREG(info.st_mode);
}

/* Removes a checkpoint directory: its files (a checkpoint holds no subdirectories), then itself. */
static void remove_checkpoint(const char *directory) {
    DIR *dir = opendir(directory);
    if (dir == NULL) return;
    struct dirent *entry;
    char path[1200];
    while ((entry = readdir(dir)) != NULL) {
        if (strcmp(entry->d_name, ".") == 0 || strcmp(entry->d_name, "..") == 0) continue;
        snprintf(path, sizeof path, "%s/%s", directory, entry->d_name);
        unlink(path);
    }
    closedir(dir);
    rmdir(directory);
}

static int compare_steps(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The step_N directories of root, sorted by step; *count of them. NULL (count 0) when there are none. */
static int64_t *list_steps(const char *root, int *count) {
    *count = 0;
    DIR *dir = opendir(root);
    if (dir == NULL) return NULL;
    int64_t *steps = NULL;
    int capacity = 0;
    struct dirent *entry;
    while ((entry = readdir(dir)) != NULL) {
        int64_t step = step_of_name(entry->d_name);
        if (step < 0) continue;
        if (*count == capacity) {
            capacity = capacity ? 2 * capacity : 16;
            int64_t *grown = realloc(steps, (size_t)capacity * sizeof *grown);
            if (grown == NULL) break;
            steps = grown;
        }
        steps[(*count)++] = step;
    }
    closedir(dir);
    if (*count > 1) qsort(steps, (size_t)*count, sizeof *steps, compare_steps);
    return steps;
}

int dcp_find_latest(const char *root, char *out, size_t out_size) {
    int count;
    int64_t *steps = list_steps(root, &count);
    int found = 1;
    char directory[1200];
    for (int i = count - 1; i >= 0 && found == 1; i--) {
        step_directory(directory, sizeof directory, root, steps[i]);
        if (is_committed(directory)) found = snprintf(out, out_size, "%s", directory) < (int)out_size ? 0 : -1;
    }
    free(steps);
    return found;
}

/* After committing step `newest`: keep the newest `keep` committed checkpoints, drop older uncommitted ones. */
static void prune(const char *root, int64_t newest, int keep) {
    int count;
    int64_t *steps = list_steps(root, &count);
    int committed_seen = 0;
    char directory[1200];
    for (int i = count - 1; i >= 0; i--) {
        step_directory(directory, sizeof directory, root, steps[i]);
        if (steps[i] > newest) { /* the future of a run resumed from an earlier step: RESUME=auto must not take it */
            remove_checkpoint(directory);
        } else if (keep <= 0) {
            continue;
        } else if (!is_committed(directory)) {
            if (steps[i] < newest) remove_checkpoint(directory);
        } else if (++committed_seen > keep) {
            remove_checkpoint(directory);
        }
    }
    free(steps);
}

/* ---- The layout of a unit, as a hash: names, shapes and offsets of its parameters ---- */

static uint64_t layout_hash(const flat_param *fp) {
    uint64_t hash = HASH_START;
    for (int p = 0; p < fp->param_count; p++) {
        const flat_param_param_info *param = &fp->params[p];
        hash = hash_bytes(hash, param->name, strlen(param->name));
        uint64_t numbers[2 + FLAT_PARAM_MAX_DIMS] = {(uint64_t)param->offset, (uint64_t)param->ndim};
        for (int d = 0; d < param->ndim && d < FLAT_PARAM_MAX_DIMS; d++) numbers[2 + d] = (uint64_t)param->shape[d];
        hash = hash_words(hash, numbers, sizeof numbers);
    }
    return hash;
}

/* One element range of a unit that a rank holds: [begin, end) in the unpadded layout (parameters back to back in
 * registration order, FSDP1's and FSDP2's alike), and where it starts in the rank's local shard. */
typedef struct held_piece {
    size_t begin, end, shard_offset;
} held_piece;

/* The unpadded element ranges of a unit `rank` holds, into pieces (room for fp->param_count); returns how many. FSDP1
 * (flat chunks): one, its chunk without the padding (possibly empty); replicated units (NO_SHARD) are held whole by
 * every rank, and saved by rank 0 alone. HYBRID_SHARD: every replicate group holds the same chunks, so the first
 * shard group (world ranks 0 .. S-1) saves them, and every rank loads its chunk from there. FSDP2 (rows): one range
 * per parameter it holds rows of, none for the others: no padding row is ever saved. */
static int held_pieces(const flat_param *fp, int rank, int saving, held_piece *pieces) {
    if (fp->layout == FLAT_PARAM_ROWS) {
        int count = 0;
        for (int p = 0; p < fp->param_count; p++) {
            size_t first, last;
            if (!flat_param_param_shard_overlap(fp, p, rank, &first, &last)) continue;
            pieces[count++] = (held_piece){fp->params[p].offset + first, fp->params[p].offset + last,
                                           flat_param_param_shard_offset(fp, p, rank)};
        }
        return count;
    }
    size_t begin, end;
    flat_param_shard_range(fp, rank, &begin, &end);
    size_t shard_begin = begin;
    if (fp->replicated && saving && rank != 0) end = begin;
    if (fp->shard_group != NULL && saving && rank >= fp->shard_group->size) end = begin;
    if (end > fp->unpadded_numel) end = fp->unpadded_numel;
    if (begin > end) begin = end;
    pieces[0] = (held_piece){begin, end, begin - shard_begin};
    return 1;
}

static held_piece *pieces_for(context *ctx, const flat_param *fp) {
    held_piece *pieces = calloc((size_t)fp->param_count, sizeof *pieces);
    if (pieces == NULL) world_fatal(ctx, "out of memory listing unit '%s''s ranges", fp->unit);
    return pieces;
}

/* The name of a unit's k-th range's tensor `suffix` in a file: "<unit>.param", then "<unit>.param.1", ... */
static void piece_name(char *out, size_t size, const char *unit, const char *suffix, int k) {
    if (k == 0) snprintf(out, size, "%s.%s", unit, suffix);
    else snprintf(out, size, "%s.%s.%d", unit, suffix, k);
}

/* ---- Saving ---- */

static const char *const MOMENT_SUFFIX[2] = {"exp_avg", "exp_avg_sq"};

/* This rank's file: for every unit with elements here, "<unit>.param" and, once AdamW has stepped, the moments. */
static int write_shard_file(context *ctx, const char *path, const flat_param *units, const adamw_state *states,
                            int unit_count, int *wrote) {
    int capacity = 0;
    for (int u = 0; u < unit_count; u++) capacity += 3 * units[u].param_count;
    st_tensor_ref *refs = calloc((size_t)capacity, sizeof *refs);
    char (*names)[ST_NAME_MAX] = calloc((size_t)capacity, sizeof *names);
    if (refs == NULL || names == NULL) world_fatal(ctx, "out of memory listing %d units for a checkpoint", unit_count);
    int count = 0;
    for (int u = 0; u < unit_count; u++) {
        held_piece *pieces = pieces_for(ctx, &units[u]);
        int piece_count = held_pieces(&units[u], ctx->rank, 1, pieces);
        for (int k = 0; k < piece_count; k++) {
            size_t length = pieces[k].end - pieces[k].begin, offset = pieces[k].shard_offset;
            if (length == 0) continue;
            const float *sources[3] = {units[u].local_shard, states[u].exp_avg, states[u].exp_avg_sq};
            const char *suffixes[3] = {"param", MOMENT_SUFFIX[0], MOMENT_SUFFIX[1]};
            for (int t = 0; t < (states[u].exp_avg != NULL ? 3 : 1); t++) {
                piece_name(names[count], ST_NAME_MAX, units[u].unit, suffixes[t], k);
                refs[count] = (st_tensor_ref){names[count], 1, {(int64_t)length}, sources[t] + offset};
                count++;
            }
        }
        free(pieces);
    }
    int status = 0;
    *wrote = count > 0;
    if (count > 0) status = st_write(path, refs, count, "fsdplab-dcp", ctx->error, sizeof ctx->error);
    free(refs);
    free(names);
    return status;
}

static cJSON *metadata_json(context *ctx, const flat_param *units, const adamw_state *states, int unit_count,
                            const dcp_progress *progress, const uint64_t *file_info) {
    cJSON *json = cJSON_CreateObject();
    cJSON_AddStringToObject(json, "format", DCP_FORMAT);
    cJSON_AddNumberToObject(json, "version", DCP_VERSION);
    cJSON_AddNumberToObject(json, "step", (double)progress->step);
    char text[32];
    snprintf(text, sizeof text, "%" PRIu64, progress->data_windows);
    cJSON_AddStringToObject(json, "data_windows", text);
    cJSON_AddNumberToObject(json, "world_size", ctx->world_size);
    cJSON_AddStringToObject(json, "strategy", progress->strategy);
    cJSON_AddStringToObject(json, "dtype", "float32");
    cJSON_AddStringToObject(json, "optimizer", "AdamW");
    cJSON *settings = cJSON_AddObjectToObject(json, "settings");
    for (int i = 0; i < progress->setting_count; i++)
        cJSON_AddStringToObject(settings, progress->settings[i].name, progress->settings[i].value);
    cJSON *unit_array = cJSON_AddArrayToObject(json, "units");
    for (int u = 0; u < unit_count; u++) {
        cJSON *unit = cJSON_CreateObject();
        cJSON_AddStringToObject(unit, "name", units[u].unit);
        cJSON_AddNumberToObject(unit, "numel", (double)units[u].unpadded_numel);
        cJSON_AddNumberToObject(unit, "param_count", units[u].param_count);
        snprintf(text, sizeof text, "%016" PRIx64, layout_hash(&units[u]));
        cJSON_AddStringToObject(unit, "layout_hash", text);
        cJSON_AddNumberToObject(unit, "optimizer_step", states[u].exp_avg != NULL ? (double)states[u].step : 0.0);
        cJSON_AddItemToArray(unit_array, unit);
    }
    cJSON *file_array = cJSON_AddArrayToObject(json, "files");
    for (int rank = 0; rank < ctx->world_size; rank++) {
        const uint64_t *info = file_info + 3 * rank; /* wrote, bytes, checksum */
        if (!info[0]) continue;
        cJSON *file = cJSON_CreateObject();
        cJSON_AddNumberToObject(file, "rank", rank);
        snprintf(text, sizeof text, "__%d_0.distcp", rank);
        cJSON_AddStringToObject(file, "file", text);
        cJSON_AddNumberToObject(file, "bytes", (double)info[1]);
        snprintf(text, sizeof text, "%016" PRIx64, info[2]);
        cJSON_AddStringToObject(file, "checksum", text);
        cJSON *ranges = cJSON_AddArrayToObject(file, "ranges");
        for (int u = 0; u < unit_count; u++) { /* [begin, end] of each range, flat: [b0, e0, b1, e1, ...] */
            held_piece *pieces = pieces_for(ctx, &units[u]);
            int piece_count = held_pieces(&units[u], rank, 1, pieces);
            cJSON *range = cJSON_CreateArray();
            for (int k = 0; k < (piece_count > 0 ? piece_count : 1); k++) {
                cJSON_AddItemToArray(range, cJSON_CreateNumber(piece_count > 0 ? (double)pieces[k].begin : 0.0));
                cJSON_AddItemToArray(range, cJSON_CreateNumber(piece_count > 0 ? (double)pieces[k].end : 0.0));
            }
            cJSON_AddItemToArray(ranges, range);
            free(pieces);
        }
        cJSON_AddItemToArray(file_array, file);
    }
    return json;
}

/* Rank 0: the extra files, then .metadata through .metadata.tmp: the commit. */
static int write_metadata(context *ctx, const char *directory, const flat_param *units, const adamw_state *states,
                          int unit_count, const dcp_progress *progress, const uint64_t *file_info,
                          dcp_extra_writer extra, void *extra_user) {
    if (extra != NULL && extra(directory, extra_user, ctx->error, sizeof ctx->error) != 0) return -1;
    cJSON *json = metadata_json(ctx, units, states, unit_count, progress, file_info);
    char *text = cJSON_Print(json);
    cJSON_Delete(json);
    char tmp[1200], path[1200];
    snprintf(tmp, sizeof tmp, "%s/%s.tmp", directory, DCP_METADATA);
    snprintf(path, sizeof path, "%s/%s", directory, DCP_METADATA);
    FILE *file = fopen(tmp, "w");
    int ok = file != NULL && text != NULL && fprintf(file, "%s\n", text) > 0;
    if (file != NULL && fclose(file) != 0) ok = 0;
    cJSON_free(text);
    if (!ok) return error_set(ctx->error, sizeof ctx->error, "writing %s failed: %s", tmp, strerror(errno));
    if (file_commit(tmp, path, ctx->error, sizeof ctx->error) != 0) return -1;
    file_sync(directory); /* the rename itself on disk; a filesystem that cannot sync a directory still renamed */
    return 0;
}

int dcp_save(context *ctx, const char *root, const flat_param *units, const adamw_state *states, int unit_count,
             const dcp_progress *progress, int keep, dcp_extra_writer extra, void *extra_user, char *written,
             size_t written_size, uint64_t *total_bytes) {
    double start_us = trace_now_us(&ctx->trace);
    char directory[1200], tmp[1300], path[1300];
    step_directory(directory, sizeof directory, root, progress->step);
    int status = 0;
    if (file_make_directories(directory) != 0)
        status = error_set(ctx->error, sizeof ctx->error, "rank %d: cannot create checkpoint directory %s: %s",
                           ctx->rank, directory, strerror(errno));
    /* A directory of an earlier, stopped attempt at this step is uncommitted until the new .metadata lands. */
    snprintf(path, sizeof path, "%s/%s", directory, DCP_METADATA);
    if (status == 0 && ctx->rank == 0 && unlink(path) != 0 && errno != ENOENT)
        status =
            error_set(ctx->error, sizeof ctx->error, "rank 0: cannot remove the old %s: %s", path, strerror(errno));
    status = world_all_true(ctx, status == 0) ? 0 : -1;

    uint64_t info[3] = {0, 0, 0}; /* wrote, bytes, checksum */
    if (status == 0) {
        snprintf(path, sizeof path, "%s/__%d_0.distcp", directory, ctx->rank);
        snprintf(tmp, sizeof tmp, "%s.tmp", path);
        int wrote = 0;
        status = write_shard_file(ctx, tmp, units, states, unit_count, &wrote);
        if (status == 0 && wrote) {
            info[0] = 1;
            status = checksum_file(tmp, &info[1], &info[2], ctx->error, sizeof ctx->error);
            if (status == 0) status = file_commit(tmp, path, ctx->error, sizeof ctx->error);
        }
        if (status != 0) {
            char reason[sizeof ctx->error];
            snprintf(reason, sizeof reason, "%s", ctx->error);
            unlink(tmp);
            snprintf(ctx->error, sizeof ctx->error, "rank %d: %s", ctx->rank, reason);
        }
    }
    if (!world_all_true(ctx, status == 0)) return -1;

    uint64_t *file_info = ctx->rank == 0 ? calloc((size_t)ctx->world_size * 3, sizeof *file_info) : NULL;
    if (ctx->rank == 0 && file_info == NULL) world_fatal(ctx, "out of memory");
    WORLD_MPI(ctx, MPI_Gather(info, 3, MPI_UINT64_T, file_info, 3, MPI_UINT64_T, 0, ctx->comm));
    uint64_t bytes = 0;
    if (ctx->rank == 0) {
        for (int rank = 0; rank < ctx->world_size; rank++) bytes += file_info[3 * rank + 1];
        status = write_metadata(ctx, directory, units, states, unit_count, progress, file_info, extra, extra_user);
        if (status == 0) prune(root, progress->step, keep);
        free(file_info);
    }
    if (!world_all_true(ctx, status == 0)) return -1;
    if (written != NULL) snprintf(written, written_size, "%s", directory);
    if (total_bytes != NULL) *total_bytes = bytes;
    char name[64];
    snprintf(name, sizeof name, "dcp.save.step_%" PRId64, progress->step);
    trace_compute(&ctx->trace, name, NULL, "checkpoint", start_us, trace_now_us(&ctx->trace) - start_us);
    return 0;
}

/* ---- Reading .metadata ---- */

static int json_text(const cJSON *object, const char *key, char *out, size_t size, const char *path, char *error,
                     size_t error_size) {
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(object, key);
    if (!cJSON_IsString(item) || strlen(item->valuestring) >= size)
        return error_set(error, error_size, "%s: \"%s\" is missing, not a string or longer than %zu bytes", path, key,
                         size - 1);
    snprintf(out, size, "%s", item->valuestring);
    return 0;
}

/* A whole number in [min, max], checked before any conversion (a cast of 1e300 or NaN is undefined in C). */
static int json_whole(const cJSON *object, const char *key, double min, double max, double *value, const char *path,
                      char *error, size_t error_size) {
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(object, key);
    if (!cJSON_IsNumber(item) || !(item->valuedouble >= min && item->valuedouble <= max) ||
        item->valuedouble != (double)(int64_t)item->valuedouble)
        return error_set(error, error_size, "%s: \"%s\" is missing or not a whole number in [%.0f, %.0f]", path, key,
                         min, max);
    *value = item->valuedouble;
    return 0;
}

static int json_hex64(const cJSON *object, const char *key, uint64_t *value, const char *path, char *error,
                      size_t error_size) {
    char text[32], *end = NULL;
    if (json_text(object, key, text, sizeof text, path, error, error_size) != 0) return -1;
    errno = 0;
    *value = strtoull(text, &end, 16);
    if (errno != 0 || end == text || *end != '\0' || strlen(text) != 16)
        return error_set(error, error_size, "%s: \"%s\" is '%s', not 16 hex digits", path, key, text);
    return 0;
}

#define MAX_ELEMENTS 9007199254740992.0 /* 2^53: every element index a JSON number holds exactly */

/* The list `key` of 1 to max objects, and a zeroed array of as many records of `size` bytes for them (NULL, with a
 * message, when the list is wrong). */
static void *json_list(const cJSON *json, const char *key, int max, size_t size, const cJSON **array, int *count,
                       const char *path, char *error, size_t error_size) {
    *array = cJSON_GetObjectItemCaseSensitive(json, key);
    *count = cJSON_IsArray(*array) ? cJSON_GetArraySize(*array) : 0;
    if (*count < 1 || *count > max) {
        error_set(error, error_size, "%s: \"%s\" is missing or not a list of 1 to %d entries", path, key, max);
        return NULL;
    }
    void *records = calloc((size_t)*count, size);
    if (records == NULL) error_set(error, error_size, "%s: out of memory", path);
    return records;
}

static int parse_units(const cJSON *json, dcp_metadata *m, const char *path, char *error, size_t error_size) {
    const cJSON *array;
    m->units = json_list(json, "units", 100000, sizeof *m->units, &array, &m->unit_count, path, error, error_size);
    if (m->units == NULL) return -1;
    int u = 0;
    const cJSON *item;
    cJSON_ArrayForEach(item, array) {
        dcp_unit_record *unit = &m->units[u];
        double numel, params, step;
        char where[1300];
        snprintf(where, sizeof where, "%s: units[%d]", path, u);
        if (!cJSON_IsObject(item) || json_text(item, "name", unit->name, sizeof unit->name, where, error, error_size) ||
            json_whole(item, "numel", 0, MAX_ELEMENTS, &numel, where, error, error_size) ||
            json_whole(item, "param_count", 1, 1e6, &params, where, error, error_size) ||
            json_hex64(item, "layout_hash", &unit->layout_hash, where, error, error_size) ||
            json_whole(item, "optimizer_step", 0, MAX_ELEMENTS, &step, where, error, error_size))
            return cJSON_IsObject(item) ? -1 : error_set(error, error_size, "%s is not an object", where);
        unit->numel = (size_t)numel, unit->param_count = (int)params, unit->optimizer_step = (int64_t)step;
        u++;
    }
    return 0;
}

static int parse_files(const cJSON *json, dcp_metadata *m, const char *path, char *error, size_t error_size) {
    const cJSON *array; /* one file per rank at most */
    m->files =
        json_list(json, "files", m->world_size, sizeof *m->files, &array, &m->file_count, path, error, error_size);
    if (m->files == NULL) return -1;
    int f = 0;
    const cJSON *item;
    cJSON_ArrayForEach(item, array) {
        dcp_file_record *file = &m->files[f];
        double rank, bytes;
        char where[1300];
        snprintf(where, sizeof where, "%s: files[%d]", path, f);
        if (!cJSON_IsObject(item)) return error_set(error, error_size, "%s is not an object", where);
        if (json_whole(item, "rank", 0, m->world_size - 1, &rank, where, error, error_size) ||
            json_text(item, "file", file->file, sizeof file->file, where, error, error_size) ||
            json_whole(item, "bytes", 8, MAX_ELEMENTS, &bytes, where, error, error_size) ||
            json_hex64(item, "checksum", &file->checksum, where, error, error_size))
            return -1;
        file->rank = (int)rank, file->bytes = (uint64_t)bytes;
        if (strchr(file->file, '/') != NULL || strcmp(file->file, "..") == 0 || file->file[0] == '.')
            return error_set(error, error_size, "%s: file '%s' is not a plain file name", where, file->file);
        const cJSON *ranges = cJSON_GetObjectItemCaseSensitive(item, "ranges");
        if (!cJSON_IsArray(ranges) || cJSON_GetArraySize(ranges) != m->unit_count)
            return error_set(error, error_size, "%s: \"ranges\" is missing or has not one range per unit (%d)", where,
                             m->unit_count);
        int total = 0;
        for (int u = 0; u < m->unit_count; u++) {
            const cJSON *range = cJSON_GetArrayItem(ranges, u);
            int size = cJSON_IsArray(range) ? cJSON_GetArraySize(range) : 0;
            if (size < 2 || size % 2 != 0 || size > 2 * m->units[u].param_count)
                return error_set(error, error_size, "%s: ranges[%d] (unit '%s') is not [begin, end, ...]: 1 to %d "
                                 "ranges", where, u, m->units[u].name, m->units[u].param_count);
            total += size / 2;
        }
        file->first_range = calloc((size_t)m->unit_count + 1, sizeof *file->first_range);
        file->begin = calloc((size_t)total, sizeof *file->begin);
        file->end = calloc((size_t)total, sizeof *file->end);
        if (file->first_range == NULL || file->begin == NULL || file->end == NULL)
            return error_set(error, error_size, "%s: out of memory", path);
        for (int u = 0, at = 0; u < m->unit_count; u++) {
            const cJSON *range = cJSON_GetArrayItem(ranges, u);
            file->first_range[u] = at;
            double numel = (double)m->units[u].numel, previous_end = 0;
            for (int k = 0; k < cJSON_GetArraySize(range) / 2; k++, at++) {
                const cJSON *b = cJSON_GetArrayItem(range, 2 * k), *e = cJSON_GetArrayItem(range, 2 * k + 1);
                if (!cJSON_IsNumber(b) || !cJSON_IsNumber(e) ||
                    !(b->valuedouble >= previous_end && b->valuedouble <= e->valuedouble && e->valuedouble <= numel) ||
                    b->valuedouble != (double)(int64_t)b->valuedouble ||
                    e->valuedouble != (double)(int64_t)e->valuedouble)
                    return error_set(error, error_size, "%s: ranges[%d] (unit '%s'), range %d is not [begin, end] with "
                                     "%.0f <= begin <= end <= %zu (ranges in order, apart)", where, u,
                                     m->units[u].name, k, previous_end, m->units[u].numel);
                file->begin[at] = (size_t)b->valuedouble, file->end[at] = (size_t)e->valuedouble;
                previous_end = e->valuedouble;
            }
            file->first_range[u + 1] = at;
        }
        for (int g = 0; g < f; g++)
            if (m->files[g].rank == file->rank)
                return error_set(error, error_size, "%s: rank %d has two files", where, file->rank);
        f++;
    }
    return 0;
}

static int parse_settings(const cJSON *json, dcp_progress *progress, const char *path, char *error, size_t error_size) {
    const cJSON *settings = cJSON_GetObjectItemCaseSensitive(json, "settings");
    if (!cJSON_IsObject(settings))
        return error_set(error, error_size, "%s: \"settings\" is missing or not an object", path);
    const cJSON *item;
    cJSON_ArrayForEach(item, settings) {
        if (!cJSON_IsString(item) || item->string == NULL ||
            strlen(item->string) >= sizeof progress->settings[0].name || strlen(item->valuestring) >= DCP_TEXT_MAX ||
            progress->setting_count == DCP_MAX_SETTINGS)
            return error_set(error, error_size, "%s: settings: '%.40s' is not a short text setting (at most %d)", path,
                             item->string ? item->string : "?", DCP_MAX_SETTINGS);
        dcp_progress_set(progress, item->string, "%s", item->valuestring);
    }
    return 0;
}

static int parse_metadata(const cJSON *json, dcp_metadata *m, const char *path, char *error, size_t error_size) {
    char format[64], windows[32], *end = NULL;
    double version, step, world;
    if (!cJSON_IsObject(json)) return error_set(error, error_size, "%s: not a JSON object", path);
    if (json_text(json, "format", format, sizeof format, path, error, error_size)) return -1;
    if (strcmp(format, DCP_FORMAT) != 0)
        return error_set(error, error_size, "%s: format '%s', expected '%s'", path, format, DCP_FORMAT);
    if (json_whole(json, "version", 0, 1e9, &version, path, error, error_size)) return -1;
    if (version != DCP_VERSION)
        return error_set(error, error_size, "%s: version %.0f; this build reads version %d", path, version,
                         DCP_VERSION);
    m->version = (int)version;
    if (json_whole(json, "step", 0, MAX_ELEMENTS, &step, path, error, error_size) ||
        json_whole(json, "world_size", 1, 1e6, &world, path, error, error_size) ||
        json_text(json, "strategy", m->progress.strategy, sizeof m->progress.strategy, path, error, error_size) ||
        json_text(json, "dtype", m->dtype, sizeof m->dtype, path, error, error_size) ||
        json_text(json, "data_windows", windows, sizeof windows, path, error, error_size))
        return -1;
    m->progress.step = (int64_t)step, m->world_size = (int)world;
    errno = 0;
    m->progress.data_windows = strtoull(windows, &end, 10);
    if (errno != 0 || end == windows || *end != '\0' || windows[0] == '-')
        return error_set(error, error_size, "%s: \"data_windows\" is '%s', not a whole number", path, windows);
    if (parse_settings(json, &m->progress, path, error, error_size) != 0) return -1;
    if (parse_units(json, m, path, error, error_size) != 0) return -1;
    return parse_files(json, m, path, error, error_size);
}

int dcp_read_metadata(const char *directory, dcp_metadata *m, char *error, size_t error_size) {
    memset(m, 0, sizeof *m);
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", directory, DCP_METADATA);
    FILE *file = fopen(path, "rb");
    if (file == NULL) {
        struct stat info;
        if (stat(directory, &info) != 0 || !S_ISDIR(info.st_mode))
            return error_set(error, error_size, "%s is not a directory", directory);
        return error_set(error, error_size, "%s: no %s, so the checkpoint was never committed (a run stopped while "
                         "writing it); use an earlier step_N", directory, DCP_METADATA);
    }
    enum { MAX_BYTES = 64 << 20 };
    char *text = malloc(MAX_BYTES + 1);
    size_t length = text ? fread(text, 1, MAX_BYTES + 1, file) : 0;
    fclose(file);
    if (text == NULL) return error_set(error, error_size, "%s: out of memory", path);
    if (length > MAX_BYTES) {
        free(text);
        return error_set(error, error_size, "%s: larger than %d MiB, not a checkpoint's metadata", path,
                         MAX_BYTES >> 20);
    }
    text[length] = '\0';
    cJSON *json = cJSON_ParseWithLength(text, length);
    free(text);
    int status = json == NULL ? error_set(error, error_size, "%s: not valid JSON", path)
                              : parse_metadata(json, m, path, error, error_size);
    cJSON_Delete(json);
    if (status != 0) dcp_metadata_free(m);
    return status;
}

void dcp_metadata_free(dcp_metadata *m) {
    for (int f = 0; m->files != NULL && f < m->file_count; f++) {
        free(m->files[f].first_range);
        free(m->files[f].begin);
        free(m->files[f].end);
    }
    free(m->files);
    free(m->units);
    memset(m, 0, sizeof *m);
}

/* ---- Loading ---- */

/* The checkpoint's units against the model's: same names, sizes and parameter layouts, in the same order. */
static int check_model(const dcp_metadata *m, const flat_param *units, int unit_count, const char *directory,
                       char *error, size_t error_size) {
    if (m->unit_count != unit_count)
        return error_set(error, error_size, "%s holds %d FSDP units, this model has %d: another model or wrap policy",
                         directory, m->unit_count, unit_count);
    for (int u = 0; u < unit_count; u++) {
        const dcp_unit_record *saved = &m->units[u];
        if (strcmp(saved->name, units[u].unit) != 0 || saved->numel != units[u].unpadded_numel ||
            saved->param_count != units[u].param_count || saved->layout_hash != layout_hash(&units[u]))
            return error_set(error, error_size, "%s: unit %d is '%s' with %zu elements in %d parameters, this model's "
                             "is '%s' with %zu in %d%s: another model", directory, u, saved->name, saved->numel,
                             saved->param_count, units[u].unit, units[u].unpadded_numel, units[u].param_count,
                             saved->numel == units[u].unpadded_numel ? " (same size, other names or shapes)" : "");
    }
    return 0;
}

/* A file's size and checksum against the metadata, once per file. */
static int verify_file(const char *directory, const dcp_file_record *record, char *error, size_t error_size) {
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", directory, record->file);
    uint64_t bytes, checksum;
    if (checksum_file(path, &bytes, &checksum, error, error_size) != 0) return -1;
    if (bytes != record->bytes)
        return error_set(error, error_size, "%s: %" PRIu64 " bytes, the metadata says %" PRIu64 " (truncated or "
                         "replaced)", path, bytes, record->bytes);
    if (checksum != record->checksum)
        return error_set(error, error_size, "%s: checksum %016" PRIx64 ", the metadata says %016" PRIx64 " (corrupt)",
                         path, checksum, record->checksum);
    return 0;
}

/* Reads elements [begin, end) of a unit's tensor `suffix` from the file's range k (which holds them) into target. */
static int read_overlap(const st_file *st, const dcp_file_record *record, int range, int k, const char *unit,
                        const char *suffix, size_t begin, size_t end, float *target, char *error, size_t error_size) {
    char name[ST_NAME_MAX];
    piece_name(name, sizeof name, unit, suffix, k);
    const st_entry *entry = st_find(st, name);
    size_t held = record->end[range] - record->begin[range];
    if (entry == NULL || entry->numel != held)
        return error_set(error, error_size, "%s: tensor '%s' %s, the metadata says %zu elements", st->path, name,
                         entry == NULL ? "is missing" : "has another size", held);
    return st_read(st, name, begin - record->begin[range], end - begin, target, error, error_size);
}

/* Elements of [a_begin, a_end) and [b_begin, b_end) both: [*begin, *end), 0 when none. */
static int overlap(size_t a_begin, size_t a_end, size_t b_begin, size_t b_end, size_t *begin, size_t *end) {
    *begin = a_begin > b_begin ? a_begin : b_begin;
    *end = a_end < b_end ? a_end : b_end;
    return *begin < *end;
}

/* Every range of unit u in the file against every range this rank holds: the shared elements read into the shard
 * (and the moments) at their place; the count read is added to *covered. */
static int load_unit_from_file(const st_file *st, const dcp_file_record *record, const dcp_metadata *m, int u,
                               flat_param *fp, adamw_state *state, const held_piece *mine, int mine_count,
                               size_t *covered, char *error, size_t error_size) {
    int status = 0;
    for (int range = record->first_range[u]; range < record->first_range[u + 1] && status == 0; range++) {
        for (int j = 0; j < mine_count && status == 0; j++) {
            size_t begin, end;
            if (!overlap(record->begin[range], record->end[range], mine[j].begin, mine[j].end, &begin, &end))
                continue;
            size_t at = mine[j].shard_offset + (begin - mine[j].begin);
            int k = range - record->first_range[u];
            status = read_overlap(st, record, range, k, fp->unit, "param", begin, end, fp->local_shard + at, error,
                                  error_size);
            float *moments[2] = {state->exp_avg, state->exp_avg_sq};
            for (int t = 0; t < 2 && status == 0 && m->units[u].optimizer_step > 0; t++)
                status = read_overlap(st, record, range, k, fp->unit, MOMENT_SUFFIX[t], begin, end, moments[t] + at,
                                      error, error_size);
            *covered += end - begin;
        }
    }
    return status;
}

static int load_units(context *ctx, const char *directory, const dcp_metadata *m, flat_param *units,
                      adamw_state *states, int unit_count, int rank, char *error, size_t error_size) {
    size_t *covered = calloc((size_t)unit_count, sizeof *covered);
    held_piece **mine = calloc((size_t)unit_count, sizeof *mine);
    int *mine_count = calloc((size_t)unit_count, sizeof *mine_count);
    if (covered == NULL || mine == NULL || mine_count == NULL) world_fatal(ctx, "out of memory");
    int status = 0;
    for (int u = 0; u < unit_count; u++) {
        if (m->units[u].optimizer_step > 0) adamw_state_prepare(&states[u], &units[u], m->units[u].optimizer_step);
        mine[u] = pieces_for(ctx, &units[u]);
        mine_count[u] = held_pieces(&units[u], rank, 0, mine[u]);
    }
    for (int f = 0; f < m->file_count && status == 0; f++) {
        const dcp_file_record *record = &m->files[f];
        int needed = 0;
        for (int u = 0; u < unit_count; u++)
            for (int range = record->first_range[u]; range < record->first_range[u + 1]; range++)
                for (int j = 0; j < mine_count[u]; j++) {
                    size_t begin, end;
                    needed |= overlap(record->begin[range], record->end[range], mine[u][j].begin, mine[u][j].end,
                                      &begin, &end);
                }
        if (!needed) continue;
        status = verify_file(directory, record, error, error_size);
        st_file st;
        char path[1200];
        snprintf(path, sizeof path, "%s/%s", directory, record->file);
        if (status == 0) status = st_open(&st, path, error, error_size);
        if (status != 0) break;
        for (int u = 0; u < unit_count && status == 0; u++)
            status = load_unit_from_file(&st, record, m, u, &units[u], &states[u], mine[u], mine_count[u],
                                         &covered[u], error, error_size);
        st_close(&st);
    }
    for (int u = 0; u < unit_count && status == 0; u++) {
        size_t held = 0;
        for (int j = 0; j < mine_count[u]; j++) held += mine[u][j].end - mine[u][j].begin;
        if (covered[u] != held)
            status = error_set(error, error_size, "%s: unit '%s': the files hold %zu of this rank's %zu elements "
                               "(overlapping or missing ranges)", directory, units[u].unit, covered[u], held);
    }
    for (int u = 0; u < unit_count; u++) free(mine[u]);
    free(mine);
    free(mine_count);
    free(covered);
    return status;
}

int dcp_load(context *ctx, const char *directory, flat_param *units, adamw_state *states, int unit_count,
             dcp_progress *progress) {
    double start_us = trace_now_us(&ctx->trace);
    dcp_metadata m;
    char error[1024];
    int status = dcp_read_metadata(directory, &m, error, sizeof error);
    if (status == 0) status = check_model(&m, units, unit_count, directory, error, sizeof error);
    if (status == 0 && strcmp(m.dtype, "float32") != 0)
        status = error_set(error, sizeof error, "%s: dtype %s; this run trains in float32", directory, m.dtype);
    if (status == 0 && strcmp(m.progress.strategy, progress->strategy) != 0)
        status = error_set(error, sizeof error, "%s: saved with STRATEGY=%s, this run is %s; resume with the same "
                           "strategy", directory, m.progress.strategy, progress->strategy);
    if (status == 0) status = load_units(ctx, directory, &m, units, states, unit_count, ctx->rank, error,
                                          sizeof error);
    if (status == 0) *progress = m.progress;
    dcp_metadata_free(&m);
    if (status != 0) snprintf(ctx->error, sizeof ctx->error, "rank %d: %s", ctx->rank, error);
    if (!world_all_true(ctx, status == 0)) {
        for (int u = 0; u < unit_count; u++) adamw_free(&states[u]);
        return -1;
    }
    trace_compute(&ctx->trace, "dcp.load", NULL, "checkpoint", start_us, trace_now_us(&ctx->trace) - start_us);
    return 0;
}
