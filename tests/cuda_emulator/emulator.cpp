/* emulator.cpp — the CUDA emulator's kernel launches (see cuda_runtime.h here): each block's threads as fibers.
 *
 * A fiber is a stack of its own, made once and kept for every later launch: it runs the kernel for the thread it is
 * given, hands on, and on its next resume runs it again for the next. A switch saves the callee-saved registers on the
 * stack being left and loads the other's stack pointer (emulator_switch, x86-64): a kernel switches at every barrier
 * of every thread, so this is the emulator's inner loop (swapcontext would make a system call per switch,
 * setjmp/longjmp unwind checks). A thread that stops at a barrier hands the block straight to the next fiber that can
 * run (pass_on), not back to the launch to pick the next: one switch a barrier, not two. A fiber parked at a
 * barrier that has not opened yet is not resumed at all. */
#include <stdio.h>
#include <stdlib.h>

#include <atomic>
#include <mutex>
#include <vector>

#include "cuda_runtime.h"

#if !defined(__x86_64__)
#error "the CUDA emulator's fiber switch is x86-64 assembly"
#endif

/* emulator_switch(save, to): pushes rbp, rbx, r12-r15, stores the stack pointer at *save, loads `to`, pops the
 * other side's registers and returns into it. */
extern "C" void emulator_switch(void **save, void *to);
asm(".text\n"
    ".globl emulator_switch\n"
    ".type emulator_switch, @function\n"
    "emulator_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size emulator_switch, .-emulator_switch\n");

emulator_index emulator_thread, emulator_block;
dim3 emulator_block_dim, emulator_grid_dim;

namespace {
const size_t STACK_BYTES = 256 * 1024;

/* A barrier for `size` fibers: the last to arrive opens it (a new generation); the others park until then. */
struct barrier {
    int arrived = 0;
    unsigned long generation = 0;
};
barrier block_barrier, warp_barriers[32];

struct fiber {
    void *sp;                      /* its stack pointer while parked */
    char *stack;
    const barrier *waiting = NULL; /* parked at this barrier, until its generation passes `generation` */
    unsigned long generation = 0;
};
void *launch_sp; /* the launching thread's stack while its block runs */
std::vector<fiber> fibers; /* made on first need, kept */
std::vector<emulator_index> thread_index;
std::vector<int> finished;
int current = -1, threads = 0, alive = 0;
std::function<void()> *kernel;
std::mutex launch_lock;

/* Whether fiber t, parked at a barrier, would only find it still closed. */
bool still_waiting(int t) { return fibers[t].waiting != NULL && fibers[t].waiting->generation == fibers[t].generation; }

/* The running fiber stops (parked at a barrier, or ended) and hands the block on: to the next fiber after it, round
 * robin, that can run (not ended, not parked at a barrier still closed), or back to the launch (launch_sp) once
 * every fiber has ended. No fiber able to run while some have not ended is a deadlock: a barrier some threads never
 * reach. A switch goes straight from fiber to fiber, so a barrier costs each thread one switch, not two through the
 * launch. */
void pass_on() {
    void **save = &fibers[current].sp;
    if (alive == 0) {
        emulator_switch(save, launch_sp);
        return;
    }
    for (int i = 1; i <= threads; i++) {
        int t = (current + i) % threads;
        if (finished[t] || still_waiting(t)) continue;
        current = t;
        emulator_thread = thread_index[t];
        emulator_switch(save, fibers[t].sp);
        return;
    }
    fprintf(stderr, "cuda emulator: block (%u, %u, %u): %d threads wait at a barrier the others never reach\n",
            emulator_block.x, emulator_block.y, emulator_block.z, alive);
    abort();
}

void wait_at(barrier &b, int size) {
    unsigned long generation = b.generation;
    if (++b.arrived == size) {
        b.arrived = 0;
        b.generation++;
        return;
    }
    fibers[current].waiting = &b;
    fibers[current].generation = generation;
    while (b.generation == generation) pass_on();
    fibers[current].waiting = NULL;
}

/* A fiber's whole life: run the kernel as thread `current`, mark it ended, hand on; again on the next resume. */
[[noreturn]] void fiber_main() {
    for (;;) {
        (*kernel)();
        finished[current] = 1;
        alive--;
        pass_on();
    }
}

/* Makes fibers up to n. A new stack holds what emulator_switch pops: six zero registers, then fiber_main as the
 * return address, above it a zero as fiber_main's own return address (so fiber_main starts with the stack aligned
 * as after a call: 8 mod 16). */
void make_fibers(int n) {
    while ((int)fibers.size() < n) {
        fiber f;
        f.stack = (char *)malloc(STACK_BYTES);
        if (f.stack == NULL) {
            fprintf(stderr, "cuda emulator: out of memory for a fiber's stack\n");
            abort();
        }
        uintptr_t top = ((uintptr_t)f.stack + STACK_BYTES) & ~(uintptr_t)15;
        void **frame = (void **)(top - 64);
        for (int i = 0; i < 6; i++) frame[i] = NULL;
        frame[6] = (void *)&fiber_main;
        frame[7] = NULL;
        f.sp = frame;
        fibers.push_back(f);
    }
}

/* One block: its threads as fibers, from thread 0 on, handing on to each other (pass_on) until every one has
 * ended; the last hands back here. */
void run_block(emulator_index where, dim3 block) {
    emulator_block = where;
    block_barrier = barrier();
    for (barrier &b : warp_barriers) b = barrier();
    for (int t = 0; t < threads; t++) {
        thread_index[t] = {t % block.x, t / block.x % block.y, t / (block.x * block.y)};
        finished[t] = 0;
    }
    alive = threads;
    current = 0;
    emulator_thread = thread_index[0];
    emulator_switch(&launch_sp, fibers[0].sp);
}
} // namespace

unsigned emulator_linear_thread() {
    return emulator_thread.x + emulator_thread.y * emulator_block_dim.x +
           emulator_thread.z * emulator_block_dim.x * emulator_block_dim.y;
}

void __syncthreads() { wait_at(block_barrier, threads); }

uint64_t *emulator_shuffle_lanes(unsigned warp) {
    static uint64_t lanes[2][32][32];
    return lanes[warp_barriers[warp].generation & 1][warp];
}

void emulator_warp_barrier() {
    int warp = (int)(emulator_linear_thread() / 32);
    wait_at(warp_barriers[warp], std::min(32, threads - warp * 32));
}

extern std::atomic<unsigned long long> emulator_works; /* runtime.cpp's: emulator_work_count */

void emulator_launch(dim3 grid, dim3 block, cudaStream_t stream, std::function<void()> body) {
    emulator_works++;
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
