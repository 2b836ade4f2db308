/* segments.c — replaying the allocator's segments and blocks from the events. See segments.h. */
#include "segments.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int line_fail(const run_rank *rank, const run_event *event, char *error, size_t error_size, const char *format,
                     ...) {
    int written = snprintf(error, error_size, "%s line %zu: ", rank->path, event->line);
    if (written < 0 || (size_t)written >= error_size) return -1;
    va_list arguments;
    va_start(arguments, format);
    vsnprintf(error + written, error_size - (size_t)written, format, arguments);
    va_end(arguments);
    return -1;
}

/* The first of `count` records (each `stride` bytes, sorted by the uint64_t address each starts with) whose address
 * is >= address; count when none. Serves the segments and each segment's blocks. */
static size_t lower_bound(const void *records, size_t count, size_t stride, uint64_t address) {
    size_t low = 0, high = count;
    while (low < high) {
        size_t middle = low + (high - low) / 2;
        uint64_t at;
        memcpy(&at, (const char *)records + middle * stride, sizeof at);
        if (at < address) low = middle + 1;
        else high = middle;
    }
    return low;
}

_Static_assert(offsetof(segments_segment, address) == 0 && offsetof(segments_block, address) == 0,
               "lower_bound reads the address each record starts with");

static size_t segment_lower_bound(const segments_state *state, uint64_t address) {
    return lower_bound(state->segments, state->count, sizeof *state->segments, address);
}

static size_t block_lower_bound(const segments_segment *segment, uint64_t address) {
    return lower_bound(segment->blocks, segment->block_count, sizeof *segment->blocks, address);
}

static int reserved_check(const segments_state *state, const run_rank *rank, const run_event *event, char *error,
                          size_t error_size) {
    if (event->reserved == state->reserved) return 0;
    return line_fail(rank, event, error, error_size, "reserved %llu, but the segments so far hold %llu bytes",
                     (unsigned long long)event->reserved, (unsigned long long)state->reserved);
}

static int segment_add(segments_state *state, const run_rank *rank, size_t index, char *error, size_t error_size) {
    const run_event *event = &rank->events[index];
    size_t at = segment_lower_bound(state, event->address);
    const segments_segment *next = at < state->count ? &state->segments[at] : NULL;
    const segments_segment *previous = at > 0 ? &state->segments[at - 1] : NULL;
    if (event->bytes == 0) return line_fail(rank, event, error, error_size, "segment_alloc id %llu of 0 bytes",
                                            (unsigned long long)event->id);
    if ((next != NULL && next->address < event->address + event->bytes) ||
        (previous != NULL && previous->address + previous->bytes > event->address)) {
        const segments_segment *other = next != NULL && next->address < event->address + event->bytes ? next : previous;
        return line_fail(rank, event, error, error_size,
                         "segment_alloc id %llu [%#llx, +%llu) overlaps the live segment [%#llx, +%llu) of line %zu",
                         (unsigned long long)event->id, (unsigned long long)event->address,
                         (unsigned long long)event->bytes, (unsigned long long)other->address,
                         (unsigned long long)other->bytes, rank->events[other->event].line);
    }
    if (state->count == state->capacity) {
        size_t capacity = state->capacity ? 2 * state->capacity : 16;
        segments_segment *segments = realloc(state->segments, capacity * sizeof *segments);
        if (segments == NULL) return line_fail(rank, event, error, error_size, "out of memory for %zu segments", capacity);
        state->segments = segments;
        state->capacity = capacity;
    }
    memmove(&state->segments[at + 1], &state->segments[at], (state->count - at) * sizeof *state->segments);
    state->segments[at] = (segments_segment){.address = event->address, .bytes = event->bytes, .pool = event->pool,
                                             .stream = event->stream, .event = index};
    state->count++;
    state->reserved += event->bytes;
    return reserved_check(state, rank, event, error, error_size);
}

