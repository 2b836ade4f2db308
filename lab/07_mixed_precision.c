/* lab 07 — mixed precision: bfloat16 parameters and gradients on the wire, float32 master shards in the optimizer.
 *
 * What it teaches
 *   torch's MixedPrecision(param_dtype, reduce_dtype, buffer_dtype, keep_low_precision_grads) on FSDP. Each rank's
 *   float32 local shard stays the master copy: AdamW reads and writes it and its two float32 states, so the
 *   persistent memory is 16 bytes per parameter / N (shard, gradient shard, exp_avg, exp_avg_sq), as without mixed
 *   precision. What changes is what travels and what is computed on:
 *     pre_unshard     the float32 shard is cast into a bfloat16 shard (_mp_shard, category
 *                     param_shard_low_precision), and that is what the all-gather moves: half the bytes;
 *     post_unshard    once gathered, the low-precision shard is freed (as torch frees it); forward and backward run
 *                     on the bfloat16 values (on CPU, widened into a float32 copy for OpenBLAS, which has no
 *                     bfloat16 GEMM: bfloat16 inputs, float32 accumulation, see core/fsdp/flat_param.h) and compute as
 *                     torch does on bfloat16 tensors: every op's output rounded to bfloat16 where torch's autograd
 *                     graph holds one (core/kernels/layers_bf16.h: each Linear, RMSNorm's two roundings, RoPE's three,
 *                     attention's scores, scaling, probabilities and output, SiLU and its product, the residual
 *                     adds, the logits; in backward every activation gradient);
 *     _post_backward_hook   the gradient (bfloat16 values, as torch's autograd leaves them) is reduce-scattered in
 *                     reduce_dtype (MP=bf16: bfloat16, half the bytes; MP=bf16,reduce=fp32: float32) and the
 *                     result is cast to float32 and added into the float32 gradient shard.
 *   The same steps run twice from the same init and batches, first in float32, then with MP, so every number below
 *   has its float32 twin beside it. MP runs under every strategy of lab 05 (NO_SHARD and HYBRID_SHARD all-reduce in
 *   reduce_dtype, with the reduce-scatter ring's rounding) and with CPU offload (the float32 shard copied h2d and
 *   cast on the device, as torch); check-07 runs those through lab 05.
 *
 * What to run (from the repository root; `make lab-NN` builds the lab, then launches it through the Makefile's MPIRUN,
 * which adds the flags mpirun needs as root (--allow-run-as-root) and for more ranks than cores (--oversubscribe))
 *   make lab-07                        20 steps of the tiny model in float32, then in MP=bf16
 *   make lab-07 MP=bf16,reduce=fp32    gather in bfloat16, reduce in float32
 *   mpirun --allow-run-as-root --oversubscribe -np 2 lab/07_mixed_precision     the same by hand, after `make`
 *   env: MP (bf16, the default; bf16,reduce=fp32; bf16,keep_low_precision_grads=1), MODEL, CONFIG, MBS, SEQ, STEPS,
 *   LR, SEED, THREADS, OUT, NP (as lab 05; every setting: docs/reference.md); COMM_STREAMS, BACKWARD_PREFETCH,
 *   FORWARD_PREFETCH (lab 06's; off here)
 *
 * What to look at (runs/07_mixed_precision/: trace.json in Perfetto UI, memory.html, summary.txt)
 *   The bytes table: every all_gather moves exactly half the bytes of its float32 twin (2-byte elements); so does
 *   every reduce_scatter with reduce_dtype bfloat16. In the trace, the all_gather slices (args: dtype bfloat16) carry
 *   half the bytes; on the memory track param_shard_low_precision appears at each _pre_forward / _pre_backward_hook
 *   (pre_unshard) and is gone once the all-gather is done, and param_unsharded holds the 2-byte gathered unit (plus,
 *   its 4-byte compute copy, which the device's layers read: param_unsharded's peak is 1.5x float32's, on the CPU
 *   and on the CUDA device alike so far; layers that read 2-byte tensors would make it 0.5x)
 *   until reshard. The peak table: param_shard, grad_shard and optim_state are the
 *   same bytes in both runs (the float32 master and AdamW did not shrink); the memory model predicts every category
 *   to the byte in both. The losses: side by side, the bfloat16 run tracks the float32 one within the bound
 *   tests/tolerances.py derives (mixed_precision_loss); step time on CPU is not faster in bfloat16 (the casts cost,
 *   the GEMMs are float32 either way): the win shown here is bytes, not time. On a GPU (lab 05 with MP=bf16, make
 *   CUDA=1, DEVICE=cuda; this lab reads its gradients on the host, so it runs on the CPU only) the GEMMs run on
 *   bfloat16 tensor cores: on an H200, Qwen2-0.5B's MP=bf16 step took 0.57 s against 0.70 s in float32
 *   (docs/gpu.md).
 *
 * The check (`make check-07`): all-gather bytes exactly half of float32's (and reduce-scatter's with reduce_dtype
 * bfloat16), every event carrying its dtype; param_shard, grad_shard and optim_state peaks unchanged; the memory
 * model exact per category in both runs; losses within the derived bound over 20 steps; N ranks vs 1 rank in
 * bfloat16 (lab 05 MP=bf16 GRADS) within the bound of bfloat16 rounding of a sum over ranks; NO_SHARD, HYBRID_SHARD
 * and _HYBRID_SHARD_ZERO2 with MP=bf16 against their reduce=fp32 twins within the bound of the bfloat16 reduction,
 * their bytes and memory model; OFFLOAD=1 with MP=bf16 bit for bit the run without it, its copies float32 shards;
 * torch's bfloat16 op rules, and the model against HF's in bfloat16 within the flip bound (tests/check_torch_bf16.py).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/runtime/env.h"
#include "core/runtime/context.h"
#include "core/base/dtype.h"
#include "core/fsdp/fsdp.h"
#include "core/memory/mem.h"
#include "core/models/qwen2.h"
#include "trace/run.h"
#include "core/runtime/world.h"
#include "core/runtime/session.h"
#include "trainer.h"

#define MAX_STEPS 200

typedef struct settings {
    int micro_batch, steps, seq_len;
    double lr;
    uint64_t seed;
    fsdp_options options;         /* the MP run's (the float32 run: the same with mixed precision off) */
    char mp_label[64];
} settings;

