/* memory_model.c — predicted per-category memory peaks. See memory_model.h. */
#include "core/models/memory_model.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/device/device.h"
#include "core/runtime/env.h"
#include "core/runtime/world.h"
#include "core/base/error.h"

/* Counts are doubles here: exact for every integer below 2^53 (8 PiB), so the prediction is exact to the byte for
 * any run that could exist, and a setting that asks for more (MBS=4096 SEQ=32768 on a wide model: B*H*T*T alone
 * passes 2^64) gives a huge number instead of wrapping around to a small one; bytes() saturates it into size_t. */
typedef double count;
static count max_of(count a, count b) { return a > b ? a : b; }
static size_t bytes(count value) { return value >= 18446744073709549568.0 ? SIZE_MAX : (size_t)value; }

/* Floats one decoder layer's forward saves for its backward (qwen2_layer_activations), plus its output. */
static count layer_activation_floats(const qwen2_config *c, count N) {
    count C = c->hidden_size, I = c->intermediate_size, H = c->num_attention_heads;
    count KVH = c->num_key_value_heads, D = c->head_dim;
    return N * C + N                        /* input_layernorm output, rstd */
           + N * H * D + 2 * N * KVH * D    /* q, k, v (the probabilities are made again in backward) */
           + N * H * D                      /* attention output */
           + N * C + N * C + N              /* residual_mid, post_attention_layernorm output, rstd */
           + 2 * N * I + N * I              /* gate_up, swiglu */
           + N * C;                         /* the layer's output */
}

/* The largest set of backward temporaries alive at once inside one layer's backward (qwen2_layer_backward), or of a
 * layer's forward temporaries (the attention's scratch: a layer recomputed in backward runs its forward before any of
 * its backward temporaries exist). The attention's scratch is core/device/device.h's size, the same on both devices.
 * ln1's gradient is added from its three Linear modules' through one share at a time. bf16_compute (MixedPrecision
 * with param_dtype bfloat16, core/kernels/layers_bf16.h) adds its scratch buffers: up_proj's share of the MLP's input
 * gradient beside gate_proj's, and in forward the attention's bfloat16 probabilities (inside its forward scratch).
 * The attention's probabilities (B H T T) are a temporary of both: the forward's, then the backward's made again. */
static count layer_workspace_floats(const qwen2_config *c, count N, count B, count T, int bf16_compute) {
    count C = c->hidden_size, I = c->intermediate_size, H = c->num_attention_heads;
    count KVH = c->num_key_value_heads, D = c->head_dim;
    count attention_scratch = (count)device_attention_backward_scratch_floats((int)B, (int)T, (int)H, (int)KVH, (int)D);
    count probs = B * H * T * T;
    count forward_scratch = probs +
        (count)device_attention_forward_scratch_floats((int)B, (int)T, 0, (int)H, (int)KVH, (int)D, bf16_compute);
    count mlp = N * C + N * I + 2 * N * I;                                   /* dmid, dact, dgate_up */
    /* dmid, dout, dq, dk, dv, the scratch, the probabilities made again */
    count attention = N * C + N * H * D + N * H * D + 2 * N * KVH * D + attention_scratch + probs;
    count norm = N * C + N * H * D + 2 * N * KVH * D + 2 * N * C;          /* dmid, dq, dk, dv, dln1, a share */
    if (bf16_compute) mlp = max_of(mlp, N * C + 2 * N * I + N * C + N * C); /* dmid, dgate_up, dln2, up's share */
    return max_of(max_of(max_of(mlp, attention), norm), forward_scratch);
}

/* The reserved bound for allocations whose category peaks sum to `sum` (the reasoning is at its use in predict). */
static size_t reserved_bound_of(count sum) {
    return bytes(sum + (count)(bytes(sum) / 2) + ALLOCATOR_LARGE_SEGMENT + ALLOCATOR_SMALL_SEGMENT);
}

/* One unit's sizes, in floats: what the prediction needs of a FlatParameter. FSDP2 (per-parameter rows) adds the
 * unpadded parameters it copies out into: full_numel (FSDP1: 0, unused). */
typedef struct unit_sizes {
    count padded_unsharded_numel, sharded_numel, full_numel;
} unit_sizes;

/* FSDP2's param_unsharded, walked hook by hook in core/fsdp/fsdp.c's order over units 0 (the root) .. L, every buffer
 * added when allocated and taken away when freed, the peak kept. Per unit, in bytes: F its unpadded float32 parameters
 * (full_numel), G its rank-major all-gather output (padded_unsharded_numel param_dtype elements), P = G / N its
 * post-forward shard under reshard_after_forward=N. The lifecycle:
 *   unshard      + G (on a comm stream the all-gather is then in flight; without one it copies out at once)
 *   copy-out     + F, then - G (kept instead in forward on comm streams, torch's all_gather_state: the previous
 *                kept G is freed just before), - P when backward gathered from the post-forward shard
 *   reshard      - F; in _post_forward under reshard_after_forward=N first + P
 * and the hooks: _pre_forward unshards (unless prefetched), copies out, then prefetches (FSDP2 waits before it
 * prefetches); _post_forward reshards a non-root unit under FULL_SHARD, and the root's frees the kept G. Backward
 * meets the root's _pre_backward_hook first (already unsharded: it only prefetches), then units L .. 1 (pre-backward
 * hook, post-backward hook), the root's post-backward hook last. Prefetch targets: an explicit list (unit i: i+1 ..
 * i+Nf forward, i-1 .. i-Nb backward) replaces the implicit one: forward prefetch the next unit (from the second
 * forward on), BACKWARD_PRE the previous unit in _post_forward order (1 .. L, then the root: the root prefetches L)
 * from the pre-backward hook, BACKWARD_POST the same from the post-backward hook. */
