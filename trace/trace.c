/* trace.c — the JSONL event sink. See trace.h and EVENTS.md. */
#define _POSIX_C_SOURCE 200809L
#include "trace.h"

#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
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

/* The writer. Each event is printed straight into the sink's buffer as cJSON_PrintUnformatted would print the object
 * (same keys in the same order, same number and string forms), without building a tree: one event cost ~6 us as a
 * cJSON tree, printed and flushed; printed into the buffer it costs well under a microsecond. The buffer goes to the
 * file at each step's end (trace_step), when it holds TRACE_FLUSH_BYTES, and on trace_flush / trace_end /
 * trace_close; a fatal signal writes what it holds (trace_open installs the handler). */
#define TRACE_FLUSH_BYTES ((size_t)1 << 20)

/* The sink a fatal signal writes out: the last one opened (a program traces into one sink at a time). */
static trace_sink *volatile signal_sink;

/* Room for `bytes` more in the buffer; 0, or -1 (out of memory: the event is dropped, with a message once). */
static int buffer_reserve(trace_sink *sink, size_t bytes) {
    if (sink->length + bytes <= sink->capacity) return 0;
    size_t capacity = sink->capacity > 0 ? sink->capacity : 4096;
    while (capacity < sink->length + bytes) capacity *= 2;
    char *grown = realloc(sink->buffer, capacity);
    if (grown == NULL) {
        if (!sink->dropped) fprintf(stderr, "rank %d: trace: out of memory buffering events for %s\n", sink->rank,
                                    sink->path);
        sink->dropped = 1;
        return -1;
    }
    sink->buffer = grown;
    sink->capacity = capacity;
    return 0;
}

static void put_bytes(trace_sink *sink, const char *bytes, size_t count) {
    if (sink->event_failed || buffer_reserve(sink, count) != 0) {
        sink->event_failed = 1;
        return;
    }
    memcpy(sink->buffer + sink->length, bytes, count);
    sink->length += count;
}

static void put_text(trace_sink *sink, const char *text) { put_bytes(sink, text, strlen(text)); }

/* A JSON string as cJSON prints it: ", \ and the control characters escaped, every other byte as it is. */
static void put_string(trace_sink *sink, const char *text) {
    put_bytes(sink, "\"", 1);
    const unsigned char *p = (const unsigned char *)(text != NULL ? text : "");
    const unsigned char *plain = p;
    for (; *p != '\0'; p++) {
        if (*p >= 32 && *p != '"' && *p != '\\') continue;
        put_bytes(sink, (const char *)plain, (size_t)(p - plain));
        char escaped[8];
        switch (*p) {
        case '"': put_text(sink, "\\\""); break;
        case '\\': put_text(sink, "\\\\"); break;
        case '\b': put_text(sink, "\\b"); break;
        case '\f': put_text(sink, "\\f"); break;
        case '\n': put_text(sink, "\\n"); break;
        case '\r': put_text(sink, "\\r"); break;
        case '\t': put_text(sink, "\\t"); break;
        default:
            snprintf(escaped, sizeof escaped, "\\u%04x", *p);
            put_text(sink, escaped);
        }
        plain = p + 1;
    }
    put_bytes(sink, (const char *)plain, (size_t)(p - plain));
    put_bytes(sink, "\"", 1);
}

/* thousandths / 1000 in decimal, the fraction's trailing zeros (and its point) dropped. It is what "%d" and
 * "%1.15g" print for a double equal to that quotient when |thousandths| < 1e18 has at most 15 significant digits
 * past the trailing zeros: the integers below 1e15 and the thousandths below 1e12 (put_number_value's cases). Such a
 * decimal reads back as the same double, so cJSON's 17-digit retry never happens for them. */
static void put_thousandths(trace_sink *sink, long long thousandths) {
    char text[32];
    char *end = text + sizeof text, *p = end;
    unsigned long long magnitude = thousandths < 0 ? 0ULL - (unsigned long long)thousandths
                                                   : (unsigned long long)thousandths;
    unsigned fraction = (unsigned)(magnitude % 1000);
    magnitude /= 1000;
    if (fraction != 0) {
        int digits = 3;
        while (fraction % 10 == 0) {
            fraction /= 10;
            digits--;
        }
        for (int i = 0; i < digits; i++) {
            *--p = (char)('0' + fraction % 10);
            fraction /= 10;
        }
        *--p = '.';
    }
    do {
        *--p = (char)('0' + magnitude % 10);
        magnitude /= 10;
    } while (magnitude != 0);
    if (thousandths < 0) *--p = '-';
    put_bytes(sink, p, (size_t)(end - p));
}

