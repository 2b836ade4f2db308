/* run.c — reads a run directory's rank<R>.jsonl files into memory. See run.h and EVENTS.md. */
#define _POSIX_C_SOURCE 200809L
#include "run.h"
#include "trace.h"
#include "segments.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#if defined(__GNUC__)
#define PRINTF_LIKE(format_index, first_arg) __attribute__((format(printf, format_index, first_arg)))
#else
#define PRINTF_LIKE(format_index, first_arg)
#endif

const char *const run_categories[RUN_CATEGORY_COUNT] = {
    "param_shard", "param_unsharded", "grad_unsharded", "grad_shard",  "optim_state",
    "activation",  "checkpoint_input", "workspace",     "comm_buffer", "data",
    "kv_cache",    "param_shard_low_precision",
};

const char *const run_stream_names[RUN_STREAM_COUNT] = {"compute", "all_gather", "reduce_scatter"};

/* What one rank's reading needs besides the run: where it is, for messages. */
typedef struct rank_reader {
    trace_run *run;
    run_rank *rank;
    size_t line_number;
    size_t t0_event;      /* events before this index were written before the last "t0" mark */
    int meta_seen;
    char *error;
    size_t error_size;
} rank_reader;

PRINTF_LIKE(3, 4)
static int fail(char *error, size_t error_size, const char *format, ...) {
    if (error != NULL && error_size > 0) {
        va_list args;
        va_start(args, format);
        vsnprintf(error, error_size, format, args);
        va_end(args);
    }
    return -1;
}

PRINTF_LIKE(2, 3)
static int line_fail(rank_reader *reader, const char *format, ...) {
    char detail[512];
    va_list args;
    va_start(args, format);
    vsnprintf(detail, sizeof detail, format, args);
    va_end(args);
    return fail(reader->error, reader->error_size, "%s line %zu: %s", reader->rank->path, reader->line_number,
                detail);
}

/* ---- the run's strings, each stored once ---- */

static size_t text_hash(const char *text) {
    size_t hash = 1469598103934665603u;  /* FNV-1a: short keys, no need for anything stronger */
    for (; *text; text++) hash = (hash ^ (unsigned char)*text) * 1099511628211u;
    return hash;
}

static int strings_grow(run_strings *strings) {
    size_t slot_count = strings->slot_count ? 2 * strings->slot_count : 256;
    int *slots = malloc(slot_count * sizeof *slots);
    if (slots == NULL) return -1;
    for (size_t slot = 0; slot < slot_count; slot++) slots[slot] = RUN_NONE;
    for (size_t index = 0; index < strings->count; index++) {
        size_t slot = text_hash(strings->texts[index]) & (slot_count - 1);
        while (slots[slot] != RUN_NONE) slot = (slot + 1) & (slot_count - 1);
        slots[slot] = (int)index;
    }
    free(strings->slots);
    strings->slots = slots;
    strings->slot_count = slot_count;
    return 0;
}

static int strings_append(run_strings *strings, const char *text) {
    if (strings->count == strings->capacity) {
        size_t capacity = strings->capacity ? 2 * strings->capacity : 256;
        char **texts = realloc(strings->texts, capacity * sizeof *texts);
        if (texts == NULL) return RUN_NONE;
        strings->texts = texts;
        strings->capacity = capacity;
    }
    char *copy = strdup(text);
    if (copy == NULL) return RUN_NONE;
    strings->texts[strings->count] = copy;
    return (int)strings->count++;
}

/* The index of text in the run's strings, adding it if new; RUN_NONE when out of memory. */
static int strings_intern(run_strings *strings, const char *text) {
    if (2 * (strings->count + 1) > strings->slot_count && strings_grow(strings) != 0) return RUN_NONE;
    size_t slot = text_hash(text) & (strings->slot_count - 1);
    for (; strings->slots[slot] != RUN_NONE; slot = (slot + 1) & (strings->slot_count - 1))
        if (strcmp(strings->texts[strings->slots[slot]], text) == 0) return strings->slots[slot];
    int index = strings_append(strings, text);
    if (index != RUN_NONE) strings->slots[slot] = index;
    return index;
}

const char *run_string(const trace_run *run, int index) {
    if (index < 0 || (size_t)index >= run->strings.count) return "";
    return run->strings.texts[index];
}

/* ---- fields of a JSONL line ---- */

static int number_field(rank_reader *reader, const cJSON *line, const char *kind, const char *key, double *value) {
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(line, key);
    *value = 0;
    if (!cJSON_IsNumber(item)) return line_fail(reader, "'%s' event has no number field '%s'", kind, key);
    *value = item->valuedouble;
    return 0;
}

/* Byte counts and ids are whole numbers below 2^53, where a double is exact. */
static int count_field(rank_reader *reader, const cJSON *line, const char *kind, const char *key, uint64_t *value) {
    double number;
    *value = 0;
    if (number_field(reader, line, kind, key, &number) != 0) return -1;
    if (number < 0 || number > 9007199254740992.0 || (double)(uint64_t)number != number)
        return line_fail(reader, "'%s' field '%s' is %g, not a whole count", kind, key, number);
    *value = (uint64_t)number;
    return 0;
}

static int integer_field(rank_reader *reader, const cJSON *line, const char *kind, const char *key, int *value) {
    double number;
    *value = 0;
    if (number_field(reader, line, kind, key, &number) != 0) return -1;
    if (number < -1e9 || number > 1e9 || (double)(int)number != number)
        return line_fail(reader, "'%s' field '%s' is %g, not an integer", kind, key, number);
    *value = (int)number;
    return 0;
}

