/* device.h — the compute device of a rank: where tensors live and what computes on them.
 *
 * The runtime (flat_param, fsdp, optim) and the model (qwen2.c) never loop over a tensor's elements themselves and
 * never call memcpy / memset on tensor memory: they call the device. Two devices implement the same table:
 *
 *   cpu   (device_cpu.c)        tensors in host memory; the layers of core/kernels/layers.c (C loops + OpenBLAS)
 *   cuda  (core/cuda/, CUDA=1)  tensors in GPU memory (cudaMalloc segments of the caching allocator); kernels in
 *                               core/cuda/kernels.cu and GEMMs in cuBLAS, launched on the compute stream
 *
 * so the same FSDP loop, hooks and model code run on either, and the trace, the memory model and the labs do not
 * know which. The per-element arithmetic both devices run (RMSNorm's scale, RoPE's rotation, SiLU, softmax's
 * pieces, AdamW's update, bfloat16 rounding) is in core/base/kernel_math.h as `static inline` functions that the CPU
 * loops and the CUDA kernels both call: the CPU tests cover the arithmetic the GPU runs.
 *
 * Every function takes the device first (its backend state: on CUDA the stream and the cuBLAS handle). Work is
 * ordered on the device's compute stream: on CPU it is done when the call returns; on CUDA it is queued, and a
 * function that returns a value to the host (sum_squares, first_nonfinite, cross_entropy_forward_backward's loss,
 * loss_slots_read) or copies to the host waits for it. The layer functions have the signatures and meaning of
 * core/kernels/layers.h (read it), on device pointers: a backward writes its input's gradient and adds into its
 * weights'.
 *
 * Host pointers: `tokens` and `targets` live in device memory too (category data, int32), copied there by
 * device_copy from the batch; nothing here takes a host pointer except the copies' host side.
 */
#ifndef FSDPLAB_DEVICE_H
#define FSDPLAB_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "core/memory/allocator.h"
#include "core/base/dtype.h"
#include "core/kernels/adamw_kernel.h"

typedef enum device_kind { DEVICE_CPU, DEVICE_CUDA } device_kind;

/* Which way a copy goes: host (pageable or pinned) <-> device, or within one. On CPU every copy is a memcpy. */
typedef enum device_copy_kind { DEVICE_H2D, DEVICE_D2H, DEVICE_D2D, DEVICE_H2H } device_copy_kind;


/* Timers one device holds at once (device.timer_start): a step's compute spans, read at its end. */
#define DEVICE_TIMERS_MAX 1024
/* Loss slots one device holds (device.cross_entropy_to_slot): a step's micro-batches' losses, read at its end. */
#define DEVICE_LOSS_SLOTS 64

/* One parameter of FSDP2's rank-major layout (flat_param.h's FLAT_PARAM_ROWS) for rows_copy: its elements at
 * [offset, offset + numel) of the unsharded buffer; every rank's piece of it, shard_numel elements (the rank's c rows,
 * padding rows included), at shard_offset of that rank's slice of the rank-major buffer. */
typedef struct device_rows_param {
    size_t offset, numel, shard_offset, shard_numel;
} device_rows_param;

typedef struct device device;
struct device {
    const char *name;             /* "cpu" or "cuda" (the meta event's `device`) */
    device_kind kind;
    int ordinal;                  /* the GPU this rank uses (CUDA), 0 on CPU */
    void *impl;                   /* the backend's state (core/cuda/cuda_device.h); NULL on CPU */
    allocator_backend segments;   /* where the device pool's segments come from (cudaMalloc; aligned host memory) */
    allocator_backend host_segments; /* the host pool's (pinned host memory on CUDA; aligned host memory) */

