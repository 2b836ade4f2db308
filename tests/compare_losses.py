"""Compares the per-step losses of two lab 05 runs (rank 0's `step` events with micro -1, which carry the loss
averaged over micro-batches and ranks at full precision) within the bound tests/tolerances.py derives: the first
step's loss differs only by rounding (loss_tolerance, relative); each later step may drift further by what AdamW
made of the step-1 gradient differences (later_loss_allowance, from both runs' GRADS dumps).

With `bf16` (both runs MP=bf16, each op's output rounded to bfloat16 at the same places, e.g. the CUDA device's
bfloat16 layers against the CPU's): the first step within tolerances.torch_bf16_loss_tolerance (float32 summation
orders that put a value on two sides of a bfloat16 rounding boundary), each later step within lr x the measured
step-1 gradient L1 difference more (torch_bf16_drift, which also fails a difference past twice the bfloat16 reduce's
error bound: a wrong gradient, not a rounded one), and each tensor's difference under twice its own such bound.
RUNDIR's grads/ must hold local_grad_l1.json (lab 05 writes it).

usage: python3 tests/compare_losses.py REFERENCE_RUNDIR RUNDIR TOKENS SEQ LR [bf16]
       (each run dir holds rank0.jsonl and grads/ — lab 05's GRADS — with config.json and model.safetensors)
"""
import json
import sys

import tolerances


def step_losses(rundir):
    with open(f"{rundir}/rank0.jsonl") as events:
        return [e["loss"] for e in map(json.loads, events) if e["kind"] == "step" and e["micro"] == -1]


def bf16_gradients_per_tensor(run_grads, reference_grads):
    """The number of tensors whose step-1 gradient L1 difference exceeds 2 x tolerances.bf16_sum_over_ranks_l1 of
    the run's local gradient L1 (local_grad_l1.json), printing the worst ratio and every failure."""
    ours = tolerances.read_safetensors(f"{run_grads}/model.safetensors")
    reference = tolerances.read_safetensors(f"{reference_grads}/model.safetensors")
    with open(f"{run_grads}/local_grad_l1.json") as file:
        local = json.load(file)
    failed, worst, worst_name = 0, 0.0, ""
    for name, values in reference.items():
        difference = sum(abs(a - b) for a, b in zip(ours[name], values))
        bound = 2.0 * tolerances.bf16_sum_over_ranks_l1(local["local_grad_l1"][name], local["world"])
        ratio = difference / bound if bound > 0 else (0.0 if difference == 0 else float("inf"))
        if not ratio <= 1.0:
            failed += 1
            print(f"FAIL: {name}: step-1 gradient L1 difference {difference:.4e} exceeds {bound:.4e}")
        if ratio > worst:
            worst, worst_name = ratio, name
    print(f"step-1 gradients per tensor: worst difference / bound {worst:.3f} ({worst_name}), {failed} over")
    return failed


def main(reference_dir, run_dir, tokens, seq, lr, mode="fp32"):
    reference, run = step_losses(reference_dir), step_losses(run_dir)
    if not reference or len(reference) != len(run):
        print(f"FAIL: {len(reference)} steps in {reference_dir}, {len(run)} in {run_dir}")
        return 1
    config = tolerances.load_config(f"{reference_dir}/grads/config.json")
    if mode == "bf16":
        rounding = tolerances.torch_bf16_loss_tolerance(config, int(tokens), int(seq))
        allowance, difference, gross = tolerances.torch_bf16_drift(f"{run_dir}/grads", f"{reference_dir}/grads",
                                                                   float(lr))
        print(f"step-1 gradients: sum |difference| = {difference:.4e}, gross bound {gross:.4e}")
        if not difference <= gross:
            print(f"FAIL: the step-1 gradients differ by more than twice the bfloat16 reduce's error bound")
            return 1
        # Per tensor too, since both runs are fsdplab's (the same rounding rules everywhere, the tied embedding's
        # included, unlike torch): each tensor's L1 difference under twice its own bfloat16 reduce error bound. A
        # wrong gradient in one tensor (a layer's RoPE backward reading cos for sin: 24x its bound) hides in the sum
        # over the model; the emulated device's correct one stays at 0.11 of it (check-cuda-emulated, MP=bf16, 2
        # ranks).
        failed = bf16_gradients_per_tensor(f"{run_dir}/grads", f"{reference_dir}/grads")
        if failed:
            return 1
    elif mode == "fp32":
        rounding = tolerances.loss_tolerance(config, int(tokens), int(seq))
        allowance = tolerances.later_loss_allowance(
            tolerances.read_safetensors(f"{run_dir}/grads/model.safetensors"),
            tolerances.read_safetensors(f"{reference_dir}/grads/model.safetensors"), float(lr))
    else:
        print(f"FAIL: mode {mode!r}: fp32 or bf16")
        return 2
    print(f"bound: {rounding:.2e} x loss (rounding) + (step - 1) x {allowance:.2e} (AdamW drift)")
    failed = 0
    for step, (a, b) in enumerate(zip(run, reference), 1):
        bound = rounding * abs(b) + (step - 1) * allowance
        ok = abs(a - b) <= bound  # False for a NaN on either side
        failed += not ok
        print(f"step {step}: {a:.7f} vs {b:.7f}: |difference| {abs(a - b):.2e}, bound {bound:.2e} "
              f"{'' if ok else 'FAIL'}")
    print(f"{'FAIL' if failed else 'OK'}: {failed} of {len(run)} steps outside the bound")
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) not in (6, 7):
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(*sys.argv[1:]))
