#!/usr/bin/env python3
"""Lab 10's layout and bytes, recomputed from the shapes alone (not from the C code's offsets).

    python3 tests/check_lab10.py layout RUNDIR   each rank's FSDP2 shard (fsdp2_shard_rank<r>.bin) equals, for every
                                                 parameter in registration order, the rows [r c, min(d0, (r+1) c))
                                                 of the full parameter (full_params.bin), then zero rows up to c,
                                                 c = ceil(d0 / W): byte for byte
    python3 tests/check_lab10.py bytes RUNDIR    in the trace, every all_gather and reduce_scatter of unit
                                                 layers.0.fsdp2 moves W x sum_p c_p row_p floats, and FSDP1's
                                                 (layers.0.fsdp1) the unit padded to a multiple of W; FSDP2's
                                                 all_gather_output is freed only after the unsharded parameters were
                                                 allocated (alive until the copy-out), its reduce_scatter_input
                                                 allocated before the gradient is freed (the copy-in)
    python3 tests/check_lab10.py collectives RUNDIR CONFIG_JSON PARAM_DTYPE REDUCE_DTYPE
                                                 lab 05 with FSDP_VERSION=2 (and MP): every all_gather and
                                                 reduce_scatter of every unit moves count = W x sum_p c_p row_p
                                                 elements, recomputed from the model's shapes (CONFIG_JSON, HF's
                                                 config.json) in Qwen2's registration order; the all_gathers in
                                                 PARAM_DTYPE, the reduce_scatters in REDUCE_DTYPE, bytes = count x
                                                 that dtype's size (2 for bfloat16). For a run without SAVE and
                                                 GRADS (which gather the float32 master and gradient)
    python3 tests/check_lab10.py post_forward RUNDIR CONFIG_JSON N PARAM_DTYPE
                                                 lab 05 with FSDP_VERSION=2 RESHARD_AFTER_FORWARD=N (torch's
                                                 reshard_after_forward=N): from the model's shapes, c'_p = (W/N) c_p
                                                 rows of each parameter per member of a group of N (the post-forward
                                                 shard: the rows of W/N ranks' shards, a narrow of the all-gather
                                                 output). Every non-root unit: each _sharded_post_forward_param_data
                                                 alloc is sum_p c'_p row_p elements of PARAM_DTYPE in param_unsharded,
                                                 freed after exactly one all_gather of the unit in group post_forward,
                                                 whose ranks are this rank's N consecutive ranks [g N, (g+1) N) and
                                                 which moves count N x sum_p c'_p row_p (bytes that x the dtype's
                                                 size, bytes_sent (N-1) x sum_p c'_p row_p x the size); every other
                                                 all_gather on the world; the root never reshards onto the group
    python3 tests/check_lab10.py prefetch RUNDIR NF NB
                                                 lab 05 with FSDP_VERSION=2 COMM_STREAMS=1 FULL_SHARD and the explicit
                                                 lists FORWARD_PREFETCH_MODULES=NF, BACKWARD_PREFETCH_MODULES=NB (no
                                                 implicit prefetch): while layer k computes forward, exactly layers
                                                 k .. k+NF are unsharded (or in flight), in backward exactly
                                                 k-NB .. k; in forward each layer's all_gather_output is kept past its
                                                 copy-out and freed just before the next layer's copy-out (torch's
                                                 all_gather_state), the last layer's once forward is done; in backward
                                                 it is freed at its own copy-out
    python3 tests/check_lab10.py save RUNDIR RANKS  lab 05's sharded checkpoints (dcp.save spans) issue no collective:
                                                 no collective event of any rank starts inside a save's span
"""
import json
import math
import struct
import sys


