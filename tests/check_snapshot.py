#!/usr/bin/env python3
"""check_snapshot.py: checks a run's memory_snapshot.pickle against PyTorch's snapshot format and the run's events.

    python3 tests/check_snapshot.py <rundir> [--snapshot PATH]

The format is torch.cuda.memory._snapshot()'s: {'segments': [Segment], 'device_traces': [[TraceEntry]]}, one device
per rank. Checks, one OK / FAIL line each:
  - it loads with Python's pickle, and uses only opcodes that pytorch.org/memory_viz's JavaScript unpickler reads;
  - every field the viewer reads is there with its type (segments, blocks, trace entries, frames);
  - each segment's blocks tile it exactly, and segments of a device do not overlap;
  - replaying each device trace: every alloc lies inside a segment that exists, no two live blocks overlap, every
    free_requested / free_completed matches a live alloc (address and size), and what is live at the end is exactly
    the segments' active blocks;
  - the trace is the rank's events up to the snapshot's moment (the end of the last optimizer step; the allocated
    peak in a run without steps): one entry per segment_alloc / alloc / segment_free line and two per free, at the
    allocator's real addresses, with bytes, line, owner and category; time_us is the wall clock; same peak;
  - allocator_settings repeats rank 0's `allocator` event, and segments carry segment_pool_id;
  - when torch is installed, torch.cuda._memory_viz's own readers (segsum, trace, trace_plot, segment_plot) accept
    it.
Standard library only (torch optional). Exit 1 when any check fails.
"""
import argparse
import bisect
import json
import os
import pickle
import pickletools
import sys

from check_report import Report

# The opcodes MemoryViz.js's unpickle() handles (protocol 2 subset a dict/list/str/int/bool/None pickle needs).
VIEWER_OPCODES = {"PROTO", "STOP", "MARK", "EMPTY_DICT", "SETITEMS", "SETITEM", "EMPTY_LIST", "APPENDS", "APPEND",
                  "BININT", "BININT1", "BININT2", "LONG1", "BINUNICODE", "SHORT_BINUNICODE", "NEWTRUE", "NEWFALSE",
                  "NONE", "BINPUT", "LONG_BINPUT", "BINGET", "LONG_BINGET", "MEMOIZE", "FRAME", "BINFLOAT"}
ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "snapshot", "oom"}
BLOCK_STATES = {"active_allocated", "active_pending_free", "inactive"}
CATEGORIES = ["param_shard", "param_unsharded", "grad_unsharded", "grad_shard", "optim_state", "activation",
              "checkpoint_input", "workspace", "comm_buffer", "data", "kv_cache",
              "param_shard_low_precision"]


def is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def typed(where, record, fields, problems):
    """Each field present with its type: fields maps name -> type or 'int'."""
    for name, kind in fields.items():
        if name not in record:
            problems.append(f"{where}: no field '{name}'")
        elif kind == "int" and not is_int(record[name]):
            problems.append(f"{where}: '{name}' is {record[name]!r}, not an int")
        elif kind != "int" and not isinstance(record[name], kind):
            problems.append(f"{where}: '{name}' is {type(record[name]).__name__}, not {kind.__name__}")


def opcode_problems(data):
    problems = []
    for opcode, argument, position in pickletools.genops(data):
        if opcode.name not in VIEWER_OPCODES:
            problems.append(f"byte {position}: opcode {opcode.name}, which the viewer's unpickler does not read")
        if opcode.name == "PROTO" and argument != 2:
            problems.append(f"protocol {argument}, expected 2")
        if opcode.name == "LONG1" and not 1 <= data[position + 1] <= 8:
            problems.append(f"byte {position}: LONG1 of {data[position + 1]} bytes (the viewer reads 1 to 8)")
    return problems


def frames_problems(where, frames):
    problems = []
    if not isinstance(frames, list):
        return [f"{where}: frames is not a list"]
    for index, frame in enumerate(frames):
        if not isinstance(frame, dict):
            problems.append(f"{where}: frame {index} is not a dict")
            continue
        typed(f"{where} frame {index}", frame, {"filename": str, "line": "int", "name": str}, problems)
    return problems


