#!/usr/bin/env python3
"""PROFILE_KERNELS=1's tables (core/cuda/kernel_profile.h) against the CUDA emulator's own counts of the same run.

    tests/check_kernel_profile.py PROFILED_RUN PLAIN_RUN "HOST_WAITS_LINE"

PROFILED_RUN is lab 05's STEPS=3 run on the emulator with PROFILE_KERNELS=1 (tests/host_waits.sh HOST_WAITS_OUT=...
PROFILE_KERNELS=1), HOST_WAITS_LINE what tests/host_waits.sh printed for it (per step and rank: "... launches L
copies C bytes B stops P gemms G"), PLAIN_RUN the same run without the profile. Every rank's kernels_rank<R>.txt must:
  - count 2 steps (steps 2 and 3: the first is left out), rows largest first, its total row the sum of the rows and
    the shares summing to 100%;
  - have as many GEMM calls (rows named cublas...) per step as the emulator's cuBLAS calls, and as many fills and
    device-to-device copies (cudaMemsetAsync, cudaMemcpyAsync device to device) as its copies within GPU memory: a
    GEMM or copy queued outside CUDA_TIMED is missed here;
  - name launchers that core/cuda/kernels.cuh declares (<name>_launch), at least one call each and together at most
    the emulator's kernel launches (a launcher launches one kernel or more);
and the profiled run's losses must equal the plain run's (the profile's events change no arithmetic).
"""
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_table(path):
    lines = open(path).read().splitlines()
    steps = re.match(r"# (\d+) steps", lines[1])
    rows, total = [], None
    for line in lines[3:]:
        match = re.match(r"(.+?)\s+([0-9.e+]+)\s+([0-9.]+)\s+([0-9.]+)%$", line)
        if not match:
            raise ValueError(f"{path}: a line that is no row: {line!r}")
        row = (match.group(1).strip(), float(match.group(2)), float(match.group(3)), float(match.group(4)))
        if row[0] == "total":
            total = row
        else:
            rows.append(row)
    return (int(steps.group(1)) if steps else None), rows, total


def losses(rundir, rank):
    out = []
    with open(os.path.join(rundir, f"rank{rank}.jsonl")) as f:
        for line in f:
            event = json.loads(line)
            if event.get("kind") == "step":
                out.append((event["step"], event["micro"], event["loss"]))
    return out


def main():
    profiled, plain, line = sys.argv[1], sys.argv[2], sys.argv[3].split()
    counts = {line[i]: float(line[i + 1]) for i in range(0, len(line) - 1, 2)}
    launchers = set(re.findall(r"\b(\w+)_launch\(", open(os.path.join(ROOT, "core/cuda/kernels.cuh")).read()))
    ranks = sorted(int(m.group(1)) for m in (re.fullmatch(r"rank(\d+)\.jsonl", f) for f in os.listdir(profiled)) if m)
    failures = []
    for rank in ranks:
        path = os.path.join(profiled, f"kernels_rank{rank}.txt")
        if not os.path.exists(path):
            failures.append(f"rank {rank}: no {path}")
            continue
        steps, rows, total = parse_table(path)
        name = f"rank {rank}"
        if steps != 2:
            failures.append(f"{name}: {steps} steps counted, not 2 (steps 2 and 3)")
        if total is None:
            failures.append(f"{name}: no total row")
            continue
        times = [row[2] for row in rows]
        if times != sorted(times, reverse=True):
            failures.append(f"{name}: rows not largest first")
        # The table prints calls with 6 significant digits, ms with 4 decimals, shares with 1: each row's rounding.
        if abs(sum(row[1] for row in rows) - total[1]) > 1e-6 * max(1.0, total[1]) * len(rows):
            failures.append(f"{name}: total calls {total[1]} != the rows' {sum(row[1] for row in rows)}")
        if abs(sum(times) - total[2]) > 5e-5 * (len(rows) + 1):
            failures.append(f"{name}: total ms {total[2]} != the rows' {sum(times):.4f}")
        if abs(sum(row[3] for row in rows) - 100.0) > 0.05 * len(rows) + 0.05:
            failures.append(f"{name}: shares sum to {sum(row[3] for row in rows):.1f}%")
        gemms = sum(row[1] for row in rows if row[0].startswith("cublas"))
        copies = sum(row[1] for row in rows if row[0] in ("cudaMemsetAsync", "cudaMemcpyAsync device to device"))
        kernels = [row for row in rows if not row[0].startswith(("cublas", "cudaMemsetAsync", "cudaMemcpyAsync"))]
        if gemms != counts["gemms"]:
            failures.append(f"{name}: {gemms:g} GEMM calls a step timed, the emulator ran {counts['gemms']:g}")
        if copies != counts["copies"]:
            failures.append(f"{name}: {copies:g} fills and copies a step timed, the emulator ran {counts['copies']:g}")
        unknown = [row[0] for row in kernels if row[0] not in launchers]
        if unknown:
            failures.append(f"{name}: rows that name no launcher of core/cuda/kernels.cuh: {unknown}")
        launched = sum(row[1] for row in kernels)
        if not kernels or min(row[1] for row in kernels) <= 0 or launched > counts["launches"] - counts["gemms"]:
            failures.append(f"{name}: {launched:g} launcher calls a step for {counts['launches'] - counts['gemms']:g} "
                            "kernel launches")
        print(f"{name}: 2 steps, {len(rows)} rows; per step {gemms:g} GEMMs (emulator {counts['gemms']:g}), "
              f"{copies:g} fills and copies ({counts['copies']:g}), {launched:g} launcher calls for "
              f"{counts['launches'] - counts['gemms']:g} kernels")
        if losses(profiled, rank) != losses(plain, rank):
            failures.append(f"{name}: the profiled run's losses differ from the plain run's")
    if not ranks:
        failures.append(f"{profiled}: no rank files")
    for failure in failures:
        print("FAIL", failure)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
