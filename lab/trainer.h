/* trainer.h — the machinery around the FSDP training step, shared by the labs so that each lab's main shows its lesson.
 *
 * The step itself is two calls: trainer_forward_backward (the next batch, forward and backward through every unit's
 * FSDP hooks: core/fsdp/fsdp.h's fsdp_forward_backward; lab 05 queues its micro-batches with
 * trainer_forward_backward_queued and reads their losses once, trainer_read_losses) and trainer_optimizer_step
 * (AdamW on each unit's local shard: core/fsdp/optim.h). Everything else a real run needs lives here, behind a name:
 * settings, building the model and its runtime, sharded checkpoints and resume, the divergence stop, GRADS, EVAL,
 * SAVE, fault injection, the log line and the memory report.
 *
 *   lab 05        trainer_read_settings, trainer_open, trainer_resume; per step trainer_begin_step, the micro-batches,
 *                 trainer_diverged, trainer_optimizer_step, trainer_log_step and the trainer_maybe_* calls; at the end
 *                 trainer_report_memory, trainer_save, trainer_close.
 *   labs 06-09    one trainer per mode they compare (trainer_open_mode): a fresh model from SEED under the mode's
 *                 options, the generated stories, so every mode starts from the same parameters and batches and the
 *                 modes differ only in what the lab compares; each mode in a window of the trace
 *                 (trainer_begin_window) and from an empty cache (trainer_empty_caches).
 *
 * Lab 05's settings (environment variables; `make run VAR=value` passes them on; docs/reference.md lists every
 * setting of every lab). Each is read on every rank, checked, and must agree between ranks; a bad one stops every
 * rank with a message naming it and the value.
 *   read here (trainer_read_settings): the fields of trainer_settings below, each with its variable's name.
 *   read by core/ while trainer_open builds the run, in this order:
 *     MODEL           tiny (the default), qwen2-0.5b, or qwen2 (its name in the PyTorch FSDP training script
 *                     that scripts/train.sh mirrors; core/models/qwen2.h)
 *     CONFIG          model fields by their HF names: CONFIG=hidden_size=512,num_hidden_layers=8
 *     COMM_STREAMS, BACKWARD_PREFETCH (NONE, BACKWARD_PRE, BACKWARD_POST), FORWARD_PREFETCH, LIMIT_ALL_GATHERS
 *                     lab 06's overlap, all off in lab 05 by default (scripts/train.sh turns on torch's defaults);
 *                     with DEVICE=cuda FORWARD_PREFETCH follows COMM_STREAMS unless set (docs/gpu.md)
 *     MP              mixed precision, torch's MixedPrecision: fp32 (the default: off); bf16: bfloat16 parameters
 *                     and gradient reduction; bf16,reduce=fp32; bf16,keep_low_precision_grads=1 (lab 07)
 *     LOSS_CHUNK      rows of the loss at a time, so the B x T x vocabulary logits never exist at once; 0: all at
 *                     once (the CPU's default), 1024 on a GPU
 *     MEMORY_CHECK    1 (the default): refuse a run whose predicted peak exceeds the memory available; 0: skip
 *     TOKENIZER       how text becomes ids: auto (the default: Qwen2's BPE for qwen2-0.5b when
 *                     data/qwen2/qwen.tiktoken is there, bytes for tiny), bytes, qwen2, or a vocabulary's path
 *   read by session_open (core/runtime/session.h), in every lab: OUT (the run directory), THREADS, TIMEOUT (a
 *   collective not done after this many seconds aborts the run), ALLOC (caching, the default, or malloc: every buffer a
 *   fresh segment, as PYTORCH_NO_CUDA_MEMORY_CACHING=1), MAX_SPLIT_SIZE_MB (PyTorch's max_split_size_mb; 0: no limit),
 *   DEVICE_MEMORY_MB (the device pool's budget; 0, the default: none), DEVICE (cpu, the default; cuda in a
 *   `make CUDA=1` build) and BACKEND (mpi = gloo; nccl on the GPU).
 */
