/* test_comm.c — the collectives against naive MPI_Send/Recv reference loops, at any world size (the suite runs it
 * under mpirun -np 1..4), for sizes that do and do not divide by the world size; mismatched calls between ranks
 * give an error on every rank instead of a hang. */
#include <math.h>
#include <string.h>

#include "core/comm/comm.h"
#include "core/base/rng.h"
#include "core/runtime/world.h"
#include "core/runtime/session.h"
#include "mpi_check.h"

static context ctx; /* the one context of this test program */

static const size_t chunk_counts[] = {1, 7, 1000, 4099};          /* per rank, for all_gather / reduce_scatter */
static const size_t any_counts[] = {1, 7, 1001, 4099, 65537};     /* for all_reduce / broadcast */
#define COUNT_OF(array) (sizeof(array) / sizeof((array)[0]))

/* Rank r's input: a value that depends only on (tag, r, i), so any rank can compute any rank's input. */
static float input_value(uint64_t tag, int rank, size_t i) {
    return rng_uniform(tag, (uint64_t)rank, i) - 0.5f;
}
static float *make_input(uint64_t tag, int rank, size_t count) {
    float *buffer = mem_alloc(&ctx.mem, count * sizeof(float), MEM_WORKSPACE, "test.input");
    for (size_t i = 0; i < count; i++) buffer[i] = input_value(tag, rank, i);
    return buffer;
}
static float *make_zeros(size_t count) { return mem_alloc(&ctx.mem, count * sizeof(float), MEM_WORKSPACE, "test.out"); }

/* Reference: in round k every rank sends to rank+k and receives from rank-k (no deadlock, no collective). */
static void exchange(const float *send, size_t send_count, int to, float *recv, size_t recv_count, int from) {
    WORLD_MPI(&ctx, MPI_Sendrecv(send, (int)send_count, MPI_FLOAT, to, 7, recv, (int)recv_count, MPI_FLOAT, from, 7,
                               ctx.comm, MPI_STATUS_IGNORE));
}

static void reference_all_gather(const float *shard, float *full, size_t chunk) {
    memcpy(full + (size_t)ctx.rank * chunk, shard, chunk * sizeof(float));
    for (int k = 1; k < ctx.world_size; k++) {
        int to = (ctx.rank + k) % ctx.world_size, from = (ctx.rank - k + ctx.world_size) % ctx.world_size;
        exchange(shard, chunk, to, full + (size_t)from * chunk, chunk, from);
    }
}

/* Sum over ranks of chunk `rank` of everyone's buffer, summed in rank order in double. */
static void reference_reduce_scatter(const float *full, float *shard, size_t chunk) {
    float *received = make_zeros(chunk * (size_t)ctx.world_size);
    memcpy(received + (size_t)ctx.rank * chunk, full + (size_t)ctx.rank * chunk, chunk * sizeof(float));
    for (int k = 1; k < ctx.world_size; k++) {
        int to = (ctx.rank + k) % ctx.world_size, from = (ctx.rank - k + ctx.world_size) % ctx.world_size;
        exchange(full + (size_t)to * chunk, chunk, to, received + (size_t)from * chunk, chunk, from);
    }
    for (size_t i = 0; i < chunk; i++) {
        double sum = 0.0;
        for (int rank = 0; rank < ctx.world_size; rank++) sum += received[(size_t)rank * chunk + i];
        shard[i] = (float)sum;
    }
    mem_free(&ctx.mem, received);
}

static void reference_all_reduce(const float *mine, float *out, size_t count) {
    float *everyone = make_zeros(count * (size_t)ctx.world_size);
    reference_all_gather(mine, everyone, count); /* gather whole buffers, then sum in rank order */
    for (size_t i = 0; i < count; i++) {
        double sum = 0.0;
        for (int rank = 0; rank < ctx.world_size; rank++) sum += everyone[(size_t)rank * count + i];
        out[i] = (float)sum;
    }
    mem_free(&ctx.mem, everyone);
}

static void reference_broadcast(float *buffer, size_t count, int root) {
    if (ctx.rank == root) {
        for (int rank = 0; rank < ctx.world_size; rank++)
            if (rank != root)
                WORLD_MPI(&ctx, MPI_Send(buffer, (int)count, MPI_FLOAT, rank, 8, ctx.comm));
    } else {
        WORLD_MPI(&ctx, MPI_Recv(buffer, (int)count, MPI_FLOAT, root, 8, ctx.comm, MPI_STATUS_IGNORE));
    }
}

/* Largest |a - b| / max(1, |b|). */
static double max_relative_error(const float *a, const float *b, size_t count) {
    double worst = 0.0;
    for (size_t i = 0; i < count; i++) {
        double error = fabs((double)a[i] - (double)b[i]) / fmax(1.0, fabs((double)b[i]));
        if (error > worst) worst = error;
    }
    return worst;
}