typedef struct param_walk {
    const unit_sizes *units;
    const fsdp_options *options;
    count f, p, live, peak;
    int unit_count, kept;        /* kept: the unit whose G a forward copy-out kept, or -1 */
    int *state, *prefetched, *needs; /* state: WALK_*; needs: this pass still has to unshard it */
} param_walk;
enum { WALK_SHARDED, WALK_POST_FORWARD, WALK_IN_FLIGHT, WALK_IN_FLIGHT_FROM_POST_FORWARD, WALK_UNSHARDED };

static void walk_add(param_walk *w, count bytes) { w->live += bytes; w->peak = max_of(w->peak, w->live); }
static count walk_gathered(const param_walk *w, int unit) { return w->p * w->units[unit].padded_unsharded_numel; }
static count walk_post_forward_shard(const param_walk *w, int unit) {
    return walk_gathered(w, unit) / (count)w->options->reshard_after_forward;
}

static void walk_free_kept(param_walk *w) {
    if (w->kept >= 0) w->live -= walk_gathered(w, w->kept);
    w->kept = -1;
}

static void walk_copy_out(param_walk *w, int unit, int keep) {
    walk_add(w, w->f * w->units[unit].full_numel);
    if (!keep) w->live -= walk_gathered(w, unit);
    if (w->state[unit] == WALK_IN_FLIGHT_FROM_POST_FORWARD) w->live -= walk_post_forward_shard(w, unit);
    w->state[unit] = WALK_UNSHARDED;
}

static void walk_unshard(param_walk *w, int unit) {
    if (w->state[unit] != WALK_SHARDED && w->state[unit] != WALK_POST_FORWARD) return;
    walk_add(w, walk_gathered(w, unit));
    w->state[unit] = w->state[unit] == WALK_POST_FORWARD ? WALK_IN_FLIGHT_FROM_POST_FORWARD : WALK_IN_FLIGHT;
    if (!w->options->comm_streams) walk_copy_out(w, unit, 0);
}

static void walk_wait(param_walk *w, int unit, int forward) {
    if (w->state[unit] != WALK_IN_FLIGHT && w->state[unit] != WALK_IN_FLIGHT_FROM_POST_FORWARD) return;
    if (forward) walk_free_kept(w);
    walk_copy_out(w, unit, forward);
    if (forward) w->kept = unit;
}

static void walk_prefetch(param_walk *w, int target) {
    if (target < 0 || target >= w->unit_count || !w->needs[target] || w->prefetched[target]) return;
    walk_unshard(w, target);
    w->prefetched[target] = 1;
}

/* unit's prefetches from _pre_forward (forward), _pre_backward_hook (backward, pre 1) or _post_backward_hook (0). */
static void walk_prefetches(param_walk *w, int unit, int forward, int pre, int recorded) {
    const fsdp_options *o = w->options;
    int explicit_count = unit == 0 ? 0 : forward ? o->forward_prefetch_modules : o->backward_prefetch_modules;
    if (explicit_count > 0) {
        for (int i = 1; pre && i <= explicit_count; i++) {
            int target = forward ? unit + i : unit - i;
            if (target >= 1) walk_prefetch(w, target);
        }
        return;
    }
    if (forward) {
        if (o->forward_prefetch && recorded) walk_prefetch(w, unit + 1);
    } else if (o->backward_prefetch == (pre ? BACKWARD_PRE : BACKWARD_POST)) {
        walk_prefetch(w, unit == 0 ? w->unit_count - 1 : unit - 1); /* unit 1: the root, never resharded */
    }
}

static void walk_reshard(param_walk *w, int unit, int after_forward) {
    if (after_forward && w->options->reshard_after_forward > 1) {
        walk_add(w, walk_post_forward_shard(w, unit));
        w->state[unit] = WALK_POST_FORWARD;
    } else {
        w->state[unit] = WALK_SHARDED;
    }
    w->live -= w->f * w->units[unit].full_numel;
    w->prefetched[unit] = 0;
}

/* One micro-batch's forward and backward; recorded: a forward ran before (forward prefetch starts then). */
static void walk_pass(param_walk *w, int recorded) {
    int last = w->unit_count - 1, reshards = w->options->strategy != FSDP_SHARD_GRAD_OP;
    for (int unit = 0; unit <= last; unit++) w->needs[unit] = 1;
    for (int unit = 0; unit <= last; unit++) { /* forward */
        if (!w->prefetched[unit]) walk_unshard(w, unit);
        w->needs[unit] = 0;
        walk_wait(w, unit, 1);
        walk_prefetches(w, unit, 1, 1, recorded);
        if (unit > 0 && reshards) walk_reshard(w, unit, 1);
        else if (unit > 0) w->prefetched[unit] = 0;
    }
    w->prefetched[0] = 0;
    walk_free_kept(w); /* the root's _post_forward */
    for (int unit = 0; unit <= last; unit++) w->needs[unit] = 1;
    for (int step = 0; step <= last; step++) { /* backward: the root's pre-backward hook, then L .. 1 */
        int unit = step == 0 ? 0 : last + 1 - step;
        if (w->needs[unit] && !w->prefetched[unit]) walk_unshard(w, unit);
        w->needs[unit] = 0;
        walk_wait(w, unit, 0);
        walk_prefetches(w, unit, 0, 1, recorded);
        if (unit == 0) continue;
        walk_reshard(w, unit, 0);
        walk_prefetches(w, unit, 0, 0, recorded);
    }
    walk_reshard(w, 0, 0); /* the root's post-backward hook */
}

