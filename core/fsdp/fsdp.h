/* fsdp.h — the FSDP runtime: units from a wrap policy, PyTorch FSDP1's state machine, hooks and prefetching,
 * gradient accumulation, activation checkpointing, and the training step that calls it all at PyTorch's moments.
 *
 *   step:  for each micro-batch:
 *            for each piece in order:
 *                _pre_forward (unshard: wait for a prefetched all-gather or issue one; prefetch the next unit)
 *                  →  piece forward  →  _post_forward (reshard, except the root)
 *            for each piece in reverse:
 *                _pre_backward_hook (unshard; BACKWARD_PRE: prefetch the unit backward meets next)
 *                  →  [recompute]  →  piece backward
 *                  →  _post_backward_hook (reduce-scatter issued on its own stream, reshard; BACKWARD_POST: prefetch)
 *          _post_backward_final_callback (root: wait for the reduce-scatters; every unit back to IDLE)
 *          →  clip  →  AdamW on the shards
 *
 * The runtime knows no model (core/fsdp/module.h): it sees a module tree, FlatParameters and an ordered list of pieces.
 * A unit's hooks fire around the span of pieces that use its parameters (the root's span is the whole model), so
 * nested units behave as in torch: outer pre-hooks first, inner post-hooks first. Collectives run on two comm
 * streams (core/comm/stream.h): the all-gather stream and the reduce-scatter stream, while the host thread computes.
 * Names follow torch/distributed/fsdp/_runtime_utils.py, so the two read side by side.
 */
#ifndef FSDPLAB_FSDP_H
#define FSDPLAB_FSDP_H

#include <stddef.h>

#include "core/runtime/context.h"
#include "core/fsdp/flat_param.h"
#include "core/fsdp/module.h"
#include "core/comm/stream.h"
#include "core/comm/group.h"

/* TrainingState (per FSDP unit) */
typedef enum fsdp_training_state { TRAINING_STATE_IDLE, TRAINING_STATE_FORWARD_BACKWARD } fsdp_training_state;
/* HandleTrainingState (per FlatParameter handle) */
typedef enum fsdp_handle_state {
    HANDLE_IDLE,
    HANDLE_FORWARD,
    HANDLE_BACKWARD_PRE,
    HANDLE_BACKWARD_POST
} fsdp_handle_state;
/* HYBRID_SHARD: FULL_SHARD inside each shard group, the gradient shard all-reduced across the replicate group
 * (ctx->mesh, core/comm/group.h); _HYBRID_SHARD_ZERO2: the same with SHARD_GRAD_OP inside the group. */
typedef enum fsdp_strategy {
    FSDP_FULL_SHARD,
    FSDP_SHARD_GRAD_OP,
    FSDP_NO_SHARD,
    FSDP_HYBRID_SHARD,
    FSDP_HYBRID_SHARD_ZERO2
} fsdp_strategy;
/* BackwardPrefetch: which all-gather backward issues early. BACKWARD_PRE: in a unit's _pre_backward_hook, the next
 * unit's (more memory: two units unsharded during one backward); BACKWARD_POST: in its _post_backward_hook, after it
 * resharded. None (torch's None) waits for each unit's all-gather in its own _pre_backward_hook. */
typedef enum fsdp_backward_prefetch { BACKWARD_PREFETCH_NONE, BACKWARD_PRE, BACKWARD_POST } fsdp_backward_prefetch;

const char *fsdp_training_state_name(fsdp_training_state state);
const char *fsdp_handle_state_name(fsdp_handle_state state);
const char *fsdp_strategy_name(fsdp_strategy strategy);
/* "FULL_SHARD" ... → strategy; -1 when unknown. */
int fsdp_strategy_from_name(const char *name);
/* HYBRID_SHARD or _HYBRID_SHARD_ZERO2 (torch's HYBRID_SHARDING_STRATEGIES) */
int fsdp_strategy_is_hybrid(fsdp_strategy strategy);
/* Whether _post_forward frees a (non-root) unit's unsharded parameters: FULL_SHARD and HYBRID_SHARD do;
 * SHARD_GRAD_OP and _HYBRID_SHARD_ZERO2 keep them for backward (NO_SHARD has none of its own). */
int fsdp_strategy_reshards_after_forward(fsdp_strategy strategy);
/* "NONE", "BACKWARD_PRE", "BACKWARD_POST" */
const char *fsdp_backward_prefetch_name(fsdp_backward_prefetch prefetch);
/* "NONE" (or "None"), "BACKWARD_PRE", "BACKWARD_POST" → the option; -1 when unknown. */
int fsdp_backward_prefetch_from_name(const char *name);

