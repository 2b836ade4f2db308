/* test_trace.c — the event sink and its Chrome export, end to end: two sinks (ranks 0 and 1 of a world of 2) write a
 * small run into a temporary directory, chrome_export merges it, and the tests read trace.json back with cJSON.
 *
 * KEEP=1 ./test_trace also leaves one such run directory (path printed) for tests/validate_trace.py, so the C
 * exporter and the Python validator are checked against each other.
 */
#define _POSIX_C_SOURCE 200809L
#include "trace/chrome.h"
#include "trace/run.h"
#include "trace/trace.h"
#include "check_main.h"

#include <check.h>
#include <cjson/cJSON.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/wait.h>

enum { WORLD = 2, CATEGORY_COUNT = 12 };
static const char *const categories[CATEGORY_COUNT] = {
    "param_shard", "param_unsharded", "grad_unsharded", "grad_shard", "optim_state",
    "activation",  "checkpoint_input", "workspace",     "comm_buffer", "data",
    "kv_cache",    "param_shard_low_precision",
};
enum { PARAM_SHARD = 0, PARAM_UNSHARDED = 1, GRAD_SHARD = 3, ACTIVATION = 5 };

/* ---- writing a run, as the core would ---- */

/* The allocator's bookkeeping the core keeps (core/memory/mem.h, core/memory/allocator.h), reduced to what the events
 * report: one 2 MiB small-pool segment, taken at the first allocation, from which blocks (bytes rounded up to 512) are
 * carved one after the other and never reused, so the events are consistent (trace/segments.h checks them). */
enum { SEGMENT_BYTES = 2 << 20, ROUND = 512, MAX_IDS = 16 };
typedef struct ledger {
    uint64_t live;
    uint64_t category_live[CATEGORY_COUNT];
    uint64_t next_id;
    uint64_t segment;            /* its address, 0 until taken */
    uint64_t carved;             /* bytes of the segment handed out */
    uint64_t address[MAX_IDS];   /* each id's block */
    uint64_t size[MAX_IDS];
} ledger;

static uint64_t ledger_alloc(trace_sink *sink, ledger *book, int category, uint64_t bytes, const char *owner) {
    if (book->segment == 0) {
        book->segment = 0x7f0000000000ull + (uint64_t)sink->rank * SEGMENT_BYTES;
        trace_segment_info segment = {.id = 1, .address = book->segment, .bytes = SEGMENT_BYTES, .pool = "small",
                                      .owner = owner, .category = categories[category],
                                      .reserved_bytes = SEGMENT_BYTES};
        trace_segment_alloc(sink, &segment);
    }
    uint64_t id = ++book->next_id;
    ck_assert_uint_lt(id, MAX_IDS);
    book->size[id] = bytes == 0 ? ROUND : (bytes + ROUND - 1) / ROUND * ROUND;
    book->address[id] = book->segment + book->carved;
    book->carved += book->size[id];
    ck_assert_uint_le(book->carved, SEGMENT_BYTES);
    book->live += bytes;
    book->category_live[category] += bytes;
    trace_memory_info info = {.id = id, .bytes = bytes, .category = categories[category], .owner = owner,
                              .live_bytes = book->live, .category_live_bytes = book->category_live[category],
                              .address = book->address[id], .size = book->size[id], .segment = book->segment,
                              .reserved_bytes = SEGMENT_BYTES};
    trace_alloc(sink, &info);
    return id;
}

static void ledger_free(trace_sink *sink, ledger *book, uint64_t id, int category, uint64_t bytes,
                        const char *owner) {
    book->live -= bytes;
    book->category_live[category] -= bytes;
    trace_memory_info info = {.id = id, .bytes = bytes, .category = categories[category], .owner = owner,
                              .live_bytes = book->live, .category_live_bytes = book->category_live[category],
                              .address = book->address[id], .size = book->size[id], .segment = book->segment,
                              .reserved_bytes = SEGMENT_BYTES};
    trace_free(sink, &info);
}

/* Waits until the sink's clock has moved, so "later" events get a strictly larger ts. */
static void clock_advance(const trace_sink *sink, double microseconds) {
    double until = trace_now_us(sink) + microseconds;
    while (trace_now_us(sink) < until) {
    }
}

static void collective_write(trace_sink *sink, const char *op, const char *unit, uint64_t seq, double start_us) {
    uint64_t count = 1024, bytes = 4 * count;
    trace_collective_info info = {op,    unit,      strcmp(op, "reduce_scatter") == 0 ? "avg" : NULL,
                                  count, bytes,     bytes / 2,
                                  bytes / 2, seq,   "compute", start_us, start_us,
                                  trace_now_us(sink) - start_us, NULL, 0, NULL, "float32"};
    trace_collective(sink, &info);
}

/* One rank's run: every kind, and spans written after events that start later than they do (so the export must
 * sort). param_shard differs per rank so the two counters differ. Memory lines, in order:
 * param_shard P, +param_unsharded 4000, +activation 512, +grad_shard 1000, -param_unsharded, -activation. */
static void rank_write(const char *dir, int rank, int world) {
    trace_sink sink;
    ck_assert_int_eq(trace_open(&sink, dir, rank, world), 0);
    trace_reset_t0(&sink);
    ledger book = {0};
    ledger_alloc(&sink, &book, PARAM_SHARD, 1000 * (uint64_t)(rank + 1), "layers.0.flat_param");
    trace_state(&sink, "root", "TrainingState", "IDLE", "FORWARD_BACKWARD", "_root_pre_forward");

    double gather_start = trace_now_us(&sink);
    clock_advance(&sink, 5);
    uint64_t unsharded = ledger_alloc(&sink, &book, PARAM_UNSHARDED, 4000, "layers.0._full_param_padded");
    collective_write(&sink, "all_gather", "layers.0", 0, gather_start);

    double forward_start = trace_now_us(&sink);
    clock_advance(&sink, 5);
    trace_state(&sink, "layers.0", "HandleTrainingState", "IDLE", "FORWARD", "_pre_forward");
    uint64_t activation = ledger_alloc(&sink, &book, ACTIVATION, 512, "layers.0.activations");
    trace_compute(&sink, "layers.0.forward", "layers.0", "forward", forward_start, trace_now_us(&sink) - forward_start);
    trace_mark(&sink, "after forward");

    double scatter_start = trace_now_us(&sink);
    ledger_alloc(&sink, &book, GRAD_SHARD, 1000, "layers.0.grad");
    collective_write(&sink, "reduce_scatter", "layers.0", 1, scatter_start);
    ledger_free(&sink, &book, unsharded, PARAM_UNSHARDED, 4000, "layers.0._full_param_padded");
    ledger_free(&sink, &book, activation, ACTIVATION, 512, "layers.0.activations");
    trace_step(&sink, 1, -1, 2.5, 6512, 8192, 0.001);
    trace_close(&sink);
}

