/* memory_model.c — predicted per-category memory peaks. See memory_model.h. */
#include "memory_model.h"

#include <stdio.h>
#include <string.h>

static size_t max_of(size_t a, size_t b) { return a > b ? a : b; }

/* Floats one decoder layer's forward saves for its backward (qwen2_layer_activations), plus its output. */
static size_t layer_activation_floats(const qwen2_config *c, size_t N, size_t B, size_t T) {
    size_t C = (size_t)c->hidden_size, I = (size_t)c->intermediate_size, H = (size_t)c->num_attention_heads;
    size_t KVH = (size_t)c->num_key_value_heads, D = (size_t)c->head_dim;
    return N * C + N                        /* input_layernorm output, rstd */
           + N * H * D + 2 * N * KVH * D    /* q, k, v */
           + B * H * T * T                  /* attention probabilities */
           + N * H * D                      /* attention output */
           + N * C + N * C + N              /* residual_mid, post_attention_layernorm output, rstd */
           + 2 * N * I + N * I              /* gate_up, swiglu */
           + N * C;                         /* the layer's output */
}

/* The largest set of backward temporaries alive at once inside one layer's backward (qwen2_layer_backward). */
static size_t layer_workspace_floats(const qwen2_config *c, size_t N, size_t T) {
    size_t C = (size_t)c->hidden_size, I = (size_t)c->intermediate_size, H = (size_t)c->num_attention_heads;
    size_t KVH = (size_t)c->num_key_value_heads, D = (size_t)c->head_dim;
    size_t mlp = N * C + N * I + 2 * N * I;                                   /* dmid, dact, dgate_up */
    size_t attention = N * C + N * H * D + N * H * D + 2 * N * KVH * D + T * T; /* dmid, dout, dq, dk, dv, dscores */
    size_t norm = N * C + N * C;                                              /* dmid, dln1 */
    return max_of(max_of(mlp, attention), norm);
}

void memory_model_predict(memory_prediction *p, const qwen2_model *model, const fsdp_options *options, int world_size,
                          int B, int T, size_t data_stream_bytes, int forward_passes) {
    memset(p, 0, sizeof *p);
    const qwen2_config *c = &model->config;
    size_t N = (size_t)B * T, C = (size_t)c->hidden_size, V = (size_t)c->vocab_size, L = (size_t)c->num_hidden_layers;
    size_t f = sizeof(float);

    size_t shards = 0, root_full = model->units[0].padded_unsharded_numel, all_full = 0, largest_other_full = 0;
    size_t largest_shard = 0, largest_pair_full = 0;
    for (int unit = 0; unit < model->unit_count; unit++) {
        const flat_param *fp = &model->units[unit];
        shards += fp->sharded_numel;
        all_full += fp->padded_unsharded_numel;
        largest_shard = max_of(largest_shard, fp->sharded_numel);
        if (unit > 0) largest_other_full = max_of(largest_other_full, fp->padded_unsharded_numel);
        if (unit > 1) /* units are numbered in forward order; backward meets them in reverse */
            largest_pair_full = max_of(largest_pair_full, fp->padded_unsharded_numel + model->units[unit - 1].padded_unsharded_numel);
    }
    if (model->unit_count <= 2) largest_pair_full = largest_other_full;
    /* Two neighbouring units' parameters live at once when the next one's all-gather is issued before this one is
     * freed: BACKWARD_PRE (issued in the _pre_backward_hook) and forward prefetch (in _pre_forward, from the second
     * forward on, once the order is known); BACKWARD_POST issues it after this unit resharded. Two neighbouring
     * unsharded gradients live at once when reduce-scatters run on their stream: unit i's is freed when its
     * reduce-scatter is waited for, in unit i-1's _post_backward_hook, after i-1's backward filled its own. */
    int param_pairs = options->backward_prefetch == BACKWARD_PRE || (options->forward_prefetch && forward_passes > 1);
    size_t param_in_flight = param_pairs ? largest_pair_full : largest_other_full;
    size_t grad_in_flight = options->comm_streams ? largest_pair_full : largest_other_full;
    p->category_peak[MEM_PARAM_SHARD] = shards * f;
    p->category_peak[MEM_GRAD_SHARD] = shards * f;
    p->category_peak[MEM_OPTIM_STATE] = 2 * shards * f;
    /* Unsharded parameters: NO_SHARD's are views of the local copy; SHARD_GRAD_OP keeps all after forward. */
    if (options->strategy == FSDP_SHARD_GRAD_OP) p->category_peak[MEM_PARAM_UNSHARDED] = all_full * f;
    else if (options->strategy == FSDP_FULL_SHARD) p->category_peak[MEM_PARAM_UNSHARDED] = (root_full + param_in_flight) * f;
    /* Unsharded gradients: the root's for the whole backward plus the unit(s) in backward; no_sync keeps them all. */
    int keeps_all = options->no_sync && options->accumulation_steps > 1;
    p->category_peak[MEM_GRAD_UNSHARDED] = (keeps_all ? all_full : root_full + grad_in_flight) * f;
    /* Comm buffers: a shard to add the second micro-batch's gradient from; the ring's running sums (3+ ranks). */
    int accumulating = options->accumulation_steps > 1 && !options->no_sync;
    int replicated = model->units[0].replicated;
    size_t ring_buffers = replicated || world_size < 3 ? 0 : (world_size == 3 ? 1 : 2);
    p->category_peak[MEM_COMM_BUFFER] = largest_shard * f * ((size_t)accumulating + ring_buffers);

    /* Activations: without checkpointing, all layers' saved tensors at the end of forward, plus the head's (final
     * norm, logits and their gradient). With it, each layer's input becomes checkpoint_input and only one layer's
     * saved tensors live at a time (in forward, and again when backward recomputes it). */
    size_t layer = layer_activation_floats(c, N, (size_t)B, (size_t)T);
    size_t head = N * C + N + 2 * N * V;
    size_t embedding = N * C;
    if (options->activation_checkpointing) {
        p->category_peak[MEM_CHECKPOINT_INPUT] = L * N * C * f;
        size_t forward_peak = max_of(layer, head + (L > 0 ? N * C : 0)); /* the head's input is the last output */
        size_t backward_peak = layer - N * C + 2 * N * C;                /* recomputed layer + two gradient buffers */
        p->category_peak[MEM_ACTIVATION] = max_of(forward_peak, backward_peak) * f;
        if (L == 0) p->category_peak[MEM_ACTIVATION] += embedding * f;
    } else {
        p->category_peak[MEM_ACTIVATION] = (embedding + L * layer + head) * f;
    }
    size_t rope = 2 * (size_t)T * (size_t)c->head_dim;
    p->category_peak[MEM_WORKSPACE] = (rope + max_of(layer_workspace_floats(c, N, (size_t)T), N * C)) * f;
    p->category_peak[MEM_DATA] = 4 * N * sizeof(int) + data_stream_bytes; /* the lab's batch + the model's copy */
    for (int category = 0; category < MEM_CATEGORY_COUNT; category++) p->sum_of_peaks += p->category_peak[category];

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
    p->reserved_bound = p->sum_of_peaks + p->sum_of_peaks / 2 + (size_t)ALLOCATOR_LARGE_SEGMENT +
                        (size_t)ALLOCATOR_SMALL_SEGMENT;
}

