/* flat_param.h — the FlatParameter: one FSDP unit's parameters as one flat, padded, sharded buffer.
 *
 *   registration order:  [ p0 ........ | p1 .... | p2 ........... | pad ]   padded_unsharded_numel
 *   rank r keeps chunk r: [  rank 0   ][  rank 1   ][  rank 2   ]            sharded_numel each
 *
 * The parameters are concatenated in the order they were registered and padded with zeros so the total divides by
 * the world size; rank r keeps chunk r (`_local_shard`, category param_shard). flat_param_unshard all-gathers the
 * chunks into `_full_param_padded` (param_unsharded) and every parameter becomes a view into it; flat_param_reshard
 * frees it. For gradients the mirror image: a full padded gradient (grad_unsharded) is reduce-scattered into the
 * sharded gradient (grad_shard), added to what is there (gradient accumulation).
 *
 * Mixed precision (torch's MixedPrecision, flat_param_set_mixed_precision): the float32 local shard stays the master
 * (the optimizer's). pre_unshard casts it into a low-precision shard (`_mp_shard`, category param_shard_low_precision,
 * param_dtype) and the all-gather moves that into a param_dtype `_full_param_padded` (param_unsharded, half the
 * bytes in bfloat16); post_unshard frees the low-precision shard (as torch does, once the all-gather is done).
 * Compute: the device's bfloat16 layers take float32 buffers holding bfloat16 values (OpenBLAS, Debian's 0.3.21, has
 * no bfloat16 GEMM; the CUDA device's GEMMs read float32 and convert exactly), so post_unshard also widens the gathered
 * bfloat16 values into a float32 copy the layers read (`full_param_padded`, param_unsharded, float32): every GEMM
 * multiplies bfloat16 values (exactly representable in float32) with float32 accumulation. That copy costs 4 bytes per
 * parameter of a unit in flight, beside the 2 of the bfloat16 buffer, on both devices until the layers store 2-byte
 * tensors (docs/gpu.md). The layers themselves compute as torch does on bfloat16 tensors (core/kernels/layers_bf16.h).
 * Gradients: the weights' float32 gradient sums become the param_dtype gradient torch would hold (rounded) at the
 * reduce, are reduce-scattered in reduce_dtype (a bfloat16 copy, grad_unsharded, when reduce_dtype is bfloat16) and
 * the result is cast to float32 and added into grad_shard. HYBRID_SHARD all-reduces that reduce_dtype shard across
 * the replicate group before the cast; NO_SHARD has nothing to gather (its _mp_shard, the whole unit, is the unsharded
 * parameter until the reshard) and all-reduces the whole reduce_dtype gradient; CPU offload copies the float32 host
 * shard to the device and casts it there (pre_unshard), and copies the gradient cast back to float32 to the host.
 *
 * Names and sizes follow torch/distributed/fsdp/_flat_param.py, so the two read alike.
 *
 * FSDP2 (torch.distributed.fsdp.fully_shard, lab 10): the same units, states and hooks with another layout,
 * FLAT_PARAM_ROWS, chosen by ctx->per_parameter_sharding when the unit is made. No flat chunks: each parameter is
 * sharded on dim 0 (torch's Shard(0)), rank r keeping its rows [r c, min(d0, (r + 1) c)), c = ceil(d0 / W), padded
 * with zero rows to c (the last ranks may hold padding only). The local shard is this rank's padded rows of p0, then
 * p1, ... (sharded_numel = sum_p c_p row_p), which is exactly its slice of the rank-major all-gather buffer:
 *
 *   all_gather_output:  [ r0: p0 rows | p1 rows | .. ][ r1: p0 rows | p1 rows | .. ] ..   padded_unsharded_numel
 *   full_param_padded:  [ p0 ........ | p1 .... | .. ]                                    unpadded_numel, no padding
 *
 * flat_param_unshard all-gathers into all_gather_output (torch's foreach_all_gather; param_unsharded), then copies
 * each rank's rows out into every parameter's own place (torch's split_with_sizes_copy) and frees it: the views are
 * FSDP1's, so the model does not change. The gradient is the mirror image: the unpadded full gradient is copied into
 * a rank-major padded reduce_scatter_input (grad_unsharded, zeros in the padding rows; torch's foreach_reduce's
 * copy-in) and reduce-scattered (mean) into grad_shard.
 * Mixed precision under FLAT_PARAM_ROWS (torch's MixedPrecisionPolicy): no _mp_shard and no low_precision_full_param.
 * all_gather_output holds param_dtype elements; the copy-in casts the float32 rows into this rank's slice of it and
 * the all-gather runs in place; the copy-out widens every rank's rows into the float32 full_param_padded (the
 * layers' float32 buffers holding bfloat16 values, as above). The gradient, rounded to param_dtype's values, is cast
 * into a reduce_dtype reduce_scatter_input (held in low_precision_grad when reduce_dtype is not float32) and
 * reduce-scattered; the rest is the flat layout's path. CPU offload: the float32 rows come h2d into the slice (or into
 * a transient device shard cast from, with a low-precision param_dtype), the gradient shard goes d2h as above.
 */
