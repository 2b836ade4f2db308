/* chrome.c — the Chrome export of a run directory. See chrome.h and EVENTS.md "Chrome export".
 *
 * One rank at a time: read its JSONL lines, turn each into a Chrome event, sort them by ts (the lines of spans
 * are written at their end but carry their start), write them. Only one rank's events are held in memory.
 */
#define _POSIX_C_SOURCE 200809L
#include "chrome.h"
#include "trace.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__)
#define PRINTF_LIKE(format_index, first_arg) __attribute__((format(printf, format_index, first_arg)))
#else
#define PRINTF_LIKE(format_index, first_arg)
#endif

/* EVENTS.md's categories in its order. Every counter sample carries all of them, so the viewer stacks the same
 * series in the same order at every sample and a category that drops to 0 is drawn as 0, not as its last value. */
static const char *const memory_categories[] = {
    "param_shard", "param_unsharded", "grad_unsharded", "grad_shard",       "optim_state",
    "activation",  "checkpoint_input", "workspace",     "comm_buffer",      "data",
};
enum { CATEGORY_COUNT = sizeof memory_categories / sizeof memory_categories[0] };

enum { TID_COMPUTE = 1, TID_COMM = 2, TID_MEMORY = 3 };
static const char *const thread_names[] = {NULL, "compute", "comm", "memory"};

enum { PATH_CAPACITY = 4096 };

/* A Chrome event waiting to be written. `order` is its JSONL line number: qsort is not stable, and events with
 * equal ts must keep file order (the memory counter's samples above all). */
typedef struct pending_event {
    double ts;
    size_t order;
    cJSON *event;
} pending_event;

/* Everything known while one rank's file is read. */
typedef struct rank_reader {
    char path[PATH_CAPACITY];
    int rank;
    int expected_world;   /* from rank0.jsonl; 0 while rank 0 itself is read */
    int world;            /* from this file's meta line; 0 until it is read */
    size_t line_number;
    size_t t0_line;       /* line of the last `mark` "t0"; events before it are drawn at ts 0 */
    int64_t category_live[CATEGORY_COUNT];
    pending_event *events;
    size_t event_count;
    size_t event_capacity;
    char *error;
    size_t error_size;
} rank_reader;

/* The output file, written one event per line so it greps and diffs well. */
typedef struct trace_writer {
    const char *path;     /* <out>.tmp, renamed to <out> once everything is written */
    FILE *file;           /* opened after rank 0 is read, so a wrong run directory is named as such */
    size_t events_written;
    int out_of_memory;    /* an event could not be printed; the export fails at the end */
} trace_writer;

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

/* An error about the line being read: the learner goes straight to that line of that file. */
PRINTF_LIKE(2, 3)
static int line_fail(rank_reader *reader, const char *format, ...) {
    char detail[512];
    va_list args;
    va_start(args, format);
    vsnprintf(detail, sizeof detail, format, args);
    va_end(args);
    return fail(reader->error, reader->error_size, "%s line %zu: %s", reader->path, reader->line_number, detail);
}

/* ---- reading fields of a JSONL line ---- */

static int required_number(rank_reader *reader, const cJSON *line, const char *kind, const char *key, double *value) {
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(line, key);
    *value = 0;  /* the compiler cannot see that callers stop on failure */
    if (!cJSON_IsNumber(item)) return line_fail(reader, "'%s' event has no number field '%s'", kind, key);
    *value = item->valuedouble;
    return 0;
}

static int required_string(rank_reader *reader, const cJSON *line, const char *kind, const char *key,
                           const char **value) {
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(line, key);
    *value = "";
    if (!cJSON_IsString(item)) return line_fail(reader, "'%s' event has no string field '%s'", kind, key);
    *value = item->valuestring;
    return 0;
}

/* Copies a field into the Chrome event's args when the line has it; absent fields stay absent. */
static void copy_field(cJSON *args, const cJSON *line, const char *key) {
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(line, key);
    if (item != NULL) cJSON_AddItemToObject(args, key, cJSON_Duplicate(item, 1));
}

