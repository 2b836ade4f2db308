/* qwen2.h — the Qwen2 model exactly as HF's Qwen2ForCausalLM, for FSDP to train.
 *
 *   tokens → embed_tokens → [ layer 0 … layer L-1 ] → norm → lm_head (tied to embed_tokens) → mean cross-entropy
 *   layer:  x → input_layernorm → q,k,v proj (bias) → RoPE(q,k) → causal GQA attention → o_proj (no bias) → + x
 *           → post_attention_layernorm → SwiGLU MLP (gate, up, down; no bias) → + residual
 *
 * Parameters have HF's names and registration order and live in FlatParameters ("units", core/fsdp/flat_param.h): by
 * default one per decoder layer plus the root unit holding what no layer claims (embed_tokens, norm). A unit's
 * parameters are usable only while it is UNSHARDED; the model finds them through the unit (views change every
 * unshard). The forward and backward are cut at unit boundaries — embed, layer l, head — so the FSDP step driver
 * can call the hooks between the pieces; qwen2_forward_backward runs them all when every unit is unsharded.
 */
#ifndef FSDPLAB_QWEN2_H
#define FSDPLAB_QWEN2_H

#include <stddef.h>
#include <stdint.h>

#include "core/runtime/context.h"
#include "core/fsdp/flat_param.h"
#include "core/fsdp/fsdp.h"
#include "core/fsdp/module.h"

#define QWEN2_IGNORE_INDEX (-100)
#define QWEN2_NAME_MAX 128
#define QWEN2_DECODER_LAYER "Qwen2DecoderLayer" /* the class transformer_auto_wrap_policy wraps */

typedef struct qwen2_config {
    char name[32];                /* preset it came from, or "custom" */
    int vocab_size;
    int hidden_size;
    int intermediate_size;
    int num_hidden_layers;
    int num_attention_heads;
    int num_key_value_heads;
    int head_dim;                 /* hidden_size / num_attention_heads */
    int max_position_embeddings;
    double rope_theta;            /* doubles, so config.json says 1e-06, not 9.99999997e-07 */
    double rms_norm_eps;
    double initializer_range;     /* std of the normal init of linear and embedding weights */
    int tie_word_embeddings;      /* fsdplab supports tied only, as both presets are */
    int bos_token_id, eos_token_id;
} qwen2_config;

/* "qwen2-0.5b" (HF's values; "qwen2", the seed's name, is the same preset) or "tiny" (byte-level vocab: 256 bytes
 * + 4 specials; CPU-fast). An unknown name returns -1 with a message listing the accepted ones. */
int qwen2_config_preset(qwen2_config *config, const char *name, char *error, size_t error_size);
/* Overrides one field by its HF name ("hidden_size", "num_hidden_layers", "rope_theta", ...) from text; head_dim
 * follows hidden_size / num_attention_heads. Returns -1 with a message naming the field and value when unknown or
 * not a number. Validate afterwards. */
int qwen2_config_set(qwen2_config *config, const char *field, const char *value, char *error, size_t error_size);
/* Several overrides, "hidden_size=512,num_hidden_layers=8" (the labs' CONFIG setting). */
int qwen2_config_apply(qwen2_config *config, const char *overrides, char *error, size_t error_size);
/* The labs' model: MODEL (a preset, default tiny) with CONFIG's overrides applied, checked to hold seq_len
 * positions. A bad value stops every rank with a message naming the variable (world_exit_all). */
void qwen2_config_from_env(context *ctx, qwen2_config *config, int seq_len);
/* Checks the shape rules (heads divide hidden, KV heads divide heads, even head_dim, ...). */
int qwen2_config_validate(const qwen2_config *config, char *error, size_t error_size);
/* config.json in HF's Qwen2Config format. */
/* 0 when a model of config a computes as one of config b (initializer_range and max_position_embeddings aside), else
 * 1 with the first field that differs in out ("num_hidden_layers 4, not 2"). */
int qwen2_config_compare(const qwen2_config *a, const qwen2_config *b, char *out, size_t out_size);
int qwen2_config_save_json(const qwen2_config *config, const char *path, char *error, size_t error_size);
int qwen2_config_load_json(qwen2_config *config, const char *path, char *error, size_t error_size);

