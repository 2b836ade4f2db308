/* device_cpu.c — the CPU device: tensors in host memory, the layers of core/kernels/layers.c, plain loops for the rest.
 *
 * Each entry is the CPU's way of doing what core/device/device.h names; the layer entries only drop the device argument
 * (core/kernels/layers.h is the CPU's own interface: the tests and the lesson labs call it directly). The vector loops
 * are the ones the runtime ran inline before the device table existed, unchanged, so the CPU's results are bit for bit
 * what they were: sums in double in index order, AdamW in core/kernels/adamw_kernel.c's loop.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/device/device.h"
#include "core/kernels/layers.h"
#include "core/kernels/layers_bf16.h"
#include "core/kernels/adamw_kernel.h"
#include "core/memory/mem.h"

static void cpu_zero(device *d, void *ptr, size_t bytes) {
    (void)d;
    memset(ptr, 0, bytes);
}

static void cpu_copy(device *d, void *dst, const void *src, size_t bytes, device_copy_kind kind) {
    (void)d;
    (void)kind;
    memmove(dst, src, bytes);
}

static void cpu_synchronize(device *d) { (void)d; }

/* The device pool is host memory. */
static void cpu_memory_info(device *d, size_t *free_bytes, size_t *total_bytes) {
    (void)d;
    (void)mem_host_info(free_bytes, total_bytes);
}

static void cpu_copy_from_pinned(device *d, void *dst, const void *src, size_t bytes) {
    cpu_copy(d, dst, src, bytes, DEVICE_H2H);
}

static void cpu_pinned_copies_wait(device *d) { (void)d; }

static double monotonic_seconds(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + 1e-9 * (double)now.tv_nsec;
}

/* The host's clock at the calls: the work between them is done when they return. */
static int cpu_timer_start(device *d) {
    if (d->timer_count == DEVICE_TIMERS_MAX) return -1;
    int timer = d->timer_count++;
    d->timer_marks[timer][0] = monotonic_seconds();
    return timer;
}

static void cpu_timer_stop(device *d, int timer) { d->timer_marks[timer][1] = monotonic_seconds(); }

static void cpu_timers_wait(device *d) { (void)d; }

static void cpu_timer_read(device *d, int timer, double *start_seconds, double *end_seconds) {
    *start_seconds = d->timer_marks[timer][0];
    *end_seconds = d->timer_marks[timer][1];
}

static void cpu_timers_reset(device *d) { d->timer_count = 0; }

static void cpu_embedding_forward(device *d, float *out, const int *tokens, const float *weight, int N, int C) {
    (void)d;
    embedding_forward(out, tokens, weight, N, C);
}

static void cpu_embedding_backward(device *d, float *dweight, const float *dout, const int *tokens, int N, int C) {
    (void)d;
    embedding_backward(dweight, dout, tokens, N, C);
}

static void cpu_rmsnorm_forward(device *d, float *out, float *rstd, const float *inp, const float *weight, int N,
                                int C, float eps) {
    (void)d;
    rmsnorm_forward(out, rstd, inp, weight, N, C, eps);
}

static void cpu_residual_rmsnorm_forward(device *d, float *residual, float *out, float *rstd, const float *inp,
                                         const float *weight, int N, int C, float eps) {
    (void)d;
    residual_rmsnorm_forward(residual, out, rstd, inp, weight, N, C, eps);
}

static void cpu_rmsnorm_backward(device *d, float *dinp, const float *dresidual, float *dweight, const float *dout,
                                 const float *inp, const float *weight, const float *rstd, int N, int C) {
    (void)d;
    rmsnorm_backward(dinp, dresidual, dweight, dout, inp, weight, rstd, N, C);
}

static void cpu_linear_forward(device *d, float *out, const float *inp, const float *weight, const float *bias, int N,
                               int IC, int OC) {
    (void)d;
    linear_forward(out, inp, weight, bias, N, IC, OC);
}