static void copy_fields(cJSON *args, const cJSON *line, const char *const *keys, size_t key_count) {
    for (size_t index = 0; index < key_count; index++) copy_field(args, line, keys[index]);
}

/* ---- building Chrome events ---- */

static cJSON *chrome_event(const char *phase, const char *category, const char *name, int pid, int tid, double ts) {
    cJSON *event = cJSON_CreateObject();
    cJSON_AddStringToObject(event, "name", name);
    cJSON_AddStringToObject(event, "cat", category);
    cJSON_AddStringToObject(event, "ph", phase);
    cJSON_AddNumberToObject(event, "pid", pid);
    cJSON_AddNumberToObject(event, "tid", tid);
    cJSON_AddNumberToObject(event, "ts", ts);
    return event;
}

static cJSON *span_event(const char *category, const char *name, int pid, int tid, double ts, double dur) {
    cJSON *event = chrome_event("X", category, name, pid, tid, ts);
    cJSON_AddNumberToObject(event, "dur", dur);
    return event;
}

/* scope "t" marks one track (a state change of one unit); "p" draws a line across the whole rank (marks, steps). */
static cJSON *instant_event(const char *category, const char *name, int pid, const char *scope, double ts) {
    cJSON *event = chrome_event("i", category, name, pid, TID_COMPUTE, ts);
    cJSON_AddStringToObject(event, "s", scope);
    return event;
}

/* Metadata names the rows of the viewer; process_* ones have no tid (pass 0). */
static cJSON *metadata_event(const char *name, int pid, int tid, const char *arg_key, cJSON *arg_value) {
    cJSON *event = cJSON_CreateObject();
    cJSON_AddStringToObject(event, "name", name);
    cJSON_AddStringToObject(event, "ph", "M");
    cJSON_AddNumberToObject(event, "pid", pid);
    if (tid != 0) cJSON_AddNumberToObject(event, "tid", tid);
    cJSON *args = cJSON_AddObjectToObject(event, "args");
    if (!cJSON_AddItemToObject(args, arg_key, arg_value)) cJSON_Delete(arg_value);
    return event;
}

/* Flows v2: the same collective on every rank shares one bind_id. Rank 0 only starts the arrow, the last rank
 * only ends it and the ranks between continue it, so the viewer draws rank 0 → 1 → ... → N-1. */
static void add_flow(cJSON *event, int rank, int world, uint64_t seq) {
    if (world < 2) return;
    char bind_id[32];
    snprintf(bind_id, sizeof bind_id, "coll-%" PRIu64, seq);
    cJSON_AddStringToObject(event, "bind_id", bind_id);
    if (rank < world - 1) cJSON_AddTrueToObject(event, "flow_out");
    if (rank > 0) cJSON_AddTrueToObject(event, "flow_in");
}

static int reader_push(rank_reader *reader, cJSON *event, double ts) {
    if (event == NULL) return line_fail(reader, "out of memory building the Chrome event");
    if (reader->event_count == reader->event_capacity) {
        size_t capacity = reader->event_capacity ? 2 * reader->event_capacity : 1024;
        pending_event *events = realloc(reader->events, capacity * sizeof *events);
        if (events == NULL) {
            cJSON_Delete(event);
            return line_fail(reader, "out of memory holding %zu events", capacity);
        }
        reader->events = events;
        reader->event_capacity = capacity;
    }
    reader->events[reader->event_count++] = (pending_event){ts, reader->line_number, event};
    return 0;
}

/* ---- one converter per JSONL kind ---- */

static int pid_of(const rank_reader *reader) { return reader->rank + 1; }  /* some viewers hide pid 0 */

