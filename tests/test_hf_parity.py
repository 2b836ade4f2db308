"""fsdplab's Qwen2 against HF transformers' Qwen2ForCausalLM, through tests/bin/qwen2_tool.

  1. A small GQA model, initialised (a) by HF and (b) by fsdplab: our logits, loss and every gradient must match
     HF's (forward + loss.backward(), fp32) within the bounds tests/tolerances.py derives (about 3e-4 here,
     relative to each tensor's max); HF must load our checkpoint as-is,
     and our initialisation must have HF's statistics.
  2. `params qwen2-0.5b` and 3. `params tiny`: the same names, order and shapes as HF's named_parameters().

usage: python3 tests/test_hf_parity.py      (after `make tests/bin/qwen2_tool`)
Prints OK / FAIL per check and a closing line; exits 0 when all pass, 1 otherwise, 77 when torch, transformers
or safetensors is missing.
"""
import json
import math

import tolerances
import os
import subprocess
import sys
import tempfile
from itertools import zip_longest
from pathlib import Path

try:
    import torch
    import torch.nn.functional as F
    import transformers
    from safetensors.torch import load_file
    from transformers import Qwen2Config, Qwen2ForCausalLM
except ImportError as error:
    print(f"skipped: {error}")
    sys.exit(77)

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "tests/bin/qwen2_tool"
# Tolerances: tests/tolerances.py derives them from float32 rounding (per output: logits, loss, gradients), for the
# SMALL config and this batch; torch's kernels and OpenBLAS's sum in different orders, as two CPUs do.
IGNORE = -100
INIT_STD = 0.02

SMALL = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64, rope_theta=1e6, rms_norm_eps=1e-6,
             tie_word_embeddings=True)
QWEN2_0_5B = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                  num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1e6,
                  rms_norm_eps=1e-6, tie_word_embeddings=True)
BATCH, SEQ = 2, 13  # an odd T, so nothing happens to line up with a power of two
INTERIOR_IGNORED = [(0, 4), (1, 9)]  # (row, position) of targets set to IGNORE besides each row's last

failures = []


def report(ok, text):
    print(f"{'OK  ' if ok else 'FAIL'} {text}")
    if not ok:
        failures.append(text)


class ToolError(Exception):
    pass


