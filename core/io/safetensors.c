/* safetensors.c — F32 safetensors read / write with validation. See safetensors.h. */
#define _POSIX_C_SOURCE 200809L
#include "core/io/safetensors.h"

#include "core/runtime/context.h"
#include "core/base/error.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* A header larger than this is not a model we make; refuse before allocating it (HF caps it at 100 MB too). */
#define ST_HEADER_MAX (100u * 1000u * 1000u)

static void put_u64_le(unsigned char *out, uint64_t value) {
    for (int i = 0; i < 8; i++) out[i] = (unsigned char)(value >> (8 * i));
}
static uint64_t get_u64_le(const unsigned char *in) {
    uint64_t value = 0;
    for (int i = 7; i >= 0; i--) value = (value << 8) | in[i];
    return value;
}

static size_t numel_of(int ndim, const int64_t *shape) {
    size_t numel = 1;
    for (int d = 0; d < ndim; d++) numel *= (size_t)shape[d];
    return numel;
}

/* The header JSON for the tensors laid out back to back in the given order. */
static char *header_json(const st_tensor_ref *tensors, int count, const char *metadata_format) {
    cJSON *header = cJSON_CreateObject();
    if (metadata_format != NULL) {
        cJSON *metadata = cJSON_AddObjectToObject(header, "__metadata__");
        cJSON_AddStringToObject(metadata, "format", metadata_format);
    }
    uint64_t offset = 0;
    for (int i = 0; i < count; i++) {
        cJSON *entry = cJSON_AddObjectToObject(header, tensors[i].name);
        cJSON_AddStringToObject(entry, "dtype", "F32");
        cJSON *shape = cJSON_AddArrayToObject(entry, "shape");
        for (int d = 0; d < tensors[i].ndim; d++)
            cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)tensors[i].shape[d]));
        uint64_t bytes = numel_of(tensors[i].ndim, tensors[i].shape) * sizeof(float);
        cJSON *offsets = cJSON_AddArrayToObject(entry, "data_offsets");
        cJSON_AddItemToArray(offsets, cJSON_CreateNumber((double)offset));
        cJSON_AddItemToArray(offsets, cJSON_CreateNumber((double)(offset + bytes)));
        offset += bytes;
    }
    char *text = cJSON_PrintUnformatted(header);
    cJSON_Delete(header);
    return text;
}

static int check_little_endian(char *error, size_t error_size) {
    const uint32_t probe = 1;
    if (*(const unsigned char *)&probe != 1)
        return error_set(error, error_size, "safetensors: this build supports little-endian hosts only");
    return 0;
}

int st_write(const char *path, const st_tensor_ref *tensors, int count, const char *metadata_format, char *error,
             size_t error_size) {
    if (check_little_endian(error, error_size) != 0) return -1;
    for (int i = 0; i < count; i++) {
        if (tensors[i].ndim < 0 || tensors[i].ndim > ST_MAX_DIMS)
            return error_set(error, error_size, "%s: tensor '%s' has %d dims (0..%d allowed)", path, tensors[i].name,
                        tensors[i].ndim, ST_MAX_DIMS);
        for (int j = 0; j < i; j++)
            if (strcmp(tensors[i].name, tensors[j].name) == 0)
                return error_set(error, error_size, "%s: tensor '%s' given twice", path, tensors[i].name);
    }
    char *json = header_json(tensors, count, metadata_format);
    if (json == NULL) return error_set(error, error_size, "%s: out of memory building the header", path);
    size_t json_length = strlen(json), padded = (json_length + 7) / 8 * 8; /* HF pads the header with spaces to 8 */
    FILE *file = fopen(path, "wb");
    if (file == NULL) {
        cJSON_free(json);
        return error_set(error, error_size, "cannot create %s: %s", path, strerror(errno));
    }
    unsigned char length_bytes[8];
    put_u64_le(length_bytes, padded);
    int ok = fwrite(length_bytes, 1, 8, file) == 8 && fwrite(json, 1, json_length, file) == json_length;
    for (size_t i = json_length; ok && i < padded; i++) ok = fputc(' ', file) != EOF;
    for (int i = 0; ok && i < count; i++) {
        size_t numel = numel_of(tensors[i].ndim, tensors[i].shape);
        ok = fwrite(tensors[i].data, sizeof(float), numel, file) == numel;
    }
    cJSON_free(json);
    if (fclose(file) != 0) ok = 0;
    return ok ? 0 : error_set(error, error_size, "writing %s failed: %s", path, strerror(errno));
}

