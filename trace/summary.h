/* summary.h — a run in a few tables per rank (summary.txt):
 *
 *   - peak memory: the moment live tracked bytes were highest (the first such line) and what they were, by category;
 *   - reserved memory: the caching allocator's settings, the reserved peak (segments held), and fragmentation at the
 *     allocated peak: reserved − allocated, split into rounding (block sizes − bytes asked) and free blocks cached in
 *     segments, with the segments that hold it, the emptiest first (trace/segments.h replays them);
 *   - collectives by op: count, buffer bytes, bytes this rank sent, time;
 *   - time: compute, comm and idle over the span from the first compute or collective start to the last end, and
 *     comm/compute overlap as HTA (Holistic Trace Analysis) defines it: the length of the intersection of the union
 *     of comm intervals with the union of compute intervals, and its share of comm time;
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

/* Prints the summary of a loaded run. Returns 0, or -1 with a message in `error` (out of memory). */
int summary_print(const trace_run *run, FILE *stream, char *error, size_t error_size);

/* Writes the summary of a loaded run to out_path. */
int summary_write_run(const trace_run *run, const char *out_path, char *error, size_t error_size);

#endif