/* A string field; when `required` is 0 an absent or null field gives RUN_NONE. */
static int string_field(rank_reader *reader, const cJSON *line, const char *kind, const char *key, int required,
                        int *index) {
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(line, key);
    *index = RUN_NONE;
    if (!required && (item == NULL || cJSON_IsNull(item))) return 0;
    if (!cJSON_IsString(item)) return line_fail(reader, "'%s' event has no string field '%s'", kind, key);
    *index = strings_intern(&reader->run->strings, item->valuestring);
    if (*index == RUN_NONE) return line_fail(reader, "out of memory storing the string '%.60s'", item->valuestring);
    return 0;
}

/* An optional string field (see run.h's RUN_HAS_*): `field` goes into event->present when the line has the key at
 * all, null included, so the Chrome export can copy it as it was. */
static int optional_string(rank_reader *reader, const cJSON *line, const char *kind, const char *key, unsigned field,
                           run_event *event, int *index) {
    if (cJSON_GetObjectItemCaseSensitive(line, key) != NULL) event->present |= field;
    return string_field(reader, line, kind, key, 0, index);
}

/* A stream name (EVENTS.md version 3): one of run_stream_names, or an error naming the value. */
static int stream_field(rank_reader *reader, const cJSON *line, const char *kind, const char *key,
                        run_stream *stream) {
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(line, key);
    if (!cJSON_IsString(item)) return line_fail(reader, "'%s' event has no string field '%s'", kind, key);
    for (int index = 0; index < RUN_STREAM_COUNT; index++)
        if (strcmp(run_stream_names[index], item->valuestring) == 0) {
            *stream = (run_stream)index;
            return 0;
        }
    return line_fail(reader, "'%s' field '%s' is '%.40s', not a stream EVENTS.md names (compute, all_gather, "
                             "reduce_scatter)", kind, key, item->valuestring);
}

/* ---- one parser per kind ---- */

static int state_parse(rank_reader *reader, const cJSON *line, run_event *event) {
    if (string_field(reader, line, "state", "unit", 1, &event->unit) != 0) return -1;
    if (string_field(reader, line, "state", "machine", 1, &event->machine) != 0) return -1;
    if (string_field(reader, line, "state", "from", 1, &event->from) != 0) return -1;
    if (string_field(reader, line, "state", "to", 1, &event->to) != 0) return -1;
    return optional_string(reader, line, "state", "hook", RUN_HAS_HOOK, event, &event->hook);
}

/* Version 4: the collective's process group. "world" (or no field, version 3) is every rank; another group names
 * its world ranks in `group_ranks`, which must include the rank that wrote the line. */
static int group_fields(rank_reader *reader, const cJSON *line, run_event *event) {
    event->group = event->group_ranks = RUN_NONE;
    event->group_size = reader->run->world;
    if (string_field(reader, line, "collective", "group", 0, &event->group) != 0) return -1;
    if (event->group != RUN_NONE && strcmp(run_string(reader->run, event->group), "world") == 0)
        event->group = RUN_NONE;
    if (event->group == RUN_NONE) return 0;
    const cJSON *ranks = cJSON_GetObjectItemCaseSensitive(line, "group_ranks"), *item;
    if (!cJSON_IsArray(ranks) || cJSON_GetArraySize(ranks) < 1)
        return line_fail(reader, "collective seq %lld in group '%s' has no list 'group_ranks'", (long long)event->seq,
                         run_string(reader->run, event->group));
    char text[1024] = "";
    size_t used = 0;
    int mine = 0;
    cJSON_ArrayForEach(item, ranks) {
        if (!cJSON_IsNumber(item) || item->valuedouble < 0 || item->valuedouble >= reader->run->world ||
            item->valuedouble != (double)(int)item->valuedouble)
            return line_fail(reader, "collective seq %lld: group_ranks holds %s, not a rank of 0..%d",
                             (long long)event->seq, cJSON_IsNumber(item) ? "a number out of range" : "a non-number",
                             reader->run->world - 1);
        if (used < sizeof text)
            used += (size_t)snprintf(text + used, sizeof text - used, "%s%d", used ? "," : "", (int)item->valuedouble);
        mine |= (int)item->valuedouble == reader->rank->rank;
    }
    if (!mine)
        return line_fail(reader, "collective seq %lld: group_ranks does not hold rank %d, which ran it",
                         (long long)event->seq, reader->rank->rank);
    event->group_size = cJSON_GetArraySize(ranks);
    event->group_ranks = strings_intern(&reader->run->strings, text);
    if (event->group_ranks == RUN_NONE) return line_fail(reader, "out of memory storing the string '%.60s'", text);
    return 0;
}