#ifndef FSDPLAB_FLAT_PARAM_H
#define FSDPLAB_FLAT_PARAM_H

#include <stddef.h>
#include <stdint.h>

#include "core/comm/comm.h"
#include "core/runtime/context.h"
#include "core/base/dtype.h"

#define FLAT_PARAM_MAX_DIMS 4
#define FLAT_PARAM_NAME_MAX 128

/* What a caller registers: a named tensor's shape. */
typedef struct flat_param_tensor_spec {
    const char *name;
    int ndim;
    int64_t shape[FLAT_PARAM_MAX_DIMS];
} flat_param_tensor_spec;

/* Where a registered parameter lives in the flat buffer. */
typedef struct flat_param_param_info {
    char name[FLAT_PARAM_NAME_MAX];
    int ndim;
    int64_t shape[FLAT_PARAM_MAX_DIMS];
    size_t numel;
    size_t offset; /* into the unsharded flat buffer */
    /* FLAT_PARAM_ROWS only (0 otherwise): */
    size_t row_numel;    /* elements of one dim-0 row: numel / shape[0] */
    size_t shard_rows;   /* c = ceil(shape[0] / W): the rows every rank holds, padding included */
    size_t shard_offset; /* where its rows start in a rank's local shard: sum of c row_numel of those before it */
} flat_param_param_info;

/* SHARDED_POST_FORWARD (FSDP2's reshard_after_forward=N, torch's ShardedState.SHARDED_POST_FORWARD): between
 * _post_forward and backward's unshard the unit holds sharded_post_forward, its slice for a group of N ranks. */
typedef enum flat_param_shard_state {
    FLAT_PARAM_SHARDED,
    FLAT_PARAM_UNSHARDED,
    FLAT_PARAM_SHARDED_POST_FORWARD
} flat_param_shard_state;

/* FSDP1's FlatParameter (flat chunks) or FSDP2's per-parameter dim-0 shards (rows); see the header comment. */
typedef enum flat_param_layout { FLAT_PARAM_FLAT, FLAT_PARAM_ROWS } flat_param_layout;

/* torch.distributed.fsdp.MixedPrecision, by its field names. All float32 (a zeroed struct): no mixed precision. */
typedef struct flat_param_mixed_precision {
    dtype param_dtype;            /* what parameters are gathered and computed in */
    dtype reduce_dtype;           /* what gradients are reduce-scattered in */
    dtype buffer_dtype;           /* module buffers (Qwen2's only one, RoPE's inv_freq, is computed in float32 as HF
                                     does: float32 only) */
    int keep_low_precision_grads; /* the sharded gradient the optimizer sees keeps param_dtype's values */
    dtype output_dtype;           /* FSDP2's MixedPrecisionPolicy.output_dtype: each unit's forward output cast to it
                                     (the model rounds where that changes a value: core/models/qwen2.c); float32 is
                                     also "unset", which computes the same numbers */
} flat_param_mixed_precision;

