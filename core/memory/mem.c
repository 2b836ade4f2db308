/* mem.c — the tracked allocator. See mem.h. */
#include "core/memory/mem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const category_names[MEM_CATEGORY_COUNT] = {
    "param_shard", "param_unsharded", "grad_unsharded", "grad_shard",  "optim_state",
    "activation",  "checkpoint_input", "workspace",     "comm_buffer", "data",
    "kv_cache",    "param_shard_low_precision",
};

const char *mem_category_name(mem_category category) {
    if ((int)category < 0 || category >= MEM_CATEGORY_COUNT) return "invalid_category";
    return category_names[category];
}

int mem_category_from_name(const char *name) {
    for (int category = 0; category < MEM_CATEGORY_COUNT; category++)
        if (strcmp(category_names[category], name) == 0) return category;
    return -1;
}

/* The allocator tells the tracker of every segment it takes or gives back; the tracker writes the event. */
static void on_segment(void *state, allocator_event event, const allocator_segment *segment) {
    mem_tracker *tracker = state;
    tracker->reserved_bytes = tracker->allocator.reserved_bytes;
    if (tracker->reserved_bytes > tracker->peak_reserved_bytes) tracker->peak_reserved_bytes = tracker->reserved_bytes;
    if (tracker->trace == NULL) return;
    trace_segment_info info = {
        .id = segment->id,
        .address = (uint64_t)(uintptr_t)segment->ptr,
        .bytes = segment->size,
        .pool = allocator_pool_name(segment->pool),
        .stream = segment->stream,
        .owner = tracker->request_owner,
        .category = tracker->request_owner ? mem_category_name(tracker->request_category) : NULL,
        .reserved_bytes = tracker->reserved_bytes,
        .device = tracker->device,
    };
    if (event == ALLOCATOR_SEGMENT_ALLOC) trace_segment_alloc(tracker->trace, &info);
    else trace_segment_free(tracker->trace, &info);
}

/* The budget: a segment that would take the pool's reserved bytes past it is refused, as cudaMalloc refuses one past
 * the GPU's memory; the allocator then empties its cache and tries once more, and mem_alloc aborts naming the
 * budget. */
static void *budget_segment_alloc(void *state, size_t bytes) {
    mem_tracker *tracker = state;
    if (tracker->allocator.reserved_bytes + bytes > tracker->budget) return NULL;
    return tracker->segments.segment_alloc(tracker->segments.state, bytes);
}

static void budget_segment_free(void *state, void *ptr, size_t bytes) {
    mem_tracker *tracker = state;
    tracker->segments.segment_free(tracker->segments.state, ptr, bytes);
}

static void *budget_event_record(void *state, int stream) {
    mem_tracker *tracker = state;
    return tracker->segments.event_record(tracker->segments.state, stream);
}

static int budget_event_done(void *state, void *event) {
    mem_tracker *tracker = state;
    return tracker->segments.event_done(tracker->segments.state, event);
}

static void budget_event_release(void *state, void *event) {
    mem_tracker *tracker = state;
    tracker->segments.event_release(tracker->segments.state, event);
}

void mem_init(mem_tracker *tracker, int rank, trace_sink *trace, const allocator_settings *settings) {
    mem_init_pool(tracker, rank, trace, settings, MEM_DEVICE, 0);
}

void mem_init_pool(mem_tracker *tracker, int rank, trace_sink *trace, const allocator_settings *settings,
                   const char *device, size_t budget) {
    mem_init_pool_on(tracker, rank, trace, settings, device, budget, &allocator_host_backend);
}