static char *run_dir_make(void) {
    char template[] = "/tmp/fsdplab-trace-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(template));
    return strdup(template);
}

static void run_dir_remove(char *dir) {
    DIR *listing = opendir(dir);
    if (listing != NULL) {
        char path[4096];
        for (struct dirent *entry; (entry = readdir(listing)) != NULL;) {
            if (strcmp(entry->d_name, ".") == 0 || strcmp(entry->d_name, "..") == 0) continue;
            snprintf(path, sizeof path, "%s/%s", dir, entry->d_name);
            unlink(path);
        }
        closedir(listing);
    }
    rmdir(dir);
    free(dir);
}

static void path_join(char *path, size_t size, const char *dir, const char *name) {
    ck_assert_int_lt(snprintf(path, size, "%s/%s", dir, name), (int)size);
}

/* Replaces line `line_number` (from 1) of the file with `text` (which carries its own newline or not). */
static void line_replace(const char *path, int line_number, const char *text) {
    FILE *file = fopen(path, "r");
    ck_assert_ptr_nonnull(file);
    char lines[64][2048];
    int count = 0;
    while (count < 64 && fgets(lines[count], sizeof lines[count], file) != NULL) count++;
    fclose(file);
    ck_assert_int_ge(count, line_number);
    file = fopen(path, "w");
    ck_assert_ptr_nonnull(file);
    for (int index = 0; index < count; index++) fputs(index + 1 == line_number ? text : lines[index], file);
    fclose(file);
}

static void text_append(const char *path, const char *text) {
    FILE *file = fopen(path, "a");
    ck_assert_ptr_nonnull(file);
    fputs(text, file);
    fclose(file);
}

static cJSON *trace_load(const char *path) {
    FILE *file = fopen(path, "r");
    ck_assert_msg(file != NULL, "cannot open %s", path);
    fseek(file, 0, SEEK_END);
    long size = ftell(file);
    rewind(file);
    char *text = malloc((size_t)size + 1);
    ck_assert_int_eq(fread(text, 1, (size_t)size, file), (size_t)size);
    text[size] = '\0';
    fclose(file);
    cJSON *trace = cJSON_Parse(text);
    free(text);
    ck_assert_msg(trace != NULL, "%s is not JSON", path);
    return trace;
}

/* ---- reading trace.json ---- */

static double number_of(const cJSON *object, const char *key) {
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(object, key);
    ck_assert_msg(cJSON_IsNumber(item), "no number '%s'", key);
    return item->valuedouble;
}

static const char *string_of(const cJSON *object, const char *key) {
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(object, key);
    return cJSON_IsString(item) ? item->valuestring : "";
}

static int is_phase(const cJSON *event, const char *phase) { return strcmp(string_of(event, "ph"), phase) == 0; }

/* The track (1 compute, 2 comm, 3 memory) of an event: its tid is pid * 10 + track, so that no tid equals its pid
 * (Perfetto would call that thread the process's "main thread"). */
static int track_of(const cJSON *event) {
    int pid = (int)number_of(event, "pid"), tid = (int)number_of(event, "tid");
    ck_assert_msg(tid != pid, "tid %d equals its pid", tid);
    ck_assert_msg(tid / 10 == pid, "tid %d is not pid %d * 10 + track", tid, pid);
    return tid % 10;
}

/* ---- the happy path: a fixture writes, exports and loads one run per test ---- */

static char *run_dir;
static cJSON *trace;
static const cJSON *events;

static void run_setup(void) {
    run_dir = run_dir_make();
    for (int rank = 0; rank < WORLD; rank++) rank_write(run_dir, rank, WORLD);
    char error[1024] = "", path[4096];
    ck_assert_msg(chrome_export(run_dir, NULL, error, sizeof error) == 0, "chrome_export: %s", error);
    path_join(path, sizeof path, run_dir, "trace.json");
    trace = trace_load(path);
    events = cJSON_GetObjectItemCaseSensitive(trace, "traceEvents");
    ck_assert(cJSON_IsArray(events));
}

static void run_teardown(void) {
    cJSON_Delete(trace);
    run_dir_remove(run_dir);
}

START_TEST(test_pids_are_ranks_plus_one) {
    int seen[WORLD + 2] = {0};
    const cJSON *event;
    cJSON_ArrayForEach(event, events) {
        int pid = (int)number_of(event, "pid");
        ck_assert_msg(pid == 1 || pid == 2, "pid %d", pid);
        seen[pid]++;
    }
    ck_assert_int_gt(seen[1], 0);
    ck_assert_int_gt(seen[2], 0);
}
END_TEST

START_TEST(test_metadata_names) {
    static const char *const thread_names[] = {NULL, "compute", "comm", "memory"};
    int process_names = 0, thread_named = 0;
    const cJSON *event;
    cJSON_ArrayForEach(event, events) {
        if (!is_phase(event, "M")) continue;
        int pid = (int)number_of(event, "pid");
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(event, "args");
        if (strcmp(string_of(event, "name"), "process_name") == 0) {
            char expected[32];
            snprintf(expected, sizeof expected, "rank %d", pid - 1);
            ck_assert_str_eq(string_of(args, "name"), expected);
            process_names++;
        } else if (strcmp(string_of(event, "name"), "process_sort_index") == 0) {
            ck_assert_int_eq((int)number_of(args, "sort_index"), pid - 1);
        } else if (strcmp(string_of(event, "name"), "thread_name") == 0) {
            int track = track_of(event);
            ck_assert_int_ge(track, 1);
            ck_assert_int_le(track, 3);
            ck_assert_str_eq(string_of(args, "name"), thread_names[track]);
            thread_named++;
        }
    }
    ck_assert_int_eq(process_names, WORLD);
    ck_assert_int_eq(thread_named, 3 * WORLD);
}
END_TEST

/* The memory lines of rank_write, as live bytes per category after each. */
static void counter_expect(int rank, int sample, uint64_t live[CATEGORY_COUNT]) {
    memset(live, 0, CATEGORY_COUNT * sizeof *live);
    live[PARAM_SHARD] = 1000 * (uint64_t)(rank + 1);
    if (sample >= 1 && sample < 4) live[PARAM_UNSHARDED] = 4000;
    if (sample >= 2 && sample < 5) live[ACTIVATION] = 512;
    if (sample >= 3) live[GRAD_SHARD] = 1000;
}

