/* memory_model.h — an analytic model of FSDP's per-rank memory, by category, to set beside what the tracked
 * allocator measures.
 *
 * The ZeRO-3 picture: parameters, gradients and AdamW's two moments are sharded ((1 + 1 + 2) x 4 bytes x Ψ / N for
 * Ψ parameters on N ranks); on top come the units unsharded at a time (the root for the whole pass plus one layer
 * unit under FULL_SHARD, every unit under SHARD_GRAD_OP), their unsharded gradients in backward, and activations.
 * Each category's peak is predicted from the shapes alone (config, batch, world size, strategy, checkpointing,
 * no_sync), counting exactly the buffers fsdplab allocates; the categories peak at different moments, so their sum
 * bounds the total peak from above.
 *
 * Mixed precision (options->mixed_precision, core/fsdp/flat_param.h) leaves the 16 bytes per parameter / N of the
 * float32 shard, gradient shard and AdamW states as they are, and changes what is in flight: param_dtype buffers for
 * the gathered units (with, on CPU, the float32 copy the layers read), the low-precision shard
 * (param_shard_low_precision) and reduce_dtype gradients and outputs; the .c counts them buffer by buffer.
 *
 * FSDP2 (options->fsdp_version 2, per-parameter rows): shards of sum_p ceil(d0/N) row_p floats a unit, and beside a
 * unit's unpadded parameters (and gradient) its rank-major all_gather_output (reduce_scatter_input) of N such shards
 * for the moment of the copy-out (copy-in), longer in forward on comm streams (kept until the next unit's copy-out);
 * the .c walks the hooks over the units (param_walk) for param_unsharded, with prefetch lists and post-forward shards,
 * and predict_per_parameter says when the gradient buffers overlap. With mixed
 * precision that buffer holds param_dtype (reduce_dtype) elements beside float32 parameters (gradient), and there is
 * no low-precision shard; CPU offload moves the same categories to the host pool as FSDP1's.
 *
 * Reserved memory (the caching allocator's segments, core/memory/allocator.h) is bounded, not predicted: see
 * memory_model_predict for what the bound assumes.
 */
#ifndef FSDPLAB_MEMORY_MODEL_H
#define FSDPLAB_MEMORY_MODEL_H

#include <stddef.h>

#include "core/fsdp/fsdp.h"
#include "core/memory/mem.h"
#include "core/models/qwen2.h"

typedef struct memory_prediction {
    size_t category_peak[MEM_CATEGORY_COUNT]; /* bytes per rank */
    size_t sum_of_peaks;                      /* an upper bound of the total (allocated) peak */
    size_t reserved_bound;                    /* the bound on the caching allocator's reserved peak (see .c) */
    /* CPU offload (options->offload_params): the host pool's peaks; the fields above are then the device pool's.
     * All zero without offload. */
    size_t host_category_peak[MEM_CATEGORY_COUNT];
    size_t host_sum_of_peaks;
    size_t host_reserved_bound;               /* the same bound as reserved_bound, for the host pool */
} memory_prediction;

/* B, T: this rank's micro-batch. world_size: the ranks the units are sharded over (HYBRID_SHARD: the model's units
 * say, their shard group's size). data_stream_bytes: the loader's token stream (it is data memory too).
 * forward_passes: micro-batches in the run (forward prefetch starts with the second). Prefetch and comm streams
 * (options) add a neighbouring unit's parameters or gradient in flight: see the .c. */
void memory_model_predict(memory_prediction *prediction, const qwen2_model *model, const fsdp_options *options,
                          int world_size, int B, int T, size_t data_stream_bytes, int forward_passes);
/* The same prediction before the model exists: from the config and the wrap policy alone (the module tree's shapes,
 * the units fsdp_auto_wrap makes, padded as FlatParameters pad), so a run that cannot fit is refused before anything
 * is allocated. options->strategy says whether units are replicated (NO_SHARD). Returns -1 with ctx->error on a bad
 * config. */
int memory_model_predict_config(memory_prediction *prediction, context *ctx, const qwen2_config *config,
                                fsdp_wrap_fn wrap, void *wrap_user, const fsdp_options *options, int B, int T,
                                size_t data_stream_bytes, int forward_passes);
/* Refuses a run whose predicted peak is more than this rank's share of the memory it comes from, naming both in GB
 * and what to lower; every rank exits together (status 2). On the CPU: sum_of_peaks and the host pool's against the
 * host's MemAvailable, divided among the ranks on the machine. On a GPU: sum_of_peaks against the GPU's free memory
 * (device.memory_info: cudaMemGetInfo), divided among the ranks on that GPU, and the host pool's (CPU offload)
 * against MemAvailable. MEMORY_CHECK=0 turns it off. Collective. */
void memory_model_require_fit(context *ctx, const memory_prediction *prediction);
/* The host pool's part of a prediction as a prediction of its own (category_peak = host_category_peak, its sum,
 * no reserved bound), to report beside the host pool's measured peaks with memory_model_report. */
memory_prediction memory_model_host_part(const memory_prediction *prediction);
/* A table: category, predicted, measured, measured / predicted; then the allocated total and the reserved peak
 * against its bound. */
void memory_model_report(const memory_prediction *prediction, const size_t *measured_category_peak,
                         size_t measured_total_peak, size_t measured_reserved_peak, char *out, size_t out_size);

#endif