    /* ---- memory ---- */
    void (*zero)(device *d, void *ptr, size_t bytes);
    void (*copy)(device *d, void *dst, const void *src, size_t bytes, device_copy_kind kind);
    /* A copy from host memory (pinned: the host pool's, on CUDA) into device memory that the host does not wait
     * for: queued on the compute stream. The host must not write `src` again before pinned_copies_wait, which
     * returns once every such copy queued so far has read its source (the CPU: a memcpy, done when it returns;
     * CUDA: an event after the copies, queried first, so the host waits only when the stream is behind). */
    void (*copy_from_pinned)(device *d, void *dst, const void *src, size_t bytes);
    void (*pinned_copies_wait)(device *d);
    /* The host waits for every queued operation of the device (CUDA: an event after the compute stream's work). */
    void (*synchronize)(device *d);
    /* The memory the device pool's segments come from: *free_bytes that can still be had, *total_bytes in all (the
     * host's MemAvailable and MemTotal on the CPU; cudaMemGetInfo of this rank's GPU on CUDA, which every process
     * using the GPU shares). Both 0 when the device cannot say. The memory model's check reads it before a run. */
    void (*memory_info)(device *d, size_t *free_bytes, size_t *total_bytes);
    /* device_destroy's work for this device: NULL on the CPU (nothing beyond the table). */
    void (*destroy)(device *d);

    /* ---- timing: how long work took on the compute stream, without a host wait per span ----
     * timer_start marks the compute stream now and returns a timer (-1: all DEVICE_TIMERS_MAX are in use; read them
     * and reset first); timer_stop marks its end. timers_wait waits until every mark so far has passed, then
     * timer_read gives a timer's marks as CLOCK_MONOTONIC seconds; timers_reset frees every timer. On the CPU a mark
     * is the host's clock at the call (the work is done when a call returns) and timers_deferred is 0: a span is read
     * at once, as the host measured it. On CUDA a mark is a cudaEvent, and the caller reads them later, once a step
     * (timers_deferred 1): one host wait per step where a span read at once would need two. */
    int timers_deferred;
    int (*timer_start)(device *d);
    void (*timer_stop)(device *d, int timer);
    void (*timers_wait)(device *d);
    void (*timer_read)(device *d, int timer, double *start_seconds, double *end_seconds);
    void (*timers_reset)(device *d);
    /* The CPU's marks (the CUDA device keeps events in `impl` and maps their times here when read). */
    double timer_marks[DEVICE_TIMERS_MAX][2];
    int timer_count;