def tool(scratch, *args):
    """Runs qwen2_tool (an MPI singleton) with its trace files in scratch; returns stdout."""
    if not TOOL.exists():
        raise ToolError(f"{TOOL.relative_to(ROOT)} is not built (make tests/bin/qwen2_tool)")
    command = [str(TOOL), *map(str, args)]
    result = subprocess.run(command, env={**os.environ, "OUT": str(scratch / "tool_out")},
                            capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise ToolError(f"`qwen2_tool {' '.join(command[1:])}` exited {result.returncode}: "
                        f"{(result.stderr or result.stdout).strip()[-500:]}")
    return result.stdout


def small_config():
    return Qwen2Config(**SMALL, attn_implementation="eager", dtype=torch.float32)


def make_batch():
    """Random tokens; targets[b][t] is the token to predict at t (our tool's convention, already shifted)."""
    generator = torch.Generator().manual_seed(1234)
    input_ids = torch.randint(0, SMALL["vocab_size"], (BATCH, SEQ), generator=generator)
    targets = torch.full_like(input_ids, IGNORE)
    targets[:, :-1] = input_ids[:, 1:]
    for row, position in INTERIOR_IGNORED:
        targets[row, position] = IGNORE
    # HF shifts labels inside its loss: logits at t are scored against labels[t + 1], the last position against
    # nothing. So labels[t + 1] = targets[t], i.e. input_ids with position t + 1 set to IGNORE for every ignored
    # interior target t; labels[:, 0] is never read.
    labels = input_ids.clone()
    labels[:, 1:] = targets[:, :-1]
    return input_ids, targets, labels


def hf_forward_backward(label, model, batch):
    input_ids, targets, labels = batch
    model.zero_grad()
    output = model(input_ids=input_ids, labels=labels)
    output.loss.backward()
    manual = F.cross_entropy(output.logits.reshape(-1, model.config.vocab_size), targets.reshape(-1),
                             ignore_index=IGNORE)
    # The same cross-entropies, summed in two orders: 2 (n - 1) u apart at most.
    report(torch.allclose(output.loss, manual, rtol=tolerances.sum_of_positives_tolerance(target_count()), atol=0),
           f"{label}: HF loss with labels {output.loss.item():.6f} == cross-entropy over our targets "
           f"{manual.item():.6f}")
    expected = {"logits": output.logits.detach(), "loss": output.loss.detach().reshape(1)}
    expected.update({f"grad/{name}": parameter.grad for name, parameter in model.named_parameters()})
    return expected


def run_ours(scratch, model_dir, batch):
    input_ids, targets, _ = batch
    batch_path, out_path = scratch / "batch.json", scratch / "out.safetensors"
    batch_path.write_text(json.dumps({"input_ids": input_ids.tolist(), "targets": targets.tolist()}))
    tool(scratch, "run", model_dir, batch_path, out_path)
    return load_file(out_path)


def relative_max_error(ours, reference):
    return ((ours - reference).abs().max() / max(reference.abs().max().item(), 1e-12)).item()


def target_count():
    return BATCH * (SEQ - 1) - len(INTERIOR_IGNORED)


def tolerance_of(name):
    """The derived bound for one output of `qwen2_tool run` against HF (see tests/tolerances.py)."""
    if name == "logits":
        return tolerances.logit_tolerance(SMALL, SEQ)
    if name == "loss":
        return tolerances.loss_tolerance(SMALL, target_count(), SEQ)
    return tolerances.gradient_tolerance(SMALL, target_count(), SEQ)


def compare_outputs(label, ours, expected):
    missing, extra = sorted(set(expected) - set(ours)), sorted(set(ours) - set(expected))
    report(not missing and not extra, f"{label}: output tensors {len(ours)}, expected {len(expected)}"
           + (f"; missing {missing}" if missing else "") + (f"; unexpected {extra}" if extra else ""))
    for name, reference in expected.items():
        if name not in ours:
            continue
        if ours[name].shape != reference.shape:
            report(False, f"{label}: {name} shape {list(ours[name].shape)}, HF {list(reference.shape)}")
            continue
        error, limit = relative_max_error(ours[name], reference), tolerance_of(name)
        report(error <= limit, f"{label}: {name} rel max err {error:.2e} (limit {limit:.1e})")


def check_hf_initialised(scratch):
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(small_config())
    # HF initialises biases to 0 and norm weights to 1, which would hide a missing bias add or norm scale;
    # every 1-D parameter is one of those.
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.ndim == 1:
                parameter.add_(0.1 * torch.randn_like(parameter))
    model_dir = scratch / "hf_initialised"
    model.save_pretrained(model_dir, safe_serialization=True)
    batch = make_batch()
    compare_outputs("1a HF-initialised", run_ours(scratch, model_dir, batch),
                    hf_forward_backward("1a HF-initialised", model, batch))


def check_loads_exactly(model, info, stored):
    problems = {kind: sorted(keys) for kind, keys in info.items() if keys}
    report(not problems, f"1b HF loads our checkpoint: {problems or 'no missing/unexpected/mismatched keys'}")
    # transformers 5 keeps rope_theta in rope_parameters, whichever way config.json spells it.
    loaded = {key: model.config.rope_parameters["rope_theta"] if key == "rope_theta" else getattr(model.config, key)
              for key in SMALL}
    differing = {key: f"{value} (asked {SMALL[key]})" for key, value in loaded.items() if value != SMALL[key]}
    report(not differing, f"1b our config.json, as HF reads it, has the asked-for {', '.join(SMALL)}"
           + (f"; differ: {differing}" if differing else ""))
    parameters = dict(model.named_parameters())
    report(set(stored) == set(parameters) and all(t.dtype == torch.float32 for t in stored.values()),
           f"1b model.safetensors holds exactly the {len(parameters)} parameters, all F32")
    # Bit patterns, so -0.0 vs 0.0 or a rounding on load would show.
    differing = [name for name, tensor in stored.items() if name in parameters and not torch.equal(
        tensor.view(torch.int32), parameters[name].detach().view(torch.int32))]
    report(not differing, "1b HF's loaded weights equal the file's bytes"
           + (f"; differ: {differing}" if differing else ""))


def check_init_statistics(stored):
    matrices = [tensor for tensor in stored.values() if tensor.ndim == 2]
    pooled = torch.cat([tensor.flatten() for tensor in matrices])
    mean, std = pooled.mean().item(), pooled.std().item()
    report(abs(mean) <= 0.05 * INIT_STD and abs(std / INIT_STD - 1) <= 0.05,
           f"1b init: {len(matrices)} weight matrices ({pooled.numel()} values) mean {mean:.2e}, "
           f"std {std:.5f} (HF: normal, std {INIT_STD}, within 5%)")
    # Per matrix within 5 standard errors of the estimate, so one badly initialised matrix shows.
    outliers = [name for name, tensor in stored.items() if tensor.ndim == 2 and (
        abs(tensor.mean().item()) > 5 * INIT_STD / math.sqrt(tensor.numel())
        or abs(tensor.std().item() / INIT_STD - 1) > 5 / math.sqrt(2 * tensor.numel()))]
    report(not outliers, "1b init: every weight matrix's mean and std within 5 standard errors"
           + (f"; not {outliers}" if outliers else ""))
    biases = [name for name in stored if name.endswith(".bias")]
    report(all(not stored[name].any() for name in biases), f"1b init: all {len(biases)} biases zero")
    norms = [name for name in stored if name.endswith("norm.weight")]
    report(all(bool((stored[name] == 1).all()) for name in norms), f"1b init: all {len(norms)} norm weights one")


def check_fsdplab_initialised(scratch):
    # init reads an HF-written config.json, so the tool's reader sees HF's current field names.
    config_dir, model_dir = scratch / "small_config", scratch / "fsdplab_initialised"
    small_config().save_pretrained(config_dir)
    tool(scratch, "init", config_dir / "config.json", 1, model_dir)
    model, info = Qwen2ForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager",
                                                   output_loading_info=True)
    stored = load_file(model_dir / "model.safetensors")
    check_loads_exactly(model, info, stored)
    check_init_statistics(stored)
    batch = make_batch()
    compare_outputs("1b fsdplab-initialised", run_ours(scratch, model_dir, batch),
                    hf_forward_backward("1b fsdplab-initialised", model, batch))


