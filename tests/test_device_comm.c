/* test_device_comm.c — the collectives on the context's device memory: whatever DEVICE and BACKEND say, every
 * collective gives what its members' inputs say, blocking and on comm streams, in the world and in process groups.
 *
 *   mpirun -np 1..4 tests/bin/test_device_comm                                  the CPU device (host memory, MPI)
 *   DEVICE=cuda BACKEND=mpi  mpirun -np 2 build/cuda/tests/bin/test_device_comm  GPU buffers staged through pinned
 *                                                                                memory (two ranks may share a GPU)
 *   BACKEND=nccl mpirun -np <GPUs> build/cuda/tests/bin/test_device_comm         NCCL on GPU buffers
 *
 * Buffers live where the device keeps tensors (ctx.mem) and reach the host only through device copies, as the
 * runtime's do. Inputs are small multiples of 1/4 (|x| <= 8), so every sum of up to 4 ranks is exact in float32 and in
 * bfloat16 (at most 8 significant bits), whatever order the backend adds in: a sum and a mean over a power-of-two group
 * must be exact. A mean over another N: the MPI path rounds the exact sum times fl(1/N) (2 roundings), NCCL may round
 * each input times 1/N and then each partial sum (N + 1 roundings), each at most u relative (u = 2^-24 in float32,
 * 2^-8 in bfloat16) of at most sum |x| / N: the bound is (N + 3) u sum|x| / N. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/comm/comm.h"
#include "core/comm/group.h"
#include "core/runtime/world.h"
#include "core/runtime/session.h"
#include "mpi_check.h"

static context ctx; /* the one context of this test program */

static const size_t chunk_counts[] = {1, 7, 1000, 4099};
#define COUNT_OF(array) (sizeof(array) / sizeof((array)[0]))

/* Rank r's element i of buffer `tag`: a multiple of 1/4 in [-6, 7.25]. */
static float input_value(int tag, int rank, size_t i) {
    return (float)((int)((i * 7 + (size_t)tag * 3) % 13) - 6) + 0.25f * (float)((rank + tag) % 5);
}

static int power_of_two(int n) { return n > 0 && (n & (n - 1)) == 0; }

static void *host_buffer(size_t bytes) {
    void *buffer = calloc(1, bytes ? bytes : 1);
    if (buffer == NULL) world_fatal(&ctx, "out of memory for a %zu-byte host buffer", bytes);
    return buffer;
}

/* A device buffer holding rank `rank`'s input `tag` in `type`, elements [first, first + count) of it. */
static void *device_input(int tag, int rank, size_t first, size_t count, dtype type) {
    size_t bytes = count * dtype_size(type);
    void *host = host_buffer(bytes);
    for (size_t i = 0; i < count; i++) {
        float value = input_value(tag, rank, first + i);
        if (type == DTYPE_BFLOAT16) ((bf16 *)host)[i] = bf16_from_float(value);
        else ((float *)host)[i] = value;
    }
    void *on_device = mem_alloc_typed(&ctx.mem, bytes, MEM_WORKSPACE, type, "test.input");
    ctx.device.copy(&ctx.device, on_device, host, bytes, DEVICE_H2D);
    free(host);
    return on_device;
}

static void *device_zeros(size_t count, dtype type) {
    return mem_alloc_typed(&ctx.mem, count * dtype_size(type), MEM_WORKSPACE, type, "test.output");
}

/* The device buffer's elements as floats on the host (the caller frees). */
static float *to_host(const void *on_device, size_t count, dtype type) {
    size_t bytes = count * dtype_size(type);
    void *raw = host_buffer(bytes);
    ctx.device.copy(&ctx.device, raw, on_device, bytes, DEVICE_D2H);
    float *values = host_buffer(count * sizeof(float));
    for (size_t i = 0; i < count; i++)
        values[i] = type == DTYPE_BFLOAT16 ? bf16_to_float(((bf16 *)raw)[i]) : ((float *)raw)[i];
    free(raw);
    return values;
}

/* Element i of the sum (or mean) over `members` world ranks of input `tag`, and the bound above on its error. */
static double reduced_value(int tag, const int *members, int size, size_t i, comm_reduce reduce, dtype type,
                            double *bound) {
    double sum = 0.0, magnitude = 0.0;
    for (int m = 0; m < size; m++) {
        double x = input_value(tag, members[m], i);
        sum += x, magnitude += fabs(x);
    }
    double u = type == DTYPE_BFLOAT16 ? ldexp(1.0, -8) : ldexp(1.0, -24);
    *bound = reduce == COMM_AVG && !power_of_two(size) ? (size + 3) * u * magnitude / size : 0.0;
    return reduce == COMM_AVG ? sum / size : sum;
}

