/* self_test.cu — the CUDA emulator's own barriers checked (built only by `make CUDA=emulated`; the unit suite runs
 * it): what gpu_layers and the labs rely on without testing it directly. Every kernel of core/cuda/ that reduces
 * meets its threads at __syncthreads and at the warp barrier inside __shfl_down_sync, and the emulator hands the
 * block from fiber to fiber at each (emulator.cpp's pass_on) and keeps a shuffle's words in two sets that alternate
 * (cuda_runtime.h). So:
 *
 *   emulator_self_test          sums per block by shuffles (16 rounds back to back, each reading what the round before
 *                               wrote) and by a shared-memory tree with __syncthreads, for blocks of 1 to 1024
 *                               threads (a warp cut short too) and grids of several blocks, against the serial sums;
 *                               prints "N passed, N failed", exit 1 on any failure
 *   emulator_self_test stuck    one thread leaves before a __syncthreads the others wait at: the emulator must abort
 *                               naming the block and the threads left waiting, not hang or run on (the unit suite
 *                               checks that message)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cuda/cuda_check.h" /* CUDA_CHECK: a failed call aborts, naming the call */

enum { ROUNDS = 16 };

/* Each thread's value v = in[global index]; per round, every lane takes v += the value `offset` lanes up (its own past
 * the warp's end), offsets cycling 1, 2, 4, 8, 16: out_shuffle[i] is the lane's value after ROUNDS such rounds (a
 * round that read the words of the round before, or of the round after, gives other numbers; checked in full warps
 * only: a lane past a short warp's last is undefined on a GPU). Then the block's sum by a shared tree:
 * out_block[blockIdx.x]. */
__global__ void barriers_kernel(long long *out_shuffle, long long *out_block, const long long *in, int n) {
    __shared__ long long tree[1024];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    long long v = i < n ? in[i] : 0;
    long long s = v;
    for (int r = 0; r < ROUNDS; r++) s += __shfl_down_sync(0xffffffffu, s, 1 << (r % 5));
    if (i < n) out_shuffle[i] = s;
    tree[threadIdx.x] = v;
    __syncthreads();
    for (int half = 1; half < (int)blockDim.x; half *= 2) {
        long long other = threadIdx.x % (2 * half) == 0 && threadIdx.x + half < blockDim.x ? tree[threadIdx.x + half]
                                                                                             : 0;
        __syncthreads();
        tree[threadIdx.x] += other;
        __syncthreads();
    }
    if (threadIdx.x == 0) out_block[blockIdx.x] = tree[0];
}

/* Thread 0 of each block leaves; the others wait at a barrier it never reaches. */
__global__ void stuck_kernel(float *out) {
    if (threadIdx.x == 0) return;
    __syncthreads();
    out[threadIdx.x] = 1.0f;
}

/* The serial reference of barriers_kernel's shuffle rounds for one full warp (its values s). */
static void shuffle_reference(long long *s) {
    long long next[32];
    for (int r = 0; r < ROUNDS; r++) {
        int offset = 1 << (r % 5);
        for (int l = 0; l < 32; l++) next[l] = s[l] + (l + offset < 32 ? s[l + offset] : s[l]);
        memcpy(s, next, sizeof(next));
    }
}

static int check_shape(int blocks, int threads) {
    int n = blocks * threads - threads / 3; /* the last block part-filled: its idle threads add 0 */
    if (n < 1) n = 1;
    size_t total = (size_t)blocks * threads;
    long long *host_in = (long long *)calloc(total, sizeof(long long));
    long long *expect_shuffle = (long long *)calloc(total, sizeof(long long));
    long long *got_shuffle = (long long *)calloc(total, sizeof(long long));
    long long *got_block = (long long *)calloc(blocks, sizeof(long long));
    if (!host_in || !expect_shuffle || !got_shuffle || !got_block) {
        fprintf(stderr, "emulator_self_test: out of host memory\n");
        exit(2);
    }
    for (int i = 0; i < n; i++) host_in[i] = (long long)(i * 7919 % 1009) - 500;
    long long *in, *out_shuffle, *out_block;
    CUDA_CHECK(0, cudaMalloc((void **)&in, total * sizeof(long long)));
    CUDA_CHECK(0, cudaMalloc((void **)&out_shuffle, total * sizeof(long long)));
    CUDA_CHECK(0, cudaMalloc((void **)&out_block, blocks * sizeof(long long)));
    CUDA_CHECK(0, cudaMemcpyAsync(in, host_in, total * sizeof(long long), cudaMemcpyHostToDevice, 0));
    barriers_kernel<<<blocks, threads>>>(out_shuffle, out_block, in, n);
    CUDA_CHECK(0, cudaGetLastError());
    CUDA_CHECK(0, cudaMemcpyAsync(got_shuffle, out_shuffle, n * sizeof(long long), cudaMemcpyDeviceToHost, 0));
    CUDA_CHECK(0, cudaMemcpyAsync(got_block, out_block, blocks * sizeof(long long), cudaMemcpyDeviceToHost, 0));
    CUDA_CHECK(0, cudaStreamSynchronize(0));
    int bad = 0;
    for (int b = 0; b < blocks; b++) {
        long long sum = 0;
        for (int t = 0; t < threads; t++) sum += host_in[(size_t)b * threads + t];
        if (got_block[b] != sum) {
            if (!bad) fprintf(stderr, "  block %d: tree sum %lld, expected %lld\n", b, got_block[b], sum);
            bad = 1;
        }
        for (int w = 0; (w + 1) * 32 <= threads; w++) {
            long long *s = expect_shuffle + (size_t)b * threads + w * 32;
            memcpy(s, host_in + (size_t)b * threads + w * 32, sizeof(long long) * 32);
            shuffle_reference(s);
        }
    }
    for (int i = 0; i < n && !bad; i++)
        if (i % threads / 32 * 32 + 32 <= threads && got_shuffle[i] != expect_shuffle[i]) {
            fprintf(stderr, "  thread %d (block %d, lane %d): shuffles gave %lld, expected %lld\n", i, i / threads,
                    i % threads % 32, got_shuffle[i], expect_shuffle[i]);
            bad = 1;
        }
    printf("%s: %d blocks of %d threads (%d values): shuffles and the block's tree\n", bad ? "FAIL" : "PASS", blocks,
           threads, n);
    CUDA_CHECK(0, cudaFree(in));
    CUDA_CHECK(0, cudaFree(out_shuffle));
    CUDA_CHECK(0, cudaFree(out_block));
    free(host_in);
    free(expect_shuffle);
    free(got_shuffle);
    free(got_block);
    return bad;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "stuck") == 0) {
        float *out;
        CUDA_CHECK(0, cudaMalloc((void **)&out, 64 * sizeof(float)));
        stuck_kernel<<<2, 64>>>(out);
        CUDA_CHECK(0, cudaStreamSynchronize(0));
        printf("stuck_kernel returned: the emulator did not see the barrier thread 0 never reaches\n");
        return 1;
    }
    static const int shapes[][2] = {{1, 1}, {1, 31}, {1, 32}, {3, 33}, {2, 100}, {4, 256}, {1, 1000}, {2, 1024}};
    int failed = 0, count = (int)(sizeof(shapes) / sizeof(shapes[0]));
    for (int s = 0; s < count; s++) failed += check_shape(shapes[s][0], shapes[s][1]);
    printf("%d passed, %d failed\n", count - failed, failed);
    return failed ? 1 : 0;
}
