/* summary.c — see summary.h. Every figure is computed from the JSONL lines alone, one rank at a time. */
#include "summary.h"
#include "segments.h"
#include "view_file.h"

#include <cjson/cJSON.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- formatting ---- */

/* 34769296 -> "34,769,296": exact bytes a learner can compare with the JSONL, grouped to be read at a glance. */
static const char *grouped(uint64_t value, char *text, size_t size) {
    char digits[32];
    int length = snprintf(digits, sizeof digits, "%llu", (unsigned long long)value);
    size_t out = 0;
    for (int index = 0; index < length && out + 2 < size; index++) {
        if (index > 0 && (length - index) % 3 == 0) text[out++] = ',';
        text[out++] = digits[index];
    }
    text[out] = '\0';
    return text;
}

/* Decimal units, as the labs print them ("Peak = 34.8 MB"). */
static const char *human(uint64_t bytes, char *text, size_t size) {
    static const char *const units[] = {"B", "kB", "MB", "GB", "TB"};
    double value = (double)bytes;
    int unit = 0;
    while (value >= 1000 && unit < 4) {
        value /= 1000;
        unit++;
    }
    if (unit == 0) snprintf(text, size, "%llu B", (unsigned long long)bytes);
    else snprintf(text, size, "%.1f %s", value, units[unit]);
    return text;
}

static double share(double part, double whole) { return whole > 0 ? 100.0 * part / whole : 0.0; }

/* ---- peak memory ---- */

typedef struct memory_peak {
    uint64_t bytes;
    uint64_t category_bytes[RUN_CATEGORY_COUNT];
    size_t line;                          /* 0: no allocation at all */
    size_t index;
} memory_peak;

/* The category column's width: the longest category name (param_shard_low_precision), so no row breaks it. */
static int category_width(void) {
    size_t width = strlen("category");
    for (int category = 0; category < RUN_CATEGORY_COUNT; category++)
        if (strlen(run_categories[category]) > width) width = strlen(run_categories[category]);
    return (int)width;
}

/* The allocated peak (segments_peak_index) and its composition: the running sums up to it. */
static memory_peak peak_find(const run_rank *rank) {
    memory_peak peak = {0};
    peak.index = segments_peak_index(rank, &peak.bytes);
    if (peak.index == rank->event_count) return (memory_peak){0};
    peak.line = rank->events[peak.index].line;
    for (size_t index = 0; index <= peak.index; index++) {
        const run_event *event = &rank->events[index];
        if (event->kind == RUN_ALLOC) peak.category_bytes[event->category] += event->bytes;
        if (event->kind == RUN_FREE) peak.category_bytes[event->category] -= event->bytes;
    }
    return peak;
}

/* "during step 2 micro-batch 1": step events close a (micro-)step, so the next one after the line names it. */
static void moment_describe(const run_rank *rank, size_t index, char *text, size_t size) {
    for (size_t next = index; next < rank->event_count; next++) {
        const run_event *event = &rank->events[next];
        if (event->kind != RUN_STEP) continue;
        if (event->micro >= 0) snprintf(text, size, "during step %d micro-batch %d", event->step, event->micro);
        else snprintf(text, size, "during step %d", event->step);
        return;
    }
    snprintf(text, size, "after the last step");
}

/* Bytes live at event `index` in blocks of the given dtype (version 4; 0 for older runs). */
static uint64_t dtype_bytes_at(const trace_run *run, const run_rank *rank, size_t index, const char *type) {
    uint64_t bytes = 0;
    for (size_t i = 0; i <= index && i < rank->event_count; i++) {
        const run_event *event = &rank->events[i];
        if ((event->kind != RUN_ALLOC && event->kind != RUN_FREE) || event->dtype == RUN_NONE ||
            strcmp(run_string(run, event->dtype), type) != 0)
            continue;
        if (event->kind == RUN_ALLOC) bytes += event->bytes;
        else bytes -= event->bytes;
    }
    return bytes;
}