static int collective_parse(rank_reader *reader, const cJSON *line, run_event *event) {
    if (string_field(reader, line, "collective", "op", 1, &event->label) != 0) return -1;
    if (optional_string(reader, line, "collective", "unit", RUN_HAS_UNIT, event, &event->unit) != 0) return -1;
    if (optional_string(reader, line, "collective", "reduce", RUN_HAS_REDUCE, event, &event->reduce) != 0) return -1;
    if (optional_string(reader, line, "collective", "dtype", RUN_HAS_DTYPE, event, &event->dtype) != 0) return -1;
    if (cJSON_GetObjectItemCaseSensitive(line, "count") != NULL) {
        event->present |= RUN_HAS_COUNT;
        if (count_field(reader, line, "collective", "count", &event->count) != 0) return -1;
    }
    if (count_field(reader, line, "collective", "bytes", &event->bytes) != 0) return -1;
    if (count_field(reader, line, "collective", "bytes_sent", &event->bytes_sent) != 0) return -1;
    if (count_field(reader, line, "collective", "bytes_recv", &event->bytes_recv) != 0) return -1;
    uint64_t seq;
    if (count_field(reader, line, "collective", "seq", &seq) != 0) return -1;
    event->seq = (int64_t)seq;
    if (number_field(reader, line, "collective", "dur", &event->dur) != 0) return -1;
    /* Version 2 had no streams: every collective blocked the host, which issued it as it started. */
    event->ran_on = RUN_STREAM_COMPUTE;
    event->issue_ts = event->ts;
    if (reader->rank->version < 3) return 0;
    if (stream_field(reader, line, "collective", "stream", &event->ran_on) != 0) return -1;
    if (number_field(reader, line, "collective", "issue_ts", &event->issue_ts) != 0) return -1;
    if (event->issue_ts < 0) event->issue_ts = 0;
    if (event->issue_ts > event->ts)
        return line_fail(reader, "collective seq %lld issued at %.3f, after its stream started it at %.3f",
                         (long long)event->seq, event->issue_ts, event->ts);
    return group_fields(reader, line, event);
}

static int category_index(const char *category) {
    for (int index = 0; index < RUN_CATEGORY_COUNT; index++)
        if (strcmp(run_categories[index], category) == 0) return index;
    return RUN_NONE;
}

static int memory_parse(rank_reader *reader, const cJSON *line, run_event *event) {
    const char *kind = event->kind == RUN_ALLOC ? "alloc" : "free";
    int category;
    if (count_field(reader, line, kind, "id", &event->id) != 0) return -1;
    if (count_field(reader, line, kind, "bytes", &event->bytes) != 0) return -1;
    if (string_field(reader, line, kind, "owner", 1, &event->label) != 0) return -1;
    if (string_field(reader, line, kind, "category", 1, &category) != 0) return -1;
    event->category = category_index(run_string(reader->run, category));
    if (event->category == RUN_NONE)
        return line_fail(reader, "%s of category '%s', which EVENTS.md does not list", kind,
                         run_string(reader->run, category));
    if (optional_string(reader, line, kind, "dtype", RUN_HAS_DTYPE, event, &event->dtype) != 0) return -1;
    if (count_field(reader, line, kind, "addr", &event->address) != 0) return -1;
    if (count_field(reader, line, kind, "size", &event->size) != 0) return -1;
    if (count_field(reader, line, kind, "segment", &event->segment) != 0) return -1;
    if (integer_field(reader, line, kind, "stream", &event->stream) != 0) return -1;
    if (count_field(reader, line, kind, "reserved", &event->reserved) != 0) return -1;
    if (event->size < event->bytes)
        return line_fail(reader, "%s id %llu: block size %llu is smaller than the %llu bytes asked for", kind,
                         (unsigned long long)event->id, (unsigned long long)event->size,
                         (unsigned long long)event->bytes);
    return 0;
}

static int segment_parse(rank_reader *reader, const cJSON *line, run_event *event) {
    const char *kind = event->kind == RUN_SEGMENT_ALLOC ? "segment_alloc" : "segment_free";
    int category;
    if (count_field(reader, line, kind, "id", &event->id) != 0) return -1;
    if (count_field(reader, line, kind, "addr", &event->address) != 0) return -1;
    if (count_field(reader, line, kind, "bytes", &event->bytes) != 0) return -1;
    if (string_field(reader, line, kind, "pool", 1, &event->pool) != 0) return -1;
    const char *pool = run_string(reader->run, event->pool);
    if (strcmp(pool, "small") != 0 && strcmp(pool, "large") != 0)
        return line_fail(reader, "%s pool '%s', expected 'small' or 'large'", kind, pool);
    if (integer_field(reader, line, kind, "stream", &event->stream) != 0) return -1;
    if (string_field(reader, line, kind, "owner", 0, &event->label) != 0) return -1;
    if (string_field(reader, line, kind, "category", 0, &category) != 0) return -1;
    if (category != RUN_NONE) {
        event->category = category_index(run_string(reader->run, category));
        if (event->category == RUN_NONE)
            return line_fail(reader, "%s of category '%s', which EVENTS.md does not list", kind,
                             run_string(reader->run, category));
    }
    return count_field(reader, line, kind, "reserved", &event->reserved);
}

static int text_copy(rank_reader *reader, const cJSON *line, const char *key, char *out, size_t out_size) {
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(line, key);
    if (!cJSON_IsString(item)) return line_fail(reader, "'allocator' event has no string field '%s'", key);
    snprintf(out, out_size, "%s", item->valuestring);
    return 0;
}

