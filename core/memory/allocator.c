/* allocator.c — the caching allocator. See allocator.h; the numbered steps there are the functions here. */
#define _DEFAULT_SOURCE /* madvise's MADV_HUGEPAGE */
#include "core/memory/allocator.h"

#include <sys/mman.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the host backend: page-aligned memory ---- */

enum { HUGE_PAGE = 2 << 20 };

/* Segments of 2 MiB and more start on a 2 MiB boundary and ask the kernel for transparent huge pages: the first
 * touch of a fresh segment then faults once per 2 MiB instead of once per 4 KiB (qwen2-0.5b touches ~5 GB per rank in
 * its first steps: 1.3 million faults, most of its system time, without them). Where THP is off this is a no-op. */
static void *host_segment_alloc(void *state, size_t bytes) {
    (void)state;
    void *ptr = NULL;
    if (posix_memalign(&ptr, bytes >= HUGE_PAGE ? HUGE_PAGE : 4096, bytes) != 0) return NULL;
#ifdef MADV_HUGEPAGE
    if (bytes >= HUGE_PAGE) (void)madvise(ptr, bytes, MADV_HUGEPAGE); /* advice: failing changes nothing */
#endif
    return ptr;
}

static void host_segment_free(void *state, void *ptr, size_t bytes) {
    (void)state;
    (void)bytes;
    free(ptr);
}

const allocator_backend allocator_host_backend = {"host", host_segment_alloc, host_segment_free, NULL, NULL, NULL, NULL,
                                                  NULL};

/* ---- 1. sizes and pools ---- */

static size_t round_up(size_t value, size_t multiple) { return (value + multiple - 1) / multiple * multiple; }

size_t allocator_round_size(size_t bytes) {
    return bytes < ALLOCATOR_ROUND ? ALLOCATOR_ROUND : round_up(bytes, ALLOCATOR_ROUND);
}

allocator_pool allocator_pool_of(size_t size) {
    return size <= ALLOCATOR_SMALL_SIZE ? ALLOCATOR_POOL_SMALL : ALLOCATOR_POOL_LARGE;
}

size_t allocator_segment_size(const allocator *a, size_t size) {
    if (!a->settings.caching) return size;  /* a segment per request, exactly the block */
    if (size <= ALLOCATOR_SMALL_SIZE) return ALLOCATOR_SMALL_SEGMENT;
    if (size < ALLOCATOR_MIN_LARGE_ALLOC) return ALLOCATOR_LARGE_SEGMENT;
    return round_up(size, ALLOCATOR_ROUND_LARGE);
}

const char *allocator_pool_name(allocator_pool pool) { return pool == ALLOCATOR_POOL_SMALL ? "small" : "large"; }

/* ---- the free lists: sorted arrays of blocks, ordered by (stream, size, address) ---- */

static int block_before(const allocator_block *x, int stream, size_t size, const char *ptr) {
    if (x->stream != stream) return x->stream < stream;
    if (x->size != size) return x->size < size;
    return x->ptr < ptr;
}

/* The index of the first block not ordered before (stream, size, ptr): std::set::lower_bound. */
static size_t lower_bound(const allocator_free_list *list, int stream, size_t size, const char *ptr) {
    size_t low = 0, high = list->count;
    while (low < high) {
        size_t middle = low + (high - low) / 2;
        if (block_before(list->blocks[middle], stream, size, ptr)) low = middle + 1;
        else high = middle;
    }
    return low;
}

static int free_list_insert(allocator_free_list *list, allocator_block *block) {
    if (list->count == list->capacity) {
        size_t capacity = list->capacity ? 2 * list->capacity : 64;
        allocator_block **grown = realloc(list->blocks, capacity * sizeof *grown);
        if (grown == NULL) return -1;
        list->blocks = grown;
        list->capacity = capacity;
    }
    size_t at = lower_bound(list, block->stream, block->size, block->ptr);
    memmove(list->blocks + at + 1, list->blocks + at, (list->count - at) * sizeof *list->blocks);
    list->blocks[at] = block;
    list->count++;
    return 0;
}

