/* fsdp.c — FSDP units, states, hooks and the micro-batch step. See fsdp.h. */
#include "core/fsdp/fsdp.h"

#include "core/runtime/env.h"
#include "core/runtime/world.h"
#include "core/base/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const training_state_names[] = {"IDLE", "FORWARD_BACKWARD"};
static const char *const handle_state_names[] = {"IDLE", "FORWARD", "BACKWARD_PRE", "BACKWARD_POST"};
static const char *const strategy_names[] = {"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD",
                                             "_HYBRID_SHARD_ZERO2"};
static const char *const backward_prefetch_names[] = {"NONE", "BACKWARD_PRE", "BACKWARD_POST"};

const char *fsdp_training_state_name(fsdp_training_state state) { return training_state_names[state]; }
const char *fsdp_handle_state_name(fsdp_handle_state state) { return handle_state_names[state]; }
const char *fsdp_strategy_name(fsdp_strategy strategy) { return strategy_names[strategy]; }

int fsdp_strategy_from_name(const char *name) {
    for (int strategy = 0; strategy < (int)(sizeof strategy_names / sizeof *strategy_names); strategy++)
        if (strcmp(strategy_names[strategy], name) == 0) return strategy;
    return -1;
}

int fsdp_strategy_is_hybrid(fsdp_strategy strategy) {
    return strategy == FSDP_HYBRID_SHARD || strategy == FSDP_HYBRID_SHARD_ZERO2;
}

int fsdp_strategy_reshards_after_forward(fsdp_strategy strategy) {
    return strategy == FSDP_FULL_SHARD || strategy == FSDP_HYBRID_SHARD;
}

const char *fsdp_backward_prefetch_name(fsdp_backward_prefetch prefetch) { return backward_prefetch_names[prefetch]; }

int fsdp_backward_prefetch_from_name(const char *name) {
    if (strcmp(name, "None") == 0) return BACKWARD_PREFETCH_NONE;
    for (int prefetch = 0; prefetch < 3; prefetch++)
        if (strcmp(backward_prefetch_names[prefetch], name) == 0) return prefetch;
    return -1;
}

fsdp_options fsdp_default_options(void) {
    return (fsdp_options){.strategy = FSDP_FULL_SHARD, .accumulation_steps = 1, .backward_prefetch = BACKWARD_PRE,
                          .comm_streams = 1, .limit_all_gathers = 1};
}

void fsdp_prefetch_options_from_env(context *ctx, fsdp_options *options) {
    static const char *const prefetches[] = {"NONE", "BACKWARD_PRE", "BACKWARD_POST", "None", NULL};
    const char *backward = env_choice(ctx, "BACKWARD_PREFETCH", backward_prefetch_names[options->backward_prefetch],
                                          prefetches);
    options->backward_prefetch = (fsdp_backward_prefetch)fsdp_backward_prefetch_from_name(backward);
    options->comm_streams = (int)env_int(ctx, "COMM_STREAMS", options->comm_streams, 0, 1);
    /* On a GPU forward prefetch follows the comm streams unless set (torch's default is off; docs/gpu.md says why
     * here it is on): the next unit's all-gather is issued before this unit's kernels are queued, so it no longer
     * waits behind the host's own waits (BACKEND=mpi's staging copies, the rate limiter) to start. */
    int forward_default = ctx->device.kind == DEVICE_CUDA ? options->comm_streams : options->forward_prefetch;
    options->forward_prefetch = (int)env_int(ctx, "FORWARD_PREFETCH", forward_default, 0, 1);
    options->limit_all_gathers = (int)env_int(ctx, "LIMIT_ALL_GATHERS", options->limit_all_gathers, 0, 1);
    options->forward_prefetch_modules =
        (int)env_int(ctx, "FORWARD_PREFETCH_MODULES", options->forward_prefetch_modules, 0, 64);
    options->backward_prefetch_modules =
        (int)env_int(ctx, "BACKWARD_PREFETCH_MODULES", options->backward_prefetch_modules, 0, 64);
}

/* ---------------------------------------------------------------- mixed precision */

static int mixed_precision_bad(const char *text, const char *part, const char *why, char *error, size_t error_size) {
    return error_set(error, error_size, "MP='%s': '%s' %s; allowed: fp32 (off), bf16, or <param_dtype>"
                     "[,reduce=<dtype>][,buffer=fp32][,keep_low_precision_grads=0|1][,output=<dtype>] with dtypes "
                     "bf16 or fp32, e.g. bf16,reduce=fp32", text, part, why);
}

int fsdp_mixed_precision_parse(const char *text, flat_param_mixed_precision *out, char *error, size_t error_size) {
    flat_param_mixed_precision mp = {0};
    char copy[128];
    if (text == NULL || text[0] == '\0' || strcmp(text, "none") == 0) {
        *out = mp;
        return 0;
    }
    if (strlen(text) >= sizeof copy) return mixed_precision_bad(text, text, "is too long", error, error_size);
    snprintf(copy, sizeof copy, "%s", text);
    int reduce_given = 0, first = 1;
    for (char *part = copy, *next; part != NULL; part = next, first = 0) {
        next = strchr(part, ',');
        if (next != NULL) *next++ = '\0';
        char *value = strchr(part, '=');
        if (first) {
            int type = value == NULL ? dtype_from_name(part) : -1;
            if (type < 0) return mixed_precision_bad(text, part, "is not a param_dtype", error, error_size);
            mp.param_dtype = (dtype)type;
            continue;
        }
        if (value == NULL) return mixed_precision_bad(text, part, "is not name=value", error, error_size);
        *value++ = '\0';
        if (strcmp(part, "keep_low_precision_grads") == 0) {
            if (strcmp(value, "0") != 0 && strcmp(value, "1") != 0)
                return mixed_precision_bad(text, value, "is not 0 or 1 (keep_low_precision_grads)", error, error_size);
            mp.keep_low_precision_grads = value[0] == '1';
            continue;
        }
        int type = dtype_from_name(value);
        if (type < 0 || type > DTYPE_BFLOAT16)
            return mixed_precision_bad(text, value, "is not a dtype", error, error_size);
        if (strcmp(part, "reduce") == 0) mp.reduce_dtype = (dtype)type, reduce_given = 1;
        else if (strcmp(part, "output") == 0) mp.output_dtype = (dtype)type; /* FSDP2's output_dtype */
        else if (strcmp(part, "buffer") == 0 && type == DTYPE_FLOAT32) mp.buffer_dtype = DTYPE_FLOAT32;
        else if (strcmp(part, "buffer") == 0)
            return mixed_precision_bad(text, value, "is not supported as buffer dtype (RoPE's inv_freq stays float32, "
                                       "as HF computes it)", error, error_size);
        else return mixed_precision_bad(text, part, "is not a setting (reduce, buffer, keep_low_precision_grads, "
                                        "output)", error, error_size);
    }
    if (!reduce_given) mp.reduce_dtype = mp.param_dtype;
    *out = mp;
    return 0;
}

