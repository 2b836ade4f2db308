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
                      "round_large": 2097152, "max_split_size": 0}),                                  # 3
    ("segment_alloc", 1, {"id": 1, "addr": SEGMENT, "bytes": 2097152, "pool": "small", "stream": 0,
                          "owner": "root._local_shard", "category": "param_shard"}),                  # 4
    ("alloc", 1, {"id": 1, "bytes": 2000, "category": "param_shard", "owner": "root._local_shard"}),  # 5: 2000
    ("alloc", 2, {"id": 2, "bytes": 3000, "category": "param_shard",
                  "owner": "layers.0._local_shard"}),                                                 # 6: 5000
    ("state", 5, {"unit": "root", "machine": "HandleTrainingState", "from": "IDLE", "to": "FORWARD",
                  "hook": "_pre_forward"}),                                                           # 7
    ("alloc", 6, {"id": 3, "bytes": 4000, "category": "param_unsharded",
                  "owner": "root._full_param_padded"}),                                               # 8: 9000
    ("collective", 10, {"op": "all_gather", "unit": "root", "bytes": 4000, "bytes_sent": 2000,
                        "bytes_recv": 2000, "seq": 0, "dur": 20}),                                    # 9: [10,30)
    ("state", 30, {"unit": "root", "machine": "ShardState", "from": "SHARDED", "to": "UNSHARDED",
                   "hook": "_pre_forward"}),                                                          # 10
    ("alloc", 31, {"id": 4, "bytes": 10000, "category": "activation", "owner": "embed.output"}),      # 11: 19000
    ("compute", 40, {"name": "embed.forward", "unit": "root", "phase": "forward", "dur": 20}),        # 12: [40,60)
    ("compute", 50, {"name": "side.forward", "unit": None, "phase": None, "dur": 20}),                # 13: [50,70)
    ("state", 60, {"unit": "layers.0", "machine": "HandleTrainingState", "from": "IDLE", "to": "FORWARD",
                   "hook": "_pre_forward"}),                                                          # 14
    ("alloc", 61, {"id": 5, "bytes": 6000, "category": "param_unsharded",
                   "owner": "layers.0._full_param_padded"}),                                          # 15: 25000
    ("collective", 65, {"op": "all_gather", "unit": "layers.0", "bytes": 6000, "bytes_sent": 3000,
                        "bytes_recv": 3000, "seq": 1, "dur": 30}),                                    # 16: [65,95)
    ("free", 95, {"id": 5, "bytes": 6000, "category": "param_unsharded",
                  "owner": "layers.0._full_param_padded"}),                                           # 17: 19000
    ("collective", 96, {"op": "all_gather", "unit": "layers.0", "bytes": 6000, "bytes_sent": 3000,
                        "bytes_recv": 3000, "seq": 2, "dur": 4}),                                     # 18: [96,100)
    ("alloc", 97, {"id": 6, "bytes": 6000, "category": "grad_unsharded",
                   "owner": "layers.0.full_grad_padded"}),                                            # 19: 25000, ties
    ("free", 98, {"id": 6, "bytes": 6000, "category": "grad_unsharded",
                  "owner": "layers.0.full_grad_padded"}),                                             # 20: 19000
    ("compute", 100, {"name": "layers.0.backward", "unit": "layers.0", "phase": "backward",
                      "dur": 10}),                                                                    # 21: [100,110)
    ("alloc", 101, {"id": 7, "bytes": 7000, "category": "workspace", "owner": "layers.0.dscores"}),   # 22: 26000 PEAK
    ("collective", 105, {"op": "reduce_scatter", "unit": "layers.0", "bytes": 6000, "bytes_sent": 3000,
                         "bytes_recv": 3000, "seq": 3, "dur": 20}),                                   # 23: [105,125)
    ("free", 126, {"id": 7, "bytes": 7000, "category": "workspace", "owner": "layers.0.dscores"}),    # 24: 19000
    ("alloc", 127, {"id": 8, "bytes": 7000, "category": "workspace", "owner": "root.dscores"}),       # 25: 26000 tie
    ("collective", 130, {"op": "reduce_scatter", "unit": "root", "bytes": 4000, "bytes_sent": 2000,
                         "bytes_recv": 2000, "seq": 4, "dur": 10}),                                   # 26: [130,140)
    ("collective", 140, {"op": "all_reduce", "unit": "loss", "bytes": 4, "bytes_sent": 4, "bytes_recv": 4,
                         "seq": 5, "dur": 10}),                                                       # 27: [140,150)
    ("step", 151, {"step": 1, "micro": 0, "loss": 2.5, "peak_bytes": 26000, "peak_reserved": 2097152,
                   "time": 0.00015}),                                                                 # 28
    ("step", 152, {"step": 1, "micro": -1, "loss": 2.5, "peak_bytes": 26000, "peak_reserved": 2097152,
                   "time": 0.00015}),                                                                 # 29
    ("free", 153, {"id": 8, "bytes": 7000, "category": "workspace", "owner": "root.dscores"}),        # 30
    ("free", 154, {"id": 4, "bytes": 10000, "category": "activation", "owner": "embed.output"}),      # 31
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
# Every collective here blocks the host (stream compute): exposed comm is all of comm; the all_gathers [10,30] [65,95]
# [96,100] are never in flight together.
TIME_MS = {"span": 0.140, "compute": 0.040, "comm": 0.094, "overlap": 0.010, "idle": 0.016, "exposed comm": 0.094}
TIME_SHARES = {"compute": 100 * 40 / 140, "comm": 100 * 94 / 140, "overlap": 100 * 10 / 94, "idle": 100 * 16 / 140,
               "exposed comm": 100.0}
