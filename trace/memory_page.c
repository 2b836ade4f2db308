/* memory_page.c — see memory_page.h. This file gathers the run's data as JSON and writes the page around it; the
 * page's style and script are in memory_page_assets.c. */
#include "memory_page.h"
#include "export.h"
#include "segments.h"
#include "view_file.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

/* memory_page_assets.c */
extern const char memory_page_style[];
extern const char memory_page_script[];

/* ---- the data: compact rows of numbers, strings as indices into one table ---- */

/* A row of numbers, or NULL when out of memory. Every value is an integer below 2^53, so doubles hold it exactly. */
static cJSON *row(const double *values, int count) { return cJSON_CreateDoubleArray(values, count); }

static int row_add(cJSON *rows, const double *values, int count) {
    cJSON *item = row(values, count);
    return item != NULL && cJSON_AddItemToArray(rows, item) ? 0 : -1;
}

/* [alloc line, free line or 0, bytes, category, owner], in allocation order. */
static int allocations_add(cJSON *rows, const run_rank *rank) {
    for (size_t index = 0; index < rank->event_count; index++) {
        const run_event *event = &rank->events[index];
        if (event->kind != RUN_ALLOC) continue;
        double free_line = event->partner == RUN_NONE ? 0 : (double)rank->events[event->partner].line;
        double values[6] = {(double)event->line, free_line, (double)event->bytes, event->category, event->label,
                            event->dtype};
        if (row_add(rows, values, 6) != 0) return -1;
    }
    return 0;
}

/* States [line, unit, machine, to], steps [line, step, micro, loss], marks [line, text], in file order. */
static int markers_add(cJSON *states, cJSON *steps, cJSON *marks, const run_rank *rank) {
    for (size_t index = 0; index < rank->event_count; index++) {
        const run_event *event = &rank->events[index];
        double line = (double)event->line;
        int status = 0;
        if (event->kind == RUN_STATE)
            status = row_add(states, (double[]){line, event->unit, event->machine, event->to}, 4);
        if (event->kind == RUN_STEP)
            status = row_add(steps, (double[]){line, event->step, event->micro, event->loss}, 4);
        if (event->kind == RUN_MARK) status = row_add(marks, (double[]){line, event->label}, 2);
        if (status != 0) return -1;
    }
    return 0;
}

/* [line, reserved bytes after it] at each segment_alloc / segment_free: the reserved line over the bands. */
static int reserved_add(cJSON *rows, const run_rank *rank) {
    for (size_t index = 0; index < rank->event_count; index++) {
        const run_event *event = &rank->events[index];
        if (event->kind != RUN_SEGMENT_ALLOC && event->kind != RUN_SEGMENT_FREE) continue;
        if (row_add(rows, (double[]){(double)event->line, (double)event->reserved}, 2) != 0) return -1;
    }
    return 0;
}

/* {line, reserved, allocated, rounding, cached, segments: [[address, pool, bytes, blocks, block bytes]...]} at the
 * allocated peak (trace/segments.h), the segments with the most free bytes first; null when nothing was allocated.
 * Returns -1 when out of memory. */
static int fragmentation_add(cJSON *data, const run_rank *rank) {
    uint64_t live;
    size_t peak = segments_peak_index(rank, &live);
    if (peak == rank->event_count) return cJSON_AddNullToObject(data, "fragmentation") != NULL ? 0 : -1;
    segments_state state;
    segments_fragmentation at;
    char error[512];
    int status = segments_fragmentation_at(&state, rank, peak, live, &at, error, sizeof error);
    cJSON *fragmentation = status == 0 ? cJSON_AddObjectToObject(data, "fragmentation") : NULL;
    cJSON *segments = fragmentation != NULL ? cJSON_AddArrayToObject(fragmentation, "segments") : NULL;
    if (segments != NULL) {
        cJSON_AddNumberToObject(fragmentation, "line", (double)rank->events[peak].line);
        cJSON_AddNumberToObject(fragmentation, "reserved", (double)at.reserved);
        cJSON_AddNumberToObject(fragmentation, "allocated", (double)at.allocated);
        cJSON_AddNumberToObject(fragmentation, "rounding", (double)at.rounding);
        cJSON_AddNumberToObject(fragmentation, "cached", (double)at.cached);
        segments_sort_by_free(&state);
        for (size_t index = 0; status == 0 && index < state.count; index++) {
            const segments_segment *segment = &state.segments[index];
            double values[5] = {(double)segment->address, segment->pool, (double)segment->bytes,
                                (double)segment->block_count, (double)segment->allocated};
            status = row_add(segments, values, 5);
        }
    }
    segments_free(&state);
    return segments != NULL && status == 0 ? 0 : -1;
}

