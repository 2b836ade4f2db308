#!/usr/bin/env python3
"""check-08: what lab 08 teaches, from the events of a HYBRID_SHARD run and from lab 08's own output.

    python3 tests/check_lab08.py traffic RUNDIR CONFIG_JSON SHARD_GROUP REDUCTIONS_PER_STEP STEPS [ELEMENT_BYTES]
    python3 tests/check_lab08.py lab RUNDIR LOG

traffic: RUNDIR holds rank<R>.jsonl of a lab 05 run with STRATEGY=HYBRID_SHARD or _HYBRID_SHARD_ZERO2. The bytes each
rank sends across groups are derived here from the model's config alone, not from the events: each FSDP unit (the
root: embedding + final norm, untied lm_head too; one per decoder layer) is a FlatParameter of numel parameters,
padded to a multiple of S = SHARD_GROUP and cut into shards of padded / S floats; after each gradient reduction (ACC
per step, 1 with NO_SYNC: REDUCTIONS_PER_STEP) the shard is all-reduced across the replicate group of R = W / S
ranks, which under a ring moves 2 (R-1)/R of the shard each way (core/comm/comm.c, EVENTS.md: the product in double,
truncated to bytes), in ELEMENT_BYTES per element: 4 (float32), 2 when the gradients reduce in bfloat16 (MP=bf16: the
all-reduce's event must then say dtype bfloat16). So per rank: replicate-group bytes = STEPS x REDUCTIONS x sum over \
units of that, exactly; and
every other collective runs in this rank's shard group (ranks S*i .. S*i + S-1), none in the world or across.

lab: LOG is lab 08's output, RUNDIR its events. Every mode's memory model is exact; HYBRID_SHARD's sharded state
is W/S times FULL_SHARD's (shards of 1/S instead of 1/W); the most a rank sends across nodes is less under
HYBRID_SHARD than under FULL_SHARD; the trace names the groups (slices "all_reduce (replicate)" with group_ranks).
"""
import json
import os
import re
import sys
from collections import defaultdict


def unit_numels(config):
    """The FlatParameters' unpadded sizes, as core/models/qwen2.c registers the parameters
    (transformer_auto_wrap_policy)."""
    C, I, V = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim", C // heads)
    q, kv = heads * head_dim, kv_heads * head_dim
    attention = (C * q + q) + 2 * (C * kv + kv) + q * C  # q, k, v with biases; o without
    mlp = 3 * C * I  # gate, up, down
    layer = attention + mlp + 2 * C  # two RMSNorms
    root = V * C + C + (0 if config.get("tie_word_embeddings", True) else V * C)
    return [root] + [layer] * config["num_hidden_layers"]


def ring_all_reduce_bytes(count, size, element_bytes=4):
    return int(2.0 * (size - 1) / size * count * element_bytes)