static int allocator_parse(rank_reader *reader, const cJSON *line, run_event *event) {
    (void)event;
    run_allocator *a = &reader->rank->allocator;
    if (text_copy(reader, line, "mode", a->mode, sizeof a->mode) != 0) return -1;
    if (text_copy(reader, line, "backend", a->backend, sizeof a->backend) != 0) return -1;
    if (strcmp(a->mode, "caching") != 0 && strcmp(a->mode, "malloc") != 0)
        return line_fail(reader, "allocator mode '%s', expected 'caching' or 'malloc'", a->mode);
    const struct { const char *key; uint64_t *value; } numbers[] = {
        {"round", &a->round}, {"small_size", &a->small_size}, {"small_segment", &a->small_segment},
        {"large_segment", &a->large_segment}, {"min_large_alloc", &a->min_large_alloc},
        {"round_large", &a->round_large}, {"max_split_size", &a->max_split_size},
    };
    for (size_t i = 0; i < sizeof numbers / sizeof numbers[0]; i++)
        if (count_field(reader, line, "allocator", numbers[i].key, numbers[i].value) != 0) return -1;
    a->seen = 1;
    return 0;
}

/* A copy between the pools (CPU offload): direction, unit, owner, bytes, the stream that ran it, dur. */
static int copy_parse(rank_reader *reader, const cJSON *line, run_event *event) {
    if (string_field(reader, line, "copy", "direction", 1, &event->direction) != 0) return -1;
    const char *direction = run_string(reader->run, event->direction);
    if (strcmp(direction, "h2d") != 0 && strcmp(direction, "d2h") != 0)
        return line_fail(reader, "copy direction '%s', expected 'h2d' or 'd2h'", direction);
    if (optional_string(reader, line, "copy", "unit", RUN_HAS_UNIT, event, &event->unit) != 0) return -1;
    if (string_field(reader, line, "copy", "owner", 1, &event->label) != 0) return -1;
    if (count_field(reader, line, "copy", "bytes", &event->bytes) != 0) return -1;
    if (stream_field(reader, line, "copy", "stream", &event->ran_on) != 0) return -1;
    return number_field(reader, line, "copy", "dur", &event->dur);
}

static int compute_parse(rank_reader *reader, const cJSON *line, run_event *event) {
    if (string_field(reader, line, "compute", "name", 1, &event->label) != 0) return -1;
    if (optional_string(reader, line, "compute", "unit", RUN_HAS_UNIT, event, &event->unit) != 0) return -1;
    if (optional_string(reader, line, "compute", "phase", RUN_HAS_PHASE, event, &event->phase) != 0) return -1;
    event->ran_on = RUN_STREAM_COMPUTE;
    if (reader->rank->version >= 3 && stream_field(reader, line, "compute", "stream", &event->ran_on) != 0) return -1;
    if (event->ran_on != RUN_STREAM_COMPUTE)
        return line_fail(reader, "compute span on stream '%s': compute runs on the compute stream",
                         run_stream_names[event->ran_on]);
    return number_field(reader, line, "compute", "dur", &event->dur);
}

/* The host blocked for a collective (or, `on` "compute", for the rate limiter's free event). */
static int wait_parse(rank_reader *reader, const cJSON *line, run_event *event) {
    if (stream_field(reader, line, "wait", "stream", &event->ran_on) != 0) return -1;
    if (event->ran_on != RUN_STREAM_COMPUTE)
        return line_fail(reader, "wait on stream '%s': only the host (the compute stream) waits",
                         run_stream_names[event->ran_on]);
    if (stream_field(reader, line, "wait", "on", &event->waited_on) != 0) return -1;
    if (string_field(reader, line, "wait", "op", 0, &event->label) != 0) return -1;
    if (optional_string(reader, line, "wait", "unit", RUN_HAS_UNIT, event, &event->unit) != 0) return -1;
    if (optional_string(reader, line, "wait", "hook", RUN_HAS_HOOK, event, &event->hook) != 0) return -1;
    double seq;
    if (number_field(reader, line, "wait", "seq", &seq) != 0) return -1;
    if (seq < -1 || seq > 9007199254740992.0 || (double)(int64_t)seq != seq)
        return line_fail(reader, "'wait' field 'seq' is %g, not a collective's seq or -1", seq);
    event->seq = (int64_t)seq;
    if (number_field(reader, line, "wait", "dur", &event->dur) != 0) return -1;
    if (event->dur < 0) return line_fail(reader, "'wait' dur %g < 0", event->dur);
    return 0;
}

/* A string field copied into a fixed buffer; null or absent gives "" when not required. */
static int fsdp_text(rank_reader *reader, const cJSON *line, const char *key, int required, char *text, size_t size) {
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(line, key);
    text[0] = '\0';
    if (!required && (item == NULL || cJSON_IsNull(item))) return 0;
    if (!cJSON_IsString(item)) return line_fail(reader, "'fsdp' event has no string field '%s'", key);
    snprintf(text, size, "%s", item->valuestring);
    return 0;
}

static int fsdp_flag(rank_reader *reader, const cJSON *line, const char *key, int *value) {
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(line, key);
    if (!cJSON_IsBool(item)) return line_fail(reader, "'fsdp' event has no true/false field '%s'", key);
    *value = cJSON_IsTrue(item);
    return 0;
}

/* The options go to run_rank.fsdp (few: one per runtime); the event keeps their index as its id. */
static int end_parse(rank_reader *reader, const cJSON *line, run_event *event) {
    (void)line, (void)event;
    reader->rank->ended = 1;
    return 0;
}

