/* context.c — MPI start-up and shut-down, the run's output directory, ordered printing. See context.h. */
#define _POSIX_C_SOURCE 200809L
#include "context.h"
#include "config.h"
#include "stream.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../trace/export.h"
#include "layers.h"

#ifdef FSDPLAB_CUDA
#include "cuda/cuda_device.h"
#include "cuda/nccl_comm.h"
#endif

void ctx_check_mpi(context *ctx, int rc, const char *call, const char *file, int line) {
    if (rc == MPI_SUCCESS) return;
    char reason[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(rc, reason, &length);
    fprintf(stderr, "rank %d: %s:%d: %s failed: %s\n", ctx->rank, file, line, call, reason);
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1); /* not reached */
}

void ctx_fatal(context *ctx, const char *format, ...) {
    char message[1024];
    va_list args;
    va_start(args, format);
    vsnprintf(message, sizeof message, format, args);
    va_end(args);
    fprintf(stderr, "rank %d: %s: %s\n", ctx->rank, ctx->program, message);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1); /* not reached */
}

void ctx_exit_all(context *ctx, int status, const char *format, ...) {
    if (ctx->rank == 0) {
        va_list args;
        va_start(args, format);
        fprintf(stderr, "%s: error: ", ctx->program);
        vfprintf(stderr, format, args);
        fprintf(stderr, "\n");
        va_end(args);
        fflush(stderr);
    }
    trace_close(&ctx->trace);
    MPI_Finalize();
    exit(status);
}

void ctx_require_world_size(context *ctx, int min_ranks, int max_ranks) {
    if (ctx->world_size >= min_ranks && ctx->world_size <= max_ranks) return;
    ctx_exit_all(ctx, 2, "this lab needs %d to %d ranks, got %d; run it as: mpirun -np %d lab/%s", min_ranks,
                 max_ranks, ctx->world_size, min_ranks, ctx->program);
}

int ctx_make_directories(const char *path) {
    char partial[1024];
    size_t length = strlen(path);
    if (length == 0 || length >= sizeof partial) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(partial, path, length + 1);
    for (size_t i = 1; i <= length; i++) {
        if (partial[i] != '/' && partial[i] != '\0') continue;
        char saved = partial[i];
        partial[i] = '\0';
        if (mkdir(partial, 0755) != 0 && errno != EEXIST) return -1;
        partial[i] = saved;
    }
    struct stat info;
    if (stat(path, &info) != 0) return -1;
    if (!S_ISDIR(info.st_mode)) {
        errno = ENOTDIR;
        return -1;
    }
    return 0;
}

/* How Open MPI moves a large message between two ranks of one machine. By default (CMA) the receiver's kernel copies
 * straight out of the sender's memory (process_vm_readv): one copy, but made in the kernel, so every collective byte
 * is system time — on qwen2-0.5b about 8% of user time in every step. Copy-in/copy-out through the shared-memory
 * FIFO takes two copies, both in user space; measured on 2 ranks the step takes the same time and system time falls
 * to ~0.1% of user time (README, "Side by side with PyTorch FSDP"). Open MPI reads its MCA parameters from the
 * environment in MPI_Init, so setting one here works; one the user set (to compare, e.g. =cma) is kept. */
static void shared_memory_copies_in_user_space(void) {
    setenv("OMPI_MCA_btl_vader_single_copy_mechanism", "none", 0);
}

/* The files an earlier run left in outdir that this run would not overwrite at once: the views (written at the end)
 * and rank files beyond this world. Returns how many were removed. */
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
    return removed;
}

/* This rank's place among the ranks of its node (MPI_COMM_TYPE_SHARED: the ranks that share memory), which picks its
 * GPU: node-local rank r takes GPU r (mod the node's GPUs). */
static void find_local_rank(context *ctx) {
    MPI_Comm node;
    CTX_MPI(ctx, MPI_Comm_split_type(ctx->comm, MPI_COMM_TYPE_SHARED, ctx->rank, MPI_INFO_NULL, &node));
    CTX_MPI(ctx, MPI_Comm_rank(node, &ctx->local_rank));
    CTX_MPI(ctx, MPI_Comm_size(node, &ctx->local_size));
    CTX_MPI(ctx, MPI_Comm_free(&node));
}

