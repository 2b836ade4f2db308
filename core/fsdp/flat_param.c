/* flat_param.c — FlatParameter layout, sharding, unshard / reshard, gradient reduce-scatter. See flat_param.h. */
#include "core/fsdp/flat_param.h"

#include "core/runtime/offload.h"
#include "core/base/rng.h"
#include "core/runtime/world.h"
#include "core/base/error.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *flat_param_shard_state_name(flat_param_shard_state state) {
    return state == FLAT_PARAM_UNSHARDED              ? "UNSHARDED"
           : state == FLAT_PARAM_SHARDED_POST_FORWARD ? "SHARDED_POST_FORWARD"
                                                      : "SHARDED";
}

void flat_param_fill_normal(const char *name, size_t first, size_t count, float *out, void *user) {
    const flat_param_normal_init *init = user;
    rng_fill_normal(init->seed, rng_stream_of(name), first, count, 0.0f, init->std, out);
}

static int bad_spec(flat_param *fp, int index, const char *why) {
    snprintf(fp->ctx->error, sizeof fp->ctx->error, "rank %d: unit '%s': parameter %d: %s", fp->ctx->rank, fp->unit,
             index, why);
    free(fp->params);
    fp->params = NULL;
    return -1;
}

/* FSDP2's layout (flat_param.h): every parameter cut on dim 0 into W pieces of c = ceil(d0 / W) rows; a rank's
 * local shard is its c rows of each parameter, back to back, so the all-gather's output is rank-major. */
static int rows_layout(flat_param *fp, size_t world) {
    fp->layout = FLAT_PARAM_ROWS;
    fp->rows = calloc((size_t)fp->param_count, sizeof *fp->rows); /* layout metadata, not tensor memory */
    if (fp->rows == NULL)
        return error_set(fp->ctx->error, sizeof fp->ctx->error, "rank %d: unit '%s': out of host memory for the "
                         "layout of %d parameters", fp->ctx->rank, fp->unit, fp->param_count);
    size_t shard_offset = 0;
    for (int i = 0; i < fp->param_count; i++) {
        flat_param_param_info *info = &fp->params[i];
        size_t rows = (size_t)info->shape[0];
        info->row_numel = info->numel / rows;
        /* EXERCISE 10-rows BEGIN: FSDP2: c = ceil(d0 / W) rows of this parameter per rank, padding rows included */
        info->shard_rows = (rows + world - 1) / world;
        /* EXERCISE 10-rows END */
        info->shard_offset = shard_offset;
        shard_offset += info->shard_rows * info->row_numel;
        fp->rows[i] = (device_rows_param){.offset = info->offset, .numel = info->numel,
                                          .shard_offset = info->shard_offset,
                                          .shard_numel = info->shard_rows * info->row_numel};
    }
    fp->sharded_numel = shard_offset;
    fp->padded_unsharded_numel = shard_offset * world; /* the all-gather buffer, padding rows included */
    fp->full_numel = fp->unpadded_numel;               /* each parameter unpadded, at FSDP1's offsets */
    return 0;
}

static int init_layout(flat_param *fp, context *ctx, const char *unit, const flat_param_tensor_spec *specs, int count,
                       int replicated) {
    memset(fp, 0, sizeof *fp);
    fp->replicated = replicated;
    fp->ctx = ctx;
    snprintf(fp->unit, sizeof fp->unit, "%s", unit);
    if (count < 1) {
        snprintf(ctx->error, sizeof ctx->error, "rank %d: unit '%s': no parameters to flatten", ctx->rank, unit);
        return -1;
    }
    fp->params = calloc((size_t)count, sizeof *fp->params); /* layout metadata, not tensor memory */
    if (fp->params == NULL) world_fatal(ctx, "unit '%s': out of memory for %d parameter records", unit, count);
    fp->param_count = count;

    size_t offset = 0;
    for (int i = 0; i < count; i++) {
        const flat_param_tensor_spec *spec = &specs[i];
        flat_param_param_info *info = &fp->params[i];
        if (spec->name == NULL || spec->name[0] == '\0') return bad_spec(fp, i, "empty name");
        if (strlen(spec->name) >= FLAT_PARAM_NAME_MAX) return bad_spec(fp, i, "name too long");
        for (int j = 0; j < i; j++)
            if (strcmp(fp->params[j].name, spec->name) == 0) return bad_spec(fp, i, "name registered twice");
        if (spec->ndim < 1 || spec->ndim > FLAT_PARAM_MAX_DIMS) return bad_spec(fp, i, "ndim must be 1..4");
        snprintf(info->name, sizeof info->name, "%s", spec->name);
        info->ndim = spec->ndim;
        info->numel = 1;
        for (int d = 0; d < spec->ndim; d++) {
            if (spec->shape[d] < 1) return bad_spec(fp, i, "a dimension is < 1");
            info->shape[d] = spec->shape[d];
            info->numel *= (size_t)spec->shape[d];
        }
        info->offset = offset;
        offset += info->numel;
    }
    size_t world = replicated ? 1 : (size_t)ctx->world_size;
    if (!replicated && ctx->mesh != NULL) { /* HYBRID_SHARD: shard over the shard group only */
        fp->shard_group = &ctx->mesh->shard;
        fp->replicate_group = &ctx->mesh->replicate;
        world = (size_t)fp->shard_group->size;
    }
    fp->unpadded_numel = offset;
    fp->padded_unsharded_numel = flat_param_padded_numel(offset, world);
    fp->sharded_numel = fp->padded_unsharded_numel / world;
    fp->full_numel = fp->padded_unsharded_numel;
    if (ctx->per_parameter_sharding && !replicated) {
        if (fp->shard_group != NULL) {
            snprintf(ctx->error, sizeof ctx->error, "rank %d: unit '%s': per-parameter sharding (FSDP2) over a "
                     "HYBRID_SHARD mesh is not supported; use FULL_SHARD or SHARD_GRAD_OP", ctx->rank, unit);
            free(fp->params);
            fp->params = NULL;
            return -1;
        }
        if (rows_layout(fp, world) != 0) {
            free(fp->params);
            fp->params = NULL;
            return -1;
        }
    }
    fp->pad_numel = fp->padded_unsharded_numel - offset;

    char owner[MEM_OWNER_MAX];
    snprintf(owner, sizeof owner, "%s._local_shard", unit);
    fp->local_shard = mem_alloc(&ctx->mem, fp->sharded_numel * sizeof(float), MEM_PARAM_SHARD, owner);
    fp->shard_state = FLAT_PARAM_SHARDED;
    return 0;
}

size_t flat_param_padded_numel(size_t numel, size_t world) {
    /* EXERCISE 01-padding BEGIN: round numel up to the next multiple of world (the FlatParameter's padded length) */
    return (numel + world - 1) / world * world;
    /* EXERCISE 01-padding END */
}

int flat_param_init(flat_param *fp, context *ctx, const char *unit, const flat_param_tensor_spec *specs, int count) {
    return init_layout(fp, ctx, unit, specs, count, 0);
}

int flat_param_init_replicated(flat_param *fp, context *ctx, const char *unit, const flat_param_tensor_spec *specs,
                               int count) {
    return init_layout(fp, ctx, unit, specs, count, 1);
}