static void free_list_remove(allocator_free_list *list, allocator_block *block) {
    size_t at = lower_bound(list, block->stream, block->size, block->ptr);
    if (at >= list->count || list->blocks[at] != block) {
        fprintf(stderr, "allocator: block %p of %zu bytes is not in its free list (corrupted allocator)\n",
                (void *)block->ptr, block->size);
        abort();
    }
    memmove(list->blocks + at, list->blocks + at + 1, (list->count - at - 1) * sizeof *list->blocks);
    list->count--;
}

static allocator_free_list *pool_list(allocator *a, const allocator_block *block) {
    return &a->free_blocks[block->segment->pool];
}

static void insert_or_abort(allocator *a, allocator_block *block) {
    if (free_list_insert(pool_list(a, block), block) != 0) {
        fprintf(stderr, "allocator: out of host memory growing a free list\n");
        abort();
    }
}

/* ---- segments ---- */

static allocator_block *new_block(char *ptr, size_t size, int stream, allocator_segment *segment) {
    allocator_block *block = calloc(1, sizeof *block);
    if (block == NULL) {
        fprintf(stderr, "allocator: out of host memory for a block record\n");
        abort();
    }
    *block = (allocator_block){.ptr = ptr, .size = size, .stream = stream, .segment = segment};
    return block;
}

/* Asks the backend for a segment that holds a block of `size`; NULL when it has no memory. The segment starts as
 * one free block (not yet in a free list: the caller takes it). */
static allocator_segment *segment_create(allocator *a, size_t size, int stream) {
    size_t bytes = allocator_segment_size(a, size);
    char *ptr = a->backend.segment_alloc(a->backend.state, bytes);
    if (ptr == NULL) return NULL;
    if (a->segment_count == a->segment_capacity) {
        size_t capacity = a->segment_capacity ? 2 * a->segment_capacity : 32;
        allocator_segment **grown = realloc(a->segments, capacity * sizeof *grown);
        if (grown == NULL) {
            a->backend.segment_free(a->backend.state, ptr, bytes);
            return NULL;
        }
        a->segments = grown;
        a->segment_capacity = capacity;
    }
    allocator_segment *segment = calloc(1, sizeof *segment);
    if (segment == NULL) {
        a->backend.segment_free(a->backend.state, ptr, bytes);
        return NULL;
    }
    *segment = (allocator_segment){.ptr = ptr, .size = bytes, .pool = allocator_pool_of(size), .stream = stream,
                                   .id = a->next_segment_id++};
    segment->first = new_block(ptr, bytes, stream, segment);
    a->segments[a->segment_count++] = segment;
    a->reserved_bytes += bytes;
    a->segment_allocs++;
    if (a->observer) a->observer(a->observer_state, ALLOCATOR_SEGMENT_ALLOC, segment);
    return segment;
}

/* Gives a segment whose blocks are all free back to the backend. */
static void segment_release(allocator *a, allocator_segment *segment) {
    a->reserved_bytes -= segment->size;  /* first, so the observer reports reserved after the release */
    if (a->observer) a->observer(a->observer_state, ALLOCATOR_SEGMENT_FREE, segment);
    for (allocator_block *block = segment->first, *next; block != NULL; block = next) {
        next = block->next;
        if (!block->allocated && a->settings.caching) free_list_remove(&a->free_blocks[segment->pool], block);
        free(block);
    }
    a->backend.segment_free(a->backend.state, segment->ptr, segment->size);
    a->segment_frees++;
    for (size_t i = 0; i < a->segment_count; i++)
        if (a->segments[i] == segment) {
            memmove(a->segments + i, a->segments + i + 1, (a->segment_count - i - 1) * sizeof *a->segments);
            a->segment_count--;
            break;
        }
    free(segment);
}

