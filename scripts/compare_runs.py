"""Side by side: two logs in lab 05's line format (`1/3: Loss = ..., Peak = ... MB, Time = ...s`), one row per
step with both losses, their relative difference, and the time and peak ratios (first / second). Exit 1 when the
logs have different step counts, or when --max-loss-diff is given and a step's losses differ by more (relative).

usage: python3 scripts/compare_runs.py FSDPLAB_LOG TORCH_LOG [--max-loss-diff 1e-5]
"""
import re
import sys

LINE = re.compile(r"^(\d+)/(\d+): Loss = ([\d.]+), Peak = ([\d.]+) MB, Time = ([\d.]+)s$", re.M)


def steps(path):
    return [(int(m[0]), float(m[2]), float(m[3]), float(m[4])) for m in LINE.findall(open(path).read())]


def main(first, second, *options):
    limit = float(options[1]) if len(options) == 2 and options[0] == "--max-loss-diff" else None
    ours, theirs = steps(first), steps(second)
    if not ours or len(ours) != len(theirs):
        print(f"compare_runs: {len(ours)} steps in {first}, {len(theirs)} in {second}")
        return 1
    print(f"{'step':>4} {'fsdplab loss':>13} {'torch loss':>11} {'rel. diff':>10} {'time ratio':>11} {'peak ratio':>11}")
    for (step, loss, peak, time), (_, loss_t, peak_t, time_t) in zip(ours, theirs):
        print(f"{step:>4} {loss:>13.6f} {loss_t:>11.6f} {abs(loss - loss_t) / loss_t:>10.1e} {time / time_t:>10.2f}x"
              f" {peak / peak_t:>10.2f}x")
    print("(ratios are fsdplab / torch; peak: each run's largest process max RSS)")
    worst = max(abs(a[1] - b[1]) / b[1] for a, b in zip(ours, theirs))
    if limit is not None:
        print(f"{'OK' if worst <= limit else 'FAIL'}: largest relative loss difference {worst:.1e}, limit {limit:.0e}")
        return 0 if worst <= limit else 1
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