typedef struct flat_param {
    context *ctx;
    char unit[64];
    int param_count;
    flat_param_layout layout;        /* FLAT_PARAM_FLAT (FSDP1) or FLAT_PARAM_ROWS (FSDP2, fully_shard) */
    flat_param_param_info *params;           /* registration order */
    device_rows_param *rows;         /* FLAT_PARAM_ROWS: each parameter's place for the device's rows_copy */
    size_t unpadded_numel;           /* sum of the parameters' numel */
    size_t padded_unsharded_numel;   /* unpadded_numel rounded up to a multiple of the world size */
    size_t pad_numel;                /* padded_unsharded_numel - unpadded_numel, zeros at the end */
    size_t sharded_numel;            /* padded_unsharded_numel / world size */
    size_t full_numel;               /* elements of full_param_padded and full_grad_padded: padded_unsharded_numel,
                                        or unpadded_numel under FLAT_PARAM_ROWS (each parameter unpadded) */
    float *local_shard;              /* _local_shard: sharded_numel floats, always present */
    float *full_param_padded;        /* _full_param_padded: padded_unsharded_numel floats while UNSHARDED, else NULL */
    float *full_grad_padded;         /* unsharded gradient while backward runs, else NULL */
    void *all_gather_output;         /* FLAT_PARAM_ROWS: the rank-major all-gather buffer (padded_unsharded_numel
                                        elements of all_gather_dtype) from the all-gather's issue to the copy-out,
                                        or until flat_param_free_all_gather_output when kept */
    dtype all_gather_dtype;          /* its elements: param_dtype (float32 without mixed precision, or forced) */
    float *reduce_scatter_input;     /* FLAT_PARAM_ROWS: the rank-major padded gradient the reduce-scatter reads */
    int copy_out_pending;            /* FLAT_PARAM_ROWS: the all-gather is in flight; its wait copies out */
    int keep_all_gather_output;      /* FLAT_PARAM_ROWS: the next copy-out leaves all_gather_output allocated (the
                                        runtime's all_gather_state, core/fsdp/fsdp.h); the copy-out clears it */
    /* FSDP2's reshard_after_forward=N (torch's post_forward_mesh_info): the group of N consecutive ranks this rank
     * is member s of (NULL: reshard_after_forward is a bool). _post_forward keeps sharded_post_forward, the rows of
     * world ranks [s W/N, (s+1) W/N) in the rank-major layout (W/N x sharded_numel elements of all_gather_dtype,
     * param_unsharded; torch's _sharded_post_forward_param_data, a narrow of all_gather_output), and backward's
     * unshard all-gathers those N slices within the group into the same all_gather_output. */
    const comm_group *post_forward_group;
    void *sharded_post_forward;
    float *grad_shard;               /* sharded gradient, NULL until the first reduce-scatter (or after zero_grad) */
    flat_param_shard_state shard_state;
    comm_handle unshard_handle;      /* the all-gather in flight, between flat_param_unshard_start and
                                        flat_param_unshard_wait */
    comm_handle reduce_handle;       /* the gradient's reduce-scatter (all-reduce when replicated) in flight */
    float *reduce_target;            /* where it lands: grad_shard, or a buffer added into grad_shard at the wait */
    int reduce_accumulate, reduce_started, reduce_status;
    int replicated;                  /* NO_SHARD: every rank keeps the whole buffer; unshard is a no-op (a view) and
                                        gradients are all-reduced instead of reduce-scattered */
    /* HYBRID_SHARD (ctx->mesh, core/comm/group.h): sharded over the shard group only, padded to a multiple of its size,
     * the chunk its shard rank's; the reduce-scattered gradient shard is then all-reduced across the replicate group
     * (the ranks holding the same chunk). NULL, NULL: sharded over the world (FULL_SHARD, SHARD_GRAD_OP). */
    const comm_group *shard_group;
    const comm_group *replicate_group;
    comm_handle replicate_handle;    /* the gradient shard's all-reduce across the replicate group, in flight */
    int offload_params;              /* CPUOffload(offload_params=True): local_shard and grad_shard live in the host
                                        pool (core/runtime/offload.h); unshard copies the shard in (h2d), the
                                        reduce-scatter's result is copied out (d2h) */
    /* mixed precision (flat_param_set_mixed_precision); all NULL / 0 without it */
    flat_param_mixed_precision mixed_precision;
    void *mp_shard;                  /* _mp_shard: sharded_numel param_dtype elements, pre_unshard to post_unshard */
    void *low_precision_full_param;  /* torch's _full_param_padded under mixed precision: padded_unsharded_numel
                                        param_dtype elements while UNSHARDED through the low-precision path */
    int unsharded_low_precision;     /* the current unshard went through the low-precision path */
    int post_unshard_pending;        /* its all-gather is in flight: post_unshard runs at the wait */
    int force_full_precision;        /* torch's _force_full_precision (state_dict): unshard the float32 master */
    void *low_precision_grad;        /* the gradient cast to reduce_dtype, read by the reduce-scatter in flight */
    void *low_precision_reduce_output; /* the reduce-scatter's reduce_dtype output, cast and added at the wait
                                          (NO_SHARD: none, the all-reduce runs in place in low_precision_grad) */
    int reducing_low_precision;      /* the reduce in flight is the reduce_dtype one (its wait casts and adds) */
    double *local_grad_l1;           /* per parameter: sum |g| of this rank's param_dtype gradient as it went into the
                                        reduce, summed over the reduces since flat_param_zero_grad (what the bound of a
                                        bfloat16 sum over ranks needs, tests/tolerances.py); NULL unless asked
                                        for (flat_param_track_grad_l1) and with mixed precision: each sum is a host
                                        wait on a GPU. Host statistics, param_count doubles, like params */
} flat_param;