START_TEST(test_all_gather_matches_reference) {
    for (size_t c = 0; c < COUNT_OF(chunk_counts); c++) {
        size_t chunk = chunk_counts[c], full_count = chunk * (size_t)ctx.world_size;
        float *shard = make_input(11, ctx.rank, chunk), *full = make_zeros(full_count),
              *expected = make_zeros(full_count);
        ck_assert_int_eq(comm_all_gather(&ctx, shard, full, full_count, "test"), 0);
        reference_all_gather(shard, expected, chunk);
        CK_ASSERT_ALL(&ctx, memcmp(full, expected, full_count * sizeof(float)) == 0,
                      "all_gather of %zu floats differs from the reference", full_count);
        const trace_collective_info *info = &ctx.last_collective;
        CK_ASSERT_ALL(&ctx,
                      info->bytes == full_count * 4 && info->bytes_sent == (uint64_t)(ctx.world_size - 1) * chunk * 4,
                      "all_gather event: bytes %llu sent %llu", (unsigned long long)info->bytes,
                      (unsigned long long)info->bytes_sent);
        mem_free(&ctx.mem, shard);
        mem_free(&ctx.mem, full);
        mem_free(&ctx.mem, expected);
    }
}
END_TEST

START_TEST(test_reduce_scatter_matches_reference) {
    for (int reduce = COMM_SUM; reduce <= COMM_AVG; reduce++) {
        for (size_t c = 0; c < COUNT_OF(chunk_counts); c++) {
            size_t chunk = chunk_counts[c], full_count = chunk * (size_t)ctx.world_size;
            float *full = make_input(22 + (uint64_t)reduce, ctx.rank, full_count), *shard = make_zeros(chunk),
                  *expected = make_zeros(chunk);
            ck_assert_int_eq(comm_reduce_scatter(&ctx, full, shard, full_count, (comm_reduce)reduce, "test"), 0);
            reference_reduce_scatter(full, expected, chunk);
            if (reduce == COMM_AVG)
                for (size_t i = 0; i < chunk; i++) expected[i] /= (float)ctx.world_size;
            double error = max_relative_error(shard, expected, chunk);
            CK_ASSERT_ALL(&ctx, error <= 1e-6, "reduce_scatter (%s) of %zu floats: max relative error %.3g",
                          reduce == COMM_AVG ? "avg" : "sum", full_count, error);
            mem_free(&ctx.mem, full);
            mem_free(&ctx.mem, shard);
            mem_free(&ctx.mem, expected);
        }
    }
}
END_TEST

START_TEST(test_all_reduce_matches_reference) {
    for (int reduce = COMM_SUM; reduce <= COMM_AVG; reduce++) {
        for (size_t c = 0; c < COUNT_OF(any_counts); c++) {
            size_t count = any_counts[c];
            float *buffer = make_input(33, ctx.rank, count), *expected = make_zeros(count);
            reference_all_reduce(buffer, expected, count);
            if (reduce == COMM_AVG)
                for (size_t i = 0; i < count; i++) expected[i] /= (float)ctx.world_size;
            ck_assert_int_eq(comm_all_reduce(&ctx, buffer, count, (comm_reduce)reduce, "test"), 0);
            double error = max_relative_error(buffer, expected, count);
            CK_ASSERT_ALL(&ctx, error <= 1e-6, "all_reduce of %zu floats: max relative error %.3g", count, error);
            mem_free(&ctx.mem, buffer);
            mem_free(&ctx.mem, expected);
        }
    }
}
END_TEST

START_TEST(test_broadcast_matches_reference_from_every_root) {
    for (int root = 0; root < ctx.world_size; root++) {
        for (size_t c = 0; c < COUNT_OF(any_counts); c++) {
            size_t count = any_counts[c];
            float *buffer = make_input(44, ctx.rank, count), *expected = make_input(44, ctx.rank, count);
            ck_assert_int_eq(comm_broadcast(&ctx, buffer, count, root, "test"), 0);
            reference_broadcast(expected, count, root);
            int ok = memcmp(buffer, expected, count * sizeof(float)) == 0 && buffer[0] == input_value(44, root, 0);
            CK_ASSERT_ALL(&ctx, ok, "broadcast of %zu floats from root %d differs", count, root);
            mem_free(&ctx.mem, buffer);
            mem_free(&ctx.mem, expected);
        }
    }
}
END_TEST

