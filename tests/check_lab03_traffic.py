"""Reads lab 03's events and checks the 1/N lesson from the trace alone, on every rank:
reduce_scatter sends (N-1)/N of the gradient and all_reduce 2(N-1)/N (exactly twice as much); the grad_shard kept
is 1/N of the full gradient; the full gradient of the reduce-scatter is freed right after it.

usage: python3 tests/check_lab03_traffic.py RUNDIR
"""
import glob
import json
import sys


def check_rank(events):
    rank, world = events[0]["rank"], events[0]["world"]
    collectives = {e["op"]: e for e in events if e["kind"] == "collective" and e["unit"] == "layers.0"}
    reduce_scatter, all_reduce = collectives.get("reduce_scatter"), collectives.get("all_reduce")
    if reduce_scatter is None or all_reduce is None:
        return [f"rank {rank}: missing reduce_scatter or all_reduce event on unit layers.0"]
    failures = []
    full = reduce_scatter["bytes"]
    if reduce_scatter["bytes_sent"] * world != full * (world - 1):
        failures.append(f"rank {rank}: reduce_scatter sent {reduce_scatter['bytes_sent']} B, expected (N-1)/N "
                        f"of {full}")
    if all_reduce["bytes_sent"] != 2 * reduce_scatter["bytes_sent"]:
        failures.append(f"rank {rank}: all_reduce sent {all_reduce['bytes_sent']} B, "
                        f"expected 2 x {reduce_scatter['bytes_sent']}")
    shards = [e for e in events if e["kind"] == "alloc" and e["category"] == "grad_shard"]
    if len(shards) != 1 or shards[0]["bytes"] * world != full:
        failures.append(f"rank {rank}: expected one grad_shard of {full}/{world} B, got {[e['bytes'] for e in shards]}")
    frees = [e for e in events if e["kind"] == "free" and e["category"] == "grad_unsharded"]
    if not frees or frees[0]["ts"] < reduce_scatter["ts"] + reduce_scatter["dur"]:
        failures.append(f"rank {rank}: the full gradient was not freed after the reduce_scatter finished")
    if not failures:
        print(f"rank {rank}: reduce_scatter sent {reduce_scatter['bytes_sent']} B, all_reduce "
              f"{all_reduce['bytes_sent']} B; kept grad_shard {shards[0]['bytes']} B of {full} B")
    return failures


def main(rundir):
    files = sorted(glob.glob(f"{rundir}/rank*.jsonl"))
    failures = [] if files else [f"no rank*.jsonl in {rundir}"]
    for path in files:
        failures += check_rank([json.loads(line) for line in open(path)])
    for failure in failures:
        print("FAIL:", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