void memory_model_report(const memory_prediction *p, const size_t *measured, size_t measured_total,
                         size_t measured_reserved, char *out, size_t out_size) {
    size_t used = (size_t)snprintf(out, out_size, "memory per rank, analytic model vs measured peak:\n"
                                                  "  %-17s %12s %12s %7s %12s\n", "category", "predicted",
                                   "measured", "ratio", "difference");
    char predicted_text[32], measured_text[32];
    for (int category = 0; category < MEM_CATEGORY_COUNT && used < out_size; category++) {
        if (p->category_peak[category] == 0 && measured[category] == 0) continue;
        double ratio = p->category_peak[category] ? (double)measured[category] / (double)p->category_peak[category] : 0.0;
        /* in bytes, exactly: the model counts the very buffers the code allocates, so anything but 0 is a bug */
        long long difference = (long long)measured[category] - (long long)p->category_peak[category];
        used += (size_t)snprintf(out + used, out_size - used, "  %-17s %12s %12s %7.3f %+10lld B\n",
                                 mem_category_name((mem_category)category),
                                 mem_format_bytes(p->category_peak[category], predicted_text, sizeof predicted_text),
                                 mem_format_bytes(measured[category], measured_text, sizeof measured_text), ratio,
                                 difference);
    }
    if (used < out_size)
        used += (size_t)snprintf(out + used, out_size - used,
                                 "  %-17s %12s %12s   (allocated peak <= sum of category peaks)\n", "total",
                                 mem_format_bytes(p->sum_of_peaks, predicted_text, sizeof predicted_text),
                                 mem_format_bytes(measured_total, measured_text, sizeof measured_text));
    /* Reserved bytes (segments): exact figures, so a check can read them. */
    if (used < out_size)
        snprintf(out + used, out_size - used,
                 "  %-17s %12s %12s   (allocated <= reserved <= bound: 1.5 x sum of peaks + 22 MiB)\n"
                 "  reserved bytes: measured %zu, allocated peak %zu, bound %zu\n",
                 "reserved", mem_format_bytes(p->reserved_bound, predicted_text, sizeof predicted_text),
                 mem_format_bytes(measured_reserved, measured_text, sizeof measured_text), measured_reserved,
                 measured_total, p->reserved_bound);
}
