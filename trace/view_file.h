/* view_file.h — writing one view of a run (memory.html, the snapshot, summary.txt) so that it appears whole or not
 * at all: everything goes to <path>.tmp, renamed to <path> only when every write succeeded. A viewer never opens
 * half a file left by a failed export.
 */
#ifndef FSDPLAB_VIEW_FILE_H
#define FSDPLAB_VIEW_FILE_H

#include <stddef.h>
#include <stdio.h>

enum { VIEW_PATH_CAPACITY = 4096 };

typedef struct view_file {
    FILE *file;
    char path[VIEW_PATH_CAPACITY];
    char temporary_path[VIEW_PATH_CAPACITY + 8];
} view_file;

/* The output path: out_path when given, else <rundir>/<default_name>. Returns 0, or -1 when it does not fit. */
int view_path(char *path, size_t path_size, const char *rundir, const char *out_path, const char *default_name,
              char *error, size_t error_size);

/* Opens <path>.tmp for writing. Returns 0, or -1 with a message naming the file. */
int view_file_open(view_file *view, const char *path, char *error, size_t error_size);

/* status 0: checks every write, closes and renames to the final path; otherwise (or when that fails) removes the
 * temporary file. Returns 0 when the file is in place, else -1 (keeping the caller's message when status != 0). */
int view_file_close(view_file *view, int status, char *error, size_t error_size);

/* For the HTML views (memory.html, player.html): text with <, >, & and " escaped, for an element or an attribute;
 * JSON inside a <script> element, with every "</" written "<\/" so the data cannot end the element early. */
void view_html_text_put(FILE *file, const char *text);
void view_script_json_put(FILE *file, const char *json);
/* An HTML view's <!DOCTYPE> ... </head>: the title is title_prefix and the run directory, the style inline. */
void view_html_head_put(FILE *file, const char *title_prefix, const char *rundir, const char *style);

/* Writes an HTML view whose data is JSON: prints `data` compactly (and deletes it; NULL means building it ran out of
 * memory) and has `page_put` write the page around that text into out_path, through view_file_open/close. */
struct cJSON;
struct trace_run;
/* Adds "palette": {categories: {name: color}, states: {name: color}} to an HTML view's data: trace/palette.h's
 * tables, the one definition of the views' colours. Returns 0, or -1 when out of memory or when palette.h's
 * categories are not run_categories in order. */
int view_palette_add(struct cJSON *data);
typedef void (*view_page_writer)(FILE *file, const struct trace_run *run, const char *json);
int view_html_write(const char *out_path, const struct trace_run *run, struct cJSON *data, view_page_writer page_put,
                    char *error, size_t error_size);

#endif
