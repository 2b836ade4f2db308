/* tokenizer.c — Qwen2's byte-level BPE (see tokenizer.h). Loading fills the tokens by id and one hash table from
 * byte strings to ids; encoding is special tokens → NFC → PCRE2 pre-tokens → BPE per pre-token (cached). */
#define _POSIX_C_SOURCE 200809L
#define PCRE2_CODE_UNIT_WIDTH 8
#include "core/data/tokenizer.h"
#include "core/base/error.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <pcre2.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <utf8proc.h>

#define NO_RANK INT32_MAX
#define CACHE_SLOTS (1u << 15)      /* pre-tokens cached; the cache is cleared when half full */
#define CACHE_MAX_WORD 128          /* longer pre-tokens are rare: not cached */

/* The table's hash (not FNV-1a, core/base/hash.h: 8 bytes at a time; tokens are short, so this is most of a lookup's
 * cost. */
static uint64_t token_hash(const char *bytes, size_t length) {
    uint64_t hash = 0x9E3779B97F4A7C15ull ^ length, word;
    for (; length >= 8; bytes += 8, length -= 8) {
        memcpy(&word, bytes, 8);
        hash = (hash ^ word) * 0xff51afd7ed558ccdull;
        hash ^= hash >> 32;
    }
    word = 0;
    memcpy(&word, bytes, length);
    hash = (hash ^ word) * 0xc4ceb9fe1a85ec53ull;
    return hash ^ (hash >> 29);
}

/* The id of a byte string, or -1. */
static int lookup(const tok_tokenizer *t, const char *bytes, size_t length) {
    for (uint64_t slot = token_hash(bytes, length) & t->table_mask;; slot = (slot + 1) & t->table_mask) {
        uint32_t entry = t->table[slot];
        if (entry == 0) return -1;
        int id = (int)entry - 1;
        if (t->token_length[id] == length && memcmp(t->token_bytes + t->token_offset[id], bytes, length) == 0)
            return id;
    }
}

uint32_t tok_byte_to_unicode(uint8_t byte) {
    uint32_t unprintable_before = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        if (b == byte) return printable ? (uint32_t)b : 256 + unprintable_before;
        unprintable_before += !printable;
    }
    return 0;
}

const char *tok_default_path(void) {
    const char *path = getenv(TOK_PATH_ENV);
    return path != NULL && path[0] != '\0' ? path : TOK_DEFAULT_PATH;
}

/* ---- Loading ---- */

typedef struct builder {
    tok_tokenizer *t;
    int capacity;                 /* ids the arrays hold */
    size_t bytes_used, bytes_capacity;
    int16_t unicode_to_byte[324]; /* GPT-2's table inverted: code point → byte, -1 if none */
    char *error;
    size_t error_size;
} builder;