START_TEST(test_mismatched_counts_fail_on_every_rank) {
    if (ctx.world_size < 2) return;
    /* Rank 0 thinks the unit has 8 floats per rank, the others 9: a bug that MPI would turn into a hang. */
    size_t full_count = (ctx.rank == 0 ? 8 : 9) * (size_t)ctx.world_size;
    float *shard = make_zeros(9), *full = make_zeros(9 * (size_t)ctx.world_size);
    int status = comm_all_gather(&ctx, shard, full, full_count, "layers.3");
    CK_ASSERT_ALL(&ctx, status == -1, "mismatched all_gather returned %d", status);
    int named = strstr(ctx.error, "layers.3") != NULL && strstr(ctx.error, "floats, but rank") != NULL;
    CK_ASSERT_ALL(&ctx, named, "error does not name the unit and the other rank's count: %s", ctx.error);
    /* The communicator is still usable afterwards. */
    ck_assert_int_eq(comm_barrier(&ctx, "after the error"), 0);
    mem_free(&ctx.mem, shard);
    mem_free(&ctx.mem, full);
}
END_TEST

START_TEST(test_mismatched_ops_fail_on_every_rank) {
    if (ctx.world_size < 2) return;
    float *buffer = make_zeros(16);
    int status = ctx.rank == 0 ? comm_all_reduce(&ctx, buffer, 16, COMM_SUM, "unit")
                               : comm_broadcast(&ctx, buffer, 16, 0, "unit");
    CK_ASSERT_ALL(&ctx, status == -1, "all_reduce on rank 0 vs broadcast elsewhere returned %d", status);
    CK_ASSERT_ALL(&ctx, strstr(ctx.error, "every rank must call the same collective") != NULL, "%s", ctx.error);
    int root_status = comm_broadcast(&ctx, buffer, 16, ctx.rank == 0 ? 0 : 1, "unit");
    CK_ASSERT_ALL(&ctx, root_status == -1 && strstr(ctx.error, "root") != NULL,
                  "broadcast with different roots: %d, %s", root_status, ctx.error);
    mem_free(&ctx.mem, buffer);
}
END_TEST

START_TEST(test_indivisible_shard_sizes_are_refused) {
    if (ctx.world_size < 2) return;
    size_t full_count = 4 * (size_t)ctx.world_size + 1;
    float *full = make_zeros(full_count), *shard = make_zeros(full_count);
    int status = comm_reduce_scatter(&ctx, full, shard, full_count, COMM_AVG, "root");
    CK_ASSERT_ALL(&ctx, status == -1 && strstr(ctx.error, "not divisible") != NULL, "status %d: %s", status,
                  ctx.error);
    status = comm_all_gather(&ctx, shard, full, full_count, "root");
    CK_ASSERT_ALL(&ctx, status == -1 && strstr(ctx.error, "not divisible") != NULL, "status %d: %s", status,
                  ctx.error);
    mem_free(&ctx.mem, full);
    mem_free(&ctx.mem, shard);
}
END_TEST

/* The agreement exchange runs once per signature: a second identical call skips it, a new count, reduction or unit
 * makes one again. */
START_TEST(test_agreement_once_per_signature) {
    size_t chunk = 5, full_count = chunk * (size_t)ctx.world_size;
    float *shard = make_input(55, ctx.rank, chunk), *full = make_zeros(full_count);
    uint64_t before = ctx.agreements;
    ck_assert_int_eq(comm_all_gather(&ctx, shard, full, full_count, "layers.agree"), 0);
    ck_assert_uint_eq(ctx.agreements, before + 1);
    ck_assert_int_eq(comm_all_gather(&ctx, shard, full, full_count, "layers.agree"), 0);
    ck_assert_uint_eq(ctx.agreements, before + 1); /* the same signature: no exchange */
    ck_assert_int_eq(comm_reduce_scatter(&ctx, full, shard, full_count, COMM_AVG, "layers.agree"), 0);
    ck_assert_uint_eq(ctx.agreements, before + 2); /* another op */
    ck_assert_int_eq(comm_reduce_scatter(&ctx, full, shard, full_count, COMM_SUM, "layers.agree"), 0);
    ck_assert_uint_eq(ctx.agreements, before + 3); /* another reduction */
    ck_assert_int_eq(comm_reduce_scatter(&ctx, full, shard, full_count, COMM_AVG, "layers.agree"), 0);
    ck_assert_uint_eq(ctx.agreements, before + 3);
    ck_assert_int_eq(comm_all_gather(&ctx, shard, full, full_count, "layers.agree2"), 0);
    ck_assert_uint_eq(ctx.agreements, before + 4); /* another unit */
    float *bigger = make_zeros(full_count + (size_t)ctx.world_size);
    ck_assert_int_eq(comm_all_gather(&ctx, shard, bigger, full_count, "layers.agree"), 0);
    ck_assert_uint_eq(ctx.agreements, before + 4);
    mem_free(&ctx.mem, bigger);
    bigger = make_zeros(2 * full_count);
    float *wider = make_input(56, ctx.rank, 2 * chunk);
    ck_assert_int_eq(comm_all_gather(&ctx, wider, bigger, 2 * full_count, "layers.agree"), 0);
    ck_assert_uint_eq(ctx.agreements, before + 5); /* another count */
    mem_free(&ctx.mem, wider);
    mem_free(&ctx.mem, bigger);
    mem_free(&ctx.mem, shard);
    mem_free(&ctx.mem, full);
}
END_TEST

