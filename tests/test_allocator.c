/* test_allocator.c — the caching allocator (core/memory/allocator.h): rounding, pool choice and segment sizes, split
 * and merge, best fit, max_split_size, streams, empty_cache, the retry after a failed segment_alloc, caching off; and
 * long random alloc/free sequences replayed against a reference model written independently here (a flat list of
 * blocks searched linearly), comparing every address and the whole free-block set after every operation. */
#define _POSIX_C_SOURCE 200809L
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/memory/allocator.h"
#include "check_main.h"

enum { MB = 1 << 20 };

/* ---- a backend that counts its calls and can run out of memory ---- */

typedef struct counting_backend {
    size_t capacity;            /* bytes it may hand out in all; SIZE_MAX: unlimited */
    size_t outstanding;
    int allocs, frees, refused;
} counting_backend;

static void *counting_alloc(void *state, size_t bytes) {
    counting_backend *backend = state;
    if (bytes > backend->capacity - backend->outstanding) {
        backend->refused++;
        return NULL;
    }
    void *ptr = malloc(bytes); /* never touched: the allocator only does address arithmetic */
    if (ptr == NULL) return NULL;
    backend->outstanding += bytes;
    backend->allocs++;
    return ptr;
}

static void counting_free(void *state, void *ptr, size_t bytes) {
    counting_backend *backend = state;
    backend->outstanding -= bytes;
    backend->frees++;
    free(ptr);
}

/* The observer's log: "+<size>" for a segment_alloc, "-<size>" for a segment_free. */
typedef struct segment_log {
    char text[4096];
    char *base[1024]; /* each segment's address, by id - 1 */
} segment_log;

static void log_segment(void *state, allocator_event event, const allocator_segment *segment) {
    segment_log *log = state;
    if (segment->id <= 1024) log->base[segment->id - 1] = segment->ptr;
    size_t used = strlen(log->text);
    snprintf(log->text + used, sizeof log->text - used, "%s%zu ", event == ALLOCATOR_SEGMENT_ALLOC ? "+" : "-",
             segment->size);
}

typedef struct fixture {
    counting_backend counts;
    allocator_backend backend;
    segment_log log;
    allocator a;
} fixture;

static void setup(fixture *f, int caching, size_t max_split_size, size_t capacity) {
    memset(f, 0, sizeof *f);
    f->counts.capacity = capacity;
    f->backend = (allocator_backend){"counting", counting_alloc, counting_free, &f->counts, NULL, NULL, NULL, NULL};
    allocator_settings settings = {.caching = caching, .max_split_size = max_split_size};
    allocator_init(&f->a, &f->backend, &settings, log_segment, &f->log);
}

static void assert_consistent(const allocator *a) {
    char error[256] = "";
    int status = allocator_check(a, error, sizeof error);
    ck_assert_msg(status == 0, "allocator_check: %s", error);
}

static void teardown(fixture *f) {
    allocator_destroy(&f->a);
    ck_assert_uint_eq(f->counts.outstanding, 0);
    ck_assert_int_eq(f->counts.allocs, f->counts.frees);
}

START_TEST(test_rounding_pools_and_segment_sizes) {
    fixture f;
    setup(&f, 1, 0, SIZE_MAX);
    ck_assert_uint_eq(allocator_round_size(0), 512);
    ck_assert_uint_eq(allocator_round_size(1), 512);
    ck_assert_uint_eq(allocator_round_size(512), 512);
    ck_assert_uint_eq(allocator_round_size(513), 1024);
    ck_assert_int_eq(allocator_pool_of(MB), ALLOCATOR_POOL_SMALL);
    ck_assert_int_eq(allocator_pool_of(MB + 512), ALLOCATOR_POOL_LARGE);
    ck_assert_uint_eq(allocator_segment_size(&f.a, 512), 2 * MB);
    ck_assert_uint_eq(allocator_segment_size(&f.a, MB), 2 * MB);
    ck_assert_uint_eq(allocator_segment_size(&f.a, MB + 512), 20 * MB);
    ck_assert_uint_eq(allocator_segment_size(&f.a, 10 * MB - 512), 20 * MB);
    ck_assert_uint_eq(allocator_segment_size(&f.a, 10 * MB), 10 * MB);
    ck_assert_uint_eq(allocator_segment_size(&f.a, 10 * MB + 512), 12 * MB);
    teardown(&f);
}
END_TEST