void mem_init_pool_on(mem_tracker *tracker, int rank, trace_sink *trace, const allocator_settings *settings,
                      const char *device, size_t budget, const allocator_backend *segments) {
    memset(tracker, 0, sizeof *tracker);
    tracker->segments = *segments;
    tracker->rank = rank;
    tracker->trace = trace;
    tracker->next_id = 1;
    tracker->device = device;
    tracker->budget = budget;
    /* the budget wraps the segments; the events are the segments' own (their state, not the tracker) */
    tracker->budget_backend = (allocator_backend){segments->name, budget_segment_alloc, budget_segment_free, tracker,
                                                  NULL, NULL, NULL, NULL};
    if (segments->event_record != NULL) {
        tracker->budget_backend.event_record = budget_event_record;
        tracker->budget_backend.event_done = budget_event_done;
        tracker->budget_backend.event_release = budget_event_release;
    }
    allocator_settings defaults = {.caching = 1, .max_split_size = SIZE_MAX};
    allocator_init(&tracker->allocator, budget > 0 ? &tracker->budget_backend : &tracker->segments,
                   settings ? settings : &defaults, on_segment, tracker);
    if (trace != NULL) {
        const allocator_settings *used = &tracker->allocator.settings;
        trace_allocator_info info = {
            .mode = used->caching ? "caching" : "malloc",
            .backend = segments->name,
            .round = ALLOCATOR_ROUND,
            .small_size = ALLOCATOR_SMALL_SIZE,
            .small_segment = ALLOCATOR_SMALL_SEGMENT,
            .large_segment = ALLOCATOR_LARGE_SEGMENT,
            .min_large_alloc = ALLOCATOR_MIN_LARGE_ALLOC,
            .round_large = ALLOCATOR_ROUND_LARGE,
            .max_split_size = used->max_split_size == SIZE_MAX ? 0 : used->max_split_size,
            .device = device,
            .budget = budget,
        };
        trace_allocator(trace, &info);
    }
}

static void emit(mem_tracker *tracker, const mem_block *block, int is_alloc) {
    if (tracker->trace == NULL) return;
    trace_memory_info info = {
        .id = block->id,
        .bytes = block->bytes,
        .category = mem_category_name(block->category),
        .dtype = dtype_name(block->dtype),
        .owner = block->owner,
        .live_bytes = tracker->live_bytes,
        .category_live_bytes = tracker->category_live_bytes[block->category],
        .address = (uint64_t)(uintptr_t)block->ptr,
        .size = block->block->size,
        .segment = (uint64_t)(uintptr_t)block->block->segment->ptr,
        .stream = block->block->stream,
        .reserved_bytes = tracker->reserved_bytes,
        .device = tracker->device,
    };
    if (is_alloc) trace_alloc(tracker->trace, &info);
    else trace_free(tracker->trace, &info);
}

static void *allocate(mem_tracker *tracker, size_t bytes, mem_category category, dtype type, const char *owner,
                      int zeroed) {
    if ((int)category < 0 || category >= MEM_CATEGORY_COUNT) {
        fprintf(stderr, "rank %d: mem_alloc for '%s': invalid category %d\n", tracker->rank, owner, (int)category);
        abort();
    }
    if (tracker->live_count == tracker->live_capacity) {
        size_t capacity = tracker->live_capacity ? 2 * tracker->live_capacity : 64;
        mem_block *grown = realloc(tracker->live_blocks, capacity * sizeof *grown);
        if (grown == NULL) {
            fprintf(stderr, "rank %d: mem_alloc for '%s': cannot grow the tracker table to %zu blocks\n",
                    tracker->rank, owner, capacity);
            abort();
        }
        tracker->live_blocks = grown;
        tracker->live_capacity = capacity;
    }
    /* A zero-byte request still gets a block (512 bytes), so it has a unique address to free and trace. */
    tracker->request_owner = owner;
    tracker->request_category = category;
    allocator_block *served = allocator_malloc(&tracker->allocator, bytes, 0);
    tracker->request_owner = NULL;
    if (served == NULL && tracker->budget > 0) {
        fprintf(stderr, "rank %d: %s pool out of memory allocating %zu bytes of %s for '%s': its budget is %zu bytes "
                "(DEVICE_MEMORY_MB=%zu), %zu reserved, %zu live (the cache emptied)\n", tracker->rank, tracker->device,
                bytes, mem_category_name(category), owner, tracker->budget, tracker->budget >> 20,
                tracker->reserved_bytes, tracker->live_bytes);
        abort();
    }
    if (served == NULL) {
        fprintf(stderr, "rank %d: out of memory allocating %zu bytes of %s for '%s' (%zu bytes live, %zu reserved, "
                "the cache emptied)\n", tracker->rank, bytes, mem_category_name(category), owner, tracker->live_bytes,
                tracker->reserved_bytes);
        abort();
    }
    void *ptr = served->ptr;
    if (zeroed && tracker->segments.zero != NULL) tracker->segments.zero(tracker->segments.state, ptr, bytes);
    else if (zeroed) memset(ptr, 0, bytes);
    mem_block *block = &tracker->live_blocks[tracker->live_count++];
    block->ptr = ptr;
    block->block = served;
    block->bytes = bytes;
    block->category = category;
    block->dtype = type;
    block->id = tracker->next_id++;
    snprintf(block->owner, sizeof block->owner, "%s", owner);

    tracker->live_bytes += bytes;
    tracker->category_live_bytes[category] += bytes;
    if (tracker->live_bytes > tracker->peak_bytes) tracker->peak_bytes = tracker->live_bytes;
    if (tracker->category_live_bytes[category] > tracker->category_peak_bytes[category])
        tracker->category_peak_bytes[category] = tracker->category_live_bytes[category];
    emit(tracker, block, 1);
    return ptr;
}