static void cpu_linear_backward(device *d, float *dinp, float *dweight, float *dbias, const float *dout,
                                const float *inp, const float *weight, int N, int IC, int OC) {
    (void)d;
    linear_backward(dinp, dweight, dbias, dout, inp, weight, N, IC, OC);
}

static void cpu_rope_tables(device *d, float *cos_table, float *sin_table, int T, int D, float theta) {
    (void)d;
    rope_tables(cos_table, sin_table, T, D, theta);
}

static void cpu_rope_forward(device *d, float *x, const float *cos_table, const float *sin_table, int B, int T, int H,
                             int D) {
    (void)d;
    rope_forward(x, cos_table, sin_table, B, T, H, D);
}

static void cpu_rope_backward(device *d, float *dx, const float *cos_table, const float *sin_table, int B, int T,
                              int H, int D) {
    (void)d;
    rope_backward(dx, cos_table, sin_table, B, T, H, D);
}

static void cpu_attention_forward_at(device *d, float *out, float *probs, float *scratch, const float *q,
                                     const float *k, const float *v, int B, int T, int past, int H, int KVH, int D) {
    (void)d, (void)scratch;
    attention_forward_at(out, probs, q, k, v, B, T, past, H, KVH, D);
}

static void cpu_attention_probs(device *d, float *probs, float *scratch, const float *q, const float *k, int B, int T,
                                int H, int KVH, int D) {
    (void)d, (void)scratch;
    attention_probs_at(probs, q, k, B, T, 0, H, KVH, D);
}

static void cpu_attention_backward(device *d, float *dq, float *dk, float *dv, float *scratch, const float *dout,
                                   const float *probs, const float *q, const float *k, const float *v, int B, int T,
                                   int H, int KVH, int D) {
    (void)d;
    attention_backward(dq, dk, dv, scratch, dout, probs, q, k, v, B, T, H, KVH, D);
}

static void cpu_swiglu_forward(device *d, float *out, const float *gate_up, int N, int width) {
    (void)d;
    swiglu_forward(out, gate_up, N, width);
}

static void cpu_swiglu_backward(device *d, float *dgate_up, const float *dout, const float *gate_up, int N,
                                int width) {
    (void)d;
    swiglu_backward(dgate_up, dout, gate_up, N, width);
}

static float cpu_cross_entropy_forward_backward(device *d, float *dlogits, const float *logits, const int *targets,
                                                int N, int V, int ignore_index, int *count_out) {
    (void)d;
    return cross_entropy_forward_backward(dlogits, logits, targets, N, V, ignore_index, count_out);
}

/* A slot outside the table is the caller's mistake (the model checks its slots first, naming its rank). */
static void check_slots(const char *what, int first, int count) {
    if (first >= 0 && count >= 0 && first + count <= DEVICE_LOSS_SLOTS) return;
    fprintf(stderr, "cpu device: %s: loss slots %d .. %d outside the table's 0 .. %d\n", what, first, first + count - 1,
            DEVICE_LOSS_SLOTS - 1);
    abort();
}

/* The loss as cross_entropy_forward_backward computes it (on the logits read as their bfloat16 rounding when
 * logits_dtype says so), its dlogits then scaled as `scale` would (x *= factor), the mean added into the slot as the
 * CUDA device's kernel adds it. */
static void cpu_cross_entropy_to_slot(device *d, float *dlogits, const float *logits, dtype logits_dtype,
                                      const int *targets, int N, int V, int ignore_index, float dlogits_scale,
                                      dtype dlogits_dtype, int slot) {
    check_slots("cross_entropy_to_slot", slot, 1);
    int count = 0;
    float mean = cross_entropy_forward_backward_of(dlogits, logits, logits_dtype == DTYPE_BFLOAT16, targets, N, V,
                                                   ignore_index, &count);
    if (dlogits != NULL) {
        for (size_t i = 0; i < (size_t)N * V; i++) dlogits[i] *= dlogits_scale;
        dtype_round_to(dlogits, (size_t)N * V, dlogits_dtype);
    }
    d->loss_slots[slot][0] += (double)mean * count;
    d->loss_slots[slot][1] += count;
}

