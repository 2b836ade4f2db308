/* fsdptrace — the trace tool: turns a run directory's rank<R>.jsonl files into views of the run.
 *
 *   fsdptrace chrome   <rundir> [-o out.json]     Chrome / Perfetto trace (default <rundir>/trace.json)
 *   fsdptrace merge    <rundir> [-o out.json]     the same (the name DESIGN.md's picture uses)
 *   fsdptrace memory   <rundir> [-o out.html]     memory timeline page (default <rundir>/memory.html)
 *   fsdptrace snapshot <rundir> [-o out.pickle]   PyTorch memory snapshot (default <rundir>/memory_snapshot.pickle)
 *   fsdptrace summary  <rundir> [-o out.txt]      prints the summary tables and writes them (<rundir>/summary.txt)
 *   fsdptrace all      <rundir>                   all of the above, under their default names
 *
 * Each subcommand is one row of the table in main's file; a new view is a new row.
 * Exit status: 0 done, 1 the run directory could not be turned into the view, 2 bad arguments.
 */
#include "chrome.h"
#include "export.h"
#include "memory_page.h"
#include "snapshot.h"
#include "summary.h"

#include <stdio.h>
#include <string.h>

enum { EXIT_DONE = 0, EXIT_FAILED = 1, EXIT_USAGE = 2 };

typedef struct subcommand {
    const char *name;
    const char *arguments;
    const char *summary;
    int (*run)(int argc, char **argv);  /* argv[0] is the subcommand's name */
} subcommand;

static int chrome_run(int argc, char **argv);
static int memory_run(int argc, char **argv);
static int snapshot_run(int argc, char **argv);
static int summary_run(int argc, char **argv);
static int all_run(int argc, char **argv);

static const subcommand subcommands[] = {
    {"chrome", "<rundir> [-o out.json]", "Chrome trace of all ranks (default <rundir>/trace.json)", chrome_run},
    {"merge", "<rundir> [-o out.json]", "same as chrome", chrome_run},
    {"memory", "<rundir> [-o out.html]", "memory timeline page (default <rundir>/" MEMORY_PAGE_FILE_NAME ")",
     memory_run},
    {"snapshot", "<rundir> [-o out.pickle]",
     "PyTorch memory snapshot for pytorch.org/memory_viz (default <rundir>/" SNAPSHOT_FILE_NAME ")", snapshot_run},
    {"summary", "<rundir> [-o out.txt]", "prints and writes the summary tables (default <rundir>/" SUMMARY_FILE_NAME ")",
     summary_run},
    {"all", "<rundir>", "all of the above, under their default names in <rundir>", all_run},
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

/* The path a view went to: -o's, or its default name in the run directory. */
static int view_done(const char *rundir, const char *out_path, const char *default_name) {
    if (out_path != NULL) printf("%s\n", out_path);
    else printf("%s/%s\n", rundir, default_name);
    return EXIT_DONE;
}

static int view_failed(const char *subcommand_name, const char *error) {
    fprintf(stderr, "fsdptrace %s: %s\n", subcommand_name, error);
    return EXIT_FAILED;
}

static int chrome_run(int argc, char **argv) {
    const char *rundir, *out_path;
    char error[1024];
    if (arguments_parse(argc, argv, &rundir, &out_path) != EXIT_DONE) return EXIT_USAGE;
    if (chrome_export(rundir, out_path, error, sizeof error) != 0) return view_failed(argv[0], error);
    return view_done(rundir, out_path, CHROME_FILE_NAME);
}

static int memory_run(int argc, char **argv) {
    const char *rundir, *out_path;
    char error[1024];
    if (arguments_parse(argc, argv, &rundir, &out_path) != EXIT_DONE) return EXIT_USAGE;
    if (memory_page_write(rundir, out_path, error, sizeof error) != 0) return view_failed(argv[0], error);
    return view_done(rundir, out_path, MEMORY_PAGE_FILE_NAME);
}

static int snapshot_run(int argc, char **argv) {
    const char *rundir, *out_path;
    char error[1024];
    if (arguments_parse(argc, argv, &rundir, &out_path) != EXIT_DONE) return EXIT_USAGE;
    if (snapshot_write(rundir, out_path, error, sizeof error) != 0) return view_failed(argv[0], error);
    return view_done(rundir, out_path, SNAPSHOT_FILE_NAME);
}

/* The tables go to stdout (they are the point), then the file's path on its own last line. */
static int summary_run(int argc, char **argv) {
    const char *rundir, *out_path;
    char error[1024];
    if (arguments_parse(argc, argv, &rundir, &out_path) != EXIT_DONE) return EXIT_USAGE;
    if (summary_write(rundir, out_path, 1, error, sizeof error) != 0) return view_failed(argv[0], error);
    printf("\n");
    return view_done(rundir, out_path, SUMMARY_FILE_NAME);
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
        if (strcmp(argv[1], subcommands[index].name) == 0) return subcommands[index].run(argc - 1, argv + 1);
    return usage_fail("unknown subcommand ", argv[1]);
}