/* One pool's page data. `rank` holds the pool's memory events (the rank itself, or its host pool: run.h), `markers`
 * the rank whose states, steps and marks are drawn over it (the same file, so its lines place them). */
static cJSON *pool_data(const run_rank *rank, const run_rank *markers);

static cJSON *rank_data(const run_rank *rank) { return pool_data(rank, rank); }

static cJSON *pool_data(const run_rank *rank, const run_rank *markers) {
    char file[32];
    snprintf(file, sizeof file, "rank%d.jsonl", rank->rank);
    cJSON *data = cJSON_CreateObject();
    cJSON_AddNumberToObject(data, "rank", rank->rank);
    cJSON_AddStringToObject(data, "file", file);
    cJSON_AddNumberToObject(data, "lines", (double)rank->line_count);
    cJSON *allocations = cJSON_AddArrayToObject(data, "allocations");
    cJSON *states = cJSON_AddArrayToObject(data, "states");
    cJSON *steps = cJSON_AddArrayToObject(data, "steps");
    cJSON *marks = cJSON_AddArrayToObject(data, "marks");
    cJSON *reserved = cJSON_AddArrayToObject(data, "reserved");
    if (allocations == NULL || states == NULL || steps == NULL || marks == NULL || reserved == NULL ||
        allocations_add(allocations, rank) != 0 || markers_add(states, steps, marks, markers) != 0 ||
        reserved_add(reserved, rank) != 0 || fragmentation_add(data, rank) != 0) {
        cJSON_Delete(data);
        return NULL;
    }
    return data;
}

static cJSON *page_data(const trace_run *run) {
    cJSON *data = cJSON_CreateObject();
    cJSON_AddStringToObject(data, "rundir", run->rundir);
    cJSON_AddNumberToObject(data, "world", run->world);
    cJSON_AddItemToObject(data, "categories", cJSON_CreateStringArray(run_categories, RUN_CATEGORY_COUNT));
    /* cJSON_CreateStringArray refuses a NULL array, which is what a run without strings has. */
    cJSON_AddItemToObject(data, "strings", run->strings.count == 0 ? cJSON_CreateArray()
                          : cJSON_CreateStringArray((const char *const *)run->strings.texts, (int)run->strings.count));
    cJSON *ranks = cJSON_AddArrayToObject(data, "ranks");
    int complete = ranks != NULL && cJSON_GetObjectItem(data, "strings") != NULL && view_palette_add(data) == 0;
    for (int rank = 0; complete && rank < run->world; rank++) {
        cJSON *each = rank_data(&run->ranks[rank]);
        complete = each != NULL && cJSON_AddItemToArray(ranks, each);
    }
    /* CPU offload: each rank's host pool after the ranks (whose index is their rank), named by `pool`. */
    for (int rank = 0; complete && rank < run->world; rank++) {
        if (run->ranks[rank].host == NULL) continue;
        cJSON *each = pool_data(run->ranks[rank].host, &run->ranks[rank]);
        complete = each != NULL && cJSON_AddStringToObject(each, "pool", "host") != NULL &&
                   cJSON_AddItemToArray(ranks, each);
    }
    if (complete) return data;
    cJSON_Delete(data);
    return NULL;
}

