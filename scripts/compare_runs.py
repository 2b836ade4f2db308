"""Side by side: two logs in lab 05's line format (`1/3: Loss = ..., Peak = ... MB, Time = ...s`), one row per
step with both losses, their relative difference, and the time and peak ratios (first / second). Exit 1 when the
logs have different step counts, or when --max-loss-diff is given and a step's losses differ by more than
REL x loss + (step - 1) x DRIFT + 1e-6 (the printed 6 decimals round each side by up to 5e-7).

usage: python3 scripts/compare_runs.py FSDPLAB_LOG TORCH_LOG [--gpu] [--max-loss-diff REL [--drift DRIFT]]
       (tests/check_train_parity.sh derives REL and DRIFT with tests/tolerances.py; --gpu: the runs were on a GPU,
       where each Peak is GPU memory, not the process's max RSS)
"""
import re
import sys

LINE = re.compile(r"^(\d+)/(\d+): Loss = ([\d.]+), Peak = ([\d.]+) MB, Time = ([\d.]+)s$", re.M)


def steps(path):
    return [(int(m[0]), float(m[2]), float(m[3]), float(m[4])) for m in LINE.findall(open(path).read())]


def main(first, second, *options):
    gpu = "--gpu" in options
    options = [o for o in options if o != "--gpu"]
    settings = dict(zip(options[::2], map(float, options[1::2])))
    if len(options) % 2 or not set(settings) <= {"--max-loss-diff", "--drift"}:
        print(__doc__, file=sys.stderr)
        return 2
    limit, drift = settings.get("--max-loss-diff"), settings.get("--drift", 0.0)
    ours, theirs = steps(first), steps(second)
    if not ours or len(ours) != len(theirs):
        print(f"compare_runs: {len(ours)} steps in {first}, {len(theirs)} in {second}")
        return 1
    print(f"{'step':>4} {'fsdplab loss':>13} {'torch loss':>11} {'rel. diff':>10} {'time ratio':>11} "
          f"{'peak ratio':>11}")
    for (step, loss, peak, time), (_, loss_t, peak_t, time_t) in zip(ours, theirs):
        print(f"{step:>4} {loss:>13.6f} {loss_t:>11.6f} {abs(loss - loss_t) / loss_t:>10.1e} {time / time_t:>10.2f}x"
              f" {peak / peak_t:>10.2f}x")
    measure = ("GPU memory, fsdplab's tracked allocated peak beside torch.cuda.max_memory_allocated()" if gpu
               else "each run's largest process max RSS")
    print(f"(ratios are fsdplab / torch; peak: {measure})")
    if limit is None:
        return 0
    outside = [step for (step, loss, _, _), (_, loss_t, _, _) in zip(ours, theirs)
               if not abs(loss - loss_t) <= limit * loss_t + (step - 1) * drift + 1e-6]
    print(f"{'FAIL' if outside else 'OK'}: bound {limit:.1e} x loss + (step - 1) x {drift:.1e} + 1e-6; "
          f"steps outside it: {outside or 'none'}")
    return 1 if outside else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