static int compute_convert(rank_reader *reader, const cJSON *line, double ts) {
    const char *name;
    double dur;
    if (required_string(reader, line, "compute", "name", &name) != 0) return -1;
    if (required_number(reader, line, "compute", "dur", &dur) != 0) return -1;
    cJSON *event = span_event("compute", name, pid_of(reader), TID_COMPUTE, ts, dur);
    static const char *const keys[] = {"unit", "phase"};
    copy_fields(cJSON_AddObjectToObject(event, "args"), line, keys, 2);
    return reader_push(reader, event, ts);
}

static int collective_convert(rank_reader *reader, const cJSON *line, double ts) {
    const char *op;
    double dur, seq;
    if (required_string(reader, line, "collective", "op", &op) != 0) return -1;
    if (required_number(reader, line, "collective", "dur", &dur) != 0) return -1;
    if (required_number(reader, line, "collective", "seq", &seq) != 0) return -1;
    /* seq becomes part of a bind_id, so it must be a whole count. */
    if (seq < 0 || seq > 9e15 || (double)(uint64_t)seq != seq)
        return line_fail(reader, "collective seq %g is not a count from 0", seq);
    cJSON *event = span_event("comm", op, pid_of(reader), TID_COMM, ts, dur);
    static const char *const keys[] = {"unit", "reduce", "count", "bytes", "bytes_sent", "bytes_recv", "seq"};
    copy_fields(cJSON_AddObjectToObject(event, "args"), line, keys, 7);
    add_flow(event, reader->rank, reader->world, (uint64_t)seq);
    return reader_push(reader, event, ts);
}

static int state_convert(rank_reader *reader, const cJSON *line, double ts) {
    const char *unit, *from, *to;
    if (required_string(reader, line, "state", "unit", &unit) != 0) return -1;
    if (required_string(reader, line, "state", "from", &from) != 0) return -1;
    if (required_string(reader, line, "state", "to", &to) != 0) return -1;
    char name[512];
    snprintf(name, sizeof name, "%s: %s -> %s", unit, from, to);
    cJSON *event = instant_event("state", name, pid_of(reader), "t", ts);
    static const char *const keys[] = {"machine", "hook"};
    copy_fields(cJSON_AddObjectToObject(event, "args"), line, keys, 2);
    return reader_push(reader, event, ts);
}

static int mark_convert(rank_reader *reader, const cJSON *line, double ts) {
    const char *text;
    if (required_string(reader, line, "mark", "text", &text) != 0) return -1;
    if (strcmp(text, "t0") == 0) reader->t0_line = reader->line_number;
    return reader_push(reader, instant_event("mark", text, pid_of(reader), "p", ts), ts);
}

static int step_convert(rank_reader *reader, const cJSON *line, double ts) {
    double step, micro;
    if (required_number(reader, line, "step", "step", &step) != 0) return -1;
    if (required_number(reader, line, "step", "micro", &micro) != 0) return -1;
    char name[96];
    if (micro < 0) snprintf(name, sizeof name, "step %.0f", step);
    else snprintf(name, sizeof name, "step %.0f micro %.0f", step, micro);
    cJSON *event = instant_event("step", name, pid_of(reader), "p", ts);
    static const char *const keys[] = {"step", "micro", "loss", "peak_bytes", "time"};
    copy_fields(cJSON_AddObjectToObject(event, "args"), line, keys, 5);
    return reader_push(reader, event, ts);
}

static int category_index(const char *category) {
    for (int index = 0; index < CATEGORY_COUNT; index++)
        if (strcmp(memory_categories[index], category) == 0) return index;
    return -1;
}

/* alloc and free move one category's running sum (in file order, which is the order the allocator saw them) and
 * emit a sample of every category: the counter is recomputed, not copied, so a wrong `live` in the JSONL shows. */