#ifndef FSDPLAB_TRAINER_H
#define FSDPLAB_TRAINER_H

#include <stddef.h>
#include <stdint.h>

#include "core/runtime/context.h"
#include "core/data/data.h"
#include "core/fsdp/fsdp.h"
#include "core/comm/group.h"
#include "core/models/memory_model.h"
#include "core/fsdp/optim.h"
#include "core/models/qwen2.h"
#include "core/data/tokenizer.h"

/* Lab 05's settings: each field's variable, default and meaning. Empty or unset texts are NULL or "". */
typedef struct trainer_settings {
    const char *strategy;     /* STRATEGY: FULL_SHARD (the default), SHARD_GRAD_OP, NO_SHARD, and lab 08's
                                 HYBRID_SHARD and _HYBRID_SHARD_ZERO2 */
    int micro_batch;          /* MBS: sequences per rank per micro-batch (default 4) */
    int accumulation;         /* ACC: micro-batches per optimizer step (default 2) */
    int steps;                /* STEPS: optimizer steps, counted from the start of training, so a resumed run ends
                                 where the uninterrupted one would (default 3) */
    int seq_len;              /* SEQ: tokens per sequence (default 128) */
    int eval_every;           /* EVAL: every N steps print a story generated from "Once upon a time" (0: off) */
    int checkpointing;        /* CKPT: activation checkpointing per decoder layer (0/1) */
    int no_sync;              /* NO_SYNC: accumulate unsharded gradients, reduce-scatter on the last micro-batch
                                 (0/1) */
    int offload;              /* OFFLOAD: CPUOffload(offload_params=True): shards, gradients and AdamW in the host pool
                                 (lab 09) */
    double lr;                /* LR: AdamW's learning rate (default 1e-3) */
    double clip;              /* CLIP: max grad norm, clip_grad_norm_ over every shard (0: off) */
    uint64_t seed;            /* SEED: initialisation, data order and EVAL's sampling (default 1234) */
    const char *data;         /* DATA: a text or .bin token file (default: generated stories) */
    const char *save;         /* SAVE: the model written there at the end as an HF directory (config.json, ...) */
    const char *grads;        /* GRADS: write step 1's gradients there, as the optimizer sees them, in checkpoint form
                                 (what check-05 compares); with MP, also each parameter's local_grad_l1.json */
    const char *wrap;         /* WRAP: layers (transformer_auto_wrap_policy, the default) or size:<min params>
                                 (size_based_auto_wrap_policy) */
    const char *peak;         /* PEAK: tracked (the tracked allocator's peak, the default) or rss (the process's max
                                 resident set: what a PyTorch run can be given too) */
    int checkpoint_every;     /* CHECKPOINT_EVERY: a sharded checkpoint (core/io/dcp.h, torch.distributed.checkpoint's
                                 layout) every N steps and at the last (0: off, the default) */
    int checkpoint_keep;      /* CHECKPOINT_KEEP: the newest checkpoints kept (default 2) */
    const char *checkpoint_dir; /* CHECKPOINT_DIR: where they go (default OUT/checkpoints) */
    const char *resume;       /* RESUME: a step_N directory, or auto: the newest committed one under CHECKPOINT_DIR,
                                 if any */
    int kill_at_step;         /* KILL_AT_STEP: fault injection for the resume check: rank KILL_RANK kills itself
                                 with SIGKILL right after this step, its checkpoint included (0: never) */
    int kill_rank;            /* KILL_RANK (default 0) */
    int shard_group;          /* SHARD_GROUP: HYBRID_SHARD's ranks per shard group (default: the ranks per node) */
    int fsdp_version;         /* FSDP_VERSION: 1 (the default: FSDP1's FlatParameter) or 2 (FSDP2's fully_shard:
                                 every parameter sharded on dim 0, lab 10); 2 takes STRATEGY FULL_SHARD
                                 (reshard_after_forward=True) or SHARD_GRAD_OP (False), MP=fp32 and OFFLOAD=0 */
    int reshard_after_forward; /* RESHARD_AFTER_FORWARD=N (FSDP_VERSION=2, FULL_SHARD): reshard_after_forward as an
                                  int, a factor of W; 1 becomes SHARD_GRAD_OP, W and 0 (unset) FULL_SHARD's True */
} trainer_settings;