/* DEVICE (cpu, cuda) says where tensors live and compute runs; BACKEND (mpi, gloo: the same; nccl) who moves the
 * collectives' bytes. BACKEND=nccl works on device buffers, so it implies DEVICE=cuda. ALLOW_TF32 (0, 1) lets cuBLAS
 * round float32 GEMMs' inputs to TF32 on the CUDA device. Read on every rank in the same order, whatever the build
 * (the cfg_env calls are collective); a failure on any rank ends every rank with the first failing rank's reason. */
static void choose_device(context *ctx) {
    static const char *const backends[] = {"mpi", "gloo", "nccl", NULL};
    static const char *const devices[] = {"cpu", "cuda", NULL};
    int nccl = strcmp(cfg_env_choice(ctx, "BACKEND", "mpi", backends), "nccl") == 0;
    int cuda = strcmp(cfg_env_choice(ctx, "DEVICE", nccl ? "cuda" : "cpu", devices), "cuda") == 0;
    int allow_tf32 = (int)cfg_env_int(ctx, "ALLOW_TF32", 0, 0, 1);
    if (nccl && !cuda)
        ctx_exit_all(ctx, 2, "BACKEND=nccl moves GPU buffers: it needs DEVICE=cuda (or DEVICE unset), not DEVICE=cpu; "
                     "the CPU device's collectives are BACKEND=mpi (or gloo)");
    ctx->backend = nccl ? CTX_BACKEND_NCCL : CTX_BACKEND_MPI;
    find_local_rank(ctx);
    device_cpu_init(&ctx->host); /* the host as a device: CPU offload's accumulation and AdamW run there */
    if (!cuda) {
        device_cpu_init(&ctx->device);
        return;
    }
    char reason[512];
    int ok = device_cuda_init(&ctx->device, ctx->local_rank, ctx->local_size, reason, sizeof reason) == 0;
    if (!ok)
        snprintf(ctx->error, sizeof ctx->error, "rank %d: DEVICE=cuda%s: %s", ctx->rank, nccl ? " (BACKEND=nccl)" : "",
                 reason);
#ifdef FSDPLAB_CUDA
    /* NCCL refuses two ranks on one GPU ("Duplicate GPU detected"): say so, and what does work, before it does. */
    if (ok && nccl) {
        int gpus = ((cuda_device_state *)ctx->device.impl)->device_count;
        if (ctx->local_size > gpus) {
            snprintf(ctx->error, sizeof ctx->error, "rank %d: BACKEND=nccl with %d ranks on this node but %d GPU%s: "
                     "NCCL refuses two ranks on one GPU; run at most %d rank%s per node, or use BACKEND=mpi (MPI on "
                     "pinned host copies), which lets ranks share a GPU", ctx->rank, ctx->local_size, gpus,
                     gpus == 1 ? "" : "s", gpus, gpus == 1 ? "" : "s");
            ok = 0;
        }
    }
    if (ok) cuda_device_allow_tf32(&ctx->device, allow_tf32);
#else
    (void)allow_tf32;
#endif
    if (!ctx_all_true(ctx, ok)) ctx_exit_all(ctx, 2, "%s", ctx->error);
#ifdef FSDPLAB_CUDA
    if (nccl && nccl_comm_create(ctx, ctx->comm, "world", &ctx->nccl) != 0) ctx_fatal(ctx, "%s", ctx->error);
    char what[160];
    snprintf(what, sizeof what, "device cuda:%d (node-local rank %d of %d), backend %s, allow_tf32 %d",
             ctx->device.ordinal, ctx->local_rank, ctx->local_size, nccl ? "nccl" : "mpi", allow_tf32);
    trace_mark(&ctx->trace, what);
#endif
}