void fsdp_mixed_precision_from_env(context *ctx, fsdp_options *options) {
    const char *text = env_text(ctx, "MP");
    if (fsdp_mixed_precision_parse(text, &options->mixed_precision, ctx->error, sizeof ctx->error) != 0)
        world_exit_all(ctx, 2, "%s", ctx->error);
    /* bfloat16 compute runs the device's bfloat16 layers (device.h's *_bf16 entries); a device without them can still
     * reduce in bfloat16 over float32 compute, which needs only casts. */
    if (options->mixed_precision.param_dtype != DTYPE_FLOAT32 && ctx->device.linear_forward_bf16 == NULL)
        world_exit_all(ctx, 2, "MP='%s': the %s device has no bfloat16 layers (device.h's *_bf16 entries): use "
                     "MP=fp32,reduce=bf16, MP=fp32 or DEVICE=cpu", text ? text : "", ctx->device.name);
}

const char *fsdp_mixed_precision_label(const flat_param_mixed_precision *mixed_precision, char *out, size_t out_size) {
    const flat_param_mixed_precision *mp = mixed_precision;
    const char *param = mp->param_dtype == DTYPE_BFLOAT16 ? "bf16" : "fp32";
    int used = snprintf(out, out_size, "%s", param);
    if (mp->reduce_dtype != mp->param_dtype && used >= 0 && (size_t)used < out_size)
        used += snprintf(out + used, out_size - (size_t)used, ",reduce=%s",
                         mp->reduce_dtype == DTYPE_BFLOAT16 ? "bf16" : "fp32");
    if (mp->keep_low_precision_grads && used >= 0 && (size_t)used < out_size)
        used += snprintf(out + used, out_size - (size_t)used, ",keep_low_precision_grads=1");
    if (mp->output_dtype == DTYPE_BFLOAT16 && used >= 0 && (size_t)used < out_size)
        snprintf(out + used, out_size - (size_t)used, ",output=bf16");
    return out;
}

/* ---------------------------------------------------------------- wrap policy */

int fsdp_wrap_by_type(const module_node *module, size_t unwrapped_numel, void *user) {
    (void)unwrapped_numel;
    return strcmp(module->type, (const char *)user) == 0;
}

int fsdp_wrap_by_size(const module_node *module, size_t unwrapped_numel, void *user) {
    return strcmp(module->type, "ModuleList") != 0 && unwrapped_numel >= *(const size_t *)user;
}

int fsdp_auto_wrap(const module_tree *tree, fsdp_wrap_fn wrap, void *user, int *unit_of_param) {
    int modules = tree->node_count;
    size_t *unwrapped = calloc((size_t)modules, sizeof *unwrapped);
    int *unit_of_module = calloc((size_t)modules, sizeof *unit_of_module); /* 0: not wrapped */
    if (unwrapped == NULL || unit_of_module == NULL) {
        fprintf(stderr, "fsdp_auto_wrap: out of memory for %d modules\n", modules);
        abort();
    }
    size_t total = 0;
    for (int p = 0; p < tree->param_count; p++) {
        unwrapped[tree->params[p].module] += module_param_numel(&tree->params[p]);
        total += module_param_numel(&tree->params[p]);
    }
    /* Children come after their parents in the tree, so walking backwards visits children first (post-order). A
     * module that would take every parameter left (Qwen2Model, around everything but the tied lm_head) is the root
     * itself: wrapping it would leave the root unit empty. */
    size_t claimed = 0;
    for (int m = modules - 1; m >= 1; m--) {
        int takes_the_rest = claimed + unwrapped[m] == total;
        if (unwrapped[m] > 0 && !takes_the_rest && wrap(&tree->nodes[m], unwrapped[m], user)) {
            unit_of_module[m] = 1;
            claimed += unwrapped[m];
        } else {
            unwrapped[tree->nodes[m].parent] += unwrapped[m];
        }
    }
    /* Number the wrapped modules in module (forward) order; the root is unit 0. */
    int units = 1;
    for (int m = 1; m < modules; m++)
        if (unit_of_module[m]) unit_of_module[m] = units++;
    for (int p = 0; p < tree->param_count; p++) {
        int m = tree->params[p].module;
        while (m > 0 && unit_of_module[m] == 0) m = tree->nodes[m].parent; /* nearest wrapped ancestor */
        unit_of_param[p] = m > 0 ? unit_of_module[m] : 0;
    }
    free(unwrapped);
    free(unit_of_module);
    return units;
}

/* ---------------------------------------------------------------- states */

static const char *unit_name(const fsdp_runtime *runtime, int unit) { return runtime->model->units[unit].unit; }
static flat_param *unit_param(fsdp_runtime *runtime, int unit) { return &runtime->model->units[unit]; }

static void check(fsdp_runtime *runtime, int status) {
    if (status != 0) world_fatal(runtime->ctx, "%s", runtime->ctx->error);
}

int fsdp_check_transition(fsdp_runtime *runtime, int unit, fsdp_handle_state expected, fsdp_handle_state to,
                          const char *hook) {
    fsdp_handle_state now = runtime->units[unit].handle_state;
    if (now == expected) return 0;
    snprintf(runtime->ctx->error, sizeof runtime->ctx->error,
             "rank %d: unit '%s': illegal HandleTrainingState transition %s -> %s in %s (expected from %s)",
             runtime->ctx->rank, unit_name(runtime, unit), handle_state_names[now], handle_state_names[to], hook,
             handle_state_names[expected]);
    return -1;
}

static void set_handle_state(fsdp_runtime *runtime, int unit, fsdp_handle_state expected, fsdp_handle_state to,
                             const char *hook) {
    check(runtime, fsdp_check_transition(runtime, unit, expected, to, hook));
    trace_state(&runtime->ctx->trace, unit_name(runtime, unit), "HandleTrainingState", handle_state_names[expected],
                handle_state_names[to], hook);
    runtime->units[unit].handle_state = to;
}

