/* adamw_tool.c — the C side of tests/test_adamw_parity.py: AdamW steps on one tensor, to compare with
 * torch.optim.AdamW. One rank (run it directly, no mpirun), so the shard is the whole tensor.
 *
 *   adamw_tool <in.safetensors> <out.safetensors> <lr> <weight_decay> [<beta1> <beta2> <eps>]
 *       in:  param [n], grad.0 [n] ... grad.<k-1> [n]     (k = how many grad.<i> there are, counted from 0)
 *       out: param [n], exp_avg [n], exp_avg_sq [n]       after k steps, step i using grad.i
 * Unset betas and eps are torch's defaults.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/runtime/context.h"
#include "core/fsdp/flat_param.h"
#include "core/fsdp/optim.h"
#include "core/io/safetensors.h"
#include "core/runtime/world.h"
#include "core/runtime/session.h"

static int usage(void) {
    fprintf(stderr,
            "usage: adamw_tool <in.safetensors> <out.safetensors> <lr> <weight_decay> [<beta1> <beta2> <eps>]\n");
    return 2;
}

static double parse_number(context *ctx, const char *what, const char *text) {
    char *end;
    double value = strtod(text, &end);
    if (end == text || *end != '\0') world_exit_all(ctx, 2, "%s '%s' is not a number", what, text);
    return value;
}

int main(int argc, char **argv) {
    if (argc != 5 && argc != 8) return usage();
    context ctx;
    session_open(&ctx, &argc, &argv, "adamw_tool", "runs/adamw_tool");
    if (ctx.world_size != 1) world_exit_all(&ctx, 2, "runs on one rank, not %d", ctx.world_size);

    adamw_config config = adamw_default_config();
    config.lr = parse_number(&ctx, "lr", argv[3]);
    config.weight_decay = parse_number(&ctx, "weight_decay", argv[4]);
    if (argc == 8) {
        config.beta1 = parse_number(&ctx, "beta1", argv[5]);
        config.beta2 = parse_number(&ctx, "beta2", argv[6]);
        config.eps = parse_number(&ctx, "eps", argv[7]);
    }
    if (adamw_config_check(&config, ctx.error, sizeof ctx.error) != 0) world_exit_all(&ctx, 2, "%s", ctx.error);

    st_file input;
    if (st_open(&input, argv[1], ctx.error, sizeof ctx.error) != 0) world_exit_all(&ctx, 1, "%s", ctx.error);
    const st_entry *param_entry = st_find(&input, "param");
    if (param_entry == NULL || param_entry->ndim != 1)
        world_exit_all(&ctx, 1, "%s: expected a 1-d tensor 'param'", argv[1]);
    int64_t numel = param_entry->shape[0];

    flat_param_tensor_spec spec = {"param", 1, {numel}};
    flat_param fp;
    if (flat_param_init(&fp, &ctx, "param", &spec, 1) != 0) world_exit_all(&ctx, 1, "%s", ctx.error);
    if (st_read(&input, "param", 0, (size_t)numel, fp.local_shard, ctx.error, sizeof ctx.error) != 0)
        world_exit_all(&ctx, 1, "%s", ctx.error);

    adamw_state state;
    adamw_init(&state);
    int steps = 0;
    for (;; steps++) {
        char name[32];
        snprintf(name, sizeof name, "grad.%d", steps);
        const st_entry *grad_entry = st_find(&input, name);
        if (grad_entry == NULL) break;
        if (grad_entry->numel != (size_t)numel)
            world_exit_all(&ctx, 1, "%s: %s has %zu elements, param has %lld", argv[1], name, grad_entry->numel,
                         (long long)numel);
        /* A fresh gradient each step, as after zero_grad and backward. */
        fp.grad_shard = mem_alloc(&ctx.mem, (size_t)numel * sizeof(float), MEM_GRAD_SHARD, "param.grad_shard");
        if (st_read(&input, name, 0, (size_t)numel, fp.grad_shard, ctx.error, sizeof ctx.error) != 0)
            world_exit_all(&ctx, 1, "%s", ctx.error);
        adamw_step(&state, &fp, &config);
        flat_param_zero_grad(&fp);
    }
    st_close(&input);
    if (steps == 0) world_exit_all(&ctx, 1, "%s: no grad.0, nothing to step", argv[1]);

    st_tensor_ref outputs[] = {
        {"param", 1, {numel}, fp.local_shard},
        {"exp_avg", 1, {numel}, state.exp_avg},
        {"exp_avg_sq", 1, {numel}, state.exp_avg_sq},
    };
    if (st_write(argv[2], outputs, 3, NULL, ctx.error, sizeof ctx.error) != 0) world_exit_all(&ctx, 1, "%s", ctx.error);
    printf("%d steps on %lld floats: lr %g, betas (%g, %g), eps %g, weight_decay %g\n", steps, (long long)numel,
           config.lr, config.beta1, config.beta2, config.eps, config.weight_decay);

    adamw_free(&state);
    flat_param_free(&fp);
    return session_close(&ctx);
}