START_TEST(test_small_blocks_split_one_segment_and_merge_back) {
    fixture f;
    setup(&f, 1, 0, SIZE_MAX);
    allocator_block *first = allocator_malloc(&f.a, 1000, 0);
    allocator_block *second = allocator_malloc(&f.a, 1000, 0);
    allocator_block *third = allocator_malloc(&f.a, 100, 0);
    assert_consistent(&f.a);
    ck_assert_int_eq(f.counts.allocs, 1); /* one 2 MiB segment serves all three */
    ck_assert_uint_eq(f.a.reserved_bytes, 2 * MB);
    ck_assert_uint_eq(first->size, 1024);
    ck_assert_ptr_eq(second->ptr, first->ptr + 1024);
    ck_assert_ptr_eq(third->ptr, first->ptr + 2048);
    ck_assert_uint_eq(f.a.allocated_bytes, 1024 + 1024 + 512);
    ck_assert_uint_eq(f.a.requested_bytes, 2100);
    ck_assert_uint_eq(f.a.free_blocks[ALLOCATOR_POOL_SMALL].count, 1); /* the rest of the segment */

    allocator_free(&f.a, second); /* a hole between two allocated blocks */
    assert_consistent(&f.a);
    ck_assert_uint_eq(f.a.free_blocks[ALLOCATOR_POOL_SMALL].count, 2);
    allocator_block *again = allocator_malloc(&f.a, 600, 0); /* best fit: the 1024-byte hole, not the big rest; */
    ck_assert_ptr_eq(again->ptr, first->ptr + 1024);     /* 1024 - 1024... no: 600 rounds to 1024, a perfect fit */
    ck_assert_uint_eq(again->size, 1024);
    allocator_free(&f.a, again);
    allocator_free(&f.a, first);  /* merges with the hole after it */
    assert_consistent(&f.a);
    ck_assert_uint_eq(f.a.free_blocks[ALLOCATOR_POOL_SMALL].count, 2);
    allocator_free(&f.a, third);  /* merges both sides: one free block is the whole segment again */
    assert_consistent(&f.a);
    ck_assert_uint_eq(f.a.free_blocks[ALLOCATOR_POOL_SMALL].count, 1);
    ck_assert_uint_eq(f.a.free_blocks[ALLOCATOR_POOL_SMALL].blocks[0]->size, 2 * MB);
    ck_assert_uint_eq(f.a.reserved_bytes, 2 * MB); /* cached, not returned */
    ck_assert_uint_eq(f.a.allocated_bytes, 0);
    ck_assert_uint_eq(allocator_empty_cache(&f.a), 2 * MB);
    ck_assert_uint_eq(f.a.reserved_bytes, 0);
    ck_assert_str_eq(f.log.text, "+2097152 -2097152 ");
    teardown(&f);
}
END_TEST

START_TEST(test_large_pool_split_rule) {
    fixture f;
    setup(&f, 1, 0, SIZE_MAX);
    allocator_block *five = allocator_malloc(&f.a, 5 * MB, 0); /* a 20 MiB segment; 15 MiB left > 1 MiB: split */
    ck_assert_uint_eq(f.a.reserved_bytes, 20 * MB);
    ck_assert_uint_eq(five->size, 5 * MB);
    allocator_block *rest = allocator_malloc(&f.a, 14 * MB + 512, 0); /* fits the 15 MiB rest; 1 MiB - 512 left */
    ck_assert_ptr_eq(rest->ptr, five->ptr + 5 * MB);
    ck_assert_uint_eq(rest->size, 15 * MB); /* remaining < 1 MiB is not worth a block: taken whole */
    ck_assert_int_eq(f.counts.allocs, 1);
    allocator_block *eleven = allocator_malloc(&f.a, 11 * MB, 0); /* >= 10 MiB: its own segment, 12 MiB */
    ck_assert_uint_eq(eleven->segment->size, 12 * MB);
    ck_assert_uint_eq(eleven->size, 12 * MB); /* 12 - 11 = 1 MiB left, not > 1 MiB: taken whole */
    assert_consistent(&f.a);
    ck_assert_uint_eq(f.a.reserved_bytes, 32 * MB);
    allocator_free(&f.a, five);
    allocator_free(&f.a, rest);
    allocator_free(&f.a, eleven);
    assert_consistent(&f.a);
    ck_assert_uint_eq(allocator_empty_cache(&f.a), 32 * MB);
    teardown(&f);
}
END_TEST

