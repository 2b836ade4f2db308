"""fsdplab's bfloat16 compute (MP=bf16, core/kernels/layers_bf16.h) against torch's: what torch does, then the model.

  A. torch's rules. Each rule layers_bf16.h states about torch's bfloat16 ops on CPU is checked on torch itself, on
     random bfloat16 data: element-wise ops (x * scalar, a * b, a + b, silu, RMSNorm as HF's Qwen2RMSNorm, RoPE as HF's
     apply_rotary_pos_emb, softmax(dtype=float32) and the backward of each) must equal the stated formula bit for bit;
     GEMMs (Linear forward with its bias, its three gradients, repeat_kv's sum) the float32 sum rounded once, except
     where torch's own float32 summation order lands on the other side of a bfloat16 rounding boundary: at most 1 in
     1000 outputs, each one bfloat16 ulp off. The order in which autograd adds the three input gradients of ln1 (k, v,
     then q) is checked on HF's attention. If torch changes any of these, this part says which.

  B. The model. HF's Qwen2ForCausalLM cast to bfloat16 (eager attention; RoPE's inv_freq kept float32, as FSDP's
     MixedPrecision keeps buffers) against `qwen2_tool run` with MP=bf16, on the batch and config of test_hf_parity.py,
     from one init: logits, loss and every gradient. Both sides round the same tensors at the same places, so they
     differ only where a float32 value, computed in two summation orders, falls on two sides of a rounding boundary
     (a "flip": one bfloat16 ulp). The flip model: with the boundary's position uniform, the values v, v' (|v - v'| =
     delta) round apart with probability delta / ulp, so the flip's mean |size| is delta: rounding transfers the
     float32 disagreement unamplified in expectation; each flip's size is at most one ulp, 2^-8 |value| x 2. So the
     bfloat16 outputs may differ, per tensor, in L1, by the float32 pipelines' disagreement (measured here: both models
     in float32, the same init and batch) plus Bernstein's deviation of a sum of independent flips:

       ||x16 - y16||_1 <= S + lambda sqrt(S w) + lambda^2 w / 3,   S = ||x32 - y32||_1,  w = 2 u max|y16|

     (u = 2^-8, lambda = 8 as tests/tolerances.py; a flip upstream is taken to move an output by at most one ulp of
     it, the normalised network passing relative errors on with gain about 1: an assumption). A rounding torch makes
     and fsdplab skips (or the converse) is not a flip but an independent error of up to an ulp on every element of a
     tensor: far above the bound (a skipped rounding of q moves the logits' L1 by 1e3 x the unmutated difference).
     The tied embedding's gradient is where fsdplab deviates on purpose (layers_bf16.h, qwen2.c): torch on CPU adds
     each token's row in bfloat16 one at a time and rounds lm_head's share and the embedding's before adding them;
     fsdplab adds both in float32 and rounds once. Its bound adds those roundings: (k + 1) u ||g||_1, k the most
     repeated token's count.

usage: python3 tests/check_torch_bf16.py      (after `make tests/bin/qwen2_tool`)
Exit 0 when every check passes, 1 otherwise, 77 without torch or transformers.
"""
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import tolerances
# its model and batch shape, and the tool; without torch, transformers or safetensors it prints "skipped" and exits 77
from test_hf_parity import BATCH, IGNORE, ROOT, SEQ, SMALL, TOOL

import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import load_file
from transformers import Qwen2Config, Qwen2ForCausalLM
from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm, apply_rotary_pos_emb, rotate_half

BF16 = torch.bfloat16
U = tolerances.U_BF16
LAMBDA = tolerances.LAMBDA
GEMM_FLIPS = 1e-3  # the most outputs of one GEMM that torch's float32 order may round the other way (measured ~1e-4)

failures = []


def report(ok, text):
    print(f"{'OK  ' if ok else 'FAIL'} {text}")
    if not ok:
        failures.append(text)


def r(x):
    """A float32 tensor rounded to bfloat16 and widened back (exact)."""
    return x.to(BF16).float()


def bits_equal(ours, reference):
    return torch.equal(ours.float().view(torch.int32), reference.float().view(torch.int32))


def exact(label, value, formula):
    report(bits_equal(value, formula), f"A {label}: equal bit for bit"
           + ("" if bits_equal(value, formula) else f" (only {identical(value, formula):.4f} of elements)"))


def identical(a, b):
    return (a.float().reshape(-1) == b.float().reshape(-1)).float().mean().item()