/* What an untyped request holds: token ids in data, float32 everywhere else. */
static dtype default_dtype(mem_category category) { return category == MEM_DATA ? DTYPE_INT32 : DTYPE_FLOAT32; }

void *mem_alloc(mem_tracker *tracker, size_t bytes, mem_category category, const char *owner) {
    return allocate(tracker, bytes, category, default_dtype(category), owner, 1);
}

void *mem_alloc_uninitialized(mem_tracker *tracker, size_t bytes, mem_category category, const char *owner) {
    return allocate(tracker, bytes, category, default_dtype(category), owner, 0);
}

void *mem_alloc_typed(mem_tracker *tracker, size_t bytes, mem_category category, dtype type, const char *owner) {
    return allocate(tracker, bytes, category, type, owner, 1);
}

void *mem_alloc_uninitialized_typed(mem_tracker *tracker, size_t bytes, mem_category category, dtype type,
                                    const char *owner) {
    return allocate(tracker, bytes, category, type, owner, 0);
}

static mem_block *find_live(const mem_tracker *tracker, const void *ptr) {
    for (size_t i = 0; i < tracker->live_count; i++)
        if (tracker->live_blocks[i].ptr == ptr) return &tracker->live_blocks[i];
    return NULL;
}

const mem_block *mem_find(const mem_tracker *tracker, const void *ptr) { return find_live(tracker, ptr); }

int mem_try_free(mem_tracker *tracker, void *ptr) {
    if (ptr == NULL) return 0;
    mem_block *block = find_live(tracker, ptr);
    if (block == NULL) {
        /* Not live: if it was freed lately it is a double free. Newest first, so that an address malloc handed out
         * again (and that was freed again since) is reported with its latest owner; a live address never gets
         * here, which is why allocating needs no bookkeeping of reused addresses. */
        for (size_t back = 1; back <= MEM_RECENT_FREES; back++) {
            const mem_block *freed =
                &tracker->recent_frees[(tracker->recent_next + MEM_RECENT_FREES - back) % MEM_RECENT_FREES];
            if (freed->ptr == ptr) {
                snprintf(tracker->error, sizeof tracker->error,
                         "rank %d: double free of %zu bytes of %s owned by '%s' (allocation id %llu)",
                         tracker->rank, freed->bytes, mem_category_name(freed->category), freed->owner,
                         (unsigned long long)freed->id);
                return -1;
            }
        }
        snprintf(tracker->error, sizeof tracker->error,
                 "rank %d: free of pointer %p that the tracked allocator did not hand out (or freed long ago)",
                 tracker->rank, ptr);
        return -1;
    }
    mem_block freed = *block;
    *block = tracker->live_blocks[--tracker->live_count]; /* unordered table: swap the last one in */
    tracker->recent_frees[tracker->recent_next] = freed;
    tracker->recent_next = (tracker->recent_next + 1) % MEM_RECENT_FREES;
    tracker->live_bytes -= freed.bytes;
    tracker->category_live_bytes[freed.category] -= freed.bytes;
    emit(tracker, &freed, 0);
    /* After the free event: with caching off the block's segment goes back now, and its event follows. */
    tracker->request_owner = freed.owner;
    tracker->request_category = freed.category;
    allocator_free(&tracker->allocator, freed.block);
    tracker->request_owner = NULL;
    tracker->reserved_bytes = tracker->allocator.reserved_bytes;
    return 0;
}

