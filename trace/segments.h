/* segments.h — the caching allocator's state replayed from a rank's events: which segments it holds and which blocks
 * of each are allocated, at any line of rank<R>.jsonl.
 *
 * The runtime's allocator (core/memory/allocator.h) writes what it does: `segment_alloc` / `segment_free` when it takes
 * memory from its backend or gives it back, and on every `alloc` / `free` the block's address, rounded size and
 * segment. Replaying those lines in file order rebuilds its state without the runtime, so the views can draw it:
 * the memory_viz snapshot (the segments at the end, with their blocks), the summary and the memory page
 * (fragmentation at the peak: reserved − allocated, and the segments that hold it).
 *
 * The replay is also a check: run_load replays every rank and refuses a run whose events contradict themselves — a
 * block outside its segment or overlapping a live block, a segment freed while it holds blocks, a `reserved` field that
 * is not the running sum of segment bytes — with a message naming the file, the line and the values.
 */
#ifndef FSDPLAB_SEGMENTS_H
#define FSDPLAB_SEGMENTS_H

#include <stddef.h>
#include <stdint.h>

#include "run.h"

/* One allocated block: where it is and which alloc event made it. */
typedef struct segments_block {
    uint64_t address;
    uint64_t size;      /* rounded size, the bytes the block takes in its segment */
    size_t event;       /* index of its `alloc` in run_rank.events */
} segments_block;

/* One segment the allocator holds, with its live blocks sorted by address. */
typedef struct segments_segment {
    uint64_t address;
    uint64_t bytes;
    int pool;           /* string index: "small" or "large" */
    int stream;
    size_t event;       /* index of its `segment_alloc` */
    uint64_t allocated; /* sum of its blocks' sizes */
    segments_block *blocks;
    size_t block_count;
    size_t block_capacity;
} segments_segment;

typedef struct segments_state {
    segments_segment *segments; /* sorted by address */
    size_t count;
    size_t capacity;
    uint64_t reserved;          /* sum of segment bytes */
    uint64_t allocated;         /* sum of live block sizes */
} segments_state;

/* Applies rank->events[index] (other kinds than alloc/free/segment_* change nothing). Returns 0, or -1 with a message
 * naming the file, the line and the values when the event contradicts the state so far. */
int segments_apply(segments_state *state, const run_rank *rank, size_t index, char *error,
                   size_t error_size);

/* Replays rank->events[0 .. end) into a fresh state (free it with segments_free). Returns 0 or -1 as above. */
int segments_replay(segments_state *state, const run_rank *rank, size_t end, char *error,
                    size_t error_size);

void segments_free(segments_state *state);

/* The allocated peak every view reports: the first `alloc` after which the rank's live bytes (the sum of allocs minus
 * frees, PyTorch's "allocated") are highest. Returns its index in rank->events, or rank->event_count when the rank
 * allocated nothing; *live_bytes gets the live bytes there. */
size_t segments_peak_index(const run_rank *rank, uint64_t *live_bytes);

/* Fragmentation at an event: reserved − allocated, and how it splits. */
typedef struct segments_fragmentation {
    uint64_t reserved;   /* bytes of all segments */
    uint64_t allocated;  /* bytes asked for by the live blocks */
    uint64_t rounding;   /* block sizes − bytes asked for */
    uint64_t cached;     /* segment bytes in no live block: free blocks the cache keeps */
} segments_fragmentation;

/* Replays rank->events[0 .. index] (the event included) into `state` (free it with segments_free) and fills `out`.
 * live_bytes is the allocated bytes there (segments_peak_index's). Returns 0 or -1 as segments_apply. */
int segments_fragmentation_at(segments_state *state, const run_rank *rank, size_t index, uint64_t live_bytes,
                              segments_fragmentation *out, char *error, size_t error_size);

/* Sorts state's segments with the most free bytes first (address order among equals): the ones holding the most
 * fragmentation lead the views' tables. */
void segments_sort_by_free(segments_state *state);

#endif