static count walk_param_unsharded(const unit_sizes *units, int unit_count, const fsdp_options *options,
                                  int forward_passes) {
    int *scratch = calloc((size_t)unit_count * 3, sizeof *scratch);
    if (scratch == NULL) {
        fprintf(stderr, "memory_model: out of memory\n");
        abort();
    }
    param_walk w = {.units = units, .options = options, .f = sizeof(float), .unit_count = unit_count, .kept = -1,
                    .p = (count)dtype_size(options->mixed_precision.param_dtype), .state = scratch,
                    .prefetched = scratch + unit_count, .needs = scratch + 2 * unit_count};
    for (int pass = 0; pass < forward_passes && pass < 2; pass++) walk_pass(&w, pass > 0); /* the rest repeat pass 2 */
    free(scratch);
    return w.peak;
}

/* FSDP2 (FSDP_VERSION=2, flat_param.h's FLAT_PARAM_ROWS): a unit's parameters and gradient are F = its unpadded numel,
 * its all-gather buffer and reduce_scatter_input G = W x sum_p c_p row_p (padded_unsharded_numel); param_unsharded is
 * walked above. A reduce holds the gradient F and copies it into G, then frees F; G lives until the reduce-scatter
 * is waited for. Units in forward order 0 (the root, its gradient from the first backward piece to the end) .. L:
 *   grad_unsharded   the root's F_0 for the whole backward; unit i's reduce F_0 + F_i + G_i; on comm streams unit
 *                    i+1's G is freed only at unit i's _post_backward_hook, after i's backward filled F_i: F_0 + F_i +
 *                    G_{i+1}. no_sync (ACC > 1) keeps every F until the last micro-batch reduces units L .. 0:
 *                    max_i (F_0 + .. + F_i + G_i).
 * F is float32 (what the layers read and write, 4 bytes); G holds reduce_dtype elements (r bytes) in the
 * reduce-scatter. Mixed precision has no _mp_shard here (the copy-in casts straight into the all-gather buffer):
 * param_shard_low_precision stays 0. */
static void predict_per_parameter(count *peak, const unit_sizes *units, int unit_count, const fsdp_options *options,
                                  int forward_passes) {
    count f = sizeof(float), r = (count)dtype_size(options->mixed_precision.reduce_dtype);
    count prefix = 0, grad_prefix_peak = 0; /* bytes from here on */
    count root = f * units[0].full_numel, grad_single = 0;
    count grad_root_peak = root + r * units[0].padded_unsharded_numel;
    for (int unit = 0; unit < unit_count; unit++) {
        count full = f * units[unit].full_numel, reduced = r * units[unit].padded_unsharded_numel;
        prefix += full;
        grad_prefix_peak = max_of(grad_prefix_peak, prefix + reduced);
        if (unit == 0) continue;
        grad_single = max_of(grad_single, full + reduced);
        if (options->comm_streams && unit + 1 < unit_count)
            grad_single = max_of(grad_single, full + r * units[unit + 1].padded_unsharded_numel);
    }
    peak[MEM_PARAM_UNSHARDED] = walk_param_unsharded(units, unit_count, options, forward_passes);
    int keeps_all = options->no_sync && options->accumulation_steps > 1;
    peak[MEM_GRAD_UNSHARDED] = keeps_all ? grad_prefix_peak : max_of(grad_root_peak, root + grad_single);
    peak[MEM_PARAM_SHARD_LOW_PRECISION] = 0;
}

/* Mixed precision (core/fsdp/flat_param.h) changes four categories; the float32 shard, its gradient and AdamW's states
 * do not change (16 bytes per parameter / N together). With p = param_dtype's size, r = reduce_dtype's (2 for
 * bfloat16):
 *   param_unsharded   an unsharded unit holds its p-byte gathered buffer and, on CPU, the 4-byte copy the layers read
 *                     (made when the all-gather is waited for): 4 + p bytes per element. A prefetched neighbour whose
 *                     all-gather is still in flight on its stream holds only its p bytes: a pair x (in use), y
 *                     (prefetched) costs (4 + p) x + p y. Without comm streams every gather completes at once.
 *   param_shard_low_precision   the _mp_shard, pre_unshard to post_unshard: one unit's shard, or two neighbours' when a
 *                     prefetch is issued before the unit in use was waited for (streams and prefetch; the root's
 *                     with the first layer's only under forward prefetch: backward finds the root unsharded).
 *   grad_unsharded    when reduce_dtype is not float32: at the reduce the float32 gradient (4 bytes) and its r-byte
 *                     copy live together for a moment, then only the r-byte copy until the wait (in the next unit's
 *                     _post_backward_hook with streams, beside that unit's float32 gradient).
 *   comm_buffer       the reduce-scatter's r-byte output shard (always: it is cast and added into grad_shard) and the
 *                     ring's running sums (3+ ranks; none on a GPU) in r bytes; HYBRID_SHARD's replicate all-reduce
 *                     of that shard receives one of its R chunks at a time (comm_all_reduce_ring_bytes), issued with
 *                     it (on a CPU).
 * NO_SHARD (replicated) gathers nothing: each unit's _mp_shard (p bytes, param_shard_low_precision) is the whole
 * unit and stays, with its 4-byte compute copy (param_unsharded), from the unit's first forward to its
 * _post_backward_hook: every unit at once after forward. Its gradient is all-reduced in place in its r-byte copy,
 * the ring receiving one of N chunks at a time (comm_buffer). */