static void set_training_state(fsdp_runtime *runtime, int unit, fsdp_training_state to, const char *hook) {
    fsdp_unit *u = &runtime->units[unit];
    if (u->training_state == to) return; /* FORWARD_BACKWARD stays so for the whole pass */
    trace_state(&runtime->ctx->trace, unit_name(runtime, unit), "TrainingState",
                training_state_names[u->training_state], training_state_names[to], hook);
    u->training_state = to;
}

/* ---------------------------------------------------------------- unshard, reshard, prefetch */

/* torch's _FreeEventQueue.dequeue_if_needed + event.synchronize(): before an all-gather, with limit_all_gathers. */
static void synchronize_oldest(fsdp_runtime *runtime, const char *hook) {
    fsdp_free_event_queue *queue = &runtime->free_event_queue;
    stream_event oldest = queue->events[0];
    memmove(&queue->events[0], &queue->events[1], (size_t)(queue->count - 1) * sizeof queue->events[0]);
    queue->count--;
    if (event_query(&oldest)) return;
    double start = trace_now_us(&runtime->ctx->trace);
    event_synchronize(&oldest);
    queue->waits++;
    trace_wait_info wait = {.on = "compute", .seq = -1, .hook = hook, .start_us = start,
                            .dur_us = trace_now_us(&runtime->ctx->trace) - start};
    trace_wait(&runtime->ctx->trace, &wait);
}

static void rate_limit(fsdp_runtime *runtime, const char *hook) {
    if (runtime->options.limit_all_gathers && runtime->free_event_queue.count >= FSDP_MAX_INFLIGHT_ALL_GATHERS)
        synchronize_oldest(runtime, hook);
}

/* _unshard: the rate limiter, then the all-gather issued on the all-gather stream (a no-op when UNSHARDED). */
static void unshard(fsdp_runtime *runtime, int unit, const char *hook) {
    flat_param *fp = unit_param(runtime, unit);
    if (fp->shard_state == FLAT_PARAM_UNSHARDED) return;
    rate_limit(runtime, hook);
    stream *on = runtime->options.comm_streams ? &runtime->all_gather_stream : NULL;
    check(runtime, flat_param_unshard_start(fp, on, hook));
    if (flat_param_unshard_pending(fp)) runtime->gathers_in_flight[runtime->gathers_in_flight_count++] = unit;
}

/* current_stream().wait_stream(unshard_stream) makes the compute stream wait for the all-gathers issued so far, and
 * not for those issued after it (the prefetch that follows it in torch's hooks). On CPU the host is the compute
 * stream, so the wait happens where compute begins: the hook notes how many all-gathers it waits for
 * (gathers_issued), issues the prefetch, then waits for those (wait_for_gathers). The prefetched all-gather is
 * queued right behind this unit's and starts as soon as it is done. */
static int gathers_issued(const fsdp_runtime *runtime) { return runtime->gathers_in_flight_count; }

static void wait_for_gathers(fsdp_runtime *runtime, int count, const char *hook) {
    for (int i = 0; i < count; i++)
        check(runtime, flat_param_unshard_wait(unit_param(runtime, runtime->gathers_in_flight[i]), hook));
    runtime->gathers_in_flight_count -= count;
    memmove(runtime->gathers_in_flight, runtime->gathers_in_flight + count,
            (size_t)runtime->gathers_in_flight_count * sizeof *runtime->gathers_in_flight);
}

/* _reshard: free the unsharded buffer (when `free_unsharded`), and with the rate limiter record a free event on the
 * compute stream. _prefetched goes back to 0 either way. */
static void reshard(fsdp_runtime *runtime, int unit, int free_unsharded, const char *hook) {
    if (free_unsharded) {
        /* _post_forward with reshard_after_forward=N: onto the post-forward group (flat_param.c) */
        if (runtime->units[unit].handle_state == HANDLE_FORWARD)
            flat_param_reshard_after_forward(unit_param(runtime, unit), hook);
        else flat_param_reshard(unit_param(runtime, unit), hook);
        fsdp_free_event_queue *queue = &runtime->free_event_queue;
        if (runtime->options.limit_all_gathers) {
            if (queue->count == FSDP_FREE_EVENTS_MAX) synchronize_oldest(runtime, hook); /* keep the newest */
            stream_event *event = &queue->events[queue->count++];
            *event = (stream_event){0};
            event_record(event, &runtime->compute_stream);
        }
    }
    runtime->units[unit].prefetched = 0;
}

/* The all-gather output a forward copy-out kept (FSDP2 on comm streams), freed. */
static void release_all_gather_state(fsdp_runtime *runtime) {
    if (runtime->all_gather_state < 0) return;
    flat_param_free_all_gather_output(unit_param(runtime, runtime->all_gather_state));
    runtime->all_gather_state = -1;
}

typedef enum prefetch_mode { PREFETCH_FORWARD, PREFETCH_BACKWARD } prefetch_mode;

/* Whether a prefetch may unshard unit `target`: it still needs this pass's unshard and is not prefetched already. */
static int prefetchable(const fsdp_runtime *runtime, int target, prefetch_mode mode) {
    const fsdp_unit *t = &runtime->units[target];
    return (mode == PREFETCH_FORWARD ? t->needs_pre_forward_unshard : t->needs_pre_backward_unshard) && !t->prefetched;
}

/* _get_handle_to_prefetch: in forward (forward_prefetch) the unit after this one in the first forward's
 * _pre_forward order; in backward (BACKWARD_PRE from _pre_backward_hook, BACKWARD_POST from _post_backward_hook) the
 * unit before this one in this forward's _post_forward order, i.e. the next one backward meets. Only a unit that
 * still needs its unshard and is not prefetched already. -1: none. */
static int unit_to_prefetch(const fsdp_runtime *runtime, int unit, prefetch_mode mode) {
    const fsdp_unit *u = &runtime->units[unit];
    if (mode == PREFETCH_FORWARD) {
        if (!runtime->options.forward_prefetch || !runtime->pre_forward_recorded) return -1;
        for (int i = 0; i + 1 < runtime->pre_forward_count; i++)
            if (runtime->pre_forward_order[i] == unit) {
                int target = runtime->pre_forward_order[i + 1];
                return prefetchable(runtime, target, mode) ? target : -1;
            }
        return -1;
    }
    int wanted = (u->handle_state == HANDLE_BACKWARD_PRE && runtime->options.backward_prefetch == BACKWARD_PRE) ||
                 (u->handle_state == HANDLE_BACKWARD_POST && runtime->options.backward_prefetch == BACKWARD_POST);
    if (!wanted) return -1;
    /* EXERCISE 06-prefetch BEGIN: backward: the unit before this one in _post_forward order, if it still needs one */
    for (int i = 1; i < runtime->post_forward_count; i++)
        if (runtime->post_forward_order[i] == unit) {
            int target = runtime->post_forward_order[i - 1];
            return prefetchable(runtime, target, mode) ? target : -1;
        }
    /* EXERCISE 06-prefetch END */
    return -1;
}

