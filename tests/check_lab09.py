#!/usr/bin/env python3
"""check-09: lab 09's invariants, from its output and its events.

  python3 tests/check_lab09.py RUNDIR LOG [--init-models tiny,qwen2-0.5b]

1. The memory model per pool: every category's measured peak equals the prediction to the byte, for the device pool
   without and with offload and for the host pool with offload. With offload the device keeps no parameter shard, no
   optimizer state and one gradient shard (the reduce-scatter's output until its d2h copy): what it holds is the
   unsharded units in flight, their gradients, the activations (and with 3+ ranks the ring's running sums); its peak
   is below the peak without offload.
2. Offload moves bytes and never changes them: per rank, the losses and the parameter checksum with offload equal
   those without, exactly (a copy is exact; no tolerance applies).
3. The copies in the trace, in the offloaded run's window: one h2d copy of each unit's shard (its all-gather's bytes /
   world) before each of its all-gathers is issued, one d2h copy of its shard per reduce-scatter, after it completed;
   none in the run without offload; the host pool holds only shards, gradient shards, optimizer state and the
   accumulation buffer.
4. Initialisation, per model: the deferred peak is the shards exactly (no workspace), the naive peak the shards plus
   the whole padded model, and the shards are bit-identical (same checksum) both ways.
"""
import argparse
import glob
import json
import os
import re
import sys
from collections import defaultdict

ROUNDING_US = 0.002  # ts and dur are written to 1 ns; two moments of different lines compare within 2 ns


class Report:
    def __init__(self):
        self.failed = 0

    def check(self, name, problems):
        if problems:
            self.failed += 1
            print(f"FAIL {name}")
            for problem in problems[:20]:
                print(f"     {problem}")
        else:
            print(f"OK   {name}")


def memory_tables(log):
    """{(rank, offload, pool): {category: (predicted text, measured text, difference bytes)}} from the tables."""
    tables, current = {}, None
    for line in log.splitlines():
        header = re.match(r"rank (\d+), offload=(\d), (device|host) pool: memory per rank", line)
        if header:
            current = tables.setdefault((int(header[1]), int(header[2]), header[3]), {})
            continue
        row = re.match(r"\s+(\w+)\s+(\S+ \S+)\s+(\S+ \S+)\s+\S+\s+([+-]\d+) B$", line)
        if row and current is not None:
            current[row[1]] = (row[2], row[3], int(row[4]))
        elif not line.startswith("  "):
            current = None
    return tables


def check_memory(log, world, report):
    tables = memory_tables(log)
    problems = []
    for rank in range(world):
        for key in ((rank, 0, "device"), (rank, 1, "device"), (rank, 1, "host")):
            if key not in tables or not tables[key]:
                problems.append(f"no table for rank {key[0]} offload={key[1]} {key[2]} pool")
                continue
            problems += [f"rank {key[0]} offload={key[1]} {key[2]} pool: {category} measured {measured}, predicted "
                         f"{predicted} ({difference:+d} B)"
                         for category, (predicted, measured, difference) in tables[key].items() if difference != 0]
        device = tables.get((rank, 1, "device"), {})
        # comm_buffer: the reduce-scatter ring's running sums (3+ ranks): the collective's own device memory
        held = set(device) - {"param_unsharded", "grad_unsharded", "grad_shard", "activation", "checkpoint_input",
                              "workspace", "data", "comm_buffer"}
        if held:
            problems.append(f"rank {rank}: with offload the device pool still holds {sorted(held)}")
        host = tables.get((rank, 1, "host"), {})
        if not {"param_shard", "grad_shard", "optim_state"} <= set(host):
            problems.append(f"rank {rank}: the host pool holds {sorted(host)}, not the shards, gradients and moments")
    report.check("memory model per pool: measured = predicted per category to the byte; offloaded device holds only "
                 "unsharded units, their gradients, one gradient shard, activations, workspace, data", problems)
    peaks = re.search(r"device pool peak: (\S+ \S+) without offload, (\S+ \S+) with it", log)
    units = {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9}
    def value(text):
        number, unit = text.split()
        return float(number) * units[unit]
    report.check("the device pool's peak is lower with offload",
                 [] if peaks and value(peaks[2]) < value(peaks[1]) else [f"peaks: {peaks and peaks.groups()}"])


def check_same_arithmetic(log, world, report):
    runs = {}
    for match in re.finditer(r"^rank (\d+) offload (\d) parameters (\w+) losses ([^c]*) copies", log, re.M):
        runs[(int(match[1]), int(match[2]))] = (match[3], match[4].split())
    problems = []
    for rank in range(world):
        if (rank, 0) not in runs or (rank, 1) not in runs:
            problems.append(f"rank {rank}: a run's line is missing")
        elif runs[(rank, 0)] != runs[(rank, 1)]:
            problems.append(f"rank {rank}: without offload {runs[(rank, 0)]}, with {runs[(rank, 1)]}")
    report.check("losses and parameters bit-identical with and without offload (exact: copies are exact)", problems)


def read_rank(path):
    with open(path, encoding="utf-8") as file:
        return [json.loads(line) for line in file]


def window(events, begin_text):
    """The events between the mark begin_text and the next 'lab 09 run end' mark."""
    inside, selected = False, []
    for event in events:
        if event.get("kind") == "mark" and event.get("text") == begin_text:
            inside = True
        elif event.get("kind") == "mark" and event.get("text") == "lab 09 run end" and inside:
            break
        elif inside:
            selected.append(event)
    return selected