static int memory_convert(rank_reader *reader, const cJSON *line, double ts) {
    const char *kind, *category;
    double bytes;
    if (required_string(reader, line, "memory", "kind", &kind) != 0) return -1;
    if (required_string(reader, line, kind, "category", &category) != 0) return -1;
    if (required_number(reader, line, kind, "bytes", &bytes) != 0) return -1;
    int index = category_index(category);
    if (index < 0) return line_fail(reader, "%s of category '%s', which EVENTS.md does not list", kind, category);
    reader->category_live[index] += strcmp(kind, "alloc") == 0 ? (int64_t)bytes : -(int64_t)bytes;
    cJSON *event = chrome_event("C", "memory", "memory", pid_of(reader), TID_MEMORY, ts);
    cJSON *args = cJSON_AddObjectToObject(event, "args");
    for (int each = 0; each < CATEGORY_COUNT; each++)
        cJSON_AddNumberToObject(args, memory_categories[each], (double)reader->category_live[each]);
    return reader_push(reader, event, ts);
}

typedef int (*line_converter)(rank_reader *reader, const cJSON *line, double ts);

static const struct {
    const char *kind;
    line_converter convert;
} converters[] = {
    {"compute", compute_convert}, {"collective", collective_convert}, {"state", state_convert},
    {"mark", mark_convert},       {"step", step_convert},             {"alloc", memory_convert},
    {"free", memory_convert},
};

/* A kind this tool does not know is skipped with a warning: a newer writer may add one (EVENTS.md). */
static int line_convert(rank_reader *reader, const cJSON *line) {
    const char *kind;
    double ts;
    if (required_string(reader, line, "event", "kind", &kind) != 0) return -1;
    if (required_number(reader, line, kind, "ts", &ts) != 0) return -1;
    if (strcmp(kind, "meta") == 0) return line_fail(reader, "a second 'meta' line (only line 1 may be one)");
    if (ts < 0) ts = 0;  /* before t0: drawn at its start, like the lines before the t0 mark */
    for (size_t index = 0; index < sizeof converters / sizeof converters[0]; index++)
        if (strcmp(converters[index].kind, kind) == 0) return converters[index].convert(reader, line, ts);
    fprintf(stderr, "warning: %s line %zu: unknown kind '%s' skipped\n", reader->path, reader->line_number, kind);
    return 0;
}

/* The meta line says whose file this is: a file left from another run or copied from another rank must not be
 * merged silently. */
static int meta_check(rank_reader *reader, const cJSON *line) {
    const char *kind, *schema;
    double version, world, rank;
    if (required_string(reader, line, "first", "kind", &kind) != 0) return -1;
    if (strcmp(kind, "meta") != 0)
        return line_fail(reader, "the first line must be the 'meta' event, not '%s'", kind);
    if (required_string(reader, line, "meta", "schema", &schema) != 0) return -1;
    if (required_number(reader, line, "meta", "version", &version) != 0) return -1;
    if (required_number(reader, line, "meta", "world", &world) != 0) return -1;
    if (required_number(reader, line, "meta", "rank", &rank) != 0) return -1;
    if (strcmp(schema, TRACE_SCHEMA_NAME) != 0)
        return line_fail(reader, "schema '%s', expected '%s'", schema, TRACE_SCHEMA_NAME);
    if (version != TRACE_SCHEMA_VERSION)
        return line_fail(reader, "schema version %g, this tool reads version %d", version, TRACE_SCHEMA_VERSION);
    if (world < 1 || world > 1e6 || (double)(int)world != world)
        return line_fail(reader, "meta world %g is not a world size", world);
    if (reader->expected_world != 0 && (int)world != reader->expected_world)
        return line_fail(reader, "meta world is %d but rank0.jsonl says world %d", (int)world, reader->expected_world);
    if (rank != reader->rank)
        return line_fail(reader, "meta rank is %g but the file name says rank %d", rank, reader->rank);
    reader->world = (int)world;
    return 0;
}

/* getline keeps the newline; a line without one is the file's last and was cut short by a crash (the sink flushes
 * whole lines), so it is skipped rather than failing the whole export. */