/* Writes elements [first, first + count) of parameter `name` to out: how a rank fills its shard without seeing the
 * others (a value must depend only on the name and the index). */
typedef void (*flat_param_fill_fn)(const char *name, size_t first, size_t count, float *out, void *user);

/* An flat_param_fill_fn: normal(0, std) from a counter-based RNG keyed by (seed, parameter name, index), as HF
 * initialises weights; `user` points to an flat_param_normal_init. */
typedef struct flat_param_normal_init {
    uint64_t seed;
    float std;
} flat_param_normal_init;
void flat_param_fill_normal(const char *name, size_t first, size_t count, float *out, void *user);

/* numel rounded up to a multiple of world: a FlatParameter's padded_unsharded_numel (world 1 when replicated). */
size_t flat_param_padded_numel(size_t numel, size_t world);
/* Lays out the parameters and allocates a zeroed local shard; with ctx->mesh set (HYBRID_SHARD), over its shard
 * group. Returns -1 with ctx->error on a bad spec (empty or
 * repeated name, a dimension < 1, more than FLAT_PARAM_MAX_DIMS dims). */
int flat_param_init(flat_param *fp, context *ctx, const char *unit, const flat_param_tensor_spec *specs, int count);
/* The same layout unsharded on every rank (FSDP's NO_SHARD, i.e. DDP): no padding, local_shard is everything. */
int flat_param_init_replicated(flat_param *fp, context *ctx, const char *unit, const flat_param_tensor_spec *specs,
                               int count);
void flat_param_free(flat_param *fp);

