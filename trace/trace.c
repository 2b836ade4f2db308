/* trace.c — the JSONL event sink. See trace.h and EVENTS.md. */
#define _POSIX_C_SOURCE 200809L
#include "trace.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/resource.h>

static double monotonic_seconds(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + 1e-9 * (double)now.tv_nsec;
}

double trace_now_us(const trace_sink *sink) { return (monotonic_seconds() - sink->t0_seconds) * 1e6; }

/* Nanosecond resolution is plenty; rounding keeps lines short and diffable. */
static int64_t nanoseconds(double us) { return (int64_t)(us * 1000.0 + 0.5); }
static double rounded_us(double us) { return (double)nanoseconds(us) / 1000.0; }

/* A span's dur as the difference of its rounded end and its rounded start, not the rounded dur: rounding is
 * monotone, so spans that do not overlap (one stream's collectives, the host's waits and compute) still do not once
 * rounded, and ts + dur is the rounded end to the nanosecond. */
static double rounded_dur_us(double start_us, double dur_us) {
    return (double)(nanoseconds(start_us + dur_us) - nanoseconds(start_us)) / 1000.0;
}

/* A new event object with the fields every event has. NULL when tracing is off. */
static cJSON *event_begin(const trace_sink *sink, const char *kind, double ts_us) {
    if (sink == NULL || sink->file == NULL) return NULL;
    cJSON *event = cJSON_CreateObject();
    if (event == NULL) {
        fprintf(stderr, "rank %d: trace: out of memory building a '%s' event\n", sink->rank, kind);
        return NULL;
    }
    cJSON_AddStringToObject(event, "kind", kind);
    cJSON_AddNumberToObject(event, "ts", rounded_us(ts_us));
    cJSON_AddNumberToObject(event, "rank", sink->rank);
    return event;
}

static void add_string_or_null(cJSON *event, const char *key, const char *value) {
    if (value != NULL) cJSON_AddStringToObject(event, key, value);
    else cJSON_AddNullToObject(event, key);
}

/* Writes the event as one line and flushes it, so a crash loses at most this line. */
static void event_write(trace_sink *sink, cJSON *event) {
    if (event == NULL) return;
    char *line = cJSON_PrintUnformatted(event);
    cJSON_Delete(event);
    if (line == NULL) {
        fprintf(stderr, "rank %d: trace: cannot serialise an event for %s\n", sink->rank, sink->path);
        return;
    }
    if (fprintf(sink->file, "%s\n", line) < 0 || fflush(sink->file) != 0) {
        fprintf(stderr, "rank %d: trace: write to %s failed: %s; tracing stops here\n", sink->rank, sink->path,
                strerror(errno));
        fclose(sink->file);
        sink->file = NULL;
    }
    cJSON_free(line);
}

int trace_open(trace_sink *sink, const char *outdir, int rank, int world_size) {
    return trace_open_run(sink, outdir, rank, world_size, NULL);
}

void trace_end(trace_sink *sink) {
    cJSON *event = event_begin(sink, "end", trace_now_us(sink));
    if (event != NULL) event_write(sink, event);
}

int trace_open_run(trace_sink *sink, const char *outdir, int rank, int world_size, const char *run_id) {
    memset(sink, 0, sizeof *sink);
    sink->rank = rank;
    sink->world_size = world_size;
    sink->t0_seconds = monotonic_seconds();
    int written = snprintf(sink->path, sizeof sink->path, "%s/rank%d.jsonl", outdir, rank);
    if (written < 0 || (size_t)written >= sizeof sink->path) {
        fprintf(stderr, "rank %d: trace: output directory name too long: %s\n", rank, outdir);
        return -1;
    }
    sink->file = fopen(sink->path, "w");
    if (sink->file == NULL) {
        fprintf(stderr, "rank %d: trace: cannot open %s: %s\n", rank, sink->path, strerror(errno));
        return -1;
    }
    cJSON *meta = event_begin(sink, "meta", 0.0);
    cJSON_AddStringToObject(meta, "schema", TRACE_SCHEMA_NAME);
    cJSON_AddNumberToObject(meta, "version", TRACE_SCHEMA_VERSION);
    cJSON_AddNumberToObject(meta, "world", world_size);
    if (run_id != NULL) cJSON_AddStringToObject(meta, "run_id", run_id);
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    cJSON_AddNumberToObject(meta, "unix_time", (double)wall.tv_sec + 1e-9 * (double)wall.tv_nsec);
    event_write(sink, meta);
    return sink->file != NULL ? 0 : -1;
}