START_TEST(test_memory_counter_values) {
    int samples[WORLD + 1] = {0}, reserved_samples[WORLD + 1] = {0};
    const cJSON *event;
    cJSON_ArrayForEach(event, events) {
        if (!is_phase(event, "C")) continue;
        if (strcmp(string_of(event, "name"), "reserved") == 0) { /* the one segment, taken before the first block */
            const cJSON *args = cJSON_GetObjectItemCaseSensitive(event, "args");
            ck_assert_int_eq(track_of(event), 3);
            ck_assert_int_eq(cJSON_GetArraySize(args), 1);
            ck_assert_double_eq(number_of(args, "reserved"), SEGMENT_BYTES);
            reserved_samples[(int)number_of(event, "pid")]++;
            continue;
        }
        ck_assert_str_eq(string_of(event, "name"), "memory");
        ck_assert_int_eq(track_of(event), 3);
        int pid = (int)number_of(event, "pid");
        uint64_t live[CATEGORY_COUNT];
        counter_expect(pid - 1, samples[pid]++, live);
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(event, "args");
        ck_assert_int_eq(cJSON_GetArraySize(args), CATEGORY_COUNT);
        int index = 0;
        const cJSON *series;
        cJSON_ArrayForEach(series, args) {  /* every category, in EVENTS.md's order */
            ck_assert_str_eq(series->string, categories[index]);
            ck_assert_msg(series->valuedouble == (double)live[index], "rank %d sample %d %s: %g, expected %llu",
                          pid - 1, samples[pid] - 1, series->string, series->valuedouble,
                          (unsigned long long)live[index]);
            index++;
        }
    }
    ck_assert_int_eq(samples[1], 6);
    ck_assert_int_eq(samples[2], 6);
    ck_assert_int_eq(reserved_samples[1], 1);
    ck_assert_int_eq(reserved_samples[2], 1);
}
END_TEST

/* Flow checks shared by the fixture's run and the hand-timed one. A collective slice of one rank, and a flow event. */
typedef struct slice_seen {
    int pid;
    int seq;
    double ts;
} slice_seen;

typedef struct flow_seen {
    int pid;
    double ts;
    int count;  /* events seen with this id and phase */
} flow_seen;

enum { MAX_SLICES = 32, MAX_FLOW_IDS = 64 };

typedef struct flows_seen {
    slice_seen slices[MAX_SLICES];
    int slice_count;
    flow_seen starts[MAX_FLOW_IDS], finishes[MAX_FLOW_IDS];
} flows_seen;

/* Reads the comm slices and the flow events of trace.json: no slice carries v2 flow fields, every flow event is on
 * a comm track with a numeric id, and an "f" binds to its enclosing slice ("bp":"e"). */
static void flows_read(const cJSON *trace_events, flows_seen *seen) {
    memset(seen, 0, sizeof *seen);
    const cJSON *event;
    cJSON_ArrayForEach(event, trace_events) {
        if (is_phase(event, "M")) continue;
        if (is_phase(event, "X") && strcmp(string_of(event, "cat"), "comm") == 0) {  /* comm or a stream track */
            ck_assert_ptr_null(cJSON_GetObjectItemCaseSensitive(event, "bind_id"));
            ck_assert_ptr_null(cJSON_GetObjectItemCaseSensitive(event, "flow_in"));
            ck_assert_ptr_null(cJSON_GetObjectItemCaseSensitive(event, "flow_out"));
            ck_assert_int_lt(seen->slice_count, MAX_SLICES);
            seen->slices[seen->slice_count++] = (slice_seen){
                (int)number_of(event, "pid"), (int)number_of(cJSON_GetObjectItemCaseSensitive(event, "args"), "seq"),
                number_of(event, "ts")};
        }
        int start = is_phase(event, "s"), finish = is_phase(event, "f");
        if (!start && !finish) continue;
        int track = track_of(event);
        ck_assert_msg(track == 2 || track == 4 || track == 5, "flow event on track %d", track);
        int id = (int)number_of(event, "id");
        ck_assert_msg(id >= 1 && id < MAX_FLOW_IDS, "flow id %d", id);
        if (finish) ck_assert_str_eq(string_of(event, "bp"), "e");
        flow_seen *flow = start ? &seen->starts[id] : &seen->finishes[id];
        *flow = (flow_seen){(int)number_of(event, "pid"), number_of(event, "ts"), flow->count + 1};
    }
}

/* A flow event sits 1 ns into its slice (EVENTS.md "Flows"; at the very start Catapult binds it to a slice of the
 * same track that ends there). */
static int flow_in_slice(const slice_seen *slice, int pid, double ts) {
    return slice->pid == pid && ts >= slice->ts && ts - slice->ts <= 0.001 + 1e-9;
}

/* The slice of `seq` on `pid` that a flow event at ts falls in (1 ns after its start). */
static void flow_binds(const flows_seen *seen, int pid, double ts, int seq) {
    for (int index = 0; index < seen->slice_count; index++) {
        const slice_seen *slice = &seen->slices[index];
        if (slice->pid == pid && slice->seq == seq) {
            ck_assert_msg(flow_in_slice(slice, pid, ts), "pid %d seq %d: flow event at ts %.4f, slice at %.4f", pid,
                          seq, ts, slice->ts);
            return;
        }
    }
    ck_abort_msg("pid %d has no slice of seq %d", pid, seq);
}

/* Checks that seq's arrows start at `sender` (a pid) and end once at each other pid of `world`; returns how many. */
static int flows_of_seq(const flows_seen *seen, int seq, int sender, int world) {
    int arrows = 0, received[16] = {0};
    for (int id = 1; id < MAX_FLOW_IDS; id++) {
        const flow_seen *start = &seen->starts[id], *finish = &seen->finishes[id];
        ck_assert_msg(start->count == finish->count && start->count <= 1, "flow %d: %d starts, %d ends", id,
                      start->count, finish->count);
        if (start->count == 0) continue;
        int start_seq = -1;
        for (int index = 0; index < seen->slice_count; index++)
            if (flow_in_slice(&seen->slices[index], start->pid, start->ts)) start_seq = seen->slices[index].seq;
        if (start_seq != seq) continue;
        ck_assert_int_eq(start->pid, sender);
        flow_binds(seen, start->pid, start->ts, seq);
        flow_binds(seen, finish->pid, finish->ts, seq);
        ck_assert_msg(finish->ts >= start->ts, "flow %d ends at %g before it starts at %g", id, finish->ts, start->ts);
        ck_assert_int_ne(finish->pid, sender);
        received[finish->pid]++;
        arrows++;
    }
    for (int pid = 1; pid <= world; pid++) ck_assert_int_eq(received[pid], pid == sender ? 0 : 1);
    return arrows;
}