START_TEST(test_best_fit_takes_the_smallest_block_that_fits) {
    fixture f;
    setup(&f, 1, 0, SIZE_MAX);
    /* Two segments of their own: 12 MiB and 14 MiB. */
    allocator_block *twelve = allocator_malloc(&f.a, 12 * MB, 0);
    allocator_block *fourteen = allocator_malloc(&f.a, 14 * MB, 0);
    char *twelve_at = twelve->ptr;
    allocator_free(&f.a, fourteen);
    allocator_free(&f.a, twelve);
    allocator_block *served = allocator_malloc(&f.a, 11 * MB, 0); /* both fit; the 12 MiB one is the best */
    ck_assert_ptr_eq(served->ptr, twelve_at);
    ck_assert_int_eq(f.counts.allocs, 2); /* reused: no new segment */
    allocator_block *next = allocator_malloc(&f.a, 11 * MB, 0);  /* the 12 MiB rest is 1 MiB: not split off; */
    ck_assert_uint_eq(next->segment->size, 14 * MB);            /* so the next 11 MiB takes the 14 MiB block */
    ck_assert_uint_eq(next->size, 11 * MB);                     /* and splits it: 3 MiB left > 1 MiB */
    assert_consistent(&f.a);
    allocator_free(&f.a, served);
    allocator_free(&f.a, next);
    teardown(&f);
}
END_TEST

START_TEST(test_max_split_size_keeps_big_blocks_whole) {
    fixture f;
    setup(&f, 1, 24 * MB, SIZE_MAX); /* PyTorch requires max_split_size > 20 MiB */
    allocator_block *thirty = allocator_malloc(&f.a, 30 * MB, 0);
    allocator_free(&f.a, thirty);
    allocator_block *small = allocator_malloc(&f.a, 2 * MB, 0); /* must not take (and split) the 30 MiB block */
    ck_assert_uint_eq(small->segment->size, 20 * MB);
    ck_assert_int_eq(f.counts.allocs, 2);
    allocator_block *again = allocator_malloc(&f.a, 30 * MB, 0); /* a large request reuses it */
    ck_assert_int_eq(f.counts.allocs, 2);
    allocator_free(&f.a, again);
    allocator_block *huge = allocator_malloc(&f.a, 60 * MB, 0);
    allocator_free(&f.a, huge);
    /* Free now: 30 MiB, the 18 MiB rest of the small request's segment, 60 MiB. */
    allocator_block *fortyfive = allocator_malloc(&f.a, 45 * MB, 0); /* 60 < 45 + 20: taken, and never split */
    ck_assert_uint_eq(fortyfive->size, 60 * MB);
    allocator_free(&f.a, fortyfive);
    allocator_block *twentysix = allocator_malloc(&f.a, 26 * MB, 0); /* the 30 MiB block, whole */
    ck_assert_uint_eq(twentysix->size, 30 * MB);
    allocator_block *thirtyfive = allocator_malloc(&f.a, 35 * MB, 0); /* only 60 fits, but 60 >= 35 + 20: new */
    ck_assert_uint_eq(thirtyfive->segment->size, 36 * MB);
    ck_assert_int_eq(f.counts.allocs, 4);
    assert_consistent(&f.a);
    allocator_free(&f.a, small);
    allocator_free(&f.a, twentysix);
    allocator_free(&f.a, thirtyfive);
    teardown(&f);
}
END_TEST