static void peak_print(FILE *stream, const trace_run *run, const run_rank *rank, memory_peak peak) {
    char exact[32], readable[32], moment[96];
    if (peak.line == 0) {
        fprintf(stream, "peak memory: no allocation in this rank's events\n");
        return;
    }
    moment_describe(rank, peak.index, moment, sizeof moment);
    int width = category_width();
    fprintf(stream, "peak memory: %s B (%s) at line %zu (alloc of %s), %s\n", grouped(peak.bytes, exact, sizeof exact),
            human(peak.bytes, readable, sizeof readable), peak.line, run_string(run, rank->events[peak.index].label),
            moment);
    fprintf(stream, "  %-*s %16s %8s\n", width, "category", "bytes", "share");
    for (int category = 0; category < RUN_CATEGORY_COUNT; category++)
        fprintf(stream, "  %-*s %16s %7.1f%%\n", width, run_categories[category],
                grouped(peak.category_bytes[category], exact, sizeof exact),
                share((double)peak.category_bytes[category], (double)peak.bytes));
    fprintf(stream, "  %-*s %16s %7.1f%%\n", width, "total", grouped(peak.bytes, exact, sizeof exact), 100.0);
    /* Mixed precision: how much of the peak is 2-byte elements (the gathered units, the low-precision shard). */
    uint64_t low = dtype_bytes_at(run, rank, peak.index, "bfloat16");
    if (low > 0)
        fprintf(stream, "  dtypes at the peak: bfloat16 %s B (%.1f%%), the rest float32 and token ids\n",
                grouped(low, exact, sizeof exact), share((double)low, (double)peak.bytes));
}

/* CPU offload (version 4): the host pool's peak and composition, and the copies between the pools. */
static void host_pool_print(FILE *stream, const trace_run *run, const run_rank *rank) {
    if (rank->host == NULL) return;
    memory_peak peak = peak_find(rank->host);
    char exact[32], readable[32];
    fprintf(stream, "host pool (CPU offload; the figures above are the device pool's): peak %s B (%s) at line %zu\n",
            grouped(peak.bytes, exact, sizeof exact), human(peak.bytes, readable, sizeof readable), peak.line);
    for (int category = 0; category < RUN_CATEGORY_COUNT; category++)
        if (peak.category_bytes[category] != 0)
            fprintf(stream, "  %-*s %16s %7.1f%%\n", category_width(), run_categories[category],
                    grouped(peak.category_bytes[category], exact, sizeof exact),
                    share((double)peak.category_bytes[category], (double)peak.bytes));
    uint64_t count[2] = {0, 0}, bytes[2] = {0, 0};
    double time[2] = {0.0, 0.0};
    for (size_t index = 0; index < rank->event_count; index++) {
        const run_event *event = &rank->events[index];
        if (event->kind != RUN_COPY) continue;
        int d2h = strcmp(run_string(run, event->direction), "d2h") == 0;
        count[d2h]++, bytes[d2h] += event->bytes, time[d2h] += event->dur;
    }
    fprintf(stream, "copies: h2d %llu (%s B, %.3f ms), d2h %llu (%s B, %.3f ms)\n", (unsigned long long)count[0],
            grouped(bytes[0], exact, sizeof exact), time[0] / 1e3, (unsigned long long)count[1],
            grouped(bytes[1], readable, sizeof readable), time[1] / 1e3);
}

/* ---- reserved memory: the caching allocator's segments ---- */

static void allocator_print(FILE *stream, const run_rank *rank) {
    const run_allocator *a = &rank->allocator;
    char round[32], small[32], small_segment[32], large_segment[32], split[48];
    if (!a->seen) {
        fprintf(stream, "allocator: no 'allocator' event in this rank's file\n");
        return;
    }
    if (a->max_split_size == 0) snprintf(split, sizeof split, "none");
    else snprintf(split, sizeof split, "%s B", grouped(a->max_split_size, round, sizeof round));
    fprintf(stream, "allocator: %s, segments from %s; blocks rounded to %s B; small pool (<= %s B) in %s B segments, "
                    "large in %s B; max_split_size %s\n",
            a->mode, a->backend, grouped(a->round, round, sizeof round), grouped(a->small_size, small, sizeof small),
            grouped(a->small_segment, small_segment, sizeof small_segment),
            grouped(a->large_segment, large_segment, sizeof large_segment), split);
}

/* The first segment event after which reserved bytes are highest. */
static void reserved_peak_print(FILE *stream, const trace_run *run, const run_rank *rank) {
    size_t peak = rank->event_count;
    for (size_t index = 0; index < rank->event_count; index++) {
        const run_event *event = &rank->events[index];
        if (event->kind != RUN_SEGMENT_ALLOC) continue;
        if (peak == rank->event_count || event->reserved > rank->events[peak].reserved) peak = index;
    }
    char exact[32], readable[32], moment[96];
    if (peak == rank->event_count) {
        fprintf(stream, "reserved peak: no segment in this rank's events\n");
        return;
    }
    const run_event *event = &rank->events[peak];
    moment_describe(rank, peak, moment, sizeof moment);
    fprintf(stream, "reserved peak: %s B (%s) at line %zu (segment_alloc for %s), %s\n",
            grouped(event->reserved, exact, sizeof exact), human(event->reserved, readable, sizeof readable),
            event->line, event->label == RUN_NONE ? "(none)" : run_string(run, event->label), moment);
}