void flat_param_free(flat_param *fp) {
    mem_tracker *mem = &fp->ctx->mem;
    mem_free(mem, fp->full_grad_padded);
    mem_free(mem, fp->all_gather_output);
    mem_free(mem, fp->sharded_post_forward);
    mem_free(mem, fp->reduce_scatter_input);
    mem_free(flat_param_shard_pool(fp), fp->grad_shard);
    if (fp->full_param_padded != fp->local_shard) mem_free(mem, fp->full_param_padded); /* NO_SHARD: a view */
    mem_free(flat_param_shard_pool(fp), fp->local_shard);
    if (fp->low_precision_full_param == fp->mp_shard) fp->mp_shard = NULL; /* NO_SHARD: one buffer, both roles */
    mem_free(mem, fp->mp_shard);
    mem_free(mem, fp->low_precision_full_param);
    mem_free(mem, fp->low_precision_grad);
    mem_free(mem, fp->low_precision_reduce_output);
    free(fp->local_grad_l1);
    free(fp->params);
    free(fp->rows);
    memset(fp, 0, sizeof *fp);
}

void flat_param_shard_range(const flat_param *fp, int rank, size_t *begin, size_t *end) {
    if (fp->layout == FLAT_PARAM_ROWS)
        world_fatal(fp->ctx, "unit '%s': per-parameter (FSDP2) shards are no flat range of rank %d; use "
                    "flat_param_param_shard_overlap per parameter", fp->unit, rank);
    int shard_rank = fp->shard_group != NULL ? rank % fp->shard_group->size : rank;
    /* EXERCISE 01-range BEGIN: rank shard_rank's chunk of the padded flat buffer, [begin, end) */
    *begin = fp->replicated ? 0 : (size_t)shard_rank * fp->sharded_numel;
    *end = *begin + fp->sharded_numel;
    /* EXERCISE 01-range END */
}

/* FLAT_PARAM_ROWS: the rows of parameter `info` that `rank` holds, [first, last), clamped to the parameter. */
static void held_rows(const flat_param_param_info *info, int rank, size_t *first, size_t *last) {
    size_t rows = (size_t)info->shape[0];
    size_t begin = (size_t)rank * info->shard_rows, end = begin + info->shard_rows;
    *first = begin < rows ? begin : rows;
    *last = end < rows ? end : rows;
}

int flat_param_param_shard_overlap(const flat_param *fp, int param_index, int rank, size_t *begin, size_t *end) {
    const flat_param_param_info *info = &fp->params[param_index];
    if (fp->layout == FLAT_PARAM_ROWS) {
        size_t first, last;
        held_rows(info, rank, &first, &last);
        *begin = first * info->row_numel;
        *end = last * info->row_numel;
        return first < last;
    }
    size_t shard_begin, shard_end;
    flat_param_shard_range(fp, rank, &shard_begin, &shard_end);
    size_t first = info->offset > shard_begin ? info->offset : shard_begin;
    size_t last = info->offset + info->numel < shard_end ? info->offset + info->numel : shard_end;
    if (first >= last) {
        *begin = *end = 0;
        return 0;
    }
    *begin = first - info->offset;
    *end = last - info->offset;
    return 1;
}

size_t flat_param_param_shard_offset(const flat_param *fp, int param_index, int rank) {
    if (fp->layout == FLAT_PARAM_ROWS) return fp->params[param_index].shard_offset;
    size_t begin, end, shard_begin, shard_end;
    flat_param_shard_range(fp, rank, &shard_begin, &shard_end);
    if (!flat_param_param_shard_overlap(fp, param_index, rank, &begin, &end)) return 0;
    return fp->params[param_index].offset + begin - shard_begin;
}

int flat_param_find_param(const flat_param *fp, const char *name) {
    for (int i = 0; i < fp->param_count; i++)
        if (strcmp(fp->params[i].name, name) == 0) return i;
    return -1;
}

void flat_param_fill_flat_range(const flat_param *fp, flat_param_fill_fn fill, void *user, size_t begin, size_t end,
                                float *out) {
    memset(out, 0, (end - begin) * sizeof *out); /* the padding, and anything no parameter covers */
    for (int i = 0; i < fp->param_count; i++) {
        const flat_param_param_info *info = &fp->params[i];
        size_t first = info->offset > begin ? info->offset : begin;
        size_t last = info->offset + info->numel < end ? info->offset + info->numel : end;
        if (first < last) fill(info->name, first - info->offset, last - first, out + (first - begin), user);
    }
}

device *flat_param_shard_device(const flat_param *fp) {
    return fp->offload_params ? &fp->ctx->host : &fp->ctx->device;
}

/* FLAT_PARAM_ROWS: this rank's rows of every parameter at their shard offsets, zeros in the padding rows. */
static void fill_rows(const flat_param *fp, flat_param_fill_fn fill, void *user, float *out) {
    memset(out, 0, fp->sharded_numel * sizeof *out);
    for (int i = 0; i < fp->param_count; i++) {
        size_t begin, end;
        if (flat_param_param_shard_overlap(fp, i, fp->ctx->rank, &begin, &end))
            fill(fp->params[i].name, begin, end - begin, out + fp->params[i].shard_offset, user);
    }
}

void flat_param_fill_local_shard(flat_param *fp, flat_param_fill_fn fill, void *user) {
    context *ctx = fp->ctx;
    size_t begin = 0, end = fp->sharded_numel;
    if (fp->layout != FLAT_PARAM_ROWS) flat_param_shard_range(fp, ctx->rank, &begin, &end);
    device *d = flat_param_shard_device(fp);
    if (d->kind == DEVICE_CPU) {
        if (fp->layout == FLAT_PARAM_ROWS) fill_rows(fp, fill, user, fp->local_shard);
        else flat_param_fill_flat_range(fp, fill, user, begin, end, fp->local_shard);
        return;
    }
    /* A GPU shard: the values are drawn on the host (the fill functions are host code), then copied over. */
    char owner[MEM_OWNER_MAX];
    snprintf(owner, sizeof owner, "%s.init_staging", fp->unit);
    float *staging = mem_alloc_uninitialized(offload_host_pool(ctx), (end - begin) * sizeof(float), MEM_WORKSPACE,
                                             owner);
    if (fp->layout == FLAT_PARAM_ROWS) fill_rows(fp, fill, user, staging);
    else flat_param_fill_flat_range(fp, fill, user, begin, end, staging);
    d->copy(d, fp->local_shard, staging, (end - begin) * sizeof(float), DEVICE_H2D);
    d->synchronize(d);
    mem_free(offload_host_pool(ctx), staging);
}

void flat_param_shard_from_full(flat_param *fp, const float *full) {
    if (fp->layout == FLAT_PARAM_ROWS) {
        device *d = flat_param_shard_device(fp);
        d->zero(d, fp->local_shard, fp->sharded_numel * sizeof(float)); /* the padding rows */
        for (int i = 0; i < fp->param_count; i++) {
            size_t begin, end;
            if (flat_param_param_shard_overlap(fp, i, fp->ctx->rank, &begin, &end))
                d->copy(d, fp->local_shard + fp->params[i].shard_offset, full + fp->params[i].offset + begin,
                        (end - begin) * sizeof(float), device_from_host(d));
        }
        return;
    }
    size_t begin, end;
    flat_param_shard_range(fp, fp->ctx->rank, &begin, &end);
    device *d = flat_param_shard_device(fp);
    d->copy(d, fp->local_shard, full + begin, (end - begin) * sizeof(float),
            device_from_host(d));
}

static void shard_state_event(flat_param *fp, flat_param_shard_state from, flat_param_shard_state to,
                              const char *hook) {
    trace_state(&fp->ctx->trace, fp->unit, "ShardState", flat_param_shard_state_name(from),
                flat_param_shard_state_name(to), hook);
}

static int unshard_low_precision_start(flat_param *fp, stream *on, const char *hook);

