#!/usr/bin/env python3
"""validate_trace.py: checks a run directory's events and its Chrome export against trace/EVENTS.md.

    python3 tests/validate_trace.py <rundir> [--expect-ranks N] [--trace path/to/trace.json]

Reads <rundir>/rank<R>.jsonl (the contract) and <rundir>/trace.json (made by `fsdptrace chrome`), recomputes what
the export must contain from the JSONL lines, and prints one OK / FAIL line per rule, then a summary line.
Exit status 1 when any rule fails. Standard library only, so it runs wherever the lab runs.
"""
import argparse
import bisect
import json
import os
import sys
from collections import defaultdict

from check_report import Report

SCHEMA_NAME = "fsdplab-events"
SCHEMA_VERSION = 4
# Version 3 had no process groups (every collective ran in the world) and no pools (every memory event is the
# device's); it still validates, as trace/run.c reads it.
READABLE_VERSIONS = (3, 4)
# EVENTS.md's order; every memory counter sample carries all of them, in this order.
CATEGORIES = ["param_shard", "param_unsharded", "grad_unsharded", "grad_shard", "optim_state",
              "activation", "checkpoint_input", "workspace", "comm_buffer", "data", "kv_cache",
              "param_shard_low_precision"]
# EVENTS.md version 4: the element types and their sizes in bytes.
DTYPE_SIZES = {"float32": 4, "bfloat16": 2, "int32": 4, "uint16": 2, "uint8": 1}
# A rank's tracks; the tid of track T in process pid is pid * 10 + T (tid_of), never the pid itself. compute, comm
# and memory are always named; a stream's track only when the rank has a collective on it.
TRACK_NAMES = {1: "compute", 2: "comm", 3: "memory", 4: "all_gather stream", 5: "reduce_scatter stream"}
ALWAYS_NAMED = (1, 2, 3)
COMPUTE_TRACK, COMM_TRACK = 1, 2
STREAMS = ("compute", "all_gather", "reduce_scatter")
# The track of a collective by its stream: the blocking forms (stream "compute") on comm, the others on their own.
STREAM_TRACK = {"compute": 2, "all_gather": 4, "reduce_scatter": 5}
COLLECTIVE_TRACKS = set(STREAM_TRACK.values())
# JSONL kind -> (Chrome phase, track) it becomes; the counts per rank must agree. A collective's track is its
# stream's (track_of_line).
KIND_TO_TRACK = {"compute": ("X", 1), "collective": ("X", None), "wait": ("X", 1), "state": ("i", 1),
                 "mark": ("i", 1), "step": ("i", 1), "fsdp": ("i", 1), "end": ("i", 1), "alloc": ("C", 3),
                 "free": ("C", 3),
                 "segment_alloc": ("C", 3), "segment_free": ("C", 3), "copy": ("X", None)}
# Version 4: memory events name their pool ("device" when absent). The Chrome export draws the device pool's
# counters only (as torch's memory views show the CUDA allocator); the host pool (CPU offload) is checked here alone.
POOLS = ("device", "host")
MEMORY_KINDS = ("alloc", "free", "segment_alloc", "segment_free", "allocator")


def pool_of(line):
    return line.get("device", "device") if line.get("kind") in MEMORY_KINDS else None


def pool_lines(lines, pool):
    """The lines of one pool: its memory events and every other kind (so the meta line and marks stay)."""
    return [(number, line) for number, line in lines if pool_of(line) in (None, pool)]
FLOW_PHASES = ("s", "f")  # v1 flow events: the arrows joining a collective across ranks
# ts and dur are written rounded to 1 ns (0.001 us): each is off by at most 0.5 ns, a span's end (ts + dur) by 1 ns,
# so two moments of different lines compare true within 2 ns. Our writer rounds ends, not durs, so its spans keep
# their order exactly; the slack is for any writer that rounds each field, plus the float sum's own error.
ROUNDING_US = 0.002
# A flow event sits this far into the slice it binds to (or half the collective's shortest slice, when less): at the
# slice's very start Catapult would bind it to a slice of the same stream that ends there.
FLOW_OFFSET_US = 0.001


def track_of_line(line):
    """The track a JSONL line's Chrome event goes to."""
    phase, track = KIND_TO_TRACK[line["kind"]]
    if line["kind"] == "copy":  # a copy the host ran sits on the compute track, else on its stream's
        return COMPUTE_TRACK if line.get("stream") == "compute" else STREAM_TRACK.get(line.get("stream"), COMM_TRACK)
    return STREAM_TRACK.get(line.get("stream"), COMM_TRACK) if track is None else track


def tid_of(pid, track):
    """Perfetto takes the thread whose tid equals its pid for the main thread and labels it so: tids avoid pids."""
    return pid * 10 + track


