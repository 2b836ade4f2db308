/* export.h — every view of a run directory at once, as each lab writes them when it ends (on rank 0, after the
 * event files are closed) and as `fsdptrace all <rundir>` does by hand:
 *
 *   trace.json               Chrome / Perfetto timeline (chrome.h)
 *   memory.html              memory timeline page, opens offline in any browser (memory_page.h)
 *   player.html              the run replayed event by event, every rank side by side (player.h)
 *   memory_snapshot.pickle   PyTorch memory snapshot for pytorch.org/memory_viz (snapshot.h)
 *   summary.txt              peak memory, collectives, compute/comm/idle time, comm volume vs ZeRO-3 (summary.h)
 */
#ifndef FSDPLAB_EXPORT_H
#define FSDPLAB_EXPORT_H

#include <stddef.h>
#include <stdio.h>

#include "run.h"

/* Writes the five files into rundir, reading the events once (run_load) for all of them. Returns 0, or -1 at the
 * first failure with a message naming the file and the cause in `error`; files written before it stay. */
int trace_export_all(const char *rundir, char *error, size_t error_size);

/* How each view writes a loaded run to a file: chrome_write_run, memory_page_write_run, player_write_run,
 * snapshot_write_run, summary_write_run. */
typedef int (*trace_view_writer)(const trace_run *run, const char *out_path, char *error, size_t error_size);

/* Loads rundir and writes one view of it to out_path (NULL: <rundir>/<default_name>), as `fsdptrace <view>` does. */
int trace_export_view(const char *rundir, const char *out_path, const char *default_name, trace_view_writer writer,
                      char *error, size_t error_size);

/* Prints where the files are and how to open each, one line per file (what a lab prints at its end). */
void trace_export_describe(FILE *stream, const char *rundir);

#endif