/* The world ranks of this rank's group (NULL: the world), in group order. */
static int *members_of(const comm_group *group, int *size) {
    *size = group ? group->size : ctx.world_size;
    int *members = host_buffer(sizeof(int) * (size_t)*size);
    for (int m = 0; m < *size; m++) members[m] = group ? group_world_rank(group, m) : m;
    return members;
}

/* An all-gather and a reduce-scatter (sum and mean) of every size in `group`, in `type`, on `on` (NULL: blocking),
 * checked element by element; the all-gather also in place (the shard at its chunk of the output). */
static void gather_and_reduce(const comm_group *group, stream *on, dtype type) {
    int size = 0, rank = group ? group->rank : ctx.rank;
    int *members = members_of(group, &size);
    const char *where = group ? group->name : "world";
    for (size_t c = 0; c < COUNT_OF(chunk_counts); c++) {
        size_t chunk = chunk_counts[c], full_count = chunk * (size_t)size;
        for (int in_place = 0; in_place < 2; in_place++) {
            /* One buffer, the whole, from which each member takes its chunk. */
            void *shard = device_input(11, ctx.world_size + 1, (size_t)rank * chunk, chunk, type);
            void *full = device_zeros(full_count, type);
            const void *send = shard;
            if (in_place) {
                char *own = (char *)full + (size_t)rank * chunk * dtype_size(type);
                ctx.device.copy(&ctx.device, own, shard, chunk * dtype_size(type), DEVICE_D2D);
                send = own;
            }
            comm_handle handle;
            ck_assert_msg(comm_all_gather_typed(&ctx, group, on, send, full, full_count, type, "test", &handle) == 0,
                          "%s", ctx.error);
            if (on != NULL) ck_assert_msg(comm_wait(&ctx, &handle, "test") == 0, "%s", ctx.error);
            float *got = to_host(full, full_count, type);
            size_t wrong = full_count;
            for (size_t i = 0; i < full_count && wrong == full_count; i++)
                if (got[i] != input_value(11, ctx.world_size + 1, i)) wrong = i;
            CK_ASSERT_ALL(&ctx, wrong == full_count, "%s all_gather of %zu %s (%s, %s): element %zu is %g, expected %g",
                          where, full_count, dtype_name(type), in_place ? "in place" : "apart",
                          on ? on->name : "blocking", wrong, wrong < full_count ? got[wrong] : 0.0,
                          wrong < full_count ? input_value(11, ctx.world_size + 1, wrong) : 0.0);
            free(got);
            mem_free(&ctx.mem, full);
            mem_free(&ctx.mem, shard);
        }
        for (comm_reduce reduce = COMM_SUM; reduce <= COMM_AVG; reduce++) {
            void *full = device_input(23, ctx.rank, 0, full_count, type), *shard = device_zeros(chunk, type);
            comm_handle handle;
            ck_assert_msg(comm_reduce_scatter_typed(&ctx, group, on, full, shard, full_count, type, reduce, "test",
                                                    &handle) == 0, "%s", ctx.error);
            if (on != NULL) ck_assert_msg(comm_wait(&ctx, &handle, "test") == 0, "%s", ctx.error);
            float *got = to_host(shard, chunk, type);
            size_t wrong = chunk;
            double expected = 0.0, bound = 0.0;
            for (size_t i = 0; i < chunk && wrong == chunk; i++) {
                expected = reduced_value(23, members, size, (size_t)rank * chunk + i, reduce, type, &bound);
                if (!(fabs(got[i] - expected) <= bound)) wrong = i;
            }
            CK_ASSERT_ALL(&ctx, wrong == chunk, "%s reduce_scatter (%s) of %zu %s (%s): element %zu is %.9g, "
                          "expected %.9g within %.3g", where, reduce == COMM_AVG ? "avg" : "sum", full_count,
                          dtype_name(type), on ? on->name : "blocking", wrong, wrong < chunk ? got[wrong] : 0.0,
                          expected, bound);
            free(got);
            mem_free(&ctx.mem, shard);
            mem_free(&ctx.mem, full);
        }
    }
    free(members);
}