/* ---------------------------------------------------------------- FSDP2's copy-in and copy-out (FLAT_PARAM_ROWS) */

/* FSDP2's two copies between the rank-major padded layout (rank r's slice at r * sharded_numel, its rows of parameter
 * p at p's shard offset) and the unpadded full buffer (p at its offset). to_full: the copy-out of an all-gather
 * (torch's split_with_sizes_copy; the padding rows stay behind); else the copy-in of foreach_reduce (torch's
 * chunk_cat), each rank's rows padded with zero rows to c, so the reduce-scatter hands rank r exactly its local
 * shard's layout. The rank-major buffer holds elements of `type` (mixed precision: param_dtype gathered, reduce_dtype
 * reduced), the full buffer float32 (what the layers read and write): a bfloat16 copy-out widens (exact), a bfloat16
 * copy-in rounds (the gradient is already rounded to param_dtype's values, so nothing changes when both are
 * bfloat16). Every piece of every rank in one device call (device.h's rows_copy: one launch on a GPU). */
/* The same for world ranks [first_rank, first_rank + ranks) only, rank_major starting at first_rank's slice. */
static void rows_copy_ranks(const flat_param *fp, void *rank_major, dtype type, float *full, int to_full,
                            int first_rank, int ranks) {
    fp->ctx->device.rows_copy(&fp->ctx->device, rank_major, type, full, to_full, fp->rows, fp->param_count,
                              fp->sharded_numel, first_rank, ranks);
}

static void rows_copy(const flat_param *fp, void *rank_major, dtype type, float *full, int to_full) {
    rows_copy_ranks(fp, rank_major, type, full, to_full, 0, fp->ctx->world_size);
}

/* Once the all-gather is done: the unsharded parameters allocated (torch's alloc_storage in
 * foreach_all_gather_copy_out), every rank's rows copied into them, the rank-major buffer freed, or kept when the
 * runtime asked (keep_all_gather_output: torch keeps it until the next unit's copy-out in forward). */
static void all_gather_copy_out(flat_param *fp) {
    context *ctx = fp->ctx;
    double start_us = trace_now_us(&ctx->trace);
    fp->copy_out_pending = 0;
    char owner[MEM_OWNER_MAX];
    snprintf(owner, sizeof owner, "%s._full_param_padded", fp->unit);
    /* Unzeroed: the rows of all ranks cover every element of every parameter. */
    fp->full_param_padded =
        mem_alloc_uninitialized(&ctx->mem, fp->full_numel * sizeof(float), MEM_PARAM_UNSHARDED, owner);
    rows_copy(fp, fp->all_gather_output, fp->all_gather_dtype, fp->full_param_padded, 1);
    if (!fp->keep_all_gather_output) flat_param_free_all_gather_output(fp);
    fp->keep_all_gather_output = 0;
    mem_free(&ctx->mem, fp->sharded_post_forward); /* backward's all-gather read it until now */
    fp->sharded_post_forward = NULL;
    snprintf(owner, sizeof owner, "%s.all_gather_copy_out", fp->unit);
    trace_compute(&ctx->trace, owner, fp->unit, "copy_out", start_us, trace_now_us(&ctx->trace) - start_us);
}

/* FSDP2's unshard (foreach_all_gather): every rank's local shard, already its padded rows of each parameter back to
 * back, all-gathered into the rank-major all_gather_output; the copy-out follows at once (blocking) or at the wait.
 * With mixed precision (torch's MixedPrecisionPolicy) the buffer holds param_dtype elements: the copy-in casts the
 * float32 rows into this rank's slice of it (torch's all_gather_input, a view of all_gather_output) and the
 * all-gather runs in place, moving param_dtype's bytes; there is no _mp_shard (FSDP1's). CPU offload: the float32
 * rows come from the host first (h2d; straight into the slice in float32, into a transient device shard to cast
 * from with a low-precision param_dtype, as FSDP1's pre_unshard). Float32 without offload: the local shard is sent
 * as it is. state_dict's force_full_precision gathers the float32 master. */
static int unshard_rows_start(flat_param *fp, stream *on, const char *hook) {
    context *ctx = fp->ctx;
    if (fp->all_gather_output != NULL)
        return error_set(ctx->error, sizeof ctx->error, "rank %d: unit '%s': unshard in %s while the output of its "
                         "previous all-gather is still kept (free it first: flat_param_free_all_gather_output)",
                         ctx->rank, fp->unit, hook);
    flat_param_shard_state from = fp->shard_state;
    if (from == FLAT_PARAM_SHARDED_POST_FORWARD && fp->force_full_precision) flat_param_reshard(fp, hook);
    from = fp->shard_state;
    int post_forward = from == FLAT_PARAM_SHARDED_POST_FORWARD;
    dtype type = post_forward ? fp->all_gather_dtype
                 : fp->force_full_precision ? DTYPE_FLOAT32 : fp->mixed_precision.param_dtype;
    size_t element = dtype_size(type), shard_bytes = fp->sharded_numel * sizeof(float);
    char owner[MEM_OWNER_MAX];
    snprintf(owner, sizeof owner, "%s.all_gather_output", fp->unit);
    fp->all_gather_output = mem_alloc_uninitialized_typed(&ctx->mem, fp->padded_unsharded_numel * element,
                                                          MEM_PARAM_UNSHARDED, type, owner);
    fp->all_gather_dtype = type;
    const void *input = fp->local_shard;
    const comm_group *group = NULL;
    if (post_forward) { /* reshard_after_forward=N: the N slices of the group make the whole rank-major buffer */
        input = fp->sharded_post_forward;
        group = fp->post_forward_group;
    } else if (type != DTYPE_FLOAT32 || fp->offload_params) { /* the copy-in: into this rank's slice, in place */
        double start_us = trace_now_us(&ctx->trace);
        char *slice = (char *)fp->all_gather_output + (size_t)ctx->rank * fp->sharded_numel * element;
        const float *rows = fp->local_shard;
        float *on_device = NULL;
        snprintf(owner, sizeof owner, "%s._local_shard", fp->unit);
        if (fp->offload_params && type == DTYPE_FLOAT32) {
            offload_copy(ctx, slice, fp->local_shard, shard_bytes, OFFLOAD_H2D, fp->unit, owner, NULL);
        } else if (fp->offload_params) {
            on_device = mem_alloc_uninitialized(&ctx->mem, shard_bytes, MEM_PARAM_SHARD, owner);
            offload_copy(ctx, on_device, fp->local_shard, shard_bytes, OFFLOAD_H2D, fp->unit, owner, NULL);
            rows = on_device;
        }
        if (type != DTYPE_FLOAT32)
            ctx->device.convert(&ctx->device, slice, type, rows, DTYPE_FLOAT32, fp->sharded_numel);
        mem_free(&ctx->mem, on_device);
        input = slice;
        snprintf(owner, sizeof owner, "%s.all_gather_copy_in", fp->unit);
        trace_compute(&ctx->trace, owner, fp->unit, "copy_in", start_us, trace_now_us(&ctx->trace) - start_us);
    }
    if (comm_all_gather_typed(ctx, group, on, input, fp->all_gather_output, fp->padded_unsharded_numel, type,
                              fp->unit, &fp->unshard_handle) != 0) {
        mem_free(&ctx->mem, fp->all_gather_output);
        fp->all_gather_output = NULL;
        return -1;
    }
    fp->shard_state = FLAT_PARAM_UNSHARDED;
    shard_state_event(fp, from, FLAT_PARAM_UNSHARDED, hook);
    if (on == NULL) all_gather_copy_out(fp);
    else fp->copy_out_pending = 1;
    return 0;
}