typedef struct run_result {
    double losses[MAX_STEPS];        /* mean over ranks */
    double rounding[MAX_STEPS];      /* sum_i |g_i| |w_i - bf16(w_i)| over the master weights (MP run): the loss's
                                        first-order change from computing on the rounded weights */
    double step_seconds;             /* mean of steps 2.., slowest rank */
    size_t peak[MEM_CATEGORY_COUNT]; /* this rank's peak per category */
    double gradient_l1_difference;   /* step 1: sum_i |g_mp,i - g_fp32,i| over every gradient (MP run) */
} run_result;

/* The step-1 gradient shards of the float32 run, kept for the MP run to compare against. Plain malloc on purpose:
 * the lab's ruler, not the thing measured (tracked memory would show up in the MP run's peaks). */
typedef struct kept_gradients {
    float **shards;
    int unit_count;
} kept_gradients;

static settings read_settings(context *ctx);
static void save_config(context *ctx, const settings *s);
static void run(context *ctx, const settings *s, const char *name, const fsdp_options *options, kept_gradients *kept,
                run_result *result);
static void free_kept_gradients(kept_gradients *kept);
static void print_peaks(context *ctx, const settings *s, const run_result *fp32, const run_result *mixed);
static void print_comparison(context *ctx, const settings *s, const run_result *fp32, const run_result *mixed);
static int print_bytes(const char *outdir);

