/* memory_page.h — memory.html: a run's memory as PyTorch's "Active Memory Timeline" draws it, in one
 * self-contained page (inline SVG and a little vanilla JavaScript; nothing is fetched, so it opens offline from
 * file://).
 *
 * Per rank (a selector switches ranks): every tracked allocation is a band, colored by category, stacked in the
 * order allocations were made; a band keeps its offset until something below it is freed, then drops by that size.
 * x is the event index: the line of rank<R>.jsonl. Step and micro-batch ends and marks are vertical markers; below
 * the plot, one lane per FSDP unit shows when it is UNSHARDED and its HandleTrainingState. The peak is marked and
 * the legend gives its composition by category. Hovering shows the band's owner, category and bytes, and every
 * unit's state at that line (its latest `state` events at or before it). Dragging across the plot zooms in x.
 * Reserved bytes (the caching allocator's segments) are a dashed step line over the bands, with its peak; a table
 * under the plot splits reserved − allocated at the allocated peak into rounding and cached free blocks and lists
 * the segments holding it (section#fragmentation, table#segments).
 *
 * For checks, the page's <svg id="timeline"> carries data-rank, data-allocations (the rank's alloc events),
 * data-bands (path.band elements drawn), data-peak-bytes, data-peak-line, data-reserved-peak,
 * data-reserved-peak-line, data-reserved-steps (segment events) and data-render-ms; <body data-ready="1">
 * once drawn. The run's data sits in <script type="application/json" id="run-data">.
 */
#ifndef FSDPLAB_MEMORY_PAGE_H
#define FSDPLAB_MEMORY_PAGE_H

#include <stddef.h>

#include "run.h"

#define MEMORY_PAGE_FILE_NAME "memory.html"  /* in the run directory */

/* Writes the page of an already loaded run to out_path. Returns 0, or -1 with a message in `error`. */
int memory_page_write_run(const trace_run *run, const char *out_path, char *error, size_t error_size);

#endif