    /* ---- the layers (core/kernels/layers.h, on device memory): a backward writes its input's gradient (=, no
     * zeroed buffer needed: a GPU's GEMM runs with beta = 0) and adds (+=) into its weights' ---- */
    void (*embedding_forward)(device *d, float *out, const int *tokens, const float *weight, int N, int C);
    void (*embedding_backward)(device *d, float *dweight, const float *dout, const int *tokens, int N, int C);
    void (*rmsnorm_forward)(device *d, float *out, float *rstd, const float *inp, const float *weight, int N, int C,
                            float eps);
    /* residual += inp, then rmsnorm_forward of it: a residual add and the norm after it in one pass (one kernel on a
     * GPU, where they were two), the same values as add_inplace then rmsnorm_forward. */
    void (*residual_rmsnorm_forward)(device *d, float *residual, float *out, float *rstd, const float *inp,
                                     const float *weight, int N, int C, float eps);
    /* dinp = dresidual + the norm's input gradient (dresidual NULL: none; dinp itself: +=), dweight +=: the residual
     * stream's gradient and the norm's added in the norm's pass, no copy of dresidual into dinp first. */
    void (*rmsnorm_backward)(device *d, float *dinp, const float *dresidual, float *dweight, const float *dout,
                             const float *inp, const float *weight, const float *rstd, int N, int C);
    void (*linear_forward)(device *d, float *out, const float *inp, const float *weight, const float *bias, int N,
                           int IC, int OC);
    void (*linear_backward)(device *d, float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                            const float *weight, int N, int IC, int OC);
    /* cos, sin (T, D) computed as layers.c's rope_tables (on the host, then copied). */
    void (*rope_tables)(device *d, float *cos_table, float *sin_table, int T, int D, float theta);
    void (*rope_forward)(device *d, float *x, const float *cos_table, const float *sin_table, int B, int T, int H,
                         int D);
    void (*rope_backward)(device *d, float *dx, const float *cos_table, const float *sin_table, int B, int T, int H,
                          int D);
    /* scratch: device_attention_forward_scratch_floats(B, T, past, H, KVH, D, 0) floats (the CPU reads none). */
    void (*attention_forward_at)(device *d, float *out, float *probs, float *scratch, const float *q, const float *k,
                                 const float *v, int B, int T, int past, int H, int KVH, int D);
    /* The forward's probs again (past = 0), by its own lines: equal to the bit (layers.h's attention_probs_at), for
     * the backward, which the model keeps no probs for. scratch: the backward's (the GPU lays q and k out at its
     * start, as the backward then does; the CPU reads none). */
    void (*attention_probs)(device *d, float *probs, float *scratch, const float *q, const float *k, int B, int T,
                            int H, int KVH, int D);
    /* scratch: device_attention_backward_scratch_floats(B, T, H, KVH, D) floats (the CPU reads T T of them). */
    void (*attention_backward)(device *d, float *dq, float *dk, float *dv, float *scratch, const float *dout,
                               const float *probs, const float *q, const float *k, const float *v, int B, int T,
                               int H, int KVH, int D);
    void (*swiglu_forward)(device *d, float *out, const float *gate_up, int N, int width);
    void (*swiglu_backward)(device *d, float *dgate_up, const float *dout, const float *gate_up, int N, int width);
    /* The mean loss, returned to the host (so it waits); dlogits overwritten. */
    float (*cross_entropy_forward_backward)(device *d, float *dlogits, const float *logits, const int *targets, int N,
                                            int V, int ignore_index, int *count_out);
    /* The same loss kept on the device, nothing returned and nothing waited for: loss slot `slot` (below) gets the
     * mean loss m (float, as returned above) added as (double)m * count, and count added to its count; dlogits (NULL:
     * none) = cross_entropy_forward_backward's, each element then times dlogits_scale in float (one rounding, as a
     * `scale` after it) and rounded to dlogits_dtype (float32: not at all; bfloat16: the gradient of logits.float()
     * in bfloat16 compute). The logits are read as their rounding to logits_dtype (bfloat16: the sums of
     * linear_forward_bf16_sums, the head's rounding done here; float32: as they are). Each rounding and the scale
     * are fused into the loss's pass, not more passes over N x V. */
    void (*cross_entropy_to_slot)(device *d, float *dlogits, const float *logits, dtype logits_dtype,
                                  const int *targets, int N, int V, int ignore_index, float dlogits_scale,
                                  dtype dlogits_dtype, int slot);
    /* ---- the loss slots: a micro-batch's loss stays on the device until the step's end ----
     * DEVICE_LOSS_SLOTS pairs (sum, count) of doubles, in the device's own memory made at init (outside the caching
     * allocator, like the reductions' scratch), zero at init. loss_slots_read copies slots first .. first + count - 1
     * to the host with one wait (sums[i], counts[i]), then zeroes them (queued) for the next step; the mean is
     * (float)(sum / count), 0 when count is 0. */
    void (*loss_slots_read)(device *d, double *sums, double *counts, int first, int count);
    double loss_slots[DEVICE_LOSS_SLOTS][2]; /* the CPU's slots (the CUDA device keeps its own in `impl`) */