static int line_read(rank_reader *reader, char *text, size_t length) {
    int complete = length > 0 && text[length - 1] == '\n';
    if (complete) text[length - 1] = '\0';
    const char *parse_end = NULL;
    cJSON *line = cJSON_ParseWithOpts(text, &parse_end, 1);
    if (!cJSON_IsObject(line)) {
        cJSON_Delete(line);
        if (!complete) {
            fprintf(stderr, "warning: %s line %zu: skipping a last line cut short (%zu bytes, no newline)\n",
                    reader->path, reader->line_number, length);
            return 0;
        }
        return line_fail(reader, "not a JSON object: %.80s", text);
    }
    int status = reader->line_number == 1 ? meta_check(reader, line) : line_convert(reader, line);
    cJSON_Delete(line);
    return status;
}

static int rank_file_read(rank_reader *reader) {
    FILE *file = fopen(reader->path, "r");
    if (file == NULL) {
        if (reader->rank == 0) return fail(reader->error, reader->error_size, "cannot open %s: %s", reader->path,
                                           strerror(errno));
        return fail(reader->error, reader->error_size, "cannot open %s: %s (rank0.jsonl says world %d)",
                    reader->path, strerror(errno), reader->expected_world);
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
        status = fail(reader->error, reader->error_size, "error reading %s: %s", reader->path, strerror(errno));
    if (status == 0 && reader->world == 0)
        status = fail(reader->error, reader->error_size, "%s has no meta line (empty or cut short)", reader->path);
    free(text);
    fclose(file);
    return status;
}

/* ---- ordering and writing ---- */

static int pending_compare(const void *left_pointer, const void *right_pointer) {
    const pending_event *left = left_pointer, *right = right_pointer;
    if (left->ts != right->ts) return left->ts < right->ts ? -1 : 1;
    return (left->order > right->order) - (left->order < right->order);
}

/* Events written before the (last) t0 mark count from an older t0, so their ts would land after the run's start;
 * they happened before t0 and are drawn at 0, in file order. */
static void events_order(rank_reader *reader) {
    for (size_t index = 0; index < reader->event_count; index++) {
        pending_event *pending = &reader->events[index];
        if (pending->order >= reader->t0_line) continue;
        pending->ts = 0;
        cJSON_SetNumberValue(cJSON_GetObjectItemCaseSensitive(pending->event, "ts"), 0);
    }
    if (reader->event_count > 0)  /* qsort's array must not be NULL, even empty */
        qsort(reader->events, reader->event_count, sizeof *reader->events, pending_compare);
}

/* Writes and frees the event. */
static void writer_put(trace_writer *writer, cJSON *event) {
    char *text = cJSON_PrintUnformatted(event);
    cJSON_Delete(event);
    if (text == NULL) {
        writer->out_of_memory = 1;
        return;
    }
    fprintf(writer->file, "%s%s", writer->events_written++ ? ",\n" : "", text);
    cJSON_free(text);
}

static void metadata_write(trace_writer *writer, int rank) {
    int pid = rank + 1;
    char process_name[32];
    snprintf(process_name, sizeof process_name, "rank %d", rank);
    writer_put(writer, metadata_event("process_name", pid, 0, "name", cJSON_CreateString(process_name)));
    writer_put(writer, metadata_event("process_sort_index", pid, 0, "sort_index", cJSON_CreateNumber(rank)));
    for (int tid = TID_COMPUTE; tid <= TID_MEMORY; tid++) {
        writer_put(writer, metadata_event("thread_name", pid, tid, "name", cJSON_CreateString(thread_names[tid])));
        writer_put(writer, metadata_event("thread_sort_index", pid, tid, "sort_index", cJSON_CreateNumber(tid)));
    }
}

static void reader_free(rank_reader *reader) {
    for (size_t index = 0; index < reader->event_count; index++) cJSON_Delete(reader->events[index].event);
    free(reader->events);
    reader->events = NULL;
    reader->event_count = 0;
}

static int writer_open(trace_writer *writer, char *error, size_t error_size) {
    if (writer->file != NULL) return 0;
    writer->file = fopen(writer->path, "w");
    if (writer->file == NULL) return fail(error, error_size, "cannot write %s: %s", writer->path, strerror(errno));
    fputs("{\"traceEvents\":[\n", writer->file);
    return 0;
}

/* Reads, orders and writes one rank; for rank 0 it also learns the world size. */
static int rank_export(const char *rundir, int rank, int *world, trace_writer *writer, char *error,
                       size_t error_size) {
    rank_reader reader = {.rank = rank, .expected_world = *world, .error = error, .error_size = error_size};
    int written = snprintf(reader.path, sizeof reader.path, "%s/rank%d.jsonl", rundir, rank);
    if (written < 0 || (size_t)written >= sizeof reader.path)
        return fail(error, error_size, "run directory name too long: %s", rundir);
    int status = rank_file_read(&reader);
    if (status == 0) status = writer_open(writer, error, error_size);
    if (status == 0) {
        if (rank == 0) *world = reader.world;
        events_order(&reader);
        metadata_write(writer, rank);
        for (size_t index = 0; index < reader.event_count; index++) writer_put(writer, reader.events[index].event);
        reader.event_count = 0;  /* writer_put freed them */
    }
    reader_free(&reader);
    return status;
}

static void footer_write(trace_writer *writer, const char *rundir, int world) {
    cJSON *other = cJSON_CreateObject();
    cJSON_AddStringToObject(other, "schema", TRACE_SCHEMA_NAME);
    cJSON_AddNumberToObject(other, "version", TRACE_SCHEMA_VERSION);
    cJSON_AddNumberToObject(other, "world", world);
    cJSON_AddStringToObject(other, "rundir", rundir);
    cJSON_AddStringToObject(other, "generator", "fsdptrace chrome");
    char *text = cJSON_PrintUnformatted(other);
    cJSON_Delete(other);
    if (text == NULL) {
        writer->out_of_memory = 1;
        return;
    }
    fprintf(writer->file, "\n],\n\"displayTimeUnit\":\"ms\",\n\"otherData\":%s}\n", text);
    cJSON_free(text);
}

/* Writes everything to <out>.tmp and renames it at the end, so a failed export never leaves a half trace.json that
 * a viewer would open without complaint. */
int chrome_export(const char *rundir, const char *out_path, char *error, size_t error_size) {
    char default_path[PATH_CAPACITY], temporary_path[PATH_CAPACITY + 8];
    if (out_path == NULL) {
        int written = snprintf(default_path, sizeof default_path, "%s/trace.json", rundir);
        if (written < 0 || (size_t)written >= sizeof default_path)
            return fail(error, error_size, "run directory name too long: %s", rundir);
        out_path = default_path;
    }
    int written = snprintf(temporary_path, sizeof temporary_path, "%s.tmp", out_path);
    if (written < 0 || (size_t)written >= sizeof temporary_path)
        return fail(error, error_size, "output path too long: %s", out_path);
    trace_writer writer = {.path = temporary_path};
    int world = 0, status = 0;
    for (int rank = 0; status == 0 && (rank == 0 || rank < world); rank++)
        status = rank_export(rundir, rank, &world, &writer, error, error_size);
    if (writer.file == NULL) return status;  /* failed before anything was written */
    if (status == 0) footer_write(&writer, rundir, world);
    int write_failed = ferror(writer.file);
    if (fclose(writer.file) != 0) write_failed = 1;
    if (status == 0 && writer.out_of_memory)
        status = fail(error, error_size, "out of memory printing an event for %s", temporary_path);
    if (status == 0 && write_failed)
        status = fail(error, error_size, "cannot write %s: %s", temporary_path, strerror(errno));
    if (status == 0 && rename(temporary_path, out_path) != 0)
        status = fail(error, error_size, "cannot rename %s to %s: %s", temporary_path, out_path, strerror(errno));
    if (status != 0) remove(temporary_path);
    return status;
}