def field_problems(snapshot, world):
    problems = []
    typed("snapshot", snapshot, {"segments": list, "device_traces": list}, problems)
    if problems:
        return problems
    if len(snapshot["device_traces"]) != world:
        problems.append(f"{len(snapshot['device_traces'])} device traces for {world} ranks")
    for index, segment in enumerate(snapshot["segments"]):
        where = f"segment {index}"
        typed(where, segment, {"device": "int", "address": "int", "total_size": "int", "allocated_size": "int",
                               "active_size": "int", "requested_size": "int", "stream": "int",
                               "segment_type": str, "blocks": list}, problems)
        for block_index, block in enumerate(segment.get("blocks", [])):
            block_where = f"{where} block {block_index}"
            typed(block_where, block, {"address": "int", "size": "int", "requested_size": "int", "state": str,
                                       "frames": list}, problems)
            if block.get("state") not in BLOCK_STATES:
                problems.append(f"{block_where}: state {block.get('state')!r}")
            problems += frames_problems(block_where, block.get("frames", []))
    for device, trace in enumerate(snapshot["device_traces"]):
        for index, entry in enumerate(trace):
            where = f"device {device} entry {index}"
            typed(where, entry, {"action": str, "addr": "int", "size": "int", "stream": "int", "frames": list},
                  problems)
            if entry.get("action") not in ACTIONS:
                problems.append(f"{where}: action {entry.get('action')!r}")
            if entry.get("action") == "alloc" and entry.get("category") not in CATEGORIES:
                problems.append(f"{where}: alloc category {entry.get('category')!r}")
            problems += frames_problems(where, entry.get("frames", []))
    return problems


def tiling_problems(snapshot):
    problems = []
    by_device = {}
    for index, segment in enumerate(snapshot["segments"]):
        cursor = segment["address"]
        for block_index, block in enumerate(segment["blocks"]):
            if block["address"] != cursor:
                problems.append(f"segment {index} block {block_index} at {block['address']:#x}, expected {cursor:#x}")
            if block["state"] == "active_allocated" and block["requested_size"] > block["size"]:
                problems.append(f"segment {index} block {block_index}: requested {block['requested_size']} > "
                                f"size {block['size']}")
            cursor += block["size"]
        if cursor != segment["address"] + segment["total_size"]:
            problems.append(f"segment {index}: blocks cover {cursor - segment['address']} of {segment['total_size']}")
        by_device.setdefault(segment["device"], []).append((segment["address"], segment["total_size"]))
    for device, ranges in by_device.items():
        ranges.sort()
        for (left, left_size), (right, _) in zip(ranges, ranges[1:]):
            if left + left_size > right:
                problems.append(f"device {device}: segments at {left:#x} and {right:#x} overlap")
    return problems


class Replay:
    """The device's memory while its trace is replayed: segments and live blocks, both sorted by address."""

    def __init__(self):
        self.segments = []   # sorted [(address, size)]
        self.live = []       # sorted [(address, size)]
        self.requested = set()
        self.bytes = 0
        self.peak = 0

    def segment_of(self, address, size):
        index = bisect.bisect_right(self.segments, (address, float("inf"))) - 1
        return index >= 0 and address + size <= self.segments[index][0] + self.segments[index][1]

    def overlaps(self, address, size):
        index = bisect.bisect_left(self.live, (address, -1))
        before = self.live[index - 1] if index > 0 else None
        after = self.live[index] if index < len(self.live) else None
        return (before and before[0] + max(before[1], 1) > address) or (after and after[0] < address + max(size, 1))

    def step(self, where, entry, problems):
        action, address, size = entry["action"], entry["addr"], entry["size"]
        if action == "segment_alloc":
            bisect.insort(self.segments, (address, size))
        elif action == "alloc":
            if not self.segment_of(address, size):
                problems.append(f"{where}: alloc [{address:#x}, +{size}) is in no segment")
            if self.overlaps(address, size):
                problems.append(f"{where}: alloc [{address:#x}, +{size}) overlaps a live block")
            bisect.insort(self.live, (address, size))
            self.bytes += size
            self.peak = max(self.peak, self.bytes)
        elif action == "free_requested":
            if (address, size) not in self.live:
                problems.append(f"{where}: free_requested of [{address:#x}, +{size}) that is not live")
            self.requested.add((address, size))
        elif action == "free_completed":
            if (address, size) not in self.requested or (address, size) not in self.live:
                problems.append(f"{where}: free_completed of [{address:#x}, +{size}) without a live, requested alloc")
                return
            self.requested.discard((address, size))
            self.live.remove((address, size))
            self.bytes -= size