MAX_IN_FLIGHT = 1
# P = root 4000 + layers.0 6000 (each unit's largest buffer); the loss all_reduce is no FSDP unit's.
# measured = 4000 + 6000 + 6000 + 6000 + 4000 = 26000 over 1 micro-batch = 2.6 P; ZeRO-3 3 P = 30000; DDP 2 P.
VOLUME = {"parameters": 10000, "measured": 26000, "per_micro_batch": 2.6, "zero3": 30000, "zero3_ratio": 26 / 30,
          "all_reduce": 20000, "all_reduce_ratio": 1.3}


# A run on three streams (EVENTS.md version 3): all-gathers on the all_gather stream (prefetched: issued before their
# stream starts them), reduce-scatters on the reduce_scatter stream, one blocking all_reduce on the compute stream,
# and the host's waits. (kind, ts, fields); line numbers start at 3.
AG, RS = "all_gather", "reduce_scatter"


def collective(op, unit, seq, stream, issue_ts, dur, reduce=None):
    return {"op": op, "unit": unit, "bytes": 4000, "bytes_sent": 2000, "bytes_recv": 2000, "seq": seq,
            "stream": stream, "issue_ts": issue_ts, "dur": dur, "reduce": reduce}


def wait(on, op, unit, seq, hook, dur):
    return {"stream": "compute", "on": on, "op": op, "unit": unit, "seq": seq, "hook": hook, "dur": dur}