static int segment_remove(segments_state *state, const run_rank *rank, size_t index, char *error, size_t error_size) {
    const run_event *event = &rank->events[index];
    size_t at = segment_lower_bound(state, event->address);
    if (at == state->count || state->segments[at].address != event->address)
        return line_fail(rank, event, error, error_size, "segment_free id %llu at %#llx, which is not a live segment",
                         (unsigned long long)event->id, (unsigned long long)event->address);
    segments_segment *segment = &state->segments[at];
    if (segment->bytes != event->bytes)
        return line_fail(rank, event, error, error_size, "segment_free id %llu of %llu bytes, but line %zu allocated %llu",
                         (unsigned long long)event->id, (unsigned long long)event->bytes,
                         rank->events[segment->event].line, (unsigned long long)segment->bytes);
    if (segment->block_count != 0)
        return line_fail(rank, event, error, error_size,
                         "segment_free id %llu at %#llx while it holds %zu live blocks (the first from line %zu)",
                         (unsigned long long)event->id, (unsigned long long)event->address, segment->block_count,
                         rank->events[segment->blocks[0].event].line);
    free(segment->blocks);
    state->reserved -= segment->bytes;
    memmove(segment, segment + 1, (state->count - at - 1) * sizeof *segment);
    state->count--;
    return reserved_check(state, rank, event, error, error_size);
}

/* The live segment the event names in its `segment` field, or NULL after writing the error. */
static segments_segment *segment_of(segments_state *state, const run_rank *rank, const run_event *event, char *error,
                                    size_t error_size) {
    size_t at = segment_lower_bound(state, event->segment);
    if (at < state->count && state->segments[at].address == event->segment) return &state->segments[at];
    line_fail(rank, event, error, error_size, "%s id %llu names segment %#llx, which is not a live segment",
              event->kind == RUN_ALLOC ? "alloc" : "free", (unsigned long long)event->id,
              (unsigned long long)event->segment);
    return NULL;
}

static int block_add(segments_state *state, const run_rank *rank, size_t index, char *error, size_t error_size) {
    const run_event *event = &rank->events[index];
    segments_segment *segment = segment_of(state, rank, event, error, error_size);
    if (segment == NULL) return -1;
    if (event->address < segment->address || event->address + event->size > segment->address + segment->bytes)
        return line_fail(rank, event, error, error_size,
                         "alloc id %llu: block [%#llx, +%llu) lies outside its segment [%#llx, +%llu)",
                         (unsigned long long)event->id, (unsigned long long)event->address,
                         (unsigned long long)event->size, (unsigned long long)segment->address,
                         (unsigned long long)segment->bytes);
    size_t at = block_lower_bound(segment, event->address);
    const segments_block *next = at < segment->block_count ? &segment->blocks[at] : NULL;
    const segments_block *previous = at > 0 ? &segment->blocks[at - 1] : NULL;
    const segments_block *other = next != NULL && next->address < event->address + event->size ? next
                                  : previous != NULL && previous->address + previous->size > event->address ? previous
                                                                                                            : NULL;
    if (other != NULL)
        return line_fail(rank, event, error, error_size,
                         "alloc id %llu: block [%#llx, +%llu) overlaps live block id %llu [%#llx, +%llu) of line %zu",
                         (unsigned long long)event->id, (unsigned long long)event->address,
                         (unsigned long long)event->size, (unsigned long long)rank->events[other->event].id,
                         (unsigned long long)other->address, (unsigned long long)other->size,
                         rank->events[other->event].line);
    if (segment->block_count == segment->block_capacity) {
        size_t capacity = segment->block_capacity ? 2 * segment->block_capacity : 8;
        segments_block *blocks = realloc(segment->blocks, capacity * sizeof *blocks);
        if (blocks == NULL) return line_fail(rank, event, error, error_size, "out of memory for %zu blocks", capacity);
        segment->blocks = blocks;
        segment->block_capacity = capacity;
    }
    memmove(&segment->blocks[at + 1], &segment->blocks[at], (segment->block_count - at) * sizeof *segment->blocks);
    segment->blocks[at] = (segments_block){event->address, event->size, index};
    segment->block_count++;
    segment->allocated += event->size;
    state->allocated += event->size;
    return reserved_check(state, rank, event, error, error_size);
}