/* foreach_reduce's copy-in: the full gradient into a rank-major reduce_scatter_input of `type` elements (reduce_dtype),
 * then the full gradient is freed (torch drops the unsharded gradients once copied in). Returns the buffer. */
static void *reduce_scatter_copy_in(flat_param *fp, dtype type) {
    context *ctx = fp->ctx;
    double start_us = trace_now_us(&ctx->trace);
    char owner[MEM_OWNER_MAX];
    snprintf(owner, sizeof owner, "%s.reduce_scatter_input", fp->unit);
    void *input = mem_alloc_uninitialized_typed(&ctx->mem, fp->padded_unsharded_numel * dtype_size(type),
                                                MEM_GRAD_UNSHARDED, type, owner);
    rows_copy(fp, input, type, fp->full_grad_padded, 0);
    flat_param_free_full_grad(fp);
    snprintf(owner, sizeof owner, "%s.reduce_scatter_copy_in", fp->unit);
    trace_compute(&ctx->trace, owner, fp->unit, "copy_in", start_us, trace_now_us(&ctx->trace) - start_us);
    return input;
}

int flat_param_unshard_start(flat_param *fp, stream *on, const char *hook) {
    if (fp->shard_state == FLAT_PARAM_UNSHARDED) return 0;
    if (fp->layout == FLAT_PARAM_ROWS) return unshard_rows_start(fp, on, hook); /* FSDP2, any param_dtype */
    if (fp->mixed_precision.param_dtype != DTYPE_FLOAT32 && !fp->force_full_precision)
        return unshard_low_precision_start(fp, on, hook);
    if (fp->replicated) { /* NO_SHARD: the local buffer already is the whole unit */
        fp->full_param_padded = fp->local_shard;
        fp->shard_state = FLAT_PARAM_UNSHARDED;
        shard_state_event(fp, FLAT_PARAM_SHARDED, FLAT_PARAM_UNSHARDED, hook);
        return 0;
    }
    char owner[MEM_OWNER_MAX];
    snprintf(owner, sizeof owner, "%s._full_param_padded", fp->unit);
    /* Unzeroed: the all-gather writes every element (every rank's shard, padding included) before any read. */
    fp->full_param_padded =
        mem_alloc_uninitialized(&fp->ctx->mem, fp->padded_unsharded_numel * sizeof(float), MEM_PARAM_UNSHARDED, owner);
    const float *shard = fp->local_shard;
    if (fp->offload_params) { /* h2d into this rank's chunk; the all-gather then runs in place (comm.c) */
        size_t begin, end;
        flat_param_shard_range(fp, fp->ctx->rank, &begin, &end);
        float *chunk = fp->full_param_padded + begin;
        snprintf(owner, sizeof owner, "%s._local_shard", fp->unit);
        /* EXERCISE 09-h2d BEGIN: copy the host shard (h2d) into this rank's chunk; the all-gather sends it there */
        offload_copy(fp->ctx, chunk, fp->local_shard, fp->sharded_numel * sizeof(float), OFFLOAD_H2D, fp->unit,
                     owner, NULL);
        shard = chunk;
        /* EXERCISE 09-h2d END */
    }
    /* In the world, or (hybrid) in the shard group; on NULL: blocking. */
    int status = comm_all_gather_typed(fp->ctx, fp->shard_group, on, shard, fp->full_param_padded,
                                       fp->padded_unsharded_numel, DTYPE_FLOAT32, fp->unit, &fp->unshard_handle);
    if (status != 0) {
        mem_free(&fp->ctx->mem, fp->full_param_padded);
        fp->full_param_padded = NULL;
        return -1;
    }
    fp->shard_state = FLAT_PARAM_UNSHARDED;
    shard_state_event(fp, FLAT_PARAM_SHARDED, FLAT_PARAM_UNSHARDED, hook);
    return 0;
}

static void post_unshard(flat_param *fp);

int flat_param_unshard_wait(flat_param *fp, const char *hook) {
    int status = comm_wait(fp->ctx, &fp->unshard_handle, hook);
    if (status == 0 && fp->post_unshard_pending) post_unshard(fp);
    if (status == 0 && fp->copy_out_pending) all_gather_copy_out(fp);
    return status;
}

int flat_param_unshard_pending(const flat_param *fp) { return fp->unshard_handle.active; }

void flat_param_free_all_gather_output(flat_param *fp) {
    mem_free(&fp->ctx->mem, fp->all_gather_output);
    fp->all_gather_output = NULL;
}

int flat_param_unshard(flat_param *fp, const char *hook) { return flat_param_unshard_start(fp, NULL, hook); }

void flat_param_reshard(flat_param *fp, const char *hook) {
    if (fp->shard_state == FLAT_PARAM_SHARDED) return;
    if (fp->shard_state == FLAT_PARAM_SHARDED_POST_FORWARD) { /* never used in backward: the local shard suffices */
        mem_free(&fp->ctx->mem, fp->sharded_post_forward);
        fp->sharded_post_forward = NULL;
        fp->shard_state = FLAT_PARAM_SHARDED;
        shard_state_event(fp, FLAT_PARAM_SHARDED_POST_FORWARD, FLAT_PARAM_SHARDED, hook);
        return;
    }
    if (flat_param_unshard_pending(fp)) /* the all-gather still writes into the buffer */
        world_fatal(fp->ctx, "unit '%s': resharded in %s while its all-gather (seq %llu) is in flight; wait first",
                  fp->unit, hook, (unsigned long long)fp->unshard_handle.seq);
    if (fp->full_param_padded != fp->local_shard) mem_free(&fp->ctx->mem, fp->full_param_padded); /* NO_SHARD: a view */
    fp->full_param_padded = NULL;
    if (fp->unsharded_low_precision) { /* the param_dtype buffer goes with the float32 copy made from it */
        if (fp->low_precision_full_param == fp->mp_shard) fp->mp_shard = NULL; /* NO_SHARD: torch's post_reshard */
        mem_free(&fp->ctx->mem, fp->low_precision_full_param);
        fp->low_precision_full_param = NULL;
        fp->unsharded_low_precision = 0;
    }
    fp->shard_state = FLAT_PARAM_SHARDED;
    shard_state_event(fp, FLAT_PARAM_UNSHARDED, FLAT_PARAM_SHARDED, hook);
}

int flat_param_set_post_forward_group(flat_param *fp, const comm_group *group) {
    context *ctx = fp->ctx;
    if (group != NULL && (fp->layout != FLAT_PARAM_ROWS || ctx->world_size % group->size != 0))
        return error_set(ctx->error, sizeof ctx->error, "rank %d: unit '%s': reshard_after_forward=%d needs FSDP2's "
                         "per-parameter rows (FSDP_VERSION=2) and a group size dividing the world size %d",
                         ctx->rank, fp->unit, group->size, ctx->world_size);
    fp->post_forward_group = group;
    return 0;
}

/* torch's FSDPParam.to_sharded_post_forward: this rank keeps its group's slice s of the rank-major all-gather buffer
 * (world ranks [s W/N, (s+1) W/N), their padded rows), made again from the unsharded parameters (exact: they hold
 * all_gather_dtype's values), then the parameters are freed. */