enum { SEGMENTS_LISTED = 12 };

/* At the allocated peak: reserved − allocated, split into rounding (block sizes − bytes asked) and free space cached
 * in segments, and the segments that hold it, the emptiest first. */
static int fragmentation_print(FILE *stream, const trace_run *run, const run_rank *rank, memory_peak peak,
                               char *error, size_t error_size) {
    if (peak.line == 0) return 0;
    segments_state state;
    segments_fragmentation at;
    if (segments_fragmentation_at(&state, rank, peak.index, peak.bytes, &at, error, error_size) != 0) {
        segments_free(&state);
        return -1;
    }
    char a[32], b[32], c[32], d[32];
    uint64_t fragmentation = at.reserved - at.allocated;
    fprintf(stream, "fragmentation at the allocated peak (line %zu): reserved %s B - allocated %s B = %s B (%.1f%% of "
                    "reserved)\n",
            peak.line, grouped(at.reserved, a, sizeof a), grouped(at.allocated, b, sizeof b),
            grouped(fragmentation, c, sizeof c), share((double)fragmentation, (double)at.reserved));
    fprintf(stream, "  %-34s %16s B\n", "rounding (block sizes - bytes asked)", grouped(at.rounding, a, sizeof a));
    fprintf(stream, "  %-34s %16s B\n", "free in segments (cached)", grouped(at.cached, a, sizeof a));
    fprintf(stream, "  %-18s %-6s %14s %7s %14s %14s\n", "segment", "pool", "bytes", "blocks", "block bytes", "free");
    segments_sort_by_free(&state);
    for (size_t index = 0; index < state.count && index < SEGMENTS_LISTED; index++) {
        const segments_segment *segment = &state.segments[index];
        fprintf(stream, "  %#-18llx %-6s %14s %7zu %14s %14s\n", (unsigned long long)segment->address,
                run_string(run, segment->pool), grouped(segment->bytes, a, sizeof a), segment->block_count,
                grouped(segment->allocated, b, sizeof b), grouped(segment->bytes - segment->allocated, c, sizeof c));
    }
    if (state.count > SEGMENTS_LISTED) {
        uint64_t bytes = 0, free_bytes = 0;
        for (size_t index = SEGMENTS_LISTED; index < state.count; index++) {
            bytes += state.segments[index].bytes;
            free_bytes += state.segments[index].bytes - state.segments[index].allocated;
        }
        fprintf(stream, "  ... %zu more segments, %s B, %s B free\n", state.count - SEGMENTS_LISTED,
                grouped(bytes, c, sizeof c), grouped(free_bytes, d, sizeof d));
    }
    segments_free(&state);
    return 0;
}

/* ---- collectives by op ---- */

typedef struct op_total {
    int op;
    int group;            /* the process group (version 4), RUN_NONE for the world: a row per op and group */
    int dtype;            /* string index of the elements' type, RUN_NONE before version 4: a row per op and dtype */
    size_t count;
    uint64_t bytes, bytes_sent;
    double dur;
} op_total;

static void op_add(op_total *totals, size_t *total_count, const run_event *event) {
    size_t index = 0;
    while (index < *total_count && (totals[index].op != event->label || totals[index].group != event->group ||
                                    totals[index].dtype != event->dtype))
        index++;
    if (index == *total_count)
        totals[(*total_count)++] = (op_total){.op = event->label, .group = event->group, .dtype = event->dtype};
    totals[index].count++;
    totals[index].bytes += event->bytes;
    totals[index].bytes_sent += event->bytes_sent;
    totals[index].dur += event->dur;
}

static void op_row_print(FILE *stream, const char *name, const op_total *total) {
    char bytes[32], sent[32];
    fprintf(stream, "  %-24s %7zu %16s %16s %10.3f\n", name, total->count, grouped(total->bytes, bytes, sizeof bytes),
            grouped(total->bytes_sent, sent, sizeof sent), total->dur / 1000.0);
}

