/* fsdptrace — the trace tool: turns a run directory's rank<R>.jsonl files into views of the run.
 *
 *   fsdptrace chrome   <rundir> [-o out.json]     Chrome / Perfetto trace (default <rundir>/trace.json)
 *   fsdptrace merge    <rundir> [-o out.json]     the same (the name docs/architecture.md's picture uses)
 *   fsdptrace memory   <rundir> [-o out.html]     memory timeline page (default <rundir>/memory.html)
 *   fsdptrace player   <rundir> [-o out.html]     step-by-step player page (default <rundir>/player.html)
 *   fsdptrace snapshot <rundir> [-o out.pickle]   PyTorch memory snapshot (default <rundir>/memory_snapshot.pickle)
 *   fsdptrace summary  <rundir> [-o out.txt]      prints the summary tables and writes them (<rundir>/summary.txt)
 *   fsdptrace all      <rundir>                   all of the above, under their default names
 *   fsdptrace overlap  <rundir> [-o out.json] [--windows PREFIX]
 *                      per rank compute / comm / overlap / exposed time and all-gathers in flight as JSON (summary.h),
 *                      on stdout unless -o, for lab checks; --windows "lab 06 mode " adds them per window between
 *                      marks that start with the prefix
 *
 * Each subcommand is one row of the table in main's file; a new view is a new row.
 * Exit status: 0 done, 1 the run directory could not be turned into the view, 2 bad arguments.
 */
#include "chrome.h"
#include "export.h"
#include "memory_page.h"
#include "player.h"
#include "snapshot.h"
#include "run.h"
#include "summary.h"

#include <stdio.h>
#include <string.h>

enum { EXIT_DONE = 0, EXIT_FAILED = 1, EXIT_USAGE = 2 };

/* The summary's writer for the command line: the tables are the point, so they go to stdout too. */
static int summary_echo_write_run(const trace_run *run, const char *out_path, char *error, size_t error_size) {
    if (summary_print(run, stdout, error, error_size) != 0) return -1;
    printf("\n");
    return summary_write_run(run, out_path, error, error_size);
}

/* A view subcommand loads the run and hands it to `writer`; `all` (writer NULL) writes every view at once. */
typedef struct subcommand {
    const char *name;
    const char *arguments;
    const char *summary;
    trace_view_writer writer;
    const char *default_name;  /* the view's file in the run directory, when -o is not given */
} subcommand;

static const subcommand subcommands[] = {
    {"chrome", "<rundir> [-o out.json]", "Chrome trace of all ranks (default <rundir>/" CHROME_FILE_NAME ")",
     chrome_write_run, CHROME_FILE_NAME},
    {"merge", "<rundir> [-o out.json]", "same as chrome", chrome_write_run, CHROME_FILE_NAME},
    {"memory", "<rundir> [-o out.html]", "memory timeline page (default <rundir>/" MEMORY_PAGE_FILE_NAME ")",
     memory_page_write_run, MEMORY_PAGE_FILE_NAME},
    {"player", "<rundir> [-o out.html]", "step-by-step player page (default <rundir>/" PLAYER_FILE_NAME ")",
     player_write_run, PLAYER_FILE_NAME},
    {"snapshot", "<rundir> [-o out.pickle]",
     "PyTorch memory snapshot for pytorch.org/memory_viz (default <rundir>/" SNAPSHOT_FILE_NAME ")",
     snapshot_write_run, SNAPSHOT_FILE_NAME},
    {"summary", "<rundir> [-o out.txt]",
     "prints and writes the summary tables (default <rundir>/" SUMMARY_FILE_NAME ")",
     summary_echo_write_run, SUMMARY_FILE_NAME},
    {"all", "<rundir>", "all of the above, under their default names in <rundir>", NULL, NULL},
    {"overlap", "<rundir> [-o out.json] [--windows PREFIX]",
     "time figures per rank (and per window between marks PREFIX...) as JSON, on stdout unless -o",
     summary_overlap_write_run, NULL},
};
enum { SUBCOMMAND_COUNT = sizeof subcommands / sizeof subcommands[0] };

static void usage_print(FILE *stream) {
    fprintf(stream, "usage: fsdptrace <subcommand> [arguments]\n\nsubcommands:\n");
    for (int index = 0; index < SUBCOMMAND_COUNT; index++)
        fprintf(stream, "  %-8s %-25s %s\n", subcommands[index].name, subcommands[index].arguments,
                subcommands[index].summary);
}

static int usage_fail(const char *problem, const char *detail) {
    fprintf(stderr, "fsdptrace: %s%s\n\n", problem, detail);
    usage_print(stderr);
    return EXIT_USAGE;
}

