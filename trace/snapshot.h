/* snapshot.h — a run's memory as a PyTorch memory snapshot (`torch.cuda.memory._snapshot()`, pickled), so the
 * learner can drop it on https://pytorch.org/memory_viz and see the run in PyTorch's own viewer.
 *
 * Each rank is one device: `device_traces[r]` is rank r's allocations in file order, each `alloc` followed later by
 * `free_requested` and `free_completed` at the same address. fsdplab's allocator is malloc, which has no addresses
 * worth showing, so addresses come from a simulated caching allocator in the spirit of PyTorch's: sizes rounded up
 * to 512 bytes, blocks of at most 1 MiB in 2 MiB "small" segments, larger ones in 20 MiB "large" segments (or a
 * segment of their own, rounded to 2 MiB), first fit, segments kept to the end (each one's creation is a
 * `segment_alloc` entry). Addresses are therefore consistent with sizes: every block lies inside its segment and
 * no two live blocks overlap. `segments` is the allocator's state at the end of the run.
 *
 * Each entry's `frames` names where it came from: {filename "rank<R>.jsonl", line <its line>, name <owner>}, then
 * {filename "fsdplab", line 0, name <category>}; allocs carry `category` too, which the viewer colors by.
 */
#ifndef FSDPLAB_SNAPSHOT_H
#define FSDPLAB_SNAPSHOT_H

#include <stddef.h>

#include "run.h"

#define SNAPSHOT_FILE_NAME "memory_snapshot.pickle"  /* in the run directory */

/* Writes the snapshot of an already loaded run to out_path. Returns 0, or -1 with a message in `error`. */
int snapshot_write_run(const trace_run *run, const char *out_path, char *error, size_t error_size);

#endif
