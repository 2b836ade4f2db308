/* emulator.cpp — the CUDA emulator's scheduler (see cuda_runtime.h here): each block's threads as fibers. */
#include <stdio.h>
#include <stdlib.h>
#include <ucontext.h>

#include <vector>

#include "cuda_runtime.h"

emulator_index emulator_thread, emulator_block;
dim3 emulator_block_dim, emulator_grid_dim;
uint64_t emulator_lanes[32][32];

namespace {
const size_t STACK_BYTES = 256 * 1024;
ucontext_t scheduler;
std::vector<ucontext_t> fibers;
std::vector<char *> stacks;
std::vector<emulator_index> thread_index;
std::vector<int> finished;
int current = -1, threads = 0;
unsigned long progress = 0; /* arrivals, openings and ends: a round without any is a deadlock */
std::function<void()> *kernel;

/* A barrier for `size` fibers: the last to arrive opens it (a new generation); the others yield until then. */
struct barrier {
    int arrived = 0;
    unsigned long generation = 0;
};
barrier block_barrier, warp_barriers[32];

void yield_to_scheduler() {
    int me = current;
    swapcontext(&fibers[me], &scheduler);
}

void wait_at(barrier &b, int size) {
    unsigned long generation = b.generation;
    progress++;
    if (++b.arrived == size) {
        b.arrived = 0;
        b.generation++;
        return;
    }
    while (b.generation == generation) yield_to_scheduler();
}

void fiber_main() {
    (*kernel)();
    finished[current] = 1;
    progress++;
}
} // namespace

unsigned emulator_linear_thread() {
    return emulator_thread.x + emulator_thread.y * emulator_block_dim.x +
           emulator_thread.z * emulator_block_dim.x * emulator_block_dim.y;
}

void __syncthreads() { wait_at(block_barrier, threads); }

void emulator_warp_barrier() {
    int warp = (int)(emulator_linear_thread() / 32);
    wait_at(warp_barriers[warp], std::min(32, threads - warp * 32));
}

void emulator_launch(dim3 grid, dim3 block, std::function<void()> body) {
    threads = (int)(block.x * block.y * block.z);
    if (grid.x * grid.y * grid.z == 0 || threads == 0 || threads > 1024) {
        fprintf(stderr, "cuda emulator: a launch of %u x %u x %u blocks of %d threads is not valid\n", grid.x, grid.y,
                grid.z, threads);
        abort();
    }
    kernel = &body;
    emulator_block_dim = block;
    emulator_grid_dim = grid;
    while ((int)stacks.size() < threads) stacks.push_back((char *)malloc(STACK_BYTES));
    fibers.resize(threads);
    thread_index.resize(threads);
    finished.assign(threads, 0);
    for (unsigned bz = 0; bz < grid.z; bz++)
        for (unsigned by = 0; by < grid.y; by++)
            for (unsigned bx = 0; bx < grid.x; bx++) {
                emulator_block = {bx, by, bz};
                block_barrier = barrier();
                for (barrier &b : warp_barriers) b = barrier();
                for (int t = 0; t < threads; t++) {
                    thread_index[t] = {t % block.x, t / block.x % block.y, t / (block.x * block.y)};
                    finished[t] = 0;
                    getcontext(&fibers[t]);
                    fibers[t].uc_stack.ss_sp = stacks[t];
                    fibers[t].uc_stack.ss_size = STACK_BYTES;
                    fibers[t].uc_link = &scheduler;
                    makecontext(&fibers[t], fiber_main, 0);
                }
                /* Round robin: each unfinished fiber runs until it waits at a barrier or ends. A round in which
                 * every fiber only waits again is a deadlock (a barrier some threads never reach). */
                for (int alive = threads; alive > 0;) {
                    unsigned long before = progress;
                    int ended = 0;
                    for (int t = 0; t < threads; t++) {
                        if (finished[t]) continue;
                        current = t;
                        emulator_thread = thread_index[t];
                        swapcontext(&scheduler, &fibers[t]);
                        if (finished[t]) ended++;
                    }
                    alive -= ended;
                    if (alive > 0 && progress == before) {
                        fprintf(stderr, "cuda emulator: block (%u, %u, %u): %d threads wait at a barrier the others "
                                        "never reach\n", bx, by, bz, alive);
                        abort();
                    }
                }
            }
}
