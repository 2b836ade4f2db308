/* snapshot.c — see snapshot.h. The field names are those of torch.cuda.memory._snapshot()'s documented TypedDicts
 * (Snapshot, Segment, Block, Frame, TraceEntry) and what torch/utils/viz/MemoryViz.js reads from them. */
#include "snapshot.h"
#include "export.h"
#include "pickle.h"
#include "view_file.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    BLOCK_ROUNDING = 512,                 /* PyTorch's kMinBlockSize */
    SMALL_BLOCK_LIMIT = 1 << 20,          /* kSmallSize: blocks up to 1 MiB come from small segments */
    SMALL_SEGMENT = 2 << 20,              /* kSmallBuffer */
    LARGE_SEGMENT = 20 << 20,             /* kLargeBuffer */
    LARGE_SEGMENT_LIMIT = 10 << 20,       /* kMinLargeAlloc: from here a block gets a segment of its own */
    SEGMENT_ROUNDING = 2 << 20,           /* kRoundLarge */
};
/* Where the simulated device memory starts: any plausible address; segments are spaced by a 2 MiB gap. */
static const uint64_t FIRST_ADDRESS = 0x7f0000000000ull;

/* ---- the simulated caching allocator ---- */

typedef struct block {
    uint64_t address;
    uint64_t size;                        /* rounded */
    size_t event;                         /* the alloc event it serves */
} block;

typedef struct segment {
    uint64_t address;
    uint64_t size;
    int small;                            /* the small pool (blocks up to 1 MiB) */
    size_t created_by;                    /* index of the alloc event that made the allocator ask for it */
    block *blocks;                        /* live blocks, sorted by address */
    size_t block_count;
    size_t block_capacity;
} segment;

typedef struct rank_memory {
    segment *segments;                    /* in creation order, which is address order */
    size_t segment_count;
    size_t segment_capacity;
    uint64_t next_address;
    uint64_t *addresses;                  /* per event of the rank: the block's address (alloc and free) */
} rank_memory;

static uint64_t round_up(uint64_t value, uint64_t multiple) { return (value + multiple - 1) / multiple * multiple; }

static uint64_t block_size_of(uint64_t bytes) { return bytes == 0 ? BLOCK_ROUNDING : round_up(bytes, BLOCK_ROUNDING); }

static uint64_t segment_size_for(uint64_t size) {
    if (size <= SMALL_BLOCK_LIMIT) return SMALL_SEGMENT;
    if (size < LARGE_SEGMENT_LIMIT) return LARGE_SEGMENT;
    return round_up(size, SEGMENT_ROUNDING);
}

/* First fit inside one segment: the lowest gap between live blocks that holds `size`. Returns the offset of the
 * gap's start and the index where the block goes in the sorted array, or -1 when nothing fits. */
static int gap_find(const segment *seg, uint64_t size, uint64_t *address, size_t *position) {
    uint64_t start = seg->address;
    for (size_t index = 0; index <= seg->block_count; index++) {
        uint64_t end = index < seg->block_count ? seg->blocks[index].address : seg->address + seg->size;
        if (end - start >= size) {
            *address = start;
            *position = index;
            return 0;
        }
        if (index < seg->block_count) start = seg->blocks[index].address + seg->blocks[index].size;
    }
    return -1;
}

static int block_insert(segment *seg, size_t position, block placed) {
    if (seg->block_count == seg->block_capacity) {
        size_t capacity = seg->block_capacity ? 2 * seg->block_capacity : 16;
        block *blocks = realloc(seg->blocks, capacity * sizeof *blocks);
        if (blocks == NULL) return -1;
        seg->blocks = blocks;
        seg->block_capacity = capacity;
    }
    memmove(seg->blocks + position + 1, seg->blocks + position, (seg->block_count - position) * sizeof *seg->blocks);
    seg->blocks[position] = placed;
    seg->block_count++;
    return 0;
}

static segment *segment_add(rank_memory *memory, uint64_t size, int small, size_t event) {
    if (memory->segment_count == memory->segment_capacity) {
        size_t capacity = memory->segment_capacity ? 2 * memory->segment_capacity : 16;
        segment *segments = realloc(memory->segments, capacity * sizeof *segments);
        if (segments == NULL) return NULL;
        memory->segments = segments;
        memory->segment_capacity = capacity;
    }
    segment *seg = &memory->segments[memory->segment_count++];
    *seg = (segment){.address = memory->next_address, .size = segment_size_for(size), .small = small,
                     .created_by = event};
    memory->next_address = seg->address + seg->size + SEGMENT_ROUNDING;
    return seg;
}