void flat_param_reshard_after_forward(flat_param *fp, const char *hook) {
    if (fp->post_forward_group == NULL || fp->shard_state != FLAT_PARAM_UNSHARDED) {
        flat_param_reshard(fp, hook);
        return;
    }
    context *ctx = fp->ctx;
    if (flat_param_unshard_pending(fp))
        world_fatal(ctx, "unit '%s': resharded in %s while its all-gather (seq %llu) is in flight; wait first",
                    fp->unit, hook, (unsigned long long)fp->unshard_handle.seq);
    int ranks = ctx->world_size / fp->post_forward_group->size;
    int first_rank = fp->post_forward_group->rank * ranks;
    char owner[MEM_OWNER_MAX];
    snprintf(owner, sizeof owner, "%s._sharded_post_forward_param_data", fp->unit);
    size_t element = dtype_size(fp->all_gather_dtype);
    fp->sharded_post_forward = mem_alloc_uninitialized_typed(&ctx->mem, (size_t)ranks * fp->sharded_numel * element,
                                                             MEM_PARAM_UNSHARDED, fp->all_gather_dtype, owner);
    rows_copy_ranks(fp, fp->sharded_post_forward, fp->all_gather_dtype, fp->full_param_padded, 0, first_rank, ranks);
    mem_free(&ctx->mem, fp->full_param_padded);
    fp->full_param_padded = NULL;
    fp->shard_state = FLAT_PARAM_SHARDED_POST_FORWARD;
    shard_state_event(fp, FLAT_PARAM_UNSHARDED, FLAT_PARAM_SHARDED_POST_FORWARD, hook);
}

static const flat_param_param_info *param_or_abort(const flat_param *fp, const char *name) {
    int index = flat_param_find_param(fp, name);
    if (index < 0) world_fatal(fp->ctx, "unit '%s': no parameter named '%s'", fp->unit, name);
    return &fp->params[index];
}

float *flat_param_param_view(const flat_param *fp, const char *name) {
    const flat_param_param_info *info = param_or_abort(fp, name);
    if (fp->shard_state != FLAT_PARAM_UNSHARDED)
        world_fatal(fp->ctx, "unit '%s': parameter '%s' used while the unit is SHARDED; unshard it first", fp->unit,
                  name);
    if (flat_param_unshard_pending(fp))
        world_fatal(fp->ctx, "unit '%s': parameter '%s' used while its all-gather (seq %llu) is in flight; wait first",
                  fp->unit, name, (unsigned long long)fp->unshard_handle.seq);
    /* EXERCISE 02-unshard BEGIN: the parameter's view into the unsharded (all-gathered) flat buffer */
    return fp->full_param_padded + info->offset;
    /* EXERCISE 02-unshard END */
}

float *flat_param_alloc_full_grad(flat_param *fp) {
    if (fp->full_grad_padded != NULL) return fp->full_grad_padded;
    char owner[MEM_OWNER_MAX];
    snprintf(owner, sizeof owner, "%s.full_grad_padded", fp->unit);
    fp->full_grad_padded =
        mem_alloc(&fp->ctx->mem, fp->full_numel * sizeof(float), MEM_GRAD_UNSHARDED, owner);
    return fp->full_grad_padded;
}

float *flat_param_grad_view(const flat_param *fp, const char *name) {
    const flat_param_param_info *info = param_or_abort(fp, name);
    if (fp->full_grad_padded == NULL)
        world_fatal(fp->ctx, "unit '%s': gradient of '%s' used before flat_param_alloc_full_grad", fp->unit, name);
    return fp->full_grad_padded + info->offset;
}


static int reduce_low_precision_start(flat_param *fp, comm_reduce reduce, stream *on);
static int reduce_low_precision_wait(flat_param *fp, const char *hook);

int flat_param_reduce_scatter_grad_start(flat_param *fp, comm_reduce reduce, stream *on) {
    context *ctx = fp->ctx;
    if (fp->full_grad_padded == NULL)
        world_fatal(ctx, "unit '%s': reduce-scatter of a gradient that was never allocated", fp->unit);
    if (fp->reduce_handle.active)
        world_fatal(ctx, "unit '%s': a second reduce-scatter issued before the first (seq %llu) was waited for",
                  fp->unit, (unsigned long long)fp->reduce_handle.seq);
    if (flat_param_mixed_precision_enabled(&fp->mixed_precision)) {
        /* The gradient torch's autograd leaves: param_dtype values (backward ran in float32 here, see the header). */
        device *d = &ctx->device;
        d->round_to(d, fp->full_grad_padded, fp->full_numel, fp->mixed_precision.param_dtype); /* FSDP2: unpadded */
        /* A diagnostic, asked for (flat_param_track_grad_l1): on a GPU each sum is a host wait. */
        for (int i = 0; fp->local_grad_l1 != NULL && i < fp->param_count; i++)
            fp->local_grad_l1[i] += d->sum_abs(d, fp->full_grad_padded + fp->params[i].offset, fp->params[i].numel);
        if (fp->mixed_precision.reduce_dtype != DTYPE_FLOAT32) return reduce_low_precision_start(fp, reduce, on);
    }
    char owner[MEM_OWNER_MAX];
    /* The first gradient lands straight in grad_shard; later ones (accumulation) need a buffer to add from. Either
     * starts unzeroed: the reduce-scatter (or, replicated, the copy after the all-reduce) writes all of it. */
    fp->reduce_accumulate = fp->grad_shard != NULL;
    size_t bytes = fp->sharded_numel * sizeof(float);
    if (fp->offload_params) { /* the result lands on the device; the wait copies it to the host's grad_shard */
        snprintf(owner, sizeof owner, "%s.grad_shard", fp->unit);
        if (fp->grad_shard == NULL)
            fp->grad_shard = mem_alloc_uninitialized(flat_param_shard_pool(fp), bytes, MEM_GRAD_SHARD, owner);
        snprintf(owner, sizeof owner, "%s.grad_shard_device", fp->unit);
        fp->reduce_target = mem_alloc_uninitialized(&ctx->mem, bytes, MEM_GRAD_SHARD, owner);
    } else if (fp->reduce_accumulate) {
        snprintf(owner, sizeof owner, "%s.reduce_scatter_output", fp->unit);
        fp->reduce_target = mem_alloc_uninitialized(&ctx->mem, bytes, MEM_COMM_BUFFER, owner);
    } else {
        snprintf(owner, sizeof owner, "%s.grad_shard", fp->unit);
        fp->reduce_target = fp->grad_shard = mem_alloc_uninitialized(&ctx->mem, bytes, MEM_GRAD_SHARD, owner);
    }
    int status;
    if (fp->layout == FLAT_PARAM_ROWS) fp->reduce_scatter_input = reduce_scatter_copy_in(fp, DTYPE_FLOAT32);
    const float *input = fp->layout == FLAT_PARAM_ROWS ? fp->reduce_scatter_input : fp->full_grad_padded;
    if (fp->replicated) /* NO_SHARD: the whole gradient all-reduced, copied into grad_shard at the wait */
        status = on ? comm_all_reduce_start(ctx, on, fp->full_grad_padded, fp->padded_unsharded_numel, reduce,
                                            fp->unit, &fp->reduce_handle)
                    : comm_all_reduce(ctx, fp->full_grad_padded, fp->padded_unsharded_numel, reduce, fp->unit);
    else
        status = comm_reduce_scatter_typed(ctx, fp->shard_group, on, input, fp->reduce_target,
                                           fp->padded_unsharded_numel, DTYPE_FLOAT32, reduce, fp->unit,
                                           &fp->reduce_handle);
    /* HYBRID_SHARD's gradient reduction, as torch's _reduce_grad: the reduce-scatter above ran in the shard group;
     * the shard is then all-reduced across the replicate group, queued behind it on the same stream (so it starts
     * once the shard is complete; on the host, one after the other). Each is a mean in its group, S and R ranks:
     * 1/S * 1/R = the mean over all W = S R ranks, as torch's pre- and post-divide factors multiply to W. With W a
     * power of two every factor is a power of two, exact in float, so where the division happens changes no bit. */
    /* EXERCISE 08-replicate BEGIN: HYBRID_SHARD: all-reduce the shard's mean across the replicate group */
    if (status == 0 && fp->replicate_group != NULL)
        status = comm_all_reduce_group_start(ctx, fp->replicate_group, on, fp->reduce_target, fp->sharded_numel,
                                             reduce, fp->unit, &fp->replicate_handle);
    /* EXERCISE 08-replicate END */
    fp->reduce_started = 1;
    fp->reduce_status = status;
    return status;
}