def gemm_like(label, value, formula):
    """A float32 sum rounded once: equal except where torch's summation order flips the rounding, one ulp."""
    value, formula = value.float(), formula.float()
    differ = value != formula
    ulp = formula.abs() * 2 * U  # at most two bfloat16 ulps of 2^-8 |x| each side of a power of two
    one_ulp = bool(((value - formula).abs()[differ] <= ulp[differ]).all())
    share = differ.float().mean().item()
    report(share <= GEMM_FLIPS and one_ulp, f"A {label}: the float32 sum rounded once; {share:.1e} of outputs one "
           f"ulp apart (torch's summation order; at most {GEMM_FLIPS:.0e})")


def check_torch_rules():
    torch.manual_seed(0)
    x, w = torch.randn(64, 512).to(BF16), (torch.randn(96, 512) * 0.05).to(BF16)
    b = torch.randn(96).to(BF16)
    exact64 = (x.double() @ w.double().t() + b.double()).float()
    gemm_like("Linear(x) + bias", F.linear(x, w, b), r(exact64))
    a, c = torch.randn(4096).to(BF16), torch.randn(4096).to(BF16)
    exact("x * scalar (head_dim^-0.5)", a * 32 ** -0.5, r(a.float() * (32 ** -0.5)))
    exact("a * b", a * c, r(a.float() * c.float()))
    exact("a + b", a + c, r(a.float() + c.float()))
    exact("silu", F.silu(a), r(a.float() / (1 + torch.exp(-a.float()))))
    # HF's RMSNorm: weight * (x * rstd).to(bfloat16)
    norm = Qwen2RMSNorm(512, eps=1e-6).to(BF16)
    with torch.no_grad():
        norm.weight.copy_((1 + 0.1 * torch.randn(512)).to(BF16))
    h = torch.randn(64, 512).to(BF16).requires_grad_()
    y = norm(h)
    hf = h.detach().float()
    rstd = torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + 1e-6)
    exact("RMSNorm = bf16(w * bf16(x * rstd))", y, r(norm.weight.float() * r(hf * rstd)))
    dy = torch.randn(64, 512).to(BF16)
    y.backward(dy)
    dh = r(dy.float() * norm.weight.float())
    leaf = hf.clone().requires_grad_()
    (leaf * torch.rsqrt(leaf.pow(2).mean(-1, keepdim=True) + 1e-6)).backward(dh)
    exact("RMSNorm backward: dx = bf16(float32 norm backward of bf16(dy * w))", h.grad, r(leaf.grad))
    gemm_like("RMSNorm backward: dw = bf16(sum of bf16(dy * h))", norm.weight.grad,
              r(r(dy.float() * r(hf * rstd)).double().sum(0).float()))
    # RoPE: cos, sin to bfloat16, then bf16(bf16(x cos) + bf16(rotate_half(x) sin))
    q = torch.randn(2, 4, 16, 32).to(BF16).requires_grad_()
    k = torch.randn(2, 2, 16, 32).to(BF16)
    angle = torch.arange(16).float()[:, None] * (1.0 / 10000 ** (torch.arange(0, 32, 2).float() / 32))
    cos32, sin32 = torch.cat([angle, angle], -1).cos()[None], torch.cat([angle, angle], -1).sin()[None]
    q_rotated, _ = apply_rotary_pos_emb(q, k, cos32.to(BF16), sin32.to(BF16))
    qf, cos, sin = q.detach().float(), r(cos32)[:, None], r(sin32)[:, None]
    exact("RoPE = bf16(bf16(x cos) + bf16(rotate_half(x) sin))", q_rotated, r(r(qf * cos) + r(rotate_half(qf) * sin)))
    dq = torch.randn_like(q_rotated.float()).to(BF16)
    q_rotated.backward(dq)
    g = r(dq.float() * sin)
    half = g.shape[-1] // 2
    exact("RoPE backward = bf16(bf16(dy cos) + rotate_half^T(bf16(dy sin)))", q.grad,
          r(r(dq.float() * cos) + torch.cat([g[..., half:], -g[..., :half]], -1)))
    # softmax(dtype=float32).to(bfloat16): float32 probabilities; the backward float32 from them, rounded once
    s = torch.randn(16, 40).to(BF16).requires_grad_()
    p32 = F.softmax(s.detach().float(), -1)
    p = F.softmax(s, -1, dtype=torch.float32).to(BF16)
    exact("softmax(dtype=float32).to(bf16) = bf16(float32 softmax)", p, r(p32))
    dp = torch.randn(16, 40).to(BF16)
    p.backward(dp)
    exact("softmax backward = bf16(float32 backward from the float32 probabilities)", s.grad,
          r(p32 * (dp.float() - (dp.float() * p32).sum(-1, keepdim=True))))
    # SiLU(gate) * up and its backward
    gate, up = torch.randn(4096).to(BF16).requires_grad_(), torch.randn(4096).to(BF16).requires_grad_()
    out = F.silu(gate) * up
    gf, uf = gate.detach().float(), up.detach().float()
    exact("silu(gate) * up = bf16(bf16(silu(gate)) * up)", out, r(r(F.silu(gf)) * uf))
    dout = torch.randn(4096).to(BF16)
    out.backward(dout)
    sigmoid = 1 / (1 + torch.exp(-gf))
    exact("d up = bf16(dy * bf16(silu(gate)))", up.grad, r(dout.float() * r(F.silu(gf))))
    exact("d gate = bf16(bf16(dy * up) * silu'(gate))", gate.grad,
          r(r(dout.float() * uf) * sigmoid * (1 + gf * (1 - sigmoid))))
    # Linear's three gradients; repeat_kv's sum over the query heads of a key/value head
    xl, wl, bl = (t.clone().requires_grad_() for t in (x, w, b))
    yl = F.linear(xl, wl, bl)
    dyl = torch.randn_like(yl.float()).to(BF16)
    yl.backward(dyl)
    gemm_like("Linear backward: dx = bf16(dy W)", xl.grad, r((dyl.double() @ wl.detach().double()).float()))
    gemm_like("Linear backward: dW = bf16(dy^T x)", wl.grad, r((dyl.double().t() @ x.double()).float()))
    gemm_like("Linear backward: db = bf16(sum of dy)", bl.grad, r(dyl.double().sum(0).float()))
    kv = torch.randn(2, 2, 16, 32).to(BF16).requires_grad_()
    expanded = kv[:, :, None].expand(2, 2, 2, 16, 32).reshape(2, 4, 16, 32)
    dkv = torch.randn(2, 4, 16, 32).to(BF16)
    expanded.backward(dkv)
    exact("repeat_kv backward = bf16(float32 sum over the group's heads)", kv.grad,
          r(dkv.float().reshape(2, 2, 2, 16, 32).sum(2)))
    check_autograd_order()
    # The embedding's gradient on CPU: each token's row added in bfloat16, one at a time (fsdplab: float32, once)
    table = torch.randn(10, 8).to(BF16).requires_grad_()
    tokens = torch.randint(0, 10, (500,))
    rows = torch.randn(500, 8).to(BF16)
    F.embedding(tokens, table).backward(rows)
    sequential = torch.zeros(10, 8, dtype=BF16)
    for i in range(500):
        sequential[tokens[i]] += rows[i]
    exact("embedding backward (CPU) = rows added in bfloat16 in token order", table.grad, sequential)