def replay_problems(snapshot):
    problems = []
    peaks = []
    for device, trace in enumerate(snapshot["device_traces"]):
        replay = Replay()
        for index, entry in enumerate(trace):
            replay.step(f"device {device} entry {index}", entry, problems)
        final = sorted((s["address"], s["total_size"]) for s in snapshot["segments"] if s["device"] == device)
        if final != replay.segments:
            problems.append(f"device {device}: segment_alloc entries make {len(replay.segments)} segments, "
                            f"the snapshot lists {len(final)}")
        active = sorted((b["address"], b["requested_size"]) for s in snapshot["segments"] if s["device"] == device
                        for b in s["blocks"] if b["state"] == "active_allocated")
        if active != replay.live:
            problems.append(f"device {device}: {len(replay.live)} blocks live after the trace, "
                            f"{len(active)} active blocks in the segments")
        peaks.append(replay.peak)
    return problems, peaks


def snapshot_moment(lines):
    """trace/snapshot.h's moment, worked out here on its own: the end of the last optimizer step (step with micro -1),
    else of the last step, else the allocated peak (the first alloc after which live bytes are highest). Returns
    the number of JSONL lines (after the meta line) the trace covers."""
    events = [event for _, event in lines]
    optimizer = [index for index, event in enumerate(events) if event["kind"] == "step" and event["micro"] < 0]
    steps = [index for index, event in enumerate(events) if event["kind"] == "step"]
    if optimizer or steps:
        return (optimizer or steps)[-1] + 1
    live, peak, peak_index = 0, -1, len(events) - 1
    for index, event in enumerate(events):
        if event["kind"] in ("alloc", "free"):
            live += event["bytes"] if event["kind"] == "alloc" else -event["bytes"]
            if event["kind"] == "alloc" and live > peak:
                peak, peak_index = live, index
    return peak_index + 1


def expected_entries(rank, lines):
    """What device trace `rank` must be, from its JSONL: the allocator's own actions at its real addresses."""
    wanted = []
    for number, event in lines[:snapshot_moment(lines)]:
        kind = event["kind"]
        if kind in ("segment_alloc", "segment_free"):
            wanted.append((kind, event["addr"], event["bytes"], f"rank{rank}.jsonl", number))
        elif kind == "alloc":
            wanted.append(("alloc", event["addr"], event["bytes"], f"rank{rank}.jsonl", number, event["owner"],
                           event["category"]))
        elif kind == "free":
            for action in ("free_requested", "free_completed"):
                wanted.append((action, event["addr"], event["bytes"], f"rank{rank}.jsonl", number, event["owner"]))
    return wanted


def entry_shape(entry):
    frame = entry["frames"][0] if entry["frames"] else {}
    found = (entry["action"], entry["addr"], entry["size"], frame.get("filename"), frame.get("line"))
    if entry["action"] in ("alloc", "free_requested", "free_completed"):
        found += (frame.get("name"),)
    if entry["action"] == "alloc":
        found += (entry.get("category"),)
    return found