/* A unit agreed on earlier (10 floats per rank) is not a pass for the same unit with other counts: a mismatch is
 * caught, and a refused signature is not remembered, so repeating the call is checked (and refused) again. */
START_TEST(test_mismatch_after_an_agreed_signature_is_caught) {
    if (ctx.world_size < 2) return;
    float *shard = make_zeros(12), *full = make_zeros(12 * (size_t)ctx.world_size);
    ck_assert_int_eq(comm_all_gather(&ctx, shard, full, 10 * (size_t)ctx.world_size, "layers.7"), 0);
    uint64_t before = ctx.agreements;
    size_t full_count = (ctx.rank == 0 ? 11 : 12) * (size_t)ctx.world_size; /* new on every rank */
    int status = comm_all_gather(&ctx, shard, full, full_count, "layers.7");
    CK_ASSERT_ALL(&ctx, status == -1 && strstr(ctx.error, "floats, but rank") != NULL, "status %d: %s", status,
                  ctx.error);
    ck_assert_uint_eq(ctx.agreements, before + 1);
    status = comm_all_gather(&ctx, shard, full, full_count, "layers.7");
    CK_ASSERT_ALL(&ctx, status == -1, "second mismatched call returned %d", status);
    ck_assert_uint_eq(ctx.agreements, before + 2);
    ck_assert_int_eq(comm_barrier(&ctx, "after the error"), 0);
    mem_free(&ctx.mem, shard);
    mem_free(&ctx.mem, full);
}
END_TEST

/* Ranks gathering different units of the same size: caught, naming both units. */
START_TEST(test_mismatched_units_fail_on_every_rank) {
    if (ctx.world_size < 2) return;
    size_t full_count = 6 * (size_t)ctx.world_size;
    float *shard = make_zeros(6), *full = make_zeros(full_count);
    int status = comm_all_gather(&ctx, shard, full, full_count, ctx.rank == 0 ? "layers.3" : "layers.4");
    CK_ASSERT_ALL(&ctx, status == -1, "all_gather of different units returned %d", status);
    int named = strstr(ctx.error, "layers.3") != NULL && strstr(ctx.error, "layers.4") != NULL &&
                strstr(ctx.error, "same unit") != NULL;
    CK_ASSERT_ALL(&ctx, named, "error does not name both units: %s", ctx.error);
    ck_assert_int_eq(comm_barrier(&ctx, "after the error"), 0);
    mem_free(&ctx.mem, shard);
    mem_free(&ctx.mem, full);
}
END_TEST

START_TEST(test_sequence_numbers_agree_across_ranks) {
    uint64_t before = ctx.collective_seq;
    ck_assert_int_eq(comm_barrier(&ctx, "seq"), 0);
    ck_assert_uint_eq(ctx.last_collective.seq, before);
    ck_assert_uint_eq(ctx.collective_seq, before + 1);
    double mine = (double)ctx.collective_seq, smallest = 0, largest = 0;
    WORLD_MPI(&ctx, MPI_Allreduce(&mine, &smallest, 1, MPI_DOUBLE, MPI_MIN, ctx.comm));
    WORLD_MPI(&ctx, MPI_Allreduce(&mine, &largest, 1, MPI_DOUBLE, MPI_MAX, ctx.comm));
    CK_ASSERT_ALL(&ctx, smallest == largest, "collective seq differs across ranks: %g..%g", smallest, largest);
}
END_TEST

/* The start forms on worker streams: the same bits as the blocking forms (every element is computed by the same
 * code in the same order; only the thread differs), several in flight on two streams at once, and the trace's
 * stream and issue time on each. */
