/* chrome.c — the Chrome export of a run loaded by run.h. See chrome.h and EVENTS.md "Chrome export".
 *
 * First the flow plan: every rank's collectives, grouped by seq, which says where each cross-rank arrow starts and
 * ends. Then one rank at a time: turn its events (in file order, as run_load keeps them) into Chrome events, add
 * the flow events the plan gives it, sort them by ts (the lines of spans are written at their end but carry their
 * start), write them. Only one rank's Chrome events are held in memory at once.
 */
#include "chrome.h"
#include "export.h"
#include "trace.h"
#include "view_file.h"

#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* The tracks of a rank. Their thread id is pid * 10 + track, not the track alone: Perfetto takes the thread whose
 * tid equals its pid for the process's main thread and labels its track "main thread", whatever its name.
 * compute is the host thread (the compute stream): compute spans, waits, state instants. comm holds the collectives
 * the host ran itself (stream "compute", the blocking forms): they are host time too, but on the compute track they
 * would nest inside or straddle compute spans, and labs 01-05 read best with comm on a row of its own. Each comm
 * stream gets a track, named only when the rank has work on it, so a blocking run shows the three rows it always
 * had. The numbers 1-3 are those of version 2's export; the sort index puts the streams between comm and memory. */
enum { TRACK_COMPUTE = 1, TRACK_COMM = 2, TRACK_MEMORY = 3, TRACK_ALL_GATHER = 4, TRACK_REDUCE_SCATTER = 5,
       TRACK_LAST = TRACK_REDUCE_SCATTER };
static const char *const track_names[] = {NULL, "compute", "comm", "memory", "all_gather stream",
                                          "reduce_scatter stream"};
static const int track_sort_index[] = {0, 1, 2, 5, 3, 4};

static int tid_of(int pid, int track) { return pid * 10 + track; }

/* How far into its slice a flow event sits: 1 ns, the events' resolution (see flow_plan_make). */
#define FLOW_BIND_OFFSET_US 0.001

/* The track of a collective: its stream's, or comm for the blocking forms. */
static int collective_track(run_stream stream) {
    switch (stream) {
    case RUN_STREAM_ALL_GATHER: return TRACK_ALL_GATHER;
    case RUN_STREAM_REDUCE_SCATTER: return TRACK_REDUCE_SCATTER;
    case RUN_STREAM_COMPUTE:
    case RUN_STREAM_COUNT: break;
    }
    return TRACK_COMM;
}

/* A Chrome event waiting to be written. `order` is its JSONL line number and `part` 0 for the event of that line,
 * 1, 2, ... for the flow events added after it: qsort is not stable, and events with equal ts must keep file order
 * (the memory counter's samples above all, and a flow event must follow the slice it binds to). */
typedef struct pending_event {
    double ts;
    size_t order;
    size_t part;
    cJSON *event;
} pending_event;

/* One rank's slice of one collective, as the flow plan sees it. */
typedef struct flow_member {
    int64_t seq;
    int group, group_ranks; /* with seq, which collective: the run's strings, RUN_NONE for the world (version 4) */
    double ts;
    double dur;
    double bind_ts;       /* where its flow event goes: ts + the collective's binding offset (flow_plan_make) */
    int rank;
    int track;            /* the track of the slice (collective_track) */
    size_t line;
    const char *op;
} flow_member;

/* Every collective slice of the run sorted by (seq, group, ts, rank): each run of equal seq and group is one
 * collective (the shard groups of HYBRID_SHARD run the same seq at once, each its own), and its first member the rank
 * that entered it first. */
typedef struct flow_plan {
    flow_member *members;
    size_t count;
} flow_plan;

/* The output file, written one event per line so it greps and diffs well. */
typedef struct trace_writer {
    FILE *file;
    size_t events_written;
    int out_of_memory;    /* an event could not be printed; the export fails at the end */
} trace_writer;

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
    cJSON *event = chrome_event("i", category, name, pid, tid_of(pid, TRACK_COMPUTE), ts);
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

