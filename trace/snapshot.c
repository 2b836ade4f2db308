/* snapshot.c — see snapshot.h. The field names are those of torch.cuda.memory._snapshot()'s documented TypedDicts
 * (Snapshot, Segment, Block, Frame, TraceEntry) and what torch/utils/viz/MemoryViz.js reads from them. */
#include "snapshot.h"
#include "export.h"
#include "pickle.h"
#include "segments.h"
#include "view_file.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- when the snapshot is taken ----
 *
 * PyTorch's snapshot is the allocator's state at the moment torch.cuda.memory._snapshot() runs, with the trace of
 * everything before it. A run's last lines tear everything down (frees, empty_cache's segment_free), so the moment
 * here is the end of the last optimizer step (the last `step` event with micro -1, else the last `step`): the
 * segments the cache holds between steps, as a learner calling _snapshot() after the training loop would see them. A
 * run with no step (labs 01-04) is taken at its allocated peak, the moment the lab is about. */
static size_t snapshot_moment(const run_rank *rank) {
    size_t moment = rank->event_count, last_step = rank->event_count;
    for (size_t index = 0; index < rank->event_count; index++) {
        if (rank->events[index].kind != RUN_STEP) continue;
        last_step = index;
        if (rank->events[index].micro < 0) moment = index;
    }
    uint64_t live;
    if (moment == rank->event_count) moment = last_step;
    if (moment == rank->event_count) moment = segments_peak_index(rank, &live);
    return moment == rank->event_count ? rank->event_count : moment + 1;  /* events [0, moment) are in the trace */
}

/* Microseconds since the epoch: the viewer prints time_us as a date. ts counts from t0, taken right after the meta
 * line's unix_time (the start barrier in between), so this is the wall clock to within that barrier. A file may hold
 * any number there: one beyond int64 (converting it would be undefined behaviour) is written as 0, no date. */
static int64_t wall_time_us(const run_rank *rank, double ts) {
    double time_us = rank->unix_time * 1e6 + ts;
    return time_us > -9e18 && time_us < 9e18 ? (int64_t)time_us : 0;
}

/* ---- writing the snapshot ---- */

static void key_int(pickle_writer *writer, const char *key, int64_t value) {
    pickle_string(writer, key);
    pickle_int(writer, value);
}

static void key_string(pickle_writer *writer, const char *key, const char *value) {
    pickle_string(writer, key);
    pickle_string(writer, value);
}

static void frame_write(pickle_writer *writer, const char *filename, int64_t line, const char *name) {
    pickle_dict_begin(writer);
    key_string(writer, "filename", filename);
    key_int(writer, "line", line);
    key_string(writer, "name", name);
    pickle_dict_end(writer);
}

/* The "stack" of an alloc or free: the line that logged it, then its category. */
static void frames_write(pickle_writer *writer, const trace_run *run, const run_rank *rank, const run_event *event) {
    char filename[32];
    snprintf(filename, sizeof filename, "rank%d.jsonl", rank->rank);
    pickle_string(writer, "frames");
    pickle_list_begin(writer);
    frame_write(writer, filename, (int64_t)event->line, run_string(run, event->label));
    frame_write(writer, "fsdplab", 0, run_categories[event->category]);
    pickle_list_end(writer);
}

static void inactive_block_write(pickle_writer *writer, uint64_t address, uint64_t size) {
    pickle_dict_begin(writer);
    key_int(writer, "address", (int64_t)address);
    key_int(writer, "size", (int64_t)size);
    key_int(writer, "requested_size", 0);
    key_string(writer, "state", "inactive");
    pickle_string(writer, "frames");
    pickle_list_begin(writer);
    pickle_list_end(writer);
    pickle_dict_end(writer);
}

static void active_block_write(pickle_writer *writer, const trace_run *run, const run_rank *rank,
                               const segments_block *live) {
    const run_event *event = &rank->events[live->event];
    pickle_dict_begin(writer);
    key_int(writer, "address", (int64_t)live->address);
    key_int(writer, "size", (int64_t)live->size);
    key_int(writer, "requested_size", (int64_t)event->bytes);
    key_string(writer, "state", "active_allocated");
    frames_write(writer, run, rank, event);
    pickle_dict_end(writer);
}

/* A segment's blocks tile it exactly, live ones and the free gaps between them (the allocator merges free neighbours
 * at once, so each gap is one cached free block): the viewer finds each block's address by adding up the sizes
 * before it. */