/* The pid whose slice of seq starts first, the lower on a tie. */
static int first_pid(const flows_seen *seen, int seq) {
    int pid = 0;
    double ts = 0;
    for (int index = 0; index < seen->slice_count; index++) {
        const slice_seen *slice = &seen->slices[index];
        if (slice->seq != seq) continue;
        if (pid == 0 || slice->ts < ts || (slice->ts == ts && slice->pid < pid)) {
            pid = slice->pid;
            ts = slice->ts;
        }
    }
    return pid;
}

START_TEST(test_collective_flows) {
    flows_seen seen;
    flows_read(events, &seen);
    ck_assert_int_eq(seen.slice_count, 2 * WORLD);
    int arrows = 0;
    for (int seq = 0; seq < 2; seq++) arrows += flows_of_seq(&seen, seq, first_pid(&seen, seq), WORLD);
    ck_assert_int_eq(arrows, 2 * (WORLD - 1));
}
END_TEST

/* Three ranks whose collectives start at chosen times: seq 0 is entered first by rank 2, seq 1 by rank 1, seq 2 by
 * ranks 0 and 2 at once. The arrows must start at that rank (the lower on a tie), not at rank 0. */
START_TEST(test_flows_start_at_the_first_rank) {
    enum { RANKS = 3 };
    static const double starts[3][RANKS] = {{30, 20, 10}, {60, 50, 70}, {90, 95, 90}};
    char *dir = run_dir_make(), error[1024] = "", path[4096];
    for (int rank = 0; rank < RANKS; rank++) {
        trace_sink sink;
        ck_assert_int_eq(trace_open(&sink, dir, rank, RANKS), 0);
        trace_reset_t0(&sink);
        for (int seq = 0; seq < 3; seq++) {
            trace_collective_info info = {"all_gather", "layers.0", NULL, 1024, 4096, 2048, 2048, (uint64_t)seq,
                                          "compute", starts[seq][rank], starts[seq][rank], 5, NULL, 0, NULL, "float32"};
            trace_collective(&sink, &info);
        }
        trace_close(&sink);
    }
    ck_assert_msg(chrome_export(dir, NULL, error, sizeof error) == 0, "chrome_export: %s", error);
    path_join(path, sizeof path, dir, "trace.json");
    cJSON *timed_trace = trace_load(path);
    flows_seen seen;
    flows_read(cJSON_GetObjectItemCaseSensitive(timed_trace, "traceEvents"), &seen);
    ck_assert_int_eq(flows_of_seq(&seen, 0, 3, RANKS), 2);
    ck_assert_int_eq(flows_of_seq(&seen, 1, 2, RANKS), 2);
    ck_assert_int_eq(flows_of_seq(&seen, 2, 1, RANKS), 2);
    cJSON_Delete(timed_trace);
    run_dir_remove(dir);
}
END_TEST

START_TEST(test_tracks_sorted_by_ts) {
    double last[WORLD + 1][4];
    for (int pid = 0; pid <= WORLD; pid++)
        for (int track = 0; track < 4; track++) last[pid][track] = -1;
    int forward_before_state = 0;
    const cJSON *event;
    cJSON_ArrayForEach(event, events) {
        if (is_phase(event, "M")) continue;
        int pid = (int)number_of(event, "pid"), track = track_of(event);
        double ts = number_of(event, "ts");
        ck_assert_msg(ts >= last[pid][track], "pid %d track %d: ts %g after %g", pid, track, ts, last[pid][track]);
        last[pid][track] = ts;
        /* the forward span's line comes after the state it contains; sorted, the span comes first */
        if (strcmp(string_of(event, "name"), "layers.0.forward") == 0) forward_before_state++;
        if (strcmp(string_of(event, "name"), "layers.0: IDLE -> FORWARD") == 0) {
            ck_assert_str_eq(string_of(event, "s"), "t");
            ck_assert_int_eq(forward_before_state, pid);
        }
    }
    ck_assert_int_eq(forward_before_state, WORLD);
}
END_TEST

START_TEST(test_marks_and_steps_are_process_instants) {
    int marks = 0, steps = 0;
    const cJSON *event;
    cJSON_ArrayForEach(event, events) {
        if (!is_phase(event, "i") || strcmp(string_of(event, "s"), "p") != 0) continue;
        if (strcmp(string_of(event, "name"), "after forward") == 0) marks++;
        if (strcmp(string_of(event, "name"), "step 1") == 0) steps++;
    }
    ck_assert_int_eq(marks, WORLD);
    ck_assert_int_eq(steps, WORLD);
}
END_TEST

/* ---- version 3: streams, waits, the fsdp event ---- */

/* Two ranks, hand-timed (us): all_gather seq 0 [10,30] and seq 1 [30,50] back to back on the all_gather stream (seq
 * 1 issued at 12, so queued 18), the host waiting for seq 0 over [12,31) and computing [31,45); reduce_scatter seq 2
 * [50,60] on its stream; a blocking all_reduce seq 3 [60,65]; a rate-limiter wait on compute [65,66). */
static char *streams_run_write(void) {
    char *dir = run_dir_make();
    for (int rank = 0; rank < WORLD; rank++) {
        trace_sink sink;
        ck_assert_int_eq(trace_open(&sink, dir, rank, WORLD), 0);
        trace_reset_t0(&sink);
        trace_fsdp_info options = {"Qwen2ForCausalLM", "FULL_SHARD", "BACKWARD_PRE", 1, 1, 0, 0, 2, 3, 0, NULL, NULL,
                                   NULL, 0};
        trace_fsdp(&sink, &options);
        trace_collective_info gathers[2] = {
            {"all_gather", "root", NULL, 1024, 4096, 2048, 2048, 0, "all_gather", 10, 10, 20, NULL, 0, NULL, "float32"},
            {"all_gather", "layers.0", NULL, 1024, 4096, 2048, 2048, 1, "all_gather", 12, 30, 20, NULL, 0, NULL,
             "float32"}};
        trace_collective(&sink, &gathers[0]);
        trace_wait_info waited = {"all_gather", "all_gather", "root", 0, "_pre_forward", 12, 19};
        trace_wait(&sink, &waited);
        trace_compute(&sink, "root.forward", "root", "forward", 31, 14);
        trace_collective(&sink, &gathers[1]);
        trace_collective_info scatter = {"reduce_scatter", "layers.0", "avg", 1024, 4096, 2048, 2048, 2,
                                         "reduce_scatter", 50, 50, 10, NULL, 0, NULL, "float32"};
        trace_collective(&sink, &scatter);
        trace_collective_info loss = {"all_reduce", "loss", "sum", 1, 4, 4, 4, 3, "compute", 60, 60, 5, NULL, 0, NULL,
                                      "float32"};
        trace_collective(&sink, &loss);
        trace_wait_info limiter = {"compute", NULL, NULL, -1, NULL, 65, 1};
        trace_wait(&sink, &limiter);
        trace_close(&sink);
    }
    char error[1024] = "";
    ck_assert_msg(chrome_export(dir, NULL, error, sizeof error) == 0, "chrome_export: %s", error);
    return dir;
}

