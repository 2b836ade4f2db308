/* emulator.cpp — the CUDA emulator's kernel launches (see cuda_runtime.h here): each block's threads as fibers.
 *
 * A fiber is a stack of its own, made once (makecontext) and kept for every later launch: it parks at the top of its
 * loop, runs the kernel for the thread it is given, and parks again. Switching between a fiber and the scheduler is
 * _setjmp / _longjmp, which do not save the signal mask (swapcontext makes a system call per switch, and a kernel
 * switches at every barrier of every thread). */
#undef _FORTIFY_SOURCE /* its longjmp check refuses a jump onto another stack, which is what a fiber switch is */
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <ucontext.h>

#include <mutex>
#include <vector>

#include "cuda_runtime.h"

emulator_index emulator_thread, emulator_block;
dim3 emulator_block_dim, emulator_grid_dim;
uint64_t emulator_lanes[32][32];

namespace {
const size_t STACK_BYTES = 256 * 1024;
jmp_buf scheduler;
struct fiber {
    jmp_buf parked; /* where it resumes */
    char *stack;
};
std::vector<fiber> fibers; /* made on first need, kept */
std::vector<emulator_index> thread_index;
std::vector<int> finished;
int current = -1, threads = 0;
unsigned long progress = 0; /* arrivals, openings and ends: a round without any is a deadlock */
std::function<void()> *kernel;
std::mutex launch_lock;

/* A barrier for `size` fibers: the last to arrive opens it (a new generation); the others yield until then. */
struct barrier {
    int arrived = 0;
    unsigned long generation = 0;
};
barrier block_barrier, warp_barriers[32];

void yield_to_scheduler() {
    if (_setjmp(fibers[current].parked) == 0) _longjmp(scheduler, 1);
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

/* A fiber's whole life: park; when resumed, run the kernel as thread `current`, mark it ended, park again. */
void fiber_main() {
    for (;;) {
        yield_to_scheduler();
        (*kernel)();
        finished[current] = 1;
        progress++;
    }
}

/* Runs fiber t until it parks (at a barrier, or done). */
__attribute__((noinline)) void resume(int t) {
    current = t;
    if (_setjmp(scheduler) == 0) _longjmp(fibers[t].parked, 1);
}

/* Makes fibers up to n: each starts on its own stack and parks at once. */
void make_fibers(int n) {
    static ucontext_t start, here;
    while ((int)fibers.size() < n) {
        int t = (int)fibers.size();
        fibers.push_back(fiber{});
        fibers[t].stack = (char *)malloc(STACK_BYTES);
        if (fibers[t].stack == NULL) {
            fprintf(stderr, "cuda emulator: out of memory for a fiber's stack\n");
            abort();
        }
        getcontext(&start);
        start.uc_stack.ss_sp = fibers[t].stack;
        start.uc_stack.ss_size = STACK_BYTES;
        start.uc_link = NULL; /* fiber_main never returns */
        makecontext(&start, fiber_main, 0);
        current = t;
        if (_setjmp(scheduler) == 0) swapcontext(&here, &start);
    }
}

/* One block: its threads as fibers, round robin until every one has ended. */
void run_block(emulator_index where, dim3 block) {
    emulator_block = where;
    block_barrier = barrier();
    for (barrier &b : warp_barriers) b = barrier();
    for (int t = 0; t < threads; t++) {
        thread_index[t] = {t % block.x, t / block.x % block.y, t / (block.x * block.y)};
        finished[t] = 0;
    }
    /* Round robin: each unfinished fiber runs until it waits at a barrier or ends. A round in which
     * every fiber only waits again is a deadlock (a barrier some threads never reach). */
    for (int alive = threads; alive > 0;) {
        unsigned long before = progress;
        int ended = 0;
        for (int t = 0; t < threads; t++) {
            if (finished[t]) continue;
            emulator_thread = thread_index[t];
            resume(t);
            if (finished[t]) ended++;
        }
        alive -= ended;
        if (alive > 0 && progress == before) {
            fprintf(stderr, "cuda emulator: block (%u, %u, %u): %d threads wait at a barrier the others "
                            "never reach\n", where.x, where.y, where.z, alive);
            abort();
        }
    }
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

void emulator_launch(dim3 grid, dim3 block, cudaStream_t stream, std::function<void()> body) {
    if (!emulator_stream_ok(stream)) {
        emulator_fail(cudaErrorInvalidResourceHandle, "a kernel launch's stream");
        return;
    }
    unsigned long long count = (unsigned long long)block.x * block.y * block.z;
    if ((unsigned long long)grid.x * grid.y * grid.z == 0 || count == 0 || count > 1024) {
        fprintf(stderr, "cuda emulator: a launch of %u x %u x %u blocks of %llu threads is not valid\n", grid.x,
                grid.y, grid.z, count);
        emulator_fail(cudaErrorInvalidConfiguration, "a kernel launch");
        return;
    }
    /* One kernel at a time in the process (the fibers and `__shared__` statics are the process's); GPU memory open
     * to it while it runs. */
    std::lock_guard<std::mutex> guard(launch_lock);
    emulator_device_access_begin();
    threads = (int)count;
    kernel = &body;
    emulator_block_dim = block;
    emulator_grid_dim = grid;
    make_fibers(threads);
    thread_index.resize(threads);
    finished.assign(threads, 0);
    for (unsigned bz = 0; bz < grid.z; bz++)
        for (unsigned by = 0; by < grid.y; by++)
            for (unsigned bx = 0; bx < grid.x; bx++) run_block({bx, by, bz}, block);
    emulator_device_access_end();
}