/* ---- writing the page ---- */

static void body_put(FILE *file, const trace_run *run) {
    fputs("<body>\n<header>\n<h1>fsdplab memory timeline</h1>\n<p>", file);
    view_html_text_put(file, run->rundir);
    fprintf(file, ", %d rank%s. Written by <code>trace/fsdptrace memory</code> from the rank&lt;R&gt;.jsonl events."
                  "</p>\n", run->world, run->world == 1 ? "" : "s");
    fputs("<div class=\"controls\"><label>show <select id=\"rank-select\"></select></label>\n"
          "<button id=\"zoom-reset\" type=\"button\">reset zoom</button>\n"
          "<span class=\"hint\">hover a band for its owner, bytes and the FSDP state then; drag across the plot to "
          "zoom; double-click to reset</span></div>\n"
          "<p id=\"lines-key\"><svg width=\"26\" height=\"10\"><line class=\"step\" x1=\"13\" x2=\"13\" y1=\"0\" "
          "y2=\"10\"/></svg> a solid line ends an optimizer step, <svg width=\"26\" height=\"10\">"
          "<line class=\"micro\" x1=\"13\" x2=\"13\" y1=\"0\" y2=\"10\"/></svg> a dashed grey line ends a "
          "micro-batch; each label sits over the span it names (s2 mb1: step 2, micro-batch 1). "
          "<svg width=\"26\" height=\"10\"><line class=\"reserved\" "
          "x1=\"0\" x2=\"26\" y1=\"5\" y2=\"5\"/></svg> the dark dashed line across is reserved bytes (the allocator's "
          "segments).</p>\n<div id=\"legend\" class=\"legend-bar\"></div>\n</header>\n"
          "<main>\n<div id=\"chart\"><noscript>This page draws with JavaScript; please enable it.</noscript></div>\n"
          "<aside id=\"details\"></aside>\n</main>\n"
          "<section id=\"fragmentation\"></section>\n", file);
    fputs("<section id=\"about\"><h3>Reading the timeline</h3><ul>\n"
          "<li>Each band is one tracked allocation, as in PyTorch's <em>Active Memory Timeline</em> "
          "(pytorch.org/memory_viz): allocations stack in the order they were made; a band keeps its height until "
          "something below it is freed, then drops by that size. The top of the stack is the live tracked bytes.</li>\n"
          "<li>The dark dashed line is <em>reserved</em> bytes: the segments the caching allocator holds "
          "(core/memory/allocator.h). The gap between it and the top of the stack is memory kept in the cache for the "
          "next allocation, plus rounding; the table under the plot splits it at the allocated peak.</li>\n"
          "<li>x is the event index: the line number in rank&lt;R&gt;.jsonl, so any moment can be looked up in the "
          "events file. Solid lines end optimizer steps, dashed lines end micro-batches (s2 mb1: step 2, "
          "micro-batch 1).</li>\n"
          "<li>Below the plot, each FSDP unit's lane is grey while the unit is UNSHARDED (its full parameters "
          "gathered) and colored by its HandleTrainingState while not IDLE.</li>\n"
          "<li>The same run: <code>trace.json</code> (ui.perfetto.dev), "
          "<code>memory_snapshot.pickle</code> (drop on pytorch.org/memory_viz), <code>summary.txt</code>.</li>\n"
          "</ul></section>\n", file);
}

static void page_put(FILE *file, const trace_run *run, const char *json) {
    view_html_head_put(file, "fsdplab memory: ", run->rundir, memory_page_style);
    body_put(file, run);
    fputs("<script type=\"application/json\" id=\"run-data\">", file);
    view_script_json_put(file, json);
    fputs("</script>\n<script>\n", file);
    fputs(memory_page_script, file);
    fputs("</script>\n</body>\n</html>\n", file);
}

int memory_page_write_run(const trace_run *run, const char *out_path, char *error, size_t error_size) {
    return view_html_write(out_path, run, page_data(run), page_put, error, error_size);
}