/* A string field of the line into args. An optional one (`field` a RUN_HAS_*) is copied only when the line has it,
 * and a null stays null; a required one (`field` 0) is always there. */
static void string_arg(cJSON *args, const trace_run *run, const run_event *event, unsigned field, const char *key,
                       int index) {
    if (field != 0 && (event->present & field) == 0) return;
    if (index == RUN_NONE) cJSON_AddNullToObject(args, key);
    else cJSON_AddStringToObject(args, key, run_string(run, index));
}

/* ---- one converter per JSONL kind; each returns NULL only when out of memory ---- */

static int pid_of(const run_rank *rank) { return rank->rank + 1; }  /* some viewers hide pid 0 */

static cJSON *compute_convert(const trace_run *run, const run_rank *rank, const run_event *event) {
    cJSON *chrome = span_event("compute", run_string(run, event->label), pid_of(rank),
                               tid_of(pid_of(rank), TRACK_COMPUTE), event->ts, event->dur);
    cJSON *args = cJSON_AddObjectToObject(chrome, "args");
    string_arg(args, run, event, RUN_HAS_UNIT, "unit", event->unit);
    string_arg(args, run, event, RUN_HAS_PHASE, "phase", event->phase);
    return chrome;
}

/* A copy between the pools (version 4, CPU offload): "h2d layers.0._local_shard" on the track of the stream that ran
 * it (the compute track when the host copied), category "copy", so a search for h2d / d2h finds every one. */
static cJSON *copy_convert(const trace_run *run, const run_rank *rank, const run_event *event) {
    char name[512];
    snprintf(name, sizeof name, "%s %s", run_string(run, event->direction), run_string(run, event->label));
    int track = event->ran_on == RUN_STREAM_COMPUTE ? TRACK_COMPUTE : collective_track(event->ran_on);
    cJSON *chrome = span_event("copy", name, pid_of(rank), tid_of(pid_of(rank), track), event->ts, event->dur);
    cJSON *args = cJSON_AddObjectToObject(chrome, "args");
    cJSON_AddStringToObject(args, "direction", run_string(run, event->direction));
    string_arg(args, run, event, RUN_HAS_UNIT, "unit", event->unit);
    cJSON_AddNumberToObject(args, "bytes", (double)event->bytes);
    cJSON_AddStringToObject(args, "stream", run_stream_names[event->ran_on]);
    return chrome;
}

/* args: the line's fields, and (version 3) its stream, when the host issued it and how long it queued on its
 * stream behind earlier work (ts - issue_ts). */
static cJSON *collective_convert(const trace_run *run, const run_rank *rank, const run_event *event) {
    /* A collective of a process group (version 4) is named "op (group)": Perfetto and Catapult colour slices by name,
     * so each group gets its own colour, and args say which ranks it joined. */
    char name[96];
    if (event->group != RUN_NONE)
        snprintf(name, sizeof name, "%s (%s)", run_string(run, event->label), run_string(run, event->group));
    else
        snprintf(name, sizeof name, "%s", run_string(run, event->label));
    cJSON *chrome = span_event("comm", name, pid_of(rank), tid_of(pid_of(rank), collective_track(event->ran_on)),
                               event->ts, event->dur);
    cJSON *args = cJSON_AddObjectToObject(chrome, "args");
    string_arg(args, run, event, RUN_HAS_UNIT, "unit", event->unit);
    string_arg(args, run, event, RUN_HAS_REDUCE, "reduce", event->reduce);
    string_arg(args, run, event, RUN_HAS_DTYPE, "dtype", event->dtype);
    if (event->present & RUN_HAS_COUNT) cJSON_AddNumberToObject(args, "count", (double)event->count);
    cJSON_AddNumberToObject(args, "bytes", (double)event->bytes);
    cJSON_AddNumberToObject(args, "bytes_sent", (double)event->bytes_sent);
    cJSON_AddNumberToObject(args, "bytes_recv", (double)event->bytes_recv);
    cJSON_AddNumberToObject(args, "seq", (double)event->seq);
    cJSON_AddStringToObject(args, "stream", run_stream_names[event->ran_on]);
    cJSON_AddNumberToObject(args, "issue_ts", event->issue_ts);
    cJSON_AddNumberToObject(args, "queued", event->ts - event->issue_ts);
    cJSON_AddStringToObject(args, "group", event->group != RUN_NONE ? run_string(run, event->group) : "world");
    cJSON_AddNumberToObject(args, "group_size", event->group_size);
    if (event->group_ranks != RUN_NONE)
        cJSON_AddStringToObject(args, "group_ranks", run_string(run, event->group_ranks));
    return chrome;
}