static void prefetch_unit(fsdp_runtime *runtime, int target) {
    unshard(runtime, target, "_prefetch_handle");
    runtime->units[target].prefetched = 1;
}

/* _prefetch_handle: issue the next unit's all-gather now, so it runs on its stream while this unit computes. FSDP2's
 * explicit list, when the unit has one, replaces it: every target that still needs its unshard, in the list's order
 * (from _pre_forward or _pre_backward_hook only). */
static void prefetch(fsdp_runtime *runtime, int unit, prefetch_mode mode) {
    const fsdp_unit *u = &runtime->units[unit];
    int count = mode == PREFETCH_FORWARD ? u->forward_prefetch_count : u->backward_prefetch_count;
    const int *targets = mode == PREFETCH_FORWARD ? u->forward_prefetch : u->backward_prefetch;
    if (count > 0) {
        if (mode == PREFETCH_BACKWARD && u->handle_state != HANDLE_BACKWARD_PRE) return;
        for (int i = 0; i < count; i++)
            if (prefetchable(runtime, targets[i], mode)) prefetch_unit(runtime, targets[i]);
        return;
    }
    int target = unit_to_prefetch(runtime, unit, mode);
    if (target >= 0) prefetch_unit(runtime, target);
}

/* FSDP2's wait_for_unshard: the unit's own all-gather waited for and copied out (nothing when none is in flight). In
 * forward the copy-out keeps the all-gather output (torch's comm_ctx.all_gather_state: on a GPU the next all-gather
 * may then be issued on the all-gather stream without reusing memory this copy-out still reads), and the one kept by
 * the unit before is freed first, so two all-gather outputs live side by side from this unit's issue to here. */
static void wait_for_unshard(fsdp_runtime *runtime, int unit, const char *hook) {
    int at = -1;
    for (int i = 0; i < runtime->gathers_in_flight_count && at < 0; i++)
        if (runtime->gathers_in_flight[i] == unit) at = i;
    if (at < 0) return;
    int forward = runtime->units[unit].handle_state == HANDLE_FORWARD;
    if (forward) release_all_gather_state(runtime);
    unit_param(runtime, unit)->keep_all_gather_output = forward;
    wait_for_gathers(runtime, at + 1, hook); /* those issued before it first, as the stream runs them */
    if (forward) runtime->all_gather_state = unit;
}

static int is_fsdp2(const fsdp_runtime *runtime) { return runtime->options.fsdp_version == 2; }

/* ---------------------------------------------------------------- hooks */

void fsdp_pre_forward(fsdp_runtime *runtime, int unit) {
    fsdp_unit *u = &runtime->units[unit];
    set_training_state(runtime, unit, TRAINING_STATE_FORWARD_BACKWARD, "_pre_forward");
    if (!runtime->pre_forward_recorded) runtime->pre_forward_order[runtime->pre_forward_count++] = unit;
    set_handle_state(runtime, unit, HANDLE_IDLE, HANDLE_FORWARD, "_pre_forward");
    /* _pre_forward_unshard */
    if (!u->prefetched) unshard(runtime, unit, "_pre_forward");
    u->needs_pre_forward_unshard = 0;
    if (is_fsdp2(runtime)) { /* FSDPParamGroup.pre_forward: wait_for_unshard, then FSDPState's forward prefetch */
        wait_for_unshard(runtime, unit, "_pre_forward");
        prefetch(runtime, unit, PREFETCH_FORWARD);
        return;
    }
    int wait_for = gathers_issued(runtime); /* current_stream().wait_stream(unshard_stream) */
    prefetch(runtime, unit, PREFETCH_FORWARD);
    wait_for_gathers(runtime, wait_for, "_pre_forward");
}

void fsdp_post_forward(fsdp_runtime *runtime, int unit) {
    runtime->post_forward_order[runtime->post_forward_count++] = unit;
    /* The root keeps its parameters for backward, which starts with it; SHARD_GRAD_OP keeps every unit's. */
    /* EXERCISE 05-hooks BEGIN: _post_forward: free the unsharded parameters unless root or SHARD_GRAD_OP keeps them */
    int free_unsharded = unit != 0 && fsdp_strategy_reshards_after_forward(runtime->options.strategy);
    /* EXERCISE 05-hooks END */
    reshard(runtime, unit, free_unsharded, "_post_forward");
    set_handle_state(runtime, unit, HANDLE_FORWARD, HANDLE_IDLE, "_post_forward");
    if (unit == 0) release_all_gather_state(runtime); /* the root's: the last layer's output goes with forward */
}

void fsdp_pre_backward_hook(fsdp_runtime *runtime, int unit) {
    fsdp_unit *u = &runtime->units[unit];
    set_handle_state(runtime, unit, HANDLE_IDLE, HANDLE_BACKWARD_PRE, "_pre_backward_hook");
    int wait_for = 0;
    if (u->needs_pre_backward_unshard) {
        if (!u->prefetched) unshard(runtime, unit, "_pre_backward_hook");
        wait_for = gathers_issued(runtime); /* current_stream().wait_stream(unshard_stream) */
    }
    u->needs_pre_backward_unshard = 0;
    if (is_fsdp2(runtime)) { /* FSDPParamGroup.pre_backward: wait_for_unshard, then the prefetch */
        wait_for_unshard(runtime, unit, "_pre_backward_hook");
        prefetch(runtime, unit, PREFETCH_BACKWARD);
    } else {
        prefetch(runtime, unit, PREFETCH_BACKWARD);
        wait_for_gathers(runtime, wait_for, "_pre_backward_hook");
    }
    flat_param_alloc_full_grad(unit_param(runtime, unit)); /* kept from the last micro-batch under no_sync */
}

/* The previous unit's reduce-scatter, waited for before the next is issued: its result is added into the sharded
 * gradient and its unsharded gradient freed. So one reduce-scatter at a time runs under the next unit's backward. */