START_TEST(test_start_wait_on_streams_equals_blocking) {
    stream gather_stream, reduce_stream;
    ck_assert_msg(stream_init(&gather_stream, &ctx, "all_gather", STREAM_WORKER) == 0, "%s", ctx.error);
    ck_assert_msg(stream_init(&reduce_stream, &ctx, "reduce_scatter", STREAM_WORKER) == 0, "%s", ctx.error);
    enum { IN_FLIGHT = 3 };
    for (size_t c = 0; c < COUNT_OF(chunk_counts); c++) {
        size_t chunk = chunk_counts[c], full_count = chunk * (size_t)ctx.world_size;
        float *shards[IN_FLIGHT], *fulls[IN_FLIGHT], *grads[IN_FLIGHT], *reduced[IN_FLIGHT];
        comm_handle gathers[IN_FLIGHT], reduces[IN_FLIGHT];
        for (int k = 0; k < IN_FLIGHT; k++) { /* three of each queued before any wait */
            shards[k] = make_input(40 + (uint64_t)k, ctx.rank, chunk), fulls[k] = make_zeros(full_count);
            grads[k] = make_input(50 + (uint64_t)k, ctx.rank, full_count), reduced[k] = make_zeros(chunk);
            ck_assert_int_eq(comm_all_gather_start(&ctx, &gather_stream, shards[k], fulls[k], full_count, "test",
                                                   &gathers[k]), 0);
            ck_assert_int_eq(comm_reduce_scatter_start(&ctx, &reduce_stream, grads[k], reduced[k], full_count, COMM_AVG,
                                                       "test", &reduces[k]), 0);
        }
        for (int k = 0; k < IN_FLIGHT; k++) {
            ck_assert_int_eq(comm_wait(&ctx, &gathers[k], "test"), 0);
            ck_assert_int_eq(comm_wait(&ctx, &reduces[k], "test"), 0);
            CK_ASSERT_ALL(&ctx, comm_done(&gathers[k]) && comm_done(&reduces[k]), "a waited collective is not done");
            CK_ASSERT_ALL(&ctx, strcmp(ctx.last_collective.op, "reduce_scatter") == 0 &&
                                    ctx.last_collective.issue_us <= ctx.last_collective.start_us,
                          "reduce_scatter event: issued at %.3f, started at %.3f", ctx.last_collective.issue_us,
                          ctx.last_collective.start_us);
            float *full = make_zeros(full_count), *shard = make_zeros(chunk);
            ck_assert_int_eq(comm_all_gather(&ctx, shards[k], full, full_count, "test"), 0);
            ck_assert_int_eq(comm_reduce_scatter(&ctx, grads[k], shard, full_count, COMM_AVG, "test"), 0);
            CK_ASSERT_ALL(&ctx, memcmp(full, fulls[k], full_count * sizeof(float)) == 0 &&
                                    memcmp(shard, reduced[k], chunk * sizeof(float)) == 0,
                          "collective %d of %zu floats on a stream differs from the blocking form", k, full_count);
            mem_free(&ctx.mem, full);
            mem_free(&ctx.mem, shard);
            mem_free(&ctx.mem, shards[k]);
            mem_free(&ctx.mem, fulls[k]);
            mem_free(&ctx.mem, grads[k]);
            mem_free(&ctx.mem, reduced[k]);
        }
    }
    stream_destroy(&gather_stream);
    stream_destroy(&reduce_stream);
}
END_TEST

/* Process groups (core/comm/group.h): for every shard group size S dividing the world, the mesh's collectives equal
 * what the inputs say (every rank's input is a function of (tag, world rank, index), so each rank computes the expected
 * result alone): an all-gather and a mean reduce-scatter in the shard group, blocking; an all-reduce across the
 * replicate group on a worker stream; ring bytes of the group's size; a mismatch inside a group names world ranks. */
