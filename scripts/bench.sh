#!/usr/bin/env bash
# fsdplab vs PyTorch FSDP, both on 2 ranks on this CPU, in one run: tiny, a mid-size config and qwen2-0.5b
# (MBS=1, SEQ=128, 2 steps). For each: the median step time after the first (warm-up) step and each run's peak
# memory as the largest process max RSS (the same measure for both), their ratios (fsdplab / torch; targets: time
# <= 0.8, peak <= 0.9), and fsdplab's tracked-allocator peak beside it.
#
# With qwen2-0.5b among the configs, a closer look follows for each SEQ in SEQS (default 64 and 128; MBS=1, ACC=1,
# QWEN_STEPS=5 steps, 2 ranks), from the runs' own records, in the steady state after two warm-up steps (the report's
# WARMUP says why two):
#   step time   median over steps 3..N, fsdplab and torch, and the ratio fsdplab / torch (target <= 0.25);
#   CPU         fsdplab's steady-state system / user CPU seconds per step (the `step` events of rank<R>.jsonl carry
#               each rank's cumulative cpu_user and cpu_sys: differences between consecutive steps, steps 3..N,
#               summed over ranks), and the whole run's system / user of both (scripts/train.sh RUSAGE: /usr/bin/time
#               around mpirun or torchrun, start-up, initialisation and loading included);
#   GFLOP/s     per rank over the whole step, against each rank's cblas_sgemm peak measured while both ranks multiply
#               at once (scripts/bench_model probe=1, 1 OpenBLAS thread per rank as the lab runs). FLOPs: the exact
#               matmul count of the model (qwen2_forward_flops: projections, attention's T x T products, MLP, lm_head;
#               backward twice forward; element-wise work not counted), not the 6 x params x tokens estimate, which
#               it also prints for comparison;
#   time split  compute / comm / optimizer / other: the whole run from summary.txt (trace/fsdptrace summary: compute,
#               comm, idle over the span), the optimizer's share of compute from the `compute` events of phase
#               "optimizer"; then the same per steady-state step from the events of steps 3..N; and each
#               collective's bandwidth (buffer bytes / time, from summary.txt's collective table).
#
# Prefetch (lab 06's modes), for mid and qwen2-0.5b when among the configs (PREFETCH=0 skips it): fsdplab in each mode
# (blocking: every collective on the host, as lab 05; NONE, BACKWARD_PRE, BACKWARD_POST: comm streams with torch's
# backward_prefetch of that name; forward: BACKWARD_PRE and forward_prefetch=True) beside PyTorch FSDP with the same
# backward_prefetch, 2 ranks, PREFETCH_STEPS steps (default 5; steady state from step 3): step time of both, and from
# fsdplab's events per steady step (mean of ranks) the comm streams' busy time, the exposed comm (the compute stream
# blocked on communication: waits for a comm stream, and collectives the host runs itself) and its share of the blocking
# mode's comm time, the communication work there was to hide. Target: exposed <= 30% of it with BACKWARD_PRE on a
# machine with spare cores; with 2 ranks on 2 cores the progress threads compete with compute for the same cores.
#
#   scripts/bench.sh                 (tens of minutes: qwen2-0.5b initialises, writes 2 GB checkpoints, 7 runs)
#   CONFIGS="tiny mid" scripts/bench.sh                       (a few minutes)
#   CONFIGS=qwen2-0.5b SEQS=64 QWEN_STEPS=5 scripts/bench.sh
#   REPORT_ONLY=1 CONFIGS=qwen2-0.5b scripts/bench.sh          (no runs: the closer look again, from runs/bench/)
#   TABLE=0 CONFIGS=qwen2-0.5b SEQS=128 scripts/bench.sh       (the closer look alone, without the first table)
# Run directories (rank<R>.jsonl, summary.txt) are TRAIN_DIR/fsdplab of each train.sh run: runs/bench/<config>/.
set -euo pipefail
cd "$(dirname "$0")/.."
configs=${CONFIGS:-tiny mid qwen2-0.5b}
seqs=${SEQS:-64 128}
qwen_steps=${QWEN_STEPS:-5}
work=runs/bench
mkdir -p "$work"
make -s lab/05_full_step scripts/bench_model trace/fsdptrace >/dev/null

