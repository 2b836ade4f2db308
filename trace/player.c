/* player.c — see player.h. This file gathers each rank's events (line, ts, verbatim JSON) and writes the page around
 * them; the page's style and script are in player_assets.c. */
#include "player.h"
#include "view_file.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* player_assets.c */
extern const char player_style[];
extern const char player_script[];

/* Every line of a rank file, texts[line - 1] without its newline; what run_load read, read again for its text. */
typedef struct rank_lines {
    char **texts;
    size_t count;
} rank_lines;

static void rank_lines_free(rank_lines *lines) {
    for (size_t index = 0; index < lines->count; index++) free(lines->texts[index]);
    free(lines->texts);
    lines->texts = NULL;
    lines->count = 0;
}

/* Appends one line of any length to lines (fgets in pieces). Returns 1 when a line was read, 0 at the end, -1 out
 * of memory. */
static int line_read(FILE *file, rank_lines *lines, size_t *capacity) {
    size_t length = 0, size = 256;
    char *text = malloc(size);
    if (text == NULL) return -1;
    text[0] = '\0';
    while (fgets(text + length, (int)(size - length), file) != NULL) {
        length += strlen(text + length);
        if (length > 0 && text[length - 1] == '\n') break;
        if (length + 1 == size) {
            char *bigger = realloc(text, size * 2);
            if (bigger == NULL) {
                free(text);
                return -1;
            }
            text = bigger;
            size *= 2;
        }
    }
    if (length == 0) {
        free(text);
        return 0;
    }
    if (text[length - 1] == '\n') text[--length] = '\0';
    if (lines->count == *capacity) {
        size_t grown = *capacity == 0 ? 1024 : *capacity * 2;
        char **texts = realloc(lines->texts, grown * sizeof *texts);
        if (texts == NULL) {
            free(text);
            return -1;
        }
        lines->texts = texts;
        *capacity = grown;
    }
    lines->texts[lines->count++] = text;
    return 1;
}

static int rank_lines_read(rank_lines *lines, const char *path, char *error, size_t error_size) {
    lines->texts = NULL;
    lines->count = 0;
    FILE *file = fopen(path, "r");
    if (file == NULL) {
        snprintf(error, error_size, "cannot read %s: %s", path, strerror(errno));
        return -1;
    }
    size_t capacity = 0;
    int status;
    while ((status = line_read(file, lines, &capacity)) == 1) {}
    int failed = ferror(file);
    fclose(file);
    if (status == 0 && !failed) return 0;
    snprintf(error, error_size, status < 0 ? "out of memory reading %s" : "cannot read %s", path);
    rank_lines_free(lines);
    return -1;
}

/* {rank, file, lines, ts, texts} of one rank: every event run_load kept, in file order. */
static cJSON *rank_data(const run_rank *rank, const rank_lines *lines, char *error, size_t error_size) {
    char file[32];
    snprintf(file, sizeof file, "rank%d.jsonl", rank->rank);
    cJSON *data = cJSON_CreateObject();
    cJSON *line_numbers = cJSON_AddArrayToObject(data, "lines");
    cJSON *times = cJSON_AddArrayToObject(data, "ts");
    cJSON *texts = cJSON_AddArrayToObject(data, "texts");
    int status = data != NULL && line_numbers != NULL && times != NULL && texts != NULL &&
                         cJSON_AddNumberToObject(data, "rank", rank->rank) != NULL &&
                         cJSON_AddStringToObject(data, "file", file) != NULL ? 0 : -1;
    for (size_t index = 0; status == 0 && index < rank->event_count; index++) {
        const run_event *event = &rank->events[index];
        if (event->line == 0 || event->line > lines->count) {
            snprintf(error, error_size, "%s changed while it was read: line %zu is gone", rank->path, event->line);
            cJSON_Delete(data);
            return NULL;
        }
        cJSON *line = cJSON_CreateNumber((double)event->line), *ts = cJSON_CreateNumber(event->ts);
        cJSON *text = cJSON_CreateString(lines->texts[event->line - 1]);
        if (!cJSON_AddItemToArray(line_numbers, line)) cJSON_Delete(line), status = -1;
        if (!cJSON_AddItemToArray(times, ts)) cJSON_Delete(ts), status = -1;
        if (!cJSON_AddItemToArray(texts, text)) cJSON_Delete(text), status = -1;
    }
    if (status == 0) return data;
    snprintf(error, error_size, "out of memory building the events of %s", rank->path);
    cJSON_Delete(data);
    return NULL;
}

