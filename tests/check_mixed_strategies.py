"""check-07: mixed precision under the strategies that reduce otherwise — NO_SHARD (all-reduce), HYBRID_SHARD
(reduce-scatter in the shard group, then all-reduce across the replicate group) — and with CPU offload, from lab 05's
GRADS and events.

  python3 tests/check_mixed_strategies.py grads FP32_REDUCE_GRADS BF16_REDUCE_GRADS
      The same run with MP=bf16,reduce=fp32 and with MP=bf16: the local gradients are the same bits (the same
      bfloat16 forward and backward), so the step-1 gradients differ only by the reduction's bfloat16 rounding: per
      tensor within tolerances.bf16_reduction_l1 of the levels the run reduced over (local_grad_l1.json). The two
      runs' sums of |local gradient| must be equal (else the local computations differed and the bound is void).
  python3 tests/check_mixed_strategies.py no_shard RUNDIR CONFIG_JSON REDUCTIONS STEPS
      NO_SHARD with MP=bf16: every collective is a world all_reduce (avg) of one unit's whole gradient in bfloat16:
      count = the unit's parameters (NO_SHARD pads nothing), bytes = 2 x count, ring traffic 2 (N-1)/N of that each
      way (EVENTS.md: the product in double, truncated); REDUCTIONS per step for each unit, nothing else.
  python3 tests/check_mixed_strategies.py copies RUNDIR
      CPU offload with MP=bf16: one h2d copy before each all-gather, of the float32 shard (torch's
      `_local_shard.to(device)`, cast to bfloat16 there): 4 bytes x the bfloat16 all-gather's count / its group's
      size; one d2h copy after each gradient reduction, of the float32 gradient shard (the reduce_dtype result cast
      back on the device, as torch's _accumulate_sharded_grad): 4 bytes x the reduce-scatter's count / group size.
"""
import json
import os
import re
import sys
from collections import defaultdict

import tolerances
from check_lab08 import unit_numels


def grads(fp32_dir, bf16_dir):
    reference = tolerances.read_safetensors(f"{fp32_dir}/model.safetensors")
    run = tolerances.read_safetensors(f"{bf16_dir}/model.safetensors")
    local = json.load(open(f"{bf16_dir}/local_grad_l1.json"))
    local_reference = json.load(open(f"{fp32_dir}/local_grad_l1.json"))
    problems = []
    if (local["reduce_dtype"], local_reference["reduce_dtype"]) != ("bfloat16", "float32"):
        problems.append(f"reduce_dtype {local['reduce_dtype']} vs {local_reference['reduce_dtype']}: expected bfloat16 "
                        f"vs float32")
    if local["local_grad_l1"] != local_reference["local_grad_l1"] or local["levels"] != local_reference["levels"]:
        problems.append("the two runs' local gradients differ (sum |t_r| or levels): not the same local computation")
    worst = 0.0
    for name, g in reference.items():
        difference = sum(abs(a - b) for a, b in zip(run[name], g))
        bound = tolerances.bf16_reduction_l1(local["local_grad_l1"][name], local["levels"])
        worst = max(worst, difference / bound if bound else float("inf"))
        ok = difference <= bound
        if not ok:
            problems.append(f"{name}: ||g_bf16 - g_fp32||_1 {difference:.3e} > bound {bound:.3e}")
        print(f"{name:55s} ||dg||_1 {difference:.3e}  bound {bound:.3e} {'' if ok else 'FAIL'}")
    for problem in problems:
        print("FAIL:", problem)
    print(f"{'FAIL' if problems else 'OK'}: levels {local['levels']}: bfloat16 reduction vs float32 within the bound "
          f"of its rounding; largest difference / bound {worst:.3f}")
    return 1 if problems else 0


def ranks_of(rundir):
    return sorted(int(m.group(1)) for m in (re.match(r"rank(\d+)\.jsonl$", f) for f in os.listdir(rundir)) if m)


def events_of(rundir, rank):
    with open(f"{rundir}/rank{rank}.jsonl") as file:
        return [json.loads(line) for line in file]