static void blocks_write(pickle_writer *writer, const trace_run *run, const run_rank *rank,
                         const segments_segment *seg) {
    uint64_t cursor = seg->address;
    pickle_string(writer, "blocks");
    pickle_list_begin(writer);
    for (size_t index = 0; index < seg->block_count; index++) {
        const segments_block *live = &seg->blocks[index];
        if (live->address > cursor) inactive_block_write(writer, cursor, live->address - cursor);
        active_block_write(writer, run, rank, live);
        cursor = live->address + live->size;
    }
    if (cursor < seg->address + seg->bytes) inactive_block_write(writer, cursor, seg->address + seg->bytes - cursor);
    pickle_list_end(writer);
}

static void segment_write(pickle_writer *writer, const trace_run *run, const run_rank *rank,
                          const segments_segment *seg) {
    uint64_t requested = 0;
    for (size_t index = 0; index < seg->block_count; index++) requested += rank->events[seg->blocks[index].event].bytes;
    pickle_dict_begin(writer);
    key_int(writer, "device", rank->rank);
    key_int(writer, "address", (int64_t)seg->address);
    key_int(writer, "total_size", (int64_t)seg->bytes);
    key_int(writer, "allocated_size", (int64_t)seg->allocated);
    key_int(writer, "active_size", (int64_t)seg->allocated);
    key_int(writer, "requested_size", (int64_t)requested);
    key_int(writer, "stream", seg->stream);
    key_string(writer, "segment_type", run_string(run, seg->pool));
    pickle_string(writer, "segment_pool_id");  /* (0, 0): the default pool; a list, as the viewer reads no tuples */
    pickle_list_begin(writer);
    pickle_int(writer, 0);
    pickle_int(writer, 0);
    pickle_list_end(writer);
    pickle_string(writer, "is_expandable");
    pickle_bool(writer, 0);
    pickle_string(writer, "frames");
    pickle_list_begin(writer);
    frame_write(writer, "fsdplab", 0, "segment");
    pickle_list_end(writer);
    blocks_write(writer, run, rank, seg);
    pickle_dict_end(writer);
}

static void entry_begin(pickle_writer *writer, const run_rank *rank, const char *action, uint64_t address,
                        uint64_t size, int stream, double ts) {
    pickle_dict_begin(writer);
    key_string(writer, "action", action);
    key_int(writer, "addr", (int64_t)address);
    key_int(writer, "size", (int64_t)size);
    key_int(writer, "stream", stream);
    key_int(writer, "time_us", wall_time_us(rank, ts));
}

/* segment_alloc / segment_free: the allocator asking its backend (cudaMalloc in PyTorch) for memory or returning it;
 * the frame names the request that made it ask, if any. */
static void segment_entry_write(pickle_writer *writer, const trace_run *run, const run_rank *rank,
                                const run_event *event) {
    entry_begin(writer, rank, event->kind == RUN_SEGMENT_ALLOC ? "segment_alloc" : "segment_free", event->address,
                event->bytes, event->stream, event->ts);
    pickle_string(writer, "frames");
    pickle_list_begin(writer);
    char filename[32];
    snprintf(filename, sizeof filename, "rank%d.jsonl", rank->rank);
    const char *requester = event->label == RUN_NONE ? "empty_cache" : run_string(run, event->label);
    frame_write(writer, filename, (int64_t)event->line, requester);
    pickle_list_end(writer);
    pickle_dict_end(writer);
}

/* PyTorch records a free twice: requested, then completed once the block is reusable (at once, on one stream).
 * Sizes are the bytes asked for, as PyTorch's trace records them; the blocks in `segments` have both. */
static void memory_entries_write(pickle_writer *writer, const trace_run *run, const run_rank *rank,
                                 const run_event *event) {
    if (event->kind == RUN_ALLOC) {
        entry_begin(writer, rank, "alloc", event->address, event->bytes, event->stream, event->ts);
        key_string(writer, "category", run_categories[event->category]);
        frames_write(writer, run, rank, event);
        pickle_dict_end(writer);
        return;
    }
    static const char *const free_actions[] = {"free_requested", "free_completed"};
    for (int action = 0; action < 2; action++) {
        entry_begin(writer, rank, free_actions[action], event->address, event->bytes, event->stream, event->ts);
        frames_write(writer, run, rank, event);
        pickle_dict_end(writer);
    }
}

/* memory_viz adds 'unknown' to the categories it found, through a misspelt name (`snapshot.categores`) that throws
 * in the versions we read; a category 'unknown' already present skips that line. A final `snapshot` entry (the
 * moment the snapshot was taken, which draws nothing) carries it. */
