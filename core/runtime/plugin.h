/* plugin.h — a device that the CPU build does not have, brought by a plug-in and found by DEVICE's name.
 *
 * A plug-in (today one: core/cuda/, linked by `make CUDA=1`) brings a device (core/device/device.h's table) and what
 * runs on it: streams and events (core/comm/stream.h's stream_ops) and, for a BACKEND of its own, collectives
 * (core/comm/comm.h's comm_backend). session_open finds it by name and lets it fill the context; nothing outside the
 * plug-in's folder knows its types or calls its functions, and no file outside it is compiled differently for it.
 *
 * The one registration point is the list plugins_linked: the CPU build links core/runtime/plugins_none.c (an empty
 * list), the CUDA builds link core/cuda/plugin.c (the CUDA plug-in) in its place.
 */
#ifndef FSDPLAB_PLUGIN_H
#define FSDPLAB_PLUGIN_H

#include "core/runtime/context.h"

/* What session_open read from the environment for the plug-in (core/runtime/session.c). */
typedef struct plugin_options {
    int use_collectives;       /* BACKEND is the plug-in's collectives (nccl) */
    int allow_tf32;            /* ALLOW_TF32=1: float32 GEMMs may round their inputs to TF32 */
    int profile_kernels;       /* PROFILE_KERNELS=1: every kernel timed (core/cuda/kernel_profile.h) */
} plugin_options;

typedef struct plugin {
    const char *device;        /* the DEVICE value it serves: "cuda" */
    const char *collectives;   /* the BACKEND value of its collectives ("nccl"), or NULL */
    /* Makes ctx->device for this rank (ctx->local_rank of ctx->local_size picks the GPU) and sets ctx->stream_ops;
     * with use_collectives also ctx->collectives and ctx->collectives_world. Collective: every rank calls it at once,
     * and every rank returns or every rank exits (world_exit_all) naming the first failing rank's reason. */
    void (*open)(context *ctx, const plugin_options *options);
    /* Before the device is destroyed: frees what open made besides the device (the world's communicator) and writes
     * what it measured (PROFILE_KERNELS' table). */
    void (*close)(context *ctx);
} plugin;

/* The plug-ins this build links, NULL-terminated. */
extern const plugin *const plugins_linked[];

#endif