static const cJSON *event_named(const cJSON *trace_events, int pid, const char *name) {
    const cJSON *event;
    cJSON_ArrayForEach(event, trace_events)
        if (!is_phase(event, "M") && (int)number_of(event, "pid") == pid && strcmp(string_of(event, "name"), name) == 0)
            return event;
    ck_abort_msg("pid %d has no event named '%s'", pid, name);
    return NULL;
}

START_TEST(test_stream_tracks_waits_and_fsdp) {
    char *dir = streams_run_write(), path[4096];
    path_join(path, sizeof path, dir, "trace.json");
    cJSON *loaded = trace_load(path);
    const cJSON *all = cJSON_GetObjectItemCaseSensitive(loaded, "traceEvents"), *event;
    /* every rank names its five tracks here (it has work on both streams); sort: compute, comm, streams, memory */
    static const char *const names[] = {NULL, "compute", "comm", "memory", "all_gather stream",
                                        "reduce_scatter stream"};
    static const int sort_index[] = {0, 1, 2, 5, 3, 4};
    int named = 0;
    cJSON_ArrayForEach(event, all) {
        if (!is_phase(event, "M")) continue;
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(event, "args");
        if (strcmp(string_of(event, "name"), "thread_name") == 0) {
            ck_assert_str_eq(string_of(args, "name"), names[track_of(event)]);
            named++;
        }
        if (strcmp(string_of(event, "name"), "thread_sort_index") == 0)
            ck_assert_int_eq((int)number_of(args, "sort_index"), sort_index[track_of(event)]);
    }
    ck_assert_int_eq(named, 5 * WORLD);
    for (int pid = 1; pid <= WORLD; pid++) {
        const cJSON *gather = NULL, *scatter = event_named(all, pid, "reduce_scatter");
        cJSON_ArrayForEach(event, all)
            if (is_phase(event, "X") && (int)number_of(event, "pid") == pid &&
                strcmp(string_of(event, "name"), "all_gather") == 0 &&
                number_of(cJSON_GetObjectItemCaseSensitive(event, "args"), "seq") == 1)
                gather = event;
        ck_assert_ptr_nonnull(gather);
        ck_assert_int_eq(track_of(gather), 4);
        ck_assert_int_eq(track_of(scatter), 5);
        ck_assert_int_eq(track_of(event_named(all, pid, "all_reduce")), 2);  /* blocking: the comm track */
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(gather, "args");
        ck_assert_str_eq(string_of(args, "stream"), "all_gather");
        ck_assert_double_eq(number_of(args, "issue_ts"), 12);
        ck_assert_double_eq(number_of(args, "queued"), 18);
        const cJSON *waited = event_named(all, pid, "wait all_gather root");
        ck_assert(is_phase(waited, "X"));
        ck_assert_int_eq(track_of(waited), 1);
        ck_assert_str_eq(string_of(waited, "cat"), "exposed");
        ck_assert_double_eq(number_of(waited, "ts"), 12);
        ck_assert_double_eq(number_of(waited, "dur"), 19);
        args = cJSON_GetObjectItemCaseSensitive(waited, "args");
        ck_assert_str_eq(string_of(args, "on"), "all_gather");
        ck_assert_str_eq(string_of(args, "op"), "all_gather");
        ck_assert_str_eq(string_of(args, "unit"), "root");
        ck_assert_str_eq(string_of(args, "hook"), "_pre_forward");
        ck_assert_double_eq(number_of(args, "seq"), 0);
        const cJSON *limiter = event_named(all, pid, "wait compute");
        ck_assert_str_eq(string_of(limiter, "cat"), "wait");
        ck_assert(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(limiter, "args"),
                                                                "op")));
        const cJSON *mode = event_named(all, pid, "fsdp FULL_SHARD backward_prefetch=BACKWARD_PRE forward_prefetch "
                                                  "limit_all_gathers");
        ck_assert_str_eq(string_of(mode, "s"), "p");
        ck_assert_double_eq(number_of(cJSON_GetObjectItemCaseSensitive(mode, "args"), "unit_count"), 3);
    }
    /* seq 1 starts on its stream where seq 0 ends: its arrow must still bind to seq 1, 1 ns in */
    flows_seen seen;
    flows_read(all, &seen);
    for (int seq = 0; seq < 4; seq++) ck_assert_int_eq(flows_of_seq(&seen, seq, first_pid(&seen, seq), WORLD), 1);
    cJSON_Delete(loaded);
    run_dir_remove(dir);
}
END_TEST

/* run.h's view of the same run: kinds, streams, the fsdp options. */
START_TEST(test_reader_streams) {
    char *dir = streams_run_write(), error[1024] = "";
    trace_run run;
    ck_assert_msg(run_load(&run, dir, error, sizeof error) == 0, "run_load: %s", error);
    const run_rank *rank = &run.ranks[1];
    ck_assert_int_eq(rank->version, TRACE_SCHEMA_VERSION);
    ck_assert_uint_eq(rank->fsdp_count, 1);
    ck_assert_str_eq(rank->fsdp[0].backward_prefetch, "BACKWARD_PRE");
    ck_assert_int_eq(rank->fsdp[0].limit_all_gathers, 1);
    ck_assert_int_eq(rank->fsdp[0].accumulation_steps, 2);
    int waits = 0, collectives = 0;
    for (size_t index = 0; index < rank->event_count; index++) {
        const run_event *event = &rank->events[index];
        if (event->kind == RUN_WAIT) {
            waits++;
            ck_assert_int_eq(event->ran_on, RUN_STREAM_COMPUTE);
            if (event->seq == 0) {
                ck_assert_int_eq(event->waited_on, RUN_STREAM_ALL_GATHER);
                ck_assert_str_eq(run_string(&run, event->hook), "_pre_forward");
            } else {
                ck_assert_int_eq(event->seq, -1);
                ck_assert_int_eq(event->waited_on, RUN_STREAM_COMPUTE);
                ck_assert_int_eq(event->label, RUN_NONE);
            }
        }
        if (event->kind == RUN_COLLECTIVE) {
            static const run_stream streams[] = {RUN_STREAM_ALL_GATHER, RUN_STREAM_ALL_GATHER,
                                                 RUN_STREAM_REDUCE_SCATTER, RUN_STREAM_COMPUTE};
            static const double issued[] = {10, 12, 50, 60};
            collectives++;
            ck_assert_int_eq(event->ran_on, streams[event->seq]);
            ck_assert_double_eq(event->issue_ts, issued[event->seq]);
        }
    }
    ck_assert_int_eq(waits, 2);
    ck_assert_int_eq(collectives, 4);
    run_free(&run);
    run_dir_remove(dir);
}
END_TEST