/* Places the block of alloc event `event`, in an existing segment of its pool or in a new one. */
static int memory_allocate(rank_memory *memory, uint64_t bytes, size_t event) {
    uint64_t size = block_size_of(bytes), address = 0;
    int small = size <= SMALL_BLOCK_LIMIT;
    size_t position = 0;
    segment *chosen = NULL;
    for (size_t index = 0; chosen == NULL && index < memory->segment_count; index++) {
        segment *seg = &memory->segments[index];
        if (seg->small == small && gap_find(seg, size, &address, &position) == 0) chosen = seg;
    }
    if (chosen == NULL) {
        chosen = segment_add(memory, size, small, event);
        if (chosen == NULL || gap_find(chosen, size, &address, &position) != 0) return -1;
    }
    memory->addresses[event] = address;
    return block_insert(chosen, position, (block){address, size, event});
}

static int memory_release(rank_memory *memory, uint64_t address) {
    for (size_t index = 0; index < memory->segment_count; index++) {
        segment *seg = &memory->segments[index];
        if (address < seg->address || address >= seg->address + seg->size) continue;
        for (size_t position = 0; position < seg->block_count; position++) {
            if (seg->blocks[position].address != address) continue;
            memmove(seg->blocks + position, seg->blocks + position + 1,
                    (seg->block_count - position - 1) * sizeof *seg->blocks);
            seg->block_count--;
            return 0;
        }
    }
    return -1;  /* cannot happen: run_load paired every free with a live alloc */
}

static void memory_free(rank_memory *memory) {
    for (size_t index = 0; index < memory->segment_count; index++) free(memory->segments[index].blocks);
    free(memory->segments);
    free(memory->addresses);
}