/* Accepts the run directory and -o in either order, so `fsdptrace chrome -o x.json runs/a` works too. out_path
 * NULL refuses -o (for `all`). Returns EXIT_DONE, or EXIT_USAGE after printing why. */
static int arguments_parse(int argc, char **argv, const char **rundir, const char **out_path) {
    *rundir = NULL;
    if (out_path != NULL) *out_path = NULL;
    for (int index = 1; index < argc; index++) {
        if (strcmp(argv[index], "-o") == 0 && out_path != NULL) {
            if (index + 1 >= argc) return usage_fail("-o needs a file name", "");
            *out_path = argv[++index];
        } else if (argv[index][0] == '-') {
            return usage_fail("unknown option ", argv[index]);
        } else if (*rundir == NULL) {
            *rundir = argv[index];
        } else {
            return usage_fail("more than one run directory: ", argv[index]);
        }
    }
    if (*rundir == NULL) return usage_fail(argv[0], " needs a run directory");
    return EXIT_DONE;
}

static int view_failed(const char *subcommand_name, const char *error) {
    fprintf(stderr, "fsdptrace %s: %s\n", subcommand_name, error);
    return EXIT_FAILED;
}

/* overlap: JSON on stdout, or into -o's file; --windows PREFIX adds the figures of each window between marks. */
static int overlap_run(int argc, char **argv) {
    const char *rundir, *out_path, *prefix = NULL;
    char error[1024], *kept[8];
    int kept_count = 0;
    for (int index = 0; index < argc; index++) {  /* --windows PREFIX out; the rest as every view's arguments */
        if (index > 0 && strcmp(argv[index], "--windows") == 0) {
            if (index + 1 >= argc) return usage_fail("--windows needs a mark prefix, e.g. ", "\"lab 06 mode \"");
            prefix = argv[++index];
        } else if (kept_count < 8) {
            kept[kept_count++] = argv[index];
        } else {
            return usage_fail("too many arguments for ", argv[0]);
        }
    }
    if (arguments_parse(kept_count, kept, &rundir, &out_path) != EXIT_DONE) return EXIT_USAGE;
    FILE *stream = out_path != NULL ? fopen(out_path, "w") : stdout;
    if (stream == NULL) return view_failed(argv[0], out_path);
    trace_run run;
    int status = run_load(&run, rundir, error, sizeof error);
    if (status == 0) status = summary_overlap_print_windows(&run, prefix, stream, error, sizeof error);
    run_free(&run);
    if (stream != stdout && fclose(stream) != 0 && status == 0) {
        snprintf(error, sizeof error, "cannot write %s", out_path);
        status = -1;
    }
    if (status == 0 && out_path != NULL) printf("%s\n", out_path);
    return status == 0 ? EXIT_DONE : view_failed(argv[0], error);
}

/* One view: prints the path it went to (-o's, or its default name in the run directory). */
static int view_run(const subcommand *command, int argc, char **argv) {
    const char *rundir, *out_path;
    char error[1024];
    if (arguments_parse(argc, argv, &rundir, &out_path) != EXIT_DONE) return EXIT_USAGE;
    if (trace_export_view(rundir, out_path, command->default_name, command->writer, error, sizeof error) != 0)
        return view_failed(argv[0], error);
    if (out_path != NULL) printf("%s\n", out_path);
    else printf("%s/%s\n", rundir, command->default_name);
    return EXIT_DONE;
}

static int all_run(int argc, char **argv) {
    const char *rundir;
    char error[1024];
    if (arguments_parse(argc, argv, &rundir, NULL) != EXIT_DONE) return EXIT_USAGE;
    if (trace_export_all(rundir, error, sizeof error) != 0) return view_failed(argv[0], error);
    trace_export_describe(stdout, rundir);
    return EXIT_DONE;
}

int main(int argc, char **argv) {
    if (argc < 2) return usage_fail("missing subcommand", "");
    if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "help") == 0) {
        usage_print(stdout);
        return EXIT_DONE;
    }
    for (int index = 0; index < SUBCOMMAND_COUNT; index++)
        if (strcmp(argv[1], subcommands[index].name) == 0)
            return subcommands[index].default_name == NULL && subcommands[index].writer != NULL
                       ? overlap_run(argc - 1, argv + 1)
                   : subcommands[index].writer != NULL ? view_run(&subcommands[index], argc - 1, argv + 1)
                                                       : all_run(argc - 1, argv + 1);
    return usage_fail("unknown subcommand ", argv[1]);
}