int main(int argc, char **argv) {
    context ctx;
    session_open(&ctx, &argc, &argv, "07_mixed_precision", "runs/07_mixed_precision");
    session_require_cpu(&ctx, "the gradients it keeps to compare the precisions");
    settings s = read_settings(&ctx);
    save_config(&ctx, &s);
    if (ctx.rank == 0) {
        printf("Ranks = %d, lab 07: the same %d steps in float32, then with MP=%s (param_dtype %s, reduce_dtype %s%s); "
               "the memory model per run and rank first\n", ctx.world_size, s.steps, s.mp_label,
               dtype_name(s.options.mixed_precision.param_dtype), dtype_name(s.options.mixed_precision.reduce_dtype),
               s.options.mixed_precision.keep_low_precision_grads ? ", keep_low_precision_grads" : "");
        fflush(stdout);
    }
    /* The same steps twice, from the same parameters and batches: first in float32, then with MixedPrecision. */
    static run_result fp32, mixed; /* static: MAX_STEPS doubles each, off the stack */
    kept_gradients kept = {0};     /* the float32 run's step-1 gradients, which the MP run's are measured against */
    fsdp_options fp32_options = s.options;
    fp32_options.mixed_precision = (flat_param_mixed_precision){0};
    run(&ctx, &s, "float32", &fp32_options, &kept, &fp32);
    char mixed_name[80];
    snprintf(mixed_name, sizeof mixed_name, "MP=%s", s.mp_label);
    run(&ctx, &s, mixed_name, &s.options, &kept, &mixed);
    free_kept_gradients(&kept);

    print_peaks(&ctx, &s, &fp32, &mixed);      /* the float32 master and AdamW did not shrink */
    print_comparison(&ctx, &s, &fp32, &mixed); /* the losses stay within bfloat16's rounding of float32's */
    /* From the trace, once it is written: every bfloat16 collective moved half the bytes of its float32 twin. */
    int rank = ctx.rank;
    char outdir[sizeof ctx.outdir];
    snprintf(outdir, sizeof outdir, "%s", ctx.outdir);
    int status = session_close(&ctx);
    if (rank == 0 && status == 0 && print_bytes(outdir) != 0) status = 1;
    return status;
}

/* MBS, STEPS, SEQ, LR, SEED; MP, the second run's MixedPrecision; lab 06's prefetch settings. */
static settings read_settings(context *ctx) {
    settings s = {
        .micro_batch = (int)env_int(ctx, "MBS", 4, 1, 4096),
        .steps = (int)env_int(ctx, "STEPS", 20, 2, MAX_STEPS),
        .seq_len = (int)env_int(ctx, "SEQ", 128, 2, 32768),
        .lr = env_real(ctx, "LR", 1e-3, 0.0, 10.0),
        .seed = env_seed(ctx),
    };
    s.options = (fsdp_options){.strategy = FSDP_FULL_SHARD, .accumulation_steps = 1};
    fsdp_prefetch_options_from_env(ctx, &s.options);
    const char *mp = env_text(ctx, "MP");
    if (fsdp_mixed_precision_parse(mp != NULL && mp[0] != '\0' ? mp : "bf16", &s.options.mixed_precision, ctx->error,
                                   sizeof ctx->error) != 0)
        world_exit_all(ctx, 2, "%s", ctx->error);
    if (s.options.mixed_precision.param_dtype == DTYPE_FLOAT32)
        world_exit_all(ctx, 2, "MP='%s': lab 07 compares a bfloat16 param_dtype against float32; choose bf16, "
                     "bf16,reduce=fp32 or bf16,keep_low_precision_grads=1", mp);
    fsdp_mixed_precision_label(&s.options.mixed_precision, s.mp_label, sizeof s.mp_label);
    return s;
}

/* The model's config.json, written beside the events: the loss bound's shapes (tests/check_lab07.py). */
static void save_config(context *ctx, const settings *s) {
    qwen2_config config;
    qwen2_config_from_env(ctx, &config, s->seq_len);
    char path[700];
    snprintf(path, sizeof path, "%s/config.json", ctx->outdir);
    if (ctx->rank == 0 && qwen2_config_save_json(&config, path, ctx->error, sizeof ctx->error) != 0)
        world_fatal(ctx, "%s", ctx->error);
}

/* This rank's share of sum_i |g_i| |w_i - round(w_i)| (padding is zero in both), summed over ranks. */
static double rounding_sensitivity(context *ctx, const qwen2_model *model, dtype type) {
    double sum = 0.0;
    for (int unit = 0; unit < model->unit_count; unit++) {
        const flat_param *fp = &model->units[unit];
        if (fp->grad_shard == NULL) continue;
        for (size_t i = 0; i < fp->sharded_numel; i++) {
            float w = fp->local_shard[i], rounded = w;
            dtype_round_to(&rounded, 1, type);
            sum += fabs((double)fp->grad_shard[i]) * fabs((double)w - (double)rounded);
        }
    }
    world_allreduce(ctx, &sum, 1, MPI_DOUBLE, MPI_SUM, "the rounding sensitivity");
    return sum;
}

