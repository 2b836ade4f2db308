"""N ranks vs 1 rank in bfloat16 (MP=bf16): step 1's gradients (lab 05's GRADS, same init and global batch) within
the bound of bfloat16 rounding of a sum over ranks (tolerances.bf16_sum_over_ranks_l1, from the N-rank run's
local_grad_l1.json: each parameter's sum over ranks of |local gradient|) plus the float32 difference of the two
runs' local computations (tolerances.gradient_tolerance, per element, so n x tol x max|g| in L1). Per tensor:

    ||g_N - g_1||_1 <= bf16_sum_over_ranks_l1(A, N) + n tol max|g_1| / (1 - 2^-8)

A sum for a mean (the gradient doubled on 2 ranks), a skipped reduce-scatter or a shifted shard are off by about
||g||_1, far above (N + 2) 2^-8 ||g||_1.

usage: python3 tests/check_mixed_grads.py REFERENCE_GRADS (1 rank) RUN_GRADS (N ranks) TOKENS SEQ
"""
import json
import sys

import tolerances


def main(reference_dir, run_dir, tokens, seq):
    reference = tolerances.read_safetensors(f"{reference_dir}/model.safetensors")
    run = tolerances.read_safetensors(f"{run_dir}/model.safetensors")
    local = json.load(open(f"{run_dir}/local_grad_l1.json"))
    config = tolerances.load_config(f"{reference_dir}/config.json")
    world = local["world"]
    if local["param_dtype"] != "bfloat16":
        print(f"FAIL: {run_dir} ran with param_dtype {local['param_dtype']}, not bfloat16")
        return 1
    fp32_tol = tolerances.gradient_tolerance(config, int(tokens), int(seq))
    failed = 0
    worst = 0.0
    for name, g1 in reference.items():
        gn = run[name]
        difference = sum(abs(a - b) for a, b in zip(gn, g1))
        bf16 = tolerances.bf16_sum_over_ranks_l1(local["local_grad_l1"][name], world)
        fp32 = len(g1) * fp32_tol * max(abs(x) for x in g1) / (1 - tolerances.U_BF16)
        bound = bf16 + fp32
        norm = sum(abs(x) for x in g1)
        ok = difference <= bound
        failed += not ok
        worst = max(worst, difference / bound if bound else float("inf"))
        print(f"{name:55s} ||dg||_1 {difference:.3e}  ||g||_1 {norm:.3e}  bound {bound:.3e} "
              f"(bf16 {bf16:.2e}, fp32 {fp32:.2e}) {'' if ok else 'FAIL'}")
    print(f"{'FAIL' if failed else 'OK'}: {world} ranks vs 1 in {local['reduce_dtype']} reduction: {failed} of "
          f"{len(reference)} tensors outside the bound; largest difference / bound {worst:.3f}")
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) != 5:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(*sys.argv[1:]))
