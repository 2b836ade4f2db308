/* export.c — see export.h. */
#include "export.h"
#include "chrome.h"
#include "memory_page.h"
#include "player.h"
#include "run.h"
#include "snapshot.h"
#include "summary.h"
#include "view_file.h"

#include <stdio.h>

/* Each view's file name in the run directory, and its writer. */
static const char *const view_names[] = {CHROME_FILE_NAME, MEMORY_PAGE_FILE_NAME, PLAYER_FILE_NAME,
                                         SNAPSHOT_FILE_NAME, SUMMARY_FILE_NAME};
static const trace_view_writer view_writers[] = {chrome_write_run, memory_page_write_run, player_write_run,
                                                 snapshot_write_run, summary_write_run};

int trace_export_all(const char *rundir, char *error, size_t error_size) {
    trace_run run;
    int status = run_load(&run, rundir, error, error_size);
    for (size_t view = 0; status == 0 && view < sizeof view_names / sizeof view_names[0]; view++) {
        char path[VIEW_PATH_CAPACITY];
        status = view_path(path, sizeof path, rundir, NULL, view_names[view], error, error_size);
        if (status == 0) status = view_writers[view](&run, path, error, error_size);
    }
    run_free(&run);
    return status;
}

int trace_export_view(const char *rundir, const char *out_path, const char *default_name, trace_view_writer writer,
                      char *error, size_t error_size) {
    char path[VIEW_PATH_CAPACITY];
    if (view_path(path, sizeof path, rundir, out_path, default_name, error, error_size) != 0) return -1;
    trace_run run;
    int status = run_load(&run, rundir, error, error_size);
    if (status == 0) status = writer(&run, path, error, error_size);
    run_free(&run);
    return status;
}

void trace_export_describe(FILE *stream, const char *rundir) {
    fprintf(stream, "events:   %s/rank*.jsonl\n", rundir);
    fprintf(stream, "trace:    %s/" CHROME_FILE_NAME "  (open in https://ui.perfetto.dev)\n",
            rundir);
    fprintf(stream, "memory:   %s/" MEMORY_PAGE_FILE_NAME "  (open in any browser; works offline)\n", rundir);
    fprintf(stream, "player:   %s/" PLAYER_FILE_NAME "  (step through the run event by event; any browser, offline)\n",
            rundir);
    fprintf(stream, "snapshot: %s/" SNAPSHOT_FILE_NAME "  (drop on https://pytorch.org/memory_viz)\n", rundir);
    fprintf(stream, "summary:  %s/" SUMMARY_FILE_NAME "  (peak memory, collectives, time, comm volume)\n", rundir);
}