void allocator_init(allocator *a, const allocator_backend *backend, const allocator_settings *settings,
                    allocator_observer observer, void *observer_state) {
    memset(a, 0, sizeof *a);
    a->backend = *backend;
    a->settings = *settings;
    if (a->settings.max_split_size == 0) a->settings.max_split_size = SIZE_MAX;
    a->next_segment_id = 1;
    a->observer = observer;
    a->observer_state = observer_state;
}

/* ---- 3. best fit ---- */

/* The smallest free block of the pool that holds `size` on `stream` and that max_split_size lets it take; it is
 * removed from the free list. NULL when none. */
static allocator_block *best_fit(allocator *a, size_t size, int stream) {
    allocator_free_list *list = &a->free_blocks[allocator_pool_of(size)];
    size_t at = lower_bound(list, stream, size, NULL);
    if (at == list->count || list->blocks[at]->stream != stream) return NULL;
    allocator_block *block = list->blocks[at];
    size_t max_split = a->settings.max_split_size;
    /* An oversize block (never split) does not serve a small request, nor a large one it exceeds by a whole
     * large segment: either would strand most of it. */
    if (size < max_split && block->size >= max_split) return NULL;
    if (size >= max_split && block->size >= size + ALLOCATOR_LARGE_SEGMENT) return NULL;
    free_list_remove(list, block);
    return block;
}

/* Is the rest of `block` after `size` bytes worth keeping as a free block of its own? */
static int should_split(const allocator *a, const allocator_block *block, size_t size) {
    size_t remaining = block->size - size;
    if (block->segment->pool == ALLOCATOR_POOL_SMALL) return remaining >= ALLOCATOR_ROUND;
    return size < a->settings.max_split_size && remaining > ALLOCATOR_SMALL_SIZE;
}

/* Splits `block` after `size` bytes: the rest becomes a free block right after it, in its pool's free list. */
static void split(allocator *a, allocator_block *block, size_t size) {
    allocator_block *rest = new_block(block->ptr + size, block->size - size, block->stream, block->segment);
    rest->prev = block;
    rest->next = block->next;
    if (block->next) block->next->prev = rest;
    block->next = rest;
    block->size = size;
    insert_or_abort(a, rest);
}

allocator_block *allocator_malloc(allocator *a, size_t bytes, int stream) {
    size_t size = allocator_round_size(bytes);
    if (a->pending_count > 0) allocator_process_events(a);
    allocator_block *block = a->settings.caching ? best_fit(a, size, stream) : NULL;
    if (block == NULL) {
        allocator_segment *segment = segment_create(a, size, stream);
        if (segment == NULL && a->settings.caching && allocator_empty_cache(a) > 0)
            segment = segment_create(a, size, stream); /* 5. the cache held the memory: release it and try again */
        if (segment == NULL) return NULL;
        block = segment->first;
    }
    if (a->settings.caching && should_split(a, block, size)) split(a, block, size);
    block->allocated = 1;
    block->requested = bytes;
    a->allocated_bytes += block->size;
    a->requested_bytes += bytes;
    return block;
}

/* ---- 4. free and merge ---- */

/* Absorbs free neighbour `other` into `block` (they are adjacent); `other` leaves its free list. */
static void absorb(allocator *a, allocator_block *block, allocator_block *other) {
    free_list_remove(pool_list(a, other), other);
    if (other == block->prev) {
        block->ptr = other->ptr;
        block->prev = other->prev;
        if (other->prev) other->prev->next = block;
        else block->segment->first = block;
    } else {
        block->next = other->next;
        if (other->next) other->next->prev = block;
    }
    block->size += other->size;
    free(other);
}

void allocator_record_stream(allocator *a, allocator_block *block, int stream) {
    (void)a;
    if (stream < 0 || stream >= ALLOCATOR_STREAMS_MAX) {
        fprintf(stderr, "allocator: record_stream of block %p on stream %d: streams are 0 .. %d\n",
                (void *)block->ptr, stream, ALLOCATOR_STREAMS_MAX - 1);
        abort();
    }
    if (stream != block->stream) block->stream_uses |= 1u << stream;
}

/* A free block merges with its free neighbours (not with pending ones: their memory may still be in use) and goes
 * to its pool's free list. */