START_TEST(test_group_collectives_match_their_members_inputs) {
    for (int shard_size = 1; shard_size <= ctx.world_size; shard_size++) {
        if (ctx.world_size % shard_size != 0) continue;
        group_mesh mesh;
        ck_assert_msg(group_mesh_init(&mesh, &ctx, shard_size) == 0, "%s", ctx.error);
        const comm_group *shard = &mesh.shard, *replicate = &mesh.replicate;
        CK_ASSERT_ALL(&ctx, shard->size == shard_size && replicate->size == ctx.world_size / shard_size &&
                                group_world_rank(shard, shard->rank) == ctx.rank &&
                                group_world_rank(replicate, replicate->rank) == ctx.rank,
                      "mesh %d x %d: rank %d is shard member %d of %d, replicate member %d of %d",
                      ctx.world_size / shard_size, shard_size, ctx.rank, shard->rank, shard->size, replicate->rank,
                      replicate->size);
        stream worker;
        ck_assert_msg(stream_init(&worker, &ctx, "reduce_scatter", STREAM_WORKER) == 0, "%s", ctx.error);
        ck_assert_msg(stream_add_group(&worker, shard) == 0 && stream_add_group(&worker, replicate) == 0, "%s",
                      ctx.error);
        for (size_t c = 0; c < COUNT_OF(chunk_counts); c++) {
            size_t chunk = chunk_counts[c], full_count = chunk * (size_t)shard_size;
            comm_handle handle;
            /* all-gather in the shard group: member m's shard at m * chunk */
            float *mine = make_input(60, ctx.rank, chunk), *full = make_zeros(full_count);
            ck_assert_int_eq(comm_all_gather_group_start(&ctx, shard, NULL, mine, full, full_count, "test", &handle),
                             0);
            ck_assert_int_eq(comm_wait(&ctx, &handle, NULL), 0);
            int gathered = ctx.last_collective.bytes_sent == (uint64_t)(shard_size - 1) * chunk * 4;
            for (int m = 0; m < shard_size; m++)
                for (size_t i = 0; i < chunk; i++)
                    gathered &= full[(size_t)m * chunk + i] == input_value(60, group_world_rank(shard, m), i);
            CK_ASSERT_ALL(&ctx, gathered, "all_gather of %zu floats in shard groups of %d", full_count, shard_size);
            /* mean reduce-scatter in the shard group: my chunk of the members' buffers */
            float *grads = make_input(61, ctx.rank, full_count), *reduced = make_zeros(chunk);
            ck_assert_int_eq(comm_reduce_scatter_group_start(&ctx, shard, NULL, grads, reduced, full_count, COMM_AVG,
                                                             "test", &handle), 0);
            ck_assert_int_eq(comm_wait(&ctx, &handle, NULL), 0);
            double worst = 0.0;
            for (size_t i = 0; i < chunk; i++) {
                double sum = 0.0;
                for (int m = 0; m < shard_size; m++)
                    sum += input_value(61, group_world_rank(shard, m), (size_t)shard->rank * chunk + i);
                worst = fmax(worst, fabs(reduced[i] - sum / shard_size) / fmax(1.0, fabs(sum / shard_size)));
            }
            CK_ASSERT_ALL(&ctx, worst <= 1e-6, "reduce_scatter (avg) of %zu floats in shard groups of %d: error %.3g",
                          full_count, shard_size, worst);
            /* sum all-reduce across the replicate group, on the worker stream */
            float *buffer = make_input(62, ctx.rank, chunk);
            ck_assert_int_eq(comm_all_reduce_group_start(&ctx, replicate, &worker, buffer, chunk, COMM_SUM, "test",
                                                         &handle), 0);
            ck_assert_int_eq(comm_wait(&ctx, &handle, NULL), 0);
            uint64_t ring = (uint64_t)(2.0 * (replicate->size - 1) / replicate->size * (double)chunk * 4);
            worst = ctx.last_collective.bytes_sent == ring ? 0.0 : 1.0;
            for (size_t i = 0; i < chunk; i++) {
                double sum = 0.0;
                for (int m = 0; m < replicate->size; m++) sum += input_value(62, group_world_rank(replicate, m), i);
                worst = fmax(worst, fabs(buffer[i] - sum) / fmax(1.0, fabs(sum)));
            }
            CK_ASSERT_ALL(&ctx, worst <= 1e-6, "all_reduce of %zu floats across replicate groups of %d: error %.3g "
                          "(bytes sent %llu, a ring moves %llu)", chunk, replicate->size, worst,
                          (unsigned long long)ctx.last_collective.bytes_sent, (unsigned long long)ring);
            mem_free(&ctx.mem, mine);
            mem_free(&ctx.mem, full);
            mem_free(&ctx.mem, grads);
            mem_free(&ctx.mem, reduced);
            mem_free(&ctx.mem, buffer);
        }
        if (shard_size >= 2) { /* the last member of each shard group passes one float more */
            size_t count = (size_t)shard_size * (shard->rank == shard_size - 1 ? 8 : 7);
            float *mine = make_zeros(8), *full = make_zeros(count);
            comm_handle handle;
            int status = comm_all_gather_group_start(&ctx, shard, NULL, mine, full, count, "mismatch", &handle);
            char expected[128];
            int other = shard->rank == shard_size - 1 ? 0 : shard_size - 1; /* the member whose count differs */
            snprintf(expected, sizeof expected, "rank %d passed %zu floats", group_world_rank(shard, other),
                     (size_t)shard_size * (shard->rank == shard_size - 1 ? 7 : 8));
            CK_ASSERT_ALL(&ctx, status == -1 && strstr(ctx.error, expected) != NULL,
                          "a count mismatch in a shard group: status %d, '%s' (expected it to name '%s')", status,
                          ctx.error, expected);
            mem_free(&ctx.mem, mine);
            mem_free(&ctx.mem, full);
        }
        stream_destroy(&worker);
        group_mesh_free(&mesh);
    }
}
END_TEST

/* A stream runs its work in launch order, and stream_wait holds later work until another stream's event. */
static void append_digit(void *arg) {
    int *log = arg; /* log[0] is the count; then the digits in the order they ran */
    log[1 + log[0]] = log[0];
    log[0]++;
}

static void sleep_a_little(void *arg) {
    (void)arg;
    double until = MPI_Wtime() + 0.02;
    while (MPI_Wtime() < until) {}
}

static void record_value(void *arg) {
    int *pair = arg; /* pair[1] = what pair[0] held when this ran */
    pair[1] = pair[0];
}

static void set_value(void *arg) { *(int *)arg = 7; }

