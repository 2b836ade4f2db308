/* fsdptrace — the trace tool: turns a run directory's rank<R>.jsonl files into views of the run.
 *
 *   fsdptrace chrome <rundir> [-o out.json]   Chrome / Perfetto trace (default <rundir>/trace.json)
 *   fsdptrace merge  <rundir> [-o out.json]   the same (the name DESIGN.md's picture uses)
 *
 * Each subcommand is one row of the table in main's file; a new view (memory page, snapshot, summary) is a new row.
 * Exit status: 0 done, 1 the run directory could not be turned into the view, 2 bad arguments.
 */
#include "chrome.h"

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

static const subcommand subcommands[] = {
    {"chrome", "<rundir> [-o out.json]", "Chrome trace of all ranks (default <rundir>/trace.json)", chrome_run},
    {"merge", "<rundir> [-o out.json]", "same as chrome", chrome_run},
};
enum { SUBCOMMAND_COUNT = sizeof subcommands / sizeof subcommands[0] };

static void usage_print(FILE *stream) {
    fprintf(stream, "usage: fsdptrace <subcommand> [arguments]\n\nsubcommands:\n");
    for (int index = 0; index < SUBCOMMAND_COUNT; index++)
        fprintf(stream, "  %-7s %-24s %s\n", subcommands[index].name, subcommands[index].arguments,
                subcommands[index].summary);
}

static int usage_fail(const char *problem, const char *detail) {
    fprintf(stderr, "fsdptrace: %s%s\n\n", problem, detail);
    usage_print(stderr);
    return EXIT_USAGE;
}

/* Accepts the run directory and -o in either order, so `fsdptrace chrome -o x.json runs/a` works too. */
static int chrome_run(int argc, char **argv) {
    const char *rundir = NULL, *out_path = NULL;
    for (int index = 1; index < argc; index++) {
        if (strcmp(argv[index], "-o") == 0) {
            if (index + 1 >= argc) return usage_fail("-o needs a file name", "");
            out_path = argv[++index];
        } else if (argv[index][0] == '-') {
            return usage_fail("unknown option ", argv[index]);
        } else if (rundir == NULL) {
            rundir = argv[index];
        } else {
            return usage_fail("more than one run directory: ", argv[index]);
        }
    }
    if (rundir == NULL) return usage_fail(argv[0], " needs a run directory");
    char error[1024];
    if (chrome_export(rundir, out_path, error, sizeof error) != 0) {
        fprintf(stderr, "fsdptrace %s: %s\n", argv[0], error);
        return EXIT_FAILED;
    }
    if (out_path != NULL) printf("%s\n", out_path);
    else printf("%s/trace.json\n", rundir);
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