static int reusable(const allocator_block *block) { return !block->allocated && !block->free_pending; }

static void free_completed(allocator *a, allocator_block *block) {
    if (!a->settings.caching) {
        segment_release(a, block->segment);
        return;
    }
    if (block->prev && reusable(block->prev)) absorb(a, block, block->prev);
    if (block->next && reusable(block->next)) absorb(a, block, block->next);
    insert_or_abort(a, block);
}

void allocator_free(allocator *a, allocator_block *block) {
    if (block == NULL) return;
    if (!block->allocated) {
        fprintf(stderr, "allocator: free of block %p (%zu bytes) that is not allocated\n", (void *)block->ptr,
                block->size);
        abort();
    }
    block->allocated = 0;
    a->allocated_bytes -= block->size;
    a->requested_bytes -= block->requested;
    block->requested = 0;
    unsigned uses = block->stream_uses;
    block->stream_uses = 0;
    if (uses == 0 || a->backend.event_record == NULL) {
        free_completed(a, block);
        return;
    }
    /* free requested: an event on every other stream that used it; the block waits in `pending` */
    if (a->pending_count == a->pending_capacity) {
        size_t capacity = a->pending_capacity ? 2 * a->pending_capacity : 16;
        allocator_block **grown = realloc(a->pending, capacity * sizeof *grown);
        if (grown == NULL) {
            fprintf(stderr, "allocator: out of memory for the pending frees\n");
            abort();
        }
        a->pending = grown;
        a->pending_capacity = capacity;
    }
    block->event_count = 0;
    for (int stream = 0; stream < ALLOCATOR_STREAMS_MAX; stream++)
        if (uses & (1u << stream))
            block->events[block->event_count++] = a->backend.event_record(a->backend.state, stream);
    block->free_pending = 1;
    a->pending[a->pending_count++] = block;
    a->pending_bytes += block->size;
}

/* Whether every event of a pending block has completed; the completed ones are released as they are seen. */
static int events_done(allocator *a, allocator_block *block) {
    while (block->event_count > 0) {
        void *event = block->events[block->event_count - 1];
        if (!a->backend.event_done(a->backend.state, event)) return 0;
        a->backend.event_release(a->backend.state, event);
        block->event_count--;
    }
    return 1;
}

size_t allocator_process_events(allocator *a) {
    size_t completed = 0, kept = 0;
    for (size_t i = 0; i < a->pending_count; i++) {
        allocator_block *block = a->pending[i];
        if (!events_done(a, block)) {
            a->pending[kept++] = block;
            continue;
        }
        block->free_pending = 0;
        a->pending_bytes -= block->size;
        free_completed(a, block);
        completed++;
    }
    a->pending_count = kept;
    return completed;
}

/* ---- 5. empty_cache ---- */

size_t allocator_empty_cache(allocator *a) {
    size_t released = 0;
    for (size_t i = a->segment_count; i-- > 0;) {
        allocator_segment *segment = a->segments[i];
        if (!reusable(segment->first) || segment->first->next != NULL) continue; /* merged into one free block? */
        released += segment->size;
        segment_release(a, segment);
    }
    return released;
}

void allocator_destroy(allocator *a) {
    /* shutdown: the device has finished its work (mem_shutdown's caller), so every pending free completes */
    for (size_t i = 0; i < a->pending_count; i++) {
        allocator_block *block = a->pending[i];
        for (int event = 0; event < block->event_count; event++)
            a->backend.event_release(a->backend.state, block->events[event]);
        block->event_count = 0;
        block->free_pending = 0;
        free_completed(a, block);
    }
    free(a->pending);
    a->pending = NULL;
    a->pending_count = a->pending_capacity = 0;
    a->pending_bytes = 0;
    while (a->segment_count > 0) {
        allocator_segment *segment = a->segments[a->segment_count - 1];
        for (allocator_block *block = segment->first; block != NULL; block = block->next)
            if (block->allocated) {
                block->allocated = 0;
                a->allocated_bytes -= block->size;
                a->requested_bytes -= block->requested;
                if (a->settings.caching) insert_or_abort(a, block); /* segment_release takes it out again */
            }
        segment_release(a, segment);
    }
    for (int pool = 0; pool < 2; pool++) free(a->free_blocks[pool].blocks);
    free(a->segments);
    a->segments = NULL;
    a->segment_capacity = 0;
    memset(a->free_blocks, 0, sizeof a->free_blocks);
}