START_TEST(test_streams_keep_order_and_wait_for_events) {
    stream first, second;
    ck_assert_msg(stream_init(&first, &ctx, "first", STREAM_WORKER) == 0, "%s", ctx.error);
    ck_assert_msg(stream_init(&second, &ctx, "second", STREAM_WORKER) == 0, "%s", ctx.error);
    int log[1 + 100] = {0};
    for (int i = 0; i < 100; i++) stream_launch(&first, append_digit, log);
    stream_synchronize(&first);
    int ordered = log[0] == 100;
    for (int i = 0; i < 100; i++) ordered &= log[1 + i] == i;
    CK_ASSERT_ALL(&ctx, ordered, "a stream ran its 100 tasks out of order (%d ran)", log[0]);
    /* second waits for an event recorded on first after a slow task that sets the value: it must see 7 */
    int pair[2] = {0, -1};
    stream_event done = {0};
    stream_launch(&first, sleep_a_little, NULL);
    stream_launch(&first, set_value, &pair[0]);
    event_record(&done, &first);
    ck_assert_double_eq(stream_wait(&second, &done), 0.0); /* a worker stream waits, not the host */
    stream_launch(&second, record_value, pair);
    stream_synchronize(&second);
    CK_ASSERT_ALL(&ctx, pair[1] == 7 && event_query(&done), "work after stream_wait ran before the event (saw %d)",
                  pair[1]);
    /* the host stream: launched work runs at once; its event is complete when recorded */
    stream host;
    ck_assert_int_eq(stream_init(&host, &ctx, "compute", STREAM_HOST), 0);
    int value = 0;
    stream_launch(&host, set_value, &value);
    stream_event recorded = {0};
    event_record(&recorded, &host);
    CK_ASSERT_ALL(&ctx, value == 7 && event_query(&recorded), "host stream: value %d, event %d", value,
                  event_query(&recorded));
    stream_destroy(&host);
    stream_destroy(&first);
    stream_destroy(&second);
}
END_TEST

/* bfloat16 (mixed precision): the all-gather moves the 2-byte elements bit for bit, half the bytes; the ring
 * reduce-scatter's result is, bit for bit, the bfloat16 sum in the ring's order (chunk c starts at rank c + 1, each
 * hop rounding received + mine once, as c10::BFloat16's a + b), then for a mean times 1/N rounded once. Every rank's
 * input is computable anywhere (input_value), so the reference needs no communication. */
START_TEST(test_bfloat16_collectives) {
    int world = ctx.world_size;
    for (size_t c = 0; c < COUNT_OF(chunk_counts); c++) {
        size_t chunk = chunk_counts[c], full_count = chunk * (size_t)world;
        bf16 *shard = mem_alloc_typed(&ctx.mem, chunk * 2, MEM_WORKSPACE, DTYPE_BFLOAT16, "test.bf16_shard");
        bf16 *full = mem_alloc_typed(&ctx.mem, full_count * 2, MEM_WORKSPACE, DTYPE_BFLOAT16, "test.bf16_full");
        for (size_t i = 0; i < chunk; i++) shard[i] = bf16_from_float(input_value(31, ctx.rank, i));
        ck_assert_int_eq(comm_all_gather_typed(&ctx, NULL, NULL, shard, full, full_count, DTYPE_BFLOAT16, "test", NULL),
                         0);
        int same = 1;
        for (size_t i = 0; i < full_count; i++)
            same &= full[i] == bf16_from_float(input_value(31, (int)(i / chunk), i % chunk));
        const trace_collective_info *info = &ctx.last_collective;
        CK_ASSERT_ALL(&ctx, same && info->bytes == full_count * 2 && strcmp(info->dtype, "bfloat16") == 0 &&
                      info->bytes_sent == (uint64_t)(world - 1) * chunk * 2,
                      "bfloat16 all_gather of %zu: same %d, bytes %llu", full_count, same,
                      (unsigned long long)info->bytes);
        for (int reduce = COMM_SUM; reduce <= COMM_AVG; reduce++) {
            for (size_t i = 0; i < full_count; i++) full[i] = bf16_from_float(input_value(41, ctx.rank, i));
            ck_assert_int_eq(comm_reduce_scatter_typed(&ctx, NULL, NULL, full, shard, full_count, DTYPE_BFLOAT16,
                                                       (comm_reduce)reduce, "test", NULL), 0);
            int exact = 1;
            for (size_t i = 0; i < chunk; i++) {
                size_t at = (size_t)ctx.rank * chunk + i;
                bf16 sum = bf16_from_float(input_value(41, (ctx.rank + 1) % world, at));
                for (int k = 2; k <= world; k++)
                    sum = bf16_add(sum, bf16_from_float(input_value(41, (ctx.rank + k) % world, at)));
                if (reduce == COMM_AVG && world > 1) sum = bf16_from_float(bf16_to_float(sum) * (1.0f / (float)world));
                exact &= shard[i] == sum;
            }
            CK_ASSERT_ALL(&ctx, exact && ctx.last_collective.bytes == full_count * 2,
                          "bfloat16 reduce_scatter (%s) of %zu differs from the ring's bfloat16 sum",
                          reduce == COMM_AVG ? "avg" : "sum", full_count);
        }
        mem_free(&ctx.mem, shard);
        mem_free(&ctx.mem, full);
    }
}
END_TEST