def is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def read_jsonl(path, problems):
    """[(line_number, event)] of one rank file. A last line with no newline that does not parse was cut short by
    a crash: the exporter skips it, so do we (with the same warning)."""
    with open(path, encoding="utf-8") as file:
        texts = file.readlines()
    events = []
    for number, text in enumerate(texts, start=1):
        try:
            event = json.loads(text)
            if not isinstance(event, dict):
                raise ValueError("not an object")
        except ValueError as error:
            if number == len(texts) and not text.endswith("\n"):
                print(f"warning: {path} line {number}: skipping a last line cut short ({len(text)} bytes)",
                      file=sys.stderr)
            else:
                problems.append(f"{path} line {number}: not a JSON object ({error}): {text[:80]!r}")
            continue
        events.append((number, event))
    return events


def read_ranks(rundir, expect_ranks, report):
    """{rank: [(line, event)]} for every rank the meta line of rank0.jsonl names, or None when unusable."""
    problems = []
    rank0 = os.path.join(rundir, "rank0.jsonl")
    if not os.path.exists(rank0):
        report.check(f"JSONL files and meta lines in {rundir}", [f"{rank0} is missing"])
        return None
    ranks = {0: read_jsonl(rank0, problems)}
    world = meta_check(rank0, ranks[0], 0, None, problems)
    if world is None:
        report.check("JSONL files and meta lines", problems)
        return None
    if expect_ranks is not None and world != expect_ranks:
        problems.append(f"{rank0}: meta world {world}, expected {expect_ranks} ranks (--expect-ranks)")
    for rank in range(1, world):
        path = os.path.join(rundir, f"rank{rank}.jsonl")
        if not os.path.exists(path):
            problems.append(f"{path} is missing (rank0.jsonl says world {world})")
            continue
        ranks[rank] = read_jsonl(path, problems)
        meta_check(path, ranks[rank], rank, world, problems)
    extra = os.path.join(rundir, f"rank{world}.jsonl")
    if os.path.exists(extra):
        problems.append(f"{extra} exists but rank0.jsonl says world {world}")
    report.check(f"JSONL files and meta lines ({world} ranks, schema {SCHEMA_NAME} v{SCHEMA_VERSION})", problems)
    return ranks if len(ranks) == world else None


def meta_check(path, events, rank, world, problems):
    """The world size the meta line states, or None when the line is not a usable meta line."""
    if not events or events[0][0] != 1 or events[0][1].get("kind") != "meta":
        problems.append(f"{path} line 1: not a 'meta' event")
        return None
    meta = events[0][1]
    if meta.get("schema") != SCHEMA_NAME or meta.get("version") not in READABLE_VERSIONS:
        problems.append(f"{path} line 1: schema {meta.get('schema')!r} version {meta.get('version')!r}, "
                        f"expected {SCHEMA_NAME!r} version {' or '.join(map(str, READABLE_VERSIONS))}")
    if meta.get("rank") != rank:
        problems.append(f"{path} line 1: meta rank {meta.get('rank')!r}, the file name says {rank}")
    if not is_int(meta.get("world")) or meta["world"] < 1:
        problems.append(f"{path} line 1: meta world {meta.get('world')!r} is not a world size")
        return None
    if world is not None and meta["world"] != world:
        problems.append(f"{path} line 1: meta world {meta['world']}, rank0.jsonl says {world}")
    return meta["world"]


def read_trace(path, report):
    """The traceEvents list, or None (reported) when the file is not a trace."""
    try:
        with open(path, encoding="utf-8") as file:
            trace = json.load(file)
    except (OSError, ValueError) as error:
        report.check(f"{path} parses", [str(error)])
        return None
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        report.check(f"{path} parses", ["no traceEvents list at the top level"])
        return None
    report.check(f"{path} parses ({len(trace['traceEvents'])} events)", [])
    return trace["traceEvents"]


def describe(index, event):
    return f"event {index} ({event.get('ph')} {event.get('name')!r} pid {event.get('pid')} tid {event.get('tid')})"


def check_fields(events, report):
    """True when every event has the fields the later checks read (a pid of 0 or a negative ts fails here but
    does not stop them)."""
    problems, usable = [], True
    for index, event in enumerate(events):
        if not isinstance(event, dict):
            problems.append(f"event {index}: not an object")
            usable = False
            continue
        missing = [key for key in ("ph", "name") if not isinstance(event.get(key), str)]
        missing += ["pid"] if not is_int(event.get("pid")) else []
        needs_tid = event.get("ph") != "M" or str(event.get("name", "")).startswith("thread_")
        missing += ["tid"] if needs_tid and not is_int(event.get("tid")) else []
        missing += ["ts"] if event.get("ph") != "M" and not is_number(event.get("ts")) else []
        if missing:
            problems.append(f"{describe(index, event)}: no {', '.join(missing)} of the right type")
            usable = False
        if event.get("pid") == 0:
            problems.append(f"{describe(index, event)}: pid 0 (pids are rank + 1; some viewers hide pid 0)")
        if is_int(event.get("tid")) and event.get("tid") == event.get("pid"):
            problems.append(f"{describe(index, event)}: tid equals pid (Perfetto would call it the main thread)")
        if is_number(event.get("ts")) and event["ts"] < 0:
            problems.append(f"{describe(index, event)}: ts {event['ts']} < 0")
    report.check("every event has ph, name, pid != 0, tid != pid, ts >= 0", problems)
    return usable