static void predict_mixed_precision(count *peak, const unit_sizes *units, int unit_count, const fsdp_options *options,
                                    int replicated, int world_size, int replicate_size, int forward_passes,
                                    int on_gpu) {
    count p = (count)dtype_size(options->mixed_precision.param_dtype);
    count r = (count)dtype_size(options->mixed_precision.reduce_dtype), f = sizeof(float);
    int streams = options->comm_streams;
    int forward_pairs = options->forward_prefetch && forward_passes > 1;
    int param_pairs = options->backward_prefetch == BACKWARD_PRE || forward_pairs;
    count root = units[0].padded_unsharded_numel, all = 0, largest_shard = 0, shard_pair = 0;
    count one_unit = 0, unit_pair = 0; /* param_unsharded of the non-root units in flight, in bytes */
    for (int unit = 0; unit < unit_count; unit++) {
        count x = units[unit].padded_unsharded_numel;
        all += x;
        largest_shard = max_of(largest_shard, units[unit].sharded_numel);
        /* neighbours' _mp_shards: the root's with the first layer's only in forward (its prefetch issued before the
         * root was waited for); backward never unshards the root, which stays unsharded after forward */
        if (unit > 1 || (unit == 1 && forward_pairs))
            shard_pair = max_of(shard_pair, units[unit].sharded_numel + units[unit - 1].sharded_numel);
        if (unit > 0) one_unit = max_of(one_unit, (f + p) * x);
        if (unit > 1) {
            count y = units[unit - 1].padded_unsharded_numel;
            unit_pair = max_of(unit_pair, streams ? (f + p) * max_of(x, y) + p * (x + y - max_of(x, y))
                                                  : (f + p) * (x + y));
        }
    }
    if (unit_count <= 2) unit_pair = one_unit;
    /* param_dtype float32 (MP=fp32,reduce=bf16): parameters gather as without mixed precision (no _mp_shard) */
    if (options->mixed_precision.param_dtype != DTYPE_FLOAT32) {
        if (replicated) peak[MEM_PARAM_UNSHARDED] = f * all;
        else if (options->strategy == FSDP_SHARD_GRAD_OP || options->strategy == FSDP_HYBRID_SHARD_ZERO2)
            peak[MEM_PARAM_UNSHARDED] = (f + p) * all;
        else peak[MEM_PARAM_UNSHARDED] = (f + p) * root + (param_pairs ? unit_pair : one_unit);
        peak[MEM_PARAM_SHARD_LOW_PRECISION] =
            replicated ? p * all : p * (streams && param_pairs ? max_of(shard_pair, largest_shard) : largest_shard);
    }
    if (options->mixed_precision.reduce_dtype == DTYPE_FLOAT32) return; /* gradients reduce as without it */
    /* Backward meets units L .. 1, the root last (its float32 gradient lives from the first backward piece). A unit's
     * reduce: its float32 gradient + its r-byte copy, beside the float32 gradients still held (the root's; under
     * no_sync every unit's not yet reduced) and, with streams, the previous unit's r-byte copy until its wait. */
    int keeps_all = options->no_sync && options->accumulation_steps > 1;
    count held = keeps_all ? all : root, grad_peak = f * held, previous = 0;
    for (int unit = unit_count - 1; unit >= 0; unit--) {
        count x = units[unit].padded_unsharded_numel;
        count others = unit == 0 ? 0 : (keeps_all ? 0 : f * x);          /* this unit's float32 gradient, if not held */
        grad_peak = max_of(grad_peak, f * held + others + (streams ? r * previous : 0)); /* its backward */
        grad_peak = max_of(grad_peak, f * held + others + r * x);         /* its reduce starts (previous waited) */
        if (keeps_all || unit == 0) held -= x;                              /* its float32 gradient is freed */
        previous = x;
    }
    peak[MEM_GRAD_UNSHARDED] = grad_peak;
    /* the ring's buffers: none in a GPU's pool (predict says why) */
    count ring_buffers = on_gpu || world_size < 3 ? 0 : (world_size == 3 ? 1 : 2);
    dtype reduce_dtype = options->mixed_precision.reduce_dtype;
    count all_reduce_ring = on_gpu ? 0 : (count)comm_all_reduce_ring_bytes((size_t)largest_shard,
                                                                         replicated ? world_size : replicate_size,
                                                                         reduce_dtype);
    if (replicated) peak[MEM_COMM_BUFFER] = all_reduce_ring;
    else peak[MEM_COMM_BUFFER] = largest_shard * r * (1 + ring_buffers) + all_reduce_ring;
}