static void snapshot_entry_write(pickle_writer *writer, const run_rank *rank, size_t end) {
    double last_ts = 0;
    for (size_t index = 0; index < end; index++)
        if (rank->events[index].ts > last_ts) last_ts = rank->events[index].ts;
    entry_begin(writer, rank, "snapshot", 0, 0, 0, last_ts);
    key_string(writer, "category", "unknown");
    pickle_string(writer, "frames");
    pickle_list_begin(writer);
    pickle_list_end(writer);
    pickle_dict_end(writer);
}

static void device_trace_write(pickle_writer *writer, const trace_run *run, const run_rank *rank, size_t end) {
    pickle_list_begin(writer);
    for (size_t index = 0; index < end; index++) {
        const run_event *event = &rank->events[index];
        if (event->kind == RUN_SEGMENT_ALLOC || event->kind == RUN_SEGMENT_FREE)
            segment_entry_write(writer, run, rank, event);
        if (event->kind == RUN_ALLOC || event->kind == RUN_FREE) memory_entries_write(writer, run, rank, event);
    }
    snapshot_entry_write(writer, rank, end);
    pickle_list_end(writer);
}

/* What PyTorch writes as `allocator_settings` (its CUDAAllocatorConfig), from rank 0's `allocator` event. */
static void settings_write(pickle_writer *writer, const run_rank *rank) {
    const run_allocator *a = &rank->allocator;
    char conf[96];
    if (a->max_split_size != 0)
        snprintf(conf, sizeof conf, "max_split_size_mb:%llu", (unsigned long long)(a->max_split_size >> 20));
    else
        snprintf(conf, sizeof conf, "%s", "");
    pickle_string(writer, "allocator_settings");
    pickle_dict_begin(writer);
    key_string(writer, "PYTORCH_CUDA_ALLOC_CONF", conf);
    key_int(writer, "max_split_size", a->max_split_size != 0 ? (int64_t)a->max_split_size : -1);
    pickle_string(writer, "expandable_segments");
    pickle_bool(writer, 0);
    key_string(writer, "mode", a->mode);        /* fsdplab's: caching, or malloc (ALLOC=malloc) */
    key_string(writer, "backend", a->backend);
    key_int(writer, "round", (int64_t)a->round);
    key_int(writer, "small_size", (int64_t)a->small_size);
    key_int(writer, "small_segment", (int64_t)a->small_segment);
    key_int(writer, "large_segment", (int64_t)a->large_segment);
    pickle_dict_end(writer);
}

static int snapshot_pickle(FILE *file, const trace_run *run, const segments_state *states, const size_t *ends) {
    pickle_writer writer;
    pickle_begin(&writer, file);
    pickle_dict_begin(&writer);
    pickle_string(&writer, "segments");
    pickle_list_begin(&writer);
    for (int rank = 0; rank < run->world; rank++)
        for (size_t index = 0; index < states[rank].count; index++)
            segment_write(&writer, run, &run->ranks[rank], &states[rank].segments[index]);
    pickle_list_end(&writer);
    pickle_string(&writer, "device_traces");
    pickle_list_begin(&writer);
    for (int rank = 0; rank < run->world; rank++) device_trace_write(&writer, run, &run->ranks[rank], ends[rank]);
    pickle_list_end(&writer);
    settings_write(&writer, &run->ranks[0]);
    pickle_dict_end(&writer);
    return pickle_end(&writer);
}

int snapshot_write_run(const trace_run *run, const char *out_path, char *error, size_t error_size) {
    segments_state *states = calloc((size_t)run->world, sizeof *states);
    size_t *ends = calloc((size_t)run->world, sizeof *ends);
    int status = 0;
    if (states == NULL || ends == NULL) {
        snprintf(error, error_size, "out of memory for %d ranks' allocators", run->world);
        status = -1;
    }
    for (int rank = 0; status == 0 && rank < run->world; rank++) {
        ends[rank] = snapshot_moment(&run->ranks[rank]);
        status = segments_replay(&states[rank], &run->ranks[rank], ends[rank], error, error_size);
    }
    view_file view;
    if (status == 0) status = view_file_open(&view, out_path, error, error_size);
    if (status == 0) {
        status = snapshot_pickle(view.file, run, states, ends);
        if (status != 0) snprintf(error, error_size, "writing %s: unbalanced pickle (a bug in snapshot.c)", out_path);
        status = view_file_close(&view, status, error, error_size);
    }
    for (int rank = 0; states != NULL && rank < run->world; rank++) segments_free(&states[rank]);
    free(states);
    free(ends);
    return status;
}
