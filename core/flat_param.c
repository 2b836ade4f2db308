/* flat_param.c — FlatParameter layout, sharding, unshard / reshard, gradient reduce-scatter. See flat_param.h. */
#include "flat_param.h"

#include "rng.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *fp_shard_state_name(fp_shard_state state) { return state == FP_UNSHARDED ? "UNSHARDED" : "SHARDED"; }

void fp_fill_normal(const char *name, size_t first, size_t count, float *out, void *user) {
    const fp_normal_init *init = user;
    rng_fill_normal(init->seed, rng_stream_of(name), first, count, 0.0f, init->std, out);
}

static int bad_spec(flat_param *fp, int index, const char *why) {
    snprintf(fp->ctx->error, sizeof fp->ctx->error, "rank %d: unit '%s': parameter %d: %s", fp->ctx->rank, fp->unit,
             index, why);
    free(fp->params);
    fp->params = NULL;
    return -1;
}

static int init_layout(flat_param *fp, context *ctx, const char *unit, const fp_tensor_spec *specs, int count,
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
    if (fp->params == NULL) ctx_fatal(ctx, "unit '%s': out of memory for %d parameter records", unit, count);
    fp->param_count = count;

    size_t offset = 0;
    for (int i = 0; i < count; i++) {
        const fp_tensor_spec *spec = &specs[i];
        fp_param_info *info = &fp->params[i];
        if (spec->name == NULL || spec->name[0] == '\0') return bad_spec(fp, i, "empty name");
        if (strlen(spec->name) >= FP_NAME_MAX) return bad_spec(fp, i, "name too long");
        for (int j = 0; j < i; j++)
            if (strcmp(fp->params[j].name, spec->name) == 0) return bad_spec(fp, i, "name registered twice");
        if (spec->ndim < 1 || spec->ndim > FP_MAX_DIMS) return bad_spec(fp, i, "ndim must be 1..4");
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
    fp->padded_unsharded_numel = fp_padded_numel(offset, world);
    fp->pad_numel = fp->padded_unsharded_numel - offset;
    fp->sharded_numel = fp->padded_unsharded_numel / world;

    char owner[MEM_OWNER_MAX];
    snprintf(owner, sizeof owner, "%s._local_shard", unit);
    fp->local_shard = mem_alloc(&ctx->mem, fp->sharded_numel * sizeof(float), MEM_PARAM_SHARD, owner);
    fp->shard_state = FP_SHARDED;
    return 0;
}

size_t fp_padded_numel(size_t numel, size_t world) { return (numel + world - 1) / world * world; }

int fp_init(flat_param *fp, context *ctx, const char *unit, const fp_tensor_spec *specs, int count) {
    return init_layout(fp, ctx, unit, specs, count, 0);
}

int fp_init_replicated(flat_param *fp, context *ctx, const char *unit, const fp_tensor_spec *specs, int count) {
    return init_layout(fp, ctx, unit, specs, count, 1);
}

void fp_free(flat_param *fp) {
    mem_tracker *mem = &fp->ctx->mem;
    mem_free(mem, fp->full_grad_padded);
    mem_free(mem, fp->grad_shard);
    if (!fp->replicated) mem_free(mem, fp->full_param_padded); /* replicated: a view of local_shard */
    mem_free(mem, fp->local_shard);
    free(fp->params);
    memset(fp, 0, sizeof *fp);
}

void fp_shard_range(const flat_param *fp, int rank, size_t *begin, size_t *end) {
    int shard_rank = fp->shard_group != NULL ? rank % fp->shard_group->size : rank;
    *begin = fp->replicated ? 0 : (size_t)shard_rank * fp->sharded_numel;
    *end = *begin + fp->sharded_numel;
}

int fp_param_shard_overlap(const flat_param *fp, int param_index, int rank, size_t *begin, size_t *end) {
    const fp_param_info *info = &fp->params[param_index];
    size_t shard_begin, shard_end;
    fp_shard_range(fp, rank, &shard_begin, &shard_end);
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

int fp_find_param(const flat_param *fp, const char *name) {
    for (int i = 0; i < fp->param_count; i++)
        if (strcmp(fp->params[i].name, name) == 0) return i;
    return -1;
}

void fp_fill_flat_range(const flat_param *fp, fp_fill_fn fill, void *user, size_t begin, size_t end, float *out) {
    memset(out, 0, (end - begin) * sizeof *out); /* the padding, and anything no parameter covers */
    for (int i = 0; i < fp->param_count; i++) {
        const fp_param_info *info = &fp->params[i];
        size_t first = info->offset > begin ? info->offset : begin;
        size_t last = info->offset + info->numel < end ? info->offset + info->numel : end;
        if (first < last) fill(info->name, first - info->offset, last - first, out + (first - begin), user);
    }
}

void fp_fill_local_shard(flat_param *fp, fp_fill_fn fill, void *user) {
    size_t begin, end;
    fp_shard_range(fp, fp->ctx->rank, &begin, &end);
    fp_fill_flat_range(fp, fill, user, begin, end, fp->local_shard);
}

static void shard_state_event(flat_param *fp, fp_shard_state from, fp_shard_state to, const char *hook) {
    trace_state(&fp->ctx->trace, fp->unit, "ShardState", fp_shard_state_name(from), fp_shard_state_name(to), hook);
}

/* An all-gather of a shard in the shard group: issued on `on`, or (NULL) run on the host and waited for. */
static int group_all_gather(flat_param *fp, stream *on, const float *shard, float *full, comm_handle *handle,
                            const char *hook) {
    int status = comm_all_gather_group_start(fp->ctx, fp->shard_group, on, shard, full, fp->padded_unsharded_numel,
                                             fp->unit, handle);
    return status == 0 && on == NULL ? comm_wait(fp->ctx, handle, hook) : status;
}

int fp_unshard_start(flat_param *fp, stream *on, const char *hook) {
    if (fp->shard_state == FP_UNSHARDED) return 0;
    if (fp->replicated) { /* NO_SHARD: the local buffer already is the whole unit */
        fp->full_param_padded = fp->local_shard;
        fp->shard_state = FP_UNSHARDED;
        shard_state_event(fp, FP_SHARDED, FP_UNSHARDED, hook);
        return 0;
    }
    char owner[MEM_OWNER_MAX];
    snprintf(owner, sizeof owner, "%s._full_param_padded", fp->unit);
    /* Unzeroed: the all-gather writes every element (every rank's shard, padding included) before any read. */
    fp->full_param_padded =
        mem_alloc_uninitialized(&fp->ctx->mem, fp->padded_unsharded_numel * sizeof(float), MEM_PARAM_UNSHARDED, owner);
    int status;
    if (fp->shard_group != NULL) /* hybrid: inside the shard group; blocking (on NULL) when waited for at once */
        status = group_all_gather(fp, on, fp->local_shard, fp->full_param_padded, &fp->unshard_handle, hook);
    else
        status = on ? comm_all_gather_start(fp->ctx, on, fp->local_shard, fp->full_param_padded,
                                            fp->padded_unsharded_numel, fp->unit, &fp->unshard_handle)
                    : comm_all_gather(fp->ctx, fp->local_shard, fp->full_param_padded, fp->padded_unsharded_numel,
                                      fp->unit);
    if (status != 0) {
        mem_free(&fp->ctx->mem, fp->full_param_padded);
        fp->full_param_padded = NULL;
        return -1;
    }
    fp->shard_state = FP_UNSHARDED;
    shard_state_event(fp, FP_SHARDED, FP_UNSHARDED, hook);
    return 0;
}

int fp_unshard_wait(flat_param *fp, const char *hook) { return comm_wait(fp->ctx, &fp->unshard_handle, hook); }

int fp_unshard_pending(const flat_param *fp) { return fp->unshard_handle.active; }

int fp_unshard(flat_param *fp, const char *hook) { return fp_unshard_start(fp, NULL, hook); }

void fp_reshard(flat_param *fp, const char *hook) {
    if (fp->shard_state == FP_SHARDED) return;
    if (fp_unshard_pending(fp)) /* the all-gather still writes into the buffer */
        ctx_fatal(fp->ctx, "unit '%s': resharded in %s while its all-gather (seq %llu) is in flight; wait first",
                  fp->unit, hook, (unsigned long long)fp->unshard_handle.seq);
    if (!fp->replicated) mem_free(&fp->ctx->mem, fp->full_param_padded);
    fp->full_param_padded = NULL;
    fp->shard_state = FP_SHARDED;
    shard_state_event(fp, FP_UNSHARDED, FP_SHARDED, hook);
}

static const fp_param_info *param_or_abort(const flat_param *fp, const char *name) {
    int index = fp_find_param(fp, name);
    if (index < 0) ctx_fatal(fp->ctx, "unit '%s': no parameter named '%s'", fp->unit, name);
    return &fp->params[index];
}

float *fp_param_view(const flat_param *fp, const char *name) {
    const fp_param_info *info = param_or_abort(fp, name);
    if (fp->shard_state != FP_UNSHARDED)
        ctx_fatal(fp->ctx, "unit '%s': parameter '%s' used while the unit is SHARDED; unshard it first", fp->unit,
                  name);
    if (fp_unshard_pending(fp))
        ctx_fatal(fp->ctx, "unit '%s': parameter '%s' used while its all-gather (seq %llu) is in flight; wait first",
                  fp->unit, name, (unsigned long long)fp->unshard_handle.seq);
    return fp->full_param_padded + info->offset;
}

float *fp_alloc_full_grad(flat_param *fp) {
    if (fp->full_grad_padded != NULL) return fp->full_grad_padded;
    char owner[MEM_OWNER_MAX];
    snprintf(owner, sizeof owner, "%s.full_grad_padded", fp->unit);
    fp->full_grad_padded =
        mem_alloc(&fp->ctx->mem, fp->padded_unsharded_numel * sizeof(float), MEM_GRAD_UNSHARDED, owner);
    return fp->full_grad_padded;
}

float *fp_grad_view(const flat_param *fp, const char *name) {
    const fp_param_info *info = param_or_abort(fp, name);
    if (fp->full_grad_padded == NULL)
        ctx_fatal(fp->ctx, "unit '%s': gradient of '%s' used before fp_alloc_full_grad", fp->unit, name);
    return fp->full_grad_padded + info->offset;
}

/* HYBRID_SHARD's gradient reduction, as torch's _reduce_grad: reduce-scatter in the shard group into reduce_target,
 * then all-reduce that shard across the replicate group, queued behind it on the same stream (so it starts once the
 * shard is complete; on the host, one after the other). Each is a mean in its group, S and R ranks: 1/S * 1/R = the
 * mean over all W = S R ranks, as torch's pre- and post-divide factors multiply to W. With W a power of two every
 * factor is a power of two, exact in float, so where the division happens changes no bit. */
static int hybrid_reduce_start(flat_param *fp, comm_reduce reduce, stream *on) {
    int status = comm_reduce_scatter_group_start(fp->ctx, fp->shard_group, on, fp->full_grad_padded, fp->reduce_target,
                                                 fp->padded_unsharded_numel, reduce, fp->unit, &fp->reduce_handle);
    if (status != 0) return status;
    return comm_all_reduce_group_start(fp->ctx, fp->replicate_group, on, fp->reduce_target, fp->sharded_numel, reduce,
                                       fp->unit, &fp->replicate_handle);
}

int fp_reduce_scatter_grad_start(flat_param *fp, comm_reduce reduce, stream *on) {
    context *ctx = fp->ctx;
    if (fp->full_grad_padded == NULL)
        ctx_fatal(ctx, "unit '%s': reduce-scatter of a gradient that was never allocated", fp->unit);
    if (fp->reduce_handle.active)
        ctx_fatal(ctx, "unit '%s': a second reduce-scatter issued before the first (seq %llu) was waited for",
                  fp->unit, (unsigned long long)fp->reduce_handle.seq);
    char owner[MEM_OWNER_MAX];
    /* The first gradient lands straight in grad_shard; later ones (accumulation) need a buffer to add from. Either
     * starts unzeroed: the reduce-scatter (or, replicated, the copy after the all-reduce) writes all of it. */
    fp->reduce_accumulate = fp->grad_shard != NULL;
    size_t bytes = fp->sharded_numel * sizeof(float);
    if (fp->reduce_accumulate) {
        snprintf(owner, sizeof owner, "%s.reduce_scatter_output", fp->unit);
        fp->reduce_target = mem_alloc_uninitialized(&ctx->mem, bytes, MEM_COMM_BUFFER, owner);
    } else {
        snprintf(owner, sizeof owner, "%s.grad_shard", fp->unit);
        fp->reduce_target = fp->grad_shard = mem_alloc_uninitialized(&ctx->mem, bytes, MEM_GRAD_SHARD, owner);
    }
    int status;
    if (fp->replicate_group != NULL) /* hybrid: the shard group's reduce-scatter, then the replicate all-reduce */
        status = hybrid_reduce_start(fp, reduce, on);
    else if (on != NULL)
        status = fp->replicated ? comm_all_reduce_start(ctx, on, fp->full_grad_padded, fp->padded_unsharded_numel,
                                                        reduce, fp->unit, &fp->reduce_handle)
                                : comm_reduce_scatter_start(ctx, on, fp->full_grad_padded, fp->reduce_target,
                                                            fp->padded_unsharded_numel, reduce, fp->unit,
                                                            &fp->reduce_handle);
    else
        status = fp->replicated ? comm_all_reduce(ctx, fp->full_grad_padded, fp->padded_unsharded_numel, reduce, fp->unit)
                                : comm_reduce_scatter(ctx, fp->full_grad_padded, fp->reduce_target,
                                                      fp->padded_unsharded_numel, reduce, fp->unit);
    fp->reduce_started = 1;
    fp->reduce_status = status;
    return status;
}

int fp_reduce_scatter_grad_wait(flat_param *fp, const char *hook) {
    context *ctx = fp->ctx;
    if (!fp->reduce_started) return 0;
    fp->reduce_started = 0;
    int status = fp->reduce_status == 0 ? comm_wait(ctx, &fp->reduce_handle, hook) : -1;
    if (status == 0 && fp->replicate_group != NULL) status = comm_wait(ctx, &fp->replicate_handle, hook);
    size_t bytes = fp->sharded_numel * sizeof(float);
    if (fp->replicated && status == 0) memcpy(fp->reduce_target, fp->full_grad_padded, bytes);
    if (status != 0 && !fp->reduce_accumulate) memset(fp->reduce_target, 0, bytes); /* no garbage gradient */
    if (fp->reduce_accumulate) {
        if (status == 0)
            for (size_t i = 0; i < fp->sharded_numel; i++) fp->grad_shard[i] += fp->reduce_target[i];
        mem_free(&ctx->mem, fp->reduce_target);
    }
    fp->reduce_target = NULL;
    fp_free_full_grad(fp);
    return status;
}

int fp_reduce_scatter_grad(flat_param *fp, comm_reduce reduce) {
    int status = fp_reduce_scatter_grad_start(fp, reduce, NULL);
    int waited = fp_reduce_scatter_grad_wait(fp, NULL);
    return status != 0 ? status : waited;
}

int fp_gather_grad(flat_param *fp) {
    float *full = fp_alloc_full_grad(fp);
    if (fp->grad_shard == NULL) return 0; /* the buffer starts zeroed */
    if (fp->replicated) {
        memcpy(full, fp->grad_shard, fp->sharded_numel * sizeof(float));
        return 0;
    }
    if (fp->shard_group != NULL) { /* hybrid: the replicas hold the same gradient shard; gather in the shard group */
        comm_handle handle;
        return group_all_gather(fp, NULL, fp->grad_shard, full, &handle, NULL);
    }
    return comm_all_gather(fp->ctx, fp->grad_shard, full, fp->padded_unsharded_numel, fp->unit);
}

void fp_free_full_grad(flat_param *fp) {
    mem_free(&fp->ctx->mem, fp->full_grad_padded);
    fp->full_grad_padded = NULL;
}

void fp_zero_grad(flat_param *fp) {
    mem_free(&fp->ctx->mem, fp->grad_shard);
    fp->grad_shard = NULL;
}