static cJSON *page_data(const trace_run *run, char *error, size_t error_size) {
    cJSON *data = cJSON_CreateObject();
    cJSON *ranks = cJSON_AddArrayToObject(data, "ranks");
    if (ranks == NULL || cJSON_AddStringToObject(data, "rundir", run->rundir) == NULL ||
        cJSON_AddNumberToObject(data, "world", run->world) == NULL ||
        !cJSON_AddItemToObject(data, "categories", cJSON_CreateStringArray(run_categories, RUN_CATEGORY_COUNT)) ||
        view_palette_add(data) != 0) {
        snprintf(error, error_size, "out of memory building the data of %s", run->rundir);
        cJSON_Delete(data);
        return NULL;
    }
    for (int rank = 0; rank < run->world; rank++) {
        rank_lines lines;
        cJSON *each = NULL;
        if (rank_lines_read(&lines, run->ranks[rank].path, error, error_size) == 0) {
            each = rank_data(&run->ranks[rank], &lines, error, error_size);
            rank_lines_free(&lines);
        }
        if (each == NULL || !cJSON_AddItemToArray(ranks, each)) {
            if (each != NULL) snprintf(error, error_size, "out of memory building the data of %s", run->rundir);
            cJSON_Delete(each);
            cJSON_Delete(data);
            return NULL;
        }
    }
    return data;
}

static void page_put(FILE *file, const trace_run *run, const char *json) {
    view_html_head_put(file, "fsdplab player: ", run->rundir, player_style);
    fputs("<body>\n<header>\n<h1>fsdplab player</h1>\n<p>", file);
    view_html_text_put(file, run->rundir);
    fprintf(file, ", %d rank%s: every event of rank&lt;R&gt;.jsonl, merged by time. Written by "
                  "<code>trace/fsdptrace player</code>.</p>\n", run->world, run->world == 1 ? "" : "s");
    fputs("<div id=\"controls\"></div>\n<div id=\"legend\"></div>\n</header>\n<main>\n<div id=\"comm\"></div>\n"
          "<div id=\"ranks\">"
          "<noscript>This page draws with JavaScript; please enable it.</noscript></div>\n"
          "<section id=\"event\"><p id=\"caption\"></p><p id=\"where\"></p><pre id=\"json\"></pre></section>\n"
          "</main>\n", file);
    fputs("<section id=\"about\"><h3>Reading the player</h3><ul>\n"
          "<li>Keys: &rarr; &larr; one event; Shift+&rarr; &larr; one hook (a <code>state</code> event of an FSDP "
          "hook); <kbd>c</kbd> the next collective; space plays and pauses; <kbd>p</kbd> the memory peak.</li>\n"
          "<li>A unit's box is filled where this rank holds its parameters: its 1/N slice while SHARDED, the whole "
          "box while UNSHARDED (gathered). In it: <em>training</em>, the unit's HandleTrainingState, and "
          "<em>shard</em>, its ShardState; the left edge has the training state's colour; TrainingState too on "
          "hover.</li>\n"
          "<li>A band across the ranks is a collective in flight, from the host issuing it to its completion; a rank "
          "whose part is pale has not issued it yet or has finished it.</li>\n"
          "<li>Memory bars: live bytes per category; the tick is the peak so far on that rank.</li>\n"
          "<li>Events are ordered by their <code>ts</code>; a compute span, a wait or a collective sits at its start. "
          "The ranks' clocks agree to within the start barrier's skew.</li>\n"
          "</ul></section>\n", file);
    fputs("<script type=\"application/json\" id=\"run-data\">", file);
    view_script_json_put(file, json);
    fputs("</script>\n<script>\n", file);
    fputs(player_script, file);
    fputs("</script>\n</body>\n</html>\n", file);
}

int player_write_run(const trace_run *run, const char *out_path, char *error, size_t error_size) {
    cJSON *data = page_data(run, error, error_size);
    return data != NULL ? view_html_write(out_path, run, data, page_put, error, error_size) : -1;
}
