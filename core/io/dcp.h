/* dcp.h — sharded training checkpoints, as torch.distributed.checkpoint (DCP) writes them: every rank saves its own
 * shard, nobody gathers the model, and a run resumes exactly where it stopped.
 *
 *   <root>/step_00000010/
 *       __0_0.distcp     rank 0's shard: for every unit its chunk of the FlatParameter and of AdamW's exp_avg and
 *       __1_0.distcp     exp_avg_sq (padding left out), as safetensors, so Python's safetensors opens it too; FSDP2
 *                        (per-parameter rows): its rows of each parameter, a range apiece, at their global offsets
 *       config.json      what the caller adds before the commit (the model's HF config)
 *       .metadata        written last, through .metadata.tmp + rename: the commit. Step, data position, world size,
 *                        strategy, dtype, the settings of the run, every unit's layout and optimizer step, and for
 *                        every file its size, checksum and which element range of each unit it holds
 *
 * A directory without .metadata was never committed (the run stopped while writing it) and is not a checkpoint.
 * Every file is written to <name>.tmp, flushed to disk (fsync) and renamed, so a full disk or a kill leaves no file
 * that looks whole and is not; the checksum (64-bit FNV-1a over 8-byte words, core/base/hash.h's hash_words) catches
 * the rest.
 *
 * Loading is by element ranges, so the world size may change between save and load (torch's resharding): rank r of
 * the new run takes, for each unit, the intersection of its new chunk with each file's range. The arithmetic does
 * not change — AdamW is element-wise — so the same world size resumes bit for bit, and another world size continues
 * within the rounding of the reductions, which now add gradients in another order.
 *
 * Random numbers need no state here: every draw is counter-based (rng.h), keyed by the seed and a position, so the
 * seed (in the settings) and the step are all a resume needs.
 */
#ifndef FSDPLAB_DCP_H
#define FSDPLAB_DCP_H

#include <stddef.h>
#include <stdint.h>

#include "core/runtime/context.h"
#include "core/fsdp/flat_param.h"
#include "core/fsdp/optim.h"

#define DCP_FORMAT "fsdplab distributed checkpoint"
#define DCP_VERSION 1
#define DCP_METADATA ".metadata"
#define DCP_MAX_SETTINGS 24
#define DCP_TEXT_MAX 256

/* A setting of the run, recorded so that a resume can say what it changed ("LR: 0.001 in the checkpoint, 0.002
 * now"). */
typedef struct dcp_setting {
    char name[32];
    char value[DCP_TEXT_MAX];
} dcp_setting;

/* Where the run is: what, together with the parameters and the optimizer state, makes a resume exact. */
typedef struct dcp_progress {
    int64_t step;              /* optimizer steps done */
    uint64_t data_windows;     /* global data windows consumed (data_loader: next_global_micro * world * micro) */
    char strategy[32];         /* FULL_SHARD, SHARD_GRAD_OP, NO_SHARD */
    int setting_count;
    dcp_setting settings[DCP_MAX_SETTINGS];
} dcp_progress;

/* One unit as recorded: enough to refuse another model's checkpoint. */
typedef struct dcp_unit_record {
    char name[64];
    size_t numel;              /* unpadded */
    int param_count;
    uint64_t layout_hash;      /* FNV-1a over the parameters' names, shapes and offsets */
    int64_t optimizer_step;    /* AdamW's step for this unit; 0: no moments saved */
} dcp_unit_record;

/* One rank's file as recorded. */
typedef struct dcp_file_record {
    int rank;
    char file[64];
    uint64_t bytes, checksum;
    /* The unpadded element ranges [begin, end) of each unit the file holds: unit u's are ranges first_range[u] ..
     * first_range[u + 1] - 1 of begin and end. FSDP1 holds one range of a unit (begin == end: none), stored as the
     * tensor "<unit>.param"; FSDP2 one per parameter it holds rows of, the k-th stored as "<unit>.param.<k>"
     * (k > 0). */
    int *first_range;
    size_t *begin, *end;
} dcp_file_record;

typedef struct dcp_metadata {
    int version, world_size;
    char dtype[16];
    dcp_progress progress;
    int unit_count, file_count;
    dcp_unit_record *units;
    dcp_file_record *files;
} dcp_metadata;

/* Called on rank 0 with the checkpoint directory before the commit: the place to add files (config.json). Returns 0,
 * or -1 with a message in error. */
typedef int (*dcp_extra_writer)(const char *directory, void *user, char *error, size_t error_size);

/* Saves every unit's local shard and AdamW state into <root>/step_<progress->step, 8 digits>, then commits it, then
 * removes older checkpoints of <root> beyond the newest `keep` (keep <= 0: none removed) and uncommitted ones, and
 * every checkpoint of a later step: those belong to the run this one replaced by resuming from an earlier step, and
 * RESUME=auto would otherwise take them.
 * Collective: every rank calls it with the same units; returns 0 on every rank, or -1 on every rank with ctx->error
 * naming the rank and the file. `written` (may be NULL) receives the directory and the bytes of all files. */
int dcp_save(context *ctx, const char *root, const flat_param *units, const adamw_state *states, int unit_count,
             const dcp_progress *progress, int keep, dcp_extra_writer extra, void *extra_user, char *written,
             size_t written_size, uint64_t *total_bytes);

/* Loads a committed checkpoint directory into the units' local shards and AdamW states (states must be empty, as
 * adamw_init leaves them) and fills `progress`. Refuses, naming the file and the values: no .metadata, another
 * format or version, another strategy or dtype, another model (unit names, sizes or parameter layout), a file
 * missing or of another size or checksum, an element range no file holds. The world size may differ (resharding).
 * Collective; returns 0 on every rank, or -1 on every rank with ctx->error. */
int dcp_load(context *ctx, const char *directory, flat_param *units, adamw_state *states, int unit_count,
             dcp_progress *progress);

/* The newest committed checkpoint under root (the highest step_N with a .metadata), into out; 0 when found, 1 when
 * root holds none (or does not exist), -1 when out is too small. Local: reads the directory only. */
int dcp_find_latest(const char *root, char *out, size_t out_size);

/* Parses <directory>/.metadata. Returns 0, or -1 with a message naming the file and the key. Local. The parser every
 * resume goes through; the fuzz check drives it with mutated files. */
int dcp_read_metadata(const char *directory, dcp_metadata *metadata, char *error, size_t error_size);
void dcp_metadata_free(dcp_metadata *metadata);

/* Records one setting; the last one wins when a name repeats. Aborts past DCP_MAX_SETTINGS (a programming error). */
void dcp_progress_set(dcp_progress *progress, const char *name, const char *format, ...)
    __attribute__((format(printf, 3, 4)));
/* The value of a recorded setting, or NULL. */
const char *dcp_progress_get(const dcp_progress *progress, const char *name);

#endif