/* Ops are few (EVENTS.md lists five) but a newer writer may add one: room for one per collective is always enough. */
static int collectives_print(FILE *stream, const trace_run *run, const run_rank *rank) {
    op_total *totals = calloc(rank->event_count + 1, sizeof *totals);
    if (totals == NULL) return -1;
    size_t total_count = 0;
    op_total all = {0};
    for (size_t index = 0; index < rank->event_count; index++) {
        const run_event *event = &rank->events[index];
        if (event->kind != RUN_COLLECTIVE) continue;
        op_add(totals, &total_count, event);
        all.count++;
        all.bytes += event->bytes;
        all.bytes_sent += event->bytes_sent;
        all.dur += event->dur;
    }
    fprintf(stream, "  %-24s %7s %16s %16s %10s  %s\n", "collective", "count", "bytes", "bytes sent", "time ms",
            "(incl. waiting for peers)");
    /* One row per op, group and dtype: "all_reduce (replicate)" as the Chrome export names a group's collectives, and
     * a type other than float32 after a colon, "all_gather:bfloat16". */
    for (size_t index = 0; index < total_count; index++) {
        char name[128];
        const char *type = totals[index].dtype == RUN_NONE ? "float32" : run_string(run, totals[index].dtype);
        int typed = strcmp(type, "float32") != 0;
        if (totals[index].group != RUN_NONE)
            snprintf(name, sizeof name, "%s%s%s (%s)", run_string(run, totals[index].op), typed ? ":" : "",
                     typed ? type : "", run_string(run, totals[index].group));
        else
            snprintf(name, sizeof name, "%s%s%s", run_string(run, totals[index].op), typed ? ":" : "",
                     typed ? type : "");
        op_row_print(stream, name, &totals[index]);
    }
    op_row_print(stream, "total", &all);
    fprintf(stream, "  time ms: from this rank entering each collective to its completion. A collective completes only "
                    "when every rank of\n  its group has joined, so a rank that arrives first waits there for the "
                    "slower ones: the ranks' times differ\n  by that waiting, not by the transfer.\n");
    free(totals);
    return 0;
}

/* ---- compute, comm, idle and overlap ---- */

typedef struct interval {
    double start, end;
} interval;

static int interval_compare(const void *left_pointer, const void *right_pointer) {
    const interval *left = left_pointer, *right = right_pointer;
    return (left->start > right->start) - (left->start < right->start);
}

/* Sorts and merges in place into disjoint intervals; returns how many remain. */
static size_t intervals_union(interval *intervals, size_t count) {
    if (count == 0) return 0;
    qsort(intervals, count, sizeof *intervals, interval_compare);
    size_t merged = 0;
    for (size_t index = 1; index < count; index++) {
        if (intervals[index].start <= intervals[merged].end) {
            if (intervals[index].end > intervals[merged].end) intervals[merged].end = intervals[index].end;
        } else {
            intervals[++merged] = intervals[index];
        }
    }
    return merged + 1;
}

static double intervals_length(const interval *intervals, size_t count) {
    double length = 0;
    for (size_t index = 0; index < count; index++) length += intervals[index].end - intervals[index].start;
    return length;
}

/* Length of the intersection of two unions of disjoint sorted intervals: walk both, advancing the one ending first. */
static double intersection_length(const interval *left, size_t left_count, const interval *right, size_t right_count) {
    double length = 0;
    size_t left_index = 0, right_index = 0;
    while (left_index < left_count && right_index < right_count) {
        double start = left[left_index].start > right[right_index].start ? left[left_index].start
                                                                           : right[right_index].start;
        double end = left[left_index].end < right[right_index].end ? left[left_index].end : right[right_index].end;
        if (end > start) length += end - start;
        if (left[left_index].end < right[right_index].end) left_index++;
        else right_index++;
    }
    return length;
}

/* The rank's spans of one kind (and, for collectives and waits, one stream: RUN_STREAM_COUNT for any; waits_on
 * picks waits by the stream they waited for) as intervals; widens [first, last] when first is not NULL. */
static size_t intervals_collect(const run_rank *rank, size_t begin, size_t end, run_event_kind kind, run_stream stream,
                                interval *intervals, double *first, double *last) {
    size_t count = 0;
    for (size_t index = begin; index < end; index++) {
        const run_event *event = &rank->events[index];
        if (event->kind != kind) continue;
        if (kind == RUN_COLLECTIVE && stream != RUN_STREAM_COUNT && event->ran_on != stream) continue;
        intervals[count++] = (interval){event->ts, event->ts + event->dur};
        if (first == NULL) continue;
        if (event->ts < *first) *first = event->ts;
        if (event->ts + event->dur > *last) *last = event->ts + event->dur;
    }
    return count;
}

/* Waits for a comm stream (not the rate limiter's waits on compute). */
static size_t comm_waits_collect(const run_rank *rank, size_t begin, size_t end, interval *intervals) {
    size_t count = 0;
    for (size_t index = begin; index < end; index++) {
        const run_event *event = &rank->events[index];
        if (event->kind == RUN_WAIT && event->waited_on != RUN_STREAM_COMPUTE)
            intervals[count++] = (interval){event->ts, event->ts + event->dur};
    }
    return count;
}

typedef struct flight_point {
    double ts;
    int change;           /* +1 issued, -1 completed */
} flight_point;

