/* run.h — a run directory's events read back into memory: the one reader of rank<R>.jsonl that every view uses (the
 * Chrome export, the memory page, the memory_viz snapshot and the summary), so they all accept and refuse the same
 * files with the same messages, and `trace_export_all` reads a run once for all four.
 *
 * Every rank<R>.jsonl of the run is parsed with cJSON and checked against trace/EVENTS.md; each event keeps its line
 * number, so every view can send the learner back to the exact line. Strings (owners, units, states...) are stored
 * once per run and events refer to them by index.
 */
#ifndef FSDPLAB_RUN_H
#define FSDPLAB_RUN_H

#include <stddef.h>
#include <stdint.h>

/* EVENTS.md's memory categories, in its order: views list and color them in this order. */
enum { RUN_CATEGORY_COUNT = 12 };
extern const char *const run_categories[RUN_CATEGORY_COUNT];

typedef enum run_event_kind {
    RUN_STATE,
    RUN_COLLECTIVE,
    RUN_ALLOC,
    RUN_FREE,
    RUN_COMPUTE,
    RUN_STEP,
    RUN_MARK,
    RUN_SEGMENT_ALLOC,
    RUN_SEGMENT_FREE,
    RUN_ALLOCATOR,
    RUN_WAIT,             /* version 3: the host (compute stream) blocked until work on a stream completed */
    RUN_FSDP,             /* version 3: the FSDP runtime's options (in run_rank.fsdp[id]) */
    RUN_END,              /* the program's orderly end (absent: the run was cut short) */
    RUN_COPY,             /* version 4: a copy between the device and the host pool (CPU offload) */
} run_event_kind;

/* The streams of EVENTS.md version 3, by name. A version-2 file's collectives all ran on the compute stream. */
typedef enum run_stream {
    RUN_STREAM_COMPUTE,        /* the host thread: compute spans, waits and the blocking collectives */
    RUN_STREAM_ALL_GATHER,     /* torch's _unshard_stream */
    RUN_STREAM_REDUCE_SCATTER, /* torch's _post_backward_stream */
    RUN_STREAM_COUNT,
} run_stream;
extern const char *const run_stream_names[RUN_STREAM_COUNT];

enum { RUN_NONE = -1 };  /* a string field that the line has not, or has as null; a free with no alloc */

/* Optional fields a line may leave out. run_event.present says which ones the line has (as a value or as null):
 * the Chrome export copies into its args exactly the fields the line has, as the line has them. */
enum {
    RUN_HAS_UNIT = 1 << 0,    /* collective, compute */
    RUN_HAS_PHASE = 1 << 1,   /* compute */
    RUN_HAS_REDUCE = 1 << 2,  /* collective */
    RUN_HAS_COUNT = 1 << 3,   /* collective */
    RUN_HAS_HOOK = 1 << 4,    /* state, wait */
    RUN_HAS_DTYPE = 1 << 5,   /* collective, alloc, free (version 4) */
};

/* One JSONL line. Which fields mean something depends on the kind (EVENTS.md): the rest are 0 or RUN_NONE. */
typedef struct run_event {
    run_event_kind kind;
    size_t line;          /* line number in rank<R>.jsonl; line 1 is the meta line, so events start at 2 */
    double ts;            /* microseconds since t0; 0 when negative or on a line before the last "t0" mark */
    double dur;           /* collective, compute, wait */
    double issue_ts;      /* collective: when the host issued it (<= ts; ts itself in a version-2 file) */
    int label;            /* string: alloc/free owner, collective op, compute name, mark text; wait: the op or
                             RUN_NONE */
    int unit;             /* string: state, collective, compute, wait */
    int machine, from, to; /* strings: state */
    int hook;             /* string: state, wait */
    run_stream ran_on;    /* collective, compute: the stream it ran on; wait: the stream that waited (compute) */
    run_stream waited_on; /* wait: the stream it waited for (`on`) */
    int phase;            /* string: compute */
    int reduce;           /* string: collective */
    int group;            /* string: collective, its process group ("shard", "replicate"); RUN_NONE: the world */
    int group_ranks;      /* string: collective, its group's world ranks as "0,2" (RUN_NONE: the world); with
                             `group` and `seq` it names one collective (version 4: the shard groups run a seq at
                             once) */
    int group_size;       /* collective: ranks in its group (the world size for the world) */
    int dtype;            /* string: collective, alloc/free: the elements' type (version 4), or RUN_NONE */
    int category;         /* alloc/free: index into run_categories; segment events: the request's, or RUN_NONE */
    int pool;             /* string: segment events' pool ("small", "large") */
    int stream;           /* alloc/free/segment events */
    uint64_t address;     /* alloc/free: the block's address; segment events: the segment's */
    uint64_t size;        /* alloc/free: the block's (rounded) size */
    uint64_t segment;     /* alloc/free: the address of the segment holding the block */
    uint64_t reserved;    /* alloc/free/segment events: reserved bytes after the event; step: the reserved peak */
    unsigned present;     /* RUN_HAS_* of the optional fields the line has */
    uint64_t id, bytes, bytes_sent, bytes_recv, peak_bytes;
    int64_t seq;          /* collective: from 0; wait: the collective waited for, or -1 */
    uint64_t count;       /* collective: floats in the buffer */
    long partner;         /* alloc: index of its free in the rank's events, free: of its alloc; RUN_NONE if none */
    int step, micro;
    double loss, seconds;
    int direction;        /* string: copy ("h2d", "d2h") */
} run_event;