def traffic(rundir, config_path, shard_group, reductions, steps, element_bytes=4):
    config = json.load(open(config_path))
    ranks = sorted(int(m.group(1)) for m in (re.match(r"rank(\d+)\.jsonl$", f) for f in os.listdir(rundir)) if m)
    world, S = len(ranks), shard_group
    R = world // S
    shards = [-(-numel // S) for numel in unit_numels(config)]  # padded to a multiple of S, over S
    per_step = reductions * sum(ring_all_reduce_bytes(shard, R, element_bytes) for shard in shards)
    expected = steps * per_step
    expected_count = steps * reductions * len(shards)
    problems = []
    for rank in ranks:
        sent, received, count, by_group = 0, 0, 0, defaultdict(int)
        shard_members = list(range(rank // S * S, rank // S * S + S))
        replicate_members = list(range(rank % S, world, S))
        for line in open(f"{rundir}/rank{rank}.jsonl"):
            event = json.loads(line)
            if event["kind"] != "collective":
                continue
            group = event.get("group", "world")
            by_group[group] += 1
            members = event.get("group_ranks", list(range(world)))
            wanted = {"shard": shard_members, "replicate": replicate_members}.get(group)
            if wanted is None or members != wanted:
                problems.append(f"rank {rank}: {event['op']} seq {event['seq']} ran in group {group} {members}, "
                                f"expected the shard group {shard_members} or the replicate group {replicate_members}")
            if group == "replicate":
                dtype = "bfloat16" if element_bytes == 2 else "float32"
                if event["op"] != "all_reduce" or event.get("reduce") != "avg" or event.get("dtype", dtype) != dtype:
                    problems.append(f"rank {rank}: seq {event['seq']}: {event['op']} ({event.get('reduce')}) across "
                                    f"the replicate group, expected the gradient shard's all_reduce (avg)")
                sent += event["bytes_sent"]
                received += event["bytes_recv"]
                count += 1
        print(f"rank {rank}: {dict(by_group)} collectives; across groups sent {sent} B, received {received} B in "
              f"{count} all-reduces; expected {expected} B in {expected_count} ({steps} steps x {reductions} x "
              f"units {shards} floats per shard, R = {R})")
        if (sent, received, count) != (expected, expected, expected_count):
            problems.append(f"rank {rank}: across groups {sent} B sent / {received} B received in {count} "
                            f"collectives, expected {expected} B each way in {expected_count}")
    for problem in problems[:20]:
        print("FAIL:", problem)
    print(f"{'FAIL' if problems else 'OK'}: {len(ranks)} ranks, {world // S} x {S} mesh, {len(problems)} problems")
    return 1 if problems else 0


def lab(rundir, log):
    text = open(log).read()
    problems = []
    rows = re.findall(r"^  (\S+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)   (exact|off by .+)$", text, re.M)
    if not rows:
        problems.append("no memory table in the output")
    sharded = defaultdict(dict)
    for mode, rank, shard_mb, _, _, model in rows:
        sharded[mode][int(rank)] = float(shard_mb)
        if model != "exact":
            problems.append(f"{mode} rank {rank}: memory model {model}")
    mesh = re.search(r"^Ranks = (\d+) as (\d+) shard groups of (\d+)", text, re.M)
    if not mesh:
        problems.append("no 'Ranks = W as R shard groups of S' line")
    else:
        world, _, shard = map(int, mesh.groups())
        for rank, full in sharded.get("FULL_SHARD", {}).items():
            hybrid = sharded.get("HYBRID_SHARD", {}).get(rank)
            # printed to 0.01 MB: the ratio holds within the two printings' rounding (padding adds < S floats)
            if hybrid is None or abs(hybrid - full * world / shard) > 0.01 * (1 + world / shard):
                problems.append(f"rank {rank}: HYBRID_SHARD's sharded state {hybrid} MB, expected {world}/{shard} x "
                                f"FULL_SHARD's {full} MB")
    most = dict(re.findall(r"^  (\S+)\s+[\d.]+ total\s+([\d.]+) most$", text, re.M))
    if "FULL_SHARD" not in most or "HYBRID_SHARD" not in most:
        problems.append("no 'across nodes per step' table")
    elif not float(most["HYBRID_SHARD"]) < float(most["FULL_SHARD"]):
        problems.append(f"HYBRID_SHARD sends {most['HYBRID_SHARD']} MB across nodes from one rank, FULL_SHARD "
                        f"{most['FULL_SHARD']} MB: hybrid should send less")
    names = set()
    groups = set()
    for event in json.load(open(f"{rundir}/trace.json"))["traceEvents"]:
        if event.get("ph") == "X" and event.get("cat") == "comm":
            names.add(event["name"])
            args = event.get("args", {})
            groups.add((args.get("group"), args.get("group_ranks")))
    for name in ("all_gather (shard)", "reduce_scatter (shard)", "all_reduce (replicate)", "all_gather"):
        if name not in names:
            problems.append(f"trace.json: no collective slice named '{name}' (names: {sorted(names)})")
    print(f"trace.json groups: {sorted(groups, key=str)}")
    for problem in problems:
        print("FAIL:", problem)
    print(f"{'FAIL' if problems else 'OK'}: {len(rows)} memory rows, across nodes (most) {most}")
    return 1 if problems else 0


if __name__ == "__main__":
    if len(sys.argv) in (7, 8) and sys.argv[1] == "traffic":
        sys.exit(traffic(sys.argv[2], sys.argv[3], *map(int, sys.argv[4:])))
    if len(sys.argv) == 4 and sys.argv[1] == "lab":
        sys.exit(lab(sys.argv[2], sys.argv[3]))
    sys.exit(__doc__)