/* The flat index range [begin, end) that world rank `rank` owns (padding included); everything when replicated.
 * Hybrid: the chunk of its shard rank, rank % shard group size (the mesh's layout, core/comm/group.h). A
 * FLAT_PARAM_ROWS unit has no such range (a rank holds rows of every parameter): aborts, naming the unit. */
void flat_param_shard_range(const flat_param *fp, int rank, size_t *begin, size_t *end);
/* The part of parameter `param_index` that `rank` owns, as [begin, end) within the parameter; 0 if none. Under
 * FLAT_PARAM_ROWS its rows [r c, min(d0, (r + 1) c)) as elements. */
int flat_param_param_shard_overlap(const flat_param *fp, int param_index, int rank, size_t *begin, size_t *end);
/* Where that part starts in `rank`'s local shard. */
size_t flat_param_param_shard_offset(const flat_param *fp, int param_index, int rank);
/* Index of the parameter called `name`, or -1. */
int flat_param_find_param(const flat_param *fp, const char *name);

/* out[i - begin] = value of flat element i for i in [begin, end): parameters' values, 0 in the padding. */
void flat_param_fill_flat_range(const flat_param *fp, flat_param_fill_fn fill, void *user, size_t begin, size_t end,
                                float *out);
/* Fills this rank's local shard (its chunk of the flat buffer; under FLAT_PARAM_ROWS its rows of every parameter,
 * zeros in the padding rows). */
void flat_param_fill_local_shard(flat_param *fp, flat_param_fill_fn fill, void *user);
/* The path without deferred init (torch without the meta device: the whole unit materialised on every rank, then
 * sharded): copies this rank's chunk of `full` (padded_unsharded_numel floats; FLAT_PARAM_ROWS: unpadded_numel, its
 * rows of each parameter) into the local shard. */
void flat_param_shard_from_full(flat_param *fp, const float *full);

/* SHARDED -> UNSHARDED: allocate the padded full buffer and all-gather every rank's shard into it. A no-op when
 * already UNSHARDED. Writes a ShardState `state` event with `hook`. Returns -1 with ctx->error if the collective
 * fails. */
int flat_param_unshard(flat_param *fp, const char *hook);
/* The same in two halves: allocate and issue the all-gather on stream `on` (NULL: blocking, as flat_param_unshard), the
 * state UNSHARDED at once (as torch's unshard: the views exist, the data comes when the stream is done); then the host
 * waits for it before any parameter is read (flat_param_param_view aborts while it is in flight). */
int flat_param_unshard_start(flat_param *fp, stream *on, const char *hook);
int flat_param_unshard_wait(flat_param *fp, const char *hook);
/* FLAT_PARAM_ROWS: frees an all-gather output a copy-out kept (keep_all_gather_output); nothing when there is none. */
void flat_param_free_all_gather_output(flat_param *fp);
int flat_param_unshard_pending(const flat_param *fp);
/* UNSHARDED (or SHARDED_POST_FORWARD) -> SHARDED: free the padded full buffer (or the post-forward shard). A no-op
 * when already SHARDED. */
void flat_param_reshard(flat_param *fp, const char *hook);
/* _post_forward's reshard: with a post_forward_group, UNSHARDED -> SHARDED_POST_FORWARD (the post-forward shard
 * copied out of the unsharded parameters, which are freed); without one, flat_param_reshard. */
void flat_param_reshard_after_forward(flat_param *fp, const char *hook);
/* FSDP2 (FLAT_PARAM_ROWS) only: reshard after forward onto `group` (consecutive ranks, its size dividing W; NULL:
 * fully). -1 with ctx->error for a FLAT_PARAM_FLAT unit or a group that does not divide the world. */
int flat_param_set_post_forward_group(flat_param *fp, const comm_group *group);
/* The parameter's values inside the unsharded buffer. Aborts (naming rank, unit, parameter) while SHARDED or for an
 * unknown name. */
float *flat_param_param_view(const flat_param *fp, const char *name);