static void cpu_loss_slots_read(device *d, double *sums, double *counts, int first, int count) {
    check_slots("loss_slots_read", first, count);
    for (int i = 0; i < count; i++) {
        sums[i] = d->loss_slots[first + i][0], counts[i] = d->loss_slots[first + i][1];
        d->loss_slots[first + i][0] = d->loss_slots[first + i][1] = 0.0;
    }
}

static void cpu_add_inplace(device *d, float *out, const float *inp, size_t count) {
    (void)d;
    add_inplace(out, inp, count);
}

static void cpu_accumulate(device *d, float *out, const void *inp, dtype type, size_t count) {
    (void)d;
    float widened[256];
    for (size_t first = 0; first < count; first += 256) {
        size_t chunk = count - first < 256 ? count - first : 256;
        dtype_convert(widened, DTYPE_FLOAT32, (const char *)inp + first * dtype_size(type), type, chunk);
        for (size_t i = 0; i < chunk; i++) out[first + i] += widened[i];
    }
}

static void cpu_scale(device *d, float *x, float factor, size_t count) {
    (void)d;
    for (size_t i = 0; i < count; i++) x[i] *= factor;
}

static double cpu_sum_squares(device *d, const float *x, size_t count) {
    (void)d;
    double sum = 0.0;
    for (size_t i = 0; i < count; i++) sum += (double)x[i] * x[i];
    return sum;
}

static double cpu_sum_abs(device *d, const float *x, size_t count) {
    (void)d;
    double sum = 0.0;
    for (size_t i = 0; i < count; i++) sum += fabs((double)x[i]);
    return sum;
}

static size_t cpu_first_nonfinite(device *d, const float *x, size_t count) {
    (void)d;
    for (size_t i = 0; i < count; i++)
        if (!isfinite(x[i])) return i;
    return count;
}

static int cpu_first_nonfinite_of(device *d, const float *const *xs, const size_t *counts, int n) {
    for (int i = 0; i < n; i++)
        if (cpu_first_nonfinite(d, xs[i], counts[i]) < counts[i]) return i;
    return n;
}

static void cpu_convert(device *d, void *dst, dtype to, const void *src, dtype from, size_t count) {
    (void)d;
    dtype_convert(dst, to, src, from, count);
}

/* Piece by piece: a copy (or a conversion) of the elements a rank's piece holds, then its padding zeroed. */
static void cpu_rows_copy(device *d, void *rank_major, dtype type, float *full, int to_full,
                          const device_rows_param *params, int param_count, size_t sharded_numel, int first_rank,
                          int ranks) {
    (void)d;
    size_t element = dtype_size(type);
    for (int r = 0; r < ranks; r++)
        for (int i = 0; i < param_count; i++) {
            const device_rows_param *p = &params[i];
            size_t begin = (size_t)(first_rank + r) * p->shard_numel; /* the parameter's first element it holds */
            size_t held = begin >= p->numel ? 0 : p->numel - begin < p->shard_numel ? p->numel - begin : p->shard_numel;
            char *piece = (char *)rank_major + ((size_t)r * sharded_numel + p->shard_offset) * element;
            if (held > 0 && to_full) dtype_convert(full + p->offset + begin, DTYPE_FLOAT32, piece, type, held);
            else if (held > 0) dtype_convert(piece, type, full + p->offset + begin, DTYPE_FLOAT32, held);
            if (!to_full) memset(piece + held * element, 0, (p->shard_numel - held) * element);
        }
}

static void cpu_round_to(device *d, float *x, size_t count, dtype type) {
    (void)d;
    dtype_round_to(x, count, type);
}

static void cpu_adamw_update(device *d, float *param, const float *grad, float *exp_avg, float *exp_avg_sq,
                             size_t count, const adamw_kernel_scalars *s) {
    (void)d;
    adamw_kernel_update(param, grad, exp_avg, exp_avg_sq, count, s);
}

/* ---- the layers in bfloat16: core/kernels/layers_bf16.c, and the GEMMs as float32 GEMMs of bfloat16 values ---- */