void ctx_init(context *ctx, int *argc, char ***argv, const char *program, const char *default_outdir) {
    memset(ctx, 0, sizeof *ctx);
    snprintf(ctx->program, sizeof ctx->program, "%s", program);
    layers_choose_blas_core(*argv); /* may re-execute this program: must come before MPI starts */
    shared_memory_copies_in_user_space();
    /* MPI_THREAD_MULTIPLE: the comm streams (core/stream.h) are threads that call MPI while the host thread does. */
    int provided = MPI_THREAD_SINGLE;
    int rc = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
    if (rc != MPI_SUCCESS) {
        fprintf(stderr, "%s: MPI_Init_thread failed (code %d)\n", program, rc);
        exit(1);
    }
    ctx->thread_multiple = provided >= MPI_THREAD_MULTIPLE;
    ctx->comm = MPI_COMM_WORLD;
    CTX_MPI(ctx, MPI_Comm_set_errhandler(ctx->comm, MPI_ERRORS_RETURN));
    CTX_MPI(ctx, MPI_Comm_rank(ctx->comm, &ctx->rank));
    CTX_MPI(ctx, MPI_Comm_size(ctx->comm, &ctx->world_size));

    ctx->threads = (int)cfg_env_int(ctx, "THREADS", 1, 1, 1024);
    /* The watchdog (core/stream.h): NCCL's default is 10 minutes too. A first touch of 5 GB or a slow rank's step
     * stays well inside it; a stopped rank is named after it. */
    ctx->timeout_seconds = cfg_env_real(ctx, "TIMEOUT", 600.0, 0.0, 1e9);

    const char *outdir = cfg_env_text(ctx, "OUT");
    if (outdir == NULL || outdir[0] == '\0') outdir = default_outdir;
    if (strlen(outdir) >= sizeof ctx->outdir - 32) ctx_exit_all(ctx, 2, "OUT='%s' is too long", outdir);
    snprintf(ctx->outdir, sizeof ctx->outdir, "%s", outdir);

    /* Rank 0 makes the directory; a failure is reported once and every rank exits. */
    int made = 1;
    if (ctx->rank == 0 && ctx_make_directories(ctx->outdir) != 0) {
        fprintf(stderr, "%s: error: cannot create output directory OUT='%s': %s\n", program, ctx->outdir,
                strerror(errno));
        made = 0;
    }
    CTX_MPI(ctx, MPI_Bcast(&made, 1, MPI_INT, 0, ctx->comm));
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
    CTX_MPI(ctx, MPI_Bcast(run_id, sizeof run_id, MPI_CHAR, 0, ctx->comm));
    if (trace_open_run(&ctx->trace, ctx->outdir, ctx->rank, ctx->world_size, run_id) != 0)
        ctx_fatal(ctx, "cannot open the event file in %s", ctx->outdir);
    choose_device(ctx);
    /* ALLOC=malloc turns the caching allocator off (PYTORCH_NO_CUDA_MEMORY_CACHING=1): one segment per request.
     * MAX_SPLIT_SIZE_MB is PyTorch's max_split_size_mb (0 or unset: no limit). Like PyTorch, it must exceed the
     * 20 MiB large segment: below that, a fully freed 20 MiB segment could never serve the requests it was cut for. */
    static const char *const alloc_modes[] = {"caching", "malloc", NULL};
    long max_split_mb = cfg_env_int(ctx, "MAX_SPLIT_SIZE_MB", 0, 0, 1 << 20);
    if (max_split_mb != 0 && max_split_mb <= ALLOCATOR_LARGE_SEGMENT >> 20)
        ctx_exit_all(ctx, 2, "MAX_SPLIT_SIZE_MB='%ld' is too small: 0 (no limit) or more than %d, the large segment size",
                     max_split_mb, ALLOCATOR_LARGE_SEGMENT >> 20);
    allocator_settings allocation = {
        .caching = strcmp(cfg_env_choice(ctx, "ALLOC", "caching", alloc_modes), "caching") == 0,
        .max_split_size = (size_t)max_split_mb << 20,
    };
    /* DEVICE_MEMORY_MB: the device pool's budget (0: none), as a GPU's memory is; CPU offload (lab 09) is what makes
     * a model fit in less. */
    size_t device_budget = (size_t)cfg_env_int(ctx, "DEVICE_MEMORY_MB", 0, 0, 1L << 30) << 20;
    ctx->allocation = allocation;
    mem_init_pool_on(&ctx->mem, ctx->rank, &ctx->trace, &allocation, MEM_DEVICE, device_budget, &ctx->device.segments);
    /* t0 right after a barrier, so every rank's timestamps start together. */
    CTX_MPI(ctx, MPI_Barrier(ctx->comm));
    trace_reset_t0(&ctx->trace);
}

