"""Compares the per-step losses of two lab 05 runs, read from their events (rank 0's `step` events with micro -1,
which carry the loss averaged over micro-batches and ranks at full precision).

usage: python3 tests/compare_losses.py REFERENCE_RUNDIR RUNDIR [TOLERANCE]     (relative, default 1e-5)
"""
import json
import sys


def step_losses(rundir):
    with open(f"{rundir}/rank0.jsonl") as events:
        return [e["loss"] for e in map(json.loads, events) if e["kind"] == "step" and e["micro"] == -1]


def main(reference_dir, run_dir, tolerance=1e-5):
    reference, run = step_losses(reference_dir), step_losses(run_dir)
    if not reference or len(reference) != len(run):
        print(f"FAIL: {len(reference)} steps in {reference_dir}, {len(run)} in {run_dir}")
        return 1
    worst = max(abs(a - b) / abs(b) for a, b in zip(run, reference))
    for step, (a, b) in enumerate(zip(run, reference), 1):
        print(f"step {step}: {a:.7f} vs {b:.7f} (relative {abs(a - b) / abs(b):.2e})")
    print(f"{'OK' if worst <= tolerance else 'FAIL'}: largest relative difference {worst:.2e}, tolerance {tolerance:.0e}")
    return 0 if worst <= tolerance else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], *(float(x) for x in sys.argv[3:])))