static void wait_for_reduce_scatter(fsdp_runtime *runtime, const char *hook) {
    if (runtime->reduce_in_flight < 0) return;
    check(runtime, flat_param_reduce_scatter_grad_wait(unit_param(runtime, runtime->reduce_in_flight), hook));
    runtime->reduce_in_flight = -1;
}

void fsdp_post_backward_hook(fsdp_runtime *runtime, int unit) {
    flat_param *fp = unit_param(runtime, unit);
    set_handle_state(runtime, unit, HANDLE_BACKWARD_PRE, HANDLE_BACKWARD_POST, "_post_backward_hook");
    /* _post_backward_reshard: then BACKWARD_POST prefetches the next unit, its all-gather beside this reduce-scatter */
    reshard(runtime, unit, 1, "_post_backward_hook");
    prefetch(runtime, unit, PREFETCH_BACKWARD);
    if (!runtime->sync_gradients) return;
    /* On a GPU the reduce-scatter stream first waits for the compute stream (the gradient must be computed); on CPU
     * the compute stream is the host, so the gradient is complete here. */
    wait_for_reduce_scatter(runtime, "_post_backward_hook");
    stream *on = runtime->options.comm_streams ? &runtime->reduce_scatter_stream : NULL;
    check(runtime, flat_param_reduce_scatter_grad_start(fp, COMM_AVG, on));
    runtime->reduce_in_flight = unit;
    if (on == NULL) wait_for_reduce_scatter(runtime, "_post_backward_hook"); /* blocking: done already */
}

void fsdp_post_backward_final_callback(fsdp_runtime *runtime) {
    /* _wait_for_post_backward: the compute stream waits for the reduce-scatter stream */
    wait_for_reduce_scatter(runtime, "_post_backward_final_callback");
    if (runtime->gathers_in_flight_count > 0)
        world_fatal(runtime->ctx, "unit '%s': an all-gather is still in flight after backward (prefetched, never used)",
                  unit_name(runtime, runtime->gathers_in_flight[0]));
    for (int unit = 0; unit < runtime->model->unit_count; unit++) { /* a post-forward shard backward never used */
        if (unit_param(runtime, unit)->shard_state == FLAT_PARAM_SHARDED_POST_FORWARD)
            flat_param_reshard(unit_param(runtime, unit), "_post_backward_final_callback");
        set_training_state(runtime, unit, TRAINING_STATE_IDLE, "_post_backward_final_callback");
        set_handle_state(runtime, unit, HANDLE_BACKWARD_POST, HANDLE_IDLE, "_post_backward_final_callback");
    }
}

/* ---------------------------------------------------------------- runtime */

/* HYBRID_SHARD: the model's units must be sharded over the mesh's shard group (ctx->mesh set before the model was
 * built), and every other strategy's over the world; the comm streams get their own communicators of both groups
 * (the all-gather stream needs the shard group's, the reduce-scatter stream both). */
static int hybrid_streams(fsdp_runtime *runtime) {
    context *ctx = runtime->ctx;
    const flat_param *root = &runtime->model->units[0];
    int hybrid = fsdp_strategy_is_hybrid(runtime->options.strategy);
    if (hybrid != (root->shard_group != NULL))
        return error_set(ctx->error, sizeof ctx->error, "rank %d: strategy %s, but the model's units are sharded over "
                         "%s: set ctx->mesh (core/comm/group.h) before building the model for a hybrid strategy, and "
                         "leave it NULL for the others", ctx->rank, strategy_names[runtime->options.strategy],
                         root->shard_group  ? "a shard group"
                         : root->replicated ? "no group (replicated)"
                                            : "the world");
    if (!hybrid) return 0;
    stream *streams[] = {&runtime->all_gather_stream, &runtime->reduce_scatter_stream};
    for (int i = 0; i < 2; i++)
        if (stream_add_group(streams[i], root->shard_group) != 0 ||
            stream_add_group(streams[i], root->replicate_group) != 0)
            return -1;
    return 0;
}

/* reshard_after_forward=N (FSDP2, FULL_SHARD): torch's post_forward_mesh, the world viewed as (W/N, N): groups of N
 * consecutive ranks; every unit but the root (which keeps its parameters for backward) reshards onto its group, and
 * the all-gather stream gets the group's communicator. Collective. */
static int post_forward_groups(fsdp_runtime *runtime) {
    context *ctx = runtime->ctx;
    int size = runtime->options.reshard_after_forward;
    if (size == 0) return 0;
    if (runtime->options.fsdp_version != 2 || runtime->options.strategy != FSDP_FULL_SHARD || size < 2 ||
        size >= ctx->world_size || ctx->world_size % size != 0)
        return error_set(ctx->error, sizeof ctx->error, "rank %d: reshard_after_forward=%d needs FSDP_VERSION=2, "
                         "STRATEGY=FULL_SHARD and 1 < N < W dividing the world size W=%d", ctx->rank, size,
                         ctx->world_size);
    if (group_mesh_init(&runtime->post_forward_mesh, ctx, size) != 0) return -1;
    runtime->owns_post_forward_mesh = 1;
    comm_group *group = &runtime->post_forward_mesh.shard;
    snprintf(group->name, sizeof group->name, "post_forward");
    for (int unit = 1; unit < runtime->model->unit_count; unit++)
        if (flat_param_set_post_forward_group(unit_param(runtime, unit), group) != 0) return -1;
    return stream_add_group(&runtime->all_gather_stream, group);
}