/* A wait: the host blocked, so a slice on the compute track, "wait all_gather layers.3". Waits for a comm stream
 * are exposed communication (category "exposed", what the summary adds up); a wait on the compute stream (the rate
 * limiter) is category "wait". */
static cJSON *wait_convert(const trace_run *run, const run_rank *rank, const run_event *event) {
    char name[512];
    const char *on = run_stream_names[event->waited_on];
    if (event->unit != RUN_NONE) snprintf(name, sizeof name, "wait %s %s", on, run_string(run, event->unit));
    else snprintf(name, sizeof name, "wait %s", on);
    cJSON *chrome = span_event(event->waited_on == RUN_STREAM_COMPUTE ? "wait" : "exposed", name, pid_of(rank),
                               tid_of(pid_of(rank), TRACK_COMPUTE), event->ts, event->dur);
    cJSON *args = cJSON_AddObjectToObject(chrome, "args");
    cJSON_AddStringToObject(args, "on", on);
    string_arg(args, run, event, 0, "op", event->label);  /* null when the wait is for no collective */
    string_arg(args, run, event, RUN_HAS_UNIT, "unit", event->unit);
    cJSON_AddNumberToObject(args, "seq", (double)event->seq);
    string_arg(args, run, event, RUN_HAS_HOOK, "hook", event->hook);
    return chrome;
}

/* The runtime's options, as a process-wide instant where the runtime started: "fsdp FULL_SHARD BACKWARD_PRE". */
static cJSON *fsdp_convert(const run_rank *rank, const run_event *event) {
    const run_fsdp *options = &rank->fsdp[event->id];
    char name[160];
    snprintf(name, sizeof name, "fsdp %s backward_prefetch=%s%s%s", options->sharding_strategy,
             options->backward_prefetch[0] ? options->backward_prefetch : "None",
             options->forward_prefetch ? " forward_prefetch" : "",
             options->limit_all_gathers ? " limit_all_gathers" : "");
    cJSON *chrome = instant_event("fsdp", name, pid_of(rank), "p", event->ts);
    cJSON_AddItemToObject(chrome, "args", run_fsdp_json(options));
    return chrome;
}

static cJSON *state_convert(const trace_run *run, const run_rank *rank, const run_event *event) {
    char name[512];
    snprintf(name, sizeof name, "%s: %s -> %s", run_string(run, event->unit), run_string(run, event->from),
             run_string(run, event->to));
    cJSON *chrome = instant_event("state", name, pid_of(rank), "t", event->ts);
    cJSON *args = cJSON_AddObjectToObject(chrome, "args");
    string_arg(args, run, event, 0, "machine", event->machine);
    string_arg(args, run, event, RUN_HAS_HOOK, "hook", event->hook);
    return chrome;
}