def check_copies(rundir, world, report):
    problems = []
    for rank in range(world):
        events = read_rank(os.path.join(rundir, f"rank{rank}.jsonl"))
        plain, offloaded = window(events, "lab 09 offload=0"), window(events, "lab 09 offload=1")
        if not offloaded:
            problems.append(f"rank {rank}: no 'lab 09 offload=1' window")
            continue
        if any(event["kind"] == "copy" or event.get("device") == "host" for event in plain):
            problems.append(f"rank {rank}: the run without offload copies or uses the host pool")
        copies = defaultdict(list)
        for event in offloaded:
            if event["kind"] == "copy":
                copies[(event["direction"], event["unit"])].append(event)
        gathers, reduces = defaultdict(list), defaultdict(list)
        for event in offloaded:
            if event["kind"] == "collective" and event["op"] == "all_gather" and event.get("unit") != "eval":
                gathers[event["unit"]].append(event)
            if event["kind"] == "collective" and event["op"] == "reduce_scatter":
                reduces[event["unit"]].append(event)
        if not gathers or not reduces:
            problems.append(f"rank {rank}: no all-gather or reduce-scatter in the offloaded run")
        for unit, collectives in gathers.items():
            collectives.sort(key=lambda event: event["issue_ts"])
            h2d = sorted(copies[("h2d", unit)], key=lambda event: event["ts"])
            if len(h2d) != len(collectives):
                problems.append(f"rank {rank} {unit}: {len(h2d)} h2d copies for {len(collectives)} all-gathers")
            for copy, gather in zip(h2d, collectives):
                if copy["bytes"] * world != gather["bytes"]:
                    problems.append(f"rank {rank} {unit}: h2d of {copy['bytes']} B for an all-gather of "
                                    f"{gather['bytes']} B on {world} ranks")
                if copy["ts"] + copy["dur"] > gather["issue_ts"] + ROUNDING_US:
                    problems.append(f"rank {rank} {unit}: h2d copy ends at {copy['ts'] + copy['dur']}, after its "
                                    f"all-gather was issued at {gather['issue_ts']}")
        for unit, collectives in reduces.items():
            collectives.sort(key=lambda event: event["issue_ts"])
            d2h = sorted(copies[("d2h", unit)], key=lambda event: event["ts"])
            if len(d2h) != len(collectives):
                problems.append(f"rank {rank} {unit}: {len(d2h)} d2h copies for {len(collectives)} reduce-scatters")
            for copy, reduce in zip(d2h, collectives):
                if copy["bytes"] * world != reduce["bytes"]:
                    problems.append(f"rank {rank} {unit}: d2h of {copy['bytes']} B for a reduce-scatter of "
                                    f"{reduce['bytes']} B on {world} ranks")
                if copy["ts"] + ROUNDING_US < reduce["ts"] + reduce["dur"]:
                    problems.append(f"rank {rank} {unit}: d2h copy at {copy['ts']} before its reduce-scatter "
                                    f"completed at {reduce['ts'] + reduce['dur']}")
        stray = {key for key in copies if key[1] not in gathers and key[1] not in reduces}
        if stray:
            problems.append(f"rank {rank}: copies of units with no collective: {sorted(stray)}")
        host_categories = {event["category"] for event in events
                           if event.get("device") == "host" and event["kind"] == "alloc"}
        if not host_categories or not host_categories <= {"param_shard", "grad_shard", "optim_state", "comm_buffer"}:
            problems.append(f"rank {rank}: host pool categories {sorted(host_categories)}")
    report.check("one h2d copy of the shard before each all-gather, one d2h copy after each reduce-scatter, of the "
                 "shard's bytes; none without offload; the host pool holds shards, gradients, moments only", problems)


INIT = re.compile(r"^init (\S+) rank (\d+): deferred peak (\d+) B \(shards (\d+) B, workspace (\d+) B\) \S+ s checksum "
                  r"(\w+); naive peak (\d+) B \(shards \+ whole model (\d+) B\) \S+ s checksum (\w+);", re.M)


def check_init(log, world, models, report):
    seen, problems = set(), []
    for match in INIT.finditer(log):
        model, rank = match[1], int(match[2])
        deferred, shards, workspace, deferred_sum = int(match[3]), int(match[4]), int(match[5]), match[6]
        naive, whole, naive_sum = int(match[7]), int(match[8]), match[9]
        seen.add((model, rank))
        # Deferred init draws every value straight into its shard: no workspace, so its bound is the shards + 0.
        if deferred != shards or workspace != 0:
            problems.append(f"{model} rank {rank}: deferred peak {deferred} B, shards {shards} B, workspace "
                            f"{workspace} B")
        if naive != shards + whole:
            problems.append(f"{model} rank {rank}: naive peak {naive} B, expected shards + model {shards + whole} B")
        if whole < shards * world:
            problems.append(f"{model} rank {rank}: the whole model ({whole} B) is smaller than {world} shards")
        if deferred_sum != naive_sum:
            problems.append(f"{model} rank {rank}: shards differ: deferred {deferred_sum}, naive {naive_sum}")
    missing = {(model, rank) for model in models for rank in range(world)} - seen
    problems += [f"no init line for {model} rank {rank}" for model, rank in sorted(missing)]
    report.check(f"initialisation of {', '.join(models)}: deferred peak = shards exactly, naive = shards + whole "
                 f"model, bit-identical shards", problems)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rundir")
    parser.add_argument("log")
    parser.add_argument("--init-models", default="tiny,qwen2-0.5b")
    options = parser.parse_args()
    with open(options.log, encoding="utf-8") as file:
        log = file.read()
    world = len(glob.glob(os.path.join(options.rundir, "rank*.jsonl")))
    report = Report()
    check_memory(log, world, report)
    check_same_arithmetic(log, world, report)
    check_copies(options.rundir, world, report)
    check_init(log, world, [model for model in options.init_models.split(",") if model], report)
    print(f"check_lab09: {'all passed' if report.failed == 0 else f'{report.failed} failed'}")
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