/* Offloaded: the device's result goes to the host (d2h): straight into a new grad_shard, or into a host buffer that
 * is added into it (accumulation runs on the host, where the gradient lives); then the device buffer is freed. */
static void offloaded_gradient_to_host(flat_param *fp, int status) {
    context *ctx = fp->ctx;
    size_t bytes = fp->sharded_numel * sizeof(float);
    char owner[MEM_OWNER_MAX];
    snprintf(owner, sizeof owner, "%s.grad_shard", fp->unit);
    if (status == 0 && fp->reduce_accumulate) {
        char staging_owner[MEM_OWNER_MAX];
        snprintf(staging_owner, sizeof staging_owner, "%s.reduce_scatter_output", fp->unit);
        float *staging = mem_alloc_uninitialized(flat_param_shard_pool(fp), bytes, MEM_COMM_BUFFER, staging_owner);
        offload_copy(ctx, staging, fp->reduce_target, bytes, OFFLOAD_D2H, fp->unit, owner, NULL);
        ctx->host.add_inplace(&ctx->host, fp->grad_shard, staging, fp->sharded_numel);
        mem_free(flat_param_shard_pool(fp), staging);
    } else if (status == 0) {
        offload_copy(ctx, fp->grad_shard, fp->reduce_target, bytes, OFFLOAD_D2H, fp->unit, owner, NULL);
    } else if (!fp->reduce_accumulate) {
        ctx->host.zero(&ctx->host, fp->grad_shard, bytes); /* no garbage gradient */
    }
    mem_free(&ctx->mem, fp->reduce_target);
    fp->reduce_target = NULL;
    flat_param_free_full_grad(fp);
}

int flat_param_reduce_scatter_grad_wait(flat_param *fp, const char *hook) {
    context *ctx = fp->ctx;
    if (!fp->reduce_started) return 0;
    fp->reduce_started = 0;
    if (fp->reducing_low_precision) return reduce_low_precision_wait(fp, hook);
    int status = fp->reduce_status == 0 ? comm_wait(ctx, &fp->reduce_handle, hook) : -1;
    if (status == 0 && fp->replicate_group != NULL) status = comm_wait(ctx, &fp->replicate_handle, hook);
    mem_free(&ctx->mem, fp->reduce_scatter_input); /* FLAT_PARAM_ROWS: read by the reduce-scatter until now */
    fp->reduce_scatter_input = NULL;
    if (fp->offload_params) {
        offloaded_gradient_to_host(fp, status);
        return status;
    }
    size_t bytes = fp->sharded_numel * sizeof(float);
    device *d = &ctx->device;
    if (fp->replicated && status == 0) d->copy(d, fp->reduce_target, fp->full_grad_padded, bytes, DEVICE_D2D);
    if (status != 0 && !fp->reduce_accumulate) d->zero(d, fp->reduce_target, bytes); /* no garbage gradient */
    if (fp->reduce_accumulate) {
        if (status == 0) d->add_inplace(d, fp->grad_shard, fp->reduce_target, fp->sharded_numel);
        mem_free(&ctx->mem, fp->reduce_target);
    }
    fp->reduce_target = NULL;
    flat_param_free_full_grad(fp);
    if (status == 0 && fp->mixed_precision.keep_low_precision_grads)
        d->round_to(d, fp->grad_shard, fp->sharded_numel, fp->mixed_precision.param_dtype);
    return status;
}

int flat_param_reduce_scatter_grad(flat_param *fp, comm_reduce reduce) {
    int status = flat_param_reduce_scatter_grad_start(fp, reduce, NULL);
    int waited = flat_param_reduce_scatter_grad_wait(fp, NULL);
    return status != 0 ? status : waited;
}

int flat_param_gather_grad(flat_param *fp) {
    float *full = flat_param_alloc_full_grad(fp);
    if (fp->grad_shard == NULL) return 0; /* the buffer starts zeroed */
    if (fp->layout == FLAT_PARAM_ROWS) { /* all-gathered rank-major, then copied out as the parameters are */
        char owner[MEM_OWNER_MAX];
        snprintf(owner, sizeof owner, "%s.grad_all_gather_output", fp->unit);
        float *rank_major = mem_alloc_uninitialized(&fp->ctx->mem, fp->padded_unsharded_numel * sizeof(float),
                                                    MEM_GRAD_UNSHARDED, owner);
        const float *shard = fp->grad_shard;
        if (fp->offload_params) { /* the host's shard h2d into this rank's slice, then gathered in place */
            float *slice = rank_major + (size_t)fp->ctx->rank * fp->sharded_numel;
            offload_copy(fp->ctx, slice, fp->grad_shard, fp->sharded_numel * sizeof(float), OFFLOAD_H2D, fp->unit,
                         owner, NULL);
            shard = slice;
        }
        int status = comm_all_gather_typed(fp->ctx, NULL, NULL, shard, rank_major,
                                           fp->padded_unsharded_numel, DTYPE_FLOAT32, fp->unit, NULL);
        if (status == 0) rows_copy(fp, rank_major, DTYPE_FLOAT32, full, 1);
        mem_free(&fp->ctx->mem, rank_major);
        return status;
    }
    device *d = &fp->ctx->device;
    const float *shard = fp->grad_shard;
    if (fp->offload_params) { /* the shard is in the host pool: h2d into this rank's chunk, then gather in place */
        size_t begin, end;
        flat_param_shard_range(fp, fp->ctx->rank, &begin, &end);
        d->copy(d, full + begin, fp->grad_shard, fp->sharded_numel * sizeof(float), DEVICE_H2D);
        if (fp->replicated) return 0;
        shard = full + begin;
    } else if (fp->replicated) {
        d->copy(d, full, fp->grad_shard, fp->sharded_numel * sizeof(float), DEVICE_D2D);
        return 0;
    }
    /* hybrid: the replicas hold the same gradient shard; gather in the shard group */
    return comm_all_gather_typed(fp->ctx, fp->shard_group, NULL, shard, full, fp->padded_unsharded_numel,
                                 DTYPE_FLOAT32, fp->unit, NULL);
}

void flat_param_free_full_grad(flat_param *fp) {
    mem_free(&fp->ctx->mem, fp->full_grad_padded);
    fp->full_grad_padded = NULL;
}

void flat_param_zero_grad(flat_param *fp) {
    mem_free(flat_param_shard_pool(fp), fp->grad_shard);
    fp->grad_shard = NULL;
    if (fp->local_grad_l1 != NULL) memset(fp->local_grad_l1, 0, (size_t)fp->param_count * sizeof(double));
}

/* ---------------------------------------------------------------- mixed precision */

int flat_param_mixed_precision_enabled(const flat_param_mixed_precision *mixed_precision) {
    return mixed_precision->param_dtype != DTYPE_FLOAT32 || mixed_precision->reduce_dtype != DTYPE_FLOAT32 ||
           mixed_precision->buffer_dtype != DTYPE_FLOAT32;
}