def timed(events):
    """(index, event) of the events placed on a track, i.e. all but metadata."""
    return [(index, event) for index, event in enumerate(events) if event["ph"] != "M"]


def check_order(events, report):
    problems = []
    last = {}
    for index, event in timed(events):
        track = (event["pid"], event["tid"])
        if track in last and event["ts"] < last[track][1]:
            problems.append(f"{describe(index, event)}: ts {event['ts']} after ts {last[track][1]} "
                            f"(event {last[track][0]}) on the same track")
        last[track] = (index, event["ts"])
    report.check("ts non-decreasing within each (pid, tid)", problems)


def check_spans(events, report):
    problems = []
    depth = defaultdict(int)
    for index, event in timed(events):
        track = (event["pid"], event["tid"])
        if event["ph"] == "X" and (not is_number(event.get("dur")) or event["dur"] < 0):
            problems.append(f"{describe(index, event)}: dur {event.get('dur')!r} is not a number >= 0")
        elif event["ph"] == "B":
            depth[track] += 1
        elif event["ph"] == "E":
            depth[track] -= 1
            if depth[track] < 0:
                problems.append(f"{describe(index, event)}: E without a B on its track")
                depth[track] = 0
    problems += [f"pid {pid} tid {tid}: {count} B event(s) never ended" for (pid, tid), count in depth.items() if count]
    report.check("X events have dur >= 0, B/E balanced per track", problems)


def check_names(events, world, report):
    problems = []
    process_names, thread_names = {}, {}
    for event in events:
        if event["ph"] == "M" and event["name"] == "process_name":
            process_names[event["pid"]] = event.get("args", {}).get("name")
        if event["ph"] == "M" and event["name"] == "thread_name":
            thread_names[(event["pid"], event.get("tid"))] = event.get("args", {}).get("name")
    pids = {event["pid"] for event in events}
    if pids != set(range(1, world + 1)):
        problems.append(f"pids {sorted(pids)}, expected 1..{world} (rank + 1)")
    used = {(event["pid"], event["tid"]) for event in events if event["ph"] != "M"}
    for pid in sorted(pids):
        if process_names.get(pid) != f"rank {pid - 1}":
            problems.append(f"pid {pid}: process_name {process_names.get(pid)!r}, expected 'rank {pid - 1}'")
        for track, name in TRACK_NAMES.items():
            tid = tid_of(pid, track)
            wanted = name if track in ALWAYS_NAMED or (pid, tid) in used else None
            if thread_names.get((pid, tid)) != wanted:
                problems.append(f"pid {pid} tid {tid}: thread_name {thread_names.get((pid, tid))!r}, expected "
                                f"{wanted!r}")
    strays = sorted(key for key in thread_names if key[1] not in {tid_of(key[0], track) for track in TRACK_NAMES})
    problems += [f"pid {pid} tid {tid}: a thread that is no track of EVENTS.md" for pid, tid in strays]
    report.check("pids are rank + 1, named 'rank N', threads compute / comm / memory with tid pid * 10 + 1..3, "
                 "'all_gather stream' / 'reduce_scatter stream' (+ 4, 5) when used", problems)


def check_counts(events, ranks, report):
    """Every JSONL event of a known kind becomes exactly one trace event on its track: nothing dropped or doubled.
    Flow events come from no line of their own (check_flows counts them)."""
    expected, found = defaultdict(int), defaultdict(int)
    for rank, lines in ranks.items():
        for _, line in lines[1:]:
            # the host pool's memory events too: "host memory" / "host reserved" counters on the same track
            if line.get("kind") in KIND_TO_TRACK:
                phase = KIND_TO_TRACK[line["kind"]][0]
                expected[(rank + 1, phase, tid_of(rank + 1, track_of_line(line)))] += 1
    for _, event in timed(events):
        if event["ph"] not in FLOW_PHASES:
            found[(event["pid"], event["ph"], event["tid"])] += 1
    problems = []
    for pid, ph, tid in sorted(set(expected) | set(found)):
        if found[(pid, ph, tid)] != expected[(pid, ph, tid)]:
            problems.append(f"rank {pid - 1}: {found[(pid, ph, tid)]} '{ph}' events on tid {tid}, "
                            f"the JSONL has {expected[(pid, ph, tid)]}")
    report.check("one trace event per JSONL event, on the right track", problems)


def memory_sums(lines):
    """[(line_number, line, {category: live bytes})] after each alloc/free, in file order."""
    live = dict.fromkeys(CATEGORIES, 0)
    sums = []
    for number, line in lines:
        if line.get("kind") not in ("alloc", "free"):
            continue
        size = line.get("bytes") if is_number(line.get("bytes")) else 0
        category = line.get("category")
        live.setdefault(category, 0)  # an unknown category is reported by check_memory_jsonl
        live[category] += size if line["kind"] == "alloc" else -size
        sums.append((number, line, dict(live)))
    return sums