static void keep_gradients(kept_gradients *kept, const qwen2_model *model) {
    kept->unit_count = model->unit_count;
    kept->shards = calloc((size_t)model->unit_count, sizeof *kept->shards);
    if (kept->shards == NULL) world_fatal(model->ctx, "out of memory");
    for (int unit = 0; unit < model->unit_count; unit++) {
        const flat_param *fp = &model->units[unit];
        kept->shards[unit] = calloc(fp->sharded_numel, sizeof(float));
        if (kept->shards[unit] == NULL) world_fatal(model->ctx, "out of memory");
        if (fp->grad_shard != NULL) memcpy(kept->shards[unit], fp->grad_shard, fp->sharded_numel * sizeof(float));
    }
}

static double gradient_difference(context *ctx, const kept_gradients *kept, const qwen2_model *model) {
    double sum = 0.0;
    for (int unit = 0; unit < model->unit_count && unit < kept->unit_count; unit++) {
        const flat_param *fp = &model->units[unit];
        for (size_t i = 0; i < fp->sharded_numel; i++)
            sum += fabs((double)(fp->grad_shard ? fp->grad_shard[i] : 0.0f) - (double)kept->shards[unit][i]);
    }
    world_allreduce(ctx, &sum, 1, MPI_DOUBLE, MPI_SUM, "the gradient difference");
    return sum;
}

static void free_kept_gradients(kept_gradients *kept) {
    for (int unit = 0; unit < kept->unit_count; unit++) free(kept->shards[unit]);
    free(kept->shards);
}

/* One run: a fresh model from SEED, the same batches, STEPS AdamW steps, between marks "lab 07 run <name>" and
 * "lab 07 run end". Prints the memory model's table. */
static void run(context *ctx, const settings *s, const char *name, const fsdp_options *options, kept_gradients *kept,
                run_result *result) {
    trainer t;
    trainer_open_mode(&t, ctx, options, s->micro_batch, s->seq_len, s->seed, s->steps);
    t.optimizer.lr = s->lr;
    qwen2_model *model = &t.model;
    int mixed = flat_param_mixed_precision_enabled(&options->mixed_precision);

    char text[128];
    snprintf(text, sizeof text, "lab 07 run %s", name);
    trainer_begin_window(ctx, text);
    double timed = 0.0;
    for (int step = 1; step <= s->steps; step++) {
        double start = MPI_Wtime();
        double loss = trainer_forward_backward(&t, 0);
        if (mixed) result->rounding[step - 1] = rounding_sensitivity(ctx, model, options->mixed_precision.param_dtype);
        if (step == 1 && !mixed) keep_gradients(kept, model);
        if (step == 1 && mixed) result->gradient_l1_difference = gradient_difference(ctx, kept, model);
        trainer_optimizer_step(&t);
        double elapsed = MPI_Wtime() - start;
        world_allreduce(ctx, &elapsed, 1, MPI_DOUBLE, MPI_MAX, "the step's time");
        trace_step(&ctx->trace, step, -1, loss, ctx->mem.peak_bytes, ctx->mem.peak_reserved_bytes, elapsed);
        world_allreduce(ctx, &loss, 1, MPI_DOUBLE, MPI_SUM, "the step's loss");
        result->losses[step - 1] = loss / ctx->world_size;
        if (step > 1) timed += elapsed;
    }
    trace_mark(&ctx->trace, "lab 07 run end");
    result->step_seconds = timed / (s->steps - 1);
    for (int category = 0; category < MEM_CATEGORY_COUNT; category++)
        result->peak[category] = ctx->mem.category_peak_bytes[category];

    snprintf(text, sizeof text, "run %s", name);
    trainer_print_memory_model(&t, text);
    trainer_close(&t);
    trainer_empty_caches(ctx); /* the second run starts from an empty cache, as the first */
}

/* Per rank: each run's peak per category side by side (machine-readable "peak" lines for check-07). */
static void print_peaks(context *ctx, const settings *s, const run_result *fp32, const run_result *mixed) {
    char text[4096];
    size_t used = (size_t)snprintf(text, sizeof text, "rank %d: peak by category (bytes), float32 vs MP=%s:\n",
                                   ctx->rank, s->mp_label);
    for (int c = 0; c < MEM_CATEGORY_COUNT && used < sizeof text; c++) {
        if (fp32->peak[c] == 0 && mixed->peak[c] == 0) continue;
        used += (size_t)snprintf(text + used, sizeof text - used, "  peak rank %d %-25s %12zu %12zu %6.3f\n",
                                 ctx->rank, mem_category_name((mem_category)c), fp32->peak[c], mixed->peak[c],
                                 fp32->peak[c] ? (double)mixed->peak[c] / (double)fp32->peak[c] : 0.0);
    }
    world_print_ordered(ctx, text);
}