int flat_param_set_mixed_precision(flat_param *fp, const flat_param_mixed_precision *mixed_precision) {
    context *ctx = fp->ctx;
    const flat_param_mixed_precision *mp = mixed_precision;
    int floating = (mp->param_dtype == DTYPE_FLOAT32 || mp->param_dtype == DTYPE_BFLOAT16) &&
                   (mp->reduce_dtype == DTYPE_FLOAT32 || mp->reduce_dtype == DTYPE_BFLOAT16);
    if (!floating)
        return error_set(ctx->error, sizeof ctx->error, "rank %d: unit '%s': mixed precision param_dtype %s, "
                         "reduce_dtype %s: each must be float32 or bfloat16", ctx->rank, fp->unit,
                         dtype_name(mp->param_dtype), dtype_name(mp->reduce_dtype));
    if (mp->output_dtype != DTYPE_FLOAT32 && mp->output_dtype != DTYPE_BFLOAT16)
        return error_set(ctx->error, sizeof ctx->error, "rank %d: unit '%s': output_dtype %s: must be float32 or "
                         "bfloat16", ctx->rank, fp->unit, dtype_name(mp->output_dtype));
    if (mp->buffer_dtype != DTYPE_FLOAT32)
        return error_set(ctx->error, sizeof ctx->error, "rank %d: unit '%s': buffer_dtype %s is not supported: the "
                         "model's one buffer (RoPE's inv_freq) is computed in float32, as HF does; use float32",
                         ctx->rank, fp->unit, dtype_name(mp->buffer_dtype));
    if (fp->shard_state != FLAT_PARAM_SHARDED || fp->full_grad_padded != NULL)
        return error_set(ctx->error, sizeof ctx->error, "rank %d: unit '%s': mixed precision set while the unit is "
                         "unsharded or holds a full gradient; set it before the first step", ctx->rank, fp->unit);
    fp->mixed_precision = *mp;
    return 0;
}

void flat_param_track_grad_l1(flat_param *fp) {
    if (fp->local_grad_l1 != NULL) return;
    fp->local_grad_l1 = calloc((size_t)fp->param_count, sizeof *fp->local_grad_l1);
    if (fp->local_grad_l1 == NULL)
        world_fatal(fp->ctx, "unit '%s': out of memory for %d sums", fp->unit, fp->param_count);
}

/* pre_unshard (torch's _use_low_precision_shard): the float32 master shard cast into the param_dtype _mp_shard, then
 * the all-gather of that into the param_dtype _full_param_padded: (N - 1) / N of the unit in 2-byte elements. With CPU
 * offload the master lives on the host, and torch casts on the device: `_mp_shard.copy_(_local_shard.to(device))`,
 * an h2d copy of the float32 shard (4 bytes an element, into a transient device buffer) and the cast there. NO_SHARD
 * has nothing to gather: the _mp_shard is the whole unit and is the unsharded parameter until the reshard (torch's
 * post_reshard frees it there). */
static int unshard_low_precision_start(flat_param *fp, stream *on, const char *hook) {
    context *ctx = fp->ctx;
    dtype type = fp->mixed_precision.param_dtype;
    char owner[MEM_OWNER_MAX];
    snprintf(owner, sizeof owner, "%s._mp_shard", fp->unit);
    fp->mp_shard = mem_alloc_uninitialized_typed(&ctx->mem, fp->sharded_numel * dtype_size(type),
                                                 MEM_PARAM_SHARD_LOW_PRECISION, type, owner);
    if (fp->offload_params) {
        size_t bytes = fp->sharded_numel * sizeof(float);
        snprintf(owner, sizeof owner, "%s._local_shard", fp->unit);
        float *on_device = mem_alloc_uninitialized(&ctx->mem, bytes, MEM_PARAM_SHARD, owner);
        offload_copy(ctx, on_device, fp->local_shard, bytes, OFFLOAD_H2D, fp->unit, owner, NULL);
        ctx->device.convert(&ctx->device, fp->mp_shard, type, on_device, DTYPE_FLOAT32, fp->sharded_numel);
        mem_free(&ctx->mem, on_device);
    } else {
        /* EXERCISE 07-cast BEGIN: cast the float32 master shard into the param_dtype _mp_shard the all-gather sends */
        ctx->device.convert(&ctx->device, fp->mp_shard, type, fp->local_shard, DTYPE_FLOAT32, fp->sharded_numel);
        /* EXERCISE 07-cast END */
    }
    fp->unsharded_low_precision = 1;
    if (fp->replicated) {
        fp->low_precision_full_param = fp->mp_shard;
        fp->shard_state = FLAT_PARAM_UNSHARDED;
        shard_state_event(fp, FLAT_PARAM_SHARDED, FLAT_PARAM_UNSHARDED, hook);
        post_unshard(fp);
        return 0;
    }
    snprintf(owner, sizeof owner, "%s._full_param_padded", fp->unit);
    /* Unzeroed: the all-gather writes every element before any read. */
    fp->low_precision_full_param = mem_alloc_uninitialized_typed(
        &ctx->mem, fp->padded_unsharded_numel * dtype_size(type), MEM_PARAM_UNSHARDED, type, owner);
    if (comm_all_gather_typed(ctx, fp->shard_group, on, fp->mp_shard, fp->low_precision_full_param,
                              fp->padded_unsharded_numel, type, fp->unit, &fp->unshard_handle) != 0) {
        mem_free(&ctx->mem, fp->low_precision_full_param);
        mem_free(&ctx->mem, fp->mp_shard);
        fp->low_precision_full_param = fp->mp_shard = NULL;
        fp->unsharded_low_precision = 0;
        return -1;
    }
    fp->shard_state = FLAT_PARAM_UNSHARDED;
    shard_state_event(fp, FLAT_PARAM_SHARDED, FLAT_PARAM_UNSHARDED, hook);
    if (on == NULL) post_unshard(fp);
    else fp->post_unshard_pending = 1;
    return 0;
}

/* post_unshard, once the all-gather is done: the low-precision shard is freed (torch's
 * _free_low_precision_sharded_param; NO_SHARD keeps it: it is the unsharded parameter), and the gathered values are
 * widened into the float32 copy the device's layers read (exact: every bfloat16 is a float32; device.h's bfloat16
 * layers take float32 buffers holding bfloat16 values, on the CPU and the GPU). */
static void post_unshard(flat_param *fp) {
    context *ctx = fp->ctx;
    fp->post_unshard_pending = 0;
    if (!fp->replicated) {
        mem_free(&ctx->mem, fp->mp_shard);
        fp->mp_shard = NULL;
    }
    char owner[MEM_OWNER_MAX];
    snprintf(owner, sizeof owner, "%s._full_param_padded.compute_float32", fp->unit);
    fp->full_param_padded = mem_alloc_uninitialized(&ctx->mem, fp->padded_unsharded_numel * sizeof(float),
                                                    MEM_PARAM_UNSHARDED, owner);
    ctx->device.convert(&ctx->device, fp->full_param_padded, DTYPE_FLOAT32, fp->low_precision_full_param,
                        fp->mixed_precision.param_dtype, fp->padded_unsharded_numel);
}

/* The reduce-scatter in reduce_dtype (torch casts the gradient to it first): the float32 gradient backward computed
 * (already param_dtype values) cast into a reduce_dtype buffer, which the collective reads; the float32 one is freed
 * at once. The output is a reduce_dtype shard, cast and added into the float32 grad_shard at the wait. As torch's
 * _reduce_grad, HYBRID_SHARD then all-reduces that reduce_dtype shard across the replicate group (queued behind the
 * reduce-scatter), and NO_SHARD (_reduce_grad_no_shard) all-reduces the whole reduce_dtype gradient in place instead
 * of reduce-scattering it: both in bfloat16 with the ring's rounding (comm_all_reduce_typed). */