/* ---- wrap policy: which modules become FSDP units (torch's auto_wrap_policy) ---- */

/* Return 1 to wrap `module` in its own unit. unwrapped_numel counts the parameters of the module and of its
 * descendants that no descendant unit has claimed (torch's nonwrapped_numel). */
typedef int (*fsdp_wrap_fn)(const module_node *module, size_t unwrapped_numel, void *user);
/* transformer_auto_wrap_policy: user points to the class name to wrap ("Qwen2DecoderLayer"). */
int fsdp_wrap_by_type(const module_node *module, size_t unwrapped_numel, void *user);
/* size_based_auto_wrap_policy: user points to a size_t min_num_params; ModuleList is never wrapped (torch excludes
 * it). */
int fsdp_wrap_by_size(const module_node *module, size_t unwrapped_numel, void *user);
/* Walks the tree children-first; every parameter goes to the unit of its nearest wrapped ancestor, else the root
 * (unit 0). A module holding every parameter not yet claimed is never wrapped: it is the root. Units are numbered
 * in module order (the order forward meets them). Returns the unit count. */
int fsdp_auto_wrap(const module_tree *tree, fsdp_wrap_fn wrap, void *user, int *unit_of_param);

/* ---- the runtime ---- */

typedef struct fsdp_options {
    fsdp_strategy strategy;
    int activation_checkpointing; /* keep only each checkpointable piece's input; recompute its forward in backward */
    int no_sync;                  /* accumulate unsharded gradients, reduce-scatter on the last micro-batch only */
    int accumulation_steps;       /* micro-batches per optimizer step (ACC) */
    fsdp_backward_prefetch backward_prefetch;
    int forward_prefetch;         /* in _pre_forward, issue the all-gather of the unit forward meets next (from the
                                     order recorded in the first forward, as torch's _ExecOrderData) */
    int comm_streams;             /* 1: collectives run on the all-gather and reduce-scatter streams, beside compute;
                                     0: every collective blocks the host (lab 05's picture, nothing overlaps) */
    int limit_all_gathers;        /* the rate limiter: at most FSDP_MAX_INFLIGHT_ALL_GATHERS unsharded buffers issued
                                     and not yet freed on the compute stream (torch's _FreeEventQueue) */
    int offload_params;           /* CPUOffload(offload_params=True): shards, gradient shards and AdamW state in the
                                     host pool, copied to the device for the all-gather and back after the
                                     reduce-scatter (core/runtime/offload.h; env OFFLOAD) */
    flat_param_mixed_precision mixed_precision; /* torch's MixedPrecision (core/fsdp/flat_param.h); zeroed: all float32,
                                                   off */
    int fsdp_version;             /* 2: the units are FSDP2's per-parameter shards (flat_param.h's FLAT_PARAM_ROWS,
                                     made under ctx->per_parameter_sharding); 0 or 1: FSDP1's FlatParameters */
    int reshard_after_forward;    /* FSDP2 under FULL_SHARD: torch's reshard_after_forward as an int N, 1 < N < W
                                     dividing W (RESHARD_AFTER_FORWARD): _post_forward keeps each non-root unit's
                                     slice for the group of N consecutive ranks it is in (SHARDED_POST_FORWARD) and
                                     backward all-gathers within that group. 0: the strategy's bool */
    int forward_prefetch_modules; /* FSDP2 on comm streams (FORWARD_PREFETCH_MODULES=N): each non-root unit's
                                     set_modules_to_forward_prefetch gets the N units forward meets after it, as
                                     torch's FSDP2 example does for its layers (num_to_forward_prefetch); 0: none */
    int backward_prefetch_modules; /* the same for set_modules_to_backward_prefetch (BACKWARD_PREFETCH_MODULES=N): the
                                     N units before it, the ones backward meets next; 0: none */
    int loss_chunk;               /* the model's loss this many rows at a time (LOSS_CHUNK; qwen2_model.loss_chunk):
                                     the runtime passes it on to the memory model; 0, all rows at once */
} fsdp_options;
/* torch's defaults: FULL_SHARD, BACKWARD_PRE, no forward prefetch, limit_all_gathers on; comm streams on; ACC 1.
 * A zeroed fsdp_options is lab 05's runtime: FULL_SHARD, blocking collectives, no prefetch. */
fsdp_options fsdp_default_options(void);
#define FSDP_MAX_INFLIGHT_ALL_GATHERS 2
/* The prefetch settings from the environment, over `defaults`: BACKWARD_PREFETCH (NONE, BACKWARD_PRE, BACKWARD_POST),
 * FORWARD_PREFETCH, LIMIT_ALL_GATHERS and COMM_STREAMS (0/1 each); on the CUDA device FORWARD_PREFETCH's default is
 * COMM_STREAMS' value (docs/gpu.md); FSDP2's FORWARD_PREFETCH_MODULES and BACKWARD_PREFETCH_MODULES (0 .. 64). A bad
 * value stops every rank naming it. */