STREAM_EVENTS = [
    EVENTS[0], EVENTS[1], EVENTS[2],                                              # allocator, segment, alloc id 1
    ("fsdp", 1, {"model": "Qwen2ForCausalLM", "sharding_strategy": "FULL_SHARD", "backward_prefetch": "BACKWARD_PRE",
                 "forward_prefetch": False, "limit_all_gathers": True, "activation_checkpointing": False,
                 "no_sync": False, "accumulation_steps": 1, "unit_count": 2}),
    ("collective", 10, collective(AG, "root", 0, AG, 10, 20)),                     # [10,30] issued 10
    ("wait", 12, wait(AG, AG, "root", 0, "_pre_forward", 19)),                    # [12,31)
    ("compute", 31, {"name": "root.forward", "unit": "root", "phase": "forward", "dur": 14}),       # [31,45)
    ("collective", 30, collective(AG, "layers.0", 1, AG, 12, 20)),                 # [30,50] issued 12: queued 18
    ("wait", 45, wait(AG, AG, "layers.0", 1, "_pre_forward", 5)),                 # [45,50)
    ("compute", 50, {"name": "layers.0.forward", "unit": "layers.0", "phase": "forward", "dur": 20}),  # [50,70)
    ("collective", 70, collective(AG, "layers.0", 2, AG, 30, 10)),                 # [70,80] issued 30
    ("wait", 70, wait(AG, AG, "layers.0", 2, "_pre_backward_hook", 10)),          # [70,80)
    ("collective", 80, collective(AG, "root", 3, AG, 80, 15)),                     # [80,95] BACKWARD_PRE prefetch
    ("compute", 80, {"name": "layers.0.backward", "unit": "layers.0", "phase": "backward", "dur": 20}),  # [80,100)
    ("wait", 100, wait(AG, AG, "root", 3, "_pre_backward_hook", 0)),              # [100,100): done already
    ("collective", 100, collective(RS, "layers.0", 4, RS, 100, 30, "avg")),        # [100,130]
    ("compute", 100, {"name": "root.backward", "unit": "root", "phase": "backward", "dur": 20}),    # [100,120)
    ("collective", 130, collective(RS, "root", 5, RS, 120, 10, "avg")),            # [130,140] issued 120
    ("wait", 120, wait(RS, RS, "root", 5, "_post_backward_final_callback", 20)),  # [120,140)
    ("collective", 140, collective("all_reduce", "loss", 6, "compute", 140, 5, "sum")),  # [140,145] blocking
    ("wait", 145, wait("compute", None, None, -1, None, 3)),                      # [145,148): the rate limiter
    ("compute", 148, {"name": "adamw", "unit": None, "phase": "optimizer", "dur": 10}),  # [148,158)
    ("step", 159, {"step": 1, "micro": -1, "loss": 2.5, "peak_bytes": 2000, "peak_reserved": 2097152,
                   "time": 0.00015}),
    ("free", 160, {"id": 1, "bytes": 2000, "category": "param_shard", "owner": "root._local_shard"}),
]
# compute union [31,45) [50,70) [80,120) [148,158) = 14 + 20 + 40 + 10 = 84 us; comm union [10,50] [70,95] [100,145]
# = 40 + 25 + 45 = 110; span [10,158) = 148; overlap [31,45) + [80,95) + [100,120) = 14 + 15 + 20 = 49 ([50,70)
# only touches [10,50]); idle 148 - (84 + 110 - 49) = 3 (the rate limiter's wait [145,148)). Per stream: all_gather
# [10,50] + [70,95] = 65, reduce_scatter [100,140] = 40, compute (the blocking all_reduce) 5. Waits for comm
# streams: 19 + 5 + 10 + 0 + 20 = 54 (disjoint); exposed = 54 + the blocking all_reduce's 5 = 59 = 53.6% of comm.
# All-gathers in flight, [issue_ts, ts + dur]: seq 0 [10,30], seq 1 [12,50], seq 2 [30,80], seq 3 [80,95]: two at
# most (at 30 seq 0 completes as seq 2 is issued: touching intervals are not in flight together; three if they were).
STREAM_TIME_MS = {"span": 0.148, "compute": 0.084, "comm": 0.110, "overlap": 0.049, "idle": 0.003,
                  "exposed": 0.059, "wait": 0.054, "blocking_comm": 0.005}
STREAM_SHARES = {"compute": 100 * 84 / 148, "comm": 100 * 110 / 148, "overlap": 100 * 49 / 110,
                 "exposed comm": 100 * 59 / 110, "idle": 100 * 3 / 148}
STREAM_COMM_MS = {"compute": 0.005, "all_gather": 0.065, "reduce_scatter": 0.040}
STREAM_MAX_IN_FLIGHT = 2
STREAM_FSDP_LINE = ("fsdp (line 6): Qwen2ForCausalLM FULL_SHARD, backward_prefetch BACKWARD_PRE, forward_prefetch off, "
                    "limit_all_gathers on, activation_checkpointing off, no_sync off, 1 accumulation steps, 2 units")