/* Everything one training run holds. A trainer never moves once open: the runtime keeps a pointer to `view`, and
 * ctx->mesh to `mesh`. */
typedef struct trainer {
    context *ctx;
    trainer_settings settings;    /* lab 05's; a mode's (trainer_open_mode): its sizes, seed and lr, the rest zero */
    fsdp_options options;
    group_mesh mesh;              /* HYBRID_SHARD's shard x replicate groups, when lab 05 made them */
    int owns_mesh;
    qwen2_model model;            /* the units (one FlatParameter each) holding this rank's shards */
    module view;                  /* the model as the runtime sees it: a module tree and its pieces */
    fsdp_runtime runtime;         /* the hooks, their states, the comm streams */
    adamw_config optimizer;
    adamw_state *states;          /* per unit: AdamW's moments of this rank's shard only */
    tok_tokenizer *tokenizer;     /* TOKENIZER's (lab 05); NULL: byte ids */
    char tokenizer_note[1024];
    data_loader loader;
    int *tokens, *targets;        /* this rank's micro-batch: MBS x SEQ ids each */
    /* the run so far (lab 05) */
    int first_step, last_checkpoint; /* last_checkpoint 0: none yet */
    double step_start;
    size_t measured_peak[MEM_CATEGORY_COUNT], measured_total_peak, measured_reserved_peak;
    char diverged[1500];          /* why the run stopped early; empty while it is healthy */
    /* lab 05's micro-batches of the step, queued (trainer_forward_backward_queued) and not yet read: each one's loss
     * waits in a device loss slot; its time and peaks are kept from when it was queued, for its step event */
    struct trainer_micro {
        double seconds;
        size_t peak_bytes, peak_reserved_bytes;
    } *micro;
    int micro_queued, micro_read;
    double loss_sum;              /* this step's losses read so far, summed in micro-batch order */
} trainer;

/* ---- Lab 05: a training run as its settings ask ---- */

/* Every setting above, checked, in one call; a SAVE, GRADS or CHECKPOINT_DIR that cannot be written is refused now,
 * before anything is built, not after the last step. Collective. */
trainer_settings trainer_read_settings(context *ctx);
/* Builds the run: HYBRID_SHARD's mesh, the model cut into FSDP units by the wrap policy and initialised from SEED
 * (after the memory model says it fits), the runtime, AdamW, the tokenizer and the data; rank 0 prints what it built.
 * Collective. */
void trainer_open(trainer *t, context *ctx, const trainer_settings *settings);
/* RESUME: the checkpoint's parameters, AdamW state and data position, after checking it is whole and of this model.
 * Returns the first step still to run: 1 without RESUME. Collective. */
int trainer_resume(trainer *t);

/* The step's clock and memory peaks start here: Peak and Time are the step's own. */
void trainer_begin_step(trainer *t);
/* One micro-batch (0 .. ACC-1): the next batch, then forward and backward with the FSDP hooks firing around every
 * unit; the last micro-batch of the step synchronises the gradients (under no_sync only it reduce-scatters). Returns
 * this rank's loss. Collective. */
float trainer_forward_backward(trainer *t, int micro);
/* Lab 05's micro-batch: trainer_forward_backward without reading the loss, which stays on the device in the
 * micro-batch's loss slot (core/fsdp/fsdp.h's fsdp_forward_backward_queued): on a GPU nothing in the micro-batch
 * waits for it. On the CPU device the loss is on the host anyway: it is read and its step event written at once. */