/* cJSON's number form: null for NaN and infinities; "%d" when the value equals its int (cJSON keeps the int
 * saturated at INT_MIN/INT_MAX); else 15 significant digits when they read back within one epsilon, 17 when not. */
static void put_number_value(trace_sink *sink, double value) {
    char text[64];
    if (isnan(value) || isinf(value)) {
        put_text(sink, "null");
        return;
    }
    /* Most numbers are counts and addresses (integers) or times rounded to the nanosecond (thousandths of a
     * microsecond): printed here without printf, in the digits cJSON's forms give for them. */
    if (fabs(value) < 1e15 && value == floor(value)) {
        put_thousandths(sink, (long long)value * 1000);
        return;
    }
    if (fabs(value) < 1e12) {
        long long thousandths = llround(value * 1000.0);
        if ((double)thousandths / 1000.0 == value) {
            put_thousandths(sink, thousandths);
            return;
        }
    }
    int as_int = value >= INT_MAX ? INT_MAX : value <= (double)INT_MIN ? INT_MIN : (int)value;
    if (value == (double)as_int) {
        snprintf(text, sizeof text, "%d", as_int);
    } else {
        snprintf(text, sizeof text, "%1.15g", value);
        double back = strtod(text, NULL);
        double larger = fabs(back) > fabs(value) ? fabs(back) : fabs(value);
        if (!(fabs(back - value) <= larger * DBL_EPSILON)) snprintf(text, sizeof text, "%1.17g", value);
    }
    put_text(sink, text);
}

/* ,"key": — every field after the first of an object; sink->first_field marks the first of a nested object. */
static void put_key(trace_sink *sink, const char *key) {
    if (!sink->first_field) put_bytes(sink, ",", 1);
    sink->first_field = 0;
    put_string(sink, key);
    put_bytes(sink, ":", 1);
}

static void add_string(trace_sink *sink, const char *key, const char *value) {
    put_key(sink, key);
    put_string(sink, value);
}
static void add_number(trace_sink *sink, const char *key, double value) {
    put_key(sink, key);
    put_number_value(sink, value);
}
static void add_bool(trace_sink *sink, const char *key, int value) {
    put_key(sink, key);
    put_text(sink, value ? "true" : "false");
}
static void add_null(trace_sink *sink, const char *key) {
    put_key(sink, key);
    put_text(sink, "null");
}
static void add_string_or_null(trace_sink *sink, const char *key, const char *value) {
    if (value != NULL) add_string(sink, key, value);
    else add_null(sink, key);
}

/* Starts an event with the fields every event has. 0 when tracing is off: the caller writes nothing. */
static int event_begin(trace_sink *sink, const char *kind, double ts_us) {
    if (sink == NULL || sink->file == NULL) return 0;
    sink->event_start = sink->length;
    sink->event_failed = 0;
    sink->first_field = 1;
    put_bytes(sink, "{", 1);
    add_string(sink, "kind", kind);
    add_number(sink, "ts", rounded_us(ts_us));
    add_number(sink, "rank", sink->rank);
    return 1;
}

/* Writes the buffered lines to the file; on a write error tracing stops, with a message. */
static void buffer_flush(trace_sink *sink) {
    if (sink->file == NULL || sink->committed == 0) return;
    sink->flushing = 1;
    size_t written = fwrite(sink->buffer, 1, sink->committed, sink->file);
    int failed = written != sink->committed || fflush(sink->file) != 0;
    sink->length -= sink->committed;
    memmove(sink->buffer, sink->buffer + sink->committed, sink->length);
    sink->committed = 0;
    sink->flushing = 0;
    if (failed) {
        fprintf(stderr, "rank %d: trace: write to %s failed: %s; tracing stops here\n", sink->rank, sink->path,
                strerror(errno));
        fclose(sink->file);
        sink->file = NULL;
    }
}