    /* ---- the layers in bfloat16 (mixed precision, param_dtype = bfloat16: core/kernels/layers_bf16.h, read it) ----
     * What torch computes on bfloat16 tensors, on float32 buffers that hold bfloat16 values: every input is a
     * bfloat16 value, each op computes in float32 and its output is rounded where torch's graph ends an op. Same
     * signatures and conventions as the float32 layers above; what differs is said per function. A GEMM's inputs
     * being bfloat16 values, a GPU runs it on bfloat16 tensor cores with float32 accumulation (cuBLAS's
     * CUBLAS_COMPUTE_32F_FAST_16BF: the inputs' conversion to bfloat16 is exact), the CPU in float32 (OpenBLAS has
     * no bfloat16 GEMM): the same float32 sums of exact products, in other orders. */
    /* out = bf16(inp @ weight^T + bias): linear_forward, its output rounded. */
    void (*linear_forward_bf16)(device *d, float *out, const float *inp, const float *weight, const float *bias,
                                int N, int IC, int OC);
    /* Its GEMM (no bias) without the rounding: out holds the float32 sums whose bfloat16 rounding is the output, for
     * a reader that rounds as it reads (cross_entropy_to_slot's logits_dtype): the CPU's float32 GEMM, the GPU's GEMM
     * on the tensor cores with no pass after it. */
    void (*linear_forward_bf16_sums)(device *d, float *out, const float *inp, const float *weight, int N, int IC,
                                     int OC);
    /* linear_backward with dinp (when not NULL) rounded: dinp = bf16(dout @ weight);
     * dweight and dbias add float32 sums (rounded once, at the reduce: flat_param.c). */
    void (*linear_backward_bf16)(device *d, float *dinp, float *dweight, float *dbias, const float *dout,
                                 const float *inp, const float *weight, int N, int IC, int OC);
    void (*rmsnorm_forward_bf16)(device *d, float *out, float *rstd, const float *inp, const float *weight, int N,
                                 int C, float eps);
    /* residual = bf16(residual + inp), then rmsnorm_forward_bf16 of it. */
    void (*residual_rmsnorm_forward_bf16)(device *d, float *residual, float *out, float *rstd, const float *inp,
                                          const float *weight, int N, int C, float eps);
    void (*rmsnorm_backward_bf16)(device *d, float *dinp, const float *dresidual, float *dweight, const float *dout,
                                  const float *inp, const float *weight, const float *rstd, int N, int C);
    void (*rope_forward_bf16)(device *d, float *x, const float *cos_table, const float *sin_table, int B, int T,
                              int H, int D);
    void (*rope_backward_bf16)(device *d, float *dx, const float *cos_table, const float *sin_table, int B, int T,
                               int H, int D);
    /* scratch: device_attention_forward_scratch_floats(B, T, past, H, KVH, D, 1) floats (the CPU reads T (past + T)
     * of them, layers_bf16.h). */
    void (*attention_forward_bf16)(device *d, float *out, float *probs, float *scratch, const float *q,
                                   const float *k, const float *v, int B, int T, int past, int H, int KVH, int D);
    /* attention_probs of the bfloat16 attention (layers_bf16.h's attention_probs_bf16). */
    void (*attention_probs_bf16)(device *d, float *probs, float *scratch, const float *q, const float *k, int B,
                                 int T, int H, int KVH, int D);
    /* dq, dk, dv written; scratch: device_attention_backward_scratch_floats(B, T, H, KVH, D) floats (the CPU
     * reads 2 T T + T D of them, layers_bf16.h). */
    void (*attention_backward_bf16)(device *d, float *dq, float *dk, float *dv, float *scratch, const float *dout,
                                    const float *probs, const float *q, const float *k, const float *v, int B, int T,
                                    int H, int KVH, int D);
    void (*swiglu_forward_bf16)(device *d, float *out, const float *gate_up, int N, int width);
    void (*swiglu_backward_bf16)(device *d, float *dgate_up, const float *dout, const float *gate_up, int N,
                                 int width);
    /* Overwrites dinp; scratch: N IC floats (layers_bf16.h). */
    void (*linear_backward_input_stacked_bf16)(device *d, float *dinp, float *scratch, const float *dout,
                                               const float *weight, int N, int IC, int OC);
    /* out = bf16(bf16(out) + bf16(inp)) (layers_bf16.h's add_bf16): the add and its rounding in one pass. */
    void (*add_inplace_bf16)(device *d, float *out, const float *inp, size_t count);