void fsdp_prefetch_options_from_env(context *ctx, fsdp_options *options);
/* MixedPrecision from text: "fp32" (or "none": off), or "<param_dtype>[,reduce=<dtype>][,buffer=<dtype>]
 * [,keep_low_precision_grads=0|1][,output=<dtype>]" with dtypes bf16/bfloat16 or fp32/float32 (output: FSDP2's
 * MixedPrecisionPolicy.output_dtype, default float32); reduce_dtype defaults to param_dtype
 * (as torch's: a None reduce_dtype follows param_dtype). "bf16" is param and reduce in bfloat16; "bf16,reduce=fp32"
 * gathers bfloat16 and reduces float32. 0, or -1 with a message naming the text, the part and what is allowed. */
int fsdp_mixed_precision_parse(const char *text, flat_param_mixed_precision *out, char *error, size_t error_size);
/* MP from the environment (default fp32: off) into options->mixed_precision; a bad value stops every rank naming it. */
void fsdp_mixed_precision_from_env(context *ctx, fsdp_options *options);
/* "bf16", "bf16,reduce=fp32", "fp32": the short form of a MixedPrecision, as MP takes it (out_size >= 64). */
const char *fsdp_mixed_precision_label(const flat_param_mixed_precision *mixed_precision, char *out, size_t out_size);

typedef struct fsdp_unit {
    fsdp_training_state training_state;
    fsdp_handle_state handle_state;
    int first_piece, last_piece;  /* span of pieces that use its parameters */
    int prefetched;               /* _prefetched: unsharded by _prefetch_handle, not yet resharded */
    int needs_pre_forward_unshard, needs_pre_backward_unshard; /* torch's flags of the same names */
    /* FSDP2's explicit prefetch lists (fsdp_set_modules_to_forward_prefetch / _backward_prefetch), NULL when unset */
    int *forward_prefetch, forward_prefetch_count;
    int *backward_prefetch, backward_prefetch_count;
} fsdp_unit;

/* torch's _FreeEventQueue: an event recorded on the compute stream when a unit's unsharded buffer is freed; before
 * issuing an all-gather with limit_all_gathers, the host waits for the oldest once FSDP_MAX_INFLIGHT_ALL_GATHERS are
 * queued. On CPU the compute stream is the host thread, so a free event is complete when recorded and the limiter
 * never waits; on a GPU (compute queued ahead of the host) it is what bounds the unsharded memory. */
#define FSDP_FREE_EVENTS_MAX 16
typedef struct fsdp_free_event_queue {
    stream_event events[FSDP_FREE_EVENTS_MAX]; /* oldest first */
    int count;
    uint64_t waits;               /* times the host had to wait on the oldest event */
} fsdp_free_event_queue;

typedef struct fsdp_runtime {
    context *ctx;
    module *model;
    fsdp_options options;
    fsdp_unit *units;             /* parallel to model->units; units[0] is the root */
    int *checkpointed;            /* per piece: run with activation checkpointing */
    int sync_gradients;           /* 0 inside no_sync micro-batches */
    stream compute_stream;        /* the host thread */
    stream all_gather_stream;     /* torch's _unshard_stream */
    stream reduce_scatter_stream; /* torch's _post_backward_stream */
    fsdp_free_event_queue free_event_queue;
    /* _ExecOrderData: the order of _pre_forward calls of the first forward (forward prefetch reads it from the second
     * on), and of _post_forward calls of this forward (backward prefetch walks it in reverse). */
    int *pre_forward_order, pre_forward_count, pre_forward_recorded;
    int *post_forward_order, post_forward_count;
    int *gathers_in_flight;       /* units whose all-gather was issued and not waited for, in issue order */
    int gathers_in_flight_count;
    int reduce_in_flight;         /* the unit whose reduce-scatter was issued and not waited for, or -1 */
    /* Pieces run and timed (device.timer_start) whose compute spans are not yet in the trace: on a device whose
     * timers are read later (CUDA), fsdp_trace_compute_spans writes them once a step. */
    struct fsdp_timed_piece {
        int timer, piece, phase;
    } *timed_pieces;
    int timed_piece_count;
    int all_gather_state;         /* FSDP2 on comm streams: the unit whose all-gather output a forward copy-out kept
                                     (torch's comm_ctx.all_gather_state), freed at the next unit's copy-out or the
                                     root's _post_forward; -1: none */
    group_mesh post_forward_mesh; /* reshard_after_forward=N: its shard groups of N ranks, named "post_forward" */
    int owns_post_forward_mesh;
    float host_losses[MODULE_LOSS_SLOTS]; /* fsdp_losses_read's, for a model without loss slots (module_ops.loss) */
} fsdp_runtime;