/* The `allocator` event: the caching allocator's settings on this rank (EVENTS.md). */
typedef struct run_allocator {
    int seen;
    char mode[16];        /* "caching" or "malloc" */
    char backend[16];
    uint64_t round, small_size, small_segment, large_segment, min_large_alloc, round_large, max_split_size;
} run_allocator;

/* The `fsdp` event: the runtime's options (torch's names), what a view prints as the run's mode. */
typedef struct run_fsdp {
    size_t line;
    char model[64];
    char sharding_strategy[32];
    char backward_prefetch[16];   /* "BACKWARD_PRE", "BACKWARD_POST" or "" (null: torch's None) */
    int forward_prefetch, limit_all_gathers, activation_checkpointing, no_sync;
    int accumulation_steps, unit_count;
    char param_dtype[16], reduce_dtype[16]; /* version 4's mixed_precision; "" when off (null) or absent */
} run_fsdp;

typedef struct run_rank {
    int rank;
    int version;          /* the meta line's schema version (2, 3 or 4) */
    run_allocator allocator;
    run_fsdp *fsdp;       /* the rank's fsdp events (one per runtime) in file order; a RUN_FSDP event's id indexes it */
    size_t fsdp_count;
    char path[4096];
    double unix_time;     /* the meta line's wall-clock seconds at t0's file open; 0 when absent */
    char run_id[64];      /* the meta line's run id ("" when absent: files from before it) */
    int ended;            /* an `end` event was read: the program finished in order */
    size_t line_count;    /* lines read, the meta line included */
    run_event *events;    /* in file order, which is the order the allocator and the hooks saw them */
    size_t event_count;
    size_t event_capacity;
    /* Version 4, CPU offload: the host pool's memory events (alloc, free, segment_*, `device` "host") and its
     * allocator, as a rank of their own (same rank and path; checked alone), so every view of `events` sees the device
     * pool exactly as before. NULL when the run has no host-pool event. */
    struct run_rank *host;
} run_rank;

typedef struct run_strings {
    char **texts;
    size_t count;
    size_t capacity;
    int *slots;           /* open-addressing hash table of indices into texts; RUN_NONE when empty */
    size_t slot_count;    /* a power of two, kept at least twice count */
} run_strings;

typedef struct trace_run {
    char rundir[4096];
    int world;
    run_rank *ranks;      /* world of them once loaded, ranks[r].rank == r */
    int rank_count;       /* entries in ranks (1 while rank 0 is read) */
    run_strings strings;
} trace_run;

/* Reads every rank<R>.jsonl of rundir (rank0.jsonl's meta line gives the world size). A final line cut short by a
 * crash is skipped with a warning on stderr; any other bad line, an unknown category, a reused allocation id or a
 * free that matches no live allocation (id, bytes, category), or memory events that contradict the allocator's
 * segments (trace/segments.h: a block outside its segment, overlapping blocks, a wrong `reserved`) is an error
 * naming the file, the line and the values.
 * Returns 0, or -1 with the message in `error`; free the run with run_free either way. */
int run_load(trace_run *run, const char *rundir, char *error, size_t error_size);
/* The options of an `fsdp` event as a JSON object, as the line had them (the Chrome export's args, `overlap`'s
 * "fsdp"). The caller owns it. */
struct cJSON *run_fsdp_json(const run_fsdp *options);
void run_free(trace_run *run);

/* The text of a string index; "" for RUN_NONE. */
const char *run_string(const trace_run *run, int index);

#endif
