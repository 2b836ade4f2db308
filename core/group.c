/* group.c — process groups from MPI_Comm_split; HYBRID_SHARD's mesh. See group.h. */
#include "group.h"

#include <stdio.h>
#include <string.h>

#include "config.h"

#ifdef FSDPLAB_CUDA
#include "cuda/nccl_comm.h"
#endif

static int mpi_failed(context *ctx, int rc, const char *what) {
    if (rc == MPI_SUCCESS) return 0;
    char reason[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(rc, reason, &length);
    return ctx_error(ctx->error, sizeof ctx->error, "rank %d: %s failed: %s", ctx->rank, what, reason);
}

/* The members of group `index` of a kind: world ranks first, first + stride, ... (count of them). */
static int group_make(comm_group *group, context *ctx, const char *name, int index, int first, int stride) {
    memset(group, 0, sizeof *group);
    snprintf(group->name, sizeof group->name, "%s", name);
    group->comm = MPI_COMM_NULL;
    group->index = index, group->first_world_rank = first, group->world_stride = stride;
    /* key = world rank: members keep the world's order, so member m is first + m * stride */
    if (mpi_failed(ctx, MPI_Comm_split(ctx->comm, index, ctx->rank, &group->comm), "MPI_Comm_split") ||
        mpi_failed(ctx, MPI_Comm_set_errhandler(group->comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler") ||
        mpi_failed(ctx, MPI_Comm_rank(group->comm, &group->rank), "MPI_Comm_rank") ||
        mpi_failed(ctx, MPI_Comm_size(group->comm, &group->size), "MPI_Comm_size"))
        return -1;
#ifdef FSDPLAB_CUDA
    if (ctx->backend == CTX_BACKEND_NCCL && nccl_comm_create(ctx, group->comm, name, &group->nccl) != 0) return -1;
#endif
    return 0;
}

int group_mesh_init(group_mesh *mesh, context *ctx, int shard_size) {
    memset(mesh, 0, sizeof *mesh);
    mesh->shard.comm = mesh->replicate.comm = MPI_COMM_NULL;
    if (shard_size < 1 || ctx->world_size % shard_size != 0)
        return ctx_error(ctx->error, sizeof ctx->error, "a shard group of %d ranks does not divide the world size %d",
                         shard_size, ctx->world_size);
    mesh->shard_size = shard_size;
    mesh->replicate_size = ctx->world_size / shard_size;
    int row = ctx->rank / shard_size, column = ctx->rank % shard_size;
    if (group_make(&mesh->shard, ctx, "shard", row, row * shard_size, 1) != 0 ||
        group_make(&mesh->replicate, ctx, "replicate", column, column, shard_size) != 0) {
        group_mesh_free(mesh);
        return -1;
    }
    if (mesh->shard.rank != column || mesh->replicate.rank != row || mesh->shard.size != shard_size ||
        mesh->replicate.size != mesh->replicate_size) {
        group_mesh_free(mesh);
        return ctx_error(ctx->error, sizeof ctx->error, "rank %d: MPI_Comm_split made groups of an unexpected layout",
                         ctx->rank);
    }
    return 0;
}

void group_mesh_free(group_mesh *mesh) {
#ifdef FSDPLAB_CUDA
    nccl_comm_destroy(mesh->shard.nccl);
    nccl_comm_destroy(mesh->replicate.nccl);
#endif
    if (mesh->shard.comm != MPI_COMM_NULL) MPI_Comm_free(&mesh->shard.comm);
    if (mesh->replicate.comm != MPI_COMM_NULL) MPI_Comm_free(&mesh->replicate.comm);
    memset(mesh, 0, sizeof *mesh);
    mesh->shard.comm = mesh->replicate.comm = MPI_COMM_NULL;
}

int group_ranks_per_node(context *ctx) {
    MPI_Comm node;
    if (mpi_failed(ctx, MPI_Comm_split_type(ctx->comm, MPI_COMM_TYPE_SHARED, ctx->rank, MPI_INFO_NULL, &node),
                   "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)"))
        return -1;
    int size = 0;
    int rc = MPI_Comm_size(node, &size);
    MPI_Comm_free(&node);
    if (mpi_failed(ctx, rc, "MPI_Comm_size")) return -1;
    int sizes[2] = {size, -size}; /* the smallest and the largest node, in one all-reduce */
    ctx_allreduce(ctx, sizes, 2, MPI_INT, MPI_MIN, "ranks per node");
    if (sizes[0] != -sizes[1])
        return ctx_error(ctx->error, sizeof ctx->error, "nodes hold different numbers of ranks (%d to %d)", sizes[0],
                         -sizes[1]);
    return size;
}

/* "1, 2, 4" */
static void divisors_text(int n, char *out, size_t size) {
    size_t used = 0;
    out[0] = '\0';
    for (int d = 1; d <= n && used < size; d++)
        if (n % d == 0) used += (size_t)snprintf(out + used, size - used, "%s%d", used ? ", " : "", d);
}

int group_shard_size_from_env(context *ctx, int default_size, int hybrid) {
    long shard = cfg_env_int(ctx, "SHARD_GROUP", default_size, 0, 1 << 20);
    if (!hybrid) return (int)shard;
    char divisors[256];
    divisors_text(ctx->world_size, divisors, sizeof divisors);
    if (shard == 0) {
        shard = group_ranks_per_node(ctx);
        if (shard < 0)
            ctx_exit_all(ctx, 2, "SHARD_GROUP unset: its default is the ranks per node, but %s; set SHARD_GROUP to "
                         "one of %s", ctx->error, divisors);
        if (ctx->world_size % shard != 0)
            ctx_exit_all(ctx, 2, "SHARD_GROUP unset: its default, the ranks per node (%ld), does not divide the world "
                         "size %d; set SHARD_GROUP to one of %s", shard, ctx->world_size, divisors);
    } else if (ctx->world_size % shard != 0) {
        ctx_exit_all(ctx, 2, "SHARD_GROUP='%ld' does not divide the world size %d: the mesh is (world / SHARD_GROUP) "
                     "x SHARD_GROUP ranks; choose one of %s", shard, ctx->world_size, divisors);
    }
    return (int)shard;
}

int group_world_rank(const comm_group *group, int member) {
    return group->first_world_rank + member * group->world_stride;
}

char *group_ranks_text(const comm_group *group, char *out, size_t out_size) {
    size_t used = 0;
    out[0] = '\0';
    for (int member = 0; member < group->size && used < out_size; member++)
        used += (size_t)snprintf(out + used, out_size - used, "%s%d", member ? "," : "",
                                 group_world_rank(group, member));
    return out;
}