/* Rank 0: step time, the step-1 gradients' difference and the losses side by side, with the rounding that bounds
 * their difference (machine-readable "loss" lines for check-07). */
static void print_comparison(context *ctx, const settings *s, const run_result *fp32, const run_result *mixed) {
    if (ctx->rank != 0) return;
    printf("\nstep time (mean of steps 2..%d, slowest rank): float32 %.2f ms, MP=%s %.2f ms (%.2fx)\n", s->steps,
           fp32->step_seconds * 1e3, s->mp_label, mixed->step_seconds * 1e3,
           fp32->step_seconds > 0 ? mixed->step_seconds / fp32->step_seconds : 0.0);
    printf("step-1 gradients: sum |g_MP - g_float32| = %.9g (lr %g, %d target tokens per step, seq %d)\n",
           mixed->gradient_l1_difference, s->lr, s->micro_batch * s->seq_len * ctx->world_size, s->seq_len);
    printf("losses side by side (mean over ranks); rounding: sum |g| |w - bf16(w)| at that step:\n"
           "  %4s %12s %12s %12s %12s\n", "step", "float32", "MP", "difference", "rounding");
    for (int step = 0; step < s->steps; step++)
        printf("  loss %4d %12.7f %12.7f %+12.3e %12.4e\n", step + 1, fp32->losses[step], mixed->losses[step],
               mixed->losses[step] - fp32->losses[step], mixed->rounding[step]);
    fflush(stdout);
}

/* After the run, from the events: per rank and run, what each kind of collective moved (dtype from bytes / count). */
static int print_bytes(const char *outdir) {
    trace_run trace;
    char error[1024];
    if (run_load(&trace, outdir, error, sizeof error) != 0) {
        fprintf(stderr, "07_mixed_precision: reading %s: %s\n", outdir, error);
        return -1;
    }
    printf("\nbytes each collective moved, per rank and run (bytes: the whole buffers; sent: this rank's ring "
           "traffic; elements of dtype):\n  %-18s %4s %-15s %-9s %6s %14s %14s\n", "run", "rank", "op", "dtype",
           "calls", "bytes", "sent");
    for (int r = 0; r < trace.world; r++) {
        const run_rank *rank = &trace.ranks[r];
        const char *current = NULL;
        enum { OPS = 3 };
        static const char *const ops[OPS] = {"all_gather", "reduce_scatter", "all_reduce"};
        uint64_t calls[OPS][2] = {{0}}, bytes[OPS][2] = {{0}}, sent[OPS][2] = {{0}};
        for (size_t i = 0; i < rank->event_count; i++) {
            const run_event *e = &rank->events[i];
            if (e->kind == RUN_MARK) {
                const char *label = run_string(&trace, e->label);
                if (strncmp(label, "lab 07 run ", 11) != 0) continue;
                if (strcmp(label, "lab 07 run end") != 0) {
                    current = label + 11;
                    memset(calls, 0, sizeof calls), memset(bytes, 0, sizeof bytes), memset(sent, 0, sizeof sent);
                    continue;
                }
                for (int op = 0; op < OPS && current != NULL; op++)
                    for (int half = 0; half < 2; half++)
                        if (calls[op][half] > 0)
                            printf("  %-18s %4d %-15s %-9s %6llu %14llu %14llu\n", current, rank->rank, ops[op],
                                   half ? "bfloat16" : "float32", (unsigned long long)calls[op][half],
                                   (unsigned long long)bytes[op][half], (unsigned long long)sent[op][half]);
                current = NULL;
            } else if (e->kind == RUN_COLLECTIVE && current != NULL) {
                const char *op = run_string(&trace, e->label);
                int half = e->count > 0 && e->bytes == 2 * e->count;
                for (int k = 0; k < OPS; k++)
                    if (strcmp(op, ops[k]) == 0)
                        calls[k][half]++, bytes[k][half] += e->bytes, sent[k][half] += e->bytes_sent;
            }
        }
    }
    run_free(&trace);
    return 0;
}