settings() { # the train.sh settings of a config name
  case "$1" in
    tiny) echo "MODEL=tiny MBS=4 ACC=2 STEPS=4 SEQ=128" ;;
    mid) echo "MODEL=tiny" \
      "CONFIG=hidden_size=512,num_hidden_layers=8,num_attention_heads=8,num_key_value_heads=2,intermediate_size=1408" \
      "MBS=4 ACC=1 STEPS=4 SEQ=128" ;;
    qwen2-0.5b) echo "MODEL=qwen2-0.5b MBS=1 ACC=1 STEPS=2 SEQ=128" ;;
    *) echo "bench.sh: unknown config '$1' (tiny, mid, qwen2-0.5b)" >&2; exit 2 ;;
  esac
}

summary() { # summary LOG -> "median_time_after_first peak_mb"
  python3 - "$1" <<'PY'
import re, statistics, sys
rows = re.findall(r"^\d+/\d+: Loss = [\d.]+, Peak = ([\d.]+) MB, Time = ([\d.]+)s$", open(sys.argv[1]).read(), re.M)
times = [float(t) for _, t in rows][1:] or [float(rows[0][1])]
print(statistics.median(times), max(float(p) for p, _ in rows))
PY
}

if [ -z "${REPORT_ONLY:-}" ] && [ "${TABLE:-1}" != 0 ]; then
printf '%-11s %12s %12s %8s %14s %14s %8s %16s\n' config "fsdplab s" "torch s" ratio "fsdplab RSS" "torch RSS" ratio \
  "fsdplab tracked"
for config in $configs; do
  # shellcheck disable=SC2046
  env $(settings "$config") PEAK=rss TRAIN_DIR="$work/$config" FSDP=fsdplab scripts/train.sh \
    > "$work/$config.fsdplab.log"
  # shellcheck disable=SC2046
  env $(settings "$config") TRAIN_DIR="$work/$config" FSDP=torch scripts/train.sh > "$work/$config.torch.log"
  # shellcheck disable=SC2046
  env $(settings "$config") PEAK=tracked STEPS=1 TRAIN_DIR="$work/$config.tracked" FSDP=fsdplab scripts/train.sh \
    > "$work/$config.tracked.log"
  read -r ours_time ours_peak < <(summary "$work/$config.fsdplab.log")
  read -r torch_time torch_peak < <(summary "$work/$config.torch.log")
  read -r _ tracked_peak < <(summary "$work/$config.tracked.log")
  python3 -c "
o_t, t_t, o_p, t_p, tr = $ours_time, $torch_time, $ours_peak, $torch_peak, $tracked_peak
print(f'{\"$config\":<11} {o_t:>12.4f} {t_t:>12.4f} {o_t / t_t:>7.2f}x {o_p:>11.1f} MB {t_p:>11.1f} MB '
      f'{o_p / t_p:>7.2f}x {tr:>13.1f} MB')"
done
echo "(2 ranks; time: median step after the first; RSS: largest process max RSS; logs in $work/)"
fi