static int reduce_low_precision_start(flat_param *fp, comm_reduce reduce, stream *on) {
    context *ctx = fp->ctx;
    dtype type = fp->mixed_precision.reduce_dtype;
    char owner[MEM_OWNER_MAX];
    if (fp->grad_shard == NULL && !fp->offload_params) { /* zeroed: the first gradient is added to 0, exactly itself */
        snprintf(owner, sizeof owner, "%s.grad_shard", fp->unit);
        fp->grad_shard = mem_alloc(&ctx->mem, fp->sharded_numel * sizeof(float), MEM_GRAD_SHARD, owner);
    }
    if (fp->layout == FLAT_PARAM_ROWS) { /* FSDP2: copied (and cast) into the rank-major reduce_scatter_input */
        fp->low_precision_grad = reduce_scatter_copy_in(fp, type);
    } else {
        snprintf(owner, sizeof owner, "%s.full_grad_padded.%s", fp->unit, dtype_name(type));
        fp->low_precision_grad = mem_alloc_uninitialized_typed(
            &ctx->mem, fp->padded_unsharded_numel * dtype_size(type), MEM_GRAD_UNSHARDED, type, owner);
        ctx->device.convert(&ctx->device, fp->low_precision_grad, type, fp->full_grad_padded, DTYPE_FLOAT32,
                            fp->padded_unsharded_numel);
        flat_param_free_full_grad(fp);
    }
    fp->reducing_low_precision = 1;
    int status;
    if (fp->replicated) {
        status = comm_all_reduce_typed(ctx, NULL, on, fp->low_precision_grad, fp->padded_unsharded_numel, type, reduce,
                                       fp->unit, &fp->reduce_handle);
    } else {
        snprintf(owner, sizeof owner, "%s.reduce_scatter_output", fp->unit);
        fp->low_precision_reduce_output = mem_alloc_uninitialized_typed(
            &ctx->mem, fp->sharded_numel * dtype_size(type), MEM_COMM_BUFFER, type, owner);
        status = comm_reduce_scatter_typed(ctx, fp->shard_group, on, fp->low_precision_grad,
                                           fp->low_precision_reduce_output, fp->padded_unsharded_numel, type, reduce,
                                           fp->unit, &fp->reduce_handle);
        if (status == 0 && fp->replicate_group != NULL)
            status = comm_all_reduce_typed(ctx, fp->replicate_group, on, fp->low_precision_reduce_output,
                                           fp->sharded_numel, type, reduce, fp->unit, &fp->replicate_handle);
    }
    fp->reduce_started = 1;
    fp->reduce_status = status;
    return status;
}

static int reduce_low_precision_wait(flat_param *fp, const char *hook) {
    context *ctx = fp->ctx;
    int status = fp->reduce_status == 0 ? comm_wait(ctx, &fp->reduce_handle, hook) : -1;
    if (status == 0 && fp->replicate_group != NULL) status = comm_wait(ctx, &fp->replicate_handle, hook);
    dtype type = fp->mixed_precision.reduce_dtype;
    const char *output = fp->replicated ? fp->low_precision_grad : fp->low_precision_reduce_output;
    char owner[MEM_OWNER_MAX];
    if (fp->offload_params) {
        /* torch's _accumulate_sharded_grad casts the result to the parameter's float32 on the device; _offload_grad
         * copies that to the host (d2h, 4 bytes an element), where it is accumulated, as without mixed precision */
        size_t bytes = fp->sharded_numel * sizeof(float);
        fp->reduce_accumulate = fp->grad_shard != NULL;
        snprintf(owner, sizeof owner, "%s.grad_shard", fp->unit);
        if (fp->grad_shard == NULL)
            fp->grad_shard = mem_alloc_uninitialized(flat_param_shard_pool(fp), bytes, MEM_GRAD_SHARD, owner);
        snprintf(owner, sizeof owner, "%s.grad_shard_device", fp->unit);
        fp->reduce_target = mem_alloc_uninitialized(&ctx->mem, bytes, MEM_GRAD_SHARD, owner);
        if (status == 0)
            ctx->device.convert(&ctx->device, fp->reduce_target, DTYPE_FLOAT32, output, type, fp->sharded_numel);
    } else if (status == 0) {
        /* _accumulate_sharded_grad after _cast_grad_to_param_dtype: float32 += the reduce_dtype result, widened */
        device *d = &ctx->device;
        d->accumulate(d, fp->grad_shard, output, type, fp->sharded_numel);
    }
    mem_free(&ctx->mem, fp->low_precision_grad);
    mem_free(&ctx->mem, fp->low_precision_reduce_output);
    fp->low_precision_grad = fp->low_precision_reduce_output = NULL;
    fp->reducing_low_precision = 0;
    if (fp->offload_params) offloaded_gradient_to_host(fp, status);
    else flat_param_free_full_grad(fp);
    if (status == 0 && fp->mixed_precision.keep_low_precision_grads)
        flat_param_shard_device(fp)->round_to(flat_param_shard_device(fp), fp->grad_shard, fp->sharded_numel,
                                              fp->mixed_precision.param_dtype);
    return status;
}

mem_tracker *flat_param_shard_pool(const flat_param *fp) {
    return fp->offload_params ? &fp->ctx->host_mem : &fp->ctx->mem;
}

/* Torch moves an offloaded FlatParameter to the CPU when FSDP wraps it; here the shard, made (and initialised) in the
 * device pool, moves to the host pool once, as a d2h copy, before any step. */
int flat_param_offload_params(flat_param *fp) {
    context *ctx = fp->ctx;
    if (fp->offload_params) return 0;
    if (fp->replicated)
        return error_set(ctx->error, sizeof ctx->error, "rank %d: unit '%s': CPU offload of a replicated (NO_SHARD) "
                         "unit is not supported; use FULL_SHARD or SHARD_GRAD_OP", ctx->rank, fp->unit);
    if (fp->shard_state != FLAT_PARAM_SHARDED || fp->reduce_started)
        return error_set(ctx->error, sizeof ctx->error, "rank %d: unit '%s': offloaded while %s; offload before the "
                         "first step", ctx->rank, fp->unit, fp->reduce_started ? "reducing" : "UNSHARDED");
    mem_tracker *host = offload_host_pool(ctx);
    size_t bytes = fp->sharded_numel * sizeof(float);
    char owner[MEM_OWNER_MAX];
    snprintf(owner, sizeof owner, "%s._local_shard", fp->unit);
    float *shard = mem_alloc_uninitialized(host, bytes, MEM_PARAM_SHARD, owner);
    offload_copy(ctx, shard, fp->local_shard, bytes, OFFLOAD_D2H, fp->unit, owner, NULL);
    mem_free(&ctx->mem, fp->local_shard);
    fp->local_shard = shard;
    if (fp->grad_shard != NULL) {
        snprintf(owner, sizeof owner, "%s.grad_shard", fp->unit);
        float *grad = mem_alloc_uninitialized(host, bytes, MEM_GRAD_SHARD, owner);
        offload_copy(ctx, grad, fp->grad_shard, bytes, OFFLOAD_D2H, fp->unit, owner, NULL);
        mem_free(&ctx->mem, fp->grad_shard);
        fp->grad_shard = grad;
    }
    fp->offload_params = 1;
    return 0;
}