static cJSON *step_convert(const run_rank *rank, const run_event *event) {
    char name[96];
    if (event->micro < 0) snprintf(name, sizeof name, "step %d", event->step);
    else snprintf(name, sizeof name, "step %d micro %d", event->step, event->micro);
    cJSON *chrome = instant_event("step", name, pid_of(rank), "p", event->ts);
    cJSON *args = cJSON_AddObjectToObject(chrome, "args");
    cJSON_AddNumberToObject(args, "step", event->step);
    cJSON_AddNumberToObject(args, "micro", event->micro);
    cJSON_AddNumberToObject(args, "loss", event->loss);
    cJSON_AddNumberToObject(args, "peak_bytes", (double)event->peak_bytes);
    cJSON_AddNumberToObject(args, "peak_reserved", (double)event->reserved);
    cJSON_AddNumberToObject(args, "time", event->seconds);
    return chrome;
}

/* alloc and free move one category's running sum (in file order, which is the order the allocator saw them) and
 * emit a sample of every category, in EVENTS.md's order: the viewer then stacks the same series in the same order
 * at every sample and draws a category that drops to 0 as 0, not as its last value. The counter is recomputed, not
 * copied from `live`, so a wrong `live` in the JSONL shows. */
static cJSON *memory_convert(const run_rank *rank, const run_event *event, int64_t category_live[RUN_CATEGORY_COUNT],
                             const char *name) {
    category_live[event->category] += event->kind == RUN_ALLOC ? (int64_t)event->bytes : -(int64_t)event->bytes;
    cJSON *chrome = chrome_event("C", "memory", name, pid_of(rank), tid_of(pid_of(rank), TRACK_MEMORY), event->ts);
    cJSON *args = cJSON_AddObjectToObject(chrome, "args");
    for (int each = 0; each < RUN_CATEGORY_COUNT; each++)
        cJSON_AddNumberToObject(args, run_categories[each], (double)category_live[each]);
    return chrome;
}

/* segment_alloc and segment_free move the reserved bytes (the segments the caching allocator holds): a second counter,
 * `reserved`, on the memory track, drawn beside the stacked categories so the gap between them is the cache. Also
 * recomputed from the segment sizes, not copied. */
static cJSON *reserved_convert(const run_rank *rank, const run_event *event, int64_t *reserved, const char *name) {
    *reserved += event->kind == RUN_SEGMENT_ALLOC ? (int64_t)event->bytes : -(int64_t)event->bytes;
    cJSON *chrome = chrome_event("C", "memory", name, pid_of(rank), tid_of(pid_of(rank), TRACK_MEMORY), event->ts);
    cJSON *args = cJSON_AddObjectToObject(chrome, "args");
    cJSON_AddNumberToObject(args, "reserved", (double)*reserved);
    return chrome;
}

static cJSON *event_convert(const trace_run *run, const run_rank *rank, const run_event *event,
                            int64_t category_live[RUN_CATEGORY_COUNT], int64_t *reserved) {
    switch (event->kind) {
    case RUN_COMPUTE: return compute_convert(run, rank, event);
    case RUN_COPY: return copy_convert(run, rank, event);
    case RUN_COLLECTIVE: return collective_convert(run, rank, event);
    case RUN_STATE: return state_convert(run, rank, event);
    case RUN_MARK: return instant_event("mark", run_string(run, event->label), pid_of(rank), "p", event->ts);
    case RUN_STEP: return step_convert(rank, event);
    case RUN_ALLOC:
    case RUN_FREE: return memory_convert(rank, event, category_live, "memory");
    case RUN_SEGMENT_ALLOC:
    case RUN_SEGMENT_FREE: return reserved_convert(rank, event, reserved, "reserved");
    case RUN_WAIT: return wait_convert(run, rank, event);
    case RUN_FSDP: return fsdp_convert(rank, event);
    case RUN_END: return instant_event("mark", "end of run", pid_of(rank), "p", event->ts);
    case RUN_ALLOCATOR: break; /* skipped by the caller */
    }
    return NULL;  /* not reached: run.h has no other kind */
}

