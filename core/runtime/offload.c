/* offload.c — the host pool and the copies of CPU offload. See offload.h. */
#include "core/runtime/offload.h"


const char *offload_direction_name(offload_direction direction) { return direction == OFFLOAD_H2D ? "h2d" : "d2h"; }

mem_tracker *offload_host_pool(context *ctx) {
    if (!ctx->host_mem_ready) {
        mem_init_pool_on(&ctx->host_mem, ctx->rank, &ctx->trace, &ctx->allocation, MEM_HOST, 0,
                         &ctx->device.host_segments);
        ctx->host_mem_ready = 1;
    }
    return &ctx->host_mem;
}

mem_tracker *offload_data_pool(context *ctx) {
    return ctx->device.kind == DEVICE_CPU ? &ctx->mem : offload_host_pool(ctx);
}

void offload_copy(context *ctx, void *dst, const void *src, size_t bytes, offload_direction direction,
                  const char *unit, const char *owner, const char *stream_name) {
    double start = trace_now_us(&ctx->trace);
    ctx->device.copy(&ctx->device, dst, src, bytes, direction == OFFLOAD_H2D ? DEVICE_H2D : DEVICE_D2H);
    double duration = trace_now_us(&ctx->trace) - start;
    ctx->copies[direction]++;
    ctx->copy_bytes[direction] += bytes;
    ctx->copy_us[direction] += duration;
    trace_copy_info info = {.direction = offload_direction_name(direction), .unit = unit, .owner = owner,
                            .bytes = bytes, .stream = stream_name, .start_us = start, .dur_us = duration};
    trace_copy(&ctx->trace, &info);
}