static int set_prefetch_list(fsdp_runtime *runtime, int unit, const int *targets, int count, prefetch_mode mode) {
    context *ctx = runtime->ctx;
    const char *which = mode == PREFETCH_FORWARD ? "forward" : "backward";
    int units = runtime->model->unit_count;
    if (unit < 0 || unit >= units || count < 0 || count > units)
        return error_set(ctx->error, sizeof ctx->error, "rank %d: set_modules_to_%s_prefetch: unit %d of %d, %d "
                         "targets", ctx->rank, which, unit, units, count);
    if (count > 0 && (!is_fsdp2(runtime) || !runtime->options.comm_streams))
        return error_set(ctx->error, sizeof ctx->error, "rank %d: unit '%s': set_modules_to_%s_prefetch is FSDP2's "
                         "(FSDP_VERSION=2) and needs the all-gather stream (COMM_STREAMS=1); this run has "
                         "FSDP_VERSION=%d COMM_STREAMS=%d", ctx->rank, unit_name(runtime, unit), which,
                         is_fsdp2(runtime) ? 2 : 1, runtime->options.comm_streams);
    for (int i = 0; i < count; i++)
        if (targets[i] < 0 || targets[i] >= units || targets[i] == unit)
            return error_set(ctx->error, sizeof ctx->error, "rank %d: unit '%s': set_modules_to_%s_prefetch target "
                             "%d is not another unit (0 .. %d)", ctx->rank, unit_name(runtime, unit), which,
                             targets[i], units - 1);
    fsdp_unit *u = &runtime->units[unit];
    int **list = mode == PREFETCH_FORWARD ? &u->forward_prefetch : &u->backward_prefetch;
    int *list_count = mode == PREFETCH_FORWARD ? &u->forward_prefetch_count : &u->backward_prefetch_count;
    free(*list);
    *list = NULL;
    *list_count = 0;
    if (count == 0) return 0;
    if ((*list = malloc((size_t)count * sizeof **list)) == NULL) world_fatal(ctx, "out of memory");
    memcpy(*list, targets, (size_t)count * sizeof **list);
    *list_count = count;
    return 0;
}

int fsdp_set_modules_to_forward_prefetch(fsdp_runtime *runtime, int unit, const int *targets, int count) {
    return set_prefetch_list(runtime, unit, targets, count, PREFETCH_FORWARD);
}

int fsdp_set_modules_to_backward_prefetch(fsdp_runtime *runtime, int unit, const int *targets, int count) {
    return set_prefetch_list(runtime, unit, targets, count, PREFETCH_BACKWARD);
}

/* options->forward_prefetch_modules / backward_prefetch_modules = N: what torch's FSDP2 example does for its layers,
 * over the non-root units in forward order: unit i prefetches i+1 .. i+N in forward, i-1 .. i-N in backward. */
static int explicit_prefetch_lists(fsdp_runtime *runtime) {
    enum { MOST = 64 }; /* FORWARD_PREFETCH_MODULES' and BACKWARD_PREFETCH_MODULES' largest value */
    int units = runtime->model->unit_count, targets[MOST];
    int forward = runtime->options.forward_prefetch_modules, backward = runtime->options.backward_prefetch_modules;
    for (int unit = 1; unit < units; unit++) {
        int count = 0;
        for (int t = unit + 1; t < units && count < forward && count < MOST; t++) targets[count++] = t;
        if (fsdp_set_modules_to_forward_prefetch(runtime, unit, targets, count) != 0) return -1;
        count = 0;
        for (int t = unit - 1; t >= 1 && count < backward && count < MOST; t--) targets[count++] = t;
        if (fsdp_set_modules_to_backward_prefetch(runtime, unit, targets, count) != 0) return -1;
    }
    return 0;
}

int fsdp_runtime_init(fsdp_runtime *runtime, context *ctx, module *model, const fsdp_options *options) {
    memset(runtime, 0, sizeof *runtime);
    runtime->ctx = ctx;
    runtime->model = model;
    runtime->options = *options;
    runtime->reduce_in_flight = -1;
    runtime->all_gather_state = -1;
    if (options->accumulation_steps < 1) {
        snprintf(ctx->error, sizeof ctx->error, "accumulation steps must be >= 1, got %d", options->accumulation_steps);
        return -1;
    }
    if ((unsigned)options->backward_prefetch > BACKWARD_POST) {
        snprintf(ctx->error, sizeof ctx->error, "backward_prefetch %d is not NONE, BACKWARD_PRE or BACKWARD_POST",
                 (int)options->backward_prefetch);
        return -1;
    }
    int units = model->unit_count, pieces = model->piece_count;
    runtime->units = calloc((size_t)units, sizeof *runtime->units);
    runtime->checkpointed = calloc((size_t)pieces, sizeof *runtime->checkpointed);
    runtime->pre_forward_order = calloc((size_t)units, sizeof(int));
    runtime->post_forward_order = calloc((size_t)units, sizeof(int));
    runtime->gathers_in_flight = calloc((size_t)units, sizeof(int));
    runtime->timed_pieces = calloc(DEVICE_TIMERS_MAX, sizeof *runtime->timed_pieces);
    if (runtime->units == NULL || runtime->checkpointed == NULL || runtime->pre_forward_order == NULL ||
        runtime->post_forward_order == NULL || runtime->gathers_in_flight == NULL || runtime->timed_pieces == NULL)
        world_fatal(ctx, "out of memory");
    for (int unit = 0; unit < units; unit++)
        runtime->units[unit].first_piece = pieces, runtime->units[unit].last_piece = -1;
    for (int p = 0; p < model->tree->param_count; p++) {
        fsdp_unit *u = &runtime->units[model->locations[p].unit];
        const module_param *param = &model->tree->params[p];
        if (param->first_piece < u->first_piece) u->first_piece = param->first_piece;
        if (param->last_piece > u->last_piece) u->last_piece = param->last_piece;
    }
    runtime->units[0].first_piece = 0; /* the root wraps the whole model, parameters or not */
    runtime->units[0].last_piece = pieces - 1;
    for (int piece = 0; piece < pieces; piece++)
        runtime->checkpointed[piece] =
            options->activation_checkpointing && model->ops->piece_checkpointable(model->self, piece);
    for (int unit = 0; unit < units; unit++)
        if (flat_param_set_mixed_precision(unit_param(runtime, unit), &options->mixed_precision) != 0) return -1;
    for (int unit = 0; options->offload_params && unit < units; unit++) /* CPUOffload: the shards go to the host */
        if (flat_param_offload_params(&model->units[unit]) != 0) return -1;
    stream_kind comm_kind = options->comm_streams ? STREAM_WORKER : STREAM_HOST;
    if (stream_init(&runtime->compute_stream, ctx, "compute", STREAM_HOST) != 0 ||
        stream_init(&runtime->all_gather_stream, ctx, "all_gather", comm_kind) != 0 ||
        stream_init(&runtime->reduce_scatter_stream, ctx, "reduce_scatter", comm_kind) != 0)
        return -1;
    if (hybrid_streams(runtime) != 0) return -1;
    for (int unit = 0; unit < units; unit++)
        if ((model->units[unit].layout == FLAT_PARAM_ROWS) != (options->fsdp_version == 2))
            return error_set(ctx->error, sizeof ctx->error, "rank %d: fsdp_version %d, but unit '%s' is %s: set "
                             "ctx->per_parameter_sharding before building the model for FSDP2, and leave it 0 for "
                             "FSDP1", ctx->rank, options->fsdp_version, model->units[unit].unit,
                             model->units[unit].layout == FLAT_PARAM_ROWS ? "sharded per parameter" : "flat");
    if (post_forward_groups(runtime) != 0) return -1;
    if (explicit_prefetch_lists(runtime) != 0) return -1;
    trace_fsdp_info info = {
        .model = model->name,
        .sharding_strategy = strategy_names[options->strategy],
        .backward_prefetch = options->backward_prefetch == BACKWARD_PREFETCH_NONE
                                 ? NULL : backward_prefetch_names[options->backward_prefetch],
        .forward_prefetch = options->forward_prefetch,
        .limit_all_gathers = options->limit_all_gathers,
        .activation_checkpointing = options->activation_checkpointing,
        .no_sync = options->no_sync,
        .accumulation_steps = options->accumulation_steps,
        .unit_count = units,
        .offload_params = options->offload_params,
    };
    const flat_param_mixed_precision *mp = &options->mixed_precision;
    if (flat_param_mixed_precision_enabled(mp)) {
        info.param_dtype = dtype_name(mp->param_dtype);
        info.reduce_dtype = dtype_name(mp->reduce_dtype);
        info.buffer_dtype = dtype_name(mp->buffer_dtype);
        info.keep_low_precision_grads = mp->keep_low_precision_grads;
    }
    trace_fsdp(&ctx->trace, &info);
    return 0;
}

