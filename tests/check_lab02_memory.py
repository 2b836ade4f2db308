"""Reads lab 02's events (not its printout) and checks the lesson from the trace alone:
the unsharded buffer is the whole padded unit (world x shard), and live memory at the "after reshard" mark equals
live memory at the "before unshard" mark, on every rank. The lab unshards twice: with the caching allocator (the
`allocator` event says which mode ran) both param_unsharded blocks have the same address and the second causes no
segment_alloc; with ALLOC=malloc the second gets a segment of its own (a segment_alloc right before it), and every
segment is freed when its block is.

usage: python3 tests/check_lab02_memory.py RUNDIR
"""
import glob
import json
import sys


def main(rundir):
    failures = []
    files = sorted(glob.glob(f"{rundir}/rank*.jsonl"))
    if not files:
        print(f"FAIL: no rank*.jsonl in {rundir}")
        return 1
    for path in files:
        events = [json.loads(line) for line in open(path)]
        world = events[0]["world"]
        rank = events[0]["rank"]
        live_at = {}
        live = 0
        shard_bytes = unsharded_bytes = None
        mode = next((e["mode"] for e in events if e["kind"] == "allocator"), None)
        unsharded = []  # (address, segment_alloc right before it?) of each param_unsharded alloc
        for index, event in enumerate(events):
            if event["kind"] == "alloc" and event["category"] == "param_unsharded":
                unsharded.append((event["addr"], events[index - 1]["kind"] == "segment_alloc"))
            if event["kind"] in ("alloc", "free"):
                live += event["bytes"] if event["kind"] == "alloc" else -event["bytes"]
                if event["kind"] == "alloc" and event["category"] == "param_shard":
                    shard_bytes = event["bytes"]
                if event["kind"] == "alloc" and event["category"] == "param_unsharded":
                    unsharded_bytes = event["bytes"]
            if event["kind"] == "mark":
                live_at[event["text"]] = live
        if shard_bytes is None or unsharded_bytes is None:
            failures.append(f"rank {rank}: no param_shard or param_unsharded allocation in {path}")
            continue
        if unsharded_bytes != world * shard_bytes:
            failures.append(f"rank {rank}: param_unsharded {unsharded_bytes} B != world {world} x shard "
                            f"{shard_bytes} B")
        before = live_at.get("lab 02: before unshard")
        after = live_at.get("lab 02: after reshard")
        if before is None or after is None or before != after:
            failures.append(f"rank {rank}: live bytes before unshard {before} != after reshard {after}")
        else:
            print(f"rank {rank}: shard {shard_bytes} B x {world} = unsharded {unsharded_bytes} B; "
                  f"live before unshard {before} B == after reshard {after} B")
        if len(unsharded) != 2 or mode not in ("caching", "malloc"):
            failures.append(f"rank {rank}: expected two unshards and an allocator event, got {len(unsharded)}, {mode}")
        elif mode == "caching" and (unsharded[0][0] != unsharded[1][0] or unsharded[1][1]):
            failures.append(f"rank {rank}: caching allocator: the second unshard got address {unsharded[1][0]:#x} "
                            f"(first {unsharded[0][0]:#x}), new segment: {unsharded[1][1]}")
        elif mode == "malloc" and not unsharded[1][1]:
            failures.append(f"rank {rank}: ALLOC=malloc: the second unshard did not get a segment of its own")
        else:
            print(f"rank {rank}: {mode}: second unshard at {unsharded[1][0]:#x}, "
                  f"{'a new segment' if unsharded[1][1] else 'the cached block of the first'}")
    for failure in failures:
        print("FAIL:", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
