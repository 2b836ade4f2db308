#!/usr/bin/env python3
"""One setting of scripts/gpu_bench.sh: fsdplab beside torch FSDP from the logs scripts/train.sh FSDP=both wrote.

    gpu_bench_report.py SETTING_DIR LABEL STEP_FLOP PEAK_TFLOPS PEAK_NAME

SETTING_DIR is train.sh's TRAIN_DIR (fsdplab.log, torch.log, fsdplab/rank0.jsonl); STEP_FLOP the FLOP of one optimizer
step (qwen2_tool flops' step_flops per micro-batch times ACC); PEAK_TFLOPS the GPU's dense peak for the run's
arithmetic (0: unknown), PEAK_NAME what that peak is. Prints:

  - per side: the median step time of steps 2.. (step 1 warms up: cuBLAS handles, allocator segments, torch's
    compilation of nothing but its own start), TFLOP/s achieved and % of the peak, the largest `Peak` a step printed
    (fsdplab: the tracked device peak on a GPU, the process's max RSS on the CPU; torch: its allocator's peak or the
    RSS, as train.sh prints them), and fsdplab / torch for each;
  - where fsdplab's time goes: rank 0's trace, between the end of step 1 (its `step` event with micro -1) and the end
    of the last step, summed per piece kind and phase (the `compute` spans: layers.N.forward counts under `layers
    forward`), per wait (`wait` spans, by the stream waited on), the blocking collectives (`collective` on stream
    compute: the loss all-reduce) and the rest (`host, untraced`: what the host did between spans), per step, with
    each one's share of the window.

Exit status 1 when a log has no step lines or the trace no window (the setting's run failed), printing why.
"""
import json
import re
import statistics
import sys

STEP = re.compile(r"^(\d+)/(\d+): Loss = [-0-9.naif]+, Peak = ([0-9.]+) MB, Time = ([0-9.]+)s")


def steps_of(path):
    """(times, peaks) of a train.sh log's step lines."""
    times, peaks = [], []
    try:
        with open(path) as lines:
            for line in lines:
                match = STEP.match(line)
                if match:
                    peaks.append(float(match.group(3)))
                    times.append(float(match.group(4)))
    except OSError:
        pass
    return times, peaks


def piece_kind(name):
    """layers.3.forward -> 'layers forward'; root.adamw -> 'adamw (optimizer)'; embed_tokens.backward as is."""
    name = re.sub(r"\.\d+\.", ".", name)
    piece, _, phase = name.rpartition(".")
    if phase == "adamw":
        return "adamw (optimizer)"
    return f"{piece} {phase}".strip()


def time_table(trace_path):
    """(rows of (kind, microseconds), window microseconds, steps in the window) from rank 0's events."""
    events = []
    with open(trace_path) as lines:
        for line in lines:
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    ends = sorted(e["ts"] for e in events if e.get("kind") == "step" and e.get("micro") == -1)
    if len(ends) < 2:
        return None, 0.0, 0
    start, stop = ends[0], ends[-1]
    totals = {}
    for e in events:
        kind = e.get("kind")
        if kind not in ("compute", "wait", "collective") or not start <= e.get("ts", -1) < stop:
            continue
        if kind == "compute":
            key = piece_kind(e.get("name", "?"))
        elif kind == "wait":
            key = f"wait {e.get('on', '?')}"
        elif e.get("stream") == "compute":
            key = f"blocking {e.get('op', '?')}"
        else:
            continue  # on a comm stream: overlapped, its exposed part is a wait
        totals[key] = totals.get(key, 0.0) + float(e.get("dur", 0.0))
    window = stop - start
    rows = sorted(totals.items(), key=lambda item: -item[1])
    rows.append(("host, untraced", max(window - sum(totals.values()), 0.0)))
    return rows, window, len(ends) - 1


def main():
    if len(sys.argv) != 6:
        sys.exit(__doc__.split("\n\n")[1])
    directory, label, step_flop = sys.argv[1], sys.argv[2], float(sys.argv[3])
    peak, peak_name = float(sys.argv[4]), sys.argv[5]
    sides = {}
    for side in ("fsdplab", "torch"):
        times, peaks = steps_of(f"{directory}/{side}.log")
        if len(times) < 2:
            print(f"{label}: FAIL {side}: fewer than 2 step lines in {directory}/{side}.log")
            return 1
        sides[side] = (statistics.median(times[1:]), max(peaks))
    ours, theirs = sides["fsdplab"], sides["torch"]

    def tflops(step):
        return step_flop / step / 1e12

    def percent(step):
        return f"{100 * tflops(step) / peak:.1f}%" if peak > 0 else "unknown"

    print(f"== {label}: {step_flop / 1e12:.3f} TFLOP per step; peak {peak_name}")
    print(f"{'':22}{'fsdplab':>12}{'torch':>12}{'fsdplab/torch':>15}")
    print(f"{'step time (s)':22}{ours[0]:12.4f}{theirs[0]:12.4f}{ours[0] / theirs[0]:14.2f}x")
    print(f"{'TFLOP/s':22}{tflops(ours[0]):12.2f}{tflops(theirs[0]):12.2f}{theirs[0] / ours[0]:14.2f}x")
    print(f"{'% of peak':22}{percent(ours[0]):>12}{percent(theirs[0]):>12}")
    print(f"{'peak memory (MB)':22}{ours[1]:12.1f}{theirs[1]:12.1f}{ours[1] / theirs[1]:14.2f}x")
    rows, window, steps = time_table(f"{directory}/fsdplab/rank0.jsonl")
    if rows is None:
        print(f"{label}: FAIL fsdplab: no window of steps 2.. in {directory}/fsdplab/rank0.jsonl")
        return 1
    print(f"where fsdplab's time goes (rank 0's trace, steps 2-{steps + 1}, per step):")
    print(f"  {'piece kind / wait':34}{'ms/step':>10}{'share':>8}")
    for kind, microseconds in rows:
        print(f"  {kind:34}{microseconds / 1e3 / steps:10.3f}{100 * microseconds / window:7.1f}%")
    print(f"  {'total (the window)':34}{window / 1e3 / steps:10.3f}{100.0:7.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