/* The bfloat16 all-reduce (NO_SHARD's gradient, HYBRID_SHARD's replicate group): any count, cut into N chunks of
 * count / N elements, the first count % N one more; chunk c's result is, bit for bit, the reduce-scatter ring's
 * bfloat16 sum (starting at rank c + 1, each hop rounding received + mine once), for a mean times 1/N rounded once,
 * and every rank holds every chunk's. Ring traffic 2 (N - 1) / N of the 2-byte buffer; its receive buffer is freed. */
START_TEST(test_bfloat16_all_reduce) {
    int world = ctx.world_size;
    const size_t counts[] = {1, 5, 7, 1000, 4099, (size_t)world * 3 + 1};
    for (size_t c = 0; c < COUNT_OF(counts); c++) {
        size_t count = counts[c], base = count / (size_t)world, extra = count % (size_t)world;
        bf16 *buffer = mem_alloc_typed(&ctx.mem, count * 2, MEM_WORKSPACE, DTYPE_BFLOAT16, "test.bf16_buffer");
        for (int reduce = COMM_SUM; reduce <= COMM_AVG; reduce++) {
            for (size_t i = 0; i < count; i++) buffer[i] = bf16_from_float(input_value(43, ctx.rank, i));
            size_t comm_before = ctx.mem.category_live_bytes[MEM_COMM_BUFFER];
            ck_assert_int_eq(comm_all_reduce_typed(&ctx, NULL, NULL, buffer, count, DTYPE_BFLOAT16,
                                                   (comm_reduce)reduce, "test", NULL), 0);
            int exact = 1;
            for (size_t i = 0; i < count; i++) {
                /* the chunk holding element i: chunks 0 .. extra - 1 have base + 1 elements */
                size_t chunk = i < extra * (base + 1) ? i / (base + 1) : extra + (i - extra * (base + 1)) / base;
                bf16 sum = bf16_from_float(input_value(43, (int)((chunk + 1) % (size_t)world), i));
                for (int k = 2; k <= world; k++)
                    sum =
                        bf16_add(sum, bf16_from_float(input_value(43, (int)((chunk + (size_t)k) % (size_t)world), i)));
                if (reduce == COMM_AVG && world > 1) sum = bf16_from_float(bf16_to_float(sum) * (1.0f / (float)world));
                exact &= buffer[i] == sum;
            }
            const trace_collective_info *info = &ctx.last_collective;
            uint64_t ring = (uint64_t)(2.0 * (double)(world - 1) / (double)world * (double)count * 2.0);
            CK_ASSERT_ALL(&ctx, exact && info->bytes == count * 2 && strcmp(info->dtype, "bfloat16") == 0 &&
                          info->bytes_sent == ring && ctx.mem.category_live_bytes[MEM_COMM_BUFFER] == comm_before,
                          "bfloat16 all_reduce (%s) of %zu: exact %d, bytes %llu, sent %llu (expected %llu)",
                          reduce == COMM_AVG ? "avg" : "sum", count, exact, (unsigned long long)info->bytes,
                          (unsigned long long)info->bytes_sent, (unsigned long long)ring);
        }
        mem_free(&ctx.mem, buffer);
    }
}
END_TEST

int main(int argc, char **argv) {
    session_open(&ctx, &argc, &argv, "test_comm", "runs/check/test_comm");
    Suite *suite = suite_create("comm");
    TCase *tc = tcase_create("collectives");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_all_gather_matches_reference);
    tcase_add_test(tc, test_reduce_scatter_matches_reference);
    tcase_add_test(tc, test_all_reduce_matches_reference);
    tcase_add_test(tc, test_broadcast_matches_reference_from_every_root);
    tcase_add_test(tc, test_mismatched_counts_fail_on_every_rank);
    tcase_add_test(tc, test_mismatched_ops_fail_on_every_rank);
    tcase_add_test(tc, test_indivisible_shard_sizes_are_refused);
    tcase_add_test(tc, test_sequence_numbers_agree_across_ranks);
    tcase_add_test(tc, test_agreement_once_per_signature);
    tcase_add_test(tc, test_mismatch_after_an_agreed_signature_is_caught);
    tcase_add_test(tc, test_mismatched_units_fail_on_every_rank);
    tcase_add_test(tc, test_start_wait_on_streams_equals_blocking);
    tcase_add_test(tc, test_streams_keep_order_and_wait_for_events);
    tcase_add_test(tc, test_group_collectives_match_their_members_inputs);
    tcase_add_test(tc, test_bfloat16_collectives);
    tcase_add_test(tc, test_bfloat16_all_reduce);
    suite_add_tcase(suite, tc);
    return mpi_check_run(&ctx, suite);
}
