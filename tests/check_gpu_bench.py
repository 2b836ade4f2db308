#!/usr/bin/env python3
"""The format of scripts/gpu_bench.sh's report (gpu_bench.txt): what its dry run (GPU_BENCH_DRY_RUN=1) must show
before GPU time is spent on it.

    check_gpu_bench.py GPU_BENCH_TXT [SETTINGS]

SETTINGS (default 3): how many setting blocks there must be. Each block: its `== name: MODEL=... MBS=... SEQ=...
ACC=... MP=...` title with the TFLOP per step and the peak; the rows step time (s), TFLOP/s, % of peak, peak memory
(MB) with a number per side (the % a number or `unknown`) and the fsdplab/torch ratio `N.NNx` (none for %); then the
time table: a header, one row or more of `kind  ms  share%`, `host, untraced` among them, and `total (the window)` at
100.0%, the rows' shares summing to 100% within their rounding (0.05% each). The last line says `gpu_bench: 0 failed`.
Prints what is wrong and exits 1, or prints OK.
"""
import re
import sys

NUMBER = r"-?[0-9]+(?:\.[0-9]+)?"


def check(lines, settings):
    problems = []
    titles = [i for i, line in enumerate(lines) if line.startswith("== ")]
    if len(titles) != settings:
        problems.append(f"{len(titles)} setting blocks, expected {settings}")
    for number, start in enumerate(titles):
        stop = titles[number + 1] if number + 1 < len(titles) else len(lines)
        block = lines[start:stop]
        title = block[0]
        if not re.match(rf"== \w+: MODEL=\S+ MBS=\d+ SEQ=\d+ ACC=\d+ MP=\w+: {NUMBER} TFLOP per step; peak .+", title):
            problems.append(f"block {number + 1}: title not as expected: {title!r}")
        name = title.split(":")[0]
        rows = {
            "step time (s)": rf"step time \(s\)\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}x$",
            "TFLOP/s": rf"TFLOP/s\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}x$",
            "% of peak": rf"% of peak\s+({NUMBER}%|unknown)\s+({NUMBER}%|unknown)$",
            "peak memory (MB)": rf"peak memory \(MB\)\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}x$",
        }
        for row, pattern in rows.items():
            if not any(re.match(pattern, line) for line in block):
                problems.append(f"{name}: no '{row}' row of the expected form")
        try:
            table = next(i for i, line in enumerate(block) if line.startswith("where fsdplab's time goes"))
        except StopIteration:
            problems.append(f"{name}: no time table")
            continue
        shares, total, untraced = [], None, False
        for line in block[table + 2:]:
            match = re.match(rf"  (.+?)\s+({NUMBER})\s+({NUMBER})%$", line)
            if not match:
                break
            if match.group(1) == "total (the window)":
                total = float(match.group(3))
                break
            untraced |= match.group(1) == "host, untraced"
            shares.append(float(match.group(3)))
        if not shares:
            problems.append(f"{name}: the time table has no rows")
        if not untraced:
            problems.append(f"{name}: the time table has no 'host, untraced' row")
        if total != 100.0:
            problems.append(f"{name}: the time table's total is {total}, not 100.0%")
        elif abs(sum(shares) - 100.0) > 0.05 * len(shares) + 1e-9:
            problems.append(f"{name}: the rows' shares sum to {sum(shares):.1f}%, not 100%")
    if not lines or not re.match(r"gpu_bench: 0 failed", lines[-1]):
        problems.append(f"last line is not 'gpu_bench: 0 failed': {lines[-1] if lines else ''!r}")
    return problems


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__.split("\n\n")[1])
    with open(sys.argv[1]) as report:
        lines = report.read().splitlines()
    problems = check(lines, int(sys.argv[2]) if len(sys.argv) == 3 else 3)
    for problem in problems:
        print(f"FAIL {problem}")
    if problems:
        return 1
    print(f"OK: {sys.argv[1]}: every setting's rows and time table")
    return 0


if __name__ == "__main__":
    sys.exit(main())