START_TEST(test_blocks_serve_their_own_stream_only) {
    fixture f;
    setup(&f, 1, 0, SIZE_MAX);
    allocator_block *on_zero = allocator_malloc(&f.a, 4096, 0);
    allocator_block *on_one = allocator_malloc(&f.a, 4096, 1);
    ck_assert_ptr_ne(on_zero->segment, on_one->segment);
    ck_assert_int_eq(on_one->segment->stream, 1);
    assert_consistent(&f.a);
    allocator_free(&f.a, on_zero);
    allocator_free(&f.a, on_one);
    teardown(&f);
}
END_TEST

/* ---- stream-ordered reuse: a backend whose events complete when the test says (a GPU's stream runs behind) ---- */

typedef struct planted_events {
    counting_backend counts;
    int complete[16];           /* per event: has its stream passed it */
    int stream_of[16];
    int recorded, released;
} planted_events;

static void *planted_alloc(void *state, size_t bytes) {
    return counting_alloc(&((planted_events *)state)->counts, bytes);
}
static void planted_free(void *state, void *ptr, size_t bytes) {
    counting_free(&((planted_events *)state)->counts, ptr, bytes);
}
/* Events are 1-based indices cast to pointers; a new one is not complete. */
static void *planted_record(void *state, int stream) {
    planted_events *events = state;
    ck_assert_int_lt(events->recorded, 16);
    events->stream_of[events->recorded] = stream;
    events->complete[events->recorded] = 0;
    return (void *)(uintptr_t)++events->recorded;
}
static int planted_done(void *state, void *event) {
    return ((planted_events *)state)->complete[(uintptr_t)event - 1];
}
static void planted_release(void *state, void *event) {
    planted_events *events = state;
    ck_assert_msg(events->complete[(uintptr_t)event - 1], "event %zu released before it completed",
                  (size_t)(uintptr_t)event);
    events->released++;
}

/* A block stream 0 allocated and stream 1 also used (record_stream) is freed by the host while stream 1's work may
 * still touch it: no request, of stream 0 or of stream 1, gets its memory until the event recorded on stream 1 at
 * the free has completed; then the next request of its size gets it back, merged as usual. */
START_TEST(test_freed_block_waits_for_the_event_of_the_stream_that_used_it) {
    planted_events events;
    memset(&events, 0, sizeof events);
    events.counts.capacity = SIZE_MAX;
    allocator_backend backend = {"planted", planted_alloc, planted_free, &events, NULL,
                                 planted_record, planted_done, planted_release};
    segment_log log;
    memset(&log, 0, sizeof log);
    allocator a;
    allocator_settings settings = {.caching = 1, .max_split_size = 0};
    allocator_init(&a, &backend, &settings, log_segment, &log);

    allocator_block *used = allocator_malloc(&a, 4096, 0);
    char *address = used->ptr;
    allocator_record_stream(&a, used, 1);
    allocator_free(&a, used);
    ck_assert_int_eq(events.recorded, 1);
    ck_assert_int_eq(events.stream_of[0], 1);
    ck_assert_uint_eq(a.pending_count, 1);
    ck_assert_uint_eq(a.allocated_bytes, 0);
    assert_consistent(&a);

    /* the event is pending: requests of either stream, of the same size and smaller, get other memory */
    allocator_block *taken[4];
    taken[0] = allocator_malloc(&a, 4096, 0);
    taken[1] = allocator_malloc(&a, 512, 0);
    taken[2] = allocator_malloc(&a, 4096, 1);
    for (int i = 0; i < 3; i++)
        ck_assert_msg(taken[i]->ptr + taken[i]->size <= address || taken[i]->ptr >= address + 4096,
                      "request %d got [%p, +%zu), inside the block whose free waits for stream 1's event", i,
                      (void *)taken[i]->ptr, taken[i]->size);
    ck_assert_uint_eq(a.pending_count, 1);
    assert_consistent(&a);
    ck_assert_uint_eq(allocator_empty_cache(&a), 0); /* nor does its segment go back */

    /* stream 1 passes the event: the free completes at the next request, which gets the block back (best fit) */
    events.complete[0] = 1;
    taken[3] = allocator_malloc(&a, 4096, 0);
    ck_assert_ptr_eq(taken[3]->ptr, address);
    ck_assert_uint_eq(a.pending_count, 0);
    ck_assert_int_eq(events.released, 1);
    assert_consistent(&a);
    for (int i = 0; i < 4; i++) allocator_free(&a, taken[i]);
    ck_assert_int_eq(events.recorded, 1); /* no other stream used them: their frees completed at once */
    assert_consistent(&a);
    allocator_destroy(&a);
}
END_TEST