static int fsdp_parse(rank_reader *reader, const cJSON *line, run_event *event) {
    run_fsdp options = {.line = reader->line_number};
    if (fsdp_text(reader, line, "model", 1, options.model, sizeof options.model) != 0) return -1;
    if (fsdp_text(reader, line, "sharding_strategy", 1, options.sharding_strategy,
                  sizeof options.sharding_strategy) != 0)
        return -1;
    if (fsdp_text(reader, line, "backward_prefetch", 0, options.backward_prefetch,
                  sizeof options.backward_prefetch) != 0)
        return -1;
    const struct { const char *key; int *value; } flags[] = {
        {"forward_prefetch", &options.forward_prefetch}, {"limit_all_gathers", &options.limit_all_gathers},
        {"activation_checkpointing", &options.activation_checkpointing}, {"no_sync", &options.no_sync},
    };
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        if (fsdp_flag(reader, line, flags[i].key, flags[i].value) != 0) return -1;
    if (integer_field(reader, line, "fsdp", "accumulation_steps", &options.accumulation_steps) != 0) return -1;
    if (integer_field(reader, line, "fsdp", "unit_count", &options.unit_count) != 0) return -1;
    const cJSON *mixed = cJSON_GetObjectItemCaseSensitive(line, "mixed_precision");
    if (cJSON_IsObject(mixed) &&
        (fsdp_text(reader, mixed, "param_dtype", 1, options.param_dtype, sizeof options.param_dtype) != 0 ||
         fsdp_text(reader, mixed, "reduce_dtype", 1, options.reduce_dtype, sizeof options.reduce_dtype) != 0))
        return -1;
    run_rank *rank = reader->rank;
    run_fsdp *grown = realloc(rank->fsdp, (rank->fsdp_count + 1) * sizeof *grown);
    if (grown == NULL) return line_fail(reader, "out of memory holding %zu fsdp events", rank->fsdp_count + 1);
    rank->fsdp = grown;
    rank->fsdp[rank->fsdp_count] = options;
    event->id = rank->fsdp_count++;
    return 0;
}

static int step_parse(rank_reader *reader, const cJSON *line, run_event *event) {
    if (integer_field(reader, line, "step", "step", &event->step) != 0) return -1;
    if (integer_field(reader, line, "step", "micro", &event->micro) != 0) return -1;
    /* A diverged step's loss is NaN or infinite, which JSON writes as null: read back as NaN, so the views still load
     * the run that stopped on it (lab 05 stops at the first such step). */
    if (cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(line, "loss"))) event->loss = NAN;
    else if (number_field(reader, line, "step", "loss", &event->loss) != 0) return -1;
    if (count_field(reader, line, "step", "peak_bytes", &event->peak_bytes) != 0) return -1;
    if (count_field(reader, line, "step", "peak_reserved", &event->reserved) != 0) return -1;
    return number_field(reader, line, "step", "time", &event->seconds);
}

static int mark_parse(rank_reader *reader, const cJSON *line, run_event *event) {
    if (string_field(reader, line, "mark", "text", 1, &event->label) != 0) return -1;
    if (strcmp(run_string(reader->run, event->label), "t0") == 0) reader->t0_event = reader->rank->event_count;
    return 0;
}

typedef int (*event_parser)(rank_reader *reader, const cJSON *line, run_event *event);

static const struct {
    const char *kind;
    run_event_kind value;
    event_parser parse;
} parsers[] = {
    {"state", RUN_STATE, state_parse},       {"collective", RUN_COLLECTIVE, collective_parse},
    {"alloc", RUN_ALLOC, memory_parse},      {"free", RUN_FREE, memory_parse},
    {"compute", RUN_COMPUTE, compute_parse}, {"step", RUN_STEP, step_parse},
    {"mark", RUN_MARK, mark_parse},
    {"segment_alloc", RUN_SEGMENT_ALLOC, segment_parse}, {"segment_free", RUN_SEGMENT_FREE, segment_parse},
    {"allocator", RUN_ALLOCATOR, allocator_parse},
    {"wait", RUN_WAIT, wait_parse},          {"fsdp", RUN_FSDP, fsdp_parse},
    {"end", RUN_END, end_parse},
    {"copy", RUN_COPY, copy_parse},
};

/* The host pool's rank (run.h: run_rank.host), made at its first event. */
static run_rank *host_rank(rank_reader *reader) {
    run_rank *rank = reader->rank;
    if (rank->host == NULL) {
        rank->host = calloc(1, sizeof *rank->host);
        if (rank->host == NULL) return NULL;
        rank->host->rank = rank->rank;
        rank->host->version = rank->version;
        snprintf(rank->host->path, sizeof rank->host->path, "%s", rank->path);
    }
    return rank->host;
}

/* Version 4: memory events name their pool. "device" (or no field: older files) stays in the rank's events; "host"
 * goes to the host pool's rank. Returns the rank the event belongs to, or NULL with the error. */
static run_rank *pool_of(rank_reader *reader, const cJSON *line, run_event_kind kind) {
    if (kind != RUN_ALLOC && kind != RUN_FREE && kind != RUN_SEGMENT_ALLOC && kind != RUN_SEGMENT_FREE &&
        kind != RUN_ALLOCATOR)
        return reader->rank;
    const cJSON *device = cJSON_GetObjectItemCaseSensitive(line, "device");
    if (device == NULL || cJSON_IsNull(device)) return reader->rank;
    if (cJSON_IsString(device) && strcmp(device->valuestring, "device") == 0) return reader->rank;
    if (cJSON_IsString(device) && strcmp(device->valuestring, "host") == 0) {
        run_rank *host = host_rank(reader);
        if (host == NULL) line_fail(reader, "out of memory for the host pool's events");
        return host;
    }
    line_fail(reader, "device '%.40s', expected 'device' or 'host'",
              cJSON_IsString(device) ? device->valuestring : "?");
    return NULL;
}

