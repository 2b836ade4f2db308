/* group.h — process groups: the ranks a collective runs among, and HYBRID_SHARD's 2-D mesh of them.
 *
 * FULL_SHARD shards every FlatParameter over all ranks (the world: ctx->comm). HYBRID_SHARD lays the W ranks out
 * as a mesh of R replicate rows by S shard columns, as torch's init_device_mesh(..., (R, S),
 * mesh_dim_names=("replicate", "shard")) does:
 *
 *     world rank = shard group index * S + shard rank            S = SHARD_GROUP (default: the ranks of one node)
 *
 *        shard group 0:  ranks 0 .. S-1        parameters sharded S ways inside each shard group; the all-gathers
 *        shard group 1:  ranks S .. 2S-1       and reduce-scatters stay inside it (the fast link: one node)
 *        ...
 *        replicate group j: ranks j, S + j, 2S + j, ...   the ranks holding the same shard, one per shard group:
 *                                                         the gradient shard is all-reduced across it (the slow
 *                                                         link between nodes)
 *
 * Each group is an MPI communicator from MPI_Comm_split; the host uses it for the agreement check and the blocking
 * forms, and every comm stream makes its own duplicate (stream_add_group, core/comm/stream.h), as it does of the
 * world's. With BACKEND=nccl a group also has an NCCL communicator (its rank 0's ncclUniqueId broadcast over the MPI
 * one), and every comm stream makes its own of it.
 */
#ifndef FSDPLAB_GROUP_H
#define FSDPLAB_GROUP_H

#include <mpi.h>

#include "core/runtime/context.h"

/* One process group, as seen from one of its members. */
typedef struct comm_group {
    char name[16];          /* "shard", "replicate": the `group` of its collectives' events */
    MPI_Comm comm;          /* errors return (MPI_ERRORS_RETURN); MPI_COMM_NULL once freed */
    int rank;               /* this rank's position in the group */
    int size;
    int index;              /* which group of its kind this rank is in (shard group i: i = rank / S) */
    int first_world_rank;   /* member m is world rank first_world_rank + m * world_stride */
    int world_stride;
    void *backend_comm;     /* BACKEND=nccl: its communicator of ctx->collectives (an ncclComm_t), for the
                               collectives on the compute stream; NULL otherwise */
} comm_group;

/* HYBRID_SHARD's mesh: replicate_size x shard_size = world size. */
typedef struct group_mesh {
    int shard_size, replicate_size;
    comm_group shard;       /* torch's process_group (intra-node) */
    comm_group replicate;   /* torch's _inter_node_pg */
    const struct comm_backend *backend; /* the groups' backend_comm were made by it (NULL: MPI alone) */
} group_mesh;

/* The mesh with shard groups of shard_size ranks. Collective (MPI_Comm_split twice). -1 with ctx->error when
 * shard_size does not divide the world size or MPI fails. */
int group_mesh_init(group_mesh *mesh, context *ctx, int shard_size);
void group_mesh_free(group_mesh *mesh);

/* The ranks that share this rank's node (MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)): HYBRID_SHARD's default shard
 * group, as torch's default intra-node group. Collective. -1 with ctx->error when nodes hold different numbers of
 * ranks (no one shard group size fits them all: set SHARD_GROUP). */
int group_ranks_per_node(context *ctx);
/* SHARD_GROUP from the environment (default default_size; 0: group_ranks_per_node), refused unless it divides the
 * world size, naming both and the divisors allowed: every rank exits. Collective (an env_ call: always call it, in
 * the same place on every rank, whatever the strategy). Not `hybrid`: the value is only read (a bad integer is still
 * refused) and returned as given, 0 when unset, so a run that uses no mesh never fails over one. */
int group_shard_size_from_env(context *ctx, int default_size, int hybrid);

/* The world rank of the group's member `member`. */
int group_world_rank(const comm_group *group, int member);
/* "0,2" for a group of world ranks 0 and 2: what the events write. Returns out. */
char *group_ranks_text(const comm_group *group, char *out, size_t out_size);

#endif
