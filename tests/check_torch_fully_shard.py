#!/usr/bin/env python3
"""fsdplab's FSDP2 shards against torch's fully_shard, byte for byte, on the same model.

    python3 tests/check_torch_fully_shard.py TORCH_DIR CHECKPOINT_DIR

TORCH_DIR is scripts/torch_fully_shard_layout.py's output (layout.json; rank<r>.safetensors: each parameter's
to_local(), its rows only); CHECKPOINT_DIR a sharded checkpoint of lab 05 with FSDP_VERSION=2 on the same world size
and the same parameters (LR=0: the step changes nothing). Every rank's rows of every parameter must be torch's:
the row range [start, end) torch's DTensor holds on that rank (c = ceil(d0 / W) rows a rank, the last ones short or
empty) is a range of fsdplab's file of that rank (at the parameter's offset in its unit, offsets counted in torch's
registration order, which is the units' order in fsdplab too), and its float32 bytes are torch's to_local()'s.
"""
import json
import math
import sys

from safetensors import safe_open


def main(torch_dir, checkpoint):
    layout = json.load(open(f"{torch_dir}/layout.json"))
    world, params = layout["world"], layout["parameters"]
    metadata = json.load(open(f"{checkpoint}/.metadata"))
    assert metadata["world_size"] == world, f"world sizes differ: torch {world}, fsdplab {metadata['world_size']}"
    unit_index = {u["name"]: i for i, u in enumerate(metadata["units"])}
    # offsets within each unit, in registration order
    by_unit = {}
    for name, p in params.items():
        by_unit.setdefault(p["unit"], []).append((p["index_in_unit"], name))
    offset = {}
    for unit, members in by_unit.items():
        at = 0
        for _, name in sorted(members):
            offset[name] = at
            at += math.prod(params[name]["shape"])
    compared = 0
    for rank in range(world):
        record = next(f for f in metadata["files"] if f["rank"] == rank)
        mine = safe_open(f"{checkpoint}/{record['file']}", "np")
        theirs = safe_open(f"{torch_dir}/rank{rank}.safetensors", "np")
        for name, p in params.items():
            d0 = p["d0"]
            assert p["chunk_rows"] == -(-d0 // world), f"{name}: torch's chunk is {p['chunk_rows']} rows of {d0}"
            start, end = p["ranks"][rank]["start"], p["ranks"][rank]["end"]
            c = p["chunk_rows"]
            assert (start, end) == (min(rank * c, d0), min((rank + 1) * c, d0)) or start == end, \
                f"{name}: torch's rank {rank} holds rows [{start}, {end}), not [r c, min(d0, (r+1) c))"
            if start == end:
                continue
            unit = "root" if p["unit"] == "" else p["unit"].removeprefix("model.")
            u = unit_index[unit]
            row = math.prod(p["shape"]) // d0
            want = (offset[name] + start * row, offset[name] + end * row)
            ranges = record["ranges"][u]
            pairs = [(ranges[i], ranges[i + 1]) for i in range(0, len(ranges), 2)]
            assert want in pairs, f"rank {rank}: {name} rows [{start}, {end}) = unit '{unit}' elements {want}, " \
                                  f"not a range of fsdplab's file: {pairs}"
            k = pairs.index(want)
            tensor = f"{unit}.param" if k == 0 else f"{unit}.param.{k}"
            a = mine.get_tensor(tensor).tobytes()
            b = theirs.get_tensor(name).astype("float32").tobytes()
            assert a == b, f"rank {rank}: {name} rows [{start}, {end}): fsdplab's bytes differ from torch's to_local()"
            compared += 1
    print(f"OK: {world} ranks, {len(params)} parameters: {compared} row ranges equal to torch's to_local(), "
          f"byte for byte, at the offsets torch's layout gives")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