/* Ends the event's line; it is committed (a fatal signal writes it out) and goes to the file with the buffer. */
static void event_write(trace_sink *sink) {
    put_bytes(sink, "}\n", 2);
    if (sink->event_failed) {
        sink->length = sink->event_start;
        return;
    }
    sink->committed = sink->length;
    if (sink->committed >= TRACE_FLUSH_BYTES) buffer_flush(sink);
}

void trace_flush(trace_sink *sink) {
    if (sink != NULL) buffer_flush(sink);
}

/* On a fatal signal: the committed lines go out with write(2) (async-signal-safe), then the signal's default action
 * (the core dump or the exit status the program would have had). Skipped while a flush is under way. */
static void flush_on_signal(int signal_number) {
    trace_sink *sink = signal_sink;
    if (sink != NULL && sink->file != NULL && !sink->flushing) {
        int fd = fileno(sink->file);
        size_t done = 0;
        while (done < sink->committed) {
            ssize_t wrote = write(fd, sink->buffer + done, sink->committed - done);
            if (wrote <= 0) break;
            done += (size_t)wrote;
        }
    }
    signal(signal_number, SIG_DFL);
    raise(signal_number);
}

/* Installs flush_on_signal for the signals that end a rank (MPI_Abort's SIGTERM to the other ranks, abort()'s
 * SIGABRT, a crash), where nothing else handles them: a sanitizer's or MPI's own handler stays. */
static void install_signal_flush(void) {
    static const int signals[] = {SIGTERM, SIGINT, SIGHUP, SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL};
    for (size_t i = 0; i < sizeof signals / sizeof signals[0]; i++) {
        struct sigaction current;
        if (sigaction(signals[i], NULL, &current) != 0) continue;
        if ((current.sa_flags & SA_SIGINFO) || current.sa_handler != SIG_DFL) continue;
        struct sigaction action;
        memset(&action, 0, sizeof action);
        action.sa_handler = flush_on_signal;
        sigemptyset(&action.sa_mask);
        sigaction(signals[i], &action, NULL);
    }
}

int trace_open(trace_sink *sink, const char *outdir, int rank, int world_size) {
    return trace_open_run(sink, outdir, rank, world_size, NULL);
}

void trace_end(trace_sink *sink) {
    if (event_begin(sink, "end", trace_now_us(sink))) event_write(sink);
    trace_flush(sink);
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
    event_begin(sink, "meta", 0.0);
    add_string(sink, "schema", TRACE_SCHEMA_NAME);
    add_number(sink, "version", TRACE_SCHEMA_VERSION);
    add_number(sink, "world", world_size);
    if (run_id != NULL) add_string(sink, "run_id", run_id);
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    add_number(sink, "unix_time", (double)wall.tv_sec + 1e-9 * (double)wall.tv_nsec);
    event_write(sink);
    signal_sink = sink;
    install_signal_flush();
    return sink->file != NULL ? 0 : -1;
}

void trace_reset_t0(trace_sink *sink) {
    sink->t0_seconds = monotonic_seconds();
    trace_mark(sink, "t0");
}

void trace_close(trace_sink *sink) {
    buffer_flush(sink);
    if (signal_sink == sink) signal_sink = NULL;
    if (sink->file != NULL) fclose(sink->file);
    sink->file = NULL;
    free(sink->buffer);
    sink->buffer = NULL;
    sink->length = sink->committed = sink->capacity = 0;
}

void trace_state(trace_sink *sink, const char *unit, const char *machine, const char *from, const char *to,
                 const char *hook) {
    if (!event_begin(sink, "state", trace_now_us(sink))) return;
    add_string(sink, "unit", unit);
    add_string(sink, "machine", machine);
    add_string(sink, "from", from);
    add_string(sink, "to", to);
    add_string(sink, "hook", hook);
    event_write(sink);
}

/* `group_ranks`: the world ranks of the group as a JSON array ("0,2" -> [0, 2]); absent for the world (every rank:
 * a world of thousands would repeat them in every event). */
static void add_group_ranks(trace_sink *sink, const char *ranks) {
    if (ranks == NULL) return;
    put_key(sink, "group_ranks");
    put_bytes(sink, "[", 1);
    int first = 1;
    for (const char *p = ranks; *p;) {
        char *end = NULL;
        long rank = strtol(p, &end, 10);
        if (end == p) break;
        if (!first) put_bytes(sink, ",", 1);
        first = 0;
        put_number_value(sink, (double)rank);
        p = *end == ',' ? end + 1 : end;
    }
    put_bytes(sink, "]", 1);
}