/* Completions sort before issues at the same moment: intervals that only touch are not in flight together. */
static int flight_compare(const void *left_pointer, const void *right_pointer) {
    const flight_point *left = left_pointer, *right = right_pointer;
    if (left->ts != right->ts) return left->ts < right->ts ? -1 : 1;
    return (left->change > right->change) - (left->change < right->change);
}

/* The most all_gathers in flight at once: issued by the host (issue_ts) and not yet complete (ts + dur). */
static int all_gathers_in_flight(const trace_run *run, const run_rank *rank, size_t begin, size_t end,
                                 flight_point *points) {
    size_t count = 0;
    for (size_t index = begin; index < end; index++) {
        const run_event *event = &rank->events[index];
        if (event->kind != RUN_COLLECTIVE || strcmp(run_string(run, event->label), "all_gather") != 0) continue;
        points[count++] = (flight_point){event->issue_ts, +1};
        points[count++] = (flight_point){event->ts + event->dur, -1};
    }
    if (count > 0) qsort(points, count, sizeof *points, flight_compare);
    int in_flight = 0, most = 0;
    for (size_t index = 0; index < count; index++) {
        in_flight += points[index].change;
        if (in_flight > most) most = in_flight;
    }
    return most;
}

int summary_time_find(const trace_run *run, const run_rank *rank, summary_time *split) {
    return summary_time_between(run, rank, 0, rank->event_count, split);
}

int summary_time_between(const trace_run *run, const run_rank *rank, size_t begin, size_t end, summary_time *split) {
    if (end > rank->event_count) end = rank->event_count;
    if (begin > end) begin = end;
    interval *compute = malloc((rank->event_count + 1) * sizeof *compute);
    interval *comm = malloc((rank->event_count + 1) * sizeof *comm);
    interval *exposed = malloc((2 * rank->event_count + 1) * sizeof *exposed);
    flight_point *points = malloc((2 * rank->event_count + 1) * sizeof *points);
    int status = compute == NULL || comm == NULL || exposed == NULL || points == NULL ? -1 : 0;
    if (status == 0) {
        double first = 1e300, last = -1e300;
        size_t compute_count =
            intervals_collect(rank, begin, end, RUN_COMPUTE, RUN_STREAM_COUNT, compute, &first, &last);
        size_t comm_count = intervals_collect(rank, begin, end, RUN_COLLECTIVE, RUN_STREAM_COUNT, comm, &first, &last);
        *split = (summary_time){.spans = compute_count + comm_count};
        compute_count = intervals_union(compute, compute_count);
        comm_count = intervals_union(comm, comm_count);
        if (split->spans > 0) {
            split->span = last - first;
            split->compute = intervals_length(compute, compute_count);
            split->comm = intervals_length(comm, comm_count);
            split->overlap = intersection_length(compute, compute_count, comm, comm_count);
            split->idle = split->span - (split->compute + split->comm - split->overlap);
        }
        for (int stream = 0; stream < RUN_STREAM_COUNT; stream++) {
            size_t count = intervals_collect(rank, begin, end, RUN_COLLECTIVE, (run_stream)stream, comm, NULL, NULL);
            split->stream_comm[stream] = intervals_length(comm, intervals_union(comm, count));
        }
        size_t waits = comm_waits_collect(rank, begin, end, exposed);
        split->waited = intervals_length(exposed, intervals_union(exposed, waits));
        waits = comm_waits_collect(rank, begin, end, exposed);
        size_t blocking =
            intervals_collect(rank, begin, end, RUN_COLLECTIVE, RUN_STREAM_COMPUTE, exposed + waits, NULL, NULL);
        split->exposed = intervals_length(exposed, intervals_union(exposed, waits + blocking));
        split->max_all_gathers_in_flight = all_gathers_in_flight(run, rank, begin, end, points);
    }
    free(compute);
    free(comm);
    free(exposed);
    free(points);
    return status;
}

static void fsdp_print(FILE *stream, const run_rank *rank) {
    for (size_t index = 0; index < rank->fsdp_count; index++) {
        const run_fsdp *options = &rank->fsdp[index];
        fprintf(stream, "fsdp (line %zu): %s %s, backward_prefetch %s, forward_prefetch %s, limit_all_gathers %s, "
                        "activation_checkpointing %s, no_sync %s, %d accumulation steps, %d units\n",
                options->line, options->model, options->sharding_strategy,
                options->backward_prefetch[0] ? options->backward_prefetch : "None",
                options->forward_prefetch ? "on" : "off", options->limit_all_gathers ? "on" : "off",
                options->activation_checkpointing ? "on" : "off", options->no_sync ? "on" : "off",
                options->accumulation_steps, options->unit_count);
        if (options->param_dtype[0])
            fprintf(stream, "  mixed precision: param_dtype %s, reduce_dtype %s (float32 master shards and AdamW)\n",
                    options->param_dtype, options->reduce_dtype);
    }
    if (rank->fsdp_count > 0) fputc('\n', stream);
}