/* Writes rank files for a world of 1 from JSONL text (the meta line made with `version`). */
static char *jsonl_run_write(int version, const char *lines) {
    char *dir = run_dir_make(), path[4096];
    path_join(path, sizeof path, dir, "rank0.jsonl");
    FILE *file = fopen(path, "w");
    ck_assert_ptr_nonnull(file);
    fprintf(file,
            "{\"kind\":\"meta\",\"ts\":0,\"rank\":0,\"schema\":\"fsdplab-events\",\"version\":%d,\"world\":1}\n%s",
            version, lines);
    fclose(file);
    return dir;
}

/* A version 2 collective has no stream: it blocked the host, which issued it as it started. */
START_TEST(test_version2_collective_defaults) {
    char *dir = jsonl_run_write(2, "{\"kind\":\"collective\",\"ts\":7.5,\"rank\":0,\"op\":\"barrier\",\"unit\":\"x\","
                                   "\"bytes\":0,\"bytes_sent\":0,\"bytes_recv\":0,\"seq\":0,\"dur\":1}\n"),
         error[1024] = "";
    trace_run run;
    ck_assert_msg(run_load(&run, dir, error, sizeof error) == 0, "run_load: %s", error);
    ck_assert_int_eq(run.ranks[0].version, 2);
    ck_assert_int_eq(run.ranks[0].events[0].ran_on, RUN_STREAM_COMPUTE);
    ck_assert_double_eq(run.ranks[0].events[0].issue_ts, 7.5);
    run_free(&run);
    run_dir_remove(dir);
}
END_TEST

/* In version 3 the stream is required and must be one EVENTS.md names; issue_ts may not follow ts. */
START_TEST(test_version3_collective_refusals) {
    static const struct { const char *line, *wanted; } cases[] = {
        {"{\"kind\":\"collective\",\"ts\":7.5,\"rank\":0,\"op\":\"barrier\",\"unit\":\"x\",\"bytes\":0,"
         "\"bytes_sent\":0,\"bytes_recv\":0,\"seq\":0,\"dur\":1,\"issue_ts\":7}\n",
         "rank0.jsonl line 2: 'collective' event has no string field 'stream'"},
        {"{\"kind\":\"collective\",\"ts\":7.5,\"rank\":0,\"op\":\"barrier\",\"unit\":\"x\",\"bytes\":0,"
         "\"bytes_sent\":0,\"bytes_recv\":0,\"seq\":0,\"dur\":1,\"stream\":\"nccl\",\"issue_ts\":7}\n",
         "rank0.jsonl line 2: 'collective' field 'stream' is 'nccl'"},
        {"{\"kind\":\"collective\",\"ts\":7.5,\"rank\":0,\"op\":\"barrier\",\"unit\":\"x\",\"bytes\":0,"
         "\"bytes_sent\":0,\"bytes_recv\":0,\"seq\":4,\"dur\":1,\"stream\":\"all_gather\",\"issue_ts\":8}\n",
         "rank0.jsonl line 2: collective seq 4 issued at 8.000, after its stream started it at 7.500"},
        {"{\"kind\":\"wait\",\"ts\":1,\"rank\":0,\"stream\":\"compute\",\"on\":\"all_gather\",\"op\":null,"
         "\"unit\":null,\"seq\":-2,\"hook\":null,\"dur\":1}\n",
         "rank0.jsonl line 2: 'wait' field 'seq' is -2"},
    };
    for (size_t index = 0; index < sizeof cases / sizeof cases[0]; index++) {
        char *dir = jsonl_run_write(3, cases[index].line), error[1024] = "";
        trace_run run;
        ck_assert_int_eq(run_load(&run, dir, error, sizeof error), -1);
        ck_assert_msg(strstr(error, cases[index].wanted) != NULL, "case %zu: %s", index, error);
        run_free(&run);
        run_dir_remove(dir);
    }
}
END_TEST

/* A kind this reader does not know is skipped (a newer writer may add one), the rest read. */
START_TEST(test_unknown_kind_skipped) {
    char *dir = jsonl_run_write(3, "{\"kind\":\"from_the_future\",\"ts\":1,\"rank\":0}\n"
                                   "{\"kind\":\"mark\",\"ts\":2,\"rank\":0,\"text\":\"still read\"}\n"),
         error[1024] = "";
    trace_run run;
    ck_assert_msg(run_load(&run, dir, error, sizeof error) == 0, "run_load: %s", error);
    ck_assert_uint_eq(run.ranks[0].event_count, 1);
    ck_assert_str_eq(run_string(&run, run.ranks[0].events[0].label), "still read");
    run_free(&run);
    run_dir_remove(dir);
}
END_TEST

/* ---- errors: each test writes its own run and breaks it ---- */

static int export_broken(char *dir, char *error, size_t error_size) {
    int status = chrome_export(dir, NULL, error, error_size);
    char path[4096];
    path_join(path, sizeof path, dir, "trace.json");
    ck_assert_msg(status != 0 || access(path, F_OK) == 0, "exported but no trace.json");
    if (status != 0) ck_assert_msg(access(path, F_OK) != 0, "a failed export left %s", path);
    return status;
}

START_TEST(test_missing_rank_file) {
    char *dir = run_dir_make(), error[1024] = "";
    rank_write(dir, 0, WORLD);
    ck_assert_int_eq(export_broken(dir, error, sizeof error), -1);
    ck_assert_msg(strstr(error, "rank1.jsonl") != NULL, "error does not name the file: %s", error);
    run_dir_remove(dir);
}
END_TEST

START_TEST(test_world_disagrees) {
    char *dir = run_dir_make(), error[1024] = "";
    rank_write(dir, 0, WORLD);
    rank_write(dir, 1, 3);
    ck_assert_int_eq(export_broken(dir, error, sizeof error), -1);
    ck_assert_msg(strstr(error, "rank1.jsonl line 1") != NULL && strstr(error, "world is 3") != NULL &&
                      strstr(error, "world 2") != NULL,
                  "error does not name the file and both worlds: %s", error);
    run_dir_remove(dir);
}
END_TEST

START_TEST(test_malformed_middle_line) {
    char *dir = run_dir_make(), error[1024] = "", path[4096];
    for (int rank = 0; rank < WORLD; rank++) rank_write(dir, rank, WORLD);
    path_join(path, sizeof path, dir, "rank1.jsonl");
    line_replace(path, 4, "{\"kind\":\"mark\",\"ts\":\n");
    ck_assert_int_eq(export_broken(dir, error, sizeof error), -1);
    ck_assert_msg(strstr(error, "rank1.jsonl line 4:") != NULL, "error does not name the line: %s", error);
    run_dir_remove(dir);
}
END_TEST

