/* trace.h — the event sink: one JSON object per line, one file per rank (<outdir>/rank<R>.jsonl).
 *
 * The sink only writes; nothing in the runtime ever reads events back (docs/architecture.md §1). Every event carries
 * `kind`, `ts` (microseconds since this rank's t0, taken right after a start barrier) and `rank`. The exact schema, and
 * the version written in the first line of each file, is trace/EVENTS.md. Events are printed into a per-sink buffer
 * and written to the file at each step's end (trace_step), when the buffer holds 1 MiB, and on trace_flush,
 * trace_end and trace_close: no flush per event. A fatal signal (SIGTERM from MPI_Abort, SIGABRT, SIGSEGV...) writes
 * the buffered lines before the process dies, and the runtime's fatal paths call trace_flush; only SIGKILL loses the
 * lines since the last flush.
 *
 * This module knows nothing of MPI or of the core: the caller passes the rank and chooses the moment of t0.
 */
#ifndef FSDPLAB_TRACE_H
#define FSDPLAB_TRACE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define TRACE_SCHEMA_NAME "fsdplab-events"
#define TRACE_SCHEMA_VERSION 4

typedef struct trace_sink {
    FILE *file;          /* NULL: tracing disabled, every trace_* call is a no-op */
    int rank;
    int world_size;
    double t0_seconds;   /* CLOCK_MONOTONIC at t0 */
    char path[1024];
    /* The buffer of printed lines not yet in the file (trace.c's writer): bytes [0, committed) are whole lines,
     * [committed, length) the event being printed. */
    char *buffer;
    size_t length, committed, capacity, event_start;
    int first_field;     /* the next field opens its object (no comma before it) */
    int event_failed;    /* out of memory while printing this event: it is dropped */
    int dropped;         /* an event was dropped (reported once) */
    volatile int flushing;
} trace_sink;

/* Opens <outdir>/rank<R>.jsonl for writing (truncating) and writes the `meta` line. t0 is "now"; call
 * trace_reset_t0 right after the start barrier. Returns 0, or -1 with a message on stderr naming the path. */
int trace_open(trace_sink *sink, const char *outdir, int rank, int world_size);
/* The same, with the run's id in the meta line (every rank of one run writes the same id, so a reader can refuse
 * rank files of two runs mixed in one directory). */
int trace_open_run(trace_sink *sink, const char *outdir, int rank, int world_size, const char *run_id);
/* The program reached its orderly end: a run whose files lack this event was cut short (crash, kill, abort). */
void trace_end(trace_sink *sink);
/* Takes t0 now and writes a `mark` "t0" line; ts of later events count from here. */
void trace_reset_t0(trace_sink *sink);
/* Microseconds since t0 (monotonic clock). */
double trace_now_us(const trace_sink *sink);
/* Writes the buffered events to the file now (a fatal path calls it before it aborts). */
void trace_flush(trace_sink *sink);
/* Flushes, closes the file and frees the buffer. */
void trace_close(trace_sink *sink);

/* A state transition of an FSDP unit. `machine` names the enum: "TrainingState", "HandleTrainingState" or
 * "ShardState"; `hook` the hook that made it (e.g. "_pre_forward"). */
void trace_state(trace_sink *sink, const char *unit, const char *machine, const char *from, const char *to,
                 const char *hook);

/* A finished collective that its stream started at start_us and completed dur_us later; the host issued it at
 * issue_us (<= start_us: a stream runs its work in order, so a collective may queue behind another). `bytes` is the
 * size of the whole (unsharded) buffer the collective covers; bytes_sent / bytes_recv what this rank moves under a
 * ring algorithm. `seq` counts the collectives of this rank from 0 in issue order, so the same seq on every rank is
 * the same collective. */
typedef struct trace_collective_info {
    const char *op;      /* all_gather, reduce_scatter, all_reduce, broadcast, barrier */
    const char *unit;
    const char *reduce;  /* "sum", "avg" or NULL when the op reduces nothing */
    uint64_t count;      /* elements in the whole buffer */
    uint64_t bytes;      /* count x the element size */
    uint64_t bytes_sent;
    uint64_t bytes_recv;
    uint64_t seq;
    const char *stream;  /* the stream it ran on: "compute" (blocking forms), "all_gather", "reduce_scatter" */
    double issue_us;
    double start_us;
    double dur_us;
    const char *group;       /* the process group it ran in: "world", "shard", "replicate" (NULL: "world") */
    int group_size;          /* its ranks (0: the world size) */
    const char *group_ranks; /* their world ranks, "0,2" (NULL: every rank) */
    const char *dtype;   /* "float32", "bfloat16" (NULL: written as float32) */
} trace_collective_info;
void trace_collective(trace_sink *sink, const trace_collective_info *info);

/* A tracked allocation or free (core/memory/mem.h). live_bytes, category_live_bytes and reserved_bytes are the totals
 * after the event. `address`/`size` are the allocator's block (size rounded), `segment` its segment's address. */