static int compare_by_begin(const void *left, const void *right) {
    const st_entry *a = left, *b = right;
    return (a->begin > b->begin) - (a->begin < b->begin);
}

/* Element counts whose byte count (x 4) is exact in a double, as the header's numbers are. */
#define ST_ELEMENTS_MAX (((size_t)1 << 53) / sizeof(float))

/* A JSON number that is a whole count a double holds exactly: 0 ... 2^53. */
static int is_whole_count(const cJSON *item) {
    return cJSON_IsNumber(item) && item->valuedouble >= 0 && item->valuedouble <= 9007199254740992.0 &&
           item->valuedouble == floor(item->valuedouble);
}

/* One header entry → st_entry, checked on its own (dtype, shape, offsets against its shape). */
static int parse_entry(const cJSON *item, st_entry *entry, const char *path, char *error, size_t error_size) {
    if (strlen(item->string) >= ST_NAME_MAX)
        return error_set(error, error_size, "%s: tensor name longer than %d bytes", path, ST_NAME_MAX - 1);
    snprintf(entry->name, sizeof entry->name, "%s", item->string);
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(item, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(item, "shape");
    const cJSON *offsets = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
    if (!cJSON_IsString(dtype) || !cJSON_IsArray(shape) || !cJSON_IsArray(offsets) || cJSON_GetArraySize(offsets) != 2)
        return error_set(error, error_size, "%s: tensor '%s': header entry needs dtype, shape and two data_offsets",
                         path, entry->name);
    if (strcmp(dtype->valuestring, "F32") != 0)
        return error_set(error, error_size, "%s: tensor '%s' has dtype %s; fsdplab reads F32 only", path, entry->name,
                    dtype->valuestring);
    entry->ndim = cJSON_GetArraySize(shape);
    if (entry->ndim > ST_MAX_DIMS)
        return error_set(error, error_size, "%s: tensor '%s' has %d dims (at most %d)", path, entry->name, entry->ndim,
                    ST_MAX_DIMS);
    /* Sizes and offsets are checked as doubles before any conversion (a double beyond the integer's range converts
     * with undefined behaviour), and the element count before it is multiplied (a wrapped product could match the
     * offsets of a tiny tensor). */
    size_t numel = 1;
    for (int d = 0; d < entry->ndim; d++) {
        const cJSON *dim = cJSON_GetArrayItem(shape, d);
        if (!is_whole_count(dim))
            return error_set(error, error_size, "%s: tensor '%s': dimension %d is not a size", path, entry->name, d);
        entry->shape[d] = (int64_t)dim->valuedouble;
        if (entry->shape[d] != 0 && numel > ST_ELEMENTS_MAX / (size_t)entry->shape[d])
            return error_set(error, error_size, "%s: tensor '%s': shape holds more than 2^53 bytes", path, entry->name);
        numel *= (size_t)entry->shape[d];
    }
    entry->numel = numel;
    const cJSON *begin = cJSON_GetArrayItem(offsets, 0), *end = cJSON_GetArrayItem(offsets, 1);
    if (!is_whole_count(begin) || !is_whole_count(end) || end->valuedouble < begin->valuedouble)
        return error_set(error, error_size, "%s: tensor '%s': data_offsets are not an increasing pair", path,
                         entry->name);
    entry->begin = (uint64_t)begin->valuedouble;
    entry->end = (uint64_t)end->valuedouble;
    if (entry->end - entry->begin != entry->numel * sizeof(float))
        return error_set(error, error_size,
                    "%s: tensor '%s': data_offsets [%llu, %llu) hold %llu bytes, but shape needs %zu x 4 = %zu",
                    path, entry->name, (unsigned long long)entry->begin, (unsigned long long)entry->end,
                    (unsigned long long)(entry->end - entry->begin), entry->numel, entry->numel * sizeof(float));
    return 0;
}

/* The entries together must tile the data section exactly: no overlap, no hole, nothing past the end. */
static int check_layout(const st_file *st, uint64_t data_bytes, char *error, size_t error_size) {
    uint64_t expected = 0;
    for (int i = 0; i < st->count; i++) {
        const st_entry *entry = &st->entries[i];
        if (entry->begin != expected)
            return error_set(error, error_size, "%s: tensor '%s' starts at data byte %llu, expected %llu (%s)",
                             st->path, entry->name, (unsigned long long)entry->begin, (unsigned long long)expected,
                             entry->begin < expected ? "overlaps the previous tensor" : "a hole before it");
        if (entry->end > data_bytes)
            return error_set(error, error_size,
                        "%s: tensor '%s' ends at data byte %llu but the file has only %llu data bytes (truncated?)",
                        st->path, entry->name, (unsigned long long)entry->end, (unsigned long long)data_bytes);
        expected = entry->end;
    }
    if (expected != data_bytes)
        return error_set(error, error_size, "%s: %llu data bytes after the last tensor belong to no tensor", st->path,
                    (unsigned long long)(data_bytes - expected));
    return 0;
}

static int parse_header(st_file *st, const char *text, uint64_t data_bytes, char *error, size_t error_size) {
    cJSON *header = cJSON_Parse(text);
    if (!cJSON_IsObject(header)) {
        cJSON_Delete(header);
        return error_set(error, error_size, "%s: header is not a JSON object", st->path);
    }
    int capacity = cJSON_GetArraySize(header);
    st->entries = calloc((size_t)(capacity > 0 ? capacity : 1), sizeof *st->entries);
    int status = st->entries ? 0 : error_set(error, error_size, "%s: out of memory for %d entries", st->path, capacity);
    const cJSON *item = NULL;
    cJSON_ArrayForEach(item, header) {
        if (status != 0) break;
        if (strcmp(item->string, "__metadata__") == 0) continue;
        status = parse_entry(item, &st->entries[st->count], st->path, error, error_size);
        if (status == 0) st->count++;
    }
    cJSON_Delete(header);
    if (status != 0) return -1;
    qsort(st->entries, (size_t)st->count, sizeof *st->entries, compare_by_begin);
    return check_layout(st, data_bytes, error, error_size);
}

int st_open(st_file *st, const char *path, char *error, size_t error_size) {
    memset(st, 0, sizeof *st);
    if (check_little_endian(error, error_size) != 0) return -1;
    snprintf(st->path, sizeof st->path, "%s", path);
    struct stat info;
    if (stat(path, &info) != 0) return error_set(error, error_size, "cannot open %s: %s", path, strerror(errno));
    uint64_t file_bytes = (uint64_t)info.st_size;
    st->file = fopen(path, "rb");
    if (st->file == NULL) return error_set(error, error_size, "cannot open %s: %s", path, strerror(errno));
    unsigned char length_bytes[8];
    char *text = NULL;
    int status = 0;
    if (fread(length_bytes, 1, 8, st->file) != 8) {
        status = error_set(error, error_size, "%s: %llu bytes, too short for the 8-byte header length", path,
                      (unsigned long long)file_bytes);
    } else {
        uint64_t header_bytes = get_u64_le(length_bytes);
        if (header_bytes > ST_HEADER_MAX || 8 + header_bytes > file_bytes) {
            status = error_set(error, error_size, "%s: header length %llu does not fit in the file's %llu bytes", path,
                          (unsigned long long)header_bytes, (unsigned long long)file_bytes);
        } else if ((text = malloc(header_bytes + 1)) == NULL) {
            status = error_set(error, error_size, "%s: out of memory for a %llu-byte header", path,
                          (unsigned long long)header_bytes);
        } else if (fread(text, 1, header_bytes, st->file) != header_bytes) {
            status = error_set(error, error_size, "%s: reading the header failed", path);
        } else {
            text[header_bytes] = '\0';
            st->data_start = 8 + header_bytes;
            status = parse_header(st, text, file_bytes - st->data_start, error, error_size);
        }
    }
    free(text);
    if (status != 0) st_close(st);
    return status;
}

const st_entry *st_find(const st_file *st, const char *name) {
    for (int i = 0; i < st->count; i++)
        if (strcmp(st->entries[i].name, name) == 0) return &st->entries[i];
    return NULL;
}

int st_read(const st_file *st, const char *name, size_t first, size_t count, float *out, char *error,
            size_t error_size) {
    const st_entry *entry = st_find(st, name);
    if (entry == NULL) return error_set(error, error_size, "%s: no tensor named '%s'", st->path, name);
    if (first > entry->numel || count > entry->numel - first)
        return error_set(error, error_size, "%s: tensor '%s' has %zu elements; cannot read [%zu, %zu)", st->path, name,
                    entry->numel, first, first + count);
    uint64_t offset = st->data_start + entry->begin + first * sizeof(float);
    if (fseeko(st->file, (off_t)offset, SEEK_SET) != 0 || fread(out, sizeof(float), count, st->file) != count)
        return error_set(error, error_size, "%s: reading tensor '%s' elements [%zu, %zu) at byte %llu failed", st->path,
                    name, first, first + count, (unsigned long long)offset);
    return 0;
}

void st_close(st_file *st) {
    if (st->file != NULL) fclose(st->file);
    free(st->entries);
    memset(st, 0, sizeof *st);
}