static int time_print(FILE *stream, const trace_run *run, const run_rank *rank) {
    summary_time split;
    if (summary_time_find(run, rank, &split) != 0) return -1;
    if (split.spans == 0) {
        fprintf(stream, "time: no compute or collective events\n");
        return 0;
    }
    fprintf(stream, "time (ms), from the first compute or collective start to the last end:\n");
    fprintf(stream, "  %-28s %12.3f\n", "span", split.span / 1000);
    fprintf(stream, "  %-28s %12.3f %7.1f%% of span\n", "compute", split.compute / 1000,
            share(split.compute, split.span));
    fprintf(stream, "  %-28s %12.3f %7.1f%% of span   (collectives incl. waiting for peers)\n", "comm",
            split.comm / 1000, share(split.comm, split.span));
    for (int each = 0; each < RUN_STREAM_COUNT; each++) {
        if (split.stream_comm[each] == 0) continue;
        char name[64];
        snprintf(name, sizeof name, "stream %s%s", run_stream_names[each],
                 each == RUN_STREAM_COMPUTE ? " (blocking)" : "");
        fprintf(stream, "    %-26s %12.3f %7.1f%% of comm\n", name, split.stream_comm[each] / 1000,
                share(split.stream_comm[each], split.comm));
    }
    fprintf(stream, "  %-28s %12.3f %7.1f%% of comm   (comm intervals that intersect compute intervals, HTA)\n",
            "overlap", split.overlap / 1000, share(split.overlap, split.comm));
    fprintf(stream, "  %-28s %12.3f %7.1f%% of comm   (the host blocked on comm: waits for comm streams %.3f "
                    "and blocking collectives %.3f, united)\n",
            "exposed comm", split.exposed / 1000, share(split.exposed, split.comm), split.waited / 1000,
            split.stream_comm[RUN_STREAM_COMPUTE] / 1000);
    fprintf(stream, "  %-28s %12.3f %7.1f%% of span   (neither compute nor comm)\n", "idle", split.idle / 1000,
            share(split.idle, split.span));
    fprintf(stream, "  %-28s %12d   (issued and not yet complete at one moment)\n", "all-gathers in flight (max)",
            split.max_all_gathers_in_flight);
    return 0;
}

/* ---- comm volume against ZeRO-3 ---- */

typedef struct volume {
    uint64_t parameters;                  /* P: sum over FSDP units of their largest collective buffer */
    int unit_count;
    uint64_t measured;
    size_t micro_batches;
} volume;

static int volume_op(const trace_run *run, const run_event *event) {
    const char *op = run_string(run, event->label);
    if (strcmp(op, "all_reduce") == 0) return 2;
    return strcmp(op, "all_gather") == 0 || strcmp(op, "reduce_scatter") == 0;
}

/* FSDP units are the units of `state` events; collectives labelled otherwise (a loss all-reduce) do not count. A
 * unit's largest all-gather / reduce-scatter / all-reduce buffer is its padded unsharded size. */
static int volume_find(const trace_run *run, const run_rank *rank, volume *found) {
    unsigned char *is_unit = calloc(run->strings.count + 1, 1);
    uint64_t *unit_bytes = calloc(run->strings.count + 1, sizeof *unit_bytes);
    if (is_unit == NULL || unit_bytes == NULL) {
        free(is_unit);
        free(unit_bytes);
        return -1;
    }
    *found = (volume){0};
    size_t optimizer_steps = 0;
    for (size_t index = 0; index < rank->event_count; index++) {
        const run_event *event = &rank->events[index];
        if (event->kind == RUN_STATE) is_unit[event->unit] = 1;
        if (event->kind == RUN_STEP && event->micro >= 0) found->micro_batches++;
        if (event->kind == RUN_STEP && event->micro < 0) optimizer_steps++;
    }
    if (found->micro_batches == 0) found->micro_batches = optimizer_steps;
    for (size_t index = 0; index < rank->event_count; index++) {
        const run_event *event = &rank->events[index];
        int weight = event->kind == RUN_COLLECTIVE && event->unit != RUN_NONE ? volume_op(run, event) : 0;
        if (weight == 0 || !is_unit[event->unit]) continue;
        found->measured += (uint64_t)weight * event->bytes;
        if (event->bytes > unit_bytes[event->unit]) unit_bytes[event->unit] = event->bytes;
    }
    for (size_t unit = 0; unit < run->strings.count; unit++) {
        found->parameters += unit_bytes[unit];
        found->unit_count += unit_bytes[unit] > 0;
    }
    free(is_unit);
    free(unit_bytes);
    return 0;
}