def no_shard(rundir, config_path, reductions, steps):
    numels = unit_numels(json.load(open(config_path)))
    ranks = ranks_of(rundir)
    world = len(ranks)
    problems = []
    for rank in ranks:
        seen = defaultdict(int)
        for event in events_of(rundir, rank):
            if event["kind"] != "collective":
                continue
            op, count = event["op"], event["count"]
            expected_sent = int(2.0 * (world - 1) / world * count * 2)
            if op != "all_reduce" or event.get("group", "world") != "world" or event.get("reduce") != "avg" or \
                    event.get("dtype") != "bfloat16" or event["bytes"] != 2 * count or \
                    event["bytes_sent"] != expected_sent or event["bytes_recv"] != expected_sent:
                problems.append(f"rank {rank} seq {event['seq']}: {op} of {count} {event.get('dtype')} in "
                                f"{event.get('group', 'world')} ({event.get('reduce')}), {event['bytes']} B, sent "
                                f"{event['bytes_sent']} B: expected a world all_reduce (avg) in bfloat16, 2 x count "
                                f"bytes, {expected_sent} B sent")
            seen[count] += 1
        expected = defaultdict(int)
        for numel in numels:
            expected[numel] += steps * reductions
        print(f"rank {rank}: all_reduce counts {dict(seen)}; expected {dict(expected)}")
        if seen != expected:
            problems.append(f"rank {rank}: all-reduces by count {dict(seen)}, expected {dict(expected)}")
    for problem in problems[:20]:
        print("FAIL:", problem)
    print(f"{'FAIL' if problems else 'OK'}: NO_SHARD MP=bf16 on {world} ranks: {len(problems)} problems")
    return 1 if problems else 0


def copies(rundir):
    problems = []
    checked = 0
    for rank in ranks_of(rundir):
        copies, gathers, reduces = defaultdict(list), defaultdict(list), defaultdict(list)
        for event in events_of(rundir, rank):
            if event["kind"] == "copy":
                copies[(event["direction"], event["unit"])].append(event)
            elif event["kind"] == "collective" and event["op"] == "all_gather":
                gathers[event["unit"]].append(event)
            elif event["kind"] == "collective" and event["op"] == "reduce_scatter":
                reduces[event["unit"]].append(event)
        if not gathers or not reduces:
            problems.append(f"rank {rank}: no all-gather or reduce-scatter")
        for kind, direction, collectives_by_unit in (("all-gather", "h2d", gathers),
                                                     ("reduce-scatter", "d2h", reduces)):
            for unit, collectives in collectives_by_unit.items():
                moved = copies[(direction, unit)]
                # the model's construction moves each shard to the host once (flat_param_offload_params):
                # d2h before step 1
                if direction == "d2h":
                    moved = moved[len(moved) - len(collectives):] if len(moved) >= len(collectives) else moved
                if len(moved) != len(collectives):
                    problems.append(f"rank {rank} {unit}: {len(moved)} {direction} copies for {len(collectives)} "
                                    f"{kind}s")
                low = [collective for collective in collectives if collective.get("dtype") == "bfloat16"]
                if not low or (direction == "d2h" and len(low) != len(collectives)):
                    problems.append(f"rank {rank} {unit}: {len(low)} of {len(collectives)} {kind}s in bfloat16")
                for copy, collective in zip(moved, collectives):
                    # float32 either way: the bfloat16 gathers' h2d (cast on the device), the checkpoint's float32
                    # gathers at SAVE (the master, unshard in full precision), the gradient cast back before its d2h
                    checked += 1
                    shard = collective["count"] // collective.get("group_size", len(ranks_of(rundir)))
                    if copy["bytes"] != 4 * shard:
                        problems.append(f"rank {rank} {unit}: {direction} of {copy['bytes']} B beside a {kind} of "
                                        f"{collective['count']} {collective.get('dtype')} in a group of "
                                        f"{collective.get('group_size')}: expected 4 x {shard} B")
    for problem in problems[:20]:
        print("FAIL:", problem)
    print(f"{'FAIL' if problems else 'OK'}: {checked} copies of float32 shards beside bfloat16 collectives; "
          f"{len(problems)} problems")
    return 1 if problems else 0


def main(argv):
    if len(argv) == 4 and argv[1] == "grads":
        return grads(argv[2], argv[3])
    if len(argv) == 6 and argv[1] == "no_shard":
        return no_shard(argv[2], argv[3], int(argv[4]), int(argv[5]))
    if len(argv) == 3 and argv[1] == "copies":
        return copies(argv[2])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
