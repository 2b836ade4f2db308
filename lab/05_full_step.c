/* lab 05 — the full FSDP training step: every unit, state, hook, collective and byte of a real training run.
 *
 * What it teaches
 *   Everything of labs 01-04 at once, on a Qwen2 model. The model is cut into FSDP units by a wrap policy (one per
 *   decoder layer, the root holding the embedding and the final norm). In each micro-batch every unit is unsharded
 *   just before its forward (_pre_forward: all-gather) and resharded right after (_post_forward), except the root;
 *   in backward each unit is unsharded again (_pre_backward_hook), its gradient reduce-scattered and its parameters
 *   freed (_post_backward_hook). After ACC micro-batches AdamW updates only this rank's shard, with optimizer
 *   state for the shard alone. Peak memory is "1/N of everything + the unsharded units in flight + activations".
 *   The bytes come from a caching allocator like PyTorch's (core/memory/allocator.h): a freed unit's buffer stays
 *   *reserved* and serves the next unit's all-gather, so after the first steps nothing is asked of the system;
 *   reserved - allocated is what the cache holds plus fragmentation.
 *   main below is the whole step; the machinery around it (settings, resume, checkpoints, the divergence stop, the
 *   log line, the memory report) is lab/trainer.c, behind the names main calls.
 *
 * What to run (from the repository root; `make lab-NN` builds the lab, then launches it through the Makefile's MPIRUN,
 * which adds the flags mpirun needs as root (--allow-run-as-root) and for more ranks than cores (--oversubscribe))
 *   make lab-05                        3 steps of the tiny model, ACC=2 (`make run` is the same)
 *   make lab-05 STEPS=50 EVAL=25       watch the loss fall and the model start to write
 *   make lab-05 STRATEGY=SHARD_GRAD_OP CKPT=1 NO_SYNC=1    compare the peaks (and the traces)
 *   make lab-05 ALLOC=malloc           no caching: every buffer a fresh segment (PyTorch's
 *                                      PYTORCH_NO_CUDA_MEMORY_CACHING=1); same numbers, more sys time
 *   make lab-05 STEPS=40 CHECKPOINT_EVERY=10                sharded checkpoints under OUT/checkpoints;
 *   make lab-05 STEPS=40 CHECKPOINT_EVERY=10 RESUME=auto    after a crash, continue from the newest one:
 *                                      the same losses, bit for bit, as if it had never stopped
 *   make lab-05 NP=4 STEPS=10          4 ranks on any machine
 *   make lab-05 FSDP_VERSION=2         FSDP2 (lab 10): every parameter sharded on dim 0; on 2 ranks FSDP1's bits
 *   mpirun --allow-run-as-root --oversubscribe -np 2 lab/05_full_step     the same by hand, after `make`
 *   Every setting (MODEL, MBS, ACC, STEPS, STRATEGY, MP, OFFLOAD, ...): docs/reference.md, and lab/trainer.h, which
 *   reads them.
 *
 * What to look at (runs/05_full_step/trace.json in Perfetto UI)
 *   Per rank: on the comm track an all_gather before each layer's forward and again before its backward, and a
 *   reduce_scatter after each backward; on the compute track forward, backward (and recompute with CKPT=1); the
 *   state instants (_pre_forward, _post_backward_hook, ...) in PyTorch's order; the memory counter rising through
 *   forward (activations) and falling through backward, param_unsharded flickering one unit at a time, and the
 *   reserved counter above it: it climbs in the first steps, then stays flat. memory.html draws reserved over the
 *   bands and lists the segments holding the fragmentation at its peak; memory_snapshot.pickle is the allocator's
 *   own state for pytorch.org/memory_viz (segments, blocks, segment_alloc/alloc/free_completed/segment_free).
 *
 * The check (`make check-05`): losses, step-1 gradients and parameters on 2, 3 and 4 ranks equal those of 1 rank
 * without sharding within derived float32 bounds, for every strategy, both accumulation modes and checkpointing
 * on/off; the state order equals PyTorch's; the memory model equals the measured peak per category to the byte, and
 * reserved lies between allocated and its bound; with ALLOC=malloc everything is bit-identical; LR=10 stops at the
 * step that diverged, naming it. `make check-resume`: a run killed with SIGKILL and resumed from its sharded
 * checkpoint ends bit for bit where the uninterrupted run ends.
 */
#include "core/runtime/context.h"
#include "core/runtime/session.h"
#include "trainer.h"

int main(int argc, char **argv) {
    context ctx;
    session_open(&ctx, &argc, &argv, "05_full_step", "runs/05_full_step");
    trainer_settings s = trainer_read_settings(&ctx); /* every setting, checked on every rank (lab/trainer.h) */

    /* The model cut into FSDP units (one FlatParameter each, this rank keeping 1/N of it), the runtime whose hooks
     * move them, AdamW with state for the shards alone, the data; RESUME: all of it from a sharded checkpoint. */
    trainer t;
    trainer_open(&t, &ctx, &s);
    int first_step = trainer_resume(&t);

    for (int step = first_step; step <= s.steps; step++) {
        trainer_begin_step(&t); /* Peak and Time are the step's own */
        for (int micro = 0; micro < s.accumulation; micro++) {
            /* Forward and backward through the hooks (core/fsdp/fsdp.c): per unit _pre_forward all-gathers its
             * parameters, _post_forward frees them; _pre_backward_hook gathers them again, _post_backward_hook
             * reduce-scatters the gradient into this rank's shard. Only the last micro-batch syncs under no_sync.
             * The loss stays on the device (a GPU's host never waits for it inside the step's micro-batches)... */
            trainer_forward_backward_queued(&t, step, micro);
        }
        double loss_sum = trainer_read_losses(&t, step); /* ...until here: every micro-batch's, one host wait */
        trainer_save_gradients(&t, step);                /* GRADS: step 1's, as the optimizer will see them */
        if (trainer_diverged(&t, step, loss_sum)) break; /* a non-finite loss or gradient: stop before AdamW */
        /* The optimizer step on the shards: AdamW reads and writes only this rank's 1/N of each unit. */
        trainer_optimizer_step(&t);
        trainer_log_step(&t, step, loss_sum);            /* "1/3: Loss = ..., Peak = ... MB, Time = ...s" */
        trainer_maybe_eval(&t, step);                    /* EVAL: a story from the model as it is */
        trainer_maybe_checkpoint(&t, step);              /* CHECKPOINT_EVERY: a sharded checkpoint (core/io/dcp.h) */
        trainer_maybe_kill(&t, step);                    /* KILL_AT_STEP: a crash, for the resume check */
    }

    trainer_report_memory(&t); /* the memory model's prediction beside the measured peaks, per category */
    trainer_save(&t);          /* SAVE: the model as an HF directory (save_pretrained); a diverged run writes none */
    trainer_close(&t);
    int status = session_close(&ctx);
    return t.diverged[0] ? 3 : status; /* the views are written either way: they load a diverged run */
}
