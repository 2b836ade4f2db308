/* session.c — MPI start-up and shut-down, the run's output directory, the device. See session.h. */
#define _POSIX_C_SOURCE 200809L
#include "core/runtime/session.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/base/error.h"
#include "core/base/file.h"
#include "core/kernels/layers.h"
#include "core/runtime/env.h"
#include "core/runtime/plugin.h"
#include "core/runtime/world.h"
#include "trace/export.h"

/* How Open MPI moves a large message between two ranks of one machine. By default (CMA) the receiver's kernel copies
 * straight out of the sender's memory (process_vm_readv): one copy, but made in the kernel, so every collective byte
 * is system time — on qwen2-0.5b about 8% of user time in every step. Copy-in/copy-out through the shared-memory
 * FIFO takes two copies, both in user space; measured on 2 ranks the step takes the same time and system time falls
 * to ~0.1% of user time (docs/torch_parity.md). Open MPI reads its MCA parameters from the
 * environment in MPI_Init, so setting one here works; one the user set (to compare, e.g. =cma) is kept. */
static void shared_memory_copies_in_user_space(void) {
    setenv("OMPI_MCA_btl_vader_single_copy_mechanism", "none", 0);
}

/* The files an earlier run left in outdir that this run would not overwrite at once: the views (written at the end),
 * rank files beyond this world and PROFILE_KERNELS' tables. Returns how many were removed. */