def parse_params(text):
    """`params` output -> ([(name, shape)], total)."""
    *rows, last = text.strip().splitlines() or [""]
    try:
        kind, total = last.split()
        if kind != "total":
            raise ValueError(f"last line {last!r}")
        return [(name, tuple(int(dim) for dim in shape.split("x"))) for name, shape in map(str.split, rows)], int(total)
    except ValueError as error:
        raise ToolError(f"params output is not '<name> <dim0>[x<dim1>]' lines then 'total <N>': {error}") from None


def compare_params(label, ours_text, config):
    ours, our_total = parse_params(ours_text)
    with torch.device("meta"):  # shapes only: no memory for 0.5B parameters
        model = Qwen2ForCausalLM(config)
    hf = [(name, tuple(parameter.shape)) for name, parameter in model.named_parameters()]
    hf_total = sum(math.prod(shape) for _, shape in hf)
    detail = ""
    if ours != hf:
        index, (mine, theirs) = next((i, pair) for i, pair in enumerate(zip_longest(ours, hf)) if pair[0] != pair[1])
        detail = f"; first difference at #{index}: ours {mine}, HF {theirs}"
    report(ours == hf, f"{label}: {len(ours)} parameters, names/order/shapes vs HF's {len(hf)}{detail}")
    listed_total = sum(math.prod(shape) for _, shape in ours)
    report(our_total == listed_total == hf_total,
           f"{label}: total {our_total} (sum of listed {listed_total}), HF {hf_total}")


def check_params_qwen2_0_5b(scratch):
    compare_params("2 params qwen2-0.5b", tool(scratch, "params", "qwen2-0.5b"), Qwen2Config(**QWEN2_0_5B))


def check_params_tiny(scratch):
    model_dir = scratch / "tiny"
    tool(scratch, "init", "tiny", 1, model_dir)
    compare_params("3 params tiny", tool(scratch, "params", "tiny"), Qwen2Config.from_pretrained(model_dir))


def main():
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    checks = [check_hf_initialised, check_fsdplab_initialised, check_params_qwen2_0_5b, check_params_tiny]
    with tempfile.TemporaryDirectory(prefix="hf_parity_") as scratch:
        for check in checks:
            try:
                check(Path(scratch))
            except ToolError as error:
                report(False, f"{check.__name__}: {error}")
    print(f"hf parity: {len(failures)} failed" if failures else "hf parity: all checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
