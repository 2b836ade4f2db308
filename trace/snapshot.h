/* snapshot.h — a run's memory as a PyTorch memory snapshot (`torch.cuda.memory._snapshot()`, pickled), so the
 * learner can drop it on https://pytorch.org/memory_viz and see the run in PyTorch's own viewer.
 *
 * Each rank is one device. Everything comes from the real allocator (core/memory/allocator.h) through its events,
 * replayed by trace/segments.h: `device_traces[r]` is rank r's `segment_alloc`, `alloc`, `free_requested` +
 * `free_completed` and `segment_free` at the blocks' and segments' real addresses, in file order, up to the snapshot's
 * moment, then a `snapshot` entry; `segments` is the allocator's state at that moment: each segment with its live
 * blocks (`active_allocated`, size and requested size) and the free blocks the cache holds between them (`inactive`).
 * The moment is the end of the last optimizer step (as torch.cuda.memory._snapshot() called after the training loop),
 * or the allocated peak in a run without steps. `time_us` is the wall clock (the meta line's unix_time + ts), so the
 * viewer shows the run's date; `allocator_settings` repeats the `allocator` event in PyTorch's names where it has
 * them (max_split_size, expandable_segments, PYTORCH_CUDA_ALLOC_CONF) and fsdplab's otherwise.
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