static void predict(memory_prediction *p, const qwen2_config *c, const unit_sizes *units, int unit_count,
                    int replicated, const fsdp_options *options, int world_size, int replicate_size, int B, int T,
                    size_t data_stream_bytes, int forward_passes, int on_gpu) {
    memset(p, 0, sizeof *p);
    count N = (count)B * T, C = c->hidden_size, V = c->vocab_size, L = c->num_hidden_layers;
    count f = sizeof(float);

    count shards = 0, root_full = units[0].padded_unsharded_numel, all_full = 0, largest_other_full = 0;
    count largest_shard = 0, largest_pair_full = 0;
    for (int unit = 0; unit < unit_count; unit++) {
        shards += units[unit].sharded_numel;
        all_full += units[unit].padded_unsharded_numel;
        largest_shard = max_of(largest_shard, units[unit].sharded_numel);
        if (unit > 0) largest_other_full = max_of(largest_other_full, units[unit].padded_unsharded_numel);
        if (unit > 1) /* units are numbered in forward order; backward meets them in reverse */
            largest_pair_full = max_of(largest_pair_full, units[unit].padded_unsharded_numel +
                                                              units[unit - 1].padded_unsharded_numel);
    }
    if (unit_count <= 2) largest_pair_full = largest_other_full;
    /* Two neighbouring units' parameters live at once when the next one's all-gather is issued before this one is
     * freed: BACKWARD_PRE (issued in the _pre_backward_hook) and forward prefetch (in _pre_forward, from the second
     * forward on, once the order is known); BACKWARD_POST issues it after this unit resharded. Two neighbouring
     * unsharded gradients live at once when reduce-scatters run on their stream: unit i's is freed when its
     * reduce-scatter is waited for, in unit i-1's _post_backward_hook, after i-1's backward filled its own. */
    int param_pairs = options->backward_prefetch == BACKWARD_PRE || (options->forward_prefetch && forward_passes > 1);
    count param_in_flight = param_pairs ? largest_pair_full : largest_other_full;
    count grad_in_flight = options->comm_streams ? largest_pair_full : largest_other_full;
    count peak[MEM_CATEGORY_COUNT] = {0};
    peak[MEM_PARAM_SHARD] = shards * f;
    peak[MEM_GRAD_SHARD] = shards * f;
    peak[MEM_OPTIM_STATE] = 2 * shards * f;
    /* Unsharded parameters: NO_SHARD's are views of the local copy; SHARD_GRAD_OP keeps all after forward. */
    if (options->strategy == FSDP_SHARD_GRAD_OP || options->strategy == FSDP_HYBRID_SHARD_ZERO2)
        peak[MEM_PARAM_UNSHARDED] = all_full * f;
    else if (fsdp_strategy_reshards_after_forward(options->strategy))
        peak[MEM_PARAM_UNSHARDED] = (root_full + param_in_flight) * f;
    /* Unsharded gradients: the root's for the whole backward plus the unit(s) in backward; no_sync keeps them all. */
    int keeps_all = options->no_sync && options->accumulation_steps > 1;
    peak[MEM_GRAD_UNSHARDED] = (keeps_all ? all_full : root_full + grad_in_flight) * f;
    /* Comm buffers: a shard to add the second micro-batch's gradient from; the ring's running sums (3+ ranks in the
     * reduce-scatter's group: world_size here is the shard group's size under HYBRID_SHARD; the replicate group's
     * all-reduce is MPI's own, in place, and allocates nothing tracked). On a GPU (on_gpu) the device pool holds no
     * ring buffer: BACKEND=mpi runs the ring on pinned host copies, its buffers in the host pool (core/comm/comm.c
     * stage_begin), and NCCL keeps its own. */
    int accumulating = options->accumulation_steps > 1 && !options->no_sync;
    count ring_buffers = on_gpu || replicated || world_size < 3 ? 0 : (world_size == 3 ? 1 : 2);
    peak[MEM_COMM_BUFFER] = largest_shard * f * (accumulating + ring_buffers);

    /* Activations: without checkpointing, all layers' saved tensors at the end of forward, plus the head's (final
     * norm, logits and their gradient). With it, each layer's input becomes checkpoint_input and only one layer's
     * saved tensors live at a time (in forward, and again when backward recomputes it). */
    count layer = layer_activation_floats(c, N);
    /* LOSS_CHUNK (k < N rows at a time): no N x V logits or gradient kept; two k x V workspace buffers instead */
    int chunked = options->loss_chunk > 0 && options->loss_chunk < N;
    /* the head's saved tensors (final norm, rstd) plus the larger of the logits and their gradient (unchunked) and
     * the gradient the head's backward hands the last layer (N x C, allocated once those are freed) */
    count head = N * C + N + max_of(chunked ? 0 : 2 * N * V, N * C);
    count embedding = N * C;
    if (options->activation_checkpointing) {
        peak[MEM_CHECKPOINT_INPUT] = L * N * C * f;
        count forward_peak = max_of(layer, head + (L > 0 ? N * C : 0)); /* the head's input is the last output */
        count backward_peak = layer - N * C + 2 * N * C;                 /* recomputed layer + two gradient buffers */
        peak[MEM_ACTIVATION] = max_of(forward_peak, backward_peak) * f;
        if (L == 0) peak[MEM_ACTIVATION] += embedding * f;
    } else {
        peak[MEM_ACTIVATION] = (embedding + L * layer + head) * f;
    }
    count rope = 2 * (count)T * c->head_dim;
    count head_workspace = N * C + (chunked ? 2 * (count)options->loss_chunk * V : 0); /* dnorm + the chunks */
    int bf16_compute = options->mixed_precision.param_dtype == DTYPE_BFLOAT16;
    peak[MEM_WORKSPACE] = (rope + max_of(layer_workspace_floats(c, N, B, T, bf16_compute), head_workspace)) * f;
    /* The lab's batch and the loader's stream, then the model's copy. On the CUDA device the first two are in the host
     * pool (core/runtime/offload.h offload_data_pool: the host writes them), so the device pool holds the copy
     * alone. */
    peak[MEM_DATA] = on_gpu ? 2 * N * sizeof(int) : 4 * N * sizeof(int) + (count)data_stream_bytes;
    if (flat_param_mixed_precision_enabled(&options->mixed_precision))
        predict_mixed_precision(peak, units, unit_count, options, replicated, world_size, replicate_size,
                                forward_passes, on_gpu);
    if (options->fsdp_version == 2) predict_per_parameter(peak, units, unit_count, options, forward_passes);
    /* CPU offload (core/runtime/offload.h): the shards, gradient shards, moments and the accumulation buffer move to
     * the host pool. The device keeps no shard at all (the all-gather runs in place in the unsharded buffer) and one
     * gradient shard, the reduce-scatter's output until its d2h copy: reduce-scatters are waited for one at a time.
     * With a bfloat16 param_dtype the device holds one float32 shard for a moment (the h2d copy pre_unshard casts from,
     * as torch's _local_shard.to(device)); with a bfloat16 reduce_dtype its comm buffers are mixed precision's, and its
     * one float32 gradient shard is the result cast back for the d2h copy. */
    if (options->offload_params) {
        count host_peak[MEM_CATEGORY_COUNT] = {0};
        host_peak[MEM_PARAM_SHARD] = peak[MEM_PARAM_SHARD];
        host_peak[MEM_GRAD_SHARD] = peak[MEM_GRAD_SHARD];
        host_peak[MEM_OPTIM_STATE] = peak[MEM_OPTIM_STATE];
        host_peak[MEM_COMM_BUFFER] = largest_shard * f * accumulating;
        int low_param = options->mixed_precision.param_dtype != DTYPE_FLOAT32;
        int low_reduce = options->mixed_precision.reduce_dtype != DTYPE_FLOAT32;
        peak[MEM_PARAM_SHARD] = low_param ? largest_shard * f : 0;
        peak[MEM_GRAD_SHARD] = largest_shard * f;
        peak[MEM_OPTIM_STATE] = 0;
        if (!low_reduce) peak[MEM_COMM_BUFFER] = largest_shard * f * ring_buffers;
        count host_sum = 0;
        for (int category = 0; category < MEM_CATEGORY_COUNT; category++) {
            p->host_category_peak[category] = bytes(host_peak[category]);
            host_sum += host_peak[category];
        }
        p->host_sum_of_peaks = bytes(host_sum);
    }
    count sum = 0;
    for (int category = 0; category < MEM_CATEGORY_COUNT; category++) {
        p->category_peak[category] = bytes(peak[category]);
        sum += peak[category];
    }
    p->sum_of_peaks = bytes(sum);

    /* Reserved: the caching allocator holds segments, so reserved >= allocated; the excess is rounding, packing and
     * cached free blocks. Packing, the part that follows from the allocator's rules: blocks of s bytes carved from
     * segments of S (2 MiB for s <= 1 MiB, 20 MiB for 1 MiB < s < 10 MiB) fill floor(S/s) s of S; over those ranges
     * that is at least 2/3 of S (worst just above s = S/3: two blocks), so such blocks reserve at most 1.5x their
     * bytes; a block of 10 MiB or more gets its own segment rounded up to 2 MiB, at most 1.2x. Cached free blocks:
     * a best-fit allocator has no useful worst case in general (Robson), so this part is FSDP's pattern, not a
     * theorem: every step asks for the same sizes in the same order, so a request finds the block the same request
     * freed a step before, and at most one partly used segment per pool (20 MiB + 2 MiB) is left over. Rounding to
     * 512 B is inside that allowance for the few hundred small blocks fsdplab has live. Checked on tiny, mid and
     * every strategy by make check-05, printed for qwen2-0.5b. */
    p->reserved_bound = reserved_bound_of(sum);
    p->host_reserved_bound = options->offload_params ? reserved_bound_of((count)p->host_sum_of_peaks) : 0;
}