/* Replays one rank's allocs and frees through the simulated allocator, keeping every event's address. */
static int memory_simulate(const run_rank *rank, rank_memory *memory, char *error, size_t error_size) {
    *memory = (rank_memory){.next_address = FIRST_ADDRESS};
    memory->addresses = calloc(rank->event_count + 1, sizeof *memory->addresses);
    if (memory->addresses == NULL) {
        snprintf(error, error_size, "out of memory simulating the allocator of %s", rank->path);
        return -1;
    }
    for (size_t index = 0; index < rank->event_count; index++) {
        const run_event *event = &rank->events[index];
        int status = 0;
        if (event->kind == RUN_ALLOC) status = memory_allocate(memory, event->bytes, index);
        if (event->kind == RUN_FREE) {
            memory->addresses[index] = memory->addresses[event->partner];
            status = memory_release(memory, memory->addresses[index]);
        }
        if (status != 0) {
            snprintf(error, error_size, "%s line %zu: simulating the allocator failed (out of memory?)", rank->path,
                     event->line);
            return -1;
        }
    }
    return 0;
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

static void active_block_write(pickle_writer *writer, const trace_run *run, const run_rank *rank, const block *live) {
    const run_event *event = &rank->events[live->event];
    pickle_dict_begin(writer);
    key_int(writer, "address", (int64_t)live->address);
    key_int(writer, "size", (int64_t)live->size);
    key_int(writer, "requested_size", (int64_t)event->bytes);
    key_string(writer, "state", "active_allocated");
    frames_write(writer, run, rank, event);
    pickle_dict_end(writer);
}

/* A segment's blocks tile it exactly, live ones and the free gaps between them: the viewer finds each block's
 * address by adding up the sizes before it. */
static void blocks_write(pickle_writer *writer, const trace_run *run, const run_rank *rank, const segment *seg) {
    uint64_t cursor = seg->address;
    pickle_string(writer, "blocks");
    pickle_list_begin(writer);
    for (size_t index = 0; index < seg->block_count; index++) {
        const block *live = &seg->blocks[index];
        if (live->address > cursor) inactive_block_write(writer, cursor, live->address - cursor);
        active_block_write(writer, run, rank, live);
        cursor = live->address + live->size;
    }
    if (cursor < seg->address + seg->size) inactive_block_write(writer, cursor, seg->address + seg->size - cursor);
    pickle_list_end(writer);
}

static void segment_write(pickle_writer *writer, const trace_run *run, const run_rank *rank, const segment *seg) {
    uint64_t allocated = 0, requested = 0;
    for (size_t index = 0; index < seg->block_count; index++) {
        allocated += seg->blocks[index].size;
        requested += rank->events[seg->blocks[index].event].bytes;
    }
    pickle_dict_begin(writer);
    key_int(writer, "device", rank->rank);
    key_int(writer, "address", (int64_t)seg->address);
    key_int(writer, "total_size", (int64_t)seg->size);
    key_int(writer, "allocated_size", (int64_t)allocated);
    key_int(writer, "active_size", (int64_t)allocated);
    key_int(writer, "requested_size", (int64_t)requested);
    key_int(writer, "stream", 0);
    key_string(writer, "segment_type", seg->small ? "small" : "large");
    pickle_string(writer, "is_expandable");
    pickle_bool(writer, 0);
    pickle_string(writer, "frames");
    pickle_list_begin(writer);
    pickle_list_end(writer);
    blocks_write(writer, run, rank, seg);
    pickle_dict_end(writer);
}

static void entry_begin(pickle_writer *writer, const char *action, uint64_t address, uint64_t size, double ts) {
    pickle_dict_begin(writer);
    key_string(writer, "action", action);
    key_int(writer, "addr", (int64_t)address);
    key_int(writer, "size", (int64_t)size);
    key_int(writer, "stream", 0);
    key_int(writer, "time_us", (int64_t)ts);
}

static void segment_entry_write(pickle_writer *writer, const segment *seg, double ts) {
    entry_begin(writer, "segment_alloc", seg->address, seg->size, ts);
    pickle_string(writer, "frames");
    pickle_list_begin(writer);
    pickle_list_end(writer);
    pickle_dict_end(writer);
}

/* PyTorch records a free twice: requested, then completed once the block is reusable (at once, on one stream). */
static void memory_entries_write(pickle_writer *writer, const trace_run *run, const run_rank *rank,
                                 const rank_memory *memory, size_t index) {
    const run_event *event = &rank->events[index];
    if (event->kind == RUN_ALLOC) {
        entry_begin(writer, "alloc", memory->addresses[index], event->bytes, event->ts);
        key_string(writer, "category", run_categories[event->category]);
        frames_write(writer, run, rank, event);
        pickle_dict_end(writer);
        return;
    }
    static const char *const free_actions[] = {"free_requested", "free_completed"};
    for (int action = 0; action < 2; action++) {
        entry_begin(writer, free_actions[action], memory->addresses[index], event->bytes, event->ts);
        frames_write(writer, run, rank, event);
        pickle_dict_end(writer);
    }
}

/* memory_viz adds 'unknown' to the categories it found, through a misspelt name (`snapshot.categores`) that throws
 * in the versions we read; a category 'unknown' already present skips that line. A final `snapshot` entry (the
 * moment the snapshot was taken, which draws nothing) carries it. */
static void snapshot_entry_write(pickle_writer *writer, const run_rank *rank) {
    double last_ts = 0;
    for (size_t index = 0; index < rank->event_count; index++)
        if (rank->events[index].ts > last_ts) last_ts = rank->events[index].ts;
    entry_begin(writer, "snapshot", 0, 0, last_ts);
    key_string(writer, "category", "unknown");
    pickle_string(writer, "frames");
    pickle_list_begin(writer);
    pickle_list_end(writer);
    pickle_dict_end(writer);
}

static void device_trace_write(pickle_writer *writer, const trace_run *run, const run_rank *rank,
                               const rank_memory *memory) {
    size_t next_segment = 0;
    pickle_list_begin(writer);
    for (size_t index = 0; index < rank->event_count; index++) {
        const run_event *event = &rank->events[index];
        if (event->kind != RUN_ALLOC && event->kind != RUN_FREE) continue;
        while (next_segment < memory->segment_count && memory->segments[next_segment].created_by == index)
            segment_entry_write(writer, &memory->segments[next_segment++], event->ts);
        memory_entries_write(writer, run, rank, memory, index);
    }
    snapshot_entry_write(writer, rank);
    pickle_list_end(writer);
}

static int snapshot_pickle(FILE *file, const trace_run *run, const rank_memory *memories) {
    pickle_writer writer;
    pickle_begin(&writer, file);
    pickle_dict_begin(&writer);
    pickle_string(&writer, "segments");
    pickle_list_begin(&writer);
    for (int rank = 0; rank < run->world; rank++)
        for (size_t index = 0; index < memories[rank].segment_count; index++)
            segment_write(&writer, run, &run->ranks[rank], &memories[rank].segments[index]);
    pickle_list_end(&writer);
    pickle_string(&writer, "device_traces");
    pickle_list_begin(&writer);
    for (int rank = 0; rank < run->world; rank++)
        device_trace_write(&writer, run, &run->ranks[rank], &memories[rank]);
    pickle_list_end(&writer);
    pickle_dict_end(&writer);
    return pickle_end(&writer);
}

int snapshot_write_run(const trace_run *run, const char *out_path, char *error, size_t error_size) {
    rank_memory *memories = calloc((size_t)run->world, sizeof *memories);
    if (memories == NULL) {
        snprintf(error, error_size, "out of memory for %d ranks' allocators", run->world);
        return -1;
    }
    int status = 0;
    for (int rank = 0; status == 0 && rank < run->world; rank++)
        status = memory_simulate(&run->ranks[rank], &memories[rank], error, error_size);
    view_file view;
    if (status == 0) status = view_file_open(&view, out_path, error, error_size);
    if (status == 0) {
        status = snapshot_pickle(view.file, run, memories);
        if (status != 0) snprintf(error, error_size, "writing %s: unbalanced pickle (a bug in snapshot.c)", out_path);
        status = view_file_close(&view, status, error, error_size);
    }
    for (int rank = 0; rank < run->world; rank++) memory_free(&memories[rank]);
    free(memories);
    return status;
}