void mem_free(mem_tracker *tracker, void *ptr) {
    if (mem_try_free(tracker, ptr) != 0) {
        fprintf(stderr, "%s\n", tracker->error);
        abort();
    }
}

void mem_reset_peak(mem_tracker *tracker) {
    tracker->peak_bytes = tracker->live_bytes;
    tracker->peak_reserved_bytes = tracker->reserved_bytes;
    for (int category = 0; category < MEM_CATEGORY_COUNT; category++)
        tracker->category_peak_bytes[category] = tracker->category_live_bytes[category];
}

mem_peaks mem_peaks_now(const mem_tracker *tracker) {
    mem_peaks saved;
    saved.peak_bytes = tracker->peak_bytes;
    memcpy(saved.category_peak_bytes, tracker->category_peak_bytes, sizeof saved.category_peak_bytes);
    return saved;
}

void mem_peaks_restore(mem_tracker *tracker, const mem_peaks *saved) {
    tracker->peak_bytes = saved->peak_bytes > tracker->live_bytes ? saved->peak_bytes : tracker->live_bytes;
    for (int category = 0; category < MEM_CATEGORY_COUNT; category++) {
        size_t live = tracker->category_live_bytes[category];
        tracker->category_peak_bytes[category] =
            saved->category_peak_bytes[category] > live ? saved->category_peak_bytes[category] : live;
    }
}

size_t mem_empty_cache(mem_tracker *tracker) {
    size_t released = allocator_empty_cache(&tracker->allocator);
    tracker->reserved_bytes = tracker->allocator.reserved_bytes;
    return released;
}

size_t mem_shutdown(mem_tracker *tracker) {
    size_t leaks = tracker->live_count;
    while (tracker->live_count > 0) {
        const mem_block *block = &tracker->live_blocks[tracker->live_count - 1];
        fprintf(stderr, "rank %d: leak: %zu bytes of %s owned by '%s' (allocation id %llu) still live at shutdown\n",
                tracker->rank, block->bytes, mem_category_name(block->category), block->owner,
                (unsigned long long)block->id);
        mem_free(tracker, block->ptr);
    }
    mem_empty_cache(tracker); /* every block is free now: the segments go back, each with its event */
    allocator_destroy(&tracker->allocator);
    free(tracker->live_blocks);
    tracker->live_blocks = NULL;
    tracker->live_capacity = 0;
    return leaks;
}

const char *mem_format_bytes(size_t bytes, char *buffer, size_t buffer_size) {
    if (bytes >= 1000000000ull) snprintf(buffer, buffer_size, "%.2f GB", (double)bytes / 1e9);
    else if (bytes >= 1000000ull) snprintf(buffer, buffer_size, "%.1f MB", (double)bytes / 1e6);
    else if (bytes >= 1000ull) snprintf(buffer, buffer_size, "%.1f KB", (double)bytes / 1e3);
    else snprintf(buffer, buffer_size, "%zu B", bytes);
    return buffer;
}

int mem_host_info(size_t *available, size_t *total) {
    double kib_available = -1.0, kib_total = -1.0, kib;
    char line[256];
    FILE *file = fopen("/proc/meminfo", "r");
    while (file != NULL && fgets(line, sizeof line, file) != NULL) {
        if (sscanf(line, "MemAvailable: %lf kB", &kib) == 1) kib_available = kib;
        if (sscanf(line, "MemTotal: %lf kB", &kib) == 1) kib_total = kib;
    }
    if (file != NULL) fclose(file);
    if (kib_available >= 0.0 && kib_total >= 0.0) {
        *available = (size_t)(kib_available * 1024.0);
        *total = (size_t)(kib_total * 1024.0);
        return 0;
    }
    long free_pages = sysconf(_SC_AVPHYS_PAGES), pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGESIZE);
    int known = free_pages > 0 && pages > 0 && page_size > 0;
    *available = known ? (size_t)free_pages * (size_t)page_size : 0;
    *total = known ? (size_t)pages * (size_t)page_size : 0;
    return known ? 0 : -1;
}