void memory_model_predict(memory_prediction *p, const qwen2_model *model, const fsdp_options *options, int world_size,
                          int B, int T, size_t data_stream_bytes, int forward_passes) {
    unit_sizes *units = calloc((size_t)model->unit_count, sizeof *units);
    if (units == NULL) world_fatal(model->ctx, "out of memory for %d unit sizes", model->unit_count);
    for (int unit = 0; unit < model->unit_count; unit++)
        units[unit] = (unit_sizes){model->units[unit].padded_unsharded_numel, model->units[unit].sharded_numel,
                                   model->units[unit].full_numel};
    const comm_group *shard_group = model->units[0].shard_group; /* HYBRID_SHARD: shards of 1/its size */
    const comm_group *replicate_group = model->units[0].replicate_group;
    predict(p, &model->config, units, model->unit_count, model->units[0].replicated, options,
            shard_group ? shard_group->size : world_size, replicate_group ? replicate_group->size : 1, B, T,
            data_stream_bytes, forward_passes, model->ctx->device.kind != DEVICE_CPU);
    free(units);
}

int memory_model_predict_config(memory_prediction *p, context *ctx, const qwen2_config *config, fsdp_wrap_fn wrap,
                                void *wrap_user, const fsdp_options *options, int B, int T, size_t data_stream_bytes,
                                int forward_passes) {
    if (qwen2_config_validate(config, ctx->error, sizeof ctx->error) != 0) return -1;
    module_tree tree;
    if (qwen2_module_tree(config, &tree) != 0) world_fatal(ctx, "out of memory building the module tree");
    int *unit_of_param = calloc((size_t)tree.param_count, sizeof *unit_of_param);
    if (unit_of_param == NULL) world_fatal(ctx, "out of memory");
    int unit_count = fsdp_auto_wrap(&tree, wrap, wrap_user, unit_of_param);
    unit_sizes *units = calloc((size_t)(unit_count > 0 ? unit_count : 1), sizeof *units);
    if (units == NULL) world_fatal(ctx, "out of memory for %d unit sizes", unit_count);
    for (int param = 0; param < tree.param_count; param++) {
        count numel = 1;
        for (int d = 0; d < tree.params[param].ndim; d++) numel *= (count)tree.params[param].shape[d];
        if (unit_of_param[param] >= 0 && unit_of_param[param] < unit_count)
            units[unit_of_param[param]].padded_unsharded_numel += numel;
    }
    int replicated = options->strategy == FSDP_NO_SHARD; /* as qwen2_model_init_wrapped makes the units */
    /* HYBRID_SHARD shards over the shard group (ctx->mesh), as flat_param_init does */
    int shard_size = fsdp_strategy_is_hybrid(options->strategy) && ctx->mesh ? ctx->mesh->shard_size : ctx->world_size;
    size_t world = replicated ? 1 : (size_t)shard_size;
    for (int unit = 0; unit < unit_count; unit++) {
        units[unit].full_numel = units[unit].padded_unsharded_numel; /* the unpadded sum so far */
        units[unit].padded_unsharded_numel =
            (count)flat_param_padded_numel(bytes(units[unit].padded_unsharded_numel), world);
        units[unit].sharded_numel = units[unit].padded_unsharded_numel / (count)world;
    }
    if (options->fsdp_version == 2 && !replicated) { /* FSDP2: c = ceil(d0 / W) rows of each parameter, as flat_param */
        for (int unit = 0; unit < unit_count; unit++) units[unit].sharded_numel = 0;
        for (int param = 0; param < tree.param_count; param++) {
            const module_param *info = &tree.params[param];
            count rows = (count)info->shape[0], row = 1;
            for (int d = 1; d < info->ndim; d++) row *= (count)info->shape[d];
            if (unit_of_param[param] >= 0 && unit_of_param[param] < unit_count)
                units[unit_of_param[param]].sharded_numel += (count)((bytes(rows) + world - 1) / world) * row;
        }
        for (int unit = 0; unit < unit_count; unit++)
            units[unit].padded_unsharded_numel = units[unit].sharded_numel * (count)world;
    }
    if (unit_count > 0)
        predict(p, config, units, unit_count, replicated, options, shard_size, ctx->world_size / shard_size, B, T,
                data_stream_bytes, forward_passes, ctx->device.kind != DEVICE_CPU);
    free(units);
    free(unit_of_param);
    module_tree_free(&tree);
    return unit_count > 0 ? 0 : error_set(ctx->error, sizeof ctx->error, "the wrap policy made no units");
}

