/* fuzz_parsers.c — a bounded, deterministic fuzz check of every parser that reads a file a user hands us.
 *
 *   tests/bin/fuzz_parsers SEED ITERATIONS [PARSER]      (files under $OUT, default runs/fuzz_parsers)
 *
 * For each parser in `parsers` below: make a valid file with our own writer (st_write, qwen2_config_save_json, the
 * trace sink ...), check that the parser accepts it, then ITERATIONS times mutate it (bit flips, byte inserts and
 * deletes, truncation, numbers replaced by huge / negative / fractional / out-of-range values, duplicated JSON keys,
 * spliced chunks), write the mutant over the parser's file and parse it. A parser must
 *   - never crash (run under build/sanitize/ by `make check-sanitize`, any overflow, leak or UB aborts too),
 *   - return within TIME_LIMIT_S seconds per file (SIGALRM ends the run, naming the parser),
 *   - accept nothing that breaks the post-conditions its callers rely on (each parse function checks them),
 *   - refuse every mutant of its `refusals` generator: changes that must be detected (a truncated safetensors or
 *     token file, a tensor past the end of the file, a config field out of range ...).
 * Mutants come from a counter-based generator keyed by (SEED, parser, iteration), so a failure is reproduced by the
 * same command line; the last mutant stays on disk under $OUT/fuzz-<parser>/.
 */
#define _POSIX_C_SOURCE 200809L
#include <cjson/cJSON.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/runtime/context.h"
#include "core/data/data.h"
#include "core/io/dcp.h"
#include "core/memory/mem.h"
#include "core/models/qwen2.h"
#include "core/io/safetensors.h"
#include "core/data/tokenizer.h"
#include "trace/export.h"
#include "trace/run.h"
#include "trace/trace.h"
#include "core/runtime/world.h"
#include "core/base/file.h"
#include "core/runtime/session.h"

enum { TIME_LIMIT_S = 20, REFUSALS_PER_PARSER = 40, TOKENS_SEQ_LEN = 16, TOKENS_VOCAB = 260 };

/* ---- bytes and randomness ---- */

typedef struct buffer {
    unsigned char *bytes;
    size_t size, capacity;
} buffer;

static void buffer_reserve(buffer *b, size_t size) {
    if (size <= b->capacity) return;
    size_t capacity = b->capacity ? b->capacity : 256;
    while (capacity < size) capacity *= 2;
    unsigned char *bytes = realloc(b->bytes, capacity);
    if (bytes == NULL) {
        fprintf(stderr, "fuzz_parsers: out of memory for %zu bytes\n", capacity);
        exit(2);
    }
    b->bytes = bytes;
    b->capacity = capacity;
}

static void buffer_set(buffer *b, const void *bytes, size_t size) {
    buffer_reserve(b, size);
    if (size > 0) memcpy(b->bytes, bytes, size);
    b->size = size;
}

/* Replaces bytes [at, at + removed) by `inserted` (count bytes). */
static void buffer_splice(buffer *b, size_t at, size_t removed, const void *inserted, size_t count) {
    buffer_reserve(b, b->size - removed + count);
    memmove(b->bytes + at + count, b->bytes + at + removed, b->size - at - removed);
    if (count > 0) memcpy(b->bytes + at, inserted, count);
    b->size = b->size - removed + count;
}

static int file_write(const char *path, const buffer *b) {
    FILE *file = fopen(path, "wb");
    if (file == NULL) return -1;
    int ok = fwrite(b->bytes, 1, b->size, file) == b->size;
    return fclose(file) == 0 && ok ? 0 : -1;
}

static int file_read(const char *path, buffer *b) {
    FILE *file = fopen(path, "rb");
    if (file == NULL) return -1;
    b->size = 0;
    unsigned char chunk[4096];
    size_t got;
    while ((got = fread(chunk, 1, sizeof chunk, file)) > 0) buffer_splice(b, b->size, 0, chunk, got);
    fclose(file);
    return 0;
}