/* Without events (the CPU's backend) record_stream changes nothing: the free completes at once. */
START_TEST(test_without_events_a_free_completes_at_once) {
    fixture f;
    setup(&f, 1, 0, SIZE_MAX);
    allocator_block *used = allocator_malloc(&f.a, 4096, 0);
    char *address = used->ptr;
    allocator_record_stream(&f.a, used, 1);
    allocator_free(&f.a, used);
    ck_assert_uint_eq(f.a.pending_count, 0);
    allocator_block *again = allocator_malloc(&f.a, 4096, 0);
    ck_assert_ptr_eq(again->ptr, address);
    allocator_free(&f.a, again);
    assert_consistent(&f.a);
    teardown(&f);
}
END_TEST

START_TEST(test_failed_segment_alloc_empties_the_cache_and_retries) {
    fixture f;
    setup(&f, 1, 0, 24 * MB);
    allocator_block *five = allocator_malloc(&f.a, 5 * MB, 0); /* 20 MiB segment */
    allocator_free(&f.a, five);                                /* cached */
    allocator_block *big = allocator_malloc(&f.a, 22 * MB, 0); /* the cached 20 MiB do not fit; 20 + 22 > 24 */
    ck_assert_ptr_nonnull(big);
    ck_assert_int_eq(f.counts.refused, 1);
    ck_assert_str_eq(f.log.text, "+20971520 -20971520 +23068672 ");
    ck_assert_ptr_null(allocator_malloc(&f.a, 13 * MB, 0)); /* nothing cached to release: out of memory */
    ck_assert_int_eq(f.counts.refused, 2);
    assert_consistent(&f.a);
    allocator_free(&f.a, big);
    teardown(&f);
}
END_TEST

START_TEST(test_caching_off_is_one_segment_per_request) {
    fixture f;
    setup(&f, 0, 0, SIZE_MAX);
    allocator_block *a = allocator_malloc(&f.a, 1000, 0);
    allocator_block *b = allocator_malloc(&f.a, 1000, 0);
    ck_assert_ptr_ne(a->segment, b->segment);
    ck_assert_uint_eq(f.a.reserved_bytes, 2048);
    ck_assert_uint_eq(f.a.reserved_bytes, f.a.allocated_bytes);
    assert_consistent(&f.a);
    allocator_free(&f.a, a);
    ck_assert_uint_eq(f.a.reserved_bytes, 1024);
    allocator_free(&f.a, b);
    ck_assert_uint_eq(f.a.reserved_bytes, 0);
    ck_assert_str_eq(f.log.text, "+1024 +1024 -1024 -1024 ");
    teardown(&f);
}
END_TEST

/* ---- the reference model: every block of every segment in one flat list, searched linearly ---- */

typedef struct ref_block {
    size_t segment;   /* index into ref_model.segment_sizes (creation order) */
    size_t offset, size;
    int allocated, stream;
    int small;
} ref_block;

typedef struct ref_model {
    ref_block blocks[4096];
    size_t count;
    size_t segment_sizes[1024];
    int segment_small[1024];
    size_t segment_count;
    size_t max_split;
} ref_model;

static size_t ref_segment_size(size_t size) {
    if (size <= (size_t)MB) return 2 * MB;
    if (size < 10 * (size_t)MB) return 20 * MB;
    return (size + 2 * MB - 1) / (2 * MB) * (2 * MB);
}