/* ---- The module tree, with HF names and class names, for the wrap policy to walk ---- */
typedef struct qwen2_module {
    char name[QWEN2_NAME_MAX];    /* "model.layers.3.self_attn" ("" is the root Qwen2ForCausalLM) */
    const char *type;             /* HF class: "Qwen2DecoderLayer", "Linear", "Qwen2RMSNorm", ... */
    int parent;                   /* index, -1 for the root */
    int layer;                    /* decoder layer index it belongs to, -1 outside the layers */
} qwen2_module;

typedef struct qwen2_param {
    char name[QWEN2_NAME_MAX];    /* "model.layers.3.self_attn.q_proj.weight" */
    int ndim;
    int64_t shape[2];
    int module;                   /* owning module's index */
    int layer;                    /* -1 for embed_tokens and norm */
} qwen2_param;

typedef struct qwen2_tree {
    int module_count, param_count;
    qwen2_module *modules;        /* parents before children, HF's registration order */
    qwen2_param *params;          /* HF's named_parameters() order; the tied lm_head is not a separate parameter */
} qwen2_tree;

int qwen2_tree_build(qwen2_tree *tree, const qwen2_config *config);
void qwen2_tree_free(qwen2_tree *tree);
size_t qwen2_param_numel(const qwen2_param *param);

/* HF's _init_weights from the counter-based RNG: weights normal(0, initializer_range), biases 0, norms 1. An
 * flat_param_fill_fn: `user` points to the qwen2_init_spec. */
typedef struct qwen2_init_spec {
    uint64_t seed;
    float std;
} qwen2_init_spec;
void qwen2_init_fill(const char *name, size_t first, size_t count, float *out, void *user);

/* Matrix-multiply FLOPs of one forward pass over B x T tokens (projections, attention as computed over the full
 * T x T, MLP, tied lm_head); backward costs twice that. layers_only counts the decoder layers alone (what
 * activation checkpointing recomputes). Element-wise work is not counted. */
double qwen2_forward_flops(const qwen2_config *config, int B, int T, int layers_only);

/* ---- The model ---- */

/* Where a parameter lives: which unit, which of its FlatParameter's params. */
typedef module_location qwen2_location;

/* The tree as the runtime sees it (core/fsdp/module.h): pieces are 0 the embedding, 1 + l decoder layer l, L + 1 the
 * head (final norm, tied lm_head, loss); embed_tokens.weight spans 0 .. L + 1 (tied), norm.weight the head. */
int qwen2_module_tree(const qwen2_config *config, module_tree *tree);

typedef struct qwen2_model {
    context *ctx;
    qwen2_config config;
    qwen2_tree tree;
    int unit_count;
    flat_param *units;            /* units[0] is the root unit */
    qwen2_location *locations;    /* per tree param */
    module_tree module_tree;      /* the same tree, as the runtime sees it */
    int rope_positions;           /* rows in the RoPE tables (grown on demand) */
    float *rope_cos, *rope_sin;   /* (rope_positions, head_dim), category workspace */
    int loss_chunk;               /* LOSS_CHUNK: 0, the loss over all N = B x T rows at once (logits and their
                                     gradient saved, N x V floats each: activations); k > 0, k rows at a time, so N x V
                                     logits never exist: the forward keeps only the loss, the backward recomputes each
                                     chunk's logits (one more lm_head GEMM); two k x V workspace buffers */
    /* Per device loss slot: the targets the host counted for the losses queued there, checked against the device's
     * count when the slot is read (qwen2_as_module's losses_read). */
    int loss_slot_targets[DEVICE_LOSS_SLOTS];
} qwen2_model;

/* Builds the tree and one FlatParameter per unit of the given assignment (unit_of_param[i]: the unit of tree
 * parameter i, 0 the root; fsdp_auto_wrap makes one), each named after the module holding its parameters ("root",
 * "layers.3", "layers.3.mlp"), and fills every rank's shards from `init` (NULL: zeros, e.g. before
 * pretrained_load). replicated: every rank keeps whole units (NO_SHARD). Every rank must call it. Returns -1
 * with ctx->error on a bad config or assignment; qwen2_model_free still frees what was made. OpenBLAS runs
 * ctx->threads threads (env THREADS, default 1: one rank per core). */