/* ---- flows: one arrow per (collective, receiving rank) ----
 *
 * Flow v1 events, not v2's bind_id on the slices: Perfetto drops a flow whose id is not a number, and Catapult drops
 * one whose end comes before its start, so an arrow must start at the rank that entered the collective first. Each
 * arrow is an "s" 1 ns into the sender's slice and an "f" ("bp":"e": bind to the slice it falls in, not the next
 * one) 1 ns into the receiver's, each on the track of its slice (comm, or the collective's stream); the receiver's
 * slice never starts earlier. */

static int member_compare(const void *left_pointer, const void *right_pointer) {
    const flow_member *left = left_pointer, *right = right_pointer;
    if (left->seq != right->seq) return left->seq < right->seq ? -1 : 1;
    if (left->group != right->group) return left->group < right->group ? -1 : 1;
    if (left->group_ranks != right->group_ranks) return left->group_ranks < right->group_ranks ? -1 : 1;
    if (left->ts != right->ts) return left->ts < right->ts ? -1 : 1;
    return (left->rank > right->rank) - (left->rank < right->rank);
}

static int same_collective(const flow_member *a, const flow_member *b) {
    return a->seq == b->seq && a->group == b->group && a->group_ranks == b->group_ranks;
}

static int flow_plan_make(flow_plan *plan, const trace_run *run, char *error, size_t error_size) {
    size_t count = 0;
    for (int rank = 0; rank < run->world; rank++)
        for (size_t index = 0; index < run->ranks[rank].event_count; index++)
            count += run->ranks[rank].events[index].kind == RUN_COLLECTIVE;
    plan->members = malloc((count + 1) * sizeof *plan->members);  /* + 1: never malloc(0) */
    plan->count = 0;
    if (plan->members == NULL) {
        snprintf(error, error_size, "%s: out of memory planning the flows of %zu collectives", run->rundir, count);
        return -1;
    }
    for (int rank = 0; rank < run->world; rank++)
        for (size_t index = 0; index < run->ranks[rank].event_count; index++) {
            const run_event *event = &run->ranks[rank].events[index];
            if (event->kind != RUN_COLLECTIVE) continue;
            plan->members[plan->count++] =
                (flow_member){event->seq, event->group, event->group_ranks, event->ts, event->dur, event->ts, rank,
                              collective_track(event->ran_on), event->line, run_string(run, event->label)};
        }
    if (plan->count > 0) qsort(plan->members, plan->count, sizeof *plan->members, member_compare);
    /* A flow event binds to the slice that encloses its ts, and Catapult takes the first such slice: at the very
     * start of a slice that begins where the one before it on the track ends (one stream's collectives, back to
     * back), that is the earlier one. So flow events sit FLOW_BIND_OFFSET_US into their slices, or half the shortest
     * slice of the collective when that is less; one offset per collective keeps every arrow pointing forward. */
    for (size_t first = 0, end; first < plan->count; first = end) {
        double offset = FLOW_BIND_OFFSET_US;
        for (end = first; end < plan->count && same_collective(&plan->members[end], &plan->members[first]); end++)
            if (plan->members[end].dur / 2 < offset) offset = plan->members[end].dur / 2;
        for (size_t index = first; index < end; index++)
            plan->members[index].bind_ts = plan->members[index].ts + offset;
    }
    return 0;
}

static cJSON *flow_event(const char *phase, const flow_member *member, size_t id) {
    int pid = member->rank + 1;
    cJSON *event = chrome_event(phase, "comm", member->op, pid, tid_of(pid, member->track), member->bind_ts);
    cJSON_AddNumberToObject(event, "id", (double)id);
    if (phase[0] == 'f') cJSON_AddStringToObject(event, "bp", "e");
    return event;
}

/* Appends the flow events of `rank` to pending (NULL: only counts them) and returns how many; *out_of_memory is set
 * when one could not be built. A collective's first member in the plan sends to each other member; an arrow's id
 * is 1 + the position of its receiving member in the plan, a number unique in the file. Each flow event sorts
 * right after its own slice: its ts is at most 1 ns later (and at an equal ts, a zero-length slice's, the same line
 * with a higher part), and nothing else on the track starts inside a collective's first nanosecond. */
