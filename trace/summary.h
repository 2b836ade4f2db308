/* summary.h — a run in a few tables per rank (summary.txt):
 *
 *   - peak memory: the moment live tracked bytes were highest (the first such line) and what they were, by category;
 *   - reserved memory: the caching allocator's settings, the reserved peak (segments held), and fragmentation at the
 *     allocated peak: reserved − allocated, split into rounding (block sizes − bytes asked) and free blocks cached in
 *     segments, with the segments that hold it, the emptiest first (trace/segments.h replays them);
 *   - collectives by op: count, buffer bytes, bytes this rank sent, time;
 *   - the FSDP runtime's options (the `fsdp` event), when the run has one;
 *   - time: compute, comm and idle over the span from the first compute or collective start to the last end; comm
 *     per stream (EVENTS.md version 3); comm/compute overlap as HTA (Holistic Trace Analysis) defines it: the length
 *     of the intersection of the union of comm intervals with the union of compute intervals, and its share of comm
 *     time; exposed comm, the time the host was blocked on communication: the union of its waits for a comm stream
 *     and of the collectives it ran itself (stream "compute", the blocking forms, all exposed); and the most
 *     all_gathers in flight at once, each from its issue (issue_ts) to its completion (ts + dur);
 *   - comm volume against ZeRO-3's: with P the padded parameter bytes of all FSDP units, FULL_SHARD moves 3 P per
 *     micro-batch (all-gather in forward, again in backward, reduce-scatter of grads), 1.5 times the 2 P of an
 *     all-reduce (DDP). Volume counts buffer bytes, an all_reduce twice (it is a reduce-scatter plus an all-gather).
 */
#ifndef FSDPLAB_SUMMARY_H
#define FSDPLAB_SUMMARY_H

#include <stddef.h>
#include <stdio.h>

#include "run.h"

#define SUMMARY_FILE_NAME "summary.txt"  /* in the run directory */

/* One rank's time figures, in microseconds (the summary's "time" section; `fsdptrace overlap` prints them as JSON
 * in milliseconds). Intervals that only touch do not overlap. */
typedef struct summary_time {
    double span;          /* first compute or collective start to the last end */
    double compute;       /* |union of compute spans| */
    double comm;          /* |union of collectives|, every stream */
    double overlap;       /* |union(comm) ∩ union(compute)| (HTA) */
    double idle;          /* span - |union(compute) ∪ union(comm)| */
    double exposed;       /* |union(waits for a comm stream) ∪ union(collectives on the compute stream)| */
    double waited;        /* |union(waits for a comm stream)| */
    double stream_comm[RUN_STREAM_COUNT];  /* |union of the collectives of each stream| */
    int max_all_gathers_in_flight;         /* most all_gathers between issue_ts and ts + dur at one moment */
    size_t spans;         /* compute and collective events seen; 0: every figure is 0 */
} summary_time;

/* The figures of the whole rank. Returns 0, or -1 when out of memory. */
int summary_time_find(const trace_run *run, const run_rank *rank, summary_time *time);
/* The figures of the rank's events [begin, end) in file order (rank->events indices): one window of a run, such as
 * one mode of lab 06 between two marks. A span counts in the window its line is in. */
int summary_time_between(const trace_run *run, const run_rank *rank, size_t begin, size_t end, summary_time *time);

/* `fsdptrace overlap`: every rank's summary_time as JSON, {"rundir", "world", "ranks": [{"rank", "fsdp" (the first
 * fsdp event's options, or null), "span_ms", "compute_ms", "comm_ms", "overlap_ms", "exposed_ms", "wait_ms",
 * "blocking_comm_ms", "idle_ms", "stream_comm_ms": {"compute", "all_gather", "reduce_scatter"},
 * "max_all_gathers_in_flight"}]}. Returns 0, or -1 with a message in `error`. */
int summary_overlap_print(const trace_run *run, FILE *stream, char *error, size_t error_size);
/* The same, and with window_prefix (not NULL) each rank also gets "windows": [{"name", ...the figures}], one per mark
 * whose text starts with window_prefix (its name the rest of the text), up to the next such mark; the mark
 * "<prefix>end" closes a window without opening one. (`fsdptrace overlap --windows "lab 06 mode "`.) */
int summary_overlap_print_windows(const trace_run *run, const char *window_prefix, FILE *stream, char *error,
                                  size_t error_size);
int summary_overlap_write_run(const trace_run *run, const char *out_path, char *error, size_t error_size);

/* Prints the summary of a loaded run. Returns 0, or -1 with a message in `error` (out of memory). */
int summary_print(const trace_run *run, FILE *stream, char *error, size_t error_size);

/* Writes the summary of a loaded run to out_path. */
int summary_write_run(const trace_run *run, const char *out_path, char *error, size_t error_size);

#endif