def events_problems(snapshot, rundir, peaks):
    problems = []
    for rank, trace in enumerate(snapshot["device_traces"]):
        with open(os.path.join(rundir, f"rank{rank}.jsonl"), encoding="utf-8") as file:
            lines = [(number, json.loads(text)) for number, text in enumerate(file, start=1) if text.endswith("\n")]
        # the host pool's memory events (CPU offload, a GPU's pinned staging and data: `device` "host") are not the
        # device's memory: the snapshot, like torch's, holds the device pool alone (trace/run.c routes them apart)
        meta, lines = lines[0][1], [(number, event) for number, event in lines[1:] if event.get("device") != "host"]
        wanted = expected_entries(rank, lines)
        found = [entry_shape(entry) for entry in trace if entry["action"] != "snapshot"]
        if len(found) != len(wanted):
            problems.append(f"rank {rank}: {len(found)} trace entries, the JSONL up to the snapshot makes "
                            f"{len(wanted)}")
        for index, (entry, line) in enumerate(zip(found, wanted)):
            if entry != line:
                problems.append(f"rank {rank} entry {index}: {entry}, the JSONL line says {line}")
                break
        if not trace or trace[-1]["action"] != "snapshot":
            problems.append(f"rank {rank}: the trace does not end with a 'snapshot' entry")
        start_us = meta["unix_time"] * 1e6
        late = [entry["time_us"] for entry in trace if not start_us - 1e6 <= entry["time_us"] <= start_us + 86400e6]
        if late:
            problems.append(f"rank {rank}: {len(late)} entries' time_us not within a day after the run's start "
                            f"{start_us:.0f} us (the wall clock), e.g. {late[0]}")
        live = peak = 0
        for _, event in lines[:snapshot_moment(lines)]:
            if event["kind"] in ("alloc", "free"):
                live += event["bytes"] if event["kind"] == "alloc" else -event["bytes"]
                peak = max(peak, live)
        if peak != peaks[rank]:
            problems.append(f"rank {rank}: the trace peaks at {peaks[rank]} live bytes, the events at {peak}")
    return problems


def settings_problems(snapshot, rundir):
    settings = snapshot.get("allocator_settings")
    if not isinstance(settings, dict):
        return ["no allocator_settings dict"]
    with open(os.path.join(rundir, "rank0.jsonl"), encoding="utf-8") as file:
        event = next((json.loads(text) for text in file if '"kind":"allocator"' in text), {})
    wanted = {"mode": event.get("mode"), "max_split_size": event.get("max_split_size") or -1,
              "expandable_segments": False}
    found = {name: settings.get(name) for name in wanted}
    problems = [] if found == wanted else [f"allocator_settings {found}, rank 0's allocator event says {wanted}"]
    for index, segment in enumerate(snapshot["segments"]):
        if segment.get("segment_pool_id") != [0, 0]:
            problems.append(f"segment {index}: segment_pool_id {segment.get('segment_pool_id')!r}, expected [0, 0]")
            break
    return problems


def torch_readers(snapshot, report):
    try:
        from torch.cuda import _memory_viz
    except ImportError:
        print("SKIP torch.cuda._memory_viz readers (torch is not installed)")
        return
    problems = []
    for name in ("segsum", "trace", "trace_plot", "segment_plot"):
        try:
            getattr(_memory_viz, name)(snapshot)
        except Exception as error:  # noqa: BLE001 - any failure of torch's reader is the finding
            problems.append(f"{name}: {type(error).__name__}: {error}")
    report.check("torch.cuda._memory_viz segsum, trace, trace_plot and segment_plot read it", problems)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rundir")
    parser.add_argument("--snapshot", help="default <rundir>/memory_snapshot.pickle")
    args = parser.parse_args()
    path = args.snapshot or os.path.join(args.rundir, "memory_snapshot.pickle")
    report = Report()
    with open(path, "rb") as file:
        data = file.read()
    try:
        snapshot = pickle.loads(data)
    except Exception as error:  # noqa: BLE001
        report.check(f"{path} loads with pickle", [f"{type(error).__name__}: {error}"])
        return 1
    report.check(f"{path} ({len(data):,} bytes) loads with pickle; opcodes the memory_viz unpickler reads",
                 opcode_problems(data))
    with open(os.path.join(args.rundir, "rank0.jsonl"), encoding="utf-8") as file:
        world = json.loads(file.readline())["world"]
    problems = field_problems(snapshot, world)
    report.check("every field the viewer reads, with its type", problems)
    if problems:
        return 1
    report.check(f"{len(snapshot['segments'])} segments: blocks tile each, no two overlap", tiling_problems(snapshot))
    problems, peaks = replay_problems(snapshot)
    report.check("replay: allocs inside segments, never overlapping; frees match live allocs; end state = segments",
                 problems)
    report.check("the trace is the allocator's events up to the snapshot: action, real address, bytes, line, owner, "
                 "category; wall-clock time_us; same peak", events_problems(snapshot, args.rundir, peaks))
    report.check("allocator_settings from the allocator event; segment_pool_id",
                 settings_problems(snapshot, args.rundir))
    torch_readers(snapshot, report)
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