/* Wraps a model (its units from fsdp_auto_wrap) and starts the comm streams. Collective: every rank calls it.
 * Returns -1 with ctx->error on bad options. */
int fsdp_runtime_init(fsdp_runtime *runtime, context *ctx, module *model, const fsdp_options *options);
void fsdp_runtime_free(fsdp_runtime *runtime);
/* Writes the `compute` spans of the pieces run since the last call. On the CPU each span is written as its piece
 * ends and this does nothing; on CUDA the pieces' timers are read here, after one wait for the last one: the trainer
 * calls it at the step's end, so no host wait falls between the step's first all-gather and its optimizer. It also
 * runs when the timers run out and when the runtime is freed. */
void fsdp_trace_compute_spans(fsdp_runtime *runtime);

/* Whether unit's HandleTrainingState may go from `expected` (its state now must be that) to `to` in `hook`:
 * 0, or -1 with ctx->error naming rank, unit, the actual and expected states, the target and the hook. */
int fsdp_check_transition(fsdp_runtime *runtime, int unit, fsdp_handle_state expected, fsdp_handle_state to,
                          const char *hook);

/* FSDP2's explicit prefetching (torch's FSDPModule.set_modules_to_forward_prefetch and
 * set_modules_to_backward_prefetch): in `unit`'s _pre_forward (_pre_backward_hook), once its own all-gather is copied
 * out, the all-gathers of `targets` are issued in that order, each unless it is unsharded or prefetched already. A
 * list replaces the unit's implicit prefetch (FORWARD_PREFETCH; BACKWARD_PRE or BACKWARD_POST), as torch's
 * default_prefetch does; count 0 clears it. FSDP2 (fsdp_version 2) on comm streams only. 0, or -1 with ctx->error
 * naming rank, unit and the bad target. */
int fsdp_set_modules_to_forward_prefetch(fsdp_runtime *runtime, int unit, const int *targets, int count);
int fsdp_set_modules_to_backward_prefetch(fsdp_runtime *runtime, int unit, const int *targets, int count);

/* The hooks, by PyTorch's names; each checks and records the state transitions it makes. FSDP2 (fsdp_version 2)
 * follows FSDPParamGroup's order: a hook waits for its own all-gather and copies it out before it issues a prefetch
 * (FSDP1 issues the prefetch first, the wait_stream covering only what came before it). */
void fsdp_pre_forward(fsdp_runtime *runtime, int unit);
void fsdp_post_forward(fsdp_runtime *runtime, int unit);
void fsdp_pre_backward_hook(fsdp_runtime *runtime, int unit);
void fsdp_post_backward_hook(fsdp_runtime *runtime, int unit);
void fsdp_post_backward_final_callback(fsdp_runtime *runtime);

/* Which micro-batch of the optimizer step: under no_sync, gradients are synchronised on the last one only. */
typedef enum fsdp_micro_batch { FSDP_MICRO_BATCH_ACCUMULATE, FSDP_MICRO_BATCH_LAST } fsdp_micro_batch;

/* One micro-batch forward + backward (tokens, targets: this rank's B x T). The loss gradient is scaled by
 * 1 / accumulation_steps. When it returns, every gradient of the micro-batch is in the sharded gradients (or kept
 * unsharded under no_sync). Returns this rank's loss. */
float fsdp_forward_backward(fsdp_runtime *runtime, const int *tokens, const int *targets, int B, int T,
                            fsdp_micro_batch micro_batch);
/* fsdp_forward_backward without reading the loss: it stays on the device, in loss slot `loss_slot` (0 ..
 * MODULE_LOSS_SLOTS - 1, one per micro-batch of a step), so nothing in the micro-batch waits for it. A step queues its
 * micro-batches, then reads every loss at once with fsdp_losses_read: one copy and one host wait a step instead of one
 * a micro-batch. fsdp_forward_backward is this into slot 0, then its read. */
void fsdp_forward_backward_queued(fsdp_runtime *runtime, const int *tokens, const int *targets, int B, int T,
                                  fsdp_micro_batch micro_batch, int loss_slot);
/* The losses of slots first .. first + count - 1 (this rank's micro-batch means), the slots zeroed for the next step.
 * On CUDA one copy and one host wait for them all. */
void fsdp_losses_read(fsdp_runtime *runtime, float *losses, int first, int count);

#endif