static int block_remove(segments_state *state, const run_rank *rank, size_t index, char *error, size_t error_size) {
    const run_event *event = &rank->events[index];
    segments_segment *segment = segment_of(state, rank, event, error, error_size);
    if (segment == NULL) return -1;
    size_t at = block_lower_bound(segment, event->address);
    if (at == segment->block_count || segment->blocks[at].address != event->address ||
        segment->blocks[at].size != event->size)
        return line_fail(rank, event, error, error_size, "free id %llu of block [%#llx, +%llu), which is not live",
                         (unsigned long long)event->id, (unsigned long long)event->address,
                         (unsigned long long)event->size);
    memmove(&segment->blocks[at], &segment->blocks[at + 1],
            (segment->block_count - at - 1) * sizeof *segment->blocks);
    segment->block_count--;
    segment->allocated -= event->size;
    state->allocated -= event->size;
    return reserved_check(state, rank, event, error, error_size);
}

int segments_apply(segments_state *state, const run_rank *rank, size_t index, char *error,
                   size_t error_size) {
    switch (rank->events[index].kind) {
    case RUN_SEGMENT_ALLOC: return segment_add(state, rank, index, error, error_size);
    case RUN_SEGMENT_FREE: return segment_remove(state, rank, index, error, error_size);
    case RUN_ALLOC: return block_add(state, rank, index, error, error_size);
    case RUN_FREE: return block_remove(state, rank, index, error, error_size);
    default: return 0;
    }
}

int segments_replay(segments_state *state, const run_rank *rank, size_t end, char *error,
                    size_t error_size) {
    memset(state, 0, sizeof *state);
    for (size_t index = 0; index < end && index < rank->event_count; index++)
        if (segments_apply(state, rank, index, error, error_size) != 0) return -1;
    return 0;
}

void segments_free(segments_state *state) {
    for (size_t index = 0; index < state->count; index++) free(state->segments[index].blocks);
    free(state->segments);
    memset(state, 0, sizeof *state);
}

size_t segments_peak_index(const run_rank *rank, uint64_t *live_bytes) {
    size_t peak = rank->event_count;
    uint64_t live = 0, peak_live = 0;
    for (size_t index = 0; index < rank->event_count; index++) {
        const run_event *event = &rank->events[index];
        if (event->kind == RUN_FREE) live -= event->bytes;
        if (event->kind != RUN_ALLOC) continue;
        live += event->bytes;
        if (peak == rank->event_count || live > peak_live) {
            peak = index;
            peak_live = live;
        }
    }
    *live_bytes = peak_live;
    return peak;
}

int segments_fragmentation_at(segments_state *state, const run_rank *rank, size_t index, uint64_t live_bytes,
                              segments_fragmentation *out, char *error, size_t error_size) {
    if (segments_replay(state, rank, index + 1, error, error_size) != 0) return -1;
    *out = (segments_fragmentation){.reserved = state->reserved, .allocated = live_bytes,
                                    .rounding = state->allocated - live_bytes,
                                    .cached = state->reserved - state->allocated};
    return 0;
}

static int by_free_descending(const void *left_pointer, const void *right_pointer) {
    const segments_segment *left = left_pointer, *right = right_pointer;
    uint64_t left_free = left->bytes - left->allocated, right_free = right->bytes - right->allocated;
    if (left_free != right_free) return left_free < right_free ? 1 : -1;
    return (left->address > right->address) - (left->address < right->address);
}

void segments_sort_by_free(segments_state *state) {
    qsort(state->segments, state->count, sizeof *state->segments, by_free_descending);
}
