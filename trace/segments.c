/* segments.c — replaying the allocator's segments and blocks from the events. See segments.h. */
#include "segments.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
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

/* ---- sorted arrays of spans ----
 *
 * The live segments, and each segment's live blocks, are arrays sorted by address whose records start with two
 * uint64_t: the address and the length (a segment's bytes, a block's size). These helpers serve both. */

typedef struct span {
    uint64_t address, length;
} span;

_Static_assert(offsetof(segments_segment, address) == 0 && offsetof(segments_segment, bytes) == sizeof(uint64_t) &&
                   offsetof(segments_block, address) == 0 && offsetof(segments_block, size) == sizeof(uint64_t),
               "segments and blocks start with their address and length");

static span span_at(const void *records, size_t stride, size_t index) {
    span at;
    memcpy(&at, (const char *)records + index * stride, sizeof at);
    return at;
}

/* The first record whose address is >= address; count when none. */
static size_t lower_bound(const void *records, size_t count, size_t stride, uint64_t address) {
    size_t low = 0, high = count;
    while (low < high) {
        size_t middle = low + (high - low) / 2;
        if (span_at(records, stride, middle).address < address) low = middle + 1;
        else high = middle;
    }
    return low;
}

/* The record that [address, address + length) would overlap if inserted at position `at` (only its neighbours can,
 * the live ones being disjoint), or SIZE_MAX. */
static size_t overlapping(const void *records, size_t count, size_t stride, size_t at, uint64_t address,
                          uint64_t length) {
    if (at < count && span_at(records, stride, at).address < address + length) return at;
    if (at > 0) {
        span previous = span_at(records, stride, at - 1);
        if (previous.address + previous.length > address) return at - 1;
    }
    return SIZE_MAX;
}

/* Inserts `record` at position `at`, growing the array; -1 when out of memory. */
static int insert_at(void **records, size_t *count, size_t *capacity, size_t stride, size_t at, const void *record) {
    if (*count == *capacity) {
        size_t grown = *capacity ? 2 * *capacity : 16;
        void *larger = realloc(*records, grown * stride);
        if (larger == NULL) return -1;
        *records = larger;
        *capacity = grown;
    }
    char *base = *records;
    memmove(base + (at + 1) * stride, base + at * stride, (*count - at) * stride);
    memcpy(base + at * stride, record, stride);
    (*count)++;
    return 0;
}

static void remove_at(void *records, size_t *count, size_t stride, size_t at) {
    char *base = records;
    memmove(base + at * stride, base + (at + 1) * stride, (*count - at - 1) * stride);
    (*count)--;
}

static size_t segment_lower_bound(const segments_state *state, uint64_t address) {
    return lower_bound(state->segments, state->count, sizeof *state->segments, address);
}

static int reserved_check(const segments_state *state, const run_rank *rank, const run_event *event, char *error,
                          size_t error_size) {
    if (event->reserved == state->reserved) return 0;
    return line_fail(rank, event, error, error_size, "reserved %llu, but the segments so far hold %llu bytes",
                     (unsigned long long)event->reserved, (unsigned long long)state->reserved);
}

static int segment_add(segments_state *state, const run_rank *rank, size_t index, char *error, size_t error_size) {
    const run_event *event = &rank->events[index];
    if (event->bytes == 0) return line_fail(rank, event, error, error_size, "segment_alloc id %llu of 0 bytes",
                                            (unsigned long long)event->id);
    size_t stride = sizeof *state->segments, at = segment_lower_bound(state, event->address);
    size_t other = overlapping(state->segments, state->count, stride, at, event->address, event->bytes);
    if (other != SIZE_MAX)
        return line_fail(rank, event, error, error_size,
                         "segment_alloc id %llu [%#llx, +%llu) overlaps the live segment [%#llx, +%llu) of line %zu",
                         (unsigned long long)event->id, (unsigned long long)event->address,
                         (unsigned long long)event->bytes, (unsigned long long)state->segments[other].address,
                         (unsigned long long)state->segments[other].bytes,
                         rank->events[state->segments[other].event].line);
    segments_segment added = {.address = event->address, .bytes = event->bytes, .pool = event->pool,
                              .stream = event->stream, .event = index};
    if (insert_at((void **)&state->segments, &state->count, &state->capacity, stride, at, &added) != 0)
        return line_fail(rank, event, error, error_size, "out of memory for %zu segments", state->count + 1);
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
        return line_fail(rank, event, error, error_size,
                         "segment_free id %llu of %llu bytes, but line %zu allocated %llu",
                         (unsigned long long)event->id, (unsigned long long)event->bytes,
                         rank->events[segment->event].line, (unsigned long long)segment->bytes);
    if (segment->block_count != 0)
        return line_fail(rank, event, error, error_size,
                         "segment_free id %llu at %#llx while it holds %zu live blocks (the first from line %zu)",
                         (unsigned long long)event->id, (unsigned long long)event->address, segment->block_count,
                         rank->events[segment->blocks[0].event].line);
    free(segment->blocks);
    state->reserved -= segment->bytes;
    remove_at(state->segments, &state->count, sizeof *state->segments, at);
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
    size_t stride = sizeof *segment->blocks;
    size_t at = lower_bound(segment->blocks, segment->block_count, stride, event->address);
    size_t other = overlapping(segment->blocks, segment->block_count, stride, at, event->address, event->size);
    if (other != SIZE_MAX) {
        const segments_block *live = &segment->blocks[other];
        return line_fail(rank, event, error, error_size,
                         "alloc id %llu: block [%#llx, +%llu) overlaps live block id %llu [%#llx, +%llu) of line %zu",
                         (unsigned long long)event->id, (unsigned long long)event->address,
                         (unsigned long long)event->size, (unsigned long long)rank->events[live->event].id,
                         (unsigned long long)live->address, (unsigned long long)live->size,
                         rank->events[live->event].line);
    }
    segments_block added = {event->address, event->size, index};
    if (insert_at((void **)&segment->blocks, &segment->block_count, &segment->block_capacity, stride, at, &added) != 0)
        return line_fail(rank, event, error, error_size, "out of memory for %zu blocks", segment->block_count + 1);
    segment->allocated += event->size;
    state->allocated += event->size;
    return reserved_check(state, rank, event, error, error_size);
}

static int block_remove(segments_state *state, const run_rank *rank, size_t index, char *error, size_t error_size) {
    const run_event *event = &rank->events[index];
    segments_segment *segment = segment_of(state, rank, event, error, error_size);
    if (segment == NULL) return -1;
    size_t at = lower_bound(segment->blocks, segment->block_count, sizeof *segment->blocks, event->address);
    if (at == segment->block_count || segment->blocks[at].address != event->address ||
        segment->blocks[at].size != event->size)
        return line_fail(rank, event, error, error_size, "free id %llu of block [%#llx, +%llu), which is not live",
                         (unsigned long long)event->id, (unsigned long long)event->address,
                         (unsigned long long)event->size);
    remove_at(segment->blocks, &segment->block_count, sizeof *segment->blocks, at);
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
