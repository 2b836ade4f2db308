/* offload.h — CPU offload: the host pool, and the copies between it and the device pool.
 *
 * torch's CPUOffload(offload_params=True) keeps a FlatParameter's shard, its gradient shard and AdamW's moments in
 * host memory and leaves the device only what computes: the unsharded units in flight and the activations. Per
 * unit and micro-batch the data moves twice:
 *
 *   h2d  before the all-gather, the host shard is copied into this rank's chunk of the device's unsharded buffer,
 *        and the all-gather runs in place there (the shard never needs a device buffer of its own)
 *   d2h  after the reduce-scatter, the device's gradient shard is copied to the host, where it is accumulated
 *        and where AdamW steps (core/fsdp/optim.h, on the host pool's buffers)
 *
 * On the CPU build both pools are host memory (the device pool is a caching allocator of its own, with a budget:
 * DEVICE_MEMORY_MB), so a copy is a memcpy; on the CUDA build the host pool is pinned memory and a copy is a
 * cudaMemcpyAsync on its stream. Either way a copy is exact: offload changes where bytes live, never their values.
 * Each copy is a `copy` event (direction, bytes, duration) and is counted in the context (ctx->copies ...).
 */
#ifndef FSDPLAB_OFFLOAD_H
#define FSDPLAB_OFFLOAD_H

#include <stddef.h>

#include "core/runtime/context.h"

typedef enum offload_direction { OFFLOAD_H2D, OFFLOAD_D2H } offload_direction;

const char *offload_direction_name(offload_direction direction);
/* The host pool of this rank, made (with the device pool's ALLOC settings, no budget) on first use. */
mem_tracker *offload_host_pool(context *ctx);
/* The pool of what the host itself reads and writes that is tracked as data (the loader's text and token stream, a
 * lab's batch before it goes to the device): the device pool on the CPU device (host memory there: one pool, as
 * always), the host pool on the CUDA device, whose device pool the host cannot touch. */
mem_tracker *offload_data_pool(context *ctx);
/* Copies `bytes` from src to dst (exactly), writes a `copy` event for `owner` of `unit` run by `stream_name` (NULL:
 * the host, "compute") and counts it. */
void offload_copy(context *ctx, void *dst, const void *src, size_t bytes, offload_direction direction,
                  const char *unit, const char *owner, const char *stream_name);

#endif