int qwen2_model_init(qwen2_model *model, context *ctx, const qwen2_config *config, const int *unit_of_param,
                     int unit_count, int replicated, const qwen2_init_spec *init);
void qwen2_model_free(qwen2_model *model);
/* The model, wrapped by `wrap` (fsdp_auto_wrap) into units and initialised from `init`; NO_SHARD keeps whole units on
 * every rank. Returns -1 with ctx->error on a bad config. */
int qwen2_model_init_wrapped(qwen2_model *model, context *ctx, const qwen2_config *config, fsdp_wrap_fn wrap,
                             void *user, fsdp_strategy strategy, const qwen2_init_spec *init);
/* The model as the FSDP runtime sees it (pieces: embed, layers, head). Valid while the model lives. */
void qwen2_as_module(qwen2_model *model, module *out);
/* The parameter's values (its unit must be UNSHARDED) or its gradient (the unit's full gradient must exist). */
float *qwen2_param_data(const qwen2_model *model, int param);
float *qwen2_param_grad(const qwen2_model *model, int param);
int qwen2_find_param(const qwen2_model *model, const char *name);

/* ---- Activations: what forward saves for backward ---- */
typedef struct qwen2_layer_activations {
    float *ln1, *ln1_rstd;        /* input_layernorm output (N, C) and 1/rms (N) */
    float *q, *k, *v;             /* after RoPE (q, k): (N, H*D), (N, KVH*D), (N, KVH*D); the backward makes the
                                   * attention's probabilities again from q and k (none are kept) */
    float *attention;             /* attention output before o_proj (N, H*D) */
    float *mid;                   /* x + o_proj(attention): the residual between the two halves (N, C) */
    float *ln2, *ln2_rstd;        /* post_attention_layernorm output and 1/rms */
    float *gate_up;               /* (N, 2I): one GEMM against gate_proj and up_proj stacked */
    float *swiglu;                /* silu(gate) * up (N, I) */
} qwen2_layer_activations;

typedef struct qwen2_activations {
    int B, T;
    int *tokens, *targets;        /* (B*T), category data */
    float **residuals;            /* L+1 of (N, C): [0] embeddings, [l+1] layer l's output; category activation */
    qwen2_layer_activations *layers;
    float *final_norm, *final_rstd;
    float *logits;                /* (N, V) */
    float *dlogits;               /* (N, V), written by the head's forward (the loss's gradient), when backward
                                     follows and the loss is not chunked */
    float **dresiduals;           /* gradient flowing back; [l] exists between layer l's and l-1's backward */
    float loss;                   /* the mean loss, when read at once (loss_slot -1) */
    int loss_slot;                /* the device's loss slot the loss goes to (module_ops.loss_to_slot), not read
                                     back; -1 (the default): the head's forward reads it at once into `loss` */
    int *chunk_counts;            /* LOSS_CHUNK with targets: each chunk's targets counted on the host (the chunk's
                                     share of the gradient's scale, known without reading the device) */
    int target_count;
    float loss_gradient_scale;    /* the factor the runtime asked dlogits to be scaled by (1 at first) */
    /* Set (before the head's forward) when backward follows: the head's forward then writes the loss's gradient.
     * Without it the forward computes the loss alone and allocates no gradient buffer. Under LOSS_CHUNK the head's
     * forward then also does its backward chunk by chunk while each chunk's logits exist (the root unit's full
     * gradient must be allocated first): dnorm below is that backward's result, the head's backward finishes it. */
    int backward_follows;
    int counted_targets;          /* targets other than QWEN2_IGNORE_INDEX, counted on the host */
    float *dnorm;                 /* (N, C), LOSS_CHUNK with backward_follows: d loss / d final_norm, category
                                     workspace, from the head's forward to its backward */
    const int *checkpointed;      /* per layer, or NULL: layer l's input is kept as checkpoint_input memory (the
                                     only thing activation checkpointing keeps of a layer) */
    struct qwen2_kv_cache *cache; /* generation only (B = 1), or NULL: the tokens are positions cache->length ..
                                     + T - 1; each layer appends its k, v there and attends over the whole cache */
} qwen2_activations;