static size_t rank_flows(const flow_plan *plan, int rank, pending_event *pending, int *out_of_memory) {
    size_t added = 0;
    for (size_t first = 0, end; first < plan->count; first = end) {
        const flow_member *sender = &plan->members[first];
        for (end = first + 1; end < plan->count && same_collective(&plan->members[end], sender); end++) {
            const flow_member *receiver = &plan->members[end];
            if (sender->rank == rank) {
                if (pending != NULL) {
                    cJSON *start = flow_event("s", sender, end + 1);
                    *out_of_memory |= start == NULL;
                    pending[added] = (pending_event){sender->bind_ts, sender->line, end - first, start};
                }
                added++;
            }
            if (receiver->rank == rank) {
                if (pending != NULL) {
                    cJSON *finish = flow_event("f", receiver, end + 1);
                    *out_of_memory |= finish == NULL;
                    pending[added] = (pending_event){receiver->bind_ts, receiver->line, 1, finish};
                }
                added++;
            }
        }
    }
    return added;
}

/* ---- ordering and writing ---- */

static int pending_compare(const void *left_pointer, const void *right_pointer) {
    const pending_event *left = left_pointer, *right = right_pointer;
    if (left->ts != right->ts) return left->ts < right->ts ? -1 : 1;
    if (left->order != right->order) return left->order < right->order ? -1 : 1;
    return (left->part > right->part) - (left->part < right->part);
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

/* compute, comm and memory are always named; a stream's track only when the rank ran something on it. */
static void metadata_write(trace_writer *writer, const run_rank *rank) {
    int pid = pid_of(rank), used[TRACK_LAST + 1] = {0, 1, 1, 1, 0, 0};
    for (size_t index = 0; index < rank->event_count; index++)
        if (rank->events[index].kind == RUN_COLLECTIVE) used[collective_track(rank->events[index].ran_on)] = 1;
    char process_name[32];
    snprintf(process_name, sizeof process_name, "rank %d", rank->rank);
    writer_put(writer, metadata_event("process_name", pid, 0, "name", cJSON_CreateString(process_name)));
    writer_put(writer, metadata_event("process_sort_index", pid, 0, "sort_index", cJSON_CreateNumber(rank->rank)));
    for (int track = TRACK_COMPUTE; track <= TRACK_LAST; track++) {
        if (!used[track]) continue;
        int tid = tid_of(pid, track);
        writer_put(writer, metadata_event("thread_name", pid, tid, "name", cJSON_CreateString(track_names[track])));
        writer_put(writer, metadata_event("thread_sort_index", pid, tid, "sort_index",
                                          cJSON_CreateNumber(track_sort_index[track])));
    }
}

/* Queues one converted line for ordering: 0, or -1 with `error` when the conversion ran out of memory (chrome NULL). */
static int pending_add(pending_event *pending, size_t *count, cJSON *chrome, const run_rank *rank,
                       const run_event *event, char *error, size_t error_size) {
    if (chrome == NULL) {
        snprintf(error, error_size, "%s line %zu: out of memory building the Chrome event", rank->path, event->line);
        return -1;
    }
    pending[(*count)++] = (pending_event){event->ts, event->line, 0, chrome};
    return 0;
}

/* Converts, orders and writes one rank with its flow events. ts is already 0 for the lines before the t0 mark
 * (run_load). */
static int rank_write(const trace_run *run, const run_rank *rank, const flow_plan *plan, trace_writer *writer,
                      char *error, size_t error_size) {
    int out_of_memory = 0;
    size_t flow_count = rank_flows(plan, rank->rank, NULL, &out_of_memory);
    size_t host_count = rank->host != NULL ? rank->host->event_count : 0;
    pending_event *pending = malloc((rank->event_count + host_count + flow_count + 1) * sizeof *pending); /* never 0 */
    if (pending == NULL) {
        snprintf(error, error_size, "%s: out of memory holding %zu events and %zu flow events", rank->path,
                 rank->event_count, flow_count);
        return -1;
    }
    int64_t category_live[RUN_CATEGORY_COUNT] = {0}, reserved = 0;
    size_t count = 0;
    int status = 0;
    for (size_t index = 0; status == 0 && index < rank->event_count; index++) {
        const run_event *event = &rank->events[index];
        if (event->kind == RUN_ALLOCATOR) continue; /* the settings: the snapshot and summary.txt show them */
        cJSON *chrome = event_convert(run, rank, event, category_live, &reserved);
        status = pending_add(pending, &count, chrome, rank, event, error, error_size);
    }
    /* CPU offload's host pool (version 4): its own two counters on the memory track, "host memory" (stacked by
     * category) and "host reserved", beside the device pool's: what lives where, and when it moves. */
    int64_t host_live[RUN_CATEGORY_COUNT] = {0}, host_reserved = 0;
    for (size_t index = 0; status == 0 && rank->host != NULL && index < rank->host->event_count; index++) {
        const run_event *event = &rank->host->events[index];
        cJSON *chrome = NULL;
        if (event->kind == RUN_ALLOC || event->kind == RUN_FREE)
            chrome = memory_convert(rank, event, host_live, "host memory");
        else if (event->kind == RUN_SEGMENT_ALLOC || event->kind == RUN_SEGMENT_FREE)
            chrome = reserved_convert(rank, event, &host_reserved, "host reserved");
        else
            continue; /* its allocator settings: summary.txt shows them */
        status = pending_add(pending, &count, chrome, rank, event, error, error_size);
    }
    if (status == 0) {
        count += rank_flows(plan, rank->rank, pending + count, &out_of_memory);
        if (out_of_memory) {
            snprintf(error, error_size, "%s: out of memory building its %zu flow events", rank->path, flow_count);
            status = -1;
        }
    }
    if (status == 0) {
        if (count > 0) qsort(pending, count, sizeof *pending, pending_compare);  /* its array must not be NULL */
        metadata_write(writer, rank);
        for (size_t index = 0; index < count; index++) writer_put(writer, pending[index].event);
    } else {
        for (size_t index = 0; index < count; index++) cJSON_Delete(pending[index].event);
    }
    free(pending);
    return status;
}

static void footer_write(trace_writer *writer, const trace_run *run) {
    cJSON *other = cJSON_CreateObject();
    cJSON_AddStringToObject(other, "schema", TRACE_SCHEMA_NAME);
    cJSON_AddNumberToObject(other, "version", TRACE_SCHEMA_VERSION);
    cJSON_AddNumberToObject(other, "world", run->world);
    cJSON_AddStringToObject(other, "rundir", run->rundir);
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

/* view_file writes <out>.tmp and renames it at the end, so a failed export never leaves a half trace.json that a
 * viewer would open without complaint. */
int chrome_write_run(const trace_run *run, const char *out_path, char *error, size_t error_size) {
    view_file view;
    if (view_file_open(&view, out_path, error, error_size) != 0) return -1;
    trace_writer writer = {.file = view.file};
    fputs("{\"traceEvents\":[\n", writer.file);
    flow_plan plan;
    int status = flow_plan_make(&plan, run, error, error_size);
    for (int rank = 0; status == 0 && rank < run->world; rank++)
        status = rank_write(run, &run->ranks[rank], &plan, &writer, error, error_size);
    free(plan.members);
    if (status == 0) footer_write(&writer, run);
    if (status == 0 && writer.out_of_memory) {
        snprintf(error, error_size, "out of memory printing an event for %s", view.temporary_path);
        status = -1;
    }
    return view_file_close(&view, status, error, error_size);
}

int chrome_export(const char *rundir, const char *out_path, char *error, size_t error_size) {
    return trace_export_view(rundir, out_path, CHROME_FILE_NAME, chrome_write_run, error, error_size);
}
