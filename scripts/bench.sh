#!/usr/bin/env bash
# fsdplab vs PyTorch FSDP, both on 2 ranks on this CPU, in one run: tiny, a mid-size config and qwen2-0.5b
# (MBS=1, SEQ=128, 2 steps). For each: the median step time after the first (warm-up) step and each run's peak
# memory as the largest process max RSS (the same measure for both), their ratios (fsdplab / torch; targets: time
# <= 0.8, peak <= 0.9), and fsdplab's tracked-allocator peak beside it.
#
#   scripts/bench.sh                 (several minutes: qwen2-0.5b initialises and writes 2 GB checkpoints)
#   CONFIGS="tiny mid" scripts/bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
configs=${CONFIGS:-tiny mid qwen2-0.5b}
work=runs/bench
mkdir -p "$work"

settings() { # the train.sh settings of a config name
  case "$1" in
    tiny) echo "MODEL=tiny MBS=4 ACC=2 STEPS=4 SEQ=128" ;;
    mid) echo "MODEL=tiny CONFIG=hidden_size=512,num_hidden_layers=8,num_attention_heads=8,num_key_value_heads=2,intermediate_size=1408 MBS=4 ACC=1 STEPS=4 SEQ=128" ;;
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

printf '%-11s %12s %12s %8s %14s %14s %8s %16s\n' config "fsdplab s" "torch s" ratio "fsdplab RSS" "torch RSS" ratio "fsdplab tracked"
for config in $configs; do
  # shellcheck disable=SC2046
  env $(settings "$config") PEAK=rss TRAIN_DIR="$work/$config" FSDP=fsdplab scripts/train.sh > "$work/$config.fsdplab.log"
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
print(f'{\"$config\":<11} {o_t:>12.4f} {t_t:>12.4f} {o_t / t_t:>7.2f}x {o_p:>11.1f} MB {t_p:>11.1f} MB {o_p / t_p:>7.2f}x {tr:>13.1f} MB')"
done
echo "(2 ranks; time: median step after the first; RSS: largest process max RSS; logs in $work/)"