def check_memory_jsonl(ranks, report):
    problems = []
    for (rank, pool), lines in pooled(ranks):
        for number, line, live in memory_sums(lines):
            where = (f"rank {rank} {pool} pool line {number} ({line['kind']} {line.get('bytes')} B "
                     f"{line.get('category')!r})")
            if line.get("category") not in CATEGORIES:
                problems.append(f"{where}: category is not one of EVENTS.md's {len(CATEGORIES)}")
            if line.get("dtype") not in DTYPE_SIZES:
                problems.append(f"{where}: dtype {line.get('dtype')!r} is not one of {sorted(DTYPE_SIZES)}")
            elif line.get("bytes", 0) % DTYPE_SIZES[line["dtype"]] != 0:
                problems.append(f"{where}: {line.get('bytes')} bytes is not a whole number of {line['dtype']}")
            if line.get("category_live") != live[line.get("category")]:
                problems.append(f"{where}: category_live {line.get('category_live')}, running sum "
                                f"{live[line.get('category')]}")
            if line.get("live") != sum(live.values()):
                problems.append(f"{where}: live {line.get('live')}, running sum {sum(live.values())}")
    report.check("JSONL alloc/free live and category_live equal the running sums", problems)


def allocator_replay(rank, lines, problems):
    """EVENTS.md's allocator invariants, replayed independently of trace/segments.c: every alloc's [addr, addr + size)
    lies in the live segment its `segment` names, no two live blocks overlap, a segment is freed empty and as it was
    allocated, size is bytes rounded up to the allocator's `round` (0 bytes take one block), and every `reserved` is
    the running sum of segment bytes. Returns [(line_number, reserved after it)] of the segment events, in order."""
    segments, blocks, reserved, samples = {}, {}, 0, []
    settings = next((line for _, line in lines if line.get("kind") == "allocator"), None)
    if settings is None:
        problems.append(f"rank {rank}: no 'allocator' event")
        return samples
    granule = settings.get("round", 512)
    for number, line in lines:
        kind, where = line.get("kind"), f"rank {rank} line {number}"
        if kind == "segment_alloc":
            start, end = line["addr"], line["addr"] + line["bytes"]
            for other, (other_end, _, _) in segments.items():
                if start < other_end and other < end:
                    problems.append(f"{where}: segment [{start:#x}, {end:#x}) overlaps live segment {other:#x}")
            segments[start] = (end, line["bytes"], number)
            reserved += line["bytes"]
        elif kind == "segment_free":
            held = segments.pop(line["addr"], None)
            if held is None or held[1] != line["bytes"]:
                problems.append(f"{where}: segment_free of {line['addr']:#x} ({line['bytes']} B), not a live segment "
                                f"of that size")
            inside = [block for block, (_, segment, _) in blocks.items() if segment == line["addr"]]
            if inside:
                problems.append(f"{where}: segment {line['addr']:#x} freed holding {len(inside)} live blocks")
            reserved -= line["bytes"]
        elif kind in ("alloc", "free"):
            start, size, segment = line.get("addr"), line.get("size"), line.get("segment")
            rounded = max(granule, -(-line.get("bytes", 0) // granule) * granule)
            if settings.get("mode") == "caching" and size is not None and size < rounded:
                problems.append(f"{where}: block size {size} for {line.get('bytes')} B, expected at least {rounded}")
            if kind == "alloc":
                held = segments.get(segment)
                if held is None or not (segment <= start and start + size <= held[0]):
                    problems.append(f"{where}: block [{start:#x}, +{size}) is not inside a live segment at "
                                    f"{segment:#x}")
                for other, (other_size, _, other_line) in blocks.items():
                    if start < other + other_size and other < start + size:
                        problems.append(f"{where}: block [{start:#x}, +{size}) overlaps the live block of line "
                                        f"{other_line}")
                blocks[start] = (size, segment, number)
            elif blocks.pop(start, (None,))[0] != size:
                problems.append(f"{where}: free of block [{start:#x}, +{size}), which is not live")
        else:
            continue
        if line.get("reserved") != reserved:
            problems.append(f"{where}: reserved {line.get('reserved')}, running sum of segments {reserved}")
        if kind.startswith("segment"):
            samples.append((number, reserved))
    return samples


def pooled(ranks):
    """((rank, pool), that pool's lines) for every rank and every pool it has events of."""
    for rank, lines in ranks.items():
        for pool in POOLS:
            if pool == "device" or any(pool_of(line) == pool for _, line in lines):
                yield (rank, pool), pool_lines(lines, pool)


def check_allocator_jsonl(ranks, report):
    problems = []
    for (rank, pool), lines in pooled(ranks):
        allocator_replay(f"{rank} ({pool} pool)", lines, problems)
    report.check("JSONL blocks lie inside live segments, never overlap, and reserved is the running sum of segments",
                 problems[:20] + ([f"... {len(problems) - 20} more"] if len(problems) > 20 else []))


def check_reserved_counters(events, ranks, report):
    problems = []
    for rank, lines in ranks.items():
        expected = allocator_replay(rank, pool_lines(lines, "device"), [])
        counters = [event for event in events
                    if event["ph"] == "C" and event["name"] == "reserved" and event["pid"] == rank + 1]
        if len(counters) != len(expected):
            problems.append(f"rank {rank}: {len(counters)} reserved counter events, {len(expected)} segment lines")
        for event, (number, reserved) in zip(counters, expected):
            if event.get("args") != {"reserved": reserved}:
                problems.append(f"rank {rank} (line {number}): reserved counter {event.get('args')}, running sum "
                                f"{reserved}")
    report.check("reserved counters equal the running sum of segment bytes, in order", problems)


def check_memory_counters(events, ranks, report):
    problems = []
    for rank, lines in ranks.items():
        expected = memory_sums(pool_lines(lines, "device"))
        counters = [(index, event) for index, event in enumerate(events)
                    if event["ph"] == "C" and event["name"] == "memory" and event["pid"] == rank + 1]
        if len(counters) != len(expected):
            problems.append(f"rank {rank}: {len(counters)} memory counter events, {len(expected)} alloc/free lines")
        for (index, event), (number, _, live) in zip(counters, expected):
            args = event.get("args", {})
            if list(args) != CATEGORIES:
                problems.append(f"rank {rank} event {index}: counter series {list(args)}, expected {CATEGORIES}")
            wrong = {name: (args.get(name), live[name]) for name in CATEGORIES if args.get(name) != live[name]}
            if wrong:
                problems.append(f"rank {rank} event {index} (line {number}): (counter, running sum) {wrong}")
    report.check("memory counters equal the running per-category sums, in order", problems)


def check_flows(events, world, report):
    """EVENTS.md "Flows": for every collective (the comm slices of equal seq and group: args group and group_ranks,
    version 4), one arrow from the rank whose slice starts first (the lower rank on a tie) to each other rank's
    slice of the same group, never to another group's: an 's' 1 ns into the sender's slice and
    an 'f' with bp 'e' 1 ns into the receiver's, on the slices' tracks, sharing an integer id found nowhere else.
    Perfetto drops non-integer ids and Catapult an arrow that ends before it starts, so both are checked here."""
    problems = []
    slices = {}  # (pid, tid, ts) -> (seq, dur) of the collective slice starting there
    starts_by_seq = defaultdict(dict)  # seq -> pid -> ts
    for index, event in timed(events):
        if any(key in event for key in ("bind_id", "flow_in", "flow_out")):
            problems.append(f"{describe(index, event)}: v2 flow fields (bind_id, flow_in, flow_out); flows are "
                            f"'s' / 'f' events")
        if event["ph"] == "X" and event.get("cat") == "comm":
            if event["tid"] not in {tid_of(event["pid"], track) for track in COLLECTIVE_TRACKS}:
                problems.append(f"{describe(index, event)}: a collective slice on no comm or stream track")
            args = event.get("args", {})
            seq = (args.get("seq"), args.get("group", "world"), args.get("group_ranks"))  # one collective
            slices[(event["pid"], event["tid"], event["ts"])] = (seq, event["dur"])
            starts_by_seq[seq][event["pid"]] = event["ts"]
    by_track = defaultdict(list)  # (pid, tid) -> sorted slice starts

    offsets = defaultdict(lambda: FLOW_OFFSET_US)  # seq -> its flow events' offset into their slices
    for (pid, tid, start), (seq, dur) in slices.items():
        offsets[seq] = min(offsets[seq], dur / 2)
        by_track[(pid, tid)].append(start)
    for starts in by_track.values():
        starts.sort()

    def bound_slice(pid, tid, ts):
        """The (start, seq, dur) of the collective slice a flow event at ts binds to: the last one on its track
        starting at or before it, provided ts is exactly the collective's offset into it (EVENTS.md "Flows")."""
        starts = by_track[(pid, tid)]
        position = bisect.bisect_right(starts, ts + 1e-9) - 1
        if position < 0:
            return None
        start = starts[position]
        seq, dur = slices[(pid, tid, start)]
        return (start, seq, dur) if abs(ts - start - offsets[seq]) <= 1e-6 else None
    arrows = defaultdict(lambda: {"s": [], "f": []})  # id -> phase -> [(pid, ts, seq)]
    for index, event in timed(events):
        if event["ph"] not in FLOW_PHASES:
            continue
        where = describe(index, event)
        if world == 1:
            problems.append(f"{where}: a flow event in a world of 1")
        if not is_int(event.get("id")):
            problems.append(f"{where}: id {event.get('id')!r} is not an integer (Perfetto drops the flow)")
            continue
        if event["ph"] == "f" and event.get("bp") != "e":
            problems.append(f"{where}: bp {event.get('bp')!r}, expected 'e' (bind to the enclosing slice)")
        bound = bound_slice(event["pid"], event["tid"], event["ts"])
        if bound is None:
            problems.append(f"{where}: ts {event['ts']} is not 1 ns (or half the shortest slice of its "
                            f"collective) into a collective slice on its track")
            continue
        arrows[event["id"]][event["ph"]].append((event["pid"], event["ts"], bound[1]))
    found = defaultdict(int)  # (seq, sender pid, receiver pid) -> arrows
    for flow_id, phases in sorted(arrows.items()):
        if len(phases["s"]) != 1 or len(phases["f"]) != 1:
            problems.append(f"flow id {flow_id}: {len(phases['s'])} 's' and {len(phases['f'])} 'f' events, "
                            f"expected one of each")
            continue
        (sender, start_ts, start_seq), (receiver, finish_ts, finish_seq) = phases["s"][0], phases["f"][0]
        if start_seq != finish_seq:
            problems.append(f"flow id {flow_id}: from seq {start_seq} (pid {sender}) to seq {finish_seq} "
                            f"(pid {receiver})")
        if finish_ts < start_ts:
            problems.append(f"flow id {flow_id}: ends at ts {finish_ts} before it starts at {start_ts} "
                            f"(Catapult drops it)")
        found[(start_seq, sender, receiver)] += 1
    expected = {}
    for seq, starts in starts_by_seq.items():
        sender = min(starts, key=lambda pid: (starts[pid], pid))
        expected.update({(seq, sender, receiver): 1 for receiver in starts if receiver != sender})
    for seq, sender, receiver in sorted(set(found) | set(expected), key=str):
        if found[(seq, sender, receiver)] != expected.get((seq, sender, receiver), 0):
            problems.append(f"seq {seq}: {found[(seq, sender, receiver)]} arrow(s) from rank {sender - 1} to rank "
                            f"{receiver - 1}, expected {expected.get((seq, sender, receiver), 0)}"
                            f" (slices start at {starts_by_seq.get(seq)})")
    report.check(f"flows: {sum(expected.values())} arrows, one per (collective, other rank), each from the rank that "
                 f"entered first, numeric ids", problems)


def check_collectives(ranks, world, report):
    problems = []
    seen = defaultdict(dict)  # seq -> rank -> (line, op, count)
    for rank, lines in ranks.items():
        for number, line in lines:
            if line.get("kind") != "collective":
                continue
            seq = line.get("seq")
            if rank in seen[seq]:
                problems.append(f"rank {rank} line {number}: seq {seq} again (first at line {seen[seq][rank][0]})")
            seen[seq][rank] = (number, line.get("op"), line.get("count"), line.get("dtype"))
            size = DTYPE_SIZES.get(line.get("dtype")) if line.get("dtype") in ("float32", "bfloat16") else None
            if size is None or line.get("bytes") != line.get("count", -1) * size:
                problems.append(f"rank {rank} line {number}: {line.get('op')} dtype {line.get('dtype')!r}, count "
                                f"{line.get('count')}, bytes {line.get('bytes')}: bytes must be count x the element "
                                f"size of float32 or bfloat16")
    for seq in sorted(seen, key=str):
        missing = sorted(set(range(world)) - set(seen[seq]))
        if missing:
            problems.append(f"seq {seq}: missing on rank(s) {missing}")
        shapes = {(op, count, dtype) for _, op, count, dtype in seen[seq].values()}
        if len(shapes) > 1:
            detail = ", ".join(f"rank {rank} line {number}: {op} count {count} {dtype}"
                               for rank, (number, op, count, dtype) in sorted(seen[seq].items()))
            problems.append(f"seq {seq}: ranks disagree ({detail})")
    report.check(f"each collective seq appears once on every rank with the same op, count and dtype, bytes = count x "
                 f"its size ({len(seen)} seqs)",
                 problems)
    check_groups(ranks, world, report)


def check_groups(ranks, world, report):
    """Version 4's process groups: a collective's `group_ranks` hold the rank that ran it and `group_size` ranks
    (absent for the world: all of them); every rank of the group ran the same seq in the same group with the same
    ranks; and the ring traffic is that of the group's size N: all_gather and reduce_scatter (N-1)/N of the bytes
    each way, all_reduce 2(N-1)/N (EVENTS.md)."""
    problems = []
    groups = {}  # (seq, rank) -> (group, ranks)
    lines_of = []
    for rank, lines in ranks.items():
        for number, line in lines:
            if line.get("kind") != "collective":
                continue
            group = line.get("group", "world")
            members = tuple(line["group_ranks"]) if "group_ranks" in line else tuple(range(world))
            size = line.get("group_size", world)
            where = f"rank {rank} line {number} (seq {line.get('seq')}, {line.get('op')} in {group})"
            if rank not in members:
                problems.append(f"{where}: group_ranks {list(members)} do not hold the rank")
            if size != len(members) or (group == "world" and members != tuple(range(world))):
                problems.append(f"{where}: group_size {size}, group_ranks {list(members)}")
            groups[(line.get("seq"), rank)] = (group, members)
            lines_of.append((where, line, len(members), group, members))
            n, count = len(members), line.get("count", 0)
            size = DTYPE_SIZES.get(line.get("dtype", "float32"), 4)  # an unknown dtype is reported by the dtype check
            ring = count // max(n, 1) * size * (n - 1)
            expected = {"all_gather": ring, "reduce_scatter": ring,
                        "all_reduce": int(2.0 * (n - 1) / n * count * size)}.get(line.get("op"))
            # the ring bytes of the group's size, for lines of a version 4 writer (a `group` field; hand-made
            # version 3 runs carry whatever bytes their author chose)
            if "group" in line and expected is not None and \
                    (line.get("bytes_sent"), line.get("bytes_recv")) != (expected, expected):
                problems.append(f"{where}: bytes_sent/recv {line.get('bytes_sent')}/{line.get('bytes_recv')}, a ring "
                                f"over {n} ranks moves {expected} each way")
    for where, line, _, group, members in lines_of:
        for other in members:
            if groups.get((line.get("seq"), other), (group, members)) != (group, members):
                problems.append(f"{where}: rank {other} ran this seq as {groups[(line.get('seq'), other)]}")
    report.check("process groups: each collective's group holds its ranks, agrees among them, and its ring bytes are "
                 "the group size's", problems)


def spans_overlap(left, right):
    """Half-open spans (start, end) that share more than the rounding: touching ones do not overlap."""
    return left[0] < right[1] - ROUNDING_US and right[0] < left[1] - ROUNDING_US


def check_streams_jsonl(ranks, report):
    """EVENTS.md version 3: collectives name a stream and were issued no later than their stream started them; a
    stream runs its work in order, so one stream's collectives never overlap; the host (stream compute) runs its
    compute spans, its waits and the blocking collectives one at a time; each wait for a collective (seq >= 0) names
    a collective of its rank by seq, op and unit, starts no earlier than it was issued, and ends no earlier than it
    completed. On a GPU (the device pool's allocator backend is not the host's) the pieces' compute spans are the GPU's
    time (CUDA events, EVENTS.md), not the host's: they are left out of the host's one-at-a-time check."""
    problems = []
    for rank, lines in ranks.items():
        by_seq, host, per_stream = {}, [], defaultdict(list)
        on_gpu = any(line.get("kind") == "allocator" and line.get("device", "device") == "device" and
                     line.get("backend") not in (None, "host") for _, line in lines)
        for number, line in lines:
            kind, where = line.get("kind"), f"rank {rank} line {number}"
            if kind not in ("collective", "compute", "wait"):
                continue
            stream = line.get("stream")
            if stream not in STREAMS:
                problems.append(f"{where}: {kind} on stream {stream!r}, not one of {STREAMS}")
                continue
            span = (line["ts"], line["ts"] + line["dur"])
            if kind == "collective":
                by_seq[line.get("seq")] = (number, line)
                if not is_number(line.get("issue_ts")) or line["issue_ts"] > line["ts"]:
                    problems.append(f"{where}: collective seq {line.get('seq')} issued at {line.get('issue_ts')!r}, "
                                    f"after its stream started it at {line['ts']}")
                per_stream[stream].append((span, number, f"{line.get('op')} seq {line.get('seq')}"))
                if stream == "compute":
                    host.append((span, number, f"blocking {line.get('op')} seq {line.get('seq')}"))
            elif stream != "compute":
                problems.append(f"{where}: {kind} on stream {stream!r}; only the host (compute) runs compute and waits")
            elif not (on_gpu and kind == "compute" and line.get("phase") in ("forward", "backward", "recompute")):
                host.append((span, number, f"{kind} {line.get('name') or line.get('on')}"))
        for stream, spans in list(per_stream.items()) + [("host (compute, waits, blocking collectives)", host)]:
            spans.sort()
            for (left, left_line, left_name), (right, right_line, right_name) in zip(spans, spans[1:]):
                if spans_overlap(left, right):
                    problems.append(f"rank {rank}: on stream {stream}, line {left_line} ({left_name}, {left}) overlaps "
                                    f"line {right_line} ({right_name}, {right})")
        for number, line in lines:
            if line.get("kind") != "wait":
                continue
            where = f"rank {rank} line {number}"
            if line.get("on") not in STREAMS:
                problems.append(f"{where}: wait on {line.get('on')!r}, not one of {STREAMS}")
            seq = line.get("seq")
            if not is_int(seq) or seq < -1:
                problems.append(f"{where}: wait seq {seq!r}, expected a collective's seq or -1")
                continue
            if seq == -1:
                continue
            found = by_seq.get(seq)
            if found is None:
                problems.append(f"{where}: wait for seq {seq}, which no collective of rank {rank} has")
                continue
            other_line, other = found
            if (other.get("op"), other.get("unit"), other.get("stream")) != (line.get("op"), line.get("unit"),
                                                                             line.get("on")):
                problems.append(f"{where}: wait for {line.get('op')} {line.get('unit')} on {line.get('on')} seq {seq}, "
                                f"line {other_line} is {other.get('op')} {other.get('unit')} on {other.get('stream')}")
            if line["ts"] + line["dur"] < other["ts"] + other["dur"] - ROUNDING_US:
                problems.append(f"{where}: wait for seq {seq} ends at {line['ts'] + line['dur']:.3f}, before the "
                                f"collective (line {other_line}) completed at {other['ts'] + other['dur']:.3f}")
            if line["ts"] < other.get("issue_ts", other["ts"]) - ROUNDING_US:
                problems.append(f"{where}: wait for seq {seq} starts at {line['ts']}, before the collective was "
                                f"issued at {other.get('issue_ts')}")
    report.check("streams: issue_ts <= ts, a stream's collectives never overlap, the host's compute, waits and "
                 "blocking collectives never overlap, each wait matches its collective and ends after it",
                 problems[:20] + ([f"... {len(problems) - 20} more"] if len(problems) > 20 else []))


def check_waits(events, ranks, report):
    """Wait slices (the JSONL's `wait` lines) lie on their rank's compute track, are named 'wait <on>[ <unit>]',
    carry on / op / unit / seq / hook, are category 'exposed' when they wait for a comm stream, and intersect no
    compute slice of their rank."""
    problems = []
    computes, waits = defaultdict(list), defaultdict(list)
    for index, event in timed(events):
        if event["ph"] == "X" and event.get("cat") == "compute":
            computes[event["pid"]].append((event["ts"], event["ts"] + event["dur"]))
        if event["ph"] == "X" and event.get("cat") in ("exposed", "wait"):
            waits[event["pid"]].append((index, event))
    for rank, lines in ranks.items():
        pid = rank + 1
        wanted = [line for _, line in lines if line.get("kind") == "wait"]
        found = sorted(waits[pid], key=lambda item: (item[1]["ts"], item[0]))
        wanted.sort(key=lambda line: line["ts"])
        if len(found) != len(wanted):
            problems.append(f"rank {rank}: {len(found)} wait slices, the JSONL has {len(wanted)} waits")
            continue
        for (index, event), line in zip(found, wanted):
            where = describe(index, event)
            name = f"wait {line['on']}" + (f" {line['unit']}" if line.get("unit") is not None else "")
            category = "wait" if line["on"] == "compute" else "exposed"
            args = {key: line.get(key) for key in ("on", "op", "unit", "seq", "hook")}
            if (event["name"], event["cat"], event["tid"]) != (name, category, tid_of(pid, COMPUTE_TRACK)):
                problems.append(f"{where}: expected {name!r}, category {category!r} on the compute track")
            if event.get("args") != args:
                problems.append(f"{where}: args {event.get('args')}, expected {args}")
            span = (event["ts"], event["ts"] + event["dur"])
            for other in computes[pid]:
                if spans_overlap(span, other):
                    problems.append(f"{where}: wait {span} intersects compute slice {other}")
    report.check(f"wait slices on the compute track, named and categorised, with their args, intersecting no "
                 f"compute slice ({sum(len(each) for each in waits.values())} waits)", problems)


def check_collective_args(events, ranks, report):
    """Version 3's collective args: the stream and issue_ts of the line, and queued = ts - issue_ts."""
    problems = []
    lines = {(rank + 1, line.get("seq")): line for rank, each in ranks.items() for _, line in each
             if line.get("kind") == "collective"}
    for index, event in timed(events):
        if event["ph"] != "X" or event.get("cat") != "comm":
            continue
        args = event.get("args", {})
        line = lines.get((event["pid"], args.get("seq")))
        if line is None:
            problems.append(f"{describe(index, event)}: seq {args.get('seq')} is no collective of its rank")
            continue
        queued = line["ts"] - line["issue_ts"]
        if (args.get("stream"), args.get("issue_ts")) != (line["stream"], line["issue_ts"]) or \
                not is_number(args.get("queued")) or abs(args["queued"] - queued) > 1e-6:
            problems.append(f"{describe(index, event)}: stream / issue_ts / queued {args.get('stream')} "
                            f"{args.get('issue_ts')} {args.get('queued')}, the line says {line['stream']} "
                            f"{line['issue_ts']} {queued}")
    report.check("collective slices carry the line's stream and issue_ts, and queued = ts - issue_ts", problems)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rundir")
    parser.add_argument("--expect-ranks", type=int, metavar="N", help="fail unless the run has N ranks")
    parser.add_argument("--trace", help="the Chrome trace to check (default <rundir>/trace.json)")
    options = parser.parse_args()
    report = Report()
    ranks = read_ranks(options.rundir, options.expect_ranks, report)
    if ranks is not None:
        world = len(ranks)
        check_memory_jsonl(ranks, report)
        check_allocator_jsonl(ranks, report)
        check_collectives(ranks, world, report)
        check_streams_jsonl(ranks, report)
    events = read_trace(options.trace or os.path.join(options.rundir, "trace.json"), report)
    if events is not None and check_fields(events, report):
        check_order(events, report)
        check_spans(events, report)
        if ranks is not None:
            check_names(events, world, report)
            check_counts(events, ranks, report)
            check_memory_counters(events, ranks, report)
            check_reserved_counters(events, ranks, report)
            check_flows(events, world, report)
            check_waits(events, ranks, report)
            check_collective_args(events, ranks, report)
        else:
            report.skip("trace checks against the JSONL", "the JSONL files are unusable")
    elif events is not None:
        report.skip("ordering, spans, names, counters, flows", "events lack required fields")
    return report.finish("validate_trace")


if __name__ == "__main__":
    sys.exit(main())