typedef struct trace_memory_info {
    uint64_t id;
    uint64_t bytes;
    const char *category;
    const char *dtype;   /* its elements: "float32", "bfloat16", "int32", ... (NULL: not written) */
    const char *owner;
    uint64_t live_bytes;
    uint64_t category_live_bytes;
    uint64_t address;
    uint64_t size;
    uint64_t segment;
    int stream;
    uint64_t reserved_bytes;
    const char *device;  /* the pool: "device" or "host" (core/memory/mem.h); NULL is written as "device" */
} trace_memory_info;
void trace_alloc(trace_sink *sink, const trace_memory_info *info);
void trace_free(trace_sink *sink, const trace_memory_info *info);

/* A segment the caching allocator took from (segment_alloc) or gave back to (segment_free) its backend.
 * owner/category: the request that made the allocator ask for it, or that freed it (category NULL for
 * empty_cache and shutdown). reserved_bytes: the total after the event. */
typedef struct trace_segment_info {
    uint64_t id;
    uint64_t address;
    uint64_t bytes;
    const char *pool;      /* "small" or "large" */
    int stream;
    const char *owner;
    const char *category;
    uint64_t reserved_bytes;
    const char *device;    /* the pool, as trace_memory_info's */
} trace_segment_info;
void trace_segment_alloc(trace_sink *sink, const trace_segment_info *info);
void trace_segment_free(trace_sink *sink, const trace_segment_info *info);

/* The allocator's settings, once, before any memory event (PyTorch's snapshot calls them allocator_settings). */
typedef struct trace_allocator_info {
    const char *mode;      /* "caching" or "malloc" */
    const char *backend;   /* "host" */
    uint64_t round;        /* block rounding */
    uint64_t small_size, small_segment, large_segment, min_large_alloc, round_large;
    uint64_t max_split_size; /* 0: no limit */
    const char *device;    /* the pool these settings are for ("device", "host"); NULL: "device" */
    uint64_t budget;       /* the pool's budget in bytes (DEVICE_MEMORY_MB); 0: none */
} trace_allocator_info;
void trace_allocator(trace_sink *sink, const trace_allocator_info *info);

/* The host (the compute stream) blocked from start_us for dur_us until work on another stream completed: exposed
 * communication. `on` names the stream waited for ("all_gather", "reduce_scatter"; "compute" for the rate
 * limiter's free events); op/unit/seq the collective (seq -1 and op NULL when the wait is not for one); hook the
 * FSDP hook that waited (or NULL). */
typedef struct trace_wait_info {
    const char *on;
    const char *op;
    const char *unit;
    int64_t seq;
    const char *hook;
    double start_us;
    double dur_us;
} trace_wait_info;
void trace_wait(trace_sink *sink, const trace_wait_info *info);

/* A copy between the pools (CPU offload, core/runtime/offload.h): "h2d" host to device (a parameter shard before its
 * all-gather), "d2h" device to host (a gradient shard after its reduce-scatter). A span on `stream` from start_us. */
typedef struct trace_copy_info {
    const char *direction; /* "h2d" or "d2h" */
    const char *unit;
    const char *owner;     /* what was copied ("layers.0._local_shard") */
    uint64_t bytes;
    const char *stream;    /* the stream that ran it; "compute" when the host did */
    double start_us;
    double dur_us;
} trace_copy_info;
void trace_copy(trace_sink *sink, const trace_copy_info *info);

/* The FSDP runtime's options, once per runtime (torch's names): what a view prints as the run's mode. */
typedef struct trace_fsdp_info {
    const char *model;             /* "Qwen2ForCausalLM" */
    const char *sharding_strategy; /* FULL_SHARD, SHARD_GRAD_OP, NO_SHARD */
    const char *backward_prefetch; /* "BACKWARD_PRE", "BACKWARD_POST" or NULL (None) */
    int forward_prefetch;
    int limit_all_gathers;
    int activation_checkpointing;
    int no_sync;
    int accumulation_steps;
    int unit_count;
    int offload_params;            /* CPUOffload(offload_params=True) */
    /* MixedPrecision: dtype names, or param_dtype NULL when it is off (written as "mixed_precision": null) */
    const char *param_dtype, *reduce_dtype, *buffer_dtype;
    int keep_low_precision_grads;
} trace_fsdp_info;
void trace_fsdp(trace_sink *sink, const trace_fsdp_info *info);

/* A finished compute span (a layer's forward, an optimizer step...) that started at start_us. */
void trace_compute(trace_sink *sink, const char *name, const char *unit, const char *phase, double start_us,
                   double dur_us);

/* The end of a (micro-)step. micro is -1 for a whole optimizer step. peak_bytes / peak_reserved_bytes: the
 * allocated and reserved peaks of the step. */
void trace_step(trace_sink *sink, int step, int micro, double loss, uint64_t peak_bytes, uint64_t peak_reserved_bytes,
                double time_seconds);

/* Free text: a label a learner will see on the timeline ("lab 02: before unshard"). */
void trace_mark(trace_sink *sink, const char *text);

#endif
