/* allocator.h — a caching allocator with the semantics of PyTorch's CUDACachingAllocator, over any backend.
 *
 * Asking the system (cudaMalloc, or mmap on a host) for memory is slow — on a GPU it even synchronises the device —
 * and FSDP asks for the same sizes again and again: every unit unshards into a buffer of its size, every micro-batch.
 * So PyTorch never gives memory back: a freed block stays *reserved* in a cache and serves the next request that
 * fits. This file is that allocator, small enough to read in one sitting:
 *
 *   1. A request is rounded up to a multiple of 512 bytes (ALLOCATOR_ROUND): a *block* of that size is handed out.
 *   2. Blocks come from two pools: the small pool (blocks of at most 1 MiB) carves 2 MiB segments; the large pool
 *      carves 20 MiB segments for blocks under 10 MiB, and gives a larger block a segment of its own, rounded up to
 *      2 MiB. A *segment* is what the backend handed out (segment_alloc): the unit of `reserved` memory.
 *   3. Best fit: the smallest free block of the pool (and stream) that holds the request. If it is larger than
 *      needed, it is *split*: the front serves the request, the rest stays free (only when the rest is worth keeping:
 *      at least 512 B in the small pool, more than 1 MiB in the large pool).
 *   4. Freeing a block *merges* it with free neighbours of its segment, so split pieces become one block again.
 *   5. Nothing goes back to the backend until `allocator_empty_cache` (or a failed segment_alloc, which empties the
 *      cache and tries once more): reserved >= allocated, and the difference is the cache plus fragmentation.
 *   6. `max_split_size` (PyTorch's max_split_size_mb): blocks at least this large are never split, and a request
 *      smaller than it never takes one, so huge buffers do not get chopped into pieces that no later request fits.
 *
 * Per-stream ownership: every block and segment belongs to a stream (today always 0, the CPU has one); a free block
 * only serves requests of its own stream, as in PyTorch, so the streams of the overlap work can slot in.
 *
 * Stream-ordered reuse (PyTorch's record_stream): a block another stream also used (allocator_record_stream) may still
 * be read or written by that stream's queued work when the host frees it. On a backend with events (a GPU's) the
 * free records an event on each such stream and the block waits, neither allocated nor free ("free requested"),
 * until every event has completed ("free completed": allocator_malloc looks first); only then can a request, of any
 * stream, get it. The host never waits for it. The CPU's backend has no events: its streams' work is done or
 * ordered by the host, and a free is completed at once.
 *
 * With caching off (ALLOC=malloc, like PYTORCH_NO_CUDA_MEMORY_CACHING=1) every request is a segment of its own,
 * released the moment the block is freed: reserved == allocated, and every reuse is a fresh page-faulted mmap.
 *
 * The allocator knows nothing of categories, owners or the trace: core/memory/mem.h keeps those per allocation and is
 * told of every segment through the `observer` callback, so the trace shows segment_alloc / segment_free in order.
 */
#ifndef FSDPLAB_ALLOCATOR_H
#define FSDPLAB_ALLOCATOR_H

#include <stddef.h>
#include <stdint.h>

enum {
    ALLOCATOR_ROUND = 512,                    /* kMinBlockSize: every block is a multiple of this */
    ALLOCATOR_SMALL_SIZE = 1 << 20,           /* kSmallSize: the largest block of the small pool */
    ALLOCATOR_SMALL_SEGMENT = 2 << 20,        /* kSmallBuffer: the small pool's segment size */
    ALLOCATOR_LARGE_SEGMENT = 20 << 20,       /* kLargeBuffer: the large pool's segment for blocks < 10 MiB */
    ALLOCATOR_MIN_LARGE_ALLOC = 10 << 20,     /* kMinLargeAlloc: from here a block gets a segment of its own */
    ALLOCATOR_ROUND_LARGE = 2 << 20,          /* kRoundLarge: such segments are rounded up to 2 MiB */
};

typedef enum allocator_pool { ALLOCATOR_POOL_SMALL, ALLOCATOR_POOL_LARGE } allocator_pool;

/* Where segments come from. segment_alloc returns NULL when the backend has no memory. */
typedef struct allocator_backend {
    const char *name;
    void *(*segment_alloc)(void *state, size_t bytes);
    void (*segment_free)(void *state, void *ptr, size_t bytes);
    void *state;
    /* Sets bytes to zero (mem_alloc's zeroed blocks); NULL: memset, the memory is the host's. The CUDA device's
     * segments are GPU memory: cudaMemsetAsync on its compute stream. */
    void (*zero)(void *state, void *ptr, size_t bytes);
    /* Events for stream-ordered reuse; NULL (the host's memory): a free completes at once. event_record marks
     * `stream` now and returns the marker; event_done says whether the stream has passed it (without waiting);
     * event_release gives it back. */
    void *(*event_record)(void *state, int stream);
    int (*event_done)(void *state, void *event);
    void (*event_release)(void *state, void *event);
} allocator_backend;