/* ---- invariants ---- */

#define FAIL(...) do { snprintf(error, error_size, __VA_ARGS__); return -1; } while (0)

int allocator_check(const allocator *a, char *error, size_t error_size) {
    size_t reserved = 0, allocated = 0, requested = 0, pending = 0, free_count[2] = {0, 0};
    for (size_t s = 0; s < a->segment_count; s++) {
        const allocator_segment *segment = a->segments[s];
        reserved += segment->size;
        const char *expected = segment->ptr;
        const allocator_block *prev = NULL;
        for (const allocator_block *block = segment->first; block != NULL; prev = block, block = block->next) {
            if (block->ptr != expected)
                FAIL("segment %llu: block at offset %td, expected %td", (unsigned long long)segment->id,
                     block->ptr - segment->ptr, expected - segment->ptr);
            if (block->prev != prev || block->segment != segment)
                FAIL("segment %llu: broken block links", (unsigned long long)segment->id);
            if (block->size == 0 || block->size % ALLOCATOR_ROUND != 0)
                FAIL("segment %llu: block size %zu is not a positive multiple of %d", (unsigned long long)segment->id,
                     block->size, ALLOCATOR_ROUND);
            if (block->allocated) {
                allocated += block->size;
                requested += block->requested;
                if (block->requested > block->size)
                    FAIL("block of %zu bytes serves %zu", block->size, block->requested);
            } else if (block->free_pending) {
                pending += block->size;
            } else {
                if (prev && reusable(prev) && a->settings.caching)
                    FAIL("segment %llu: two free neighbours at offset %td", (unsigned long long)segment->id,
                         block->ptr - segment->ptr);
                free_count[segment->pool]++;
                const allocator_free_list *list = &a->free_blocks[segment->pool];
                size_t at = lower_bound(list, block->stream, block->size, block->ptr);
                if (a->settings.caching && (at >= list->count || list->blocks[at] != block))
                    FAIL("segment %llu: free block at offset %td missing from the %s free list",
                         (unsigned long long)segment->id, block->ptr - segment->ptr,
                         allocator_pool_name(segment->pool));
            }
            expected = block->ptr + block->size;
        }
        if (expected != segment->ptr + segment->size)
            FAIL("segment %llu: blocks cover %td of %zu bytes", (unsigned long long)segment->id,
                 expected - segment->ptr, segment->size);
    }
    for (int pool = 0; pool < 2; pool++) {
        const allocator_free_list *list = &a->free_blocks[pool];
        if (a->settings.caching && list->count != free_count[pool])
            FAIL("%s free list holds %zu blocks, segments have %zu free", allocator_pool_name((allocator_pool)pool),
                 list->count, free_count[pool]);
        for (size_t i = 1; i < list->count; i++)
            if (!block_before(list->blocks[i - 1], list->blocks[i]->stream, list->blocks[i]->size,
                              list->blocks[i]->ptr))
                FAIL("%s free list not sorted at %zu", allocator_pool_name((allocator_pool)pool), i);
    }
    if (reserved != a->reserved_bytes) FAIL("reserved %zu, segments sum to %zu", a->reserved_bytes, reserved);
    if (allocated != a->allocated_bytes) FAIL("allocated %zu, blocks sum to %zu", a->allocated_bytes, allocated);
    if (requested != a->requested_bytes) FAIL("requested %zu, blocks sum to %zu", a->requested_bytes, requested);
    if (pending != a->pending_bytes) FAIL("pending %zu, blocks sum to %zu", a->pending_bytes, pending);
    return 0;
}
