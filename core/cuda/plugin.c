/* plugin.c — the CUDA plug-in (core/runtime/plugin.h): DEVICE=cuda's device, its streams and events (cudaStreams,
 * cudaEvents: core/cuda/cuda_stream.c) and BACKEND=nccl's collectives (core/cuda/nccl_comm.c), handed to the runtime
 * as tables, and this build's list of plug-ins: the one registration point. The CUDA builds link this file in place
 * of core/runtime/plugins_none.c (Makefile). */
#include "core/runtime/plugin.h"

#include <stdio.h>

#include "core/base/error.h"
#include "core/comm/comm_backend.h"
#include "core/comm/stream.h"
#include "core/cuda/cuda_device.h"
#include "core/cuda/cuda_stream.h"
#include "core/cuda/nccl_comm.h"
#include "core/runtime/world.h"

static const stream_ops cuda_streams = {
    .init = cuda_stream_init,
    .add_group = cuda_stream_add_group,
    .destroy = cuda_stream_destroy,
    .thread_start = cuda_stream_thread_start,
    .event_record = cuda_event_record,
    .event_query = cuda_event_query,
    .event_synchronize = cuda_event_synchronize,
    .wait_event = cuda_stream_wait_event,
    .synchronize = cuda_stream_synchronize,
    .record_compute = cuda_compute_record,
    .stage_copy = cuda_stage_copy,
};

static const comm_backend nccl_collectives = {
    .name = "nccl",
    .create = nccl_comm_create,
    .destroy = nccl_comm_destroy,
    .issue = nccl_comm_issue,
    .order = nccl_comm_order,
    .wait = nccl_comm_wait,
    .finish = nccl_comm_finish,
};

/* The GPU of this rank; with BACKEND=nccl the world's NCCL communicator. Every rank agrees on the device before
 * NCCL is asked for anything, so a rank without a GPU stops every rank with its reason. */
static void cuda_open(context *ctx, const plugin_options *options) {
    int use_collectives = options->use_collectives, allow_tf32 = options->allow_tf32;
    char reason[512];
    int ok = cuda_device_init(&ctx->device, ctx->local_rank, ctx->local_size, reason, sizeof reason) == 0;
    if (!ok)
        error_set(ctx->error, sizeof ctx->error, "rank %d: DEVICE=cuda%s: %s", ctx->rank,
                  use_collectives ? " (BACKEND=nccl)" : "", reason);
    /* NCCL refuses two ranks on one GPU ("Duplicate GPU detected"): say so, and what does work, before it does. */
    if (ok && use_collectives) {
        int gpus = ((cuda_device_state *)ctx->device.impl)->device_count;
        if (ctx->local_size > gpus) {
            error_set(ctx->error, sizeof ctx->error, "rank %d: BACKEND=nccl with %d ranks on this node but %d GPU%s: "
                      "NCCL refuses two ranks on one GPU; run at most %d rank%s per node, or use BACKEND=mpi (MPI on "
                      "pinned host copies), which lets ranks share a GPU", ctx->rank, ctx->local_size, gpus,
                      gpus == 1 ? "" : "s", gpus, gpus == 1 ? "" : "s");
            ok = 0;
        }
    }
    if (ok) {
        cuda_device_allow_tf32(&ctx->device, allow_tf32);
        cuda_device_state *device = ctx->device.impl;
        device->timeout_seconds = ctx->timeout_seconds; /* cuda_event_wait's */
        if (options->profile_kernels) device->profile = cuda_profile_create(ctx->rank);
    }
    if (!world_all_true(ctx, ok)) world_exit_all(ctx, 2, "%s", ctx->error);
    ctx->stream_ops = &cuda_streams;
    if (use_collectives) {
        ctx->collectives = &nccl_collectives;
        if (nccl_comm_create(ctx, ctx->comm, "world", &ctx->collectives_world) != 0)
            world_fatal(ctx, "%s", ctx->error);
    }
    char what[160];
    snprintf(what, sizeof what, "device cuda:%d (node-local rank %d of %d), backend %s, allow_tf32 %d",
             ctx->device.ordinal, ctx->local_rank, ctx->local_size, use_collectives ? "nccl" : "mpi", allow_tf32);
    trace_mark(&ctx->trace, what);
}

/* PROFILE_KERNELS' table (core/cuda/kernel_profile.h), then the world's communicator. A table that cannot be written
 * is said, and the run goes on to close. */
static void cuda_close(context *ctx) {
    cuda_device_state *device = ctx->device.impl;
    if (device != NULL && device->profile != NULL) {
        char path[600], title[200], error[700];
        snprintf(path, sizeof path, "%s/kernels_rank%d.txt", ctx->outdir, ctx->rank);
        snprintf(title, sizeof title, "%s, rank %d, GPU %d (PROFILE_KERNELS=1): the compute stream's work per step",
                 ctx->program, ctx->rank, device->ordinal);
        if (cuda_profile_write(device->profile, path, title, error, sizeof error) != 0)
            fprintf(stderr, "%s: error: %s\n", ctx->program, error);
    }
    nccl_comm_destroy(ctx->collectives_world);
    ctx->collectives_world = NULL;
}

static const plugin cuda_plugin = {.device = "cuda", .collectives = "nccl", .open = cuda_open, .close = cuda_close};

const plugin *const plugins_linked[] = {&cuda_plugin, NULL};