/* One memory's check: each rank's `predicted` bytes against its share of what the memory has free (free_bytes, split
 * evenly among the `sharing` ranks that use it). Every rank reaches the same verdict: the rank with the least room
 * speaks for all, naming the memory (`gpu`: this rank's GPU; -1: the host's, on every rank) and what to lower.
 * Collective. */
static void require_room(context *ctx, double predicted, size_t free_bytes, size_t total_bytes, int sharing, int gpu,
                         const char *pool) {
    double available = (double)free_bytes / sharing;
    struct {
        double room;
        int rank;
    } worst = {total_bytes > 0 ? available - predicted : 0.0, ctx->rank}; /* a memory that cannot say passes */
    world_allreduce(ctx, &worst, 1, MPI_DOUBLE_INT, MPI_MINLOC, "the memory check");
    if (worst.room >= 0.0) return;
    /* the worst rank's predicted, available, free, total, sharing ranks, GPU */
    double figures[6] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
    if (ctx->rank == worst.rank)
        figures[0] = predicted, figures[1] = available, figures[2] = (double)free_bytes,
        figures[3] = (double)total_bytes, figures[4] = sharing, figures[5] = gpu;
    world_allreduce(ctx, figures, 6, MPI_DOUBLE, MPI_SUM, "the memory check");
    char peak[32], share[32], free_text[32], total_text[32], where[160];
    mem_format_bytes((size_t)figures[0], peak, sizeof peak);
    mem_format_bytes((size_t)figures[1], share, sizeof share);
    mem_format_bytes((size_t)figures[2], free_text, sizeof free_text);
    mem_format_bytes((size_t)figures[3], total_text, sizeof total_text);
    if (gpu >= 0)
        snprintf(where, sizeof where, "GPU %d: %s free of %s, shared by %d rank%s", (int)figures[5], free_text,
                 total_text, (int)figures[4], figures[4] == 1 ? "" : "s");
    else
        snprintf(where, sizeof where, "MemAvailable %s shared by %d rank%s on this machine", free_text,
                 (int)figures[4], figures[4] == 1 ? "" : "s");
    world_exit_all(ctx, 2, "rank %d: predicted peak %s%s per rank (core/models/memory_model.h: model, MBS, SEQ, "
                 "strategy) but %s available (%s); lower MBS or SEQ, or use more %s (MEMORY_CHECK=0 skips this check)",
                 worst.rank, peak, pool, share, where, gpu >= 0 ? "GPUs" : "ranks");
}