void trace_collective(trace_sink *sink, const trace_collective_info *info) {
    if (!event_begin(sink, "collective", info->start_us)) return;
    add_string(sink, "op", info->op);
    add_string(sink, "unit", info->unit);
    add_string_or_null(sink, "reduce", info->reduce);
    add_number(sink, "count", (double)info->count);
    add_number(sink, "bytes", (double)info->bytes);
    add_string(sink, "dtype", info->dtype ? info->dtype : "float32");
    add_number(sink, "bytes_sent", (double)info->bytes_sent);
    add_number(sink, "bytes_recv", (double)info->bytes_recv);
    add_number(sink, "world", sink->world_size);
    add_string(sink, "group", info->group ? info->group : "world");
    add_number(sink, "group_size", info->group_size > 0 ? info->group_size : sink->world_size);
    add_group_ranks(sink, info->group_ranks);
    add_number(sink, "seq", (double)info->seq);
    add_string(sink, "stream", info->stream ? info->stream : "compute");
    add_number(sink, "issue_ts", rounded_us(info->issue_us));
    add_number(sink, "dur", rounded_dur_us(info->start_us, info->dur_us));
    event_write(sink);
}

void trace_wait(trace_sink *sink, const trace_wait_info *info) {
    if (!event_begin(sink, "wait", info->start_us)) return;
    add_string(sink, "stream", "compute");
    add_string(sink, "on", info->on);
    add_string_or_null(sink, "op", info->op);
    add_string_or_null(sink, "unit", info->unit);
    add_number(sink, "seq", (double)info->seq);
    add_string_or_null(sink, "hook", info->hook);
    add_number(sink, "dur", rounded_dur_us(info->start_us, info->dur_us));
    event_write(sink);
}

void trace_fsdp(trace_sink *sink, const trace_fsdp_info *info) {
    if (!event_begin(sink, "fsdp", trace_now_us(sink))) return;
    add_string(sink, "model", info->model);
    add_string(sink, "sharding_strategy", info->sharding_strategy);
    add_string_or_null(sink, "backward_prefetch", info->backward_prefetch);
    add_bool(sink, "forward_prefetch", info->forward_prefetch);
    add_bool(sink, "limit_all_gathers", info->limit_all_gathers);
    add_bool(sink, "activation_checkpointing", info->activation_checkpointing);
    add_bool(sink, "no_sync", info->no_sync);
    add_number(sink, "accumulation_steps", info->accumulation_steps);
    add_number(sink, "unit_count", info->unit_count);
    add_bool(sink, "offload_params", info->offload_params);
    if (info->param_dtype == NULL) {
        add_null(sink, "mixed_precision");
    } else {
        put_key(sink, "mixed_precision");
        put_bytes(sink, "{", 1);
        sink->first_field = 1;
        add_string(sink, "param_dtype", info->param_dtype);
        add_string(sink, "reduce_dtype", info->reduce_dtype);
        add_string(sink, "buffer_dtype", info->buffer_dtype);
        add_bool(sink, "keep_low_precision_grads", info->keep_low_precision_grads);
        put_bytes(sink, "}", 1);
    }
    event_write(sink);
}

static void memory_event(trace_sink *sink, const char *kind, const trace_memory_info *info) {
    if (!event_begin(sink, kind, trace_now_us(sink))) return;
    add_number(sink, "id", (double)info->id);
    add_number(sink, "bytes", (double)info->bytes);
    add_string(sink, "category", info->category);
    if (info->dtype != NULL) add_string(sink, "dtype", info->dtype);
    add_string(sink, "owner", info->owner);
    add_number(sink, "live", (double)info->live_bytes);
    add_number(sink, "category_live", (double)info->category_live_bytes);
    add_number(sink, "addr", (double)info->address);
    add_number(sink, "size", (double)info->size);
    add_number(sink, "segment", (double)info->segment);
    add_number(sink, "stream", info->stream);
    add_number(sink, "reserved", (double)info->reserved_bytes);
    add_string(sink, "device", info->device ? info->device : "device");
    event_write(sink);
}