/* The export reads through run.h, which pairs every free with a live alloc of its rank. */
START_TEST(test_unmatched_free_refused) {
    char *dir = run_dir_make(), error[1024] = "", path[4096];
    for (int rank = 0; rank < WORLD; rank++) rank_write(dir, rank, WORLD);
    path_join(path, sizeof path, dir, "rank1.jsonl");
    text_append(path, "{\"kind\":\"free\",\"ts\":99,\"rank\":1,\"id\":999,\"bytes\":8,\"category\":\"data\","
                      "\"owner\":\"nobody\",\"live\":0,\"category_live\":0,\"addr\":4096,\"size\":512,"
                      "\"segment\":4096,\"stream\":0,\"reserved\":2097152}\n");
    ck_assert_int_eq(export_broken(dir, error, sizeof error), -1);
    ck_assert_msg(strstr(error, "rank1.jsonl line 17:") != NULL && strstr(error, "id 999") != NULL,
                  "error does not name the line and the id: %s", error);
    run_dir_remove(dir);
}
END_TEST

/* run_load replays the allocator (trace/segments.h): a block laid over a live one is refused, naming both. Rank 1's
 * first block (id 1, 2000 bytes) sits at the start of its segment 0x7f0000200000. */
START_TEST(test_overlapping_block_refused) {
    char *dir = run_dir_make(), error[1024] = "", path[4096];
    for (int rank = 0; rank < WORLD; rank++) rank_write(dir, rank, WORLD);
    path_join(path, sizeof path, dir, "rank1.jsonl");
    text_append(path, "{\"kind\":\"alloc\",\"ts\":99,\"rank\":1,\"id\":99,\"bytes\":512,\"category\":\"data\","
                      "\"owner\":\"intruder\",\"live\":3512,\"category_live\":512,\"addr\":139637978825216,"
                      "\"size\":512,\"segment\":139637978824704,\"stream\":0,\"reserved\":2097152}\n");
    ck_assert_int_eq(export_broken(dir, error, sizeof error), -1);
    ck_assert_msg(strstr(error, "rank1.jsonl line 17:") != NULL && strstr(error, "overlaps live block id 1") != NULL,
                  "error does not name the line and the block: %s", error);
    run_dir_remove(dir);
}
END_TEST

/* ... and a reserved figure that is not the running sum of the segments. */
START_TEST(test_wrong_reserved_refused) {
    char *dir = run_dir_make(), error[1024] = "", path[4096];
    for (int rank = 0; rank < WORLD; rank++) rank_write(dir, rank, WORLD);
    path_join(path, sizeof path, dir, "rank1.jsonl");
    text_append(path, "{\"kind\":\"alloc\",\"ts\":99,\"rank\":1,\"id\":99,\"bytes\":512,\"category\":\"data\","
                      "\"owner\":\"x\",\"live\":3512,\"category_live\":512,\"addr\":139637979873280,"
                      "\"size\":512,\"segment\":139637978824704,\"stream\":0,\"reserved\":4194304}\n");
    ck_assert_int_eq(export_broken(dir, error, sizeof error), -1);
    ck_assert_msg(strstr(error, "rank1.jsonl line 17:") != NULL && strstr(error, "reserved 4194304") != NULL,
                  "error does not name the line and the figure: %s", error);
    run_dir_remove(dir);
}
END_TEST

START_TEST(test_truncated_last_line_skipped) {
    char *dir = run_dir_make(), error[1024] = "", path[4096];
    for (int rank = 0; rank < WORLD; rank++) rank_write(dir, rank, WORLD);
    path_join(path, sizeof path, dir, "rank1.jsonl");
    text_append(path, "{\"kind\":\"alloc\",\"ts\":12.5,\"ra");  /* a crash mid-line: no newline */
    ck_assert_msg(export_broken(dir, error, sizeof error) == 0, "chrome_export: %s", error);
    run_dir_remove(dir);
}
END_TEST

START_TEST(test_explicit_output_path) {
    char *dir = run_dir_make(), error[1024] = "", path[4096];
    for (int rank = 0; rank < WORLD; rank++) rank_write(dir, rank, WORLD);
    path_join(path, sizeof path, dir, "other.json");
    ck_assert_msg(chrome_export(dir, path, error, sizeof error) == 0, "chrome_export: %s", error);
    cJSON_Delete(trace_load(path));
    run_dir_remove(dir);
}
END_TEST

/* ---- the writer: cJSON's bytes without cJSON, buffered until a step's end, written out on a fatal signal ---- */

static long file_size(const char *path) {
    FILE *file = fopen(path, "r");
    ck_assert_ptr_nonnull(file);
    fseek(file, 0, SEEK_END);
    long size = ftell(file);
    fclose(file);
    return size;
}

/* Every line the writer prints is what cJSON_PrintUnformatted prints for the same object (the writer used to build
 * each event as a cJSON tree): parsed and printed again by cJSON, a line comes back byte for byte. The values are the
 * ones where number forms differ: ints at and past INT_MAX, 15 vs 17 digits, -0, NaN, tiny and huge, escapes. */
START_TEST(test_lines_print_as_cjson) {
    char *dir = run_dir_make(), path[4096];
    trace_sink sink;
    ck_assert_int_eq(trace_open_run(&sink, dir, 0, 4, "run \"quoted\"\t\x01"), 0);
    static const double values[] = {0.0,     -0.0,         0.1,       1.0 / 3.0,  2147483647.0, 2147483648.0,
                                    -2147483648.0, -2147483649.0, 1e20, 1e300, 5e-324, 123456.789012345678,
                                    0.30000000000000004, 1e15 + 0.5, 4294967296.0, 1234.567, -0.5, 0.001, 0.0005,
                                    -17.25, 999999999999.999, 1e12 + 0.5, 1e15 - 1, 1e15, -1e15 + 1, 3e-3 + 1e-12,
                                    140004275781632.0};
    int count = (int)(sizeof values / sizeof values[0]);
    for (int index = 0; index < count; index++)
        trace_step(&sink, index, -1, values[index], (uint64_t)index << 40, 7, values[(index + 1) % count]);
    trace_step(&sink, 99, -1, 0.0 / 0.0, 0, 0, 1.0 / 0.0);
    trace_mark(&sink, "\\ \" \b \f \n \r \t \x1f \x7f caf\xc3\xa9");
    trace_collective_info info = {"all_gather", "layers.0", NULL, 1024, 4096, 2048, 2048, 3, "all_gather", 1.5, 2.25,
                                  1e-4, "shard", 2, "0,2", "bfloat16"};
    trace_collective(&sink, &info);
    trace_fsdp_info fsdp = {"Qwen2ForCausalLM", "FULL_SHARD", NULL, 1, 0, 1, 0, 2, 3, 0, "bfloat16", "float32",
                            "bfloat16", 1};
    trace_fsdp(&sink, &fsdp);
    fsdp.param_dtype = NULL;
    trace_fsdp(&sink, &fsdp);
    trace_end(&sink);
    trace_close(&sink);
    path_join(path, sizeof path, dir, "rank0.jsonl");
    FILE *file = fopen(path, "r");
    ck_assert_ptr_nonnull(file);
    char line[4096];
    int lines = 0;
    while (fgets(line, sizeof line, file) != NULL) {
        line[strcspn(line, "\n")] = '\0';
        cJSON *event = cJSON_Parse(line);
        ck_assert_msg(event != NULL, "line %d is not JSON: %s", lines + 1, line);
        char *again = cJSON_PrintUnformatted(event);
        ck_assert_msg(strcmp(again, line) == 0, "line %d:\n  written %s\n  cJSON   %s", lines + 1, line, again);
        cJSON_free(again);
        cJSON_Delete(event);
        lines++;
    }
    fclose(file);
    ck_assert_int_eq(lines, 1 + count + 1 + 1 + 1 + 2 + 1);
    run_dir_remove(dir);
}
END_TEST