/* Allocates the zeroed padded full gradient (grad_unsharded) that backward accumulates into; returns it. */
float *flat_param_alloc_full_grad(flat_param *fp);
/* The parameter's gradient inside the full gradient. Aborts when there is none or the name is unknown. */
float *flat_param_grad_view(const flat_param *fp, const char *name);
/* Reduce-scatters the full gradient (sum or mean over ranks; hybrid: over the shard group, then all-reduced across the
 * replicate group, a mean in each: the mean over every rank) and adds the result into grad_shard (on first use the
 * result is written straight into a new grad_shard, as 0 + x), then frees the full gradient. Replicated: all-reduces
 * instead. Returns -1 with ctx->error if the collective fails. */
int flat_param_reduce_scatter_grad(flat_param *fp, comm_reduce reduce);
/* The same in two halves: issue on stream `on` (NULL: blocking); then wait, add into grad_shard and free the full
 * gradient and the temporary (the full gradient stays allocated while the collective reads it). */
int flat_param_reduce_scatter_grad_start(flat_param *fp, comm_reduce reduce, stream *on);
int flat_param_reduce_scatter_grad_wait(flat_param *fp, const char *hook);
/* The sharded gradient all-gathered into the full gradient buffer (flat_param_alloc_full_grad's; zeros where no
 * gradient has arrived yet), so flat_param_grad_view reads every parameter's whole gradient: for writing gradients out,
 * never during a step. Collective. Returns -1 with ctx->error if the collective fails. */
int flat_param_gather_grad(flat_param *fp);
/* Frees the full gradient buffer (after flat_param_gather_grad). */
void flat_param_free_full_grad(flat_param *fp);
/* Frees the sharded gradient (torch's zero_grad(set_to_none=True)). */
void flat_param_zero_grad(flat_param *fp);

/* ---- CPU offload (lab 09, core/runtime/offload.h) ---- */

/* Moves the local shard (and the sharded gradient, if any) into the host pool and turns offload on: from now on
 * flat_param_unshard copies the shard into its chunk of the device's unsharded buffer (h2d) and all-gathers in place,
 * and the reduce-scatter lands in a device buffer that is copied to the host gradient shard (d2h; accumulated on the
 * host). Returns -1 with ctx->error for a replicated (NO_SHARD) unit, which this runtime does not offload. */
int flat_param_offload_params(flat_param *fp);
/* The pool that holds this unit's shards (and its optimizer state): the host pool when offloaded, else the device's. */
mem_tracker *flat_param_shard_pool(const flat_param *fp);
/* The device that holds the unit's shards: the host (ctx->host, a CPU device) when offloaded, else the rank's. */
device *flat_param_shard_device(const flat_param *fp);
/* Turns mixed precision on for this FlatParameter (before its first unshard, and before flat_param_offload_params).
 * Every strategy takes it: NO_SHARD casts the whole unit into its _mp_shard and all-reduces the gradient in
 * reduce_dtype, HYBRID_SHARD all-reduces the reduce_dtype gradient shard across the replicate group, CPU offload copies
 * the float32 shard h2d and casts it on the device (torch's order). -1 with ctx->error for a dtype other than float32
 * or bfloat16, a buffer_dtype other than float32, or a unit already unsharded or holding a gradient. */
int flat_param_set_mixed_precision(flat_param *fp, const flat_param_mixed_precision *mixed_precision);
/* Asks for local_grad_l1 (a diagnostic: GRADS with mixed precision). Off by default: on a GPU each parameter's sum
 * is a read back to the host, per micro-batch. */
void flat_param_track_grad_l1(flat_param *fp);
/* Whether mixed precision changes anything (some dtype is not float32). */
int flat_param_mixed_precision_enabled(const flat_param_mixed_precision *mixed_precision);

const char *flat_param_shard_state_name(flat_param_shard_state state);

#endif