static int rank_push(rank_reader *reader, const run_event *event) {
    run_rank *rank = reader->rank;
    if (rank->event_count == rank->event_capacity) {
        size_t capacity = rank->event_capacity ? 2 * rank->event_capacity : 1024;
        run_event *events = realloc(rank->events, capacity * sizeof *events);
        if (events == NULL) return line_fail(reader, "out of memory holding %zu events", capacity);
        rank->events = events;
        rank->event_capacity = capacity;
    }
    rank->events[rank->event_count++] = *event;
    return 0;
}

/* A kind this tool does not know is skipped with a warning: a newer writer may add one (EVENTS.md). */
static int event_parse(rank_reader *reader, const cJSON *line) {
    run_event event = {.line = reader->line_number, .label = RUN_NONE, .unit = RUN_NONE, .machine = RUN_NONE,
                       .from = RUN_NONE, .to = RUN_NONE, .hook = RUN_NONE, .phase = RUN_NONE,
                       .reduce = RUN_NONE, .category = RUN_NONE, .partner = RUN_NONE, .pool = RUN_NONE,
                       .dtype = RUN_NONE};
    const cJSON *kind = cJSON_GetObjectItemCaseSensitive(line, "kind");
    if (!cJSON_IsString(kind)) return line_fail(reader, "event has no string field 'kind'");
    if (strcmp(kind->valuestring, "meta") == 0)
        return line_fail(reader, "a second 'meta' line (only line 1 may be one)");
    if (number_field(reader, line, kind->valuestring, "ts", &event.ts) != 0) return -1;
    if (event.ts < 0) event.ts = 0;
    for (size_t index = 0; index < sizeof parsers / sizeof parsers[0]; index++) {
        if (strcmp(parsers[index].kind, kind->valuestring) != 0) continue;
        event.kind = parsers[index].value;
        run_rank *rank = reader->rank, *pool = pool_of(reader, line, event.kind);
        if (pool == NULL) return -1;
        reader->rank = pool; /* the host pool's events are read into (and checked as) a rank of their own */
        int status = parsers[index].parse(reader, line, &event);
        if (status == 0) status = rank_push(reader, &event);
        reader->rank = rank;
        return status;
    }
    fprintf(stderr, "warning: %s line %zu: unknown kind '%s' skipped\n", reader->rank->path, reader->line_number,
            kind->valuestring);
    return 0;
}

/* The meta line says whose file this is, so a file left from another run is not read as this one's. */
static int meta_check(rank_reader *reader, const cJSON *line) {
    const cJSON *kind = cJSON_GetObjectItemCaseSensitive(line, "kind");
    const cJSON *schema = cJSON_GetObjectItemCaseSensitive(line, "schema");
    double version, world, rank;
    if (!cJSON_IsString(kind)) return line_fail(reader, "the first line must be the 'meta' event");
    if (strcmp(kind->valuestring, "meta") != 0)
        return line_fail(reader, "the first line must be the 'meta' event, not '%s'", kind->valuestring);
    if (!cJSON_IsString(schema)) return line_fail(reader, "'meta' event has no string field 'schema'");
    if (strcmp(schema->valuestring, TRACE_SCHEMA_NAME) != 0)
        return line_fail(reader, "schema '%s', expected '%s'", schema->valuestring, TRACE_SCHEMA_NAME);
    if (number_field(reader, line, "meta", "version", &version) != 0) return -1;
    if (number_field(reader, line, "meta", "world", &world) != 0) return -1;
    if (number_field(reader, line, "meta", "rank", &rank) != 0) return -1;
    if (version == 1)
        return line_fail(reader, "schema version 1, from fsdplab before the caching allocator (no block addresses or "
                                 "segments); this tool reads version %d: run the lab again to record it",
                         TRACE_SCHEMA_VERSION);
    /* Version 3 added streams (collectives' `stream` and `issue_ts`, `wait` and `fsdp` events); a version-2 run
     * reads as one whose collectives all blocked on the compute stream. */
    /* Version 4 added process groups (collectives' `group`, `group_size`, `group_ranks`) and the pools (`device` on
     * memory events, `copy`) and dtypes (mixed precision); a version-3 run's collectives all ran in the world, on the
     * device pool alone, in float32. */
    if (version != TRACE_SCHEMA_VERSION && version != 3 && version != 2)
        return line_fail(reader, "schema version %g, this tool reads versions 2 to %d", version, TRACE_SCHEMA_VERSION);
    if (world < 1 || world > 1e6 || (double)(int)world != world)
        return line_fail(reader, "meta world %g is not a world size", world);
    if (reader->run->world != 0 && (int)world != reader->run->world)
        return line_fail(reader, "meta world is %g but rank0.jsonl says world %d", world, reader->run->world);
    if (rank != reader->rank->rank)
        return line_fail(reader, "meta rank is %g but the file name says rank %d", rank, reader->rank->rank);
    const cJSON *unix_time = cJSON_GetObjectItemCaseSensitive(line, "unix_time");
    if (cJSON_IsNumber(unix_time)) reader->rank->unix_time = unix_time->valuedouble;
    const cJSON *run_id = cJSON_GetObjectItemCaseSensitive(line, "run_id");
    if (cJSON_IsString(run_id)) snprintf(reader->rank->run_id, sizeof reader->rank->run_id, "%s", run_id->valuestring);
    /* Rank files of two runs in one directory (a smaller run into a bigger one's OUT, a rank restarted by hand) */
    if (reader->rank->rank > 0 && strcmp(reader->rank->run_id, reader->run->ranks[0].run_id) != 0)
        return line_fail(reader, "run id '%s', but rank0.jsonl has '%s': the rank files come from different runs",
                         reader->rank->run_id, reader->run->ranks[0].run_id);
    if (reader->run->world == 0) reader->run->world = (int)world;
    reader->rank->version = (int)version;
    reader->meta_seen = 1;
    return 0;
}

