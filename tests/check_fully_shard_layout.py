"""scripts/torch_fully_shard_layout.py's output against the checkpoint it sharded: per parameter, chunk_rows is
ceil(d0 / W), the padded local shape chunk_rows rows, each rank's range [min(d0, r c), min(d0, (r + 1) c)) (an empty
one starts at d0), rank<r>.safetensors that many rows, and the ranks' rows in order the checkpoint's tensor, bit for
bit.

    python3 tests/check_fully_shard_layout.py CHECKPOINT_DIR LAYOUT_DIR [--expect-empty N]

--expect-empty N: the layout must hold exactly N empty (zero-row) shards, counted over parameters and ranks."""
import argparse
import json
import math
import sys

import torch
from safetensors.torch import load_file


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkpoint")
    parser.add_argument("layout")
    parser.add_argument("--expect-empty", type=int, default=None)
    args = parser.parse_args()
    whole = load_file(f"{args.checkpoint}/model.safetensors")
    with open(f"{args.layout}/layout.json") as file:
        layout = json.load(file)
    world = layout["world"]
    shards = [load_file(f"{args.layout}/rank{r}.safetensors") for r in range(world)]
    problems, empty = [], []
    for name, entry in layout["parameters"].items():
        d0, rows = entry["d0"], entry["chunk_rows"]
        if rows != math.ceil(d0 / world) or entry["padded_local_shape"] != [rows] + entry["shape"][1:]:
            problems.append(f"{name}: chunk_rows {rows}, padded {entry['padded_local_shape']} for shape "
                            f"{entry['shape']} on {world} ranks")
        for r, got in enumerate(entry["ranks"]):
            start, end = min(d0, r * rows), min(d0, (r + 1) * rows)
            if (got["start"], got["end"]) != (start, end):
                problems.append(f"{name}: rank {r} holds [{got['start']}, {got['end']}), expected [{start}, {end})")
            if shards[r][name].shape[0] != got["end"] - got["start"]:
                problems.append(f"{name}: rank{r}.safetensors has {shards[r][name].shape[0]} rows")
            if got["start"] == got["end"]:
                empty.append(f"{name} on rank {r}")
        if not torch.equal(torch.cat([shards[r][name] for r in range(world)]), whole[name]):
            problems.append(f"{name}: the ranks' rows in order are not the checkpoint's tensor")
    if args.expect_empty is not None and len(empty) != args.expect_empty:
        problems.append(f"{len(empty)} empty shards, expected {args.expect_empty}: {empty}")
    for problem in problems:
        print(f"FAIL: {problem}")
    print(f"{len(layout['parameters'])} parameters on {world} ranks, {len(empty)} empty shards {empty}: "
          f"{'FAIL' if problems else 'as expected'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