static int read_file(const char *path, char **text, size_t *length, char *error, size_t error_size) {
    FILE *file = fopen(path, "rb");
    if (file == NULL) {
        error_set(error, error_size, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    size_t capacity = 1 << 20, used = 0;
    char *buffer = malloc(capacity + 1);
    for (size_t got = 1; buffer != NULL && got > 0;) {
        if (used == capacity) {
            char *grown = realloc(buffer, 2 * capacity + 1);
            if (grown == NULL) break;
            buffer = grown, capacity *= 2;
        }
        got = fread(buffer + used, 1, capacity - used, file);
        used += got;
    }
    int read_error = ferror(file) || buffer == NULL || (used == capacity && !feof(file));
    fclose(file);
    if (read_error) {
        error_set(error, error_size, "%s: cannot read (%s)", path, buffer == NULL ? "out of memory" : "read error");
        free(buffer);
        return -1;
    }
    buffer[used] = '\0';
    *text = buffer, *length = used;
    return 0;
}

/* Gives `id` the token `bytes`. `where` names the line or value for messages. */
static int set_token(builder *b, int id, const char *bytes, size_t length, const char *where) {
    tok_tokenizer *t = b->t;
    if (id < 0 || id >= INT32_MAX - 1) {
        error_set(b->error, b->error_size, "%s: id %d is out of range", where, id);
        return -1;
    }
    if (length == 0 || length > UINT32_MAX / 2) {
        error_set(b->error, b->error_size, "%s: a token of %zu bytes", where, length);
        return -1;
    }
    if (id >= b->capacity) {
        int capacity = b->capacity > 0 ? b->capacity : 1024;
        while (capacity <= id) capacity = capacity > INT32_MAX / 2 ? INT32_MAX - 1 : capacity * 2;
        uint32_t *offset = realloc(t->token_offset, sizeof *offset * (size_t)capacity);
        if (offset != NULL) t->token_offset = offset;
        uint32_t *lengths = realloc(t->token_length, sizeof *lengths * (size_t)capacity);
        if (lengths != NULL) t->token_length = lengths;
        if (offset == NULL || lengths == NULL) goto out_of_memory;
        memset(t->token_length + b->capacity, 0, sizeof *lengths * (size_t)(capacity - b->capacity));
        b->capacity = capacity;
    }
    if (id < t->vocab_size && t->token_length[id] != 0) {
        error_set(b->error, b->error_size, "%s: id %d is given twice", where, id);
        return -1;
    }
    if (b->bytes_used + length > b->bytes_capacity) {
        size_t capacity = b->bytes_capacity > 0 ? b->bytes_capacity : 1 << 20;
        while (capacity < b->bytes_used + length) capacity *= 2;
        char *grown = realloc(t->token_bytes, capacity);
        if (grown == NULL) goto out_of_memory;
        t->token_bytes = grown, b->bytes_capacity = capacity;
    }
    if (b->bytes_used > UINT32_MAX - length) goto out_of_memory;
    memcpy(t->token_bytes + b->bytes_used, bytes, length);
    t->token_offset[id] = (uint32_t)b->bytes_used;
    t->token_length[id] = (uint32_t)length;
    b->bytes_used += length;
    if (id >= t->vocab_size) t->vocab_size = id + 1;
    return 0;
out_of_memory:
    error_set(b->error, b->error_size, "%s: out of memory", where);
    return -1;
}

/* A byte-level string (GPT-2's table: "Ġthe") to bytes in `out` (at most strlen(text) of them). */
static int unicode_to_bytes(const builder *b, const char *text, char *out, size_t *length, const char *where) {
    size_t used = 0;
    const utf8proc_uint8_t *p = (const utf8proc_uint8_t *)text;
    for (utf8proc_ssize_t step; *p != '\0'; p += step) {
        utf8proc_int32_t code_point;
        step = utf8proc_iterate(p, -1, &code_point);
        if (step < 0 || code_point >= 324 || b->unicode_to_byte[code_point] < 0) {
            error_set(b->error, b->error_size, "%s: '%s' is not a byte-level token: %s at byte %zu", where, text,
                      step < 0 ? "invalid UTF-8" : "a character outside GPT-2's byte-to-unicode table",
                      (size_t)(p - (const utf8proc_uint8_t *)text));
            return -1;
        }
        out[used++] = (char)b->unicode_to_byte[code_point];
    }
    *length = used;
    return 0;
}

static int base64_value(int c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    return c == '+' ? 62 : c == '/' ? 63 : -1;
}

/* Standard base64 with '=' padding; returns the byte count, or -1 if `text` is not base64. */
static long base64_decode(const char *text, size_t length, char *out) {
    if (length == 0 || length % 4 != 0) return -1;
    long used = 0;
    for (size_t i = 0; i < length; i += 4) {
        int values[4], padding = 0;
        for (int k = 0; k < 4; k++) {
            int c = (unsigned char)text[i + k];
            if (c == '=' && i + 4 == length && k >= 2 && (k == 3 || text[i + 3] == '=')) {
                values[k] = 0, padding++;
            } else if ((values[k] = base64_value(c)) < 0 || padding > 0) {
                return -1;
            }
        }
        uint32_t group = (uint32_t)values[0] << 18 | (uint32_t)values[1] << 12 | (uint32_t)values[2] << 6 |
                         (uint32_t)values[3];
        out[used++] = (char)(group >> 16);
        if (padding < 2) out[used++] = (char)(group >> 8);
        if (padding < 1) out[used++] = (char)group;
    }
    return used;
}

static int build_table(builder *b, const char *path);

/* qwen.tiktoken: "base64token rank" per line; the rank is the id and the merge priority. */
static int load_tiktoken(builder *b, const char *path, char *text, size_t length) {
    char where[700], *line = text, *end = text + length, bytes[1024];
    for (size_t number = 1; line < end; number++) {
        char *newline = memchr(line, '\n', (size_t)(end - line)), *line_end = newline != NULL ? newline : end;
        snprintf(where, sizeof where, "%s:%zu", path, number);
        if (line_end > line && line_end[-1] == '\r') line_end--;
        if (line_end == line) {
            if (newline == NULL) break;
            error_set(b->error, b->error_size, "%s: empty line", where);
            return -1;
        }
        char *space = memchr(line, ' ', (size_t)(line_end - line));
        long token_length = space != NULL && space - line <= (long)(4 * sizeof bytes / 3)
                                ? base64_decode(line, (size_t)(space - line), bytes)
                                : -1;
        if (token_length < 0) {
            error_set(b->error, b->error_size, "%s: '%.*s' is not 'base64token rank'", where,
                      (int)(line_end - line > 60 ? 60 : line_end - line), line);
            return -1;
        }
        char *rank_end;
        errno = 0;
        long rank = space + 1 < line_end && space[1] >= '0' && space[1] <= '9' ? strtol(space + 1, &rank_end, 10) : -1;
        if (rank < 0 || errno != 0 || rank_end != line_end || rank >= INT32_MAX - TOK_MAX_SPECIALS) {
            error_set(b->error, b->error_size, "%s: rank '%.*s' is not a number from 0 to %d", where,
                      (int)(line_end - space - 1 > 30 ? 30 : line_end - space - 1), space + 1,
                      INT32_MAX - TOK_MAX_SPECIALS - 1);
            return -1;
        }
        if (set_token(b, (int)rank, bytes, (size_t)token_length, where) != 0) return -1;
        line = newline != NULL ? newline + 1 : end;
    }
    if (b->t->vocab_size == 0) {
        error_set(b->error, b->error_size, "%s: no tokens", path);
        return -1;
    }
    if (build_table(b, path) != 0) return -1;
    for (int id = 0; id < b->t->vocab_size; id++)
        if (b->t->token_length[id] > 1) b->t->merge_rank[id] = id;
    return 0;
}

/* model.vocab (or vocab.json's object): byte-level string → id. */
static int load_vocab_object(builder *b, const cJSON *vocab, const char *where_vocab) {
    char where[700];
    if (!cJSON_IsObject(vocab) || vocab->child == NULL) {
        error_set(b->error, b->error_size, "%s: not an object of token → id", where_vocab);
        return -1;
    }
    const cJSON *entry;
    cJSON_ArrayForEach(entry, vocab) {
        snprintf(where, sizeof where, "%s[\"%.60s\"]", where_vocab, entry->string);
        char bytes[1024];
        size_t length;
        if (strlen(entry->string) >= sizeof bytes) {
            error_set(b->error, b->error_size, "%s: a token of %zu characters", where, strlen(entry->string));
            return -1;
        }
        if (!cJSON_IsNumber(entry) || entry->valuedouble != (double)entry->valueint) {
            error_set(b->error, b->error_size, "%s: the id is not an integer", where);
            return -1;
        }
        if (unicode_to_bytes(b, entry->string, bytes, &length, where) != 0 ||
            set_token(b, entry->valueint, bytes, length, where) != 0)
            return -1;
    }
    return 0;
}

/* One merge, "left right" (or the two strings apart): the merged token's rank is the first merge that makes it. */
static int add_merge(builder *b, const char *left, const char *right, int index, const char *where) {
    char bytes[2048];
    size_t left_length, right_length;
    if (strlen(left) >= sizeof bytes / 2 || strlen(right) >= sizeof bytes / 2) {
        error_set(b->error, b->error_size, "%s: a merge of over %zu characters", where, sizeof bytes / 2);
        return -1;
    }
    if (unicode_to_bytes(b, left, bytes, &left_length, where) != 0 ||
        unicode_to_bytes(b, right, bytes + left_length, &right_length, where) != 0)
        return -1;
    const tok_tokenizer *t = b->t;
    int left_id = lookup(t, bytes, left_length), right_id = lookup(t, bytes + left_length, right_length);
    int merged_id = lookup(t, bytes, left_length + right_length);
    if (left_id < 0 || right_id < 0 || merged_id < 0) {
        error_set(b->error, b->error_size, "%s: merge '%s %s': '%s%s' is not in the vocabulary", where, left, right,
                  left_id < 0 ? left : right_id < 0 ? right : left, left_id < 0 || right_id < 0 ? "" : right);
        return -1;
    }
    if (t->merge_rank[merged_id] == NO_RANK) t->merge_rank[merged_id] = index;
    return 0;
}

static int add_merge_line(builder *b, char *line, int index, const char *where) {
    char *space = strchr(line, ' ');
    if (space == NULL || space == line || space[1] == '\0' || strchr(space + 1, ' ') != NULL) {
        error_set(b->error, b->error_size, "%s: '%.60s' is not 'left right'", where, line);
        return -1;
    }
    *space = '\0';
    int status = add_merge(b, line, space + 1, index, where);
    *space = ' ';
    return status;
}

static int add_special(builder *b, const char *text, int id, const char *where) {
    tok_tokenizer *t = b->t;
    if (t->special_count == TOK_MAX_SPECIALS) {
        error_set(b->error, b->error_size, "%s: more than %d special tokens", where, TOK_MAX_SPECIALS);
        return -1;
    }
    size_t length = strlen(text);
    if (length == 0 || id < 0 || id >= INT32_MAX - 1) {
        error_set(b->error, b->error_size, "%s: special token '%s' with id %d", where, text, id);
        return -1;
    }
    if (id < t->vocab_size && t->token_length[id] != 0 &&
        (t->token_length[id] != length || memcmp(t->token_bytes + t->token_offset[id], text, length) != 0)) {
        error_set(b->error, b->error_size, "%s: special token '%s' takes id %d, which is another token's", where, text,
                  id);
        return -1;
    }
    for (int i = 0; i < t->special_count; i++)
        if (t->specials[i].id == id || strcmp(t->specials[i].text, text) == 0) {
            error_set(b->error, b->error_size, "%s: special token '%s' (id %d) is given twice", where, text, id);
            return -1;
        }
    tok_special *special = &t->specials[t->special_count];
    if ((special->text = malloc(length + 1)) == NULL) {
        error_set(b->error, b->error_size, "%s: out of memory", where);
        return -1;
    }
    memcpy(special->text, text, length + 1);
    special->length = length, special->id = id;
    t->special_count++;
    if (id >= t->vocab_size) t->vocab_size = id + 1;
    return 0;
}

/* Qwen2's three, after the highest id: where qwen.tiktoken and vocab.json (which do not list them) put them. */
static int add_qwen2_specials(builder *b, const char *path) {
    const char *texts[] = {TOK_ENDOFTEXT, TOK_IM_START, TOK_IM_END};
    int first = b->t->vocab_size;
    for (int i = 0; i < 3; i++)
        if (add_special(b, texts[i], first + i, path) != 0) return -1;
    return 0;
}

static int load_tokenizer_json(builder *b, const char *path, const char *text) {
    char where[700];
    cJSON *root = cJSON_Parse(text);
    if (root == NULL) {
        const char *at = cJSON_GetErrorPtr();
        error_set(b->error, b->error_size, "%s: not JSON (at byte %ld)", path, at != NULL ? (long)(at - text) : -1L);
        return -1;
    }
    int status = -1;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(model, "type");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (!cJSON_IsObject(model) || (type != NULL && (!cJSON_IsString(type) || strcmp(type->valuestring, "BPE") != 0))) {
        error_set(b->error, b->error_size, "%s: model is not a BPE model (model.type %s)", path,
                  cJSON_IsString(type) ? type->valuestring : "missing");
        goto done;
    }
    snprintf(where, sizeof where, "%s: model.vocab", path);
    if (load_vocab_object(b, cJSON_GetObjectItemCaseSensitive(model, "vocab"), where) != 0 ||
        build_table(b, path) != 0)
        goto done;
    if (!cJSON_IsArray(merges)) {
        error_set(b->error, b->error_size, "%s: model.merges is not an array", path);
        goto done;
    }
    int index = 0;
    const cJSON *merge;
    cJSON_ArrayForEach(merge, merges) {
        snprintf(where, sizeof where, "%s: model.merges[%d]", path, index);
        const cJSON *left = cJSON_GetArrayItem(merge, 0), *right = cJSON_GetArrayItem(merge, 1);
        if (cJSON_IsString(merge)) {
            char *copy = strdup(merge->valuestring);
            int merge_status = copy != NULL ? add_merge_line(b, copy, index, where) : -1;
            free(copy);
            if (merge_status != 0) goto done;
        } else if (cJSON_IsArray(merge) && cJSON_GetArraySize(merge) == 2 && cJSON_IsString(left) &&
                   cJSON_IsString(right)) {
            if (add_merge(b, left->valuestring, right->valuestring, index, where) != 0) goto done;
        } else {
            error_set(b->error, b->error_size, "%s: neither \"left right\" nor [\"left\", \"right\"]", where);
            goto done;
        }
        index++;
    }
    index = 0;
    const cJSON *token;
    cJSON_ArrayForEach(token, added) {
        snprintf(where, sizeof where, "%s: added_tokens[%d]", path, index++);
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(token, "content");
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(token, "id");
        if (!cJSON_IsString(content) || !cJSON_IsNumber(id)) {
            error_set(b->error, b->error_size, "%s: no string content and number id", where);
            goto done;
        }
        if (add_special(b, content->valuestring, id->valueint, where) != 0) goto done;
    }
    status = 0;
done:
    cJSON_Delete(root);
    return status;
}

/* vocab.json and merges.txt ("#version: ..." first, then "left right" per line). */
static int load_vocab_and_merges(builder *b, const char *vocab_path, const char *merges_path) {
    char *text, where[700];
    size_t length;
    if (read_file(vocab_path, &text, &length, b->error, b->error_size) != 0) return -1;
    cJSON *vocab = cJSON_Parse(text);
    free(text);
    if (vocab == NULL) {
        error_set(b->error, b->error_size, "%s: not JSON", vocab_path);
        return -1;
    }
    int status = load_vocab_object(b, vocab, vocab_path);
    cJSON_Delete(vocab);
    if (status != 0 || build_table(b, vocab_path) != 0) return -1;
    if (read_file(merges_path, &text, &length, b->error, b->error_size) != 0) return -1;
    int index = 0;
    char *line = text;
    for (size_t number = 1; status == 0 && line < text + length; number++) {
        char *newline = strchr(line, '\n');
        if (newline != NULL) *newline = '\0';
        size_t line_length = strlen(line);
        if (line_length > 0 && line[line_length - 1] == '\r') line[--line_length] = '\0';
        snprintf(where, sizeof where, "%s:%zu", merges_path, number);
        if (line_length > 0 && !(number == 1 && strncmp(line, "#version", 8) == 0))
            status = add_merge_line(b, line, index++, where);
        line = newline != NULL ? newline + 1 : text + length;
    }
    free(text);
    return status != 0 ? -1 : add_qwen2_specials(b, vocab_path);
}

/* The hash table over every token so far, the single bytes' ids, and merge ranks not yet given. */
static int build_table(builder *b, const char *path) {
    tok_tokenizer *t = b->t;
    uint64_t slots = 1024;
    while (slots < 2 * (uint64_t)t->vocab_size) slots *= 2;
    free(t->table), free(t->merge_rank);
    t->table = calloc(slots, sizeof *t->table);
    t->merge_rank = malloc(sizeof *t->merge_rank * (size_t)(t->vocab_size > 0 ? t->vocab_size : 1));
    if (t->table == NULL || t->merge_rank == NULL) {
        error_set(b->error, b->error_size, "%s: out of memory for %d tokens", path, t->vocab_size);
        return -1;
    }
    t->table_mask = slots - 1;
    for (int id = 0; id < t->vocab_size; id++) {
        t->merge_rank[id] = NO_RANK;
        if (t->token_length[id] == 0) continue;
        const char *bytes = t->token_bytes + t->token_offset[id];
        int existing = lookup(t, bytes, t->token_length[id]);
        if (existing >= 0) {
            error_set(b->error, b->error_size, "%s: ids %d and %d are the same token", path, existing, id);
            return -1;
        }
        uint64_t slot = token_hash(bytes, t->token_length[id]) & t->table_mask;
        while (t->table[slot] != 0) slot = (slot + 1) & t->table_mask;
        t->table[slot] = (uint32_t)id + 1;
    }
    for (int byte = 0; byte < 256; byte++) {
        char c = (char)byte;
        if ((t->byte_id[byte] = lookup(t, &c, 1)) < 0) {
            error_set(b->error, b->error_size, "%s: no token for the byte 0x%02X (every byte needs one)", path, byte);
            return -1;
        }
    }
    return 0;
}

static int compile_pattern(tok_tokenizer *t, char *error, size_t error_size) {
    int code;
    PCRE2_SIZE offset;
    pcre2_code *regex = pcre2_compile((PCRE2_SPTR)TOK_QWEN2_PATTERN, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
                                      &code, &offset, NULL);
    if (regex == NULL) {
        PCRE2_UCHAR message[256];
        pcre2_get_error_message(code, message, sizeof message);
        error_set(error, error_size, "the pre-tokenizer pattern does not compile at %zu: %s", (size_t)offset, message);
        return -1;
    }
    t->regex = regex;
    t->jit = pcre2_jit_compile(regex, PCRE2_JIT_COMPLETE) == 0;
    if ((t->match_data = pcre2_match_data_create_from_pattern(regex, NULL)) == NULL) {
        error_set(error, error_size, "out of memory for PCRE2 match data");
        return -1;
    }
    return 0;
}

static int has_suffix(const char *text, const char *suffix) {
    size_t length = strlen(text), suffix_length = strlen(suffix);
    return length >= suffix_length && strcmp(text + length - suffix_length, suffix) == 0;
}

static int is_file(const char *path) {
    struct stat info;
    return stat(path, &info) == 0 && S_ISREG(info.st_mode);
}

/* The file beside `path` named `name` ("dir/vocab.json" → "dir/merges.txt"). */
static void sibling(const char *path, const char *name, char *out, size_t out_size) {
    const char *slash = strrchr(path, '/');
    snprintf(out, out_size, "%.*s%s", slash != NULL ? (int)(slash - path + 1) : 0, path, name);
}

static int load_path(builder *b, const char *path) {
    struct stat info;
    char file[600], other[600];
    if (stat(path, &info) != 0) {
        error_set(b->error, b->error_size, "%s: %s (the Qwen2 vocabulary: scripts/get_qwen2_tokenizer.sh fetches it)",
                  path,
                  strerror(errno));
        return -1;
    }
    if (S_ISDIR(info.st_mode)) {
        const char *names[] = {"qwen.tiktoken", "tokenizer.json", "vocab.json"};
        for (int i = 0; i < 3; i++) {
            snprintf(file, sizeof file, "%s/%s", path, names[i]);
            if (is_file(file)) return load_path(b, file);
        }
        error_set(b->error, b->error_size, "%s: a directory without qwen.tiktoken, tokenizer.json or vocab.json", path);
        return -1;
    }
    snprintf(b->t->source, sizeof b->t->source, "%s", path);
    if (has_suffix(path, "vocab.json") || has_suffix(path, "merges.txt")) {
        int vocab_given = has_suffix(path, "vocab.json");
        sibling(path, vocab_given ? "merges.txt" : "vocab.json", other, sizeof other);
        return vocab_given ? load_vocab_and_merges(b, path, other) : load_vocab_and_merges(b, other, path);
    }
    char *text;
    size_t length;
    if (read_file(path, &text, &length, b->error, b->error_size) != 0) return -1;
    int status;
    if (has_suffix(path, ".json")) {
        status = load_tokenizer_json(b, path, text);
    } else {
        status = load_tiktoken(b, path, text, length);
        if (status == 0) status = add_qwen2_specials(b, path);
    }
    free(text);
    return status;
}

int tok_load(tok_tokenizer *t, const char *path, char *error, size_t error_size) {
    memset(t, 0, sizeof *t);
    builder b = {.t = t, .error = error, .error_size = error_size};
    for (int i = 0; i < 324; i++) b.unicode_to_byte[i] = -1;
    for (int byte = 0; byte < 256; byte++) b.unicode_to_byte[tok_byte_to_unicode((uint8_t)byte)] = (int16_t)byte;
    if (path == NULL) path = tok_default_path();
    if (load_path(&b, path) != 0 || compile_pattern(t, error, error_size) != 0) {
        tok_free(t);
        return -1;
    }
    return 0;
}

void tok_free(tok_tokenizer *t) {
    free(t->token_offset), free(t->token_length), free(t->token_bytes), free(t->merge_rank), free(t->table);
    for (int i = 0; i < t->special_count; i++) free(t->specials[i].text);
    pcre2_match_data_free(t->match_data);
    pcre2_code_free(t->regex);
    free(t->cache), free(t->cache_keys), free(t->cache_ids), free(t->scratch);
    memset(t, 0, sizeof *t);
}

int tok_vocab_size(const tok_tokenizer *t) { return t->vocab_size; }

int tok_special_id(const tok_tokenizer *t, const char *text) {
    for (int i = 0; i < t->special_count; i++)
        if (strcmp(t->specials[i].text, text) == 0) return t->specials[i].id;
    return -1;
}

const char *tok_token_bytes(const tok_tokenizer *t, int id, size_t *length) {
    if (id < 0 || id >= t->vocab_size || t->token_length[id] == 0) return NULL;
    for (int i = 0; i < t->special_count; i++)
        if (t->specials[i].id == id) return NULL;
    *length = t->token_length[id];
    return t->token_bytes + t->token_offset[id];
}

/* ---- Encoding ---- */

static int push_id(tok_ids *out, int id) {
    if (out->count == out->capacity) {
        size_t capacity = out->capacity > 0 ? 2 * out->capacity : 1024;
        int *grown = realloc(out->ids, sizeof *grown * capacity);
        if (grown == NULL) return -1;
        out->ids = grown, out->capacity = capacity;
    }
    out->ids[out->count++] = id;
    return 0;
}

void tok_ids_free(tok_ids *ids) {
    free(ids->ids);
    *ids = (tok_ids){0};
}

/* A candidate merge: parts [left, right) and [right, end) into token id, at rank. */
typedef struct merge_candidate {
    int rank, id;
    uint32_t left, right, end;
} merge_candidate;

static int before(const merge_candidate *a, const merge_candidate *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

static void heap_push(merge_candidate *heap, size_t *count, merge_candidate candidate) {
    size_t i = (*count)++;
    for (; i > 0 && before(&candidate, &heap[(i - 1) / 2]); i = (i - 1) / 2) heap[i] = heap[(i - 1) / 2];
    heap[i] = candidate;
}

static merge_candidate heap_pop(merge_candidate *heap, size_t *count) {
    merge_candidate top = heap[0], last = heap[--*count];
    size_t i = 0;
    for (size_t child; (child = 2 * i + 1) < *count; i = child) {
        if (child + 1 < *count && before(&heap[child + 1], &heap[child])) child++;
        if (!before(&heap[child], &last)) break;
        heap[i] = heap[child];
    }
    heap[i] = last;
    return top;
}

/* Queues the merge of the parts starting at `left` and `right` if their bytes together are a merged token. */
static void queue_pair(const tok_tokenizer *t, const char *word, const uint32_t *next, uint32_t left, uint32_t right,
                       merge_candidate *heap, size_t *count) {
    uint32_t end = next[right];
    int id = lookup(t, word + left, end - left);
    if (id >= 0 && t->merge_rank[id] != NO_RANK)
        heap_push(heap, count, (merge_candidate){t->merge_rank[id], id, left, right, end});
}

/* BPE over one pre-token of `length` >= 2 bytes: parts start as bytes; the lowest-ranked adjacent pair (leftmost
 * on ties) merges until none can. A heap of candidates, dropped when stale, keeps a long word O(n log n). */
static int bpe(tok_tokenizer *t, const char *word, uint32_t length, tok_ids *out) {
    size_t need =
        (size_t)(length + 1) * (2 * sizeof(uint32_t) + sizeof(int)) + 3 * (size_t)length * sizeof(merge_candidate);
    if (need > t->scratch_capacity) {
        void *grown = realloc(t->scratch, need);
        if (grown == NULL) return -1;
        t->scratch = grown, t->scratch_capacity = need;
    }
    merge_candidate *heap = t->scratch;
    uint32_t *next = (uint32_t *)(heap + 3 * (size_t)length), *previous = next + length + 1;
    int *part_id = (int *)(previous + length + 1);
    size_t count = 0;
    for (uint32_t i = 0; i <= length; i++) {
        next[i] = i + 1, previous[i] = i - 1;
        if (i < length) part_id[i] = t->byte_id[(unsigned char)word[i]];
    }
    for (uint32_t i = 0; i + 1 < length; i++) queue_pair(t, word, next, i, i + 1, heap, &count);
    while (count > 0) {
        merge_candidate merge = heap_pop(heap, &count);
        /* Stale when the left part has merged with something else, or the right one has grown. */
        if (next[merge.left] != merge.right || next[merge.right] != merge.end || previous[merge.right] != merge.left)
            continue;
        next[merge.left] = merge.end;
        previous[merge.end] = merge.left;
        previous[merge.right] = next[merge.right] = UINT32_MAX;
        part_id[merge.left] = merge.id;
        if (merge.left > 0) queue_pair(t, word, next, previous[merge.left], merge.left, heap, &count);
        if (merge.end < length) queue_pair(t, word, next, merge.left, merge.end, heap, &count);
    }
    for (uint32_t i = 0; i < length; i = next[i])
        if (push_id(out, part_id[i]) != 0) return -1;
    return 0;
}

static void cache_clear(tok_tokenizer *t) {
    memset(t->cache, 0, sizeof *t->cache * (t->cache_mask + 1));
    t->cache_used = t->cache_keys_used = t->cache_ids_used = 0;
}

static int cache_append(char **pool, size_t *used, size_t *capacity, const void *data, size_t bytes) {
    if (*used + bytes > *capacity) {
        size_t grown_capacity = *capacity > 0 ? *capacity : 1 << 16;
        while (grown_capacity < *used + bytes) grown_capacity *= 2;
        char *grown = realloc(*pool, grown_capacity);
        if (grown == NULL) return -1;
        *pool = grown, *capacity = grown_capacity;
    }
    memcpy(*pool + *used, data, bytes);
    *used += bytes;
    return 0;
}

/* One pre-token's ids, from the cache or by BPE (then cached). */
static int encode_word(tok_tokenizer *t, const char *word, size_t length, tok_ids *out) {
    if (length == 1) return push_id(out, t->byte_id[(unsigned char)word[0]]);
    if (length > CACHE_MAX_WORD) return length > UINT32_MAX / 8 ? -1 : bpe(t, word, (uint32_t)length, out);
    if (t->cache == NULL) {
        if ((t->cache = calloc(CACHE_SLOTS, sizeof *t->cache)) == NULL) return -1;
        t->cache_mask = CACHE_SLOTS - 1;
    }
    uint64_t hash = token_hash(word, length), slot = hash & t->cache_mask;
    for (;; slot = (slot + 1) & t->cache_mask) {
        const tok_cache_entry *entry = &t->cache[slot];
        if (entry->key_length == 0) break;
        if (entry->hash == hash && entry->key_length == length &&
            memcmp(t->cache_keys + entry->key_offset, word, length) == 0) {
            for (uint32_t i = 0; i < entry->ids_count; i++)
                if (push_id(out, t->cache_ids[entry->ids_offset + i]) != 0) return -1;
            return 0;
        }
    }
    size_t first = out->count;
    if (bpe(t, word, (uint32_t)length, out) != 0) return -1;
    if (2 * (t->cache_used + 1) > t->cache_mask + 1) {
        cache_clear(t);
        for (slot = hash & t->cache_mask; t->cache[slot].key_length != 0;) slot = (slot + 1) & t->cache_mask;
    }
    size_t ids_used = t->cache_ids_used * sizeof(int), ids_capacity = t->cache_ids_capacity * sizeof(int);
    char *ids_pool = (char *)t->cache_ids;
    uint32_t count = (uint32_t)(out->count - first);
    if (cache_append(&t->cache_keys, &t->cache_keys_used, &t->cache_keys_capacity, word, length) != 0 ||
        cache_append(&ids_pool, &ids_used, &ids_capacity, out->ids + first, count * sizeof(int)) != 0) {
        t->cache_ids = (int *)ids_pool, t->cache_ids_capacity = ids_capacity / sizeof(int);
        return -1;
    }
    t->cache_ids = (int *)ids_pool, t->cache_ids_capacity = ids_capacity / sizeof(int);
    t->cache[slot] = (tok_cache_entry){hash, (uint32_t)(t->cache_keys_used - length), (uint32_t)length,
                                       (uint32_t)(t->cache_ids_used), count};
    t->cache_ids_used += count;
    t->cache_used++;
    return 0;
}

/* The offset of the first byte that is not valid UTF-8 (`length` if all are): for the message only. */
static size_t invalid_utf8_at(const char *text, size_t length) {
    size_t at = 0;
    while (at < length) {
        utf8proc_int32_t code_point;
        utf8proc_ssize_t step = utf8proc_iterate((const utf8proc_uint8_t *)text + at, (utf8proc_ssize_t)(length - at),
                                                 &code_point);
        if (step <= 0) return at;
        at += (size_t)step;
    }
    return length;
}

/* Text with no special token: NFC, pre-tokens, BPE each. `offset` is where it starts in tok_encode's text. */
static int encode_ordinary(tok_tokenizer *t, const char *text, size_t length, size_t offset, tok_ids *out,
                           char *error, size_t error_size) {
    utf8proc_uint8_t *normalized = NULL;
    int ascii = 1;
    for (size_t i = 0; i < length && ascii; i++) ascii = (unsigned char)text[i] < 0x80;
    if (!ascii) { /* ASCII text is its own NFC */
        utf8proc_ssize_t normalized_length = utf8proc_map((const utf8proc_uint8_t *)text, (utf8proc_ssize_t)length,
                                                          &normalized, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        if (normalized_length < 0) {
            if (normalized_length == UTF8PROC_ERROR_INVALIDUTF8)
                error_set(error, error_size, "invalid UTF-8 at byte %zu", offset + invalid_utf8_at(text, length));
            else
                error_set(error, error_size, "NFC of %zu bytes at byte %zu: %s", length, offset,
                          utf8proc_errmsg(normalized_length));
            return -1;
        }
        text = (const char *)normalized, length = (size_t)normalized_length;
    }
    PCRE2_SIZE *match = pcre2_get_ovector_pointer(t->match_data);
    int status = 0;
    for (size_t at = 0; status == 0 && at < length;) {
        int found = t->jit ? pcre2_jit_match(t->regex, (PCRE2_SPTR)text, length, at, 0, t->match_data, NULL)
                           : pcre2_match(t->regex, (PCRE2_SPTR)text, length, at, PCRE2_NO_UTF_CHECK, t->match_data,
                                         NULL);
        size_t start = found > 0 ? match[0] : length, end = found > 0 ? match[1] : length;
        if (found < 0 && found != PCRE2_ERROR_NOMATCH) {
            PCRE2_UCHAR message[256];
            pcre2_get_error_message(found, message, sizeof message);
            error_set(error, error_size, "pre-tokenizing at byte %zu: %s", offset + at, message);
            status = -1;
            break;
        }
        if (found > 0 && end == start) { /* the pattern matches no empty string; a bug if it did */
            error_set(error, error_size, "pre-tokenizing at byte %zu: an empty match", offset + at);
            status = -1;
            break;
        }
        if (start > at) status = encode_word(t, text + at, start - at, out); /* text between matches: a piece too */
        if (status == 0 && end > start) status = encode_word(t, text + start, end - start, out);
        if (status != 0) error_set(error, error_size, "out of memory encoding %zu bytes", length);
        at = end;
    }
    free(normalized);
    return status;
}

/* The first special token at or after `from` (leftmost, then longest), or -1. */
static int find_special(const tok_tokenizer *t, const char *text, size_t length, size_t from, size_t *at) {
    for (size_t i = from; i < length; i++) {
        int best = -1;
        for (int s = 0; s < t->special_count; s++) {
            const tok_special *special = &t->specials[s];
            if (special->text[0] == text[i] && special->length <= length - i &&
                memcmp(special->text, text + i, special->length) == 0 &&
                (best < 0 || special->length > t->specials[best].length))
                best = s;
        }
        if (best >= 0) {
            *at = i;
            return best;
        }
    }
    return -1;
}

int tok_encode(tok_tokenizer *t, const char *text, size_t length, tok_ids *out, char *error, size_t error_size) {
    size_t count_before = out->count;
    for (size_t at = 0; at < length;) {
        size_t special_at = length;
        int special = find_special(t, text, length, at, &special_at);
        if (special_at > at && encode_ordinary(t, text + at, special_at - at, at, out, error, error_size) != 0) {
            out->count = count_before;
            return -1;
        }
        if (special < 0) break;
        if (push_id(out, t->specials[special].id) != 0) {
            error_set(error, error_size, "out of memory encoding %zu bytes", length);
            out->count = count_before;
            return -1;
        }
        at = special_at + t->specials[special].length;
    }
    return 0;
}

/* ---- Decoding ---- */

size_t tok_decode(const tok_tokenizer *t, const int *ids, size_t count, char *out, size_t out_size) {
    size_t total = 0;
    for (size_t i = 0; i < count; i++) {
        char unknown[40];
        size_t length = 0;
        const char *bytes = tok_token_bytes(t, ids[i], &length);
        for (int s = 0; bytes == NULL && s < t->special_count; s++)
            if (t->specials[s].id == ids[i]) bytes = t->specials[s].text, length = t->specials[s].length;
        if (bytes == NULL) {
            length = (size_t)snprintf(unknown, sizeof unknown, "<|token %d|>", ids[i]);
            bytes = unknown;
        }
        if (out_size > 0 && total < out_size - 1) {
            size_t room = out_size - 1 - total;
            memcpy(out + total, bytes, length < room ? length : room);
        }
        total += length;
    }
    if (out_size > 0) out[total < out_size - 1 ? total : out_size - 1] = '\0';
    return total;
}