/* Events wait in the buffer until the step's end: no write per event. */
START_TEST(test_buffered_until_step_end) {
    char *dir = run_dir_make(), path[4096];
    trace_sink sink;
    ck_assert_int_eq(trace_open(&sink, dir, 0, 1), 0);
    path_join(path, sizeof path, dir, "rank0.jsonl");
    trace_reset_t0(&sink);
    for (int index = 0; index < 100; index++) trace_mark(&sink, "inside the step");
    ck_assert_int_eq(file_size(path), 0);
    trace_step(&sink, 1, -1, 2.5, 0, 0, 0.001);
    long after_step = file_size(path);
    ck_assert_int_gt(after_step, 100 * (long)strlen("inside the step"));
    trace_mark(&sink, "after the step");
    ck_assert_int_eq(file_size(path), after_step);
    trace_close(&sink);
    ck_assert_int_gt(file_size(path), after_step);
    run_dir_remove(dir);
}
END_TEST

/* A rank killed by a signal (MPI_Abort's SIGTERM, abort()'s SIGABRT) still leaves the events it had buffered, and
 * dies of that signal as before. */
START_TEST(test_fatal_signal_writes_the_buffer) {
    static const int signals[] = {SIGTERM, SIGABRT};
    for (int index = 0; index < 2; index++) {
        char *dir = run_dir_make(), path[4096];
        path_join(path, sizeof path, dir, "rank0.jsonl");
        pid_t child = fork();
        ck_assert_int_ge(child, 0);
        if (child == 0) {
            signal(signals[index], SIG_DFL); /* Check's own handlers aside: the disposition a rank starts with */
            trace_sink sink;
            if (trace_open(&sink, dir, 0, 1) != 0) _exit(3);
            trace_mark(&sink, "before the signal");
            raise(signals[index]);
            _exit(4);
        }
        int status = 0;
        ck_assert_int_eq(waitpid(child, &status, 0), child);
        ck_assert_msg(WIFSIGNALED(status) && WTERMSIG(status) == signals[index], "child status %d", status);
        FILE *file = fopen(path, "r");
        ck_assert_ptr_nonnull(file);
        char text[4096] = "";
        size_t read = fread(text, 1, sizeof text - 1, file);
        fclose(file);
        text[read] = '\0';
        ck_assert_msg(strstr(text, "\"text\":\"before the signal\"}\n") != NULL, "file holds: %s", text);
        run_dir_remove(dir);
    }
}
END_TEST

/* KEEP=1: one exported run left on disk for tests/validate_trace.py (a test, so ck_assert works in it). */
START_TEST(test_keep_run) {
    char *dir = run_dir_make(), error[1024] = "";
    for (int rank = 0; rank < WORLD; rank++) rank_write(dir, rank, WORLD);
    ck_assert_msg(chrome_export(dir, NULL, error, sizeof error) == 0, "chrome_export: %s", error);
    printf("test_trace: kept run %s\n", dir);
    fflush(stdout);
    free(dir);
}
END_TEST

static Suite *trace_suite(void) {
    Suite *suite = suite_create("trace");
    TCase *exported = tcase_create("export");
    tcase_add_checked_fixture(exported, run_setup, run_teardown);
    tcase_add_test(exported, test_pids_are_ranks_plus_one);
    tcase_add_test(exported, test_metadata_names);
    tcase_add_test(exported, test_memory_counter_values);
    tcase_add_test(exported, test_collective_flows);
    tcase_add_test(exported, test_tracks_sorted_by_ts);
    tcase_add_test(exported, test_marks_and_steps_are_process_instants);
    suite_add_tcase(suite, exported);
    TCase *errors = tcase_create("errors");
    tcase_add_test(errors, test_missing_rank_file);
    tcase_add_test(errors, test_world_disagrees);
    tcase_add_test(errors, test_malformed_middle_line);
    tcase_add_test(errors, test_unmatched_free_refused);
    tcase_add_test(errors, test_overlapping_block_refused);
    tcase_add_test(errors, test_wrong_reserved_refused);
    tcase_add_test(errors, test_truncated_last_line_skipped);
    tcase_add_test(errors, test_explicit_output_path);
    suite_add_tcase(suite, errors);
    TCase *writer = tcase_create("writer");
    tcase_add_test(writer, test_lines_print_as_cjson);
    tcase_add_test(writer, test_buffered_until_step_end);
    tcase_add_test(writer, test_fatal_signal_writes_the_buffer);
    suite_add_tcase(suite, writer);
    TCase *timed = tcase_create("flows");
    tcase_add_test(timed, test_flows_start_at_the_first_rank);
    suite_add_tcase(suite, timed);
    TCase *streams = tcase_create("streams");
    tcase_add_test(streams, test_stream_tracks_waits_and_fsdp);
    tcase_add_test(streams, test_reader_streams);
    tcase_add_test(streams, test_version2_collective_defaults);
    tcase_add_test(streams, test_version3_collective_refusals);
    tcase_add_test(streams, test_unknown_kind_skipped);
    suite_add_tcase(suite, streams);
    const char *keep = getenv("KEEP");
    if (keep != NULL && keep[0] != '\0') {
        TCase *kept = tcase_create("keep");
        tcase_add_test(kept, test_keep_run);
        suite_add_tcase(suite, kept);
    }
    return suite;
}

int main(void) {
    return check_run(trace_suite());
}