/* splitmix64: the mutants of (seed, parser, iteration) are the same on every machine. */
static uint64_t next_random(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static size_t below(uint64_t *state, size_t bound) { return bound == 0 ? 0 : (size_t)(next_random(state) % bound); }

/* ---- mutations ---- */

/* Numbers a parser must survive in place of any number: huge, negative, fractional, beyond int / uint64 / 2^53,
 * infinite after strtod (1e999), denormal, and words JSON has not. */
static const char *const odd_numbers[] = {
    "0",     "-1",         "1.5",   "-0",     "1e308",  "-1e308", "1e999",     "-1e999",   "2147483648", "-2147483649",
    "4294967296",          "9007199254740993",          "18446744073709551616", "1e-320", "NaN",      "Infinity",
    "99999999999999999999999999", "3e19", "-9223372036854775809", "65535",  "260",        "1e30",
};
#define ODD_NUMBER_COUNT (sizeof odd_numbers / sizeof odd_numbers[0])

static int is_number_char(unsigned char c) {
    return (c >= '0' && c <= '9') || c == '-' || c == '.' || c == 'e' || c == '+';
}

/* The digits run around a random position, replaced by one of odd_numbers. */
static void mutate_number(buffer *b, uint64_t *rng) {
    for (int attempt = 0; attempt < 16 && b->size > 0; attempt++) {
        size_t at = below(rng, b->size);
        if (b->bytes[at] < '0' || b->bytes[at] > '9') continue;
        size_t begin = at, end = at;
        while (begin > 0 && is_number_char(b->bytes[begin - 1])) begin--;
        while (end < b->size && is_number_char(b->bytes[end])) end++;
        const char *number = odd_numbers[below(rng, ODD_NUMBER_COUNT)];
        buffer_splice(b, begin, end - begin, number, strlen(number));
        return;
    }
}

/* A `"key": value` member copied in front of itself (cJSON keeps both; the first wins a lookup). */
static void mutate_duplicate_key(buffer *b, uint64_t *rng) {
    for (int attempt = 0; attempt < 16 && b->size > 2; attempt++) {
        size_t at = below(rng, b->size - 1);
        if (b->bytes[at] != '"' || (at > 0 && b->bytes[at - 1] != '{' && b->bytes[at - 1] != ',' &&
                                    b->bytes[at - 1] != ' ' && b->bytes[at - 1] != '\n'))
            continue;
        size_t end = at + 1;
        int depth = 0;
        while (end < b->size && !(depth == 0 && (b->bytes[end] == ',' || b->bytes[end] == '}'))) {
            if (b->bytes[end] == '{' || b->bytes[end] == '[') depth++;
            if (b->bytes[end] == '}' || b->bytes[end] == ']') depth--;
            if (b->bytes[end] == '\n' && depth == 0) break;
            end++;
        }
        if (end >= b->size || b->bytes[end] == '\n') continue;
        buffer copy = {0};
        buffer_set(&copy, b->bytes + at, end - at);
        buffer_splice(&copy, copy.size, 0, ",", 1);
        buffer_splice(b, at, 0, copy.bytes, copy.size);
        free(copy.bytes);
        return;
    }
}

static void mutate_once(buffer *b, uint64_t *rng, int json) {
    static const char structural[] = "{}[]\",:0123456789-.eE\n\\ ";
    switch (below(rng, json ? 10 : 6)) { /* JSON: numbers and keys in 4 of 10 */
    case 0: /* bit flips */
        for (size_t flips = 1 + below(rng, 8); flips > 0 && b->size > 0; flips--)
            b->bytes[below(rng, b->size)] ^= (unsigned char)(1u << below(rng, 8));
        break;
    case 1: { /* insert bytes: random or JSON punctuation */
        unsigned char inserted[8];
        size_t count = 1 + below(rng, sizeof inserted);
        for (size_t i = 0; i < count; i++)
            inserted[i] = below(rng, 2) ? (unsigned char)next_random(rng)
                                        : (unsigned char)structural[below(rng, sizeof structural - 1)];
        buffer_splice(b, below(rng, b->size + 1), 0, inserted, count);
        break;
    }
    case 2: { /* delete bytes */
        size_t at = below(rng, b->size + 1), count = 1 + below(rng, 16);
        buffer_splice(b, at, count < b->size - at ? count : b->size - at, NULL, 0);
        break;
    }
    case 3: /* truncate */
        b->size = below(rng, b->size + 1);
        break;
    case 4: { /* a chunk copied elsewhere */
        size_t from = below(rng, b->size + 1), count = below(rng, 64);
        if (count > b->size - from) count = b->size - from;
        buffer chunk = {0};
        buffer_set(&chunk, b->bytes + from, count);
        buffer_splice(b, below(rng, b->size + 1), 0, chunk.bytes, chunk.size);
        free(chunk.bytes);
        break;
    }
    case 5: { /* an aligned little-endian word set to an extreme: lengths, offsets, token ids */
        static const uint64_t extremes[] = {0, 1, 0xff, 0xffff, 0x7fffffff, 0xffffffff, UINT64_MAX, UINT64_MAX / 2,
                                            TOKENS_VOCAB, TOKENS_VOCAB - 1, 1ull << 32, 100000001};
        size_t width = below(rng, 2) ? 8 : 2;
        if (b->size < width) break;
        size_t at = below(rng, b->size / width) * width;
        uint64_t value = extremes[below(rng, sizeof extremes / sizeof extremes[0])];
        for (size_t i = 0; i < width; i++) b->bytes[at + i] = (unsigned char)(value >> (8 * i));
        break;
    }
    default:
        if (below(rng, 2)) mutate_number(b, rng);
        else mutate_duplicate_key(b, rng);
        break;
    }
}

/* ---- the parsers: a valid file, the parse with its post-conditions, the changes that must be refused ---- */

typedef enum parse_result { PARSE_ACCEPTED, PARSE_REFUSED, PARSE_BROKEN } parse_result;

typedef struct fuzz_state {
    context *ctx;      /* for the data loader (collective, tracked memory) */
    char dir[1024];    /* this parser's directory under OUT */
    char path[1200];   /* the file the parser reads: seed, then each mutant */
} fuzz_state;

typedef struct fuzz_parser {
    const char *name;
    const char *file_name;  /* in the parser's directory */
    int json;               /* text with JSON numbers and keys: number and duplicate-key mutations apply */
    int (*make_seed)(fuzz_state *state);  /* writes a valid file at state->path; 0 or -1 */
    parse_result (*parse)(fuzz_state *state, char *error, size_t error_size);
    /* A change of the valid file `seed` that must be refused, as `out`, described in `what`; NULL: none. */
    void (*refusal)(const buffer *seed, uint64_t *rng, buffer *out, char *what, size_t what_size);
} fuzz_parser;

/* safetensors: three tensors (a 0-d one too) with HF's metadata; an accepted file must read back every tensor. */
static int safetensors_seed(fuzz_state *state) {
    static const float weight[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, bias[3] = {-1, 0, 1}, scale = 0.5f;
    st_tensor_ref tensors[3] = {{"layer.weight", 2, {3, 4}, weight}, {"layer.bias", 1, {3}, bias},
                                {"scale", 0, {0}, &scale}};
    char error[512];
    if (st_write(state->path, tensors, 3, "pt", error, sizeof error) != 0) {
        fprintf(stderr, "fuzz_parsers: %s\n", error);
        return -1;
    }
    return 0;
}

static parse_result safetensors_parse(fuzz_state *state, char *error, size_t error_size) {
    st_file st;
    if (st_open(&st, state->path, error, error_size) != 0) return PARSE_REFUSED;
    parse_result result = PARSE_ACCEPTED;
    for (int i = 0; i < st.count && result == PARSE_ACCEPTED; i++) {
        size_t count = st.entries[i].numel < 4096 ? st.entries[i].numel : 4096;
        float values[4096];
        if (st_read(&st, st.entries[i].name, 0, count, values, error, error_size) != 0) result = PARSE_BROKEN;
    }
    st_close(&st);
    return result;
}

/* The seed with its header (JSON) changed by `edit`, the length prefix and data kept consistent with it. */
static void safetensors_edit_header(const buffer *seed, buffer *out, void (*edit)(cJSON *header)) {
    uint64_t header_bytes = 0;
    for (int i = 7; i >= 0; i--) header_bytes = header_bytes << 8 | seed->bytes[i];
    cJSON *header = cJSON_ParseWithLength((const char *)seed->bytes + 8, (size_t)header_bytes);
    edit(header);
    char *text = cJSON_PrintUnformatted(header);
    cJSON_Delete(header);
    unsigned char length[8];
    for (int i = 0; i < 8; i++) length[i] = (unsigned char)((uint64_t)strlen(text) >> (8 * i));
    buffer_set(out, length, 8);
    buffer_splice(out, 8, 0, text, strlen(text));
    buffer_splice(out, out->size, 0, seed->bytes + 8 + header_bytes, seed->size - 8 - header_bytes);
    cJSON_free(text);
}

static void set_pair(cJSON *entry, const char *key, double first, double second) {
    cJSON_ReplaceItemInObjectCaseSensitive(entry, key, cJSON_CreateDoubleArray((const double[]){first, second}, 2));
}
/* The last tensor ("layer.bias", bytes [48, 60)) grown by one element: it ends 4 bytes past the file. */
static void edit_past_the_end(cJSON *header) {
    cJSON *entry = cJSON_GetObjectItemCaseSensitive(header, "layer.bias");
    cJSON_ReplaceItemInObjectCaseSensitive(entry, "shape", cJSON_CreateIntArray((const int[]){4}, 1));
    set_pair(entry, "data_offsets", 48, 64);
}
/* "layer.bias" moved 4 bytes back: it overlaps "layer.weight", and 4 bytes at the end belong to nobody. */
static void edit_overlap(cJSON *header) {
    set_pair(cJSON_GetObjectItemCaseSensitive(header, "layer.bias"), "data_offsets", 44, 56);
}
/* A shape of 2^62 x 4 floats for "scale", its 4 bytes dropped (safetensors_refusal): numel x 4 wraps to 0 in 64
 * bits, so only a check before multiplying refuses it. */
static void edit_wrapping_shape(cJSON *header) {
    cJSON *entry = cJSON_GetObjectItemCaseSensitive(header, "scale");
    cJSON_ReplaceItemInObjectCaseSensitive(entry, "shape",
                                           cJSON_CreateDoubleArray((const double[]){4611686018427387904.0, 4}, 2));
    set_pair(entry, "data_offsets", 60, 60);
}

static void safetensors_refusal(const buffer *seed, uint64_t *rng, buffer *out, char *what, size_t what_size) {
    size_t kind = below(rng, 6);
    if (kind <= 2) { /* truncated anywhere: in the length, the header or the data */
        buffer_set(out, seed->bytes, below(rng, seed->size));
        snprintf(what, what_size, "truncated to %zu of %zu bytes", out->size, seed->size);
    } else if (kind == 3) {
        buffer_set(out, seed->bytes, seed->size);
        buffer_splice(out, out->size, 0, "\0\0\0\0", 1 + below(rng, 4));
        snprintf(what, what_size, "%zu bytes after the last tensor", out->size - seed->size);
    } else {
        static void (*const edits[])(cJSON *) = {edit_past_the_end, edit_overlap, edit_wrapping_shape};
        static const char *const names[] = {"a tensor ending past the file", "overlapping tensors",
                                            "a shape whose byte count wraps"};
        size_t edit = below(rng, 3);
        safetensors_edit_header(seed, out, edits[edit]);
        if (edits[edit] == edit_wrapping_shape) out->size -= sizeof(float);
        snprintf(what, what_size, "%s", names[edit]);
    }
}

/* config.json as checkpoints write it (the tiny preset); an accepted one must save and load back the same. */
static int config_seed(fuzz_state *state) {
    qwen2_config config;
    char error[512];
    if (qwen2_config_preset(&config, "tiny", error, sizeof error) != 0 ||
        qwen2_config_save_json(&config, state->path, error, sizeof error) != 0) {
        fprintf(stderr, "fuzz_parsers: %s\n", error);
        return -1;
    }
    return 0;
}

static parse_result config_parse(fuzz_state *state, char *error, size_t error_size) {
    qwen2_config config, again;
    if (qwen2_config_load_json(&config, state->path, error, error_size) != 0) return PARSE_REFUSED;
    char copy[1300];
    snprintf(copy, sizeof copy, "%s.again", state->path);
    if (qwen2_config_save_json(&config, copy, error, error_size) != 0 ||
        qwen2_config_load_json(&again, copy, error, error_size) != 0)
        return PARSE_BROKEN;
    if (memcmp(&config, &again, sizeof config) != 0) {
        snprintf(error, error_size, "accepted, but saving and loading it again gives a different config");
        return PARSE_BROKEN;
    }
    return PARSE_ACCEPTED;
}

/* A required integer field given a value no model has (0 is one for num_hidden_layers: embeddings and head only). */
static void config_refusal(const buffer *seed, uint64_t *rng, buffer *out, char *what, size_t what_size) {
    static const char *const fields[] = {"\"vocab_size\":", "\"hidden_size\":", "\"num_hidden_layers\":",
                                         "\"num_attention_heads\":", "\"intermediate_size\":"};
    static const char *const values[] = {"-1", "1.5", "1e999", "-1e999", "2147483648", "1e300", "\"128\"",
                                         "null", "-2147483649"};
    const char *field = fields[below(rng, sizeof fields / sizeof fields[0])];
    const char *value = values[below(rng, sizeof values / sizeof values[0])];
    buffer_set(out, seed->bytes, seed->size);
    buffer_splice(out, out->size, 0, "", 1); /* a terminator for strstr, dropped below */
    const char *found = strstr((const char *)out->bytes, field);
    size_t at = (size_t)(found - (const char *)out->bytes) + strlen(field);
    while (out->bytes[at] == ' ' || out->bytes[at] == '\t') at++;
    size_t end = at;
    while (end < out->size && is_number_char(out->bytes[end])) end++;
    buffer_splice(out, at, end - at, value, strlen(value));
    out->size--;
    snprintf(what, what_size, "%s%s", field, value);
}

/* Token files: the loader's own checks, so each mutant's verdict is known exactly (tokens_valid). Two seeds: the old
 * headerless uint16 file, and the headered one from data_write_tokens at 4 bytes an id (narrowed to 2 in memory). */
static int tokens_bin_seed(fuzz_state *state) {
    buffer b = {0};
    for (int i = 0; i < 3 * TOKENS_SEQ_LEN; i++) {
        unsigned char id[2] = {(unsigned char)(i * 37 % TOKENS_VOCAB), (unsigned char)(i * 37 % TOKENS_VOCAB >> 8)};
        buffer_splice(&b, b.size, 0, id, 2);
    }
    int status = file_write(state->path, &b);
    free(b.bytes);
    return status;
}

/* What the loader must accept: a headered file (data.h) whose header agrees with its size, or, without the magic,
 * the old headerless uint16 ids; either way at least seq_len + 1 ids, each < vocab_size. */
static uint64_t little_endian(const unsigned char *bytes, int count) {
    uint64_t value = 0;
    for (int i = count - 1; i >= 0; i--) value = value << 8 | bytes[i];
    return value;
}

static int tokens_valid(const buffer *b) {
    size_t offset = 0, width = 2, count = b->size / 2;
    if (b->size >= 8 && memcmp(b->bytes, DATA_TOKENS_MAGIC, 8) == 0) {
        if (b->size < DATA_TOKENS_HEADER_BYTES) return 0;
        uint64_t version = little_endian(b->bytes + 8, 4), header_width = little_endian(b->bytes + 12, 4);
        uint64_t header_count = little_endian(b->bytes + 16, 8);
        size_t id_bytes = b->size - DATA_TOKENS_HEADER_BYTES;
        if (version != DATA_TOKENS_VERSION || (header_width != 2 && header_width != 4) ||
            id_bytes % header_width != 0 || id_bytes / header_width != header_count)
            return 0;
        offset = DATA_TOKENS_HEADER_BYTES, width = (size_t)header_width, count = (size_t)header_count;
    } else if (b->size % 2 != 0) {
        return 0;
    }
    if (count < TOKENS_SEQ_LEN + 1) return 0;
    for (size_t i = 0; i < count; i++)
        if (little_endian(b->bytes + offset + i * width, (int)width) >= TOKENS_VOCAB) return 0;
    return 1;
}

/* Opens the loader on state->path (text or .bin by the name) and reads a batch; an accepted stream's ids are all in
 * the vocabulary. */
static parse_result tokens_open(fuzz_state *state, char *error, size_t error_size) {
    data_loader loader;
    if (data_loader_open(&loader, state->ctx, state->path, TOKENS_VOCAB, 2, TOKENS_SEQ_LEN, 7, 1) != 0) {
        snprintf(error, error_size, "%s", state->ctx->error);
        return PARSE_REFUSED;
    }
    parse_result result = PARSE_ACCEPTED;
    int tokens[2 * TOKENS_SEQ_LEN], targets[2 * TOKENS_SEQ_LEN];
    for (int batch = 0; batch < 3; batch++) {
        data_next_batch(&loader, tokens, targets);
        for (int i = 0; i < 2 * TOKENS_SEQ_LEN; i++)
            if (tokens[i] < 0 || tokens[i] >= TOKENS_VOCAB || targets[i] < 0 || targets[i] >= TOKENS_VOCAB) {
                snprintf(error, error_size, "accepted, but batch %d holds id %d / %d outside the vocabulary", batch,
                         tokens[i], targets[i]);
                result = PARSE_BROKEN;
            }
    }
    data_loader_close(&loader);
    return result;
}

static parse_result tokens_bin_parse(fuzz_state *state, char *error, size_t error_size) {
    parse_result result = tokens_open(state, error, error_size);
    buffer b = {0};
    int expected = file_read(state->path, &b) == 0 && tokens_valid(&b);
    free(b.bytes);
    if (result != PARSE_BROKEN && (result == PARSE_ACCEPTED) != expected) {
        snprintf(error, error_size, "%s a file that has %s", result == PARSE_ACCEPTED ? "accepted" : "refused",
                 expected ? "whole ids in the vocabulary, enough of them" : "a bad size or id");
        return PARSE_BROKEN;
    }
    return result;
}

static void tokens_bin_refusal(const buffer *seed, uint64_t *rng, buffer *out, char *what, size_t what_size) {
    buffer_set(out, seed->bytes, seed->size);
    size_t kind = below(rng, 3);
    if (kind == 0) {
        out->size = below(rng, seed->size / 2) * 2 + 1;
        snprintf(what, what_size, "truncated to an odd %zu bytes", out->size);
    } else if (kind == 1) {
        out->size = below(rng, TOKENS_SEQ_LEN + 1) * 2;
        snprintf(what, what_size, "truncated to %zu tokens (fewer than seq_len + 1)", out->size / 2);
    } else {
        size_t at = below(rng, seed->size / 2) * 2, id = TOKENS_VOCAB + below(rng, 65536 - TOKENS_VOCAB);
        out->bytes[at] = (unsigned char)id;
        out->bytes[at + 1] = (unsigned char)(id >> 8);
        snprintf(what, what_size, "id %zu at token %zu", id, at / 2);
    }
}

static int tokens_header_seed(fuzz_state *state) {
    int ids[3 * TOKENS_SEQ_LEN];
    for (int i = 0; i < 3 * TOKENS_SEQ_LEN; i++) ids[i] = i * 37 % TOKENS_VOCAB;
    return data_write_tokens(state->path, ids, 3 * TOKENS_SEQ_LEN, 4, state->ctx->error, sizeof state->ctx->error);
}

/* A header that disagrees with its file, or a file cut short, or an id past the vocabulary. */
static void tokens_header_refusal(const buffer *seed, uint64_t *rng, buffer *out, char *what, size_t what_size) {
    static const uint64_t odd_fields[] = {0, 1, 3, 5, 8, 65535, 0xffffffffu};
    buffer_set(out, seed->bytes, seed->size);
    size_t ids = (seed->size - DATA_TOKENS_HEADER_BYTES) / 4;
    uint64_t odd = odd_fields[below(rng, sizeof odd_fields / sizeof odd_fields[0])];
    size_t kind = below(rng, 6);
    if (kind == 0) {
        size_t at = below(rng, 8);
        out->bytes[at] ^= (unsigned char)(1 + below(rng, 255));
        snprintf(what, what_size, "magic byte %zu changed (the old format then, ids outside the vocabulary)", at);
    } else if (kind == 1) {
        for (int i = 0; i < 4; i++) out->bytes[8 + i] = (unsigned char)(odd >> (8 * i));
        snprintf(what, what_size, "version %llu", (unsigned long long)odd);
    } else if (kind == 2) {
        for (int i = 0; i < 4; i++) out->bytes[12 + i] = (unsigned char)(odd >> (8 * i));
        snprintf(what, what_size, "width %llu", (unsigned long long)odd);
    } else if (kind == 3) {
        uint64_t count = below(rng, 2) ? ids + 1 + below(rng, 1000) : (uint64_t)1 << (62 + below(rng, 2));
        for (int i = 0; i < 8; i++) out->bytes[16 + i] = (unsigned char)(count >> (8 * i));
        snprintf(what, what_size, "count %llu, larger than the %zu ids", (unsigned long long)count, ids);
    } else if (kind == 4) {
        out->size = below(rng, seed->size);
        snprintf(what, what_size, "truncated to %zu of %zu bytes", out->size, seed->size);
    } else {
        size_t at = below(rng, ids);
        uint64_t id = TOKENS_VOCAB + below(rng, 0xffffffffu - TOKENS_VOCAB);
        for (int i = 0; i < 4; i++) out->bytes[DATA_TOKENS_HEADER_BYTES + 4 * at + i] = (unsigned char)(id >> (8 * i));
        snprintf(what, what_size, "id %llu at token %zu", (unsigned long long)id, at);
    }
}

static int tokens_text_seed(fuzz_state *state) {
    char text[4096];
    size_t length = data_generate_stories(3, 2, text, sizeof text);
    buffer b = {0};
    buffer_set(&b, text, length < sizeof text ? length : sizeof text - 1);
    int status = file_write(state->path, &b);
    free(b.bytes);
    return status;
}

static void set_number(cJSON *line, const char *key, double value) {
    if (cJSON_GetObjectItemCaseSensitive(line, key) != NULL)
        cJSON_ReplaceItemInObjectCaseSensitive(line, key, cJSON_CreateNumber(value));
}

/* The clock and malloc's addresses made the same on every run, so the mutants of a seed are too: ts = 10 x the line
 * number (collectives issued as they start), fixed wall and CPU times, each segment at (its rank of appearance) x
 * 2^32 with its blocks at the same offsets in it. */
static int jsonl_canonical(const char *path) {
    buffer text = {0}, out = {0};
    if (file_read(path, &text) != 0) return -1;
    buffer_splice(&text, text.size, 0, "", 1);
    uint64_t segments[16];
    int segment_count = 0, status = 0;
    char *save = NULL;
    for (char *row = strtok_r((char *)text.bytes, "\n", &save); row != NULL && status == 0;
         row = strtok_r(NULL, "\n", &save)) {
        cJSON *line = cJSON_Parse(row);
        const cJSON *kind = cJSON_GetObjectItemCaseSensitive(line, "kind");
        if (!cJSON_IsString(kind)) status = -1;
        int segment_line = status == 0 && strncmp(kind->valuestring, "segment_", 8) == 0;
        const cJSON *base = cJSON_GetObjectItemCaseSensitive(line, segment_line ? "addr" : "segment");
        if (status == 0 && cJSON_IsNumber(base)) {
            int found = 0;
            while (found < segment_count && segments[found] != (uint64_t)base->valuedouble) found++;
            if (found == segment_count && segment_count < 16) segments[segment_count++] = (uint64_t)base->valuedouble;
            double mapped = (double)((uint64_t)(found + 1) << 32);
            const cJSON *addr = cJSON_GetObjectItemCaseSensitive(line, "addr");
            set_number(line, "addr", mapped + (addr->valuedouble - base->valuedouble));
            set_number(line, "segment", mapped);
        }
        char *printed = NULL;
        if (status == 0) {
            size_t lines = 0;
            for (size_t i = 0; i < out.size; i++) lines += out.bytes[i] == '\n';
            set_number(line, "ts", 10.0 * (double)lines);
            set_number(line, "issue_ts", 10.0 * (double)lines);
            set_number(line, "unix_time", 1.7e9);
            set_number(line, "cpu_user", 0.01);
            set_number(line, "cpu_sys", 0.01);
            printed = cJSON_PrintUnformatted(line);
        }
        if (printed != NULL) {
            buffer_splice(&out, out.size, 0, printed, strlen(printed));
            buffer_splice(&out, out.size, 0, "\n", 1);
        } else status = -1;
        cJSON_free(printed);
        cJSON_Delete(line);
    }
    if (status == 0) status = file_write(path, &out);
    free(text.bytes);
    free(out.bytes);
    return status;
}

/* A run of two ranks as the runtime writes it: the real allocator's alloc / free / segment events (mem.c through the
 * trace sink), states, collectives on streams, a wait, compute, steps, a mark and the end. */
static int jsonl_seed(fuzz_state *state) {
    for (int rank = 0; rank < 2; rank++) {
        trace_sink sink;
        if (trace_open_run(&sink, state->dir, rank, 2, "fuzz-run") != 0) return -1;
        trace_reset_t0(&sink);
        mem_tracker mem;
        mem_init(&mem, rank, &sink, NULL);
        trace_fsdp_info options = {"Qwen2ForCausalLM", "FULL_SHARD", "BACKWARD_PRE", 1, 1, 0, 0, 2, 2, 0, NULL, NULL,
                                   NULL, 0};
        trace_fsdp(&sink, &options);
        void *shard = mem_alloc(&mem, 1000 * (size_t)(rank + 1), MEM_PARAM_SHARD, "layers.0.flat_param");
        trace_state(&sink, "layers.0", "HandleTrainingState", "IDLE", "FORWARD", "_pre_forward");
        void *full = mem_alloc(&mem, 2 << 20, MEM_PARAM_UNSHARDED, "layers.0._full_param_padded");
        trace_collective_info gather = {"all_gather", "layers.0", NULL, 1024, 4096, 2048, 2048, 0, "all_gather",
                                        10, 12, 20, NULL, 0, NULL, "float32"};
        trace_collective(&sink, &gather);
        trace_wait_info waited = {"all_gather", "all_gather", "layers.0", 0, "_pre_forward", 12, 20};
        trace_wait(&sink, &waited);
        trace_compute(&sink, "layers.0.forward", "layers.0", "forward", 32, 5);
        trace_collective_info scatter = {"reduce_scatter", "layers.0", "avg", 1024, 4096, 2048, 2048, 1, "compute",
                                         40, 40, 6, NULL, 0, NULL, "float32"};
        trace_collective(&sink, &scatter);
        mem_free(&mem, full);
        trace_mark(&sink, "after backward");
        trace_step(&sink, 1, 0, 5.5, 3 << 20, 22 << 20, 0.01);
        trace_step(&sink, 1, -1, 5.5, 3 << 20, 22 << 20, 0.01);
        mem_free(&mem, shard);
        mem_empty_cache(&mem);
        if (mem_shutdown(&mem) != 0) return -1;
        trace_end(&sink);
        trace_close(&sink);
        char path[1200];
        snprintf(path, sizeof path, "%s/rank%d.jsonl", state->dir, rank);
        if (jsonl_canonical(path) != 0) return -1;
    }
    return 0;
}

/* An accepted run must also export every view (what `fsdptrace all` and every lab's end do with it). */
static parse_result jsonl_parse(fuzz_state *state, char *error, size_t error_size) {
    trace_run run;
    int status = run_load(&run, state->dir, error, error_size);
    run_free(&run);
    if (status != 0) return PARSE_REFUSED;
    return trace_export_all(state->dir, error, error_size) == 0 ? PARSE_ACCEPTED : PARSE_BROKEN;
}

/* The meta line lost, a line cut in the middle that is not the last, or a count made negative. */
static void jsonl_refusal(const buffer *seed, uint64_t *rng, buffer *out, char *what, size_t what_size) {
    buffer_set(out, seed->bytes, seed->size);
    buffer_splice(out, out->size, 0, "", 1);
    const char *text = (const char *)out->bytes;
    size_t kind = below(rng, 3);
    if (kind == 0) {
        out->size = below(rng, (size_t)(strchr(text, '\n') - text));
        snprintf(what, what_size, "the meta line cut to %zu bytes", out->size);
        return;
    }
    if (kind == 1) {
        const char *line = strstr(text, "\"kind\":\"collective\"");
        const char *end = strchr(line, '\n');
        size_t cut = (size_t)(line - text) + below(rng, (size_t)(end - line));
        buffer_splice(out, cut, (size_t)(end - text) - cut, NULL, 0);
        snprintf(what, what_size, "the first collective's line cut at byte %zu, lines follow it", cut);
    } else {
        static const char *const keys[] = {"\"bytes\":", "\"seq\":", "\"size\":", "\"addr\":", "\"id\":"};
        size_t key = below(rng, sizeof keys / sizeof keys[0]);
        const char *line = strstr(text, key < 2 ? "\"kind\":\"collective\"" : "\"kind\":\"alloc\"");
        size_t at = (size_t)(strstr(line, keys[key]) - text) + strlen(keys[key]);
        buffer_splice(out, at, 0, "-1", 2); /* "-" alone would make 0 into -0, which is 0 */
        snprintf(what, what_size, "%s made negative", keys[key]);
    }
    out->size--;
}

/* out = seed with the first `from` replaced by `to` (`from` must be in it). */
static void replace_first(const buffer *seed, buffer *out, const char *from, const char *to) {
    buffer_set(out, seed->bytes, seed->size);
    buffer_splice(out, out->size, 0, "", 1); /* a terminator for strstr, dropped below */
    const char *found = strstr((const char *)out->bytes, from);
    size_t at = (size_t)(found - (const char *)out->bytes);
    buffer_splice(out, at, strlen(from), to, strlen(to));
    out->size--;
}

/* A sharded checkpoint's .metadata (core/io/dcp.h): two units on two ranks. An accepted one must keep every range
 * inside its unit and every file name inside the checkpoint's directory. */
static const char dcp_valid[] =
    "{\"format\":\"" DCP_FORMAT "\",\"version\":1,\"step\":4,\"data_windows\":\"64\",\"world_size\":2,"
    "\"strategy\":\"FULL_SHARD\",\"dtype\":\"float32\",\"optimizer\":\"AdamW\",\"settings\":{\"MBS\":\"4\","
    "\"LR\":\"0.001\"},\"units\":[{\"name\":\"root\",\"numel\":100,\"param_count\":2,\"layout_hash\":"
    "\"0123456789abcdef\",\"optimizer_step\":4},{\"name\":\"layers.0\",\"numel\":50,\"param_count\":1,"
    "\"layout_hash\":\"fedcba9876543210\",\"optimizer_step\":4}],\"files\":[{\"rank\":0,\"file\":\"__0_0.distcp\","
    "\"bytes\":1000,\"checksum\":\"00000000000000ff\",\"ranges\":[[0,50],[0,25]]},{\"rank\":1,\"file\":"
    "\"__1_0.distcp\",\"bytes\":1000,\"checksum\":\"00000000000000fe\",\"ranges\":[[50,100],[25,50]]}]}\n";

static int dcp_seed(fuzz_state *state) {
    buffer b = {0};
    buffer_set(&b, dcp_valid, sizeof dcp_valid - 1);
    int status = file_write(state->path, &b);
    free(b.bytes);
    return status;
}

static parse_result dcp_parse(fuzz_state *state, char *error, size_t error_size) {
    dcp_metadata m;
    if (dcp_read_metadata(state->dir, &m, error, error_size) != 0) return PARSE_REFUSED;
    parse_result result = PARSE_ACCEPTED;
    for (int f = 0; f < m.file_count; f++) {
        if (strchr(m.files[f].file, '/') != NULL || m.files[f].rank >= m.world_size) result = PARSE_BROKEN;
        for (int u = 0; u < m.unit_count; u++)
            for (int r = m.files[f].first_range[u]; r < m.files[f].first_range[u + 1]; r++)
                if (m.files[f].begin[r] > m.files[f].end[r] || m.files[f].end[r] > m.units[u].numel)
                    result = PARSE_BROKEN;
    }
    if (result == PARSE_BROKEN) snprintf(error, error_size, "accepted a file name or a range outside its bounds");
    dcp_metadata_free(&m);
    return result;
}

static void dcp_refusal(const buffer *seed, uint64_t *rng, buffer *out, char *what, size_t what_size) {
    static const char *const edits[][3] = {
        {"\"version\":1", "\"version\":2", "a format version from the future"},
        {"[[0,50],[0,25]]", "[[0,50],[0,51]]", "a range past its unit"},
        {"\"file\":\"__0_0.distcp\"", "\"file\":\"../x\"", "a file outside the directory"},
        {"\"data_windows\":\"64\"", "\"data_windows\":\"-64\"", "a negative data position"},
        {"\"world_size\":2", "\"world_size\":1", "more files than ranks"},
        {"\"rank\":1", "\"rank\":0", "two files of one rank"},
        {"\"checksum\":\"00000000000000ff\"", "\"checksum\":\"ff\"", "a checksum that is not 16 hex digits"},
        {"\"numel\":100", "\"numel\":1e300", "a unit size beyond 2^53"},
        {"\"optimizer_step\":4", "\"optimizer_step\":-4", "a negative optimizer step"},
    };
    size_t kind = below(rng, sizeof edits / sizeof edits[0] + 1);
    if (kind == sizeof edits / sizeof edits[0]) { /* cut before the closing brace: never JSON */
        buffer_set(out, seed->bytes, below(rng, seed->size - 2));
        snprintf(what, what_size, "truncated to %zu of %zu bytes", out->size, seed->size);
        return;
    }
    replace_first(seed, out, edits[kind][0], edits[kind][1]);
    snprintf(what, what_size, "%s", edits[kind][2]);
}

/* A tiktoken ranks file (core/data/tokenizer.c; tests/data/tiny_ranks.tiktoken: the 256 bytes and "Hi"). An accepted
 * vocabulary has a token for every byte, so any text must come back from decode(encode(text)) unchanged. */
static int tiktoken_seed(fuzz_state *state) {
    buffer b = {0};
    int status = file_read("tests/data/tiny_ranks.tiktoken", &b) == 0 ? file_write(state->path, &b) : -1;
    free(b.bytes);
    return status;
}

static parse_result tiktoken_parse(fuzz_state *state, char *error, size_t error_size) {
    tok_tokenizer t;
    if (tok_load(&t, state->path, error, error_size) != 0) return PARSE_REFUSED;
    static const char text[] = "Hi there, Hi!\n<|endoftext|>\n\xc3\xa9t\xc3\xa9 42";
    tok_ids ids = {0};
    char decoded[256];
    parse_result result = PARSE_ACCEPTED;
    if (tok_encode(&t, text, sizeof text - 1, &ids, error, error_size) != 0) result = PARSE_BROKEN;
    else if (tok_decode(&t, ids.ids, ids.count, decoded, sizeof decoded) != sizeof text - 1 ||
             memcmp(decoded, text, sizeof text - 1) != 0) {
        snprintf(error, error_size, "accepted, but decode(encode(text)) is not the text");
        result = PARSE_BROKEN;
    }
    tok_ids_free(&ids);
    tok_free(&t);
    return result;
}

static void tiktoken_refusal(const buffer *seed, uint64_t *rng, buffer *out, char *what, size_t what_size) {
    static const char *const edits[][3] = {
        {"SGk= 256", "SGk= x", "a rank that is not a number"},
        {"SGk= 256", "SGk=", "a line without a rank"},
        {"SGk= 256", "SGk= 255", "one id given twice"},
        {"QQ== 65\n", "", "no token for the byte 'A'"},
        {"SGk= 256", "SGk= -3", "a negative rank"},
        {"SGk= 256", "SGk= 99999999999999999999", "a rank beyond int"},
    };
    size_t kind = below(rng, sizeof edits / sizeof edits[0]);
    replace_first(seed, out, edits[kind][0], edits[kind][1]);
    snprintf(what, what_size, "%s", edits[kind][2]);
}

/* Every parser of a user's file, one entry each. A new parser is one more line here: its name, its file, whether it
 * is JSON, a writer of a valid file, the parse with its post-conditions, and the changes it must refuse (or NULL). */
static const fuzz_parser parsers[] = {
    {"safetensors", "model.safetensors", 1, safetensors_seed, safetensors_parse, safetensors_refusal},
    {"config.json", "config.json", 1, config_seed, config_parse, config_refusal},
    {"tokens.bin", "tokens.bin", 0, tokens_bin_seed, tokens_bin_parse, tokens_bin_refusal},
    {"tokens-header.bin", "tokens.bin", 0, tokens_header_seed, tokens_bin_parse, tokens_header_refusal},
    {"tokens.txt", "tokens.txt", 0, tokens_text_seed, tokens_open, NULL},
    {"rank0.jsonl", "rank0.jsonl", 1, jsonl_seed, jsonl_parse, jsonl_refusal},
    {"rank1.jsonl", "rank1.jsonl", 1, jsonl_seed, jsonl_parse, jsonl_refusal},
    {"dcp-metadata", ".metadata", 1, dcp_seed, dcp_parse, dcp_refusal},
    {"qwen.tiktoken", "qwen.tiktoken", 0, tiktoken_seed, tiktoken_parse, tiktoken_refusal},
};
#define PARSER_COUNT (sizeof parsers / sizeof parsers[0])

/* ---- the driver ---- */

static volatile sig_atomic_t current_parser = -1;

static void on_alarm(int signal_number) {
    (void)signal_number;
    static const char message[] = "fuzz_parsers: FAIL: a parser ran past the time limit on the mutant under OUT: ";
    ssize_t ignored = write(2, message, sizeof message - 1);
    if (current_parser >= 0) {
        const char *name = parsers[current_parser].name;
        ignored = write(2, name, strlen(name));
    }
    ignored = write(2, "\n", 1);
    (void)ignored;
    _exit(3);
}

static parse_result parse_timed(int index, fuzz_state *state, const buffer *input, char *error, size_t error_size) {
    if (file_write(state->path, input) != 0) {
        snprintf(error, error_size, "cannot write %s: %s", state->path, strerror(errno));
        return PARSE_BROKEN;
    }
    error[0] = '\0';
    current_parser = index;
    alarm(TIME_LIMIT_S);
    parse_result result = parsers[index].parse(state, error, error_size);
    alarm(0);
    current_parser = -1;
    return result;
}

/* Runs one parser: its seed accepted, its refusals refused, its mutants survived. Returns the failures. */
static int fuzz_one(int index, context *ctx, const char *outdir, uint64_t seed, long iterations) {
    const fuzz_parser *parser = &parsers[index];
    fuzz_state state = {.ctx = ctx};
    snprintf(state.dir, sizeof state.dir, "%s/fuzz-%s", outdir, parser->name);
    snprintf(state.path, sizeof state.path, "%s/%s", state.dir, parser->file_name);
    char error[2048];
    buffer valid = {0}, mutant = {0};
    int failures = 0;
    if (file_make_directories(state.dir) != 0 || parser->make_seed(&state) != 0 || file_read(state.path, &valid) != 0) {
        printf("FAIL %s: cannot write its valid file in %s\n", parser->name, state.dir);
        return 1;
    }
    if (parse_timed(index, &state, &valid, error, sizeof error) != PARSE_ACCEPTED) {
        printf("FAIL %s: the valid file is not accepted: %s\n", parser->name, error);
        failures++;
    }
    long accepted = 0, refused = 0;
    uint64_t rng = seed ^ (0x51ed270b27a3c0ffull * (uint64_t)(index + 1));
    for (int i = 0; parser->refusal != NULL && i < REFUSALS_PER_PARSER; i++) {
        char what[256];
        parser->refusal(&valid, &rng, &mutant, what, sizeof what);
        parse_result result = parse_timed(index, &state, &mutant, error, sizeof error);
        if (result != PARSE_REFUSED) {
            printf("FAIL %s: %s was %s%s%s\n", parser->name, what, result == PARSE_ACCEPTED ? "accepted" : "broken",
                   error[0] ? ": " : "", error);
            failures++;
        }
    }
    for (long iteration = 0; iteration < iterations; iteration++) {
        uint64_t mutation_rng = seed * 0x9e3779b97f4a7c15ull + (uint64_t)index * 1000003u + (uint64_t)iteration;
        buffer_set(&mutant, valid.bytes, valid.size);
        for (size_t count = 1 + below(&mutation_rng, 3); count > 0; count--)
            mutate_once(&mutant, &mutation_rng, parser->json);
        parse_result result = parse_timed(index, &state, &mutant, error, sizeof error);
        if (result == PARSE_BROKEN) {
            printf("FAIL %s: mutant %ld (seed %llu): %s\n", parser->name, iteration, (unsigned long long)seed, error);
            if (++failures > 20) break;
        }
        accepted += result == PARSE_ACCEPTED;
        refused += result == PARSE_REFUSED;
    }
    printf("%-12s %ld mutants: %ld accepted, %ld refused; %d must-refuse changes; %s\n", parser->name, iterations,
           accepted, refused, parser->refusal != NULL ? REFUSALS_PER_PARSER : 0, failures ? "FAILED" : "ok");
    free(valid.bytes);
    free(mutant.bytes);
    return failures;
}

int main(int argc, char **argv) {
    context ctx;
    session_open(&ctx, &argc, &argv, "fuzz_parsers", "runs/fuzz_parsers");
    char *end = NULL;
    uint64_t seed = argc >= 3 ? strtoull(argv[1], &end, 10) : 0;
    long iterations = argc >= 3 ? strtol(argv[2], NULL, 10) : -1;
    if (argc < 3 || argc > 4 || end == argv[1] || *end != '\0' || iterations < 0 || ctx.world_size != 1)
        world_exit_all(&ctx, 2, "usage: fuzz_parsers SEED ITERATIONS [PARSER]   (one process; files under OUT)\n");
    setvbuf(stdout, NULL, _IOLBF, 0); /* each parser's line before a sanitizer's report, should one abort us */
    signal(SIGALRM, on_alarm);
    int failures = 0, matched = 0;
    for (size_t index = 0; index < PARSER_COUNT; index++) {
        if (argc == 4 && strcmp(argv[3], parsers[index].name) != 0) continue;
        matched++;
        failures += fuzz_one((int)index, &ctx, ctx.outdir, seed, iterations);
    }
    if (matched == 0) world_exit_all(&ctx, 2, "fuzz_parsers: no parser named '%s'\n", argv[3]);
    printf("%s\n", failures ? "fuzz_parsers: FAILED" : "fuzz_parsers: every parser survived");
    int status = session_close(&ctx);
    return failures == 0 && status == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