def write_run(rundir, world, events, version=4):
    os.makedirs(rundir, exist_ok=True)
    for rank in range(world):
        with open(os.path.join(rundir, f"rank{rank}.jsonl"), "w", encoding="utf-8") as file:
            lines = [{"kind": "meta", "ts": 0, "rank": rank, "schema": "fsdplab-events", "version": version,
                      "world": world, "unix_time": 0},
                     {"kind": "mark", "ts": 0, "rank": rank, "text": "t0"}]
            live = {}  # category -> live bytes, so the files also pass tests/validate_trace.py
            for kind, ts, fields in events:
                line = {"kind": kind, "ts": ts, "rank": rank, **fields}
                if kind in ("alloc", "free"):
                    category = fields["category"]
                    live[category] = live.get(category, 0) + (fields["bytes"] if kind == "alloc" else -fields["bytes"])
                    line.update({"live": sum(live.values()), "category_live": live[category]})
                if kind == "collective":
                    line.update({"reduce": fields.get("reduce"), "count": fields["bytes"] // 4, "world": world})
                    if version >= 3:  # the blocking forms, unless the event says otherwise
                        line.setdefault("stream", "compute")
                        line.setdefault("issue_ts", ts)
                if kind == "compute" and version >= 3:
                    line.setdefault("stream", "compute")
                if kind in ("alloc", "free", "collective") and version >= 4:  # float32 (data: int32) unless said
                    line.setdefault("dtype", "int32" if fields.get("category") == "data" else "float32")
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
                     "activation", "checkpoint_input", "workspace", "comm_buffer", "data", "kv_cache",
                     "param_shard_low_precision"]:
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
    for name, pattern in (("rounding", r"^  rounding .*?([\d,]+) B$"),
                          ("cached", r"^  free in segments .*?([\d,]+) B$")):
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


def time_problems(section, times=TIME_MS, shares=TIME_SHARES, in_flight=MAX_IN_FLIGHT):
    problems = []
    match = re.search(r"^  all-gathers in flight \(max\)\s+(\d+)", section, re.M)
    if not match or int(match[1]) != in_flight:
        problems.append(f"all-gathers in flight (max): {match and match[1]}, expected {in_flight}")
    for name, wanted in times.items():
        match = re.search(rf"^  {name}\s+([\d.]+)(?:\s+([\d.]+)%)?", section, re.M)
        if not match:
            problems.append(f"no '{name}' time row")
            continue
        if not close(float(match[1]), wanted, 0.0005):
            problems.append(f"{name} {match[1]} ms, expected {wanted:.3f}")
        if name in shares and (match[2] is None or not close(float(match[2]), shares[name], 0.05)):
            problems.append(f"{name} share {match[2]}%, expected {shares[name]:.1f}%")
    return problems


def stream_problems(section):
    """The streams run's time section: the rows of time_problems, comm per stream, and the fsdp mode line."""
    times = {name: STREAM_TIME_MS[name] for name in ("span", "compute", "comm", "overlap", "idle")}
    times["exposed comm"] = STREAM_TIME_MS["exposed"]
    problems = time_problems(section, times, STREAM_SHARES, STREAM_MAX_IN_FLIGHT)
    rows = {stream: (float(ms), float(percent)) for stream, ms, percent in
            re.findall(r"^    stream (\w+)(?: \(blocking\))?\s+([\d.]+)\s+([\d.]+)% of comm$", section, re.M)}
    for stream, wanted in STREAM_COMM_MS.items():
        found = rows.get(stream)
        if found is None or not close(found[0], wanted, 0.0005) or \
                not close(found[1], 100 * wanted / STREAM_TIME_MS["comm"], 0.05):
            problems.append(f"comm on stream {stream}: {found}, expected {wanted} ms")
    match = re.search(r"waits for comm streams ([\d.]+) and blocking collectives ([\d.]+)", section)
    if not match or (float(match[1]), float(match[2])) != (STREAM_TIME_MS["wait"], STREAM_TIME_MS["blocking_comm"]):
        problems.append(f"exposed comm's parts: {match and match.groups()}")
    if STREAM_FSDP_LINE not in section:
        problems.append(f"no line {STREAM_FSDP_LINE!r}")
    return problems


def overlap_problems(tool, rundir, world):
    """`fsdptrace overlap`: the same figures as JSON, in ms, to the float's precision."""
    done = run_tool(tool, "overlap", rundir)
    if done.returncode != 0:
        return [f"exit {done.returncode}: {done.stderr.strip()}"]
    found = json.loads(done.stdout)
    problems = [] if found.get("world") == world and len(found.get("ranks", [])) == world else [f"ranks: {found}"]
    for rank in found.get("ranks", []):
        wanted = {f"{name}_ms": value for name, value in STREAM_TIME_MS.items()}
        wanted.update({"max_all_gathers_in_flight": STREAM_MAX_IN_FLIGHT, "stream_comm_ms": STREAM_COMM_MS})
        for key, value in wanted.items():
            got = rank.get(key)
            same = (all(close(got.get(name, -1), each, 1e-9) for name, each in value.items()) and len(got) == 3
                    if isinstance(value, dict) else got is not None and close(got, value, 1e-9))
            if not same:
                problems.append(f"rank {rank.get('rank')}: {key} {got}, expected {value}")
        fsdp = rank.get("fsdp") or {}
        if (fsdp.get("sharding_strategy"), fsdp.get("backward_prefetch"), fsdp.get("limit_all_gathers")) != \
                ("FULL_SHARD", "BACKWARD_PRE", True):
            problems.append(f"rank {rank.get('rank')}: fsdp {fsdp}")
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


def layout_problems(section):
    """The category table's columns stay straight with the longest category name (param_shard_low_precision): every
    row's bytes end in one column, its name apart from them; the collectives' time column and the comm row say the
    time includes waiting for peers."""
    problems = []
    table = re.search(r"^  category .*\n((?:  \w+ +[\d,]+ +[\d.]+%\n)+)", section, re.M)
    if table is None:
        return ["no category table"]
    rows = table[1].splitlines()
    names = [row.split()[0] for row in rows]
    if "param_shard_low_precision" not in names:
        problems.append(f"no param_shard_low_precision row in {names}")
    ends = {re.search(r"[\d,]+(?= +[\d.]+%$)", row).end() for row in rows}
    header_end = table[0].splitlines()[0].index("bytes") + len("bytes")
    if len(ends) != 1 or ends != {header_end}:
        problems.append(f"the bytes column ends at {sorted(ends)} (header at {header_end}): {rows}")
    if any(not re.match(r"  \w+ {2,}", row) for row in rows):
        problems.append(f"a name runs into its bytes: {rows}")
    if not re.search(r"^  collective .*time ms.*incl\. waiting for peers", section, re.M):
        problems.append("the collectives' header does not say the time includes waiting for peers")
    if not re.search(r"^  comm .*incl\. waiting for peers", section, re.M):
        problems.append("the comm time row does not say it includes waiting for peers")
    return problems


def run_tool(tool, *arguments):
    return subprocess.run([tool, *arguments], capture_output=True, text=True, timeout=60)


def windows_problems(tool, scratch):
    """`fsdptrace overlap --windows "mode "`: the streams run cut by marks into window A (up to the blocking
    all_reduce's line) and B (from it to "mode end"). B: the all_reduce [140,145], the limiter's wait, adamw
    [148,158): comm 5, compute 10, exposed 5 (blocking), waits 0, span 18, no all_gather. A: the rest: comm [10,50]
    [70,95] [100,140] = 105, exposed 54 (the waits), all-gathers in flight 2."""
    rundir = os.path.join(scratch, "windows")
    cut = next(index for index, (kind, _, fields) in enumerate(STREAM_EVENTS) if fields.get("op") == "all_reduce")
    events = (STREAM_EVENTS[:4] + [("mark", 5, {"text": "mode A"})] + STREAM_EVENTS[4:cut]
              + [("mark", 140, {"text": "mode B"})] + STREAM_EVENTS[cut:-2] + [("mark", 158, {"text": "mode end"})]
              + STREAM_EVENTS[-2:])
    write_run(rundir, 1, events)
    done = run_tool(tool, "overlap", rundir, "--windows", "mode ")
    if done.returncode != 0:
        return [f"exit {done.returncode}: {done.stderr.strip()}"]
    windows = {window["name"]: window for window in json.loads(done.stdout)["ranks"][0].get("windows", [])}
    wanted = {"A": {"comm_ms": 0.105, "exposed_ms": 0.054, "wait_ms": 0.054, "max_all_gathers_in_flight": 2},
              "B": {"comm_ms": 0.005, "compute_ms": 0.010, "exposed_ms": 0.005, "wait_ms": 0.0, "span_ms": 0.018,
                    "blocking_comm_ms": 0.005, "max_all_gathers_in_flight": 0}}
    if sorted(windows) != ["A", "B"]:
        return [f"windows {sorted(windows)}, expected ['A', 'B']"]
    return [f"window {name} {key}: {windows[name][key]}, expected {value}"
            for name, figures in wanted.items() for key, value in figures.items()
            if not close(windows[name][key], value, 1e-9)]


def write_streams_run(tool, rundir):
    """The streams run on 2 ranks, exported (`fsdptrace all`), for validate_trace.py and the viewers."""
    write_run(rundir, 2, STREAM_EVENTS)
    done = run_tool(tool, "all", rundir)
    if done.returncode != 0:
        print(f"fsdptrace all {rundir}: exit {done.returncode}: {done.stderr.strip()}", file=sys.stderr)
    return done.returncode


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tool", default=os.environ.get("FSDPTRACE", "trace/fsdptrace"))
    parser.add_argument("--write-streams-run", metavar="DIR",
                        help="only write the two-stream synthetic run into DIR and export its views")
    args = parser.parse_args()
    if args.write_streams_run:
        return write_streams_run(args.tool, args.write_streams_run)
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
        report.check("columns: the category table as wide as its longest name, 'incl. waiting for peers' on the "
                     "collectives' time and comm", layout_problems(section))
        report.check("compute / comm / overlap (interval intersection) / idle", time_problems(section))
        report.check("comm volume vs ZeRO-3 and all-reduce", volume_problems(section))
        old = os.path.join(scratch, "version2")  # no streams: every collective read as a blocking one
        write_run(old, 2, EVENTS, version=2)
        done = run_tool(args.tool, "summary", old)
        text2 = open(os.path.join(old, "summary.txt"), encoding="utf-8").read() if done.returncode == 0 else ""
        section2 = sections(text2).get(0, "")
        report.check("a version 2 run reads, its collectives blocking on the compute stream (same time figures)",
                     time_problems(section2) if done.returncode == 0
                     else [f"exit {done.returncode}: {done.stderr.strip()}"])
        streams = os.path.join(scratch, "streams")
        write_run(streams, 2, STREAM_EVENTS)
        done = run_tool(args.tool, "summary", streams)
        text3 = open(os.path.join(streams, "summary.txt"), encoding="utf-8").read() if done.returncode == 0 else ""
        report.check("streams run: comm per stream, overlap, exposed comm (waits + blocking), all-gathers in flight, "
                     "the fsdp mode", stream_problems(sections(text3).get(1, "")) if done.returncode == 0
                     else [f"exit {done.returncode}: {done.stderr.strip()}"])
        report.check("fsdptrace overlap: the streams run's figures as JSON, per rank", overlap_problems(args.tool,
                                                                                                          streams, 2))
        report.check("fsdptrace overlap --windows: the figures between marks", windows_problems(args.tool, scratch))
        done = run_tool(args.tool, "all", rundir)
        missing = [name for name in ("trace.json", "memory.html", "player.html", "memory_snapshot.pickle",
                                     "summary.txt")
                   if not os.path.exists(os.path.join(rundir, name)) or f"{rundir}/{name}" not in done.stdout]
        report.check("fsdptrace all writes and names trace.json, memory.html, player.html, the snapshot, summary.txt",
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