void trace_reset_t0(trace_sink *sink) {
    sink->t0_seconds = monotonic_seconds();
    trace_mark(sink, "t0");
}

void trace_close(trace_sink *sink) {
    if (sink->file != NULL) fclose(sink->file);
    sink->file = NULL;
}

void trace_state(trace_sink *sink, const char *unit, const char *machine, const char *from, const char *to,
                 const char *hook) {
    cJSON *event = event_begin(sink, "state", trace_now_us(sink));
    if (event == NULL) return;
    cJSON_AddStringToObject(event, "unit", unit);
    cJSON_AddStringToObject(event, "machine", machine);
    cJSON_AddStringToObject(event, "from", from);
    cJSON_AddStringToObject(event, "to", to);
    cJSON_AddStringToObject(event, "hook", hook);
    event_write(sink, event);
}

/* `group_ranks`: the world ranks of the group as a JSON array ("0,2" -> [0, 2]); absent for the world (every rank:
 * a world of thousands would repeat them in every event). */
static void add_group_ranks(cJSON *event, const char *ranks) {
    if (ranks == NULL) return;
    cJSON *array = cJSON_AddArrayToObject(event, "group_ranks");
    if (array == NULL) return;
    for (const char *p = ranks; *p;) {
        char *end = NULL;
        long rank = strtol(p, &end, 10);
        if (end == p) break;
        cJSON_AddItemToArray(array, cJSON_CreateNumber((double)rank));
        p = *end == ',' ? end + 1 : end;
    }
}

void trace_collective(trace_sink *sink, const trace_collective_info *info) {
    cJSON *event = event_begin(sink, "collective", info->start_us);
    if (event == NULL) return;
    cJSON_AddStringToObject(event, "op", info->op);
    cJSON_AddStringToObject(event, "unit", info->unit);
    add_string_or_null(event, "reduce", info->reduce);
    cJSON_AddNumberToObject(event, "count", (double)info->count);
    cJSON_AddNumberToObject(event, "bytes", (double)info->bytes);
    cJSON_AddStringToObject(event, "dtype", info->dtype ? info->dtype : "float32");
    cJSON_AddNumberToObject(event, "bytes_sent", (double)info->bytes_sent);
    cJSON_AddNumberToObject(event, "bytes_recv", (double)info->bytes_recv);
    cJSON_AddNumberToObject(event, "world", sink->world_size);
    cJSON_AddStringToObject(event, "group", info->group ? info->group : "world");
    cJSON_AddNumberToObject(event, "group_size", info->group_size > 0 ? info->group_size : sink->world_size);
    add_group_ranks(event, info->group_ranks);
    cJSON_AddNumberToObject(event, "seq", (double)info->seq);
    cJSON_AddStringToObject(event, "stream", info->stream ? info->stream : "compute");
    cJSON_AddNumberToObject(event, "issue_ts", rounded_us(info->issue_us));
    cJSON_AddNumberToObject(event, "dur", rounded_dur_us(info->start_us, info->dur_us));
    event_write(sink, event);
}

void trace_wait(trace_sink *sink, const trace_wait_info *info) {
    cJSON *event = event_begin(sink, "wait", info->start_us);
    if (event == NULL) return;
    cJSON_AddStringToObject(event, "stream", "compute");
    cJSON_AddStringToObject(event, "on", info->on);
    add_string_or_null(event, "op", info->op);
    add_string_or_null(event, "unit", info->unit);
    cJSON_AddNumberToObject(event, "seq", (double)info->seq);
    add_string_or_null(event, "hook", info->hook);
    cJSON_AddNumberToObject(event, "dur", rounded_dur_us(info->start_us, info->dur_us));
    event_write(sink, event);
}