prefetch_steps=${PREFETCH_STEPS:-5}
# prefetch_report CONFIG: lab 06's modes on 2 ranks, fsdplab beside torch (see the header).
prefetch_report() {
  python3 - "$work/prefetch.$1" "$1" <<'PY'
import glob, json, re, statistics, sys

base, config = sys.argv[1], sys.argv[2]
WARMUP = 2  # as the qwen2-0.5b closer look: the allocator and the optimizer state settle in two steps


def step_time(log):
    rows = [float(t) for t in re.findall(r"^\d+/\d+: Loss = [\d.]+, Peak = [\d.]+ MB, Time = ([\d.]+)s$",
                                         open(log).read(), re.M)]
    return statistics.median(rows[WARMUP:] or rows), len(rows)


def union(spans):
    merged = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return sum(end - start for start, end in merged)


def per_step(rundir):
    """(comm busy, exposed) seconds per steady step: each rank's union of spans in each step's window, the mean
    over ranks, the median over steps."""
    rows = {}
    ranks = sorted(glob.glob(f"{rundir}/rank*.jsonl"))
    for path in ranks:
        events = [json.loads(line) for line in open(path)]
        for end in (e for e in events if e["kind"] == "step" and e["micro"] == -1 and e["step"] > WARMUP):
            start = end["ts"] - end["time"] * 1e6
            inside = [e for e in events if e["kind"] in ("collective", "wait") and start <= e["ts"] <= end["ts"]]
            comm = union([(e["ts"], e["ts"] + e["dur"]) for e in inside if e["kind"] == "collective"])
            exposed = union([(e["ts"], e["ts"] + e["dur"]) for e in inside
                             if (e["kind"] == "wait" and e["on"] != "compute") or
                             (e["kind"] == "collective" and e.get("stream", "compute") == "compute")])
            row = rows.setdefault(end["step"], [0.0, 0.0])
            row[0] += comm / 1e6 / len(ranks)
            row[1] += exposed / 1e6 / len(ranks)
    return statistics.median(r[0] for r in rows.values()), statistics.median(r[1] for r in rows.values())


blocking_comm = per_step(f"{base}.blocking/fsdplab")[0]
print(f"\nprefetch, {config}, 2 ranks: steady steps {WARMUP + 1}.. (step: median; comm, exposed: per step, mean of "
      f"ranks; work to hide = the blocking mode's comm {blocking_comm:.3f} s)")
print(f"  {'mode':<14} {'fsdplab s':>10} {'torch s':>10} {'ratio':>7} {'comm s':>8} {'exposed s':>10} "
      f"{'exposed/work':>13}")
for mode in ("blocking", "NONE", "BACKWARD_PRE", "BACKWARD_POST", "forward"):
    ours, steps = step_time(f"{base}.{mode}.fsdplab.log")
    comm, exposed = per_step(f"{base}.{mode}/fsdplab")
    torch_log = f"{base}.{mode}.torch.log"
    if mode == "blocking":
        theirs, ratio = "-", "-"
    else:
        t, _ = step_time(torch_log)
        theirs, ratio = f"{t:.4f}", f"{ours / t:.2f}x"
    print(f"  {mode:<14} {ours:>10.4f} {theirs:>10} {ratio:>7} {comm:>8.3f} {exposed:>10.3f} "
          f"{100 * exposed / blocking_comm if blocking_comm else 0:>12.0f}%")
PY
}

if [ "${PREFETCH:-1}" != 0 ]; then
  for config in $configs; do
    case "$config" in mid | qwen2-0.5b) ;; *) continue ;; esac
    base="$work/prefetch.$config"
    if [ -z "${REPORT_ONLY:-}" ]; then
      for mode in blocking NONE BACKWARD_PRE BACKWARD_POST forward; do
        streams=1 prefetch=$mode forward=0
        [ "$mode" = blocking ] && streams=0 prefetch=NONE
        [ "$mode" = forward ] && prefetch=BACKWARD_PRE forward=1
        # shellcheck disable=SC2046
        env $(settings "$config") STEPS="$prefetch_steps" COMM_STREAMS=$streams BACKWARD_PREFETCH=$prefetch \
          FORWARD_PREFETCH=$forward TRAIN_DIR="$base.$mode" FSDP=fsdplab scripts/train.sh > "$base.$mode.fsdplab.log"
        [ "$mode" = blocking ] && continue
        # shellcheck disable=SC2046
        env $(settings "$config") STEPS="$prefetch_steps" BACKWARD_PREFETCH=$prefetch FORWARD_PREFETCH=$forward \
          TRAIN_DIR="$base.$mode" FSDP=torch scripts/train.sh > "$base.$mode.torch.log"
      done
    fi
    prefetch_report "$config"
  done
fi

[[ " $configs " == *" qwen2-0.5b "* ]] || exit 0

mpirun_flags=()
[ "$(id -u)" = 0 ] && mpirun_flags+=(--allow-run-as-root)
[ 2 -gt "$(nproc)" ] && mpirun_flags+=(--oversubscribe)