static void cpu_linear_forward_bf16(device *d, float *out, const float *inp, const float *weight, const float *bias,
                                    int N, int IC, int OC) {
    (void)d;
    linear_forward(out, inp, weight, bias, N, IC, OC);
    dtype_round_to(out, (size_t)N * OC, DTYPE_BFLOAT16);
}

static void cpu_linear_forward_bf16_sums(device *d, float *out, const float *inp, const float *weight, int N, int IC,
                                         int OC) {
    (void)d;
    linear_forward(out, inp, weight, NULL, N, IC, OC);
}

static void cpu_linear_backward_bf16(device *d, float *dinp, float *dweight, float *dbias, const float *dout,
                                     const float *inp, const float *weight, int N, int IC, int OC) {
    (void)d;
    linear_backward(dinp, dweight, dbias, dout, inp, weight, N, IC, OC);
    if (dinp != NULL) dtype_round_to(dinp, (size_t)N * IC, DTYPE_BFLOAT16);
}

static void cpu_rmsnorm_forward_bf16(device *d, float *out, float *rstd, const float *inp, const float *weight, int N,
                                     int C, float eps) {
    (void)d;
    rmsnorm_forward_bf16(out, rstd, inp, weight, N, C, eps);
}

static void cpu_residual_rmsnorm_forward_bf16(device *d, float *residual, float *out, float *rstd, const float *inp,
                                              const float *weight, int N, int C, float eps) {
    (void)d;
    residual_rmsnorm_forward_bf16(residual, out, rstd, inp, weight, N, C, eps);
}

static void cpu_rmsnorm_backward_bf16(device *d, float *dinp, const float *dresidual, float *dweight,
                                      const float *dout, const float *inp, const float *weight, const float *rstd,
                                      int N, int C) {
    (void)d;
    rmsnorm_backward_bf16(dinp, dresidual, dweight, dout, inp, weight, rstd, N, C);
}

static void cpu_rope_forward_bf16(device *d, float *x, const float *cos_table, const float *sin_table, int B, int T,
                                  int H, int D) {
    (void)d;
    rope_forward_bf16(x, cos_table, sin_table, B, T, H, D);
}

static void cpu_rope_backward_bf16(device *d, float *dx, const float *cos_table, const float *sin_table, int B, int T,
                                   int H, int D) {
    (void)d;
    rope_backward_bf16(dx, cos_table, sin_table, B, T, H, D);
}

static void cpu_attention_forward_bf16(device *d, float *out, float *probs, float *scratch, const float *q,
                                       const float *k, const float *v, int B, int T, int past, int H, int KVH, int D) {
    (void)d;
    attention_forward_bf16(out, probs, scratch, q, k, v, B, T, past, H, KVH, D);
}

static void cpu_attention_probs_bf16(device *d, float *probs, float *scratch, const float *q, const float *k, int B,
                                     int T, int H, int KVH, int D) {
    (void)d, (void)scratch;
    attention_probs_bf16(probs, q, k, B, T, 0, H, KVH, D);
}

static void cpu_attention_backward_bf16(device *d, float *dq, float *dk, float *dv, float *scratch, const float *dout,
                                        const float *probs, const float *q, const float *k, const float *v, int B,
                                        int T, int H, int KVH, int D) {
    (void)d;
    attention_backward_bf16(dq, dk, dv, scratch, dout, probs, q, k, v, B, T, H, KVH, D);
}

static void cpu_swiglu_forward_bf16(device *d, float *out, const float *gate_up, int N, int width) {
    (void)d;
    swiglu_forward_bf16(out, gate_up, N, width);
}

static void cpu_swiglu_backward_bf16(device *d, float *dgate_up, const float *dout, const float *gate_up, int N,
                                     int width) {
    (void)d;
    swiglu_backward_bf16(dgate_up, dout, gate_up, N, width);
}