static void segment_event(trace_sink *sink, const char *kind, const trace_segment_info *info) {
    if (!event_begin(sink, kind, trace_now_us(sink))) return;
    add_number(sink, "id", (double)info->id);
    add_number(sink, "addr", (double)info->address);
    add_number(sink, "bytes", (double)info->bytes);
    add_string(sink, "pool", info->pool);
    add_number(sink, "stream", info->stream);
    add_string_or_null(sink, "owner", info->owner);
    add_string_or_null(sink, "category", info->category);
    add_number(sink, "reserved", (double)info->reserved_bytes);
    add_string(sink, "device", info->device ? info->device : "device");
    event_write(sink);
}

void trace_segment_alloc(trace_sink *sink, const trace_segment_info *info) {
    segment_event(sink, "segment_alloc", info);
}
void trace_segment_free(trace_sink *sink, const trace_segment_info *info) { segment_event(sink, "segment_free", info); }

void trace_allocator(trace_sink *sink, const trace_allocator_info *info) {
    if (!event_begin(sink, "allocator", trace_now_us(sink))) return;
    add_string(sink, "mode", info->mode);
    add_string(sink, "backend", info->backend);
    add_number(sink, "round", (double)info->round);
    add_number(sink, "small_size", (double)info->small_size);
    add_number(sink, "small_segment", (double)info->small_segment);
    add_number(sink, "large_segment", (double)info->large_segment);
    add_number(sink, "min_large_alloc", (double)info->min_large_alloc);
    add_number(sink, "round_large", (double)info->round_large);
    add_number(sink, "max_split_size", (double)info->max_split_size);
    add_string(sink, "device", info->device ? info->device : "device");
    add_number(sink, "budget", (double)info->budget);
    event_write(sink);
}

void trace_copy(trace_sink *sink, const trace_copy_info *info) {
    if (!event_begin(sink, "copy", info->start_us)) return;
    add_string(sink, "direction", info->direction);
    add_string_or_null(sink, "unit", info->unit);
    add_string(sink, "owner", info->owner);
    add_number(sink, "bytes", (double)info->bytes);
    add_string(sink, "stream", info->stream ? info->stream : "compute");
    add_number(sink, "dur", rounded_dur_us(info->start_us, info->dur_us));
    event_write(sink);
}

void trace_alloc(trace_sink *sink, const trace_memory_info *info) { memory_event(sink, "alloc", info); }
void trace_free(trace_sink *sink, const trace_memory_info *info) { memory_event(sink, "free", info); }

void trace_compute(trace_sink *sink, const char *name, const char *unit, const char *phase, double start_us,
                   double dur_us) {
    if (!event_begin(sink, "compute", start_us)) return;
    add_string(sink, "name", name);
    add_string_or_null(sink, "unit", unit);
    add_string_or_null(sink, "phase", phase);
    add_string(sink, "stream", "compute");
    add_number(sink, "dur", rounded_dur_us(start_us, dur_us));
    event_write(sink);
}

void trace_step(trace_sink *sink, int step, int micro, double loss, uint64_t peak_bytes, uint64_t peak_reserved_bytes,
                double time_seconds) {
    if (!event_begin(sink, "step", trace_now_us(sink))) return;
    add_number(sink, "step", step);
    add_number(sink, "micro", micro);
    add_number(sink, "loss", loss);
    add_number(sink, "peak_bytes", (double)peak_bytes);
    add_number(sink, "peak_reserved", (double)peak_reserved_bytes);
    /* The process's CPU time so far: differences between steps split a step into user and system (kernel) time,
     * where page faults on fresh memory and the kernel-side copies of shared-memory MPI show up. */
    struct rusage usage;
    if (getrusage(RUSAGE_SELF, &usage) == 0) {
        add_number(sink, "cpu_user",
                                (double)usage.ru_utime.tv_sec + 1e-6 * (double)usage.ru_utime.tv_usec);
        add_number(sink, "cpu_sys",
                                (double)usage.ru_stime.tv_sec + 1e-6 * (double)usage.ru_stime.tv_usec);
    }
    add_number(sink, "time", time_seconds);
    event_write(sink);
    trace_flush(sink); /* a step's events go to the file at once, at its end */
}

void trace_mark(trace_sink *sink, const char *text) {
    if (!event_begin(sink, "mark", trace_now_us(sink))) return;
    add_string(sink, "text", text);
    event_write(sink);
}