void fsdp_runtime_free(fsdp_runtime *runtime) {
    fsdp_trace_compute_spans(runtime);
    free(runtime->timed_pieces);
    stream_destroy(&runtime->all_gather_stream);
    stream_destroy(&runtime->reduce_scatter_stream);
    stream_destroy(&runtime->compute_stream);
    if (runtime->owns_post_forward_mesh) group_mesh_free(&runtime->post_forward_mesh);
    for (int unit = 0; runtime->units != NULL && unit < runtime->model->unit_count; unit++) {
        free(runtime->units[unit].forward_prefetch);
        free(runtime->units[unit].backward_prefetch);
    }
    free(runtime->units);
    free(runtime->checkpointed);
    free(runtime->pre_forward_order);
    free(runtime->post_forward_order);
    free(runtime->gathers_in_flight);
    memset(runtime, 0, sizeof *runtime);
}

/* ---------------------------------------------------------------- the step */

/* Which units' hooks fire at a piece: those whose span starts there (pre-hooks) or ends there (post-hooks). */
typedef enum span_edge { SPAN_START, SPAN_END } span_edge;
/* Nesting order among them: pre-hooks outer (wider span) first, post-hooks inner first, as torch's module hooks. */
typedef enum nesting { OUTER_FIRST, INNER_FIRST } nesting;

static int units_at(const fsdp_runtime *runtime, int piece, span_edge edge, nesting order, int *out) {
    int count = 0;
    for (int unit = 0; unit < runtime->model->unit_count; unit++) {
        const fsdp_unit *u = &runtime->units[unit];
        if ((edge == SPAN_START ? u->first_piece : u->last_piece) == piece) out[count++] = unit;
    }
    for (int i = 1; i < count; i++) /* insertion sort by span width: a handful of units */
        for (int j = i; j > 0; j--) {
            const fsdp_unit *a = &runtime->units[out[j - 1]], *b = &runtime->units[out[j]];
            int width_a = a->last_piece - a->first_piece, width_b = b->last_piece - b->first_piece;
            if (order == INNER_FIRST ? width_a > width_b : width_a < width_b) {
                int swap = out[j];
                out[j] = out[j - 1];
                out[j - 1] = swap;
            }
        }
    return count;
}

/* The unit a piece's compute span is labelled with: the innermost unit covering it. */
static const char *piece_unit(const fsdp_runtime *runtime, int piece) {
    int best = 0;
    for (int unit = 1; unit < runtime->model->unit_count; unit++) {
        const fsdp_unit *u = &runtime->units[unit], *b = &runtime->units[best];
        if (u->first_piece <= piece && piece <= u->last_piece &&
            u->last_piece - u->first_piece < b->last_piece - b->first_piece)
            best = unit;
    }
    return unit_name(runtime, best);
}

typedef enum piece_phase { PHASE_FORWARD, PHASE_RECOMPUTE, PHASE_BACKWARD } piece_phase;
static const char *const phase_names[] = {"forward", "recompute", "backward"};

void fsdp_trace_compute_spans(fsdp_runtime *runtime) {
    check(runtime, comm_finish_pending(runtime->ctx)); /* the collectives the compute stream waited for, as above */
    if (runtime->timed_piece_count == 0) return;
    module *model = runtime->model;
    trace_sink *trace = &runtime->ctx->trace;
    device *d = &runtime->ctx->device;
    d->timers_wait(d);
    for (int i = 0; i < runtime->timed_piece_count; i++) {
        const struct fsdp_timed_piece *timed = &runtime->timed_pieces[i];
        double start_seconds = 0.0, end_seconds = 0.0;
        d->timer_read(d, timed->timer, &start_seconds, &end_seconds);
        char name[96], piece_label[64];
        model->ops->piece_name(model->self, timed->piece, piece_label, sizeof piece_label);
        snprintf(name, sizeof name, "%s.%s", piece_label, phase_names[timed->phase]);
        /* trace_now_us's clock: microseconds since the sink's t0 */
        trace_compute(trace, name, piece_unit(runtime, timed->piece), phase_names[timed->phase],
                      (start_seconds - trace->t0_seconds) * 1e6, (end_seconds - start_seconds) * 1e6);
    }
    d->timers_reset(d);
    runtime->timed_piece_count = 0;
}

/* Runs one piece's forward, recompute or backward on the compute stream, as a `compute` span. On a GPU the layers
 * only queue kernels: the span is the piece's time on the device, marked by the device's timer (CUDA events around
 * the piece, read at the step's end), so the host never waits here and the queue stays full. On the CPU the marks
 * are the host's clock and the span is written at once. */
