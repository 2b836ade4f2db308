/* group.c — process groups from MPI_Comm_split; HYBRID_SHARD's mesh. See group.h. */
#include "core/comm/group.h"

#include <stdio.h>
#include <string.h>

#include "core/base/error.h"
#include "core/comm/comm_backend.h"
#include "core/runtime/env.h"
#include "core/runtime/world.h"


/* The members of group `index` of a kind: world ranks first, first + stride, ... (count of them). */
static int group_make(comm_group *group, context *ctx, const char *name, int index, int first, int stride) {
    memset(group, 0, sizeof *group);
    snprintf(group->name, sizeof group->name, "%s", name);
    group->comm = MPI_COMM_NULL;
    group->index = index, group->first_world_rank = first, group->world_stride = stride;
    /* key = world rank: members keep the world's order, so member m is first + m * stride */
    if (world_mpi_error(ctx, MPI_Comm_split(ctx->comm, index, ctx->rank, &group->comm), "MPI_Comm_split") ||
        world_mpi_error(ctx, MPI_Comm_set_errhandler(group->comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler") ||
        world_mpi_error(ctx, MPI_Comm_rank(group->comm, &group->rank), "MPI_Comm_rank") ||
        world_mpi_error(ctx, MPI_Comm_size(group->comm, &group->size), "MPI_Comm_size"))
        return -1;
    const comm_backend *backend = ctx->collectives;
    if (backend != NULL && backend->create(ctx, group->comm, name, &group->backend_comm) != 0) return -1;
    return 0;
}

int group_mesh_init(group_mesh *mesh, context *ctx, int shard_size) {
    memset(mesh, 0, sizeof *mesh);
    mesh->shard.comm = mesh->replicate.comm = MPI_COMM_NULL;
    if (shard_size < 1 || ctx->world_size % shard_size != 0)
        return error_set(ctx->error, sizeof ctx->error, "a shard group of %d ranks does not divide the world size %d",
                         shard_size, ctx->world_size);
    mesh->shard_size = shard_size;
    mesh->backend = ctx->collectives;
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
        return error_set(ctx->error, sizeof ctx->error, "rank %d: MPI_Comm_split made groups of an unexpected layout",
                         ctx->rank);
    }
    return 0;
}

void group_mesh_free(group_mesh *mesh) {
    const comm_backend *backend = mesh->backend;
    if (backend != NULL && backend->destroy != NULL) {
        backend->destroy(mesh->shard.backend_comm);
        backend->destroy(mesh->replicate.backend_comm);
    }
    if (mesh->shard.comm != MPI_COMM_NULL) MPI_Comm_free(&mesh->shard.comm);
    if (mesh->replicate.comm != MPI_COMM_NULL) MPI_Comm_free(&mesh->replicate.comm);
    memset(mesh, 0, sizeof *mesh);
    mesh->shard.comm = mesh->replicate.comm = MPI_COMM_NULL;
}

int group_ranks_per_node(context *ctx) {
    MPI_Comm node;
    if (world_mpi_error(ctx, MPI_Comm_split_type(ctx->comm, MPI_COMM_TYPE_SHARED, ctx->rank, MPI_INFO_NULL, &node),
                   "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)"))
        return -1;
    int size = 0;
    int rc = MPI_Comm_size(node, &size);
    MPI_Comm_free(&node);
    if (world_mpi_error(ctx, rc, "MPI_Comm_size")) return -1;
    int sizes[2] = {size, -size}; /* the smallest and the largest node, in one all-reduce */
    world_allreduce(ctx, sizes, 2, MPI_INT, MPI_MIN, "ranks per node");
    if (sizes[0] != -sizes[1])
        return error_set(ctx->error, sizeof ctx->error, "nodes hold different numbers of ranks (%d to %d)", sizes[0],
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
    long shard = env_int(ctx, "SHARD_GROUP", default_size, 0, 1 << 20);
    if (!hybrid) return (int)shard;
    char divisors[256];
    divisors_text(ctx->world_size, divisors, sizeof divisors);
    if (shard == 0) {
        shard = group_ranks_per_node(ctx);
        if (shard < 0)
            world_exit_all(ctx, 2, "SHARD_GROUP unset: its default is the ranks per node, but %s; set SHARD_GROUP to "
                         "one of %s", ctx->error, divisors);
        if (ctx->world_size % shard != 0)
            world_exit_all(ctx, 2, "SHARD_GROUP unset: its default, the ranks per node (%ld), does not divide the "
                         "world size %d; set SHARD_GROUP to one of %s", shard, ctx->world_size, divisors);
    } else if (ctx->world_size % shard != 0) {
        world_exit_all(ctx, 2, "SHARD_GROUP='%ld' does not divide the world size %d: the mesh is (world / SHARD_GROUP) "
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