/* A line without its newline is the file's last and was cut short by a crash (the sink flushes whole lines). */
static int line_read(rank_reader *reader, char *text, size_t length) {
    int complete = length > 0 && text[length - 1] == '\n';
    if (complete) text[length - 1] = '\0';
    cJSON *line = cJSON_ParseWithOpts(text, NULL, 1);
    if (!cJSON_IsObject(line)) {
        cJSON_Delete(line);
        if (complete) return line_fail(reader, "not a JSON object: %.80s", text);
        fprintf(stderr, "warning: %s line %zu: skipping a last line cut short (%zu bytes, no newline)\n",
                reader->rank->path, reader->line_number, length);
        return 0;
    }
    int status = reader->line_number == 1 ? meta_check(reader, line) : event_parse(reader, line);
    cJSON_Delete(line);
    return status;
}

static int file_read(rank_reader *reader) {
    run_rank *rank = reader->rank;
    FILE *file = fopen(rank->path, "r");
    if (file == NULL) {
        if (rank->rank == 0) { /* say first whether the directory itself is wrong */
            int open_errno = errno;
            struct stat info;
            if (stat(reader->run->rundir, &info) != 0)
                return fail(reader->error, reader->error_size, "cannot open %s: no run directory %s (%s)", rank->path,
                            reader->run->rundir, strerror(errno));
            if (!S_ISDIR(info.st_mode))
                return fail(reader->error, reader->error_size, "run directory %s is not a directory",
                            reader->run->rundir);
            if (open_errno == ENOENT)
                return fail(reader->error, reader->error_size,
                            "%s has no rank0.jsonl: not a run directory (a lab's OUT)", reader->run->rundir);
            return fail(reader->error, reader->error_size, "cannot open %s: %s", rank->path, strerror(open_errno));
        }
        return fail(reader->error, reader->error_size, "cannot open %s: %s (rank0.jsonl says world %d)", rank->path,
                    strerror(errno), reader->run->world);
    }
    char *text = NULL;
    size_t text_capacity = 0;
    ssize_t length;
    int status = 0;
    while (status == 0 && (length = getline(&text, &text_capacity, file)) >= 0) {
        reader->line_number++;
        status = line_read(reader, text, (size_t)length);
    }
    if (status == 0 && ferror(file))
        status = fail(reader->error, reader->error_size, "error reading %s: %s", rank->path, strerror(errno));
    if (status == 0 && !reader->meta_seen)
        status = fail(reader->error, reader->error_size, "%s has no meta line (empty or cut short)", rank->path);
    rank->line_count = reader->line_number;
    free(text);
    fclose(file);
    return status;
}

/* ---- pairing each free with its alloc ---- */

typedef struct id_entry {
    uint64_t id;
    size_t event;
} id_entry;

static int id_compare(const void *left_pointer, const void *right_pointer) {
    const id_entry *left = left_pointer, *right = right_pointer;
    return (left->id > right->id) - (left->id < right->id);
}

static int free_match(rank_reader *reader, const id_entry *allocs, size_t alloc_count, size_t index) {
    run_rank *rank = reader->rank;
    run_event *freed = &rank->events[index];
    id_entry key = {freed->id, 0};
    const id_entry *found = bsearch(&key, allocs, alloc_count, sizeof *allocs, id_compare);
    reader->line_number = freed->line;
    if (found == NULL || found->event > index)
        return line_fail(reader, "free of id %llu (%llu bytes, %s) that was never allocated before it",
                         (unsigned long long)freed->id, (unsigned long long)freed->bytes,
                         run_string(reader->run, freed->label));
    run_event *allocated = &rank->events[found->event];
    if (allocated->partner != RUN_NONE)
        return line_fail(reader, "free of id %llu, already freed at line %zu", (unsigned long long)freed->id,
                         rank->events[allocated->partner].line);
    if (allocated->bytes != freed->bytes || allocated->category != freed->category)
        return line_fail(reader, "free of id %llu is %llu bytes of %s, but line %zu allocated %llu bytes of %s",
                         (unsigned long long)freed->id, (unsigned long long)freed->bytes,
                         run_categories[freed->category], allocated->line, (unsigned long long)allocated->bytes,
                         run_categories[allocated->category]);
    allocated->partner = (long)index;
    freed->partner = (long)found->event;
    return 0;
}