static void run_piece(fsdp_runtime *runtime, void *batch, int piece, piece_phase phase) {
    module *model = runtime->model;
    device *d = &runtime->ctx->device;
    int timer = d->timer_start(d);
    if (timer < 0) { /* every timer in use: read them now (a host wait, once per DEVICE_TIMERS_MAX pieces) */
        fsdp_trace_compute_spans(runtime);
        timer = d->timer_start(d);
    }
    if (phase == PHASE_FORWARD) model->ops->forward(model->self, batch, piece, runtime->checkpointed[piece]);
    else if (phase == PHASE_RECOMPUTE) model->ops->recompute(model->self, batch, piece);
    else model->ops->backward(model->self, batch, piece);
    d->timer_stop(d, timer);
    runtime->timed_pieces[runtime->timed_piece_count++] = (struct fsdp_timed_piece){timer, piece, (int)phase};
    if (!d->timers_deferred) fsdp_trace_compute_spans(runtime);
}

/* _root_pre_forward's reset: every unit needs its unshards again; this forward's _post_forward order starts anew. */
static void begin_pass(fsdp_runtime *runtime, fsdp_micro_batch micro_batch) {
    runtime->sync_gradients = !runtime->options.no_sync || micro_batch == FSDP_MICRO_BATCH_LAST;
    runtime->post_forward_count = 0;
    for (int unit = 0; unit < runtime->model->unit_count; unit++) {
        runtime->units[unit].needs_pre_forward_unshard = 1;
        runtime->units[unit].needs_pre_backward_unshard = 1;
    }
}

void fsdp_forward_backward_queued(fsdp_runtime *runtime, const int *tokens, const int *targets, int B, int T,
                                  fsdp_micro_batch micro_batch, int loss_slot) {
    module *model = runtime->model;
    if (loss_slot < 0 || loss_slot >= MODULE_LOSS_SLOTS)
        world_fatal(runtime->ctx, "loss slot %d outside 0 .. %d", loss_slot, MODULE_LOSS_SLOTS - 1);
    int *hooked = calloc((size_t)model->unit_count, sizeof *hooked);
    if (hooked == NULL) world_fatal(runtime->ctx, "out of memory");
    void *batch = NULL;
    check(runtime, model->ops->batch_begin(model->self, &batch, tokens, targets, B, T, runtime->checkpointed));
    /* the loss stays on the device, in its slot, until fsdp_losses_read (a model without slots: read below) */
    if (model->ops->loss_to_slot != NULL) model->ops->loss_to_slot(model->self, batch, loss_slot);
    begin_pass(runtime, micro_batch);
    /* (loss / accumulation_steps).backward()'s factor, handed before the forward to a model that starts its backward
     * there (module.h's begin_backward_in_forward), else applied between forward and backward (below) */
    /* EXERCISE 05-accumulate BEGIN: each micro-batch's share of the step's gradient, (loss / ACC).backward() */
    float loss_factor = 1.0f / (float)runtime->options.accumulation_steps;
    /* EXERCISE 05-accumulate END */
    int grads_in_forward = -1, early = model->ops->begin_backward_in_forward != NULL;
    if (early) grads_in_forward = model->ops->begin_backward_in_forward(model->self, batch, loss_factor);

    /* forward: pre-hooks, the piece, post-hooks */
    for (int piece = 0; piece < model->piece_count; piece++) {
        for (int i = 0, n = units_at(runtime, piece, SPAN_START, OUTER_FIRST, hooked); i < n; i++)
            fsdp_pre_forward(runtime, hooked[i]);
        /* A piece that adds into gradients in forward: the full gradients of the units around it, allocated now
         * instead of in their _pre_backward_hook (which then finds them), reduced as always in their
         * _post_backward_hook after their last backward piece. */
        if (piece == grads_in_forward)
            for (int unit = 0; unit < model->unit_count; unit++)
                if (runtime->units[unit].first_piece <= piece && piece <= runtime->units[unit].last_piece)
                    flat_param_alloc_full_grad(unit_param(runtime, unit));
        run_piece(runtime, batch, piece, PHASE_FORWARD);
        for (int i = 0, n = units_at(runtime, piece, SPAN_END, INNER_FIRST, hooked); i < n; i++)
            fsdp_post_forward(runtime, hooked[i]);
    }
    runtime->pre_forward_recorded = 1;
    /* Each micro-batch contributes 1/ACC of the step's gradient, as `(loss / accumulation_steps).backward()`. With
     * ACC = 1 the factor is 1.0f, and x * 1.0f is x: the pass over the loss's gradient would change nothing. */
    if (!early && runtime->options.accumulation_steps > 1)
        model->ops->scale_loss_gradient(model->self, batch, loss_factor);

    /* backward, in reverse: pre-backward hooks where a unit's span ends, post-backward hooks where it starts */
    for (int piece = model->piece_count - 1; piece >= 0; piece--) {
        for (int i = 0, n = units_at(runtime, piece, SPAN_END, OUTER_FIRST, hooked); i < n; i++)
            fsdp_pre_backward_hook(runtime, hooked[i]);
        if (runtime->checkpointed[piece]) run_piece(runtime, batch, piece, PHASE_RECOMPUTE);
        run_piece(runtime, batch, piece, PHASE_BACKWARD);
        for (int i = 0, n = units_at(runtime, piece, SPAN_START, INNER_FIRST, hooked); i < n; i++)
            fsdp_post_backward_hook(runtime, hooked[i]);
    }
    fsdp_post_backward_final_callback(runtime);
    if (model->ops->loss_to_slot == NULL) runtime->host_losses[loss_slot] = model->ops->loss(model->self, batch);
    model->ops->batch_end(model->self, batch);
    free(hooked);
}

void fsdp_losses_read(fsdp_runtime *runtime, float *losses, int first, int count) {
    module *model = runtime->model;
    if (first < 0 || count < 0 || first + count > MODULE_LOSS_SLOTS)
        world_fatal(runtime->ctx, "loss slots %d .. %d outside 0 .. %d", first, first + count - 1,
                    MODULE_LOSS_SLOTS - 1);
    /* The read waits for the device: first the collectives it is ordered after (BACKEND=nccl's, polled, so a stopped
     * rank is reported by TIMEOUT's watchdog rather than hanging the read) */
    check(runtime, comm_finish_pending(runtime->ctx));
    if (model->ops->losses_read != NULL) model->ops->losses_read(model->self, losses, first, count);
    else memcpy(losses, runtime->host_losses + first, (size_t)count * sizeof *losses);
}

float fsdp_forward_backward(fsdp_runtime *runtime, const int *tokens, const int *targets, int B, int T,
                            fsdp_micro_batch micro_batch) {
    float loss = 0.0f;
    fsdp_forward_backward_queued(runtime, tokens, targets, B, T, micro_batch, 0);
    fsdp_losses_read(runtime, &loss, 0, 1);
    return loss;
}