static void volume_row_print(FILE *stream, const char *name, uint64_t bytes, double per_micro_batch,
                             const char *comparison) {
    char exact[32];
    fprintf(stream, "  %-18s %16s B = %.3f P per micro-batch%s\n", name, grouped(bytes, exact, sizeof exact),
            per_micro_batch, comparison);
}

static int volume_print(FILE *stream, const trace_run *run, const run_rank *rank) {
    volume found;
    char exact[32], readable[32], comparison[96];
    if (volume_find(run, rank, &found) != 0) return -1;
    fprintf(stream,
            "comm volume vs ZeRO-3 (buffer bytes: all_gather + reduce_scatter + 2 x all_reduce, FSDP units):\n");
    if (found.parameters == 0 || found.micro_batches == 0) {
        fprintf(stream, "  no FSDP unit collectives or no steps in this rank's events\n");
        return 0;
    }
    double micro = (double)found.micro_batches, parameters = (double)found.parameters;
    uint64_t zero3 = 3 * found.parameters * found.micro_batches,
             all_reduce = 2 * found.parameters * found.micro_batches;
    fprintf(stream, "  %-18s %16s B (%s, padded, %d units); %zu micro-batches\n", "parameters P",
            grouped(found.parameters, exact, sizeof exact), human(found.parameters, readable, sizeof readable),
            found.unit_count, found.micro_batches);
    volume_row_print(stream, "measured", found.measured, (double)found.measured / parameters / micro, "");
    snprintf(comparison, sizeof comparison, "   measured / expected %.3f", (double)found.measured / (double)zero3);
    volume_row_print(stream, "ZeRO-3 expects", zero3, 3.0, comparison);
    snprintf(comparison, sizeof comparison, "   measured / all-reduce %.3f (ZeRO-3: 1.5)",
             (double)found.measured / (double)all_reduce);
    volume_row_print(stream, "all-reduce (DDP)", all_reduce, 2.0, comparison);
    return 0;
}

/* ---- the whole summary ---- */

static void rank_header_print(FILE *stream, const run_rank *rank) {
    size_t steps = 0, micro_batches = 0;
    for (size_t index = 0; index < rank->event_count; index++) {
        if (rank->events[index].kind != RUN_STEP) continue;
        if (rank->events[index].micro < 0) steps++;
        else micro_batches++;
    }
    fprintf(stream, "\n== rank %d  (%s: %zu lines, %zu events; steps %zu, micro-batches %zu)\n\n", rank->rank,
            rank->path, rank->line_count, rank->event_count, steps, micro_batches);
}

int summary_print(const trace_run *run, FILE *stream, char *error, size_t error_size) {
    fprintf(stream, "fsdplab summary of %s: %d rank%s (events: trace/EVENTS.md; \"line\" is a line of rank<R>.jsonl)\n",
            run->rundir, run->world, run->world == 1 ? "" : "s");
    /* A run's files end with an `end` event when the program finished in order (files from before it have no run
     * id and say nothing either way). */
    for (int rank = 0; rank < run->world; rank++)
        if (run->ranks[rank].run_id[0] && !run->ranks[rank].ended)
            fprintf(stream, "CUT SHORT: rank %d's events stop at line %zu without the end event (the run crashed, was "
                    "killed or aborted there); what follows is what it recorded\n", rank, run->ranks[rank].line_count);
    for (int rank = 0; rank < run->world; rank++) {
        const run_rank *each = &run->ranks[rank];
        rank_header_print(stream, each);
        memory_peak peak = peak_find(each);
        peak_print(stream, run, each, peak);
        fputc('\n', stream);
        allocator_print(stream, each);
        reserved_peak_print(stream, run, each);
        if (fragmentation_print(stream, run, each, peak, error, error_size) != 0) return -1;
        fputc('\n', stream);
        host_pool_print(stream, run, each);
        if (each->host != NULL) fputc('\n', stream);
        int status = collectives_print(stream, run, each);
        if (status == 0) fputc('\n', stream);
        if (status == 0) fsdp_print(stream, each);
        if (status == 0) status = time_print(stream, run, each);
        if (status == 0) fputc('\n', stream);
        if (status == 0) status = volume_print(stream, run, each);
        if (status != 0) {
            snprintf(error, error_size, "out of memory summarizing %s", each->path);
            return -1;
        }
    }
    return 0;
}