/* Returns the index of the block that serves the request, splitting as PyTorch does. Ties between free blocks of
 * one size go to the lowest address, as in PyTorch's set ordering: `base` has each segment's address. */
static size_t ref_malloc(ref_model *m, char *const *base, size_t bytes, int stream) {
    size_t size = bytes < 512 ? 512 : (bytes + 511) / 512 * 512;
    int small = size <= (size_t)MB;
    size_t best = SIZE_MAX;
    for (size_t i = 0; i < m->count; i++) {
        const ref_block *b = &m->blocks[i];
        if (b->allocated || b->small != small || b->stream != stream || b->size < size) continue;
        if (best == SIZE_MAX || b->size < m->blocks[best].size ||
            (b->size == m->blocks[best].size &&
             base[b->segment] + b->offset < base[m->blocks[best].segment] + m->blocks[best].offset))
            best = i;
    }
    if (best != SIZE_MAX) {
        size_t found = m->blocks[best].size;
        if ((size < m->max_split && found >= m->max_split) || (size >= m->max_split && found >= size + 20 * (size_t)MB))
            best = SIZE_MAX;
    }
    if (best == SIZE_MAX) {
        m->segment_sizes[m->segment_count] = ref_segment_size(size);
        m->segment_small[m->segment_count] = small;
        m->blocks[m->count] = (ref_block){m->segment_count, 0, ref_segment_size(size), 0, stream, small};
        m->segment_count++;
        best = m->count++;
    }
    ref_block *b = &m->blocks[best];
    size_t remaining = b->size - size;
    int split = small ? remaining >= 512 : (size < m->max_split && remaining > (size_t)MB);
    if (split) {
        m->blocks[m->count++] = (ref_block){b->segment, b->offset + size, remaining, 0, stream, small};
        b->size = size;
    }
    b->allocated = 1;
    return best;
}

static void ref_free(ref_model *m, size_t index) {
    ref_block *b = &m->blocks[index];
    b->allocated = 0;
    for (int merged = 1; merged;) {
        merged = 0;
        for (size_t i = 0; i < m->count; i++) {
            ref_block *o = &m->blocks[i];
            if (i == index || o->allocated || o->size == 0 || o->segment != b->segment) continue;
            if (o->offset + o->size == b->offset) b->offset = o->offset;
            else if (b->offset + b->size != o->offset) continue;
            b->size += o->size;
            o->size = 0; /* dead: skipped from now on */
            merged = 1;
        }
    }
}

/* The allocator's segment index for a segment pointer (the reference numbers segments by creation). */
static size_t segment_index(const allocator_segment *segment) { return (size_t)(segment->id - 1); }

