"""fsdplab's AdamW (core/fsdp/optim.c) against torch.optim.AdamW(foreach=False), through tests/bin/adamw_tool.

Random params and 5 steps of random gradients (fixed seed, an odd n so nothing lines up with a vector width), with
torch's defaults and with a non-default lr, betas, eps and weight_decay: after the steps, param, exp_avg and
exp_avg_sq must match torch's to max|ours - torch| / max|torch| <= TOLERANCE, derived below.

usage: python3 tests/test_adamw_parity.py      (after `make tests/bin/adamw_tool`; ADAMW_TOOL=<path> overrides it)
Prints OK / FAIL per check with the measured error; exits 0 when all pass, 1 otherwise, 77 when torch or safetensors
is missing.
"""
import os
import subprocess
import sys
import tempfile
from pathlib import Path

try:
    import torch
    from safetensors.torch import load_file, save_file
except ImportError as error:
    print(f"skipped: {error}")
    sys.exit(77)

ROOT = Path(__file__).resolve().parent.parent
TOOL = Path(os.environ.get("ADAMW_TOOL", ROOT / "tests/bin/adamw_tool"))
# The update is element-wise (no sums, no BLAS: nothing depends on the CPU's kernels or on the tensor's size). Per
# element and step, each side rounds at most 4 times on the way to each of param, exp_avg and exp_avg_sq (decay
# multiply, lerp's difference and fused multiply-add, addcmul, the update's multiply, divide and add); so after
# STEPS steps the two differ by at most 2 sides x 4 roundings x STEPS x u relative to the tensor's max (earlier
# differences only shrink: the moments decay by beta, the parameter by 1 - lr wd). 40 u = 2.4e-6. Measured: the
# moments bit-identical, param 3.3e-8; a wrong bias correction or eps placement is off by more than 1e-3.
UNIT_ROUNDOFF = 2.0 ** -24
STEPS = 5
TOLERANCE = 2 * 4 * STEPS * UNIT_ROUNDOFF
NUMEL = 1001

# name, AdamW keyword arguments (lr, weight_decay always passed to the tool; betas and eps when not torch's)
CASES = [
    ("defaults", dict(lr=1e-3, weight_decay=1e-2)),
    ("lr 3e-2, weight_decay 0.1", dict(lr=3e-2, weight_decay=0.1)),
    ("lr 5e-3, weight_decay 0, betas (0.8, 0.95), eps 1e-6",
     dict(lr=5e-3, weight_decay=0.0, betas=(0.8, 0.95), eps=1e-6)),
    ("beta1 0.3 (lerp's other branch)", dict(lr=1e-2, weight_decay=0.05, betas=(0.3, 0.99))),
]

failures = []


def report(ok, text):
    print(f"{'OK  ' if ok else 'FAIL'} {text}")
    if not ok:
        failures.append(text)


def torch_adamw(param, grads, options):
    """torch's single-tensor AdamW on a leaf tensor; returns param, exp_avg, exp_avg_sq after len(grads) steps."""
    weight = torch.nn.Parameter(param.clone())
    optimizer = torch.optim.AdamW([weight], foreach=False, **options)
    for grad in grads:
        weight.grad = grad.clone()
        optimizer.step()
    state = optimizer.state[weight]
    return weight.detach(), state["exp_avg"], state["exp_avg_sq"]


def tool_adamw(scratch, param, grads, options):
    inputs = {"param": param, **{f"grad.{i}": grad for i, grad in enumerate(grads)}}
    save_file(inputs, str(scratch / "in.safetensors"))
    betas = options.get("betas", (0.9, 0.999))
    command = [str(TOOL), str(scratch / "in.safetensors"), str(scratch / "out.safetensors"),
               repr(options["lr"]), repr(options["weight_decay"]), repr(betas[0]), repr(betas[1]),
               repr(options.get("eps", 1e-8))]
    result = subprocess.run(command, env={**os.environ, "OUT": str(scratch / "tool_out")},
                            capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise RuntimeError(f"`{' '.join(command)}` exited {result.returncode}: "
                           f"{(result.stderr or result.stdout).strip()[-500:]}")
    out = load_file(str(scratch / "out.safetensors"))
    return out["param"], out["exp_avg"], out["exp_avg_sq"]


def relative_error(ours, theirs):
    scale = theirs.abs().max().item()
    return (ours.double() - theirs.double()).abs().max().item() / (scale if scale > 0 else 1.0)


def main():
    if not TOOL.exists():
        print(f"FAIL {TOOL} is not built (make tests/bin/adamw_tool)")
        return 1
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(20240607)
    param = torch.randn(NUMEL, generator=generator, dtype=torch.float32)
    # Gradients over several magnitudes, so the second moment and eps both matter somewhere.
    magnitudes = torch.logspace(-6, 1, NUMEL)
    grads = [torch.randn(NUMEL, generator=generator) * magnitudes[torch.randperm(NUMEL, generator=generator)]
             for _ in range(STEPS)]
    worst = 0.0
    with tempfile.TemporaryDirectory(prefix="adamw_parity_") as directory:
        scratch = Path(directory)
        for name, options in CASES:
            expected = torch_adamw(param, grads, options)
            try:
                got = tool_adamw(scratch, param, grads, options)
            except RuntimeError as error:
                report(False, f"{name}: {error}")
                continue
            for tensor_name, ours, theirs in zip(("param", "exp_avg", "exp_avg_sq"), got, expected):
                error = relative_error(ours, theirs)
                worst = max(worst, error)
                report(error <= TOLERANCE, f"{name}: {tensor_name} after {STEPS} steps on {NUMEL} floats: "
                                           f"max|ours - torch| / max|torch| = {error:.3e} (limit {TOLERANCE:.1e})")
    print(f"adamw parity: worst relative max error {worst:.3e}; "
          f"{'all passed' if not failures else f'{len(failures)} failed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