int summary_write_run(const trace_run *run, const char *out_path, char *error, size_t error_size) {
    view_file view;
    if (view_file_open(&view, out_path, error, error_size) != 0) return -1;
    int status = summary_print(run, view.file, error, error_size);
    return view_file_close(&view, status, error, error_size);
}

/* ---- the time figures as JSON, for lab checks (`fsdptrace overlap`) ---- */

static cJSON *fsdp_json(const run_rank *rank) {
    return rank->fsdp_count == 0 ? cJSON_CreateNull() : run_fsdp_json(&rank->fsdp[0]);
}

/* The figures into object, in ms. */
static void time_json_add(cJSON *object, const summary_time *split) {
    const struct { const char *key; double us; } figures[] = {
        {"span_ms", split->span}, {"compute_ms", split->compute}, {"comm_ms", split->comm},
        {"overlap_ms", split->overlap}, {"exposed_ms", split->exposed}, {"wait_ms", split->waited},
        {"blocking_comm_ms", split->stream_comm[RUN_STREAM_COMPUTE]}, {"idle_ms", split->idle},
    };
    for (size_t index = 0; index < sizeof figures / sizeof figures[0]; index++)
        cJSON_AddNumberToObject(object, figures[index].key, figures[index].us / 1000);
    cJSON *streams = cJSON_AddObjectToObject(object, "stream_comm_ms");
    for (int each = 0; each < RUN_STREAM_COUNT; each++)
        cJSON_AddNumberToObject(streams, run_stream_names[each], split->stream_comm[each] / 1000);
    cJSON_AddNumberToObject(object, "max_all_gathers_in_flight", split->max_all_gathers_in_flight);
}

/* Each window's figures: from a mark starting with prefix to the next such mark ("<prefix>end" opens none). */
static int windows_json_add(const trace_run *run, const run_rank *rank, const char *prefix, cJSON *object) {
    cJSON *windows = cJSON_AddArrayToObject(object, "windows");
    size_t prefix_length = strlen(prefix), begin = 0;
    const char *name = NULL;
    for (size_t index = 0; index <= rank->event_count; index++) {
        const char *text = index < rank->event_count && rank->events[index].kind == RUN_MARK
                               ? run_string(run, rank->events[index].label) : NULL;
        int boundary = index == rank->event_count || (text != NULL && strncmp(text, prefix, prefix_length) == 0);
        if (!boundary) continue;
        if (name != NULL) {
            summary_time split;
            if (summary_time_between(run, rank, begin, index, &split) != 0) return -1;
            cJSON *window = cJSON_CreateObject();
            cJSON_AddStringToObject(window, "name", name);
            time_json_add(window, &split);
            cJSON_AddItemToArray(windows, window);
        }
        name = text != NULL && strcmp(text + prefix_length, "end") != 0 ? text + prefix_length : NULL;
        begin = index + 1;
    }
    return 0;
}

int summary_overlap_print(const trace_run *run, FILE *stream, char *error, size_t error_size) {
    return summary_overlap_print_windows(run, NULL, stream, error, error_size);
}

int summary_overlap_print_windows(const trace_run *run, const char *window_prefix, FILE *stream, char *error,
                                  size_t error_size) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "rundir", run->rundir);
    cJSON_AddNumberToObject(root, "world", run->world);
    cJSON *ranks = cJSON_AddArrayToObject(root, "ranks");
    for (int rank = 0; rank < run->world; rank++) {
        const run_rank *each = &run->ranks[rank];
        summary_time split;
        cJSON *object = cJSON_CreateObject();
        cJSON_AddItemToArray(ranks, object);
        cJSON_AddNumberToObject(object, "rank", each->rank);
        cJSON_AddItemToObject(object, "fsdp", fsdp_json(each));
        if (summary_time_find(run, each, &split) != 0 ||
            (time_json_add(object, &split), window_prefix != NULL && windows_json_add(run, each, window_prefix,
                                                                                      object) != 0)) {
            cJSON_Delete(root);
            snprintf(error, error_size, "out of memory summarizing %s", each->path);
            return -1;
        }
    }
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    if (text == NULL) {
        snprintf(error, error_size, "out of memory printing the overlap of %s", run->rundir);
        return -1;
    }
    fprintf(stream, "%s\n", text);
    cJSON_free(text);
    return 0;
}

int summary_overlap_write_run(const trace_run *run, const char *out_path, char *error, size_t error_size) {
    view_file view;
    if (view_file_open(&view, out_path, error, error_size) != 0) return -1;
    int status = summary_overlap_print(run, view.file, error, error_size);
    return view_file_close(&view, status, error, error_size);
}
