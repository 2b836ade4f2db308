#!/usr/bin/env python3
"""test_summary.py: `fsdptrace summary` on a small synthetic run whose figures are computed by hand below.

    python3 tests/test_summary.py [--tool trace/fsdptrace]

Writes two rank files (the same events on both ranks) into a temporary run directory, runs the tool's `summary`,
and compares every figure of summary.txt with the values worked out in the comments: peak and its composition,
collectives by op, compute / comm / overlap / idle time (touching intervals do not overlap), and comm volume
against ZeRO-3's 3 P per micro-batch. Then `all` must write the other views of the same run, and a free that
matches no allocation must be refused with the file and line. Prints OK / FAIL per check, then the counts.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

from check_report import Report

# (kind, ts, fields) in file order; line numbers start at 3 (line 1 meta, line 2 the t0 mark).
SEGMENT = 0x200000  # the one 2 MiB small-pool segment every block below is carved from
# Each allocation id's block (address, size = bytes rounded up to 512), laid out as the caching allocator would: id 5
# is freed and its block handed to id 6 and, grown by the free space after it, to id 7, then id 8.
BLOCKS = {1: (SEGMENT, 2048), 2: (SEGMENT + 2048, 3072), 3: (SEGMENT + 5120, 4096), 4: (SEGMENT + 9216, 10240),
          5: (SEGMENT + 19456, 6144), 6: (SEGMENT + 19456, 6144), 7: (SEGMENT + 19456, 7168),
          8: (SEGMENT + 19456, 7168)}
EVENTS = [
    ("allocator", 0, {"mode": "caching", "backend": "host", "round": 512, "small_size": 1048576,
                      "small_segment": 2097152, "large_segment": 20971520, "min_large_alloc": 10485760,
                      "round_large": 2097152, "max_split_size": 0}),                                        # 3
    ("segment_alloc", 1, {"id": 1, "addr": SEGMENT, "bytes": 2097152, "pool": "small", "stream": 0,
                          "owner": "root._local_shard", "category": "param_shard"}),                       # 4
    ("alloc", 1, {"id": 1, "bytes": 2000, "category": "param_shard", "owner": "root._local_shard"}),        # 5: 2000
    ("alloc", 2, {"id": 2, "bytes": 3000, "category": "param_shard", "owner": "layers.0._local_shard"}),    # 6: 5000
    ("state", 5, {"unit": "root", "machine": "HandleTrainingState", "from": "IDLE", "to": "FORWARD",
                  "hook": "_pre_forward"}),                                                                # 7
    ("alloc", 6, {"id": 3, "bytes": 4000, "category": "param_unsharded",
                  "owner": "root._full_param_padded"}),                                                    # 8: 9000
    ("collective", 10, {"op": "all_gather", "unit": "root", "bytes": 4000, "bytes_sent": 2000,
                        "bytes_recv": 2000, "seq": 0, "dur": 20}),                                         # 9: [10,30)
    ("state", 30, {"unit": "root", "machine": "ShardState", "from": "SHARDED", "to": "UNSHARDED",
                   "hook": "_pre_forward"}),                                                               # 10
    ("alloc", 31, {"id": 4, "bytes": 10000, "category": "activation", "owner": "embed.output"}),         # 11: 19000
    ("compute", 40, {"name": "embed.forward", "unit": "root", "phase": "forward", "dur": 20}),           # 12: [40,60)
    ("compute", 50, {"name": "side.forward", "unit": None, "phase": None, "dur": 20}),                  # 13: [50,70)
    ("state", 60, {"unit": "layers.0", "machine": "HandleTrainingState", "from": "IDLE", "to": "FORWARD",
                   "hook": "_pre_forward"}),                                                               # 14
    ("alloc", 61, {"id": 5, "bytes": 6000, "category": "param_unsharded",
                   "owner": "layers.0._full_param_padded"}),                                               # 15: 25000
    ("collective", 65, {"op": "all_gather", "unit": "layers.0", "bytes": 6000, "bytes_sent": 3000,
                        "bytes_recv": 3000, "seq": 1, "dur": 30}),                                         # 16: [65,95)
    ("free", 95, {"id": 5, "bytes": 6000, "category": "param_unsharded",
                  "owner": "layers.0._full_param_padded"}),                                                # 17: 19000
    ("collective", 96, {"op": "all_gather", "unit": "layers.0", "bytes": 6000, "bytes_sent": 3000,
                        "bytes_recv": 3000, "seq": 2, "dur": 4}),                                          # 18: [96,100)
    ("alloc", 97, {"id": 6, "bytes": 6000, "category": "grad_unsharded",
                   "owner": "layers.0.full_grad_padded"}),                                                 # 19: 25000, ties
    ("free", 98, {"id": 6, "bytes": 6000, "category": "grad_unsharded",
                  "owner": "layers.0.full_grad_padded"}),                                                  # 20: 19000
    ("compute", 100, {"name": "layers.0.backward", "unit": "layers.0", "phase": "backward", "dur": 10}),  # 21: [100,110)
    ("alloc", 101, {"id": 7, "bytes": 7000, "category": "workspace", "owner": "layers.0.dscores"}),      # 22: 26000 PEAK
    ("collective", 105, {"op": "reduce_scatter", "unit": "layers.0", "bytes": 6000, "bytes_sent": 3000,
                         "bytes_recv": 3000, "seq": 3, "dur": 20}),                                        # 23: [105,125)
    ("free", 126, {"id": 7, "bytes": 7000, "category": "workspace", "owner": "layers.0.dscores"}),       # 24: 19000
    ("alloc", 127, {"id": 8, "bytes": 7000, "category": "workspace", "owner": "root.dscores"}),          # 25: 26000 tie
    ("collective", 130, {"op": "reduce_scatter", "unit": "root", "bytes": 4000, "bytes_sent": 2000,
                         "bytes_recv": 2000, "seq": 4, "dur": 10}),                                        # 26: [130,140)
    ("collective", 140, {"op": "all_reduce", "unit": "loss", "bytes": 4, "bytes_sent": 4, "bytes_recv": 4,
                         "seq": 5, "dur": 10}),                                                            # 27: [140,150)
    ("step", 151, {"step": 1, "micro": 0, "loss": 2.5, "peak_bytes": 26000, "peak_reserved": 2097152, "time": 0.00015}),          # 28
    ("step", 152, {"step": 1, "micro": -1, "loss": 2.5, "peak_bytes": 26000, "peak_reserved": 2097152, "time": 0.00015}),         # 29
    ("free", 153, {"id": 8, "bytes": 7000, "category": "workspace", "owner": "root.dscores"}),           # 30
    ("free", 154, {"id": 4, "bytes": 10000, "category": "activation", "owner": "embed.output"}),         # 31
    ("free", 155, {"id": 3, "bytes": 4000, "category": "param_unsharded", "owner": "root._full_param_padded"}),
]

# Worked out by hand from EVENTS.
PEAK = {"bytes": 26000, "line": 22, "owner": "layers.0.dscores", "moment": "during step 1 micro-batch 0",
        "categories": {"param_shard": 5000, "param_unsharded": 4000, "activation": 10000, "workspace": 7000}}
# The reserved peak is the one segment, from line 4 on. At the allocated peak (line 22) the live blocks are ids 1, 2,
# 3, 4, 7: sizes 2048 + 3072 + 4096 + 10240 + 7168 = 26624 for 26000 bytes asked, so rounding 624; the segment's
# 2097152 - 26624 = 2070528 bytes are free; fragmentation 2097152 - 26000 = 2071152 = 98.8% of reserved.
RESERVED = {"peak": 2097152, "peak_line": 4, "peak_owner": "root._local_shard", "rounding": 624, "cached": 2070528,
            "fragmentation": 2071152, "fragmentation_share": 100 * 2071152 / 2097152,
            "segment": (SEGMENT, "small", 2097152, 5, 26624, 2070528)}
# op: (count, bytes, bytes sent, ms); all_gather 20+30+4 us, reduce_scatter 20+10, all_reduce 10.
COLLECTIVES = {"all_gather": (3, 16000, 8000, 0.054), "reduce_scatter": (2, 10000, 5000, 0.030),
               "all_reduce": (1, 4, 4, 0.010), "total": (6, 26004, 13004, 0.094)}
# compute union [40,70) + [100,110) = 40 us; comm union [10,30) [65,95) [96,100) [105,125) [130,150) = 94 us;
# overlap [65,70) + [105,110) = 10 us ([96,100) only touches [100,110)); span [10,150) = 140 us;
# idle 140 - (40 + 94 - 10) = 16 us; overlap share of comm 10 / 94.
TIME_MS = {"span": 0.140, "compute": 0.040, "comm": 0.094, "overlap": 0.010, "idle": 0.016}
TIME_SHARES = {"compute": 100 * 40 / 140, "comm": 100 * 94 / 140, "overlap": 100 * 10 / 94, "idle": 100 * 16 / 140}
# P = root 4000 + layers.0 6000 (each unit's largest buffer); the loss all_reduce is no FSDP unit's.
# measured = 4000 + 6000 + 6000 + 6000 + 4000 = 26000 over 1 micro-batch = 2.6 P; ZeRO-3 3 P = 30000; DDP 2 P.
VOLUME = {"parameters": 10000, "measured": 26000, "per_micro_batch": 2.6, "zero3": 30000, "zero3_ratio": 26 / 30,
          "all_reduce": 20000, "all_reduce_ratio": 1.3}


def write_run(rundir, world, events, version=3):
    os.makedirs(rundir, exist_ok=True)
    for rank in range(world):
        with open(os.path.join(rundir, f"rank{rank}.jsonl"), "w", encoding="utf-8") as file:
            lines = [{"kind": "meta", "ts": 0, "rank": rank, "schema": "fsdplab-events", "version": version,
                      "world": world, "unix_time": 0},
                     {"kind": "mark", "ts": 0, "rank": rank, "text": "t0"}]
            for kind, ts, fields in events:
                line = {"kind": kind, "ts": ts, "rank": rank, **fields}
                if kind == "collective":
                    line.update({"reduce": None, "count": fields["bytes"] // 4, "world": world})
                if kind in ("alloc", "free"):  # the block, and the one segment's bytes as reserved
                    address, size = BLOCKS.get(fields["id"], (SEGMENT + 1048576, 512))
                    line.update({"addr": address, "size": size, "segment": SEGMENT, "stream": 0, "reserved": 2097152})
                if kind == "segment_alloc":
                    line["reserved"] = fields["bytes"]
                lines.append(line)
            file.write("".join(json.dumps(line) + "\n" for line in lines))


def number(text):
    return float(text.replace(",", ""))


def sections(text):
    """{rank: text of that rank's section}."""
    parts = re.split(r"^== rank (\d+)", text, flags=re.MULTILINE)
    return {int(parts[index]): parts[index + 1] for index in range(1, len(parts) - 1, 2)}


def close(found, wanted, tolerance):
    return abs(found - wanted) <= tolerance


def peak_problems(section):
    problems = []
    match = re.search(r"^peak memory: ([\d,]+) B \(.*?\) at line (\d+) \(alloc of (\S+)\), (.*)$", section, re.M)
    if not match:
        return ["no 'peak memory:' line"]
    found = (number(match[1]), int(match[2]), match[3], match[4])
    wanted = (PEAK["bytes"], PEAK["line"], PEAK["owner"], PEAK["moment"])
    if found != wanted:
        problems.append(f"peak line says {found}, expected {wanted}")
    rows = dict(re.findall(r"^  (\w+)\s+([\d,]+)\s+[\d.]+%$", section, re.M))
    for category in ["param_shard", "param_unsharded", "grad_unsharded", "grad_shard", "optim_state",
                     "activation", "checkpoint_input", "workspace", "comm_buffer", "data"]:
        wanted_bytes = PEAK["categories"].get(category, 0)
        if category not in rows or number(rows[category]) != wanted_bytes:
            problems.append(f"{category} at peak: {rows.get(category)}, expected {wanted_bytes}")
    if number(rows.get("total", "0")) != PEAK["bytes"]:
        problems.append(f"total at peak {rows.get('total')}, expected {PEAK['bytes']}")
    return problems


def reserved_problems(section):
    problems = []
    match = re.search(r"^reserved peak: ([\d,]+) B \(.*?\) at line (\d+) \(segment_alloc for (\S+)\)", section, re.M)
    found = (number(match[1]), int(match[2]), match[3]) if match else None
    if found != (RESERVED["peak"], RESERVED["peak_line"], RESERVED["peak_owner"]):
        problems.append(f"reserved peak line says {found}")
    match = re.search(r"^fragmentation at the allocated peak \(line (\d+)\): reserved ([\d,]+) B - allocated ([\d,]+) B"
                      r" = ([\d,]+) B \(([\d.]+)% of reserved\)", section, re.M)
    found = (int(match[1]), number(match[2]), number(match[3]), number(match[4])) if match else None
    if found != (PEAK["line"], RESERVED["peak"], PEAK["bytes"], RESERVED["fragmentation"]) or \
            not close(float(match[5]), RESERVED["fragmentation_share"], 0.05):
        problems.append(f"fragmentation line says {found}")
    for name, pattern in (("rounding", r"^  rounding .*?([\d,]+) B$"), ("cached", r"^  free in segments .*?([\d,]+) B$")):
        match = re.search(pattern, section, re.M)
        if not match or number(match[1]) != RESERVED[name]:
            problems.append(f"{name}: {match and match[1]}, expected {RESERVED[name]}")
    rows = re.findall(r"^  (0x[0-9a-f]+)\s+(\w+)\s+([\d,]+)\s+(\d+)\s+([\d,]+)\s+([\d,]+)$", section, re.M)
    found = [(int(a, 16), pool, number(b), int(n), number(c), number(f)) for a, pool, b, n, c, f in rows]
    if found != [RESERVED["segment"]]:
        problems.append(f"segment rows {found}, expected [{RESERVED['segment']}]")
    return problems


def collective_problems(section):
    problems = []
    rows = {name: (int(count), number(sent_bytes), number(sent), float(ms))
            for name, count, sent_bytes, sent, ms in
            re.findall(r"^  (\w+)\s+(\d+)\s+([\d,]+)\s+([\d,]+)\s+([\d.]+)$", section, re.M)}
    for op, wanted in COLLECTIVES.items():
        found = rows.get(op)
        if found is None or found[:3] != wanted[:3] or not close(found[3], wanted[3], 0.0005):
            problems.append(f"{op}: {found}, expected {wanted}")
    return problems


def time_problems(section):
    problems = []
    for name, wanted in TIME_MS.items():
        match = re.search(rf"^  {name}\s+([\d.]+)(?:\s+([\d.]+)%)?", section, re.M)
        if not match:
            problems.append(f"no '{name}' time row")
            continue
        if not close(float(match[1]), wanted, 0.0005):
            problems.append(f"{name} {match[1]} ms, expected {wanted:.3f}")
        if name in TIME_SHARES and (match[2] is None or not close(float(match[2]), TIME_SHARES[name], 0.05)):
            problems.append(f"{name} share {match[2]}%, expected {TIME_SHARES[name]:.1f}%")
    return problems


def volume_problems(section):
    patterns = {
        "parameters": (r"^  parameters P\s+([\d,]+) B", None),
        "measured": (r"^  measured\s+([\d,]+) B = ([\d.]+) P per micro-batch", "per_micro_batch"),
        "zero3": (r"^  ZeRO-3 expects\s+([\d,]+) B .*measured / expected ([\d.]+)", "zero3_ratio"),
        "all_reduce": (r"^  all-reduce \(DDP\)\s+([\d,]+) B .*measured / all-reduce ([\d.]+)", "all_reduce_ratio"),
    }
    problems = []
    for key, (pattern, ratio_key) in patterns.items():
        match = re.search(pattern, section, re.M)
        if not match:
            problems.append(f"no row matching {pattern!r}")
            continue
        if number(match[1]) != VOLUME[key]:
            problems.append(f"{key} {match[1]} B, expected {VOLUME[key]}")
        if ratio_key and not close(float(match[2]), VOLUME[ratio_key], 0.0005):
            problems.append(f"{ratio_key} {match[2]}, expected {VOLUME[ratio_key]:.3f}")
    return problems


def run_tool(tool, *arguments):
    return subprocess.run([tool, *arguments], capture_output=True, text=True, timeout=60)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tool", default=os.environ.get("FSDPTRACE", "trace/fsdptrace"))
    args = parser.parse_args()
    report = Report()
    with tempfile.TemporaryDirectory(prefix="fsdplab-summary-") as scratch:
        rundir = os.path.join(scratch, "run")
        write_run(rundir, 2, EVENTS)
        done = run_tool(args.tool, "summary", rundir)
        report.check("fsdptrace summary exits 0 and names summary.txt last",
                     [] if done.returncode == 0 and done.stdout.rstrip().endswith(f"{rundir}/summary.txt")
                     else [f"exit {done.returncode}: {done.stderr.strip()} {done.stdout[-200:]!r}"])
        if done.returncode != 0:
            return report.finish()
        with open(os.path.join(rundir, "summary.txt"), encoding="utf-8") as file:
            text = file.read()
        ranks = sections(text)
        bodies = {rank: body.split(")", 1)[-1].strip() for rank, body in ranks.items()}  # after the file name
        report.check("one section per rank, both identical (both ranks have the same events)",
                     [] if sorted(bodies) == [0, 1] and bodies[0] == bodies[1] else [f"sections {sorted(ranks)}"])
        section = ranks.get(0, "")
        report.check("peak: bytes, line, owner, step and composition by category", peak_problems(section))
        report.check("reserved peak, fragmentation at the peak (rounding, cached) and its segment",
                     reserved_problems(section))
        report.check("collectives by op: count, bytes, bytes sent, time", collective_problems(section))
        report.check("compute / comm / overlap (interval intersection) / idle", time_problems(section))
        report.check("comm volume vs ZeRO-3 and all-reduce", volume_problems(section))
        done = run_tool(args.tool, "all", rundir)
        missing = [name for name in ("trace.json", "memory.html", "memory_snapshot.pickle", "summary.txt")
                   if not os.path.exists(os.path.join(rundir, name)) or f"{rundir}/{name}" not in done.stdout]
        report.check("fsdptrace all writes and names trace.json, memory.html, the snapshot, summary.txt",
                     [f"exit {done.returncode}, missing {missing}: {done.stderr.strip()}"] if done.returncode or missing
                     else [])
        broken = os.path.join(scratch, "broken")
        write_run(broken, 1, EVENTS[:5] + [("free", 7, {"id": 99, "bytes": 64, "category": "data", "owner": "x"})])
        done = run_tool(args.tool, "summary", broken)
        wanted = "rank0.jsonl line 8: free of id 99"
        report.check("a free of an unknown id is refused, naming file, line and id",
                     [] if done.returncode == 1 and wanted in done.stderr
                     else [f"exit {done.returncode}, stderr {done.stderr.strip()!r}, wanted {wanted!r}"])
        old = os.path.join(scratch, "version1")
        write_run(old, 1, EVENTS, version=1)
        done = run_tool(args.tool, "summary", old)
        wanted = "rank0.jsonl line 1: schema version 1, from fsdplab before the caching allocator"
        report.check("a version 1 run (before the caching allocator) is refused, naming the version",
                     [] if done.returncode == 1 and wanted in done.stderr
                     else [f"exit {done.returncode}, stderr {done.stderr.strip()!r}, wanted {wanted!r}"])
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