START_TEST(test_random_sequences_match_the_reference_model) {
    for (int round = 0; round < 6; round++) {
        fixture f;
        size_t max_split = round % 2 ? 24 * (size_t)MB : SIZE_MAX;
        setup(&f, 1, max_split == SIZE_MAX ? 0 : max_split, SIZE_MAX);
        static ref_model m;
        memset(&m, 0, sizeof m);
        m.max_split = max_split;
        allocator_block *live[64] = {0};
        size_t live_ref[64];
        uint64_t state = 0x9e3779b97f4a7c15ull * (uint64_t)(round + 1);
        for (int op = 0; op < 1500; op++) {
            state = state * 6364136223846793005ull + 1442695040888963407ull;
            int slot = (int)((state >> 33) % 64);
            if (live[slot] == NULL) {
                /* sizes from every regime: tiny, small pool, large pool, own segment */
                size_t kinds[4] = {700, 300 * 1024, 6 * (size_t)MB, 30 * (size_t)MB};
                size_t bytes = (size_t)((state >> 12) % kinds[(state >> 40) % 4]) + 1;
                int stream = (int)((state >> 50) % 2);
                live[slot] = allocator_malloc(&f.a, bytes, stream);
                live_ref[slot] = ref_malloc(&m, f.log.base, bytes, stream);
                const ref_block *r = &m.blocks[live_ref[slot]];
                ck_assert_msg(segment_index(live[slot]->segment) == r->segment &&
                                  (size_t)(live[slot]->ptr - live[slot]->segment->ptr) == r->offset &&
                                  live[slot]->size == r->size,
                              "round %d op %d: %zu bytes: allocator gave segment %zu offset %td size %zu, reference "
                              "segment %zu offset %zu size %zu", round, op, bytes,
                              segment_index(live[slot]->segment), live[slot]->ptr - live[slot]->segment->ptr,
                              live[slot]->size, r->segment, r->offset, r->size);
            } else {
                allocator_free(&f.a, live[slot]);
                ref_free(&m, live_ref[slot]);
                live[slot] = NULL;
            }
            assert_consistent(&f.a);
            /* The free blocks, pool by pool, are the reference's (as (segment, offset, size) sets). */
            size_t ref_free_count = 0, reserved = 0;
            for (size_t i = 0; i < m.count; i++) ref_free_count += !m.blocks[i].allocated && m.blocks[i].size > 0;
            for (size_t s = 0; s < m.segment_count; s++) reserved += m.segment_sizes[s];
            ck_assert_uint_eq(f.a.free_blocks[0].count + f.a.free_blocks[1].count, ref_free_count);
            ck_assert_uint_eq(f.a.reserved_bytes, reserved);
            for (int pool = 0; pool < 2; pool++)
                for (size_t i = 0; i < f.a.free_blocks[pool].count; i++) {
                    const allocator_block *b = f.a.free_blocks[pool].blocks[i];
                    int found = 0;
                    for (size_t j = 0; j < m.count && !found; j++)
                        found = !m.blocks[j].allocated && m.blocks[j].size == b->size &&
                                m.blocks[j].segment == segment_index(b->segment) &&
                                m.blocks[j].offset == (size_t)(b->ptr - b->segment->ptr);
                    ck_assert_msg(found, "round %d op %d: free block of %zu bytes not in the reference", round, op,
                                  b->size);
                }
            /* No two live blocks overlap. */
            for (int x = 0; x < 64; x++)
                for (int y = x + 1; y < 64; y++)
                    if (live[x] && live[y])
                        ck_assert(live[x]->ptr + live[x]->size <= live[y]->ptr ||
                                  live[y]->ptr + live[y]->size <= live[x]->ptr);
        }
        for (int slot = 0; slot < 64; slot++) allocator_free(&f.a, live[slot]);
        assert_consistent(&f.a);
        ck_assert_uint_eq(f.a.allocated_bytes, 0);
        size_t reserved_before = f.a.reserved_bytes;
        ck_assert_uint_gt(reserved_before, 0);
        ck_assert_uint_eq(allocator_empty_cache(&f.a), reserved_before); /* every segment is one free block again */
        ck_assert_uint_eq(f.a.reserved_bytes, 0);
        teardown(&f);
    }
}
END_TEST

int main(void) {
    Suite *suite = suite_create("allocator");
    TCase *tc = tcase_create("caching allocator");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_rounding_pools_and_segment_sizes);
    tcase_add_test(tc, test_small_blocks_split_one_segment_and_merge_back);
    tcase_add_test(tc, test_large_pool_split_rule);
    tcase_add_test(tc, test_best_fit_takes_the_smallest_block_that_fits);
    tcase_add_test(tc, test_max_split_size_keeps_big_blocks_whole);
    tcase_add_test(tc, test_blocks_serve_their_own_stream_only);
    tcase_add_test(tc, test_freed_block_waits_for_the_event_of_the_stream_that_used_it);
    tcase_add_test(tc, test_without_events_a_free_completes_at_once);
    tcase_add_test(tc, test_failed_segment_alloc_empties_the_cache_and_retries);
    tcase_add_test(tc, test_caching_off_is_one_segment_per_request);
    tcase_add_test(tc, test_random_sequences_match_the_reference_model);
    suite_add_tcase(suite, tc);
    return check_run(suite);
}
