/* chrome.h — turns a run directory's rank<R>.jsonl files into one Chrome Trace Event Format file.
 *
 * The mapping (pids, tids, event phases, the memory counter, the flows joining a collective across ranks) is the
 * section "Chrome export" of trace/EVENTS.md; tests/validate_trace.py checks every rule of it on a real run, and
 * tests/check_trace_viewers.py opens it in Perfetto UI and in Catapult and counts the arrows each one draws.
 * Open the result in https://ui.perfetto.dev (or `go tool trace`'s Catapult viewer).
 */
#ifndef FSDPLAB_CHROME_H
#define FSDPLAB_CHROME_H

#include <stddef.h>

#include "run.h"

#define CHROME_FILE_NAME "trace.json"  /* in the run directory */

/* Writes the Chrome trace of an already loaded run to out_path (through <out_path>.tmp, renamed at the end, so the
 * file appears only when the export succeeds). Returns 0, or -1 with a message in `error`. */
int chrome_write_run(const trace_run *run, const char *out_path, char *error, size_t error_size);

/* Loads rundir with run_load (rank0.jsonl's `meta` line gives the world size, then rank1 .. rank<world-1>) and
 * writes its Chrome trace to out_path (NULL: <rundir>/trace.json). A final line cut short by a crash is skipped with
 * a warning on stderr; any other bad line is an error. Returns 0, or -1 with a message naming the file, the line and
 * the values in `error`. */
int chrome_export(const char *rundir, const char *out_path, char *error, size_t error_size);

#endif