/* An all-reduce (sum and mean) in `group` on `on` (NULL: blocking). */
static void all_reduce(const comm_group *group, stream *on) {
    int size = 0;
    int *members = members_of(group, &size);
    for (size_t c = 0; c < COUNT_OF(chunk_counts); c++) {
        size_t count = chunk_counts[c] * 3 + 1; /* any count */
        for (comm_reduce reduce = COMM_SUM; reduce <= COMM_AVG; reduce++) {
            float *buffer = device_input(31, ctx.rank, 0, count, DTYPE_FLOAT32);
            comm_handle handle;
            int status = on || group ? comm_all_reduce_group_start(&ctx, group, on, buffer, count, reduce, "test",
                                                                   &handle)
                                     : comm_all_reduce(&ctx, buffer, count, reduce, "test");
            ck_assert_msg(status == 0, "%s", ctx.error);
            if (on || group) ck_assert_msg(comm_wait(&ctx, &handle, "test") == 0, "%s", ctx.error);
            float *got = to_host(buffer, count, DTYPE_FLOAT32);
            size_t wrong = count;
            double expected = 0.0, bound = 0.0;
            for (size_t i = 0; i < count && wrong == count; i++) {
                expected = reduced_value(31, members, size, i, reduce, DTYPE_FLOAT32, &bound);
                if (!(fabs(got[i] - expected) <= bound)) wrong = i;
            }
            CK_ASSERT_ALL(&ctx, wrong == count, "%s all_reduce (%s) of %zu floats (%s): element %zu is %.9g, expected "
                          "%.9g within %.3g", group ? group->name : "world", reduce == COMM_AVG ? "avg" : "sum",
                          count, on ? on->name : "blocking", wrong, wrong < count ? got[wrong] : 0.0, expected, bound);
            free(got);
            mem_free(&ctx.mem, buffer);
        }
    }
    free(members);
}

START_TEST(test_memory_is_the_devices) {
    /* mem_alloc's blocks are zeroed by the device (cudaMemsetAsync on CUDA), copies round-trip exactly. */
    size_t count = 100003;
    float *zeros = device_zeros(count, DTYPE_FLOAT32);
    float *got = to_host(zeros, count, DTYPE_FLOAT32);
    size_t nonzero = 0;
    for (size_t i = 0; i < count; i++) nonzero += got[i] != 0.0f;
    free(got);
    float *input = device_input(5, ctx.rank, 0, count, DTYPE_FLOAT32);
    ctx.device.copy(&ctx.device, zeros, input, count * sizeof(float), DEVICE_D2D);
    got = to_host(zeros, count, DTYPE_FLOAT32);
    size_t wrong = 0;
    for (size_t i = 0; i < count; i++) wrong += got[i] != input_value(5, ctx.rank, i);
    free(got);
    mem_free(&ctx.mem, input);
    mem_free(&ctx.mem, zeros);
    CK_ASSERT_ALL(&ctx, nonzero == 0 && wrong == 0, "device %s: %zu of %zu zeroed elements are not 0, %zu copied "
                  "ones differ", ctx.device.name, nonzero, count, wrong);
}
END_TEST

START_TEST(test_world_collectives_blocking) {
    gather_and_reduce(NULL, NULL, DTYPE_FLOAT32);
    gather_and_reduce(NULL, NULL, DTYPE_BFLOAT16);
    all_reduce(NULL, NULL);
    for (int root = 0; root < ctx.world_size; root++) {
        size_t count = 1001;
        float *buffer = device_input(41, ctx.rank, 0, count, DTYPE_FLOAT32);
        ck_assert_msg(comm_broadcast(&ctx, buffer, count, root, "test") == 0, "%s", ctx.error);
        float *got = to_host(buffer, count, DTYPE_FLOAT32);
        size_t wrong = 0;
        for (size_t i = 0; i < count; i++) wrong += got[i] != input_value(41, root, i);
        free(got);
        mem_free(&ctx.mem, buffer);
        CK_ASSERT_ALL(&ctx, wrong == 0, "broadcast from rank %d: %zu of %zu elements differ", root, wrong, count);
    }
    ck_assert_msg(comm_barrier(&ctx, "test") == 0, "%s", ctx.error);
}
END_TEST