/* Allocates the batch buffers and copies tokens/targets in (targets may be NULL: forward only, no loss). Checks
 * every token id against the vocabulary. Returns -1 with ctx->error naming the bad id and its position. */
int qwen2_activations_begin(qwen2_model *model, qwen2_activations *acts, const int *tokens, const int *targets, int B,
                            int T);
/* Frees whatever activations remain. */
void qwen2_activations_end(qwen2_model *model, qwen2_activations *acts);

/* The pieces, in the order a step runs them. Each needs the named unit(s) UNSHARDED. */
void qwen2_embed_forward(qwen2_model *model, qwen2_activations *acts);                 /* root */
void qwen2_layer_forward(qwen2_model *model, qwen2_activations *acts, int layer);      /* layer's unit */
/* final norm, logits, loss (when targets were given) and, when acts->backward_follows, dlogits, or under LOSS_CHUNK
 * the lm_head's backward (dnorm, and the tied embedding's gradient: the root's full gradient must exist). root.
 * Returns the loss. */
float qwen2_head_forward(qwen2_model *model, qwen2_activations *acts);
/* Backward pieces add into the units' full gradients (flat_param_alloc_full_grad first). */
void qwen2_head_backward(qwen2_model *model, qwen2_activations *acts);                 /* root */
void qwen2_layer_backward(qwen2_model *model, qwen2_activations *acts, int layer);     /* layer's unit */
void qwen2_embed_backward(qwen2_model *model, qwen2_activations *acts);                /* root */
/* Frees layer l's saved activations (activation checkpointing keeps only the layer's input). */
void qwen2_layer_activations_free(qwen2_model *model, qwen2_layer_activations *layer_acts);
/* Activation checkpointing's second forward, in backward: recomputes layer l's saved activations from its kept
 * input (the output it recomputes is dropped: the next layer's backward already used the real one). */
void qwen2_layer_recompute(qwen2_model *model, qwen2_activations *acts, int layer);

/* Everything, with every unit already UNSHARDED: forward, loss, backward into the full gradients (allocated here
 * when missing). Returns the loss. */
float qwen2_forward_backward(qwen2_model *model, const int *tokens, const int *targets, int B, int T);

/* ---- Generation ---- */

/* What attention keeps of the positions seen so far, so that generation computes one new position per token: per
 * layer the keys (after RoPE) and values, (capacity, num_key_value_heads * head_dim) floats each, category kv_cache,
 * owners "layers.<l>.self_attn.k_cache" / ".v_cache". */
typedef struct qwen2_kv_cache {
    int capacity;                 /* positions it can hold */
    int length;                   /* positions filled: the next forward's first position */
    float **k, **v;               /* per layer */
} qwen2_kv_cache;

void qwen2_kv_cache_init(qwen2_model *model, qwen2_kv_cache *cache, int capacity);
void qwen2_kv_cache_free(qwen2_model *model, qwen2_kv_cache *cache);

/* Greedy (temperature 0) or sampled continuation of prompt; every unit UNSHARDED. Writes up to max_new tokens into
 * out and returns how many (stops early at eos, and at max_position_embeddings positions in all). Sampling uses the
 * counter RNG keyed by (seed, step). With a KV cache: one forward over the prompt (prefill), then one position per
 * new token attending over the cache. -1 with ctx->error when the prompt is empty or longer than
 * max_position_embeddings, or max_new < 0. */
int qwen2_generate(qwen2_model *model, const int *prompt, int prompt_length, int max_new, float temperature,
                   uint64_t seed, int *out);
/* The same without a cache: every new token reruns the whole prefix. The reference the cached path is tested
 * against (the same tokens, token for token). */
int qwen2_generate_uncached(qwen2_model *model, const int *prompt, int prompt_length, int max_new, float temperature,
                            uint64_t seed, int *out);

#endif