def load_layer(rundir):
    layer = json.load(open(f"{rundir}/layer.json"))
    world, params = layer["world"], layer["params"]
    for p in params:
        p["numel"] = math.prod(p["shape"])
        p["rows"] = p["shape"][0]
        p["row"] = p["numel"] // p["rows"]
        p["c"] = -(-p["rows"] // world)
    return world, params


def check_layout(rundir):
    world, params = load_layer(rundir)
    full = open(f"{rundir}/full_params.bin", "rb").read()
    assert len(full) == 4 * sum(p["numel"] for p in params), "full_params.bin has the wrong size"
    offset, pieces = 0, []
    for p in params:
        pieces.append(full[4 * offset:4 * (offset + p["numel"])])
        offset += p["numel"]
    zero = struct.pack("<f", 0.0)
    for rank in range(world):
        expected = b""
        for p, data in zip(params, pieces):
            first, last = min(rank * p["c"], p["rows"]), min((rank + 1) * p["c"], p["rows"])
            expected += data[4 * first * p["row"]:4 * last * p["row"]]
            expected += zero * ((p["c"] - (last - first)) * p["row"])
        got = open(f"{rundir}/fsdp2_shard_rank{rank}.bin", "rb").read()
        if got != expected:
            at = next((i for i in range(min(len(got), len(expected))) if got[i] != expected[i]), None)
            sys.exit(f"rank {rank}: shard of {len(got)} B differs from the expected rows ({len(expected)} B), "
                     f"first at byte {at}")
        empty = [p["name"] for p in params if rank * p["c"] >= p["rows"]]
        print(f"rank {rank}: {len(got)} B = its rows of {len(params)} parameters + zero padding rows"
              + (f"; no rows of {len(empty)} parameters" if empty else ""))
    print(f"OK: {world} ranks, every shard the rows [r c, min(d0, (r+1) c)) of every parameter, padding zero")


def check_bytes(rundir):
    world, params = load_layer(rundir)
    fsdp2 = 4 * world * sum(p["c"] * p["row"] for p in params)
    numel = sum(p["numel"] for p in params)
    fsdp1 = 4 * (-(-numel // world) * world)
    expected = {"layers.0.fsdp1": fsdp1, "layers.0.fsdp2": fsdp2}
    for rank in range(world):
        events = [json.loads(line) for line in open(f"{rundir}/rank{rank}.jsonl")]
        seen = {}
        for e in events:
            if e["kind"] == "collective" and e["unit"] in expected and e["op"] in ("all_gather", "reduce_scatter"):
                assert e["bytes"] == expected[e["unit"]], \
                    f"rank {rank}: {e['op']} of {e['unit']} moved {e['bytes']} B, expected {expected[e['unit']]}"
                seen[(e["unit"], e["op"])] = e["bytes"]
        assert len(seen) == 4, f"rank {rank}: expected an all_gather and a reduce_scatter of each unit, saw {seen}"

        def order(kind, owner):
            return next(i for i, e in enumerate(events) if e["kind"] == kind and e.get("owner") == owner)
        unit = "layers.0.fsdp2"
        assert order("free", f"{unit}.all_gather_output") > order("alloc", f"{unit}._full_param_padded"), \
            f"rank {rank}: all_gather_output freed before the unsharded parameters existed (no copy-out)"
        assert order("alloc", f"{unit}.reduce_scatter_input") < order("free", f"{unit}.full_grad_padded"), \
            f"rank {rank}: reduce_scatter_input allocated after the gradient was freed (no copy-in)"
    print(f"OK: {world} ranks: all_gather and reduce_scatter move {fsdp2} B = {world} x sum_p c_p row_p x 4 (FSDP2), "
          f"{fsdp1} B = the unit padded to a multiple of {world} (FSDP1)")

DTYPE_BYTES = {"float32": 4, "bfloat16": 2}


def qwen2_unit_shapes(config):
    """Each unit's parameter shapes as core/models/qwen2.c registers them (the root: the embedding, tied to the head,
    and the final norm; then one unit per decoder layer)."""
    C, I, V = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim", C // heads)
    q, kv = heads * head_dim, kv_heads * head_dim
    root = [[V, C], [C]] + ([] if config.get("tie_word_embeddings", True) else [[V, C]])
    layer = [[C], [q, C], [q], [kv, C], [kv], [kv, C], [kv], [C, q], [C], [I, C], [I, C], [C, I]]
    units = {"root": root}
    for i in range(config["num_hidden_layers"]):
        units[f"layers.{i}"] = layer
    return units


def finish(problems, failure, success):
    """Prints the first ten problems and exits with a count of them, or prints OK: success."""
    for problem in problems[:10]:
        print("FAIL:", problem)
    if problems:
        sys.exit(f"FAIL: {len(problems)} {failure}")
    print(f"OK: {success}")


def check_collectives(rundir, config_path, param_dtype, reduce_dtype):
    config = json.load(open(config_path))
    ranks = json.loads(open(f"{rundir}/rank0.jsonl").readline())["world"]
    expected = {unit: ranks * sum(-(-shape[0] // ranks) * (math.prod(shape) // shape[0]) for shape in shapes)
                for unit, shapes in qwen2_unit_shapes(config).items()}
    dtypes = {"all_gather": param_dtype, "reduce_scatter": reduce_dtype}
    seen, problems = {}, []
    for rank in range(ranks):
        for e in map(json.loads, open(f"{rundir}/rank{rank}.jsonl")):
            if e["kind"] != "collective" or e["op"] not in dtypes:
                continue
            count, dtype = expected.get(e["unit"]), dtypes[e["op"]]
            if count is None:
                problems.append(f"rank {rank}: {e['op']} of unit {e['unit']}, which the model has not (WRAP?)")
                continue
            if e["count"] != count or e["dtype"] != dtype or e["bytes"] != count * DTYPE_BYTES[dtype]:
                problems.append(f"rank {rank}: {e['op']} of {e['unit']} (seq {e['seq']}): {e['count']} {e['dtype']} "
                                f"elements, {e['bytes']} B; expected {count} {dtype}, {count * DTYPE_BYTES[dtype]} B")
            seen[(e["unit"], e["op"])] = seen.get((e["unit"], e["op"]), 0) + 1
    missing = [(unit, op) for unit in expected for op in dtypes if (unit, op) not in seen]
    if missing:
        problems.append(f"no collective for {missing}")
    finish(problems, "collectives differ from W x sum_p c_p row_p elements of the dtype",
           f"{sum(seen.values())} collectives on {ranks} ranks: all_gather {param_dtype}, reduce_scatter "
           f"{reduce_dtype}, count W x sum_p c_p row_p per unit ({', '.join(f'{u} {c}' for u, c in expected.items())})")


def check_post_forward(rundir, config_path, n, param_dtype):
    config, n, size = json.load(open(config_path)), int(n), DTYPE_BYTES[param_dtype]
    world = json.loads(open(f"{rundir}/rank0.jsonl").readline())["world"]
    assert 1 < n < world and world % n == 0, f"N={n} is not a factor of W={world} between 1 and W"
    # c'_p = (W / N) c_p: rows per group member (padding included), numel per member sum_p c'_p row_p
    member = {unit: sum(world // n * -(-shape[0] // world) * (math.prod(shape) // shape[0]) for shape in shapes)
              for unit, shapes in qwen2_unit_shapes(config).items()}
    problems, gathers = [], 0
    for rank in range(world):
        group = list(range(rank // n * n, rank // n * n + n))
        live = {}  # unit -> the post-forward shard's alloc, until its all-gather and free
        for e in map(json.loads, open(f"{rundir}/rank{rank}.jsonl")):
            owner = e.get("owner", "")
            if e["kind"] in ("alloc", "free") and owner.endswith("._sharded_post_forward_param_data"):
                unit = owner[:-len("._sharded_post_forward_param_data")]
                if e["kind"] == "alloc":
                    want = member.get(unit, -1) * size
                    if unit == "root" or e["bytes"] != want or e["category"] != "param_unsharded":
                        problems.append(f"rank {rank}: {owner} {e['bytes']} B {e['category']}; expected {want} B "
                                        f"param_unsharded (and none for the root)")
                    live[unit] = 0
                elif live.pop(unit, None) != 1:
                    problems.append(f"rank {rank}: {owner} freed without exactly one post_forward all_gather")
            if e["kind"] != "collective" or e["op"] != "all_gather":
                continue
            if e["group"] != "post_forward":
                if e["group"] != "world":
                    problems.append(f"rank {rank}: all_gather of {e['unit']} (seq {e['seq']}) in group {e['group']}")
                continue
            gathers += 1
            count = n * member.get(e["unit"], 0)
            got = (e["group_ranks"], e["count"], e["bytes"], e["bytes_sent"], e["dtype"])
            want = (group, count, count * size, (n - 1) * member.get(e["unit"], 0) * size, param_dtype)
            if got != want or live.get(e["unit"]) != 0:
                problems.append(f"rank {rank}: post_forward all_gather of {e['unit']} (seq {e['seq']}): ranks, count, "
                                f"bytes, bytes_sent, dtype {got}; expected {want}, after its post-forward shard")
            live[e["unit"]] = live.get(e["unit"], 0) + 1
        if live:
            problems.append(f"rank {rank}: post-forward shards never freed: {sorted(live)}")
    layers = [unit for unit in member if unit != "root"]
    if gathers < world * len(layers):
        problems.append(f"only {gathers} post_forward all_gathers on {world} ranks for {len(layers)} units")
    finish(problems, "post-forward shards or all-gathers differ from the shapes' c'_p = (W/N) c_p",
           f"{gathers} backward all_gathers on {world} ranks in groups of {n} consecutive ranks, each moving "
           f"N x sum_p c'_p row_p {param_dtype} elements ({', '.join(f'{u} {n * member[u]}' for u in layers[:1])} "
           f"per layer) from a post-forward shard of sum_p c'_p row_p, allocated before and freed after it")


def check_save(rundir, ranks):
    saves = 0
    for rank in range(ranks):
        events = [json.loads(line) for line in open(f"{rundir}/rank{rank}.jsonl")]
        spans = [(e["ts"], e["ts"] + e["dur"], e["name"]) for e in events
                 if e["kind"] == "compute" and e["name"].startswith("dcp.save")]
        assert spans, f"rank {rank}: no dcp.save span in the trace (CHECKPOINT_EVERY unset?)"
        for e in events:
            if e["kind"] != "collective":
                continue
            for begin, end, name in spans:
                assert not begin <= e["issue_ts"] <= end and not begin <= e["ts"] <= end, \
                    f"rank {rank}: {e['op']} of {e['unit']} (seq {e['seq']}) inside {name}"
        saves += len(spans)
    print(f"OK: {saves} saves on {ranks} ranks, no collective inside any")


def check_prefetch(rundir, nf, nb):
    nf, nb = int(nf), int(nb)
    world = json.loads(open(f"{rundir}/rank0.jsonl").readline())["world"]
    problems, computes = [], 0

    def layer(unit):
        return int(unit.split(".")[1]) if unit.startswith("layers.") else None
    for rank in range(world):
        events = [json.loads(line) for line in open(f"{rundir}/rank{rank}.jsonl")]
        layers = 1 + max(layer(e["unit"]) for e in events if e["kind"] == "state" and layer(e["unit"]) is not None)
        unsharded, phase, last_alloc, gathering = set(), "forward", None, set()
        for i, e in enumerate(events):
            if e["kind"] == "state" and e["machine"] == "ShardState" and layer(e["unit"]) is not None:
                (unsharded.add if e["to"] == "UNSHARDED" else unsharded.discard)(layer(e["unit"]))
            if e["kind"] == "compute" and e["phase"] in ("forward", "backward"):
                if phase == "backward" and e["phase"] == "forward":  # the next micro-batch
                    phase = "forward"
                phase = e["phase"] if e["phase"] == "backward" else phase
                k = layer(e["unit"])
                if k is None:
                    continue
                computes += 1
                want = set(range(k, min(k + nf, layers - 1) + 1)) if phase == "forward" else \
                    set(range(max(k - nb, 0), k + 1))
                if unsharded != want:
                    problems.append(f"rank {rank}: layers.{k} {phase}: layers {sorted(unsharded)} unsharded, "
                                    f"expected {sorted(want)}")
            owner = e.get("owner") or ""
            if e["kind"] == "alloc" and owner.endswith("._full_param_padded"):
                last_alloc = owner[:-len("._full_param_padded")]
            if owner.endswith(".all_gather_output") and layer(owner) is not None and e["kind"] in ("alloc", "free"):
                (gathering.add if e["kind"] == "alloc" else gathering.discard)(layer(owner))
            if e["kind"] != "free" or not owner.endswith(".all_gather_output") or layer(owner) is None:
                continue
            k = layer(owner)
            later = [x for x in events[i + 1:] if x["kind"] in ("alloc", "compute")]
            next_copy_out = next((x["owner"] for x in later if x["kind"] == "alloc"
                                  and x["owner"].endswith("._full_param_padded")), None)
            if phase == "backward":
                if last_alloc != f"layers.{k}":
                    problems.append(f"rank {rank}: backward: layers.{k}.all_gather_output freed after "
                                    f"{last_alloc}'s copy-out, not at its own")
            elif k + 1 < layers and next_copy_out != f"layers.{k + 1}._full_param_padded":
                problems.append(f"rank {rank}: forward: layers.{k}.all_gather_output freed before "
                                f"{next_copy_out}, not just before layers.{k + 1}'s copy-out")
            elif k + 1 < layers and (last_alloc != f"layers.{k}" or k + 1 not in gathering):
                problems.append(f"rank {rank}: forward: layers.{k}.all_gather_output freed after {last_alloc}'s "
                                f"copy-out, with layers {sorted(gathering)}'s outputs allocated; expected after "
                                f"layers.{k}'s copy-out and layers.{k + 1}'s all-gather")
            elif k + 1 == layers and any(x["kind"] == "compute" and x["phase"] == "forward"
                                         for x in later[:next((j for j, x in enumerate(later) if x["kind"] ==
                                                               "compute" and x["phase"] == "backward"), len(later))]):
                problems.append(f"rank {rank}: forward: the last layer's all_gather_output freed before forward "
                                f"ended")
    if computes == 0:
        problems.append("no layer computed (no trace?)")
    finish(problems, "prefetch or all-gather output lifetimes differ from FSDP2's explicit lists",
           f"{computes} layer computes on {world} ranks: layers k .. k+{nf} unsharded in forward, k-{nb} .. k in "
           f"backward; each all_gather_output kept until the next layer's copy-out in forward, freed at its own in "
           f"backward")


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] not in ("layout", "bytes", "save", "collectives", "post_forward",
                                                 "prefetch"):
        sys.exit(__doc__)
    if sys.argv[1] == "prefetch":
        check_prefetch(*sys.argv[2:5])
    elif sys.argv[1] == "post_forward":
        check_post_forward(*sys.argv[2:6])
    elif sys.argv[1] == "collectives":
        check_collectives(*sys.argv[2:6])
    elif sys.argv[1] == "save":
        check_save(sys.argv[2], int(sys.argv[3]))
    else:
        (check_layout if sys.argv[1] == "layout" else check_bytes)(sys.argv[2])