/* Sorting the allocations by id finds reused ids and lets each free find its alloc in log time. */
static int frees_match(rank_reader *reader) {
    run_rank *rank = reader->rank;
    id_entry *allocs = malloc((rank->event_count + 1) * sizeof *allocs);
    if (allocs == NULL) return fail(reader->error, reader->error_size, "out of memory pairing allocations");
    size_t alloc_count = 0;
    for (size_t index = 0; index < rank->event_count; index++)
        if (rank->events[index].kind == RUN_ALLOC) allocs[alloc_count++] = (id_entry){rank->events[index].id, index};
    qsort(allocs, alloc_count, sizeof *allocs, id_compare);
    int status = 0;
    for (size_t index = 1; status == 0 && index < alloc_count; index++) {
        if (allocs[index].id != allocs[index - 1].id) continue;
        reader->line_number = rank->events[allocs[index].event].line;
        status = line_fail(reader, "allocation id %llu reused (first at line %zu)",
                           (unsigned long long)allocs[index].id, rank->events[allocs[index - 1].event].line);
    }
    for (size_t index = 0; status == 0 && index < rank->event_count; index++)
        if (rank->events[index].kind == RUN_FREE) status = free_match(reader, allocs, alloc_count, index);
    free(allocs);
    return status;
}

/* Lines before the last t0 mark count from an older t0, so their ts would land after the run's start; they happened
 * before t0 and are put at 0, keeping file order. */
static void early_events_clamp(rank_reader *reader) {
    for (size_t index = 0; index < reader->t0_event; index++) {
        reader->rank->events[index].ts = 0;
        reader->rank->events[index].issue_ts = 0;
    }
}

static int rank_load(trace_run *run, int rank_index, char *error, size_t error_size) {
    run_rank *rank = &run->ranks[rank_index];
    rank->rank = rank_index;
    int written = snprintf(rank->path, sizeof rank->path, "%s/rank%d.jsonl", run->rundir, rank_index);
    if (written < 0 || (size_t)written >= sizeof rank->path)
        return fail(error, error_size, "run directory name too long: %s", run->rundir);
    rank_reader reader = {.run = run, .rank = rank, .error = error, .error_size = error_size};
    if (file_read(&reader) != 0) return -1;
    early_events_clamp(&reader);
    if (frees_match(&reader) != 0) return -1;
    segments_state state;
    int status = segments_replay(&state, rank, rank->event_count, error, error_size);
    segments_free(&state);
    if (status == 0 && rank->host != NULL) { /* the host pool: its own ids, blocks and segments */
        rank_reader host_reader = {.run = run, .rank = rank->host, .error = error, .error_size = error_size};
        if (frees_match(&host_reader) != 0) return -1;
        status = segments_replay(&state, rank->host, rank->host->event_count, error, error_size);
        segments_free(&state);
    }
    return status;
}

/* Rank 0 is read into a one-rank array first, since only its meta line tells how many ranks there are. */
int run_load(trace_run *run, const char *rundir, char *error, size_t error_size) {
    memset(run, 0, sizeof *run);
    int written = snprintf(run->rundir, sizeof run->rundir, "%s", rundir);
    if (written < 0 || (size_t)written >= sizeof run->rundir)
        return fail(error, error_size, "run directory name too long: %s", rundir);
    run->ranks = calloc(1, sizeof *run->ranks);
    if (run->ranks == NULL) return fail(error, error_size, "out of memory reading %s", rundir);
    run->rank_count = 1;
    if (rank_load(run, 0, error, error_size) != 0) return -1;
    run_rank *ranks = realloc(run->ranks, (size_t)run->world * sizeof *ranks);
    if (ranks == NULL) return fail(error, error_size, "out of memory for %d ranks", run->world);
    memset(ranks + 1, 0, (size_t)(run->world - 1) * sizeof *ranks);
    run->ranks = ranks;
    run->rank_count = run->world;
    for (int rank = 1; rank < run->world; rank++)
        if (rank_load(run, rank, error, error_size) != 0) return -1;
    return 0;
}

void run_free(trace_run *run) {
    for (int rank = 0; rank < run->rank_count; rank++) {
        free(run->ranks[rank].events);
        free(run->ranks[rank].fsdp);
        if (run->ranks[rank].host != NULL) free(run->ranks[rank].host->events);
        free(run->ranks[rank].host);
    }
    free(run->ranks);
    for (size_t index = 0; index < run->strings.count; index++) free(run->strings.texts[index]);
    free(run->strings.texts);
    free(run->strings.slots);
    memset(run, 0, sizeof *run);
}

cJSON *run_fsdp_json(const run_fsdp *options) {
    cJSON *object = cJSON_CreateObject();
    cJSON_AddStringToObject(object, "model", options->model);
    cJSON_AddStringToObject(object, "sharding_strategy", options->sharding_strategy);
    if (options->backward_prefetch[0]) cJSON_AddStringToObject(object, "backward_prefetch", options->backward_prefetch);
    else cJSON_AddNullToObject(object, "backward_prefetch");
    cJSON_AddBoolToObject(object, "forward_prefetch", options->forward_prefetch);
    cJSON_AddBoolToObject(object, "limit_all_gathers", options->limit_all_gathers);
    cJSON_AddBoolToObject(object, "activation_checkpointing", options->activation_checkpointing);
    cJSON_AddBoolToObject(object, "no_sync", options->no_sync);
    cJSON_AddNumberToObject(object, "accumulation_steps", options->accumulation_steps);
    cJSON_AddNumberToObject(object, "unit_count", options->unit_count);
    return object;
}
