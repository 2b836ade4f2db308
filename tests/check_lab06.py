#!/usr/bin/env python3
"""check-06: what lab 06 teaches, from its printed output and its events (not from our own views).

    python3 tests/check_lab06.py RUNDIR LOG

RUNDIR holds rank<R>.jsonl of one `lab/06_prefetch` run, LOG its standard output. Asserts, per rank:
  1. prefetch changes timing, never arithmetic: every mode's losses and parameter checksum are those of the first mode
  2. the memory model's prediction equals the measured peak of every category, in every mode (difference +0 B)
  3. blocking: no collective span intersects a compute span; "none": no all-gather does
  4. with a comm stream: the host computed while a collective was in flight (issued on its stream, not yet
     complete: [issue_ts, end] intersects the compute spans; see below), and the comm time the host waited through
     (its `wait` spans on a comm stream, intersected with the streams' busy spans) is less than that busy time: some
     comm was hidden; with BACKWARD_PRE / forward prefetch, all-gathers overlap compute too, on every rank
  5. never more than 2 all-gathers in flight (issued and not completed) at once, in any mode

Without prefetch ("none", BACKWARD_POST) the only overlap is a reduce-scatter running on its stream's thread beside
the next piece's compute, and whether that thread gets a core while the compute thread runs is the scheduler's
choice when more threads are runnable than there are cores (2 ranks of 2 threads beside make check's other lane,
on 2 cores): a fresh clone's CI run on the emulated GPU saw rank 1's "none" overlap 0.000 ms while rank 0's was
20.7 ms, and a later one 0.000 ms on both ranks. What the program decides, and the lab teaches, is the order: the
host issues the reduce-scatter and goes on to the next piece's compute without waiting for it. So the check is that a
collective was in flight (issued, not yet complete) while the host computed, on every rank; a stream that the host
waited for right after issuing fails it, however the threads were scheduled. Prefetched all-gathers, issued ahead of
the compute that needs them, must also run beside compute on every rank (their spans intersect compute spans).

Timestamps in the events are rounded to 1 ns (3 decimals of a microsecond), so two spans that merely touch can
appear to overlap by up to 1 ns each way: "no intersection" allows 2 ns per span compared, "intersects" requires more
than that.
"""
import json
import os
import re
import sys
from collections import defaultdict

ROUNDING_US = 0.002  # two 1-ns roundings (an end and a start) per pair of touching spans
PREFETCH_MODES = {"BACKWARD_PRE", "forward", "no_limit"}  # modes whose all-gathers are issued ahead of compute
MAX_IN_FLIGHT = 2


def union(intervals):
    merged = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


def length(intervals):
    return sum(end - start for start, end in intervals)


def intersection(left, right):
    """Length of the intersection of two unions of disjoint sorted intervals."""
    total, i, j = 0.0, 0, 0
    while i < len(left) and j < len(right):
        start, end = max(left[i][0], right[j][0]), min(left[i][1], right[j][1])
        if end > start:
            total += end - start
        if left[i][1] < right[j][1]:
            i += 1
        else:
            j += 1
    return total


def max_in_flight(spans):
    """Largest number of [issue, end] intervals covering one moment."""
    edges = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans], key=lambda e: (e[0], e[1]))
    now = best = 0
    for _, step in edges:
        now += step
        best = max(best, now)
    return best


def windows(events):
    """{mode: [events]} between the marks 'lab 06 mode <name>' and 'lab 06 mode end'."""
    result, current = {}, None
    for event in events:
        if event["kind"] == "mark":
            if event["text"].startswith("lab 06 mode ") and event["text"] != "lab 06 mode end":
                current = event["text"][len("lab 06 mode "):]
                result[current] = []
            elif event["text"] == "lab 06 mode end":
                current = None
            continue
        if current is not None:
            result[current].append(event)
    return result