static int remove_stale_outputs(const char *outdir, int world) {
    static const char *const views[] = {"trace.json", "memory.html", "player.html", "memory_snapshot.pickle",
                                        "summary.txt"};
    char path[1100];
    int removed = 0;
    for (size_t i = 0; i < sizeof views / sizeof views[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", outdir, views[i]);
        removed += unlink(path) == 0;
    }
    for (int rank = world; rank < world + 4096; rank++) {
        snprintf(path, sizeof path, "%s/rank%d.jsonl", outdir, rank);
        if (unlink(path) != 0) break;
        removed++;
    }
    for (int rank = 0; rank < 4096; rank++) { /* PROFILE_KERNELS' tables, written at the end when asked for */
        snprintf(path, sizeof path, "%s/kernels_rank%d.txt", outdir, rank);
        if (unlink(path) != 0) break;
        removed++;
    }
    return removed;
}

/* This rank's place among the ranks of its node (MPI_COMM_TYPE_SHARED: the ranks that share memory), which picks its
 * GPU: node-local rank r takes GPU r (mod the node's GPUs). */
static void find_local_rank(context *ctx) {
    MPI_Comm node;
    WORLD_MPI(ctx, MPI_Comm_split_type(ctx->comm, MPI_COMM_TYPE_SHARED, ctx->rank, MPI_INFO_NULL, &node));
    WORLD_MPI(ctx, MPI_Comm_rank(node, &ctx->local_rank));
    WORLD_MPI(ctx, MPI_Comm_size(node, &ctx->local_size));
    WORLD_MPI(ctx, MPI_Comm_free(&node));
}

/* The plug-in that serves DEVICE=name in this build (core/runtime/plugin.h), or NULL. */
static const plugin *plugin_for(const char *name) {
    for (const plugin *const *p = plugins_linked; *p != NULL; p++)
        if (strcmp((*p)->device, name) == 0) return *p;
    return NULL;
}

/* DEVICE (cpu, cuda) says where tensors live and compute runs; BACKEND (mpi, gloo: the same; nccl) who moves the
 * collectives' bytes. BACKEND=nccl works on device buffers, so it implies DEVICE=cuda. ALLOW_TF32 (0, 1) lets cuBLAS
 * round float32 GEMMs' inputs to TF32 on the CUDA device; PROFILE_KERNELS (0, 1) times its every kernel
 * (core/cuda/kernel_profile.h). Read on every rank in the same order, whatever the build
 * (the env_ calls are collective); a failure on any rank ends every rank with the first failing rank's reason. The
 * CPU device is the build's own; any other comes from the plug-in that serves it. */
static void choose_device(context *ctx) {
    static const char *const backends[] = {"mpi", "gloo", "nccl", NULL};
    static const char *const devices[] = {"cpu", "cuda", NULL};
    int nccl = strcmp(env_choice(ctx, "BACKEND", "mpi", backends), "nccl") == 0;
    const char *device_name = env_choice(ctx, "DEVICE", nccl ? "cuda" : "cpu", devices);
    plugin_options options = {.use_collectives = nccl}; /* the env_ calls one by one: their order is collective */
    options.allow_tf32 = (int)env_int(ctx, "ALLOW_TF32", 0, 0, 1);
    options.profile_kernels = (int)env_int(ctx, "PROFILE_KERNELS", 0, 0, 1);
    int cpu = strcmp(device_name, "cpu") == 0;
    if (nccl && cpu)
        world_exit_all(ctx, 2, "BACKEND=nccl moves GPU buffers: it needs DEVICE=cuda (or DEVICE unset), not "
                       "DEVICE=cpu; the CPU device's collectives are BACKEND=mpi (or gloo)");
    if (options.profile_kernels && cpu)
        world_exit_all(ctx, 2, "PROFILE_KERNELS=1 times each GPU kernel: it needs DEVICE=cuda; on the CPU the trace's "
                       "compute spans time each piece (trace.json, summary.txt)");
    ctx->profile_kernels = options.profile_kernels;
    find_local_rank(ctx);
    device_cpu_init(&ctx->host); /* the host as a device: CPU offload's accumulation and AdamW run there */
    if (cpu) {
        device_cpu_init(&ctx->device);
        return;
    }
    const plugin *found = plugin_for(device_name);
    if (found == NULL)
        error_set(ctx->error, sizeof ctx->error, "rank %d: DEVICE=%s%s: this build has no CUDA device: build with make "
                  "CUDA=1", ctx->rank, device_name, nccl ? " (BACKEND=nccl)" : "");
    if (!world_all_true(ctx, found != NULL)) world_exit_all(ctx, 2, "%s", ctx->error);
    ctx->plugin = found;
    found->open(ctx, &options);
}

void session_open(context *ctx, int *argc, char ***argv, const char *program, const char *default_outdir) {
    memset(ctx, 0, sizeof *ctx);
    snprintf(ctx->program, sizeof ctx->program, "%s", program);
    layers_choose_blas_core(*argv); /* may re-execute this program: must come before MPI starts */
    shared_memory_copies_in_user_space();
    /* MPI_THREAD_MULTIPLE: the comm streams (core/comm/stream.h) are threads that call MPI while the host thread
     * does. */
    int provided = MPI_THREAD_SINGLE;
    int rc = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
    if (rc != MPI_SUCCESS) {
        fprintf(stderr, "%s: MPI_Init_thread failed (code %d)\n", program, rc);
        exit(1);
    }
    ctx->thread_multiple = provided >= MPI_THREAD_MULTIPLE;
    ctx->comm = MPI_COMM_WORLD;
    WORLD_MPI(ctx, MPI_Comm_set_errhandler(ctx->comm, MPI_ERRORS_RETURN));
    WORLD_MPI(ctx, MPI_Comm_rank(ctx->comm, &ctx->rank));
    WORLD_MPI(ctx, MPI_Comm_size(ctx->comm, &ctx->world_size));

    ctx->threads = (int)env_int(ctx, "THREADS", 1, 1, 1024);
    /* The watchdog (core/comm/stream.h): NCCL's default is 10 minutes too. A first touch of 5 GB or a slow rank's step
     * stays well inside it; a stopped rank is named after it. */
    ctx->timeout_seconds = env_real(ctx, "TIMEOUT", 600.0, 0.0, 1e9);

    const char *outdir = env_text(ctx, "OUT");
    if (outdir == NULL || outdir[0] == '\0') outdir = default_outdir;
    if (strlen(outdir) >= sizeof ctx->outdir - 32) world_exit_all(ctx, 2, "OUT='%s' is too long", outdir);
    snprintf(ctx->outdir, sizeof ctx->outdir, "%s", outdir);

    /* Rank 0 makes the directory; a failure is reported once and every rank exits. */
    int made = 1;
    if (ctx->rank == 0 && file_make_directories(ctx->outdir) != 0) {
        fprintf(stderr, "%s: error: cannot create output directory OUT='%s': %s\n", program, ctx->outdir,
                strerror(errno));
        made = 0;
    }
    WORLD_MPI(ctx, MPI_Bcast(&made, 1, MPI_INT, 0, ctx->comm));
    if (!made) {
        MPI_Finalize();
        exit(2);
    }
    /* One id for the run (rank 0's clock and pid), in every rank's meta line: readers refuse files of two runs. And
     * a fresh OUT: the views and any rank files of an earlier run (a bigger world leaves rank<N>.jsonl beyond
     * ours) go before this run writes, so nothing in OUT is older than the run. Only fsdplab's own file names. */
    char run_id[64] = "";
    if (ctx->rank == 0) {
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        snprintf(run_id, sizeof run_id, "%lld.%09ld-%d", (long long)now.tv_sec, now.tv_nsec, (int)getpid());
        int removed = remove_stale_outputs(ctx->outdir, ctx->world_size);
        if (removed > 0) printf("(OUT=%s: removed %d files of an earlier run)\n", ctx->outdir, removed);
    }
    WORLD_MPI(ctx, MPI_Bcast(run_id, sizeof run_id, MPI_CHAR, 0, ctx->comm));
    if (trace_open_run(&ctx->trace, ctx->outdir, ctx->rank, ctx->world_size, run_id) != 0)
        world_fatal(ctx, "cannot open the event file in %s", ctx->outdir);
    choose_device(ctx);
    /* ALLOC=malloc turns the caching allocator off (PYTORCH_NO_CUDA_MEMORY_CACHING=1): one segment per request.
     * MAX_SPLIT_SIZE_MB is PyTorch's max_split_size_mb (0 or unset: no limit). Like PyTorch, it must exceed the
     * 20 MiB large segment: below that, a fully freed 20 MiB segment could never serve the requests it was cut for. */
    static const char *const alloc_modes[] = {"caching", "malloc", NULL};
    long max_split_mb = env_int(ctx, "MAX_SPLIT_SIZE_MB", 0, 0, 1 << 20);
    if (max_split_mb != 0 && max_split_mb <= ALLOCATOR_LARGE_SEGMENT >> 20)
        world_exit_all(ctx, 2, "MAX_SPLIT_SIZE_MB='%ld' is too small: 0 (no limit) or more than %d, the large "
                       "segment size", max_split_mb, ALLOCATOR_LARGE_SEGMENT >> 20);
    allocator_settings allocation = {
        .caching = strcmp(env_choice(ctx, "ALLOC", "caching", alloc_modes), "caching") == 0,
        .max_split_size = (size_t)max_split_mb << 20,
    };
    /* DEVICE_MEMORY_MB: the device pool's budget (0: none), as a GPU's memory is; CPU offload (lab 09) is what makes
     * a model fit in less. */
    size_t device_budget = (size_t)env_int(ctx, "DEVICE_MEMORY_MB", 0, 0, 1L << 30) << 20;
    ctx->allocation = allocation;
    mem_init_pool_on(&ctx->mem, ctx->rank, &ctx->trace, &allocation, MEM_DEVICE, device_budget, &ctx->device.segments);
    /* t0 right after a barrier, so every rank's timestamps start together. */
    WORLD_MPI(ctx, MPI_Barrier(ctx->comm));
    trace_reset_t0(&ctx->trace);
}

void session_require_cpu(context *ctx, const char *reads) {
    if (ctx->device.kind == DEVICE_CPU) return;
    world_exit_all(ctx, 2, "DEVICE=%s: %s runs on the CPU device only (DEVICE=cpu, BACKEND=mpi): it reads in host "
                   "memory %s; on a GPU, run lab/05_full_step, lab/06_prefetch or lab/08_hybrid_shard",
                   ctx->device.name, ctx->program, reads);
}

int session_close(context *ctx) {
    /* Collectives the device was ordered after and the host has not waited for (BACKEND=nccl): their events */
    if (ctx->finish_pending != NULL && ctx->finish_pending(ctx) != 0)
        fprintf(stderr, "%s: error: rank %d: %s\n", ctx->program, ctx->rank, ctx->error);
    size_t leaks = mem_shutdown(&ctx->mem);
    if (ctx->host_mem_ready) leaks += mem_shutdown(&ctx->host_mem);
    if (ctx->plugin != NULL) ctx->plugin->close(ctx);
    device_destroy(&ctx->device); /* after the pools: their segments went back to it */
    trace_end(&ctx->trace);
    trace_close(&ctx->trace);
    int clean = world_all_true(ctx, leaks == 0);
    int status = clean ? 0 : 1;
    if (ctx->rank == 0) {
        if (!clean) fprintf(stderr, "%s: error: tracked memory leaked on some rank (listed above)\n", ctx->program);
        char error[512];
        if (trace_export_all(ctx->outdir, error, sizeof error) != 0) {
            fprintf(stderr, "%s: error: exporting the trace of %s: %s\n", ctx->program, ctx->outdir, error);
            status = 1;
        } else {
            printf("\n");
            trace_export_describe(stdout, ctx->outdir);
            if (ctx->profile_kernels)
                printf("kernels:  %s/kernels_rank*.txt  (PROFILE_KERNELS=1: GPU time per kernel, per step)\n",
                       ctx->outdir);
        }
        fflush(stdout);
    }
    WORLD_MPI(ctx, MPI_Bcast(&status, 1, MPI_INT, 0, ctx->comm));
    MPI_Finalize();
    return status;
}