    /* ---- vectors (the runtime's element loops) ---- */
    void (*add_inplace)(device *d, float *out, const float *inp, size_t count);          /* out += inp */
    /* out += inp widened to float32 (inp of `type`: float32 or bfloat16): a low-precision gradient into the float32
     * gradient shard. */
    void (*accumulate)(device *d, float *out, const void *inp, dtype type, size_t count);
    void (*scale)(device *d, float *x, float factor, size_t count);                      /* x *= factor */
    double (*sum_squares)(device *d, const float *x, size_t count);  /* sum of x^2 in double, to the host */
    double (*sum_abs)(device *d, const float *x, size_t count);      /* sum of |x| in double, to the host */
    /* Index of the first element that is not finite, or count when all are. */
    size_t (*first_nonfinite)(device *d, const float *x, size_t count);
    /* The first of n arrays (xs[i], counts[i] elements) holding an element that is not finite, or n when none does:
     * first_nonfinite of each, with one host wait for them all (CUDA: the reductions queued, their results copied
     * back together) where n calls of first_nonfinite wait n times. */
    int (*first_nonfinite_of)(device *d, const float *const *xs, const size_t *counts, int n);
    /* FSDP2's copies between a unit's rank-major buffer and its unpadded parameters, every parameter of every rank
     * in one pass (torch's split_with_sizes_copy after the all-gather, chunk_cat before the reduce-scatter): one
     * launch on a GPU where a copy per parameter per rank made dozens. rank_major holds `ranks` slices of
     * sharded_numel elements of rank_major_type (float32 or bfloat16), ranks first_rank .. first_rank + ranks - 1;
     * parameter i's piece in rank r's slice (params[i].shard_numel elements at params[i].shard_offset) is its
     * elements from r * shard_numel on, as far as numel (the rest: padding rows). to_full 1: rank_major -> full,
     * widened (exact), padding left behind; 0: full -> rank_major, rounded to rank_major_type, padding zeroed. */
    void (*rows_copy)(device *d, void *rank_major, dtype rank_major_type, float *full, int to_full,
                      const device_rows_param *params, int param_count, size_t sharded_numel, int first_rank,
                      int ranks);
    /* dtype.h's dtype_convert and dtype_round_to on device memory (the same rounding: kernel_math.h). */
    void (*convert)(device *d, void *dst, dtype to, const void *src, dtype from, size_t count);
    void (*round_to)(device *d, float *x, size_t count, dtype type);
    /* One AdamW step on `count` elements, each exactly as core/fsdp/optim.c's loop (kernel_math.h's adamw_element). */
    void (*adamw_update)(device *d, float *param, const float *grad, float *exp_avg, float *exp_avg_sq, size_t count,
                         const adamw_kernel_scalars *scalars);
};

/* The kind of a copy from host memory into this device's memory: a plain host copy on the CPU, h2d on a GPU. */
static inline device_copy_kind device_from_host(const device *d) {
    return d->kind == DEVICE_CPU ? DEVICE_H2H : DEVICE_H2D;
}
/* And back: device memory into host memory. */
static inline device_copy_kind device_to_host(const device *d) {
    return d->kind == DEVICE_CPU ? DEVICE_H2H : DEVICE_D2H;
}

/* The attention's scratch, one size for both devices (so the memory model need not know which runs). The CPU loops
 * over heads and reads one head's share; the CUDA device batches every (batch, head) pair into one strided-batched
 * GEMM per product, which needs the heads laid out (B, heads, T, D): in forward q (its block then holds the output),
 * k and v transposed, plus, in bfloat16, the rounded probs (B, H, T, past + T); in backward q, k, v and dout
 * transposed (dout's block then holds dq's), one (B, H, T, D) block of per-query-head dk or dv terms (summed into
 * each key/value head in order by one kernel) and dp (B, H, T, T). Counts in floats. */
size_t device_attention_forward_scratch_floats(int B, int T, int past, int H, int KVH, int D, int bf16);
size_t device_attention_backward_scratch_floats(int B, int T, int H, int KVH, int D);

/* The CPU device (core/device/device_cpu.c). */
void device_cpu_init(device *d);

/* Frees what the device made (its `destroy`: on CUDA the cuBLAS handle, streams, events, scratch buffers) and
 * clears the table. The devices themselves come from device_cpu_init or a plug-in (core/runtime/plugin.h). */
void device_destroy(device *d);

#endif