/* The ranks of this machine that use this rank's memory: all of them on the CPU, those on its GPU on CUDA (more ranks
 * than GPUs share them: BACKEND=mpi). Collective. */
static int ranks_sharing(context *ctx, int gpu) {
    MPI_Comm node, same;
    int sharing = 1;
    WORLD_MPI(ctx, MPI_Comm_split_type(ctx->comm, MPI_COMM_TYPE_SHARED, ctx->rank, MPI_INFO_NULL, &node));
    WORLD_MPI(ctx, MPI_Comm_split(node, gpu, ctx->rank, &same));
    WORLD_MPI(ctx, MPI_Comm_size(same, &sharing));
    WORLD_MPI(ctx, MPI_Comm_free(&same));
    WORLD_MPI(ctx, MPI_Comm_free(&node));
    return sharing;
}

void memory_model_require_fit(context *ctx, const memory_prediction *prediction) {
    if (env_int(ctx, "MEMORY_CHECK", 1, 0, 1) == 0) return;
    device *d = &ctx->device;
    size_t free_bytes = 0, total_bytes = 0;
    d->memory_info(d, &free_bytes, &total_bytes);
    if (d->kind == DEVICE_CPU) { /* one memory: the device pool and the host pool are both the host's */
        require_room(ctx, (double)prediction->sum_of_peaks + (double)prediction->host_sum_of_peaks, free_bytes,
                     total_bytes, ranks_sharing(ctx, 0), -1, "");
        return;
    }
    /* A GPU: the device pool against the GPU's free memory, then the host pool (CPU offload's) against the host's. */
    require_room(ctx, (double)prediction->sum_of_peaks, free_bytes, total_bytes, ranks_sharing(ctx, d->ordinal),
                 d->ordinal, " of GPU memory");
    (void)mem_host_info(&free_bytes, &total_bytes);
    require_room(ctx, (double)prediction->host_sum_of_peaks, free_bytes, total_bytes, ranks_sharing(ctx, 0), -1,
                 " of host memory");
}

memory_prediction memory_model_host_part(const memory_prediction *prediction) {
    memory_prediction host = {0};
    memcpy(host.category_peak, prediction->host_category_peak, sizeof host.category_peak);
    host.sum_of_peaks = prediction->host_sum_of_peaks;
    host.reserved_bound = prediction->host_reserved_bound;
    return host;
}

void memory_model_report(const memory_prediction *p, const size_t *measured, size_t measured_total,
                         size_t measured_reserved, char *out, size_t out_size) {
    size_t used = (size_t)snprintf(out, out_size, "memory per rank, analytic model vs measured peak:\n"
                                                  "  %-25s %12s %12s %7s %12s\n", "category", "predicted",
                                   "measured", "ratio", "difference");
    char predicted_text[32], measured_text[32];
    for (int category = 0; category < MEM_CATEGORY_COUNT && used < out_size; category++) {
        if (p->category_peak[category] == 0 && measured[category] == 0) continue;
        double ratio =
            p->category_peak[category] ? (double)measured[category] / (double)p->category_peak[category] : 0.0;
        /* in bytes, exactly: the model counts the very buffers the code allocates, so anything but 0 is a bug */
        long long difference = (long long)measured[category] - (long long)p->category_peak[category];
        used += (size_t)snprintf(out + used, out_size - used, "  %-25s %12s %12s %7.3f %+10lld B\n",
                                 mem_category_name((mem_category)category),
                                 mem_format_bytes(p->category_peak[category], predicted_text, sizeof predicted_text),
                                 mem_format_bytes(measured[category], measured_text, sizeof measured_text), ratio,
                                 difference);
    }
    if (used < out_size)
        used += (size_t)snprintf(out + used, out_size - used,
                                 "  %-25s %12s %12s   (allocated peak <= sum of category peaks)\n", "total",
                                 mem_format_bytes(p->sum_of_peaks, predicted_text, sizeof predicted_text),
                                 mem_format_bytes(measured_total, measured_text, sizeof measured_text));
    /* Reserved bytes (segments): exact figures, so a check can read them. */
    if (used < out_size)
        snprintf(out + used, out_size - used,
                 "  %-25s %12s %12s   (allocated <= reserved <= bound: 1.5 x sum of peaks + 22 MiB)\n"
                 "  reserved bytes: measured %zu, allocated peak %zu, bound %zu\n",
                 "reserved", mem_format_bytes(p->reserved_bound, predicted_text, sizeof predicted_text),
                 mem_format_bytes(measured_reserved, measured_text, sizeof measured_text), measured_reserved,
                 measured_total, p->reserved_bound);
}