int ctx_all_true(context *ctx, int ok) {
    int first_failed = ok ? ctx->world_size : ctx->rank;
    ctx_allreduce(ctx, &first_failed, 1, MPI_INT, MPI_MIN, "ctx_all_true");
    if (first_failed == ctx->world_size) return 1;
    /* A rank that did not fail takes the message of the lowest rank that did: rank 0 prints for all (ctx_exit_all),
     * so it must name the real cause; a rank that failed keeps its own. */
    char first_error[sizeof ctx->error];
    if (ctx->rank == first_failed) memcpy(first_error, ctx->error, sizeof first_error);
    CTX_MPI(ctx, MPI_Bcast(first_error, (int)sizeof first_error, MPI_CHAR, first_failed, ctx->comm));
    if (ok) memcpy(ctx->error, first_error, sizeof first_error);
    return 0;
}

void ctx_print_ordered(context *ctx, const char *text) {
    int length = (int)strlen(text);
    int *lengths = NULL, *offsets = NULL;
    char *all = NULL;
    if (ctx->rank == 0) {
        lengths = calloc((size_t)ctx->world_size, sizeof *lengths);
        offsets = calloc((size_t)ctx->world_size, sizeof *offsets);
        if (lengths == NULL || offsets == NULL) ctx_fatal(ctx, "out of memory gathering text to print");
    }
    CTX_MPI(ctx, MPI_Gather(&length, 1, MPI_INT, lengths, 1, MPI_INT, 0, ctx->comm));
    int total = 0;
    if (ctx->rank == 0) {
        for (int rank = 0; rank < ctx->world_size; rank++) {
            offsets[rank] = total;
            total += lengths[rank];
        }
        all = malloc((size_t)total + 1);
        if (all == NULL) ctx_fatal(ctx, "out of memory gathering %d bytes of text to print", total);
    }
    CTX_MPI(ctx, MPI_Gatherv(text, length, MPI_CHAR, all, lengths, offsets, MPI_CHAR, 0, ctx->comm));
    if (ctx->rank == 0) {
        all[total] = '\0';
        fputs(all, stdout);
        fflush(stdout);
    }
    free(all);
    free(lengths);
    free(offsets);
}

int ctx_finish(context *ctx) {
    size_t leaks = mem_shutdown(&ctx->mem);
    if (ctx->host_mem_ready) leaks += mem_shutdown(&ctx->host_mem);
#ifdef FSDPLAB_CUDA
    nccl_comm_destroy(ctx->nccl);
    ctx->nccl = NULL;
#endif
    device_destroy(&ctx->device); /* after the pools: their segments went back to it */
    trace_end(&ctx->trace);
    trace_close(&ctx->trace);
    int clean = ctx_all_true(ctx, leaks == 0);
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
        }
        fflush(stdout);
    }
    CTX_MPI(ctx, MPI_Bcast(&status, 1, MPI_INT, 0, ctx->comm));
    MPI_Finalize();
    return status;
}

int ctx_error(char *error, size_t error_size, const char *format, ...) {
    va_list args;
    va_start(args, format);
    vsnprintf(error, error_size, format, args);
    va_end(args);
    return -1;
}

void ctx_allreduce(context *ctx, void *buffer, int count, MPI_Datatype type, MPI_Op op, const char *what) {
    MPI_Request request;
    CTX_MPI(ctx, MPI_Iallreduce(MPI_IN_PLACE, buffer, count, type, op, ctx->comm, &request));
    int rc = stream_progress(ctx, NULL, 1, &request);
    if (rc == STREAM_TIMED_OUT)
        ctx_fatal(ctx, "%s (all-reduce) timed out: not complete after %g s (TIMEOUT); a rank has stopped, died or "
                  "fallen behind by more than that", what, ctx->timeout_seconds);
    CTX_MPI(ctx, rc);
}