def check_autograd_order():
    """ln1 feeds q_proj, k_proj and v_proj: autograd adds their bfloat16 input gradients as (k + v) + q."""
    config = Qwen2Config(**{**SMALL, "num_hidden_layers": 1}, attn_implementation="eager")
    attention = Qwen2ForCausalLM(config).model.layers[0].self_attn.to(BF16)
    torch.manual_seed(3)
    with torch.no_grad():
        for parameter in attention.parameters():
            parameter.normal_(0, 0.05)
    B, T, D = 2, 16, config.hidden_size // config.num_attention_heads
    ln1 = torch.randn(B, T, config.hidden_size).to(BF16).requires_grad_()
    projected = [getattr(attention, f"{name}_proj")(ln1) for name in "qkv"]
    for tensor in projected:
        tensor.retain_grad()
    q, k, v = (t.view(B, T, -1, D).transpose(1, 2) for t in projected)
    angle = torch.arange(T).float()[:, None] * torch.rand(D // 2)
    cos, sin = torch.cat([angle, angle], -1).cos()[None].to(BF16), torch.cat([angle, angle], -1).sin()[None].to(BF16)
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    mask = torch.full((T, T), torch.finfo(BF16).min, dtype=BF16).triu(1)
    from transformers.models.qwen2.modeling_qwen2 import eager_attention_forward
    out, _ = eager_attention_forward(attention, q, k, v, mask, scaling=attention.scaling)
    out.backward(torch.randn_like(out.float()).to(BF16))
    share = {name: r(t.grad.float() @ getattr(attention, f"{name}_proj").weight.float())
             for name, t in zip("qkv", projected)}
    gemm_like("autograd adds ln1's three input gradients as bf16(bf16(k + v) + q)", ln1.grad,
              r(r(share["k"] + share["v"]) + share["q"]))


def tool(scratch, *args, mp="fp32"):
    if not TOOL.exists():
        raise SystemExit(f"FAIL {TOOL.relative_to(ROOT)} is not built (make tests/bin/qwen2_tool)")
    result = subprocess.run([str(TOOL), *map(str, args)], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "OUT": str(scratch / "tool_out"), "MP": mp})
    if result.returncode != 0:
        raise SystemExit(f"FAIL qwen2_tool {' '.join(map(str, args))}: {(result.stderr or result.stdout)[-500:]}")