void trace_fsdp(trace_sink *sink, const trace_fsdp_info *info) {
    cJSON *event = event_begin(sink, "fsdp", trace_now_us(sink));
    if (event == NULL) return;
    cJSON_AddStringToObject(event, "model", info->model);
    cJSON_AddStringToObject(event, "sharding_strategy", info->sharding_strategy);
    add_string_or_null(event, "backward_prefetch", info->backward_prefetch);
    cJSON_AddBoolToObject(event, "forward_prefetch", info->forward_prefetch);
    cJSON_AddBoolToObject(event, "limit_all_gathers", info->limit_all_gathers);
    cJSON_AddBoolToObject(event, "activation_checkpointing", info->activation_checkpointing);
    cJSON_AddBoolToObject(event, "no_sync", info->no_sync);
    cJSON_AddNumberToObject(event, "accumulation_steps", info->accumulation_steps);
    cJSON_AddNumberToObject(event, "unit_count", info->unit_count);
    cJSON_AddBoolToObject(event, "offload_params", info->offload_params);
    if (info->param_dtype == NULL) {
        cJSON_AddNullToObject(event, "mixed_precision");
    } else {
        cJSON *mixed = cJSON_AddObjectToObject(event, "mixed_precision");
        cJSON_AddStringToObject(mixed, "param_dtype", info->param_dtype);
        cJSON_AddStringToObject(mixed, "reduce_dtype", info->reduce_dtype);
        cJSON_AddStringToObject(mixed, "buffer_dtype", info->buffer_dtype);
        cJSON_AddBoolToObject(mixed, "keep_low_precision_grads", info->keep_low_precision_grads);
    }
    event_write(sink, event);
}

static void memory_event(trace_sink *sink, const char *kind, const trace_memory_info *info) {
    cJSON *event = event_begin(sink, kind, trace_now_us(sink));
    if (event == NULL) return;
    cJSON_AddNumberToObject(event, "id", (double)info->id);
    cJSON_AddNumberToObject(event, "bytes", (double)info->bytes);
    cJSON_AddStringToObject(event, "category", info->category);
    if (info->dtype != NULL) cJSON_AddStringToObject(event, "dtype", info->dtype);
    cJSON_AddStringToObject(event, "owner", info->owner);
    cJSON_AddNumberToObject(event, "live", (double)info->live_bytes);
    cJSON_AddNumberToObject(event, "category_live", (double)info->category_live_bytes);
    cJSON_AddNumberToObject(event, "addr", (double)info->address);
    cJSON_AddNumberToObject(event, "size", (double)info->size);
    cJSON_AddNumberToObject(event, "segment", (double)info->segment);
    cJSON_AddNumberToObject(event, "stream", info->stream);
    cJSON_AddNumberToObject(event, "reserved", (double)info->reserved_bytes);
    cJSON_AddStringToObject(event, "device", info->device ? info->device : "device");
    event_write(sink, event);
}

static void segment_event(trace_sink *sink, const char *kind, const trace_segment_info *info) {
    cJSON *event = event_begin(sink, kind, trace_now_us(sink));
    if (event == NULL) return;
    cJSON_AddNumberToObject(event, "id", (double)info->id);
    cJSON_AddNumberToObject(event, "addr", (double)info->address);
    cJSON_AddNumberToObject(event, "bytes", (double)info->bytes);
    cJSON_AddStringToObject(event, "pool", info->pool);
    cJSON_AddNumberToObject(event, "stream", info->stream);
    add_string_or_null(event, "owner", info->owner);
    add_string_or_null(event, "category", info->category);
    cJSON_AddNumberToObject(event, "reserved", (double)info->reserved_bytes);
    cJSON_AddStringToObject(event, "device", info->device ? info->device : "device");
    event_write(sink, event);
}

void trace_segment_alloc(trace_sink *sink, const trace_segment_info *info) {
    segment_event(sink, "segment_alloc", info);
}
void trace_segment_free(trace_sink *sink, const trace_segment_info *info) { segment_event(sink, "segment_free", info); }