def check_rank(path, rank, problems, report):
    with open(path) as file:
        events = [json.loads(line) for line in file if line.strip()]
    for mode, window in windows(events).items():
        compute = union([(e["ts"], e["ts"] + e["dur"]) for e in window if e["kind"] == "compute"])
        collectives = [e for e in window if e["kind"] == "collective"]
        on_streams = [e for e in collectives if e.get("stream", "compute") != "compute"]
        comm = union([(e["ts"], e["ts"] + e["dur"]) for e in collectives])
        gathers = [e for e in collectives if e["op"] == "all_gather"]
        gather_spans = union([(e["ts"], e["ts"] + e["dur"]) for e in gathers])
        waits = union([(e["ts"], e["ts"] + e["dur"]) for e in window
                       if e["kind"] == "wait" and e["on"] in ("all_gather", "reduce_scatter")])
        overlap, gather_overlap = intersection(comm, compute), intersection(gather_spans, compute)
        in_flight_spans = union([(e["issue_ts"], e["ts"] + e["dur"]) for e in on_streams])
        in_flight_overlap = intersection(in_flight_spans, compute)
        busy_spans = union([(e["ts"], e["ts"] + e["dur"]) for e in on_streams])
        busy = length(busy_spans)
        exposed = length(waits)
        # The comm time the host spent waiting: a wait also covers the host's wake-up after its collective completed
        # (scheduler latency, large on a loaded machine), which is not comm time, so exposed alone may exceed busy
        # by that latency while comm still overlapped compute.
        waited_comm = intersection(waits, busy_spans)
        in_flight = max_in_flight([(e["issue_ts"], e["ts"] + e["dur"]) for e in gathers])
        slack = ROUNDING_US * len(collectives)
        where = f"rank {rank} mode {mode}"
        report.append(f"{where}: comm {length(comm) / 1e3:.2f} ms, overlap {overlap / 1e3:.3f} ms, all-gather "
                      f"overlap {gather_overlap / 1e3:.3f} ms, in flight beside compute {in_flight_overlap / 1e3:.3f} "
                      f"ms, exposed {exposed / 1e3:.3f} ms, all-gathers in flight {in_flight}")
        if not collectives:
            problems.append(f"{where}: no collective events in the mode's window")
            continue
        if mode == "blocking":
            if on_streams:
                problems.append(f"{where}: {len(on_streams)} collectives ran on a comm stream")
            if overlap > slack:
                problems.append(f"{where}: collectives overlap compute by {overlap:.3f} us (> {slack:.3f} us rounding)")
        else:
            if len(on_streams) != len(collectives):
                problems.append(f"{where}: {len(collectives) - len(on_streams)} collectives ran on the host")
            if in_flight_overlap <= slack:
                problems.append(f"{where}: no compute while a collective was in flight on a comm stream "
                                f"({in_flight_overlap:.3f} us): the host waited for each one it issued")
            if not waited_comm < busy - slack:
                problems.append(f"{where}: the host waited through {waited_comm:.1f} us of the comm streams' "
                                f"{busy:.1f} us busy time: no comm was hidden (exposed {exposed:.1f} us)")
        if mode in ("blocking", "none") and gather_overlap > ROUNDING_US * len(gathers):
            problems.append(f"{where}: all-gathers overlap compute by {gather_overlap:.3f} us without prefetch")
        if mode in PREFETCH_MODES and gather_overlap <= ROUNDING_US * len(gathers):
            problems.append(f"{where}: prefetched all-gathers overlap compute by only {gather_overlap:.3f} us")
        if in_flight > MAX_IN_FLIGHT:
            problems.append(f"{where}: {in_flight} all-gathers in flight at once (at most {MAX_IN_FLIGHT})")


def check_log(text, problems, report):
    results = defaultdict(dict)  # rank -> mode -> (checksum, losses)
    for match in re.finditer(r"^rank (\d+) mode (\S+)\s+parameters ([0-9a-f]+) losses ([^\n]*?) limiter_waits (\d+)$",
                             text, re.M):
        rank, mode, checksum, losses = int(match[1]), match[2], match[3], match[4].split()
        results[rank][mode] = (checksum, losses)
    if not results:
        problems.append("no 'rank R mode M parameters ... losses ...' lines in the log")
    for rank, modes in sorted(results.items()):
        first_mode, first = next(iter(modes.items()))
        for mode, value in modes.items():
            if value != first:
                problems.append(f"rank {rank}: mode {mode} gives parameters {value[0]} losses {value[1]}, mode "
                                f"{first_mode} {first[0]} {first[1]}: prefetch changed the arithmetic")
        report.append(f"rank {rank}: {len(modes)} modes, parameters {first[0]}, losses {' '.join(first[1])}")
    blocks = re.split(r"^rank (\d+), mode (\S+): memory per rank", text, flags=re.M)
    compared = 0
    for index in range(1, len(blocks) - 2, 3):
        rank, mode, body = blocks[index], blocks[index + 1], blocks[index + 2]
        for line in body.splitlines():
            match = re.match(r"^\s+(\w+)\s+.*\s([+-]\d+) B$", line)
            if match:
                compared += 1
                if int(match[2]) != 0:
                    problems.append(f"rank {rank} mode {mode}: {match[1]} measured - predicted = {match[2]} B")
            if line.startswith("  total"):
                break
    if compared == 0:
        problems.append("no memory model tables in the log")
    report.append(f"memory model: {compared} category peaks compared")


def main():
    rundir, log_path = sys.argv[1], sys.argv[2]
    problems, report = [], []
    with open(log_path) as file:
        check_log(file.read(), problems, report)
    ranks = sorted(int(name[4:-6]) for name in os.listdir(rundir) if re.fullmatch(r"rank\d+\.jsonl", name))
    for rank in ranks:
        check_rank(os.path.join(rundir, f"rank{rank}.jsonl"), rank, problems, report)
    print("\n".join(report))
    if problems:
        print("\nFAIL:\n  " + "\n  ".join(problems))
        sys.exit(1)
    print("\nOK: same arithmetic in every mode, memory model exact, overlap where prefetch puts it, "
          f"at most {MAX_IN_FLIGHT} all-gathers in flight")


if __name__ == "__main__":
    main()
