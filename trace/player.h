/* player.h — player.html: a run replayed event by event, every rank side by side, in one self-contained page (vanilla
 * JavaScript, nothing fetched: it opens offline from file://).
 *
 * The page merges all ranks' events by `ts` (ties: rank, then line); the current moment is an index into that order,
 * and each rank's panel (side by side while each gets 330 px; more ranks wrap into rows) shows its state as of its last
 * event at or before it: every FSDP unit as a box (this rank's 1/N slice filled while SHARDED, the whole box while
 * UNSHARDED) reading "training <HandleTrainingState> · shard <ShardState>", the compute span running (or the last one),
 * the wait the host is blocked in, and live memory per category with the peak so far. Collectives in flight (from
 * `issue_ts` to `ts + dur`) are bands across the ranks. Under the picture: a caption made from the current event by
 * rules per event kind, and its JSON line verbatim with "rank R, line L of rankR.jsonl". Controls: → ← events, Shift+→
 * ← hooks, c next collective, space play/pause (speed selector), p the memory peak, a scrubber. Seeking restores the
 * state snapshot taken every 64 events (SNAPSHOT_EVERY in the script) and replays at most that many.
 *
 * It opens on the first hook's state event. Colours come from trace/palette.h (the data's "palette"), shown in a legend
 * at the top.
 *
 * The data is <script type="application/json" id="run-data">: {rundir, world, categories, palette, ranks: [{rank, file,
 * lines: [line of each event], ts: [its ts as trace/run.h reads it], texts: [the line's JSON verbatim]}]}; the page
 * parses each text for the other fields. For checks, window.player has seek(i), next(), prev(), nextHook(),
 * prevHook(), nextCollective(), peak(rank), play(), pause(), count(), index() and state() (the moment's event and,
 * per rank, its line, unit states, live bytes per category, live total and peak so far); <body data-ready="1"> once
 * drawn.
 */
#ifndef FSDPLAB_PLAYER_H
#define FSDPLAB_PLAYER_H

#include <stddef.h>

#include "run.h"

#define PLAYER_FILE_NAME "player.html"  /* in the run directory */

/* Writes the page of an already loaded run to out_path; the events' JSON text is read again from the rank files.
 * Returns 0, or -1 with a message naming the file in `error`. */
int player_write_run(const trace_run *run, const char *out_path, char *error, size_t error_size);

#endif