static void cpu_linear_backward_input_stacked_bf16(device *d, float *dinp, float *scratch, const float *dout,
                                                   const float *weight, int N, int IC, int OC) {
    (void)d;
    linear_backward_input_stacked_bf16(dinp, scratch, dout, weight, N, IC, OC);
}

static void cpu_add_inplace_bf16(device *d, float *out, const float *inp, size_t count) {
    (void)d;
    add_bf16(out, inp, count);
}

void device_cpu_init(device *d) {
    memset(d, 0, sizeof *d);
    d->name = "cpu";
    d->kind = DEVICE_CPU;
    d->segments = allocator_host_backend;
    d->host_segments = allocator_host_backend;
    d->zero = cpu_zero;
    d->copy = cpu_copy;
    d->synchronize = cpu_synchronize;
    d->memory_info = cpu_memory_info;
    d->copy_from_pinned = cpu_copy_from_pinned;
    d->pinned_copies_wait = cpu_pinned_copies_wait;
    d->timers_deferred = 0;
    d->timer_start = cpu_timer_start;
    d->timer_stop = cpu_timer_stop;
    d->timers_wait = cpu_timers_wait;
    d->timer_read = cpu_timer_read;
    d->timers_reset = cpu_timers_reset;
    d->embedding_forward = cpu_embedding_forward;
    d->embedding_backward = cpu_embedding_backward;
    d->rmsnorm_forward = cpu_rmsnorm_forward;
    d->residual_rmsnorm_forward = cpu_residual_rmsnorm_forward;
    d->rmsnorm_backward = cpu_rmsnorm_backward;
    d->linear_forward = cpu_linear_forward;
    d->linear_backward = cpu_linear_backward;
    d->rope_tables = cpu_rope_tables;
    d->rope_forward = cpu_rope_forward;
    d->rope_backward = cpu_rope_backward;
    d->attention_forward_at = cpu_attention_forward_at;
    d->attention_probs = cpu_attention_probs;
    d->attention_backward = cpu_attention_backward;
    d->swiglu_forward = cpu_swiglu_forward;
    d->swiglu_backward = cpu_swiglu_backward;
    d->cross_entropy_forward_backward = cpu_cross_entropy_forward_backward;
    d->cross_entropy_to_slot = cpu_cross_entropy_to_slot;
    d->loss_slots_read = cpu_loss_slots_read;
    d->linear_forward_bf16 = cpu_linear_forward_bf16;
    d->linear_forward_bf16_sums = cpu_linear_forward_bf16_sums;
    d->linear_backward_bf16 = cpu_linear_backward_bf16;
    d->rmsnorm_forward_bf16 = cpu_rmsnorm_forward_bf16;
    d->residual_rmsnorm_forward_bf16 = cpu_residual_rmsnorm_forward_bf16;
    d->rmsnorm_backward_bf16 = cpu_rmsnorm_backward_bf16;
    d->rope_forward_bf16 = cpu_rope_forward_bf16;
    d->rope_backward_bf16 = cpu_rope_backward_bf16;
    d->attention_forward_bf16 = cpu_attention_forward_bf16;
    d->attention_probs_bf16 = cpu_attention_probs_bf16;
    d->attention_backward_bf16 = cpu_attention_backward_bf16;
    d->swiglu_forward_bf16 = cpu_swiglu_forward_bf16;
    d->swiglu_backward_bf16 = cpu_swiglu_backward_bf16;
    d->linear_backward_input_stacked_bf16 = cpu_linear_backward_input_stacked_bf16;
    d->add_inplace_bf16 = cpu_add_inplace_bf16;
    d->add_inplace = cpu_add_inplace;
    d->accumulate = cpu_accumulate;
    d->scale = cpu_scale;
    d->sum_squares = cpu_sum_squares;
    d->sum_abs = cpu_sum_abs;
    d->first_nonfinite = cpu_first_nonfinite;
    d->first_nonfinite_of = cpu_first_nonfinite_of;
    d->convert = cpu_convert;
    d->round_to = cpu_round_to;
    d->rows_copy = cpu_rows_copy;
    d->adamw_update = cpu_adamw_update;
}