# report SEQ DIR: the closer look at one qwen2-0.5b run pair (see the header).
report() {
  python3 - "$@" <<'PY'
import glob, json, re, statistics, sys

seq, directory = int(sys.argv[1]), sys.argv[2]
rundir = f"{directory}/fsdplab"


# Steady state: from step WARMUP + 1 on, for fsdplab and torch alike. Two warm-up steps, because a caching allocator
# warms up in two: step 1 creates the optimizer state (lazily, as torch.optim does) in segments the forward and
# backward had cached, and step 2 maps the segments that displaced, paying the first touch of fresh pages (about
# 3 s of system time per GB on this virtual machine). Steps 1 and 2 are still printed.
WARMUP = 2


def step_times(log):
    rows = re.findall(r"^\d+/\d+: Loss = [\d.]+, Peak = [\d.]+ MB, Time = ([\d.]+)s$", open(log).read(), re.M)
    times = [float(t) for t in rows]
    return statistics.median(times[WARMUP:] or times), len(times)


def rusage(path):  # "user sys wall" from /usr/bin/time
    user, system, wall = map(float, open(path).read().split()[-3:])
    return user, system, wall


ours, steps = step_times(f"{directory}.fsdplab.log")
theirs, _ = step_times(f"{directory}.torch.log")
probes = [json.loads(line) for line in open(f"{directory}/probe.jsonl") if line.startswith("{")]
ranks = sorted(glob.glob(f"{rundir}/rank*.jsonl"))
events = {path: [json.loads(line) for line in open(path)] for path in ranks}

print(f"\nqwen2-0.5b, {len(ranks)} ranks, MBS=1, ACC=1, SEQ={seq}, {steps} steps (steady state: steps "
      f"{WARMUP + 1}..{steps})")
print(f"  step time     fsdplab {ours:.3f} s, torch {theirs:.3f} s: ratio {ours / theirs:.3f} (target <= 0.25)")

# Per steady-state step k >= 2, each rank's difference of the cumulative CPU counters and the split of its window
# [end - time, end] into compute, comm and optimizer events, summed (CPU) or averaged (time) over ranks. Medians over
# the steps: step 2 still takes the first touch of the segments the optimizer state displaced in step 1.
per_step = {}
for path in ranks:
    ends = [e for e in events[path] if e["kind"] == "step" and e["micro"] == -1]
    for before, end in zip(ends, ends[1:]):
        row = per_step.setdefault(end["step"], {"user": 0.0, "sys": 0.0, "compute": 0.0, "comm": 0.0,
                                                "optimizer": 0.0, "total": 0.0})
        row["user"] += end["cpu_user"] - before["cpu_user"]
        row["sys"] += end["cpu_sys"] - before["cpu_sys"]
        start = end["ts"] - end["time"] * 1e6
        inside = [e for e in events[path] if e["kind"] in ("compute", "collective", "wait") and
                  start <= e["ts"] <= end["ts"]]
        mean = lambda seconds: seconds / 1e6 / len(ranks)
        row["optimizer"] += mean(sum(e["dur"] for e in inside if e["kind"] == "compute" and e["phase"] == "optimizer"))
        row["compute"] += mean(sum(e["dur"] for e in inside if e["kind"] == "compute" and e["phase"] != "optimizer"))
        # exposed comm: what the host waited (waits for a comm stream, collectives it ran itself); the comm streams'
        # busy time overlaps compute and is not part of the step's sum
        row["comm"] += mean(sum(e["dur"] for e in inside if e["kind"] == "wait" and e["on"] != "compute") +
                            sum(e["dur"] for e in inside if e["kind"] == "collective" and e.get("stream") == "compute"))
        for e in inside:
            if e["kind"] == "collective":
                row.setdefault(e["op"], [0, 0.0])
                row[e["op"]][0] += e["bytes"]
                row[e["op"]][1] += e["dur"]
        row["total"] += mean(end["time"] * 1e6)
for row in per_step.values():
    row["other"] = row["total"] - row["compute"] - row["comm"] - row["optimizer"]
all_steps = per_step
per_step = {k: row for k, row in all_steps.items() if k > WARMUP} or all_steps
median = lambda key: statistics.median(row[key] for row in per_step.values())
ours_run, torch_run = rusage(f"{directory}/rusage.fsdplab"), rusage(f"{directory}/rusage.torch")
print(f"  CPU sys/user  fsdplab per step: " + ", ".join(f"step {k} {row['sys'] / row['user']:.3f}" for k, row in
                                                          sorted(all_steps.items())) +
      f"; median of steps {WARMUP + 1}.. "
      f"{statistics.median(row['sys'] / row['user'] for row in per_step.values()):.3f} (user "
      f"{median('user'):.2f} s, sys {median('sys'):.2f} s per step, all ranks)")
print(f"                whole run: fsdplab {ours_run[1] / ours_run[0]:.3f} (user {ours_run[0]:.1f} s, sys "
      f"{ours_run[1]:.1f} s), torch {torch_run[1] / torch_run[0]:.3f} (user {torch_run[0]:.1f} s, sys "
      f"{torch_run[1]:.1f} s)")

# GFLOP/s per rank over the whole step against each rank's concurrent sgemm peak.
step_flops = probes[0]["step_flops"]
peak = statistics.mean(p["sgemm_peak_gflops"] for p in probes)
params = int(re.search(r"^total (\d+)$", open(f"{directory}/params.txt").read(), re.M)[1])
print(f"  GFLOP/s       fsdplab {step_flops / ours / 1e9:.1f} per rank = "
      f"{100 * step_flops / ours / 1e9 / peak:.0f}% of "
      f"the sgemm peak {peak:.1f} per rank (both ranks at once); torch {step_flops / theirs / 1e9:.1f} per rank "
      f"({step_flops / 1e9:.1f} GFLOP per rank per step, exact matmul count; 6 x params x tokens would say "
      f"{6 * params * seq / 1e9:.1f})")

# Whole-run split from summary.txt, the optimizer's part of compute from the events.
text = open(f"{rundir}/summary.txt").read()
number = lambda name: [float(v) for v in re.findall(rf"^  {name} +([\d.]+)", text, re.M)]
# exposed comm, not comm: collectives on comm streams overlap compute, so only what the host waited adds to the span
span, compute, comm, idle = (statistics.mean(number(n)) for n in ("span", "compute", "exposed comm", "idle"))
optimizer = statistics.mean(sum(e["dur"] for e in events[p] if e["kind"] == "compute" and e["phase"] == "optimizer")
                            for p in ranks) / 1000
share = lambda part: 100 * part / span
print(f"  time, run     compute {share(compute - optimizer):.1f}%, exposed comm {share(comm):.1f}%, optimizer "
      f"{share(optimizer):.1f}%, other {share(span - compute - comm):.1f}% of {span / 1000:.1f} s "
      "(summary.txt, mean of ranks; "
      f"initialisation and step 1's first touch included)")
print(f"  time, step    compute {median('compute'):.3f} s, exposed comm {median('comm'):.3f} s, optimizer "
      f"{median('optimizer'):.3f} s, other {median('other'):.3f} s of {median('total'):.3f} s (each the median over "
      f"steps {WARMUP + 1}..{steps} of the mean of ranks)")

# Each collective's bandwidth over the run: buffer bytes / time, from the collective table (mean of ranks).
table = {}
for op, calls, size, _, ms in re.findall(r"^  (all_gather|reduce_scatter|all_reduce|broadcast|barrier) +(\d+) +"
                                         r"([\d,]+) +([\d,]+) +([\d.]+)$", text, re.M):
    table.setdefault(op, []).append((int(calls), int(size.replace(",", "")), float(ms)))
print("  collectives   " + ", ".join(
    f"{op} {rows[0][0]} calls {sum(r[1] for r in rows) / sum(r[2] for r in rows) / 1e6:.2f} GB/s"
    for op, rows in table.items()) + " (buffer bytes / time, the whole run, first touches included)")
print("                " + ", ".join(
    f"{op} {statistics.median(row[op][0] / row[op][1] / 1e3 for row in per_step.values() if op in row):.2f} GB/s"
    for op in table) + f" (the median over steps {WARMUP + 1}..{steps})")
PY
}

for seq in $seqs; do
  dir="$work/qwen2-0.5b.seq$seq"
  if [ -n "${REPORT_ONLY:-}" ]; then report "$seq" "$dir"; continue; fi
  rm -rf "$dir"
  mkdir -p "$dir"
  common=(MODEL=qwen2-0.5b MBS=1 ACC=1 STEPS="$qwen_steps" SEQ="$seq" TRAIN_DIR="$dir" RUSAGE="$dir/rusage")
  env "${common[@]}" FSDP=fsdplab scripts/train.sh > "$dir.fsdplab.log"
  env "${common[@]}" FSDP=torch scripts/train.sh > "$dir.torch.log"
  OUT="$dir/probe" mpirun "${mpirun_flags[@]}" -np 2 scripts/bench_model probe=1 model=qwen2-0.5b B=1 T="$seq" \
    > "$dir/probe.jsonl"
  OUT="$dir/params" tests/bin/qwen2_tool params qwen2-0.5b > "$dir/params.txt"
  report "$seq" "$dir"
done