void trace_allocator(trace_sink *sink, const trace_allocator_info *info) {
    cJSON *event = event_begin(sink, "allocator", trace_now_us(sink));
    if (event == NULL) return;
    cJSON_AddStringToObject(event, "mode", info->mode);
    cJSON_AddStringToObject(event, "backend", info->backend);
    cJSON_AddNumberToObject(event, "round", (double)info->round);
    cJSON_AddNumberToObject(event, "small_size", (double)info->small_size);
    cJSON_AddNumberToObject(event, "small_segment", (double)info->small_segment);
    cJSON_AddNumberToObject(event, "large_segment", (double)info->large_segment);
    cJSON_AddNumberToObject(event, "min_large_alloc", (double)info->min_large_alloc);
    cJSON_AddNumberToObject(event, "round_large", (double)info->round_large);
    cJSON_AddNumberToObject(event, "max_split_size", (double)info->max_split_size);
    cJSON_AddStringToObject(event, "device", info->device ? info->device : "device");
    cJSON_AddNumberToObject(event, "budget", (double)info->budget);
    event_write(sink, event);
}

void trace_copy(trace_sink *sink, const trace_copy_info *info) {
    cJSON *event = event_begin(sink, "copy", info->start_us);
    if (event == NULL) return;
    cJSON_AddStringToObject(event, "direction", info->direction);
    add_string_or_null(event, "unit", info->unit);
    cJSON_AddStringToObject(event, "owner", info->owner);
    cJSON_AddNumberToObject(event, "bytes", (double)info->bytes);
    cJSON_AddStringToObject(event, "stream", info->stream ? info->stream : "compute");
    cJSON_AddNumberToObject(event, "dur", rounded_dur_us(info->start_us, info->dur_us));
    event_write(sink, event);
}

void trace_alloc(trace_sink *sink, const trace_memory_info *info) { memory_event(sink, "alloc", info); }
void trace_free(trace_sink *sink, const trace_memory_info *info) { memory_event(sink, "free", info); }

void trace_compute(trace_sink *sink, const char *name, const char *unit, const char *phase, double start_us,
                   double dur_us) {
    cJSON *event = event_begin(sink, "compute", start_us);
    if (event == NULL) return;
    cJSON_AddStringToObject(event, "name", name);
    add_string_or_null(event, "unit", unit);
    add_string_or_null(event, "phase", phase);
    cJSON_AddStringToObject(event, "stream", "compute");
    cJSON_AddNumberToObject(event, "dur", rounded_dur_us(start_us, dur_us));
    event_write(sink, event);
}

void trace_step(trace_sink *sink, int step, int micro, double loss, uint64_t peak_bytes, uint64_t peak_reserved_bytes,
                double time_seconds) {
    cJSON *event = event_begin(sink, "step", trace_now_us(sink));
    if (event == NULL) return;
    cJSON_AddNumberToObject(event, "step", step);
    cJSON_AddNumberToObject(event, "micro", micro);
    cJSON_AddNumberToObject(event, "loss", loss);
    cJSON_AddNumberToObject(event, "peak_bytes", (double)peak_bytes);
    cJSON_AddNumberToObject(event, "peak_reserved", (double)peak_reserved_bytes);
    /* The process's CPU time so far: differences between steps split a step into user and system (kernel) time,
     * where page faults on fresh memory and the kernel-side copies of shared-memory MPI show up. */
    struct rusage usage;
    if (getrusage(RUSAGE_SELF, &usage) == 0) {
        cJSON_AddNumberToObject(event, "cpu_user",
                                (double)usage.ru_utime.tv_sec + 1e-6 * (double)usage.ru_utime.tv_usec);
        cJSON_AddNumberToObject(event, "cpu_sys",
                                (double)usage.ru_stime.tv_sec + 1e-6 * (double)usage.ru_stime.tv_usec);
    }
    cJSON_AddNumberToObject(event, "time", time_seconds);
    event_write(sink, event);
}

void trace_mark(trace_sink *sink, const char *text) {
    cJSON *event = event_begin(sink, "mark", trace_now_us(sink));
    if (event == NULL) return;
    cJSON_AddStringToObject(event, "text", text);
    event_write(sink, event);
}
