/* pretrained.h — a model as an HF directory: config.json + model.safetensors, loadable by
 * transformers.Qwen2ForCausalLM.from_pretrained(dir), and HF's save_pretrained output loadable here.
 *
 * Saving gathers the full parameters (every unit unsharded for the moment of the write; rank 0 writes), the
 * FULL_STATE_DICT way. Loading is sharded: every rank reads from the file only the elements of its own shards. */
#ifndef FSDPLAB_PRETRAINED_H
#define FSDPLAB_PRETRAINED_H

#include "core/models/qwen2.h"

/* Collective. Returns 0 on every rank, or -1 on every rank with ctx->error (on the rank that failed). */
int pretrained_save(qwen2_model *model, const char *directory);
/* The gradients the optimizer is about to use (every unit's sharded gradient, gathered), written like a checkpoint:
 * the parameters' names and shapes, so tools that compare checkpoints compare gradients too. Collective; returns 0
 * on every rank or -1 on every rank with ctx->error. */
int pretrained_save_gradients(qwen2_model *model, const char *directory);
/* Fills every unit's local shard from <directory>/model.safetensors. The model must have been made with the config
 * in <directory>/config.json (qwen2_config_load_json). A missing tensor, a wrong shape or an unknown tensor is an
 * error naming it. Collective; returns 0 or -1 on every rank. The tied lm_head.weight, if the file has it, must
 * have model.embed_tokens.weight's shape (else an error naming both shapes); its values are not read. */
int pretrained_load(qwen2_model *model, const char *directory);
/* Before a run that will save into `directory` (rank 0 writes): can it be made and written? Rank 0 tries (mkdir -p,
 * a probe file written and removed, then the directories it made removed), so a bad SAVE fails before training
 * instead of after it. Collective; returns 0, or -1 on every rank with ctx->error saying what failed. */
int pretrained_check_writable(context *ctx, const char *directory);

#endif
