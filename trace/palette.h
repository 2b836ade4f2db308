/* palette.h — the one colour of each memory category and of each FSDP state, defined here and nowhere else.
 *
 * memory.html and player.html get these tables as the "palette" of their page data (view_palette_add in
 * view_file.h) and colour their bands, bars, boxes, lanes and the legend at the top of each page from it;
 * notebooks/fsdplab_events.py reads this file (the {"name", "#rrggbb"} rows) for the notebooks' figures. The
 * categories are in trace/EVENTS.md's order, run_categories' (trace/run.h), which is also the order of the series of
 * trace.json's memory counter; view_palette_add refuses a table out of that order.
 *
 * The state colours are dark or grey, none of them a category's: a unit lane's colour never reads as memory.
 */
#ifndef FSDPLAB_PALETTE_H
#define FSDPLAB_PALETTE_H

#include "run.h"

typedef struct palette_color {
    const char *name;
    const char *color;
} palette_color;

/* Memory categories, in run_categories' order. */
static const palette_color palette_categories[RUN_CATEGORY_COUNT] = {
    {"param_shard", "#4e79a7"},
    {"param_unsharded", "#a0cbe8"},
    {"grad_unsharded", "#ffbe7d"},
    {"grad_shard", "#f28e2b"},
    {"optim_state", "#59a14f"},
    {"activation", "#e15759"},
    {"checkpoint_input", "#ff9d9a"},
    {"workspace", "#b07aa1"},
    {"comm_buffer", "#edc948"},
    {"data", "#9c755f"},
    {"kv_cache", "#76b7b2"},
    {"param_shard_low_precision", "#d4a6c8"},
};

/* FSDP states: ShardState (SHARDED, UNSHARDED, and FSDP2's SHARDED_POST_FORWARD under reshard_after_forward=N: a
 * shade between the two, part of the parameters still held) and HandleTrainingState (IDLE, FORWARD, BACKWARD_PRE,
 * BACKWARD_POST). */
enum { PALETTE_STATE_COUNT = 7 };
static const palette_color palette_states[PALETTE_STATE_COUNT] = {
    {"SHARDED", "#cfd8e2"},
    {"SHARDED_POST_FORWARD", "#b3c1d0"},
    {"UNSHARDED", "#9aa6b2"},
    {"IDLE", "#f4f4f4"},
    {"FORWARD", "#1f3b73"},
    {"BACKWARD_PRE", "#7b3294"},
    {"BACKWARD_POST", "#00707a"},
};

#endif