/* The streams a block can be used by besides its own (allocator_record_stream): stream numbers 0 .. this - 1. */
#define ALLOCATOR_STREAMS_MAX 8

/* Page-aligned host memory (posix_memalign / free). */
extern const allocator_backend allocator_host_backend;

typedef struct allocator_segment allocator_segment;

/* A block: a piece of a segment, allocated or free. Neighbours in address order are linked within the segment. */
typedef struct allocator_block {
    char *ptr;
    size_t size;                        /* rounded: what the block occupies */
    size_t requested;                   /* what the caller asked for (0 when free) */
    int allocated;
    int stream;
    unsigned stream_uses;               /* bit s: stream s used it too (allocator_record_stream) */
    int free_pending;                   /* freed, waiting for `events`: neither allocated nor in a free list */
    int event_count;
    void *events[ALLOCATOR_STREAMS_MAX]; /* recorded at the free, one per stream that used it */
    allocator_segment *segment;
    struct allocator_block *prev, *next;
} allocator_block;

struct allocator_segment {
    char *ptr;
    size_t size;
    allocator_pool pool;
    int stream;
    uint64_t id;                        /* from 1, in creation order */
    allocator_block *first;             /* its blocks in address order */
};

/* The free blocks of one pool, sorted by (stream, size, address): best fit is a binary search. */
typedef struct allocator_free_list {
    allocator_block **blocks;
    size_t count, capacity;
} allocator_free_list;

typedef enum allocator_event { ALLOCATOR_SEGMENT_ALLOC, ALLOCATOR_SEGMENT_FREE } allocator_event;
typedef void (*allocator_observer)(void *observer_state, allocator_event event, const allocator_segment *segment);

typedef struct allocator_settings {
    int caching;                        /* 1: PyTorch's caching allocator; 0: one segment per request (ALLOC=malloc) */
    size_t max_split_size;              /* SIZE_MAX or 0: no limit (PyTorch's default); else > 20 MiB, as PyTorch
                                         * requires: a smaller cap would strand every fully freed large segment */
} allocator_settings;

typedef struct allocator {
    allocator_backend backend;
    allocator_settings settings;
    allocator_free_list free_blocks[2]; /* per pool */
    allocator_segment **segments;       /* live segments, in creation order */
    size_t segment_count, segment_capacity;
    uint64_t next_segment_id;
    size_t reserved_bytes;              /* sum of segment sizes */
    size_t allocated_bytes;             /* sum of allocated block sizes (rounded) */
    size_t requested_bytes;             /* sum of what callers asked for */
    size_t segment_allocs, segment_frees; /* backend calls made (the costly part) */
    allocator_block **pending;          /* freed blocks waiting for their events, in free order */
    size_t pending_count, pending_capacity;
    size_t pending_bytes;               /* their sizes: reserved, neither allocated nor reusable yet */
    allocator_observer observer;
    void *observer_state;
} allocator;

/* Rounds a request to its block size (ALLOCATOR_ROUND; 0 bytes still takes one 512-byte block). */
size_t allocator_round_size(size_t bytes);
/* The pool a block of `size` (rounded) comes from. */
allocator_pool allocator_pool_of(size_t size);
/* The segment size the allocator asks the backend for when no cached block holds a block of `size`. */
size_t allocator_segment_size(const allocator *a, size_t size);
const char *allocator_pool_name(allocator_pool pool);

void allocator_init(allocator *a, const allocator_backend *backend, const allocator_settings *settings,
                    allocator_observer observer, void *observer_state);
/* A block of at least `bytes` for `stream`, or NULL when the backend has no memory even after emptying the cache.
 * The contents are undefined. */
allocator_block *allocator_malloc(allocator *a, size_t bytes, int stream);
/* Stream `stream` uses the block too (torch's Tensor.record_stream): its free waits for that stream's work. */
void allocator_record_stream(allocator *a, allocator_block *block, int stream);
/* Returns the block to its pool (merging free neighbours); with caching off, releases its segment. A block other
 * streams used goes to the pending list instead, with an event per stream, until they complete. */
void allocator_free(allocator *a, allocator_block *block);
/* Completes the frees whose events have all completed (allocator_malloc calls it first). Returns how many. */
size_t allocator_process_events(allocator *a);
/* Releases every segment that holds no allocated block. Returns the bytes released. */
size_t allocator_empty_cache(allocator *a);
/* Releases every segment (all blocks must be free or are dropped); for shutdown. */
void allocator_destroy(allocator *a);

/* Checks every invariant: blocks tile each segment exactly, no two free neighbours, free lists sorted and holding
 * exactly the free blocks, the byte totals. Returns 0, or -1 with a message in `error`. Tests call it. */
int allocator_check(const allocator *a, char *error, size_t error_size);

#endif
