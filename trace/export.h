/* export.h — every view of a run directory at once, as each lab writes them when it ends (on rank 0, after the
 * event files are closed) and as `fsdptrace all <rundir>` does by hand:
 *
 *   trace.json               Chrome / Perfetto timeline (chrome.h)
 *   memory.html              memory timeline page, opens offline in any browser (memory_page.h)
 *   memory_snapshot.pickle   PyTorch memory snapshot for pytorch.org/memory_viz (snapshot.h)
 *   summary.txt              peak memory, collectives, compute/comm/idle time, comm volume vs ZeRO-3 (summary.h)
 */
#ifndef FSDPLAB_EXPORT_H
#define FSDPLAB_EXPORT_H

#include <stddef.h>
#include <stdio.h>

/* Writes the four files into rundir, reading the events once for the last three. Returns 0, or -1 at the first
 * failure with a message naming the file and the cause in `error`; files written before it stay. */
int trace_export_all(const char *rundir, char *error, size_t error_size);

/* Prints where the files are and how to open each, one line per file (what a lab prints at its end). */
void trace_export_describe(FILE *stream, const char *rundir);

#endif