START_TEST(test_world_collectives_on_streams) {
    stream gather_stream, reduce_stream;
    ck_assert_msg(stream_init(&gather_stream, &ctx, "all_gather", STREAM_WORKER) == 0, "%s", ctx.error);
    ck_assert_msg(stream_init(&reduce_stream, &ctx, "reduce_scatter", STREAM_WORKER) == 0, "%s", ctx.error);
    gather_and_reduce(NULL, &gather_stream, DTYPE_FLOAT32);
    gather_and_reduce(NULL, &reduce_stream, DTYPE_BFLOAT16);
    all_reduce(NULL, &reduce_stream);
    /* Several in flight on both streams before any wait: each still gives its own result. */
    enum { IN_FLIGHT = 3 };
    size_t chunk = 4099, full_count = chunk * (size_t)ctx.world_size;
    void *shards[IN_FLIGHT], *fulls[IN_FLIGHT], *grads[IN_FLIGHT], *reduced[IN_FLIGHT];
    comm_handle gathers[IN_FLIGHT], reduces[IN_FLIGHT];
    for (int k = 0; k < IN_FLIGHT; k++) {
        shards[k] = device_input(50 + k, ctx.rank, 0, chunk, DTYPE_FLOAT32);
        fulls[k] = device_zeros(full_count, DTYPE_FLOAT32);
        grads[k] = device_input(60 + k, ctx.rank, 0, full_count, DTYPE_FLOAT32);
        reduced[k] = device_zeros(chunk, DTYPE_FLOAT32);
        ck_assert_msg(comm_all_gather_start(&ctx, &gather_stream, shards[k], fulls[k], full_count, "test",
                                            &gathers[k]) == 0, "%s", ctx.error);
        ck_assert_msg(comm_reduce_scatter_start(&ctx, &reduce_stream, grads[k], reduced[k], full_count, COMM_SUM,
                                                "test", &reduces[k]) == 0, "%s", ctx.error);
    }
    int *members = members_of(NULL, &(int){0});
    for (int k = 0; k < IN_FLIGHT; k++) {
        ck_assert_msg(comm_wait(&ctx, &gathers[k], "test") == 0, "%s", ctx.error);
        ck_assert_msg(comm_wait(&ctx, &reduces[k], "test") == 0, "%s", ctx.error);
        float *gathered = to_host(fulls[k], full_count, DTYPE_FLOAT32);
        float *sums = to_host(reduced[k], chunk, DTYPE_FLOAT32);
        size_t wrong = 0;
        double bound = 0.0;
        for (size_t i = 0; i < full_count; i++)
            wrong += gathered[i] != input_value(50 + k, (int)(i / chunk), i % chunk);
        for (size_t i = 0; i < chunk; i++)
            wrong += sums[i] != reduced_value(60 + k, members, ctx.world_size, (size_t)ctx.rank * chunk + i, COMM_SUM,
                                              DTYPE_FLOAT32, &bound);
        free(gathered);
        free(sums);
        CK_ASSERT_ALL(&ctx, wrong == 0, "in-flight pair %d: %zu elements differ", k, wrong);
        mem_free(&ctx.mem, shards[k]);
        mem_free(&ctx.mem, fulls[k]);
        mem_free(&ctx.mem, grads[k]);
        mem_free(&ctx.mem, reduced[k]);
    }
    free(members);
    stream_destroy(&gather_stream);
    stream_destroy(&reduce_stream);
}
END_TEST

/* HYBRID_SHARD's groups: for every shard size S dividing the world, the shard group's all-gather and reduce-scatter
 * and the replicate group's all-reduce, blocking and on a stream given both groups. */
START_TEST(test_group_collectives) {
    for (int shard_size = 1; shard_size <= ctx.world_size; shard_size++) {
        if (ctx.world_size % shard_size != 0) continue;
        group_mesh mesh;
        ck_assert_msg(group_mesh_init(&mesh, &ctx, shard_size) == 0, "%s", ctx.error);
        stream worker;
        ck_assert_msg(stream_init(&worker, &ctx, "reduce_scatter", STREAM_WORKER) == 0, "%s", ctx.error);
        ck_assert_msg(stream_add_group(&worker, &mesh.shard) == 0 && stream_add_group(&worker, &mesh.replicate) == 0,
                      "%s", ctx.error);
        gather_and_reduce(&mesh.shard, NULL, DTYPE_FLOAT32);
        gather_and_reduce(&mesh.shard, &worker, DTYPE_BFLOAT16);
        all_reduce(&mesh.replicate, NULL);
        all_reduce(&mesh.replicate, &worker);
        stream_destroy(&worker);
        group_mesh_free(&mesh);
    }
}
END_TEST

int main(int argc, char **argv) {
    session_open(&ctx, &argc, &argv, "test_device_comm", "runs/check/test_device_comm");
    if (ctx.rank == 0)
        printf("device %s, backend %s, %d ranks\n", ctx.device.name,
               ctx.collectives != NULL ? ctx.collectives->name : "mpi", ctx.world_size);
    Suite *suite = suite_create("device_comm");
    TCase *tc = tcase_create("collectives on device memory");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_memory_is_the_devices);
    tcase_add_test(tc, test_world_collectives_blocking);
    tcase_add_test(tc, test_world_collectives_on_streams);
    tcase_add_test(tc, test_group_collectives);
    suite_add_tcase(suite, tc);
    return mpi_check_run(&ctx, suite);
}