def hf_run(model, input_ids, targets):
    model.zero_grad()
    logits = model(input_ids=input_ids).logits
    loss = F.cross_entropy(logits.float().reshape(-1, SMALL["vocab_size"]), targets.reshape(-1), ignore_index=IGNORE)
    loss.backward()
    out = {"logits": logits.detach().float(), "loss": loss.detach().reshape(1)}
    out.update({f"grad/{name}": parameter.grad.float() for name, parameter in model.named_parameters()})
    return out


def check_model(scratch):
    config = Qwen2Config(**SMALL, attn_implementation="eager")
    config_dir, model_dir = scratch / "config", scratch / "model"
    config.save_pretrained(config_dir)
    tool(scratch, "init", config_dir / "config.json", 1, model_dir)
    # fsdplab's init has biases 0 and norm weights 1, which would hide a rounding before a norm's weight multiply
    # (bf16(dy) * 1 rounds nothing): every 1-D parameter moves off those values, as test_hf_parity's HF init does.
    model = Qwen2ForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")
    torch.manual_seed(5)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.ndim == 1:
                parameter.add_(0.1 * torch.randn_like(parameter))
    model.save_pretrained(model_dir, safe_serialization=True)
    generator = torch.Generator().manual_seed(1234)
    input_ids = torch.randint(0, SMALL["vocab_size"], (BATCH, SEQ), generator=generator)
    targets = torch.full_like(input_ids, IGNORE)
    targets[:, :-1] = input_ids[:, 1:]
    batch = scratch / "batch.json"
    batch.write_text(json.dumps({"input_ids": input_ids.tolist(), "targets": targets.tolist()}))
    ours = {}
    for mp in ("fp32", "bf16"):
        tool(scratch, "run", model_dir, batch, scratch / f"ours_{mp}.safetensors", mp=mp)
        ours[mp] = load_file(scratch / f"ours_{mp}.safetensors")
    model = Qwen2ForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")
    inv_freq = model.model.rotary_emb.inv_freq.clone()
    theirs = {"fp32": hf_run(model, input_ids, targets)}
    model = model.to(BF16)
    model.model.rotary_emb.inv_freq = inv_freq  # MixedPrecision leaves buffers in float32 (buffer_dtype None)
    theirs["bf16"] = hf_run(model, input_ids, targets)
    repeats = int(torch.bincount(input_ids.reshape(-1)).max())
    worst = 0.0
    for name, reference in theirs["bf16"].items():
        mine = ours["bf16"][name].reshape(reference.shape).float()
        if name.startswith("grad/"):
            mine = r(mine)  # the gradient as the FlatParameter casts it for the reduce
        difference = (mine - reference).abs().sum().item()
        float32 = (ours["fp32"][name].reshape(reference.shape) - theirs["fp32"][name]).abs().sum().item()
        w = 2 * U * reference.abs().max().item()
        bound = float32 + LAMBDA * math.sqrt(float32 * w) + LAMBDA ** 2 * w / 3
        if name == "grad/model.embed_tokens.weight":
            bound += (repeats + 1) * U * reference.abs().sum().item()
        if name == "loss":
            bound += tolerances.loss_tolerance(SMALL, int((targets != IGNORE).sum()), SEQ) * reference.item()
        control = (r(ours["fp32"][name].reshape(reference.shape)) - reference).abs().sum().item()
        worst = max(worst, difference / bound if bound else math.inf)
        report(difference <= bound, f"B {name}: ||ours - torch||_1 {difference:.3e} <= {bound:.3e} (float32 pipelines "
               f"{float32:.2e}; float32 compute rounded at the end: {control:.2e}; identical "
               f"{identical(mine, reference):.4f})")
    print(f"B largest difference / bound: {worst:.3f}")


def main():
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(1)
    check_torch_rules()
    with tempfile.TemporaryDirectory(prefix="fsdplab_bf16_") as directory:
        check_model(Path(directory))
    print(f"{'FAIL' if failures else 'OK'}: {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