void trainer_forward_backward_queued(trainer *t, int step, int micro);
/* After the step's micro-batches: every loss still on the device, read with one copy and one host wait (and one more
 * per MODULE_LOSS_SLOTS micro-batches, when ACC is larger), each micro-batch's step event written with the time and
 * peaks it had when it ended. Returns this rank's losses summed over the micro-batches, in their order. */
double trainer_read_losses(trainer *t, int step);
/* GRADS, after step 1's backward: the gradients the optimizer is about to use. A diagnostic outside FSDP (it gathers
 * every unit's gradient at once), so the step's peaks leave it out. Collective. */
void trainer_save_gradients(trainer *t, int step);
/* The divergence stop: true when the step's loss (loss_sum: this rank's over its micro-batches) or any gradient is
 * not finite; the run stops before the optimizer writes NaN into the parameters (and before SAVE), and t->diverged
 * says which step and unit, and which checkpoint to resume from. Collective. */
int trainer_diverged(trainer *t, int step, double loss_sum);
/* The optimizer step on the shards: CLIP's clip_grad_norm_, then AdamW on each unit's local shard with state for
 * that shard alone, then zero_grad. Collective when CLIP is on. */
void trainer_optimizer_step(trainer *t);
/* The step's line, rank 0: "step/STEPS: Loss = <mean over micro-batches and ranks>, Peak = <MB, the largest rank's>,
 * Time = <s, the slowest rank's>", and its step event (micro -1). Collective. */
void trainer_log_step(trainer *t, int step, double loss_sum);
/* EVAL: every EVAL steps, a story from "Once upon a time" (every unit unsharded for the moment). Collective. */
void trainer_maybe_eval(trainer *t, int step);
/* CHECKPOINT_EVERY: a sharded checkpoint every N steps and at the last one. Collective. */
void trainer_maybe_checkpoint(trainer *t, int step);
/* KILL_AT_STEP: rank KILL_RANK sends itself SIGKILL after that step, as a crash would (the resume check). */
void trainer_maybe_kill(trainer *t, int step);
/* After the steps: the memory model's prediction beside the measured peaks per category (and the host pool's with
 * OFFLOAD), rank 0. Collective. */
void trainer_report_memory(trainer *t);
/* SAVE: the HF directory (save_pretrained); a diverged run writes nothing and says why on stderr. Collective. */
void trainer_save(trainer *t);

/* ---- Labs 06-09: one mode of a comparison ---- */

/* A fresh tiny (or MODEL/CONFIG) Qwen2 from `seed`, one FSDP unit per decoder layer under `options` (ACC is
 * options->accumulation_steps), AdamW with its defaults, the generated stories. Refuses (every rank exits) a run the
 * memory model says cannot fit, before anything is allocated (MEMORY_CHECK=0 skips it). A hybrid strategy shards
 * over ctx->mesh's shard group: set it first. Collective. */
void trainer_open_mode(trainer *t, context *ctx, const fsdp_options *options, int micro_batch, int seq_len,
                       uint64_t seed, int steps);
/* A window of the trace that the lab reads back afterwards: every rank at a barrier (so windows do not overlap
 * across ranks on the timeline), a mark named `label`, the device pool's peaks reset. Collective. */
void trainer_begin_window(context *ctx, const char *label);
/* The memory model's prediction for what ran, per category. */
void trainer_predict_memory(const trainer *t, memory_prediction *predicted);
/* The memory model's table against the device pool's peaks since the window began, "rank R, <window>: ...", in
 * rank order. Collective. */
void trainer_print_memory_model(trainer *t, const char *window);
/* FNV-1a over this rank's parameter shards: equal across modes, or a mode changed the arithmetic. */
uint64_t trainer_shards_checksum(const flat_param *units, int unit_count);

/* ---- Every lab ---- */

/* Frees what trainer_open or trainer_open_mode built (and lab 05's mesh). The allocator keeps its cache. */
void trainer_close(trainer *t);
/* Empties the device pool's cache (and the host pool's): the next mode starts from nothing reserved, as the first. */
void trainer_empty_caches(context *ctx);

#endif
