#!/usr/bin/env bash
# Forward + backward speed of fsdplab's Qwen2 vs PyTorch (HF Qwen2ForCausalLM, eager, fp32), one CPU thread each,
# same config and batch, in one run; prints tokens/s, the ratio ours/torch (target >= 1.0), and fsdplab's achieved
# GFLOP/s against a measured single-thread cblas_sgemm peak.
#
#   scripts/bench_model.sh            (make bench-model does the same after building)
#   ROUNDS=3 ITERATIONS=10 B=4 T=128 scripts/bench_model.sh
# The two run alternately ROUNDS times and each reports the median of its rounds: on a shared (virtual) machine the
# speed drifts by tens of percent over a minute, and alternating exposes both to the same drift.
set -euo pipefail
cd "$(dirname "$0")/.."
make -s scripts/bench_model >/dev/null

iterations=${ITERATIONS:-5}
rounds=${ROUNDS:-3}
batch=${B:-4}
length=${T:-128}
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OUT=${OUT:-runs/bench_model}

if ! python3 -c "import torch, transformers" 2>/dev/null; then
  echo "bench_model: torch/transformers missing (scripts/install_deps.sh installs them)" >&2
  exit 1
fi

configs=(
  "tiny|model=tiny"
  "mid (hidden 512, 8 layers)|model=tiny hidden_size=512 num_hidden_layers=8 num_attention_heads=8 "\
"num_key_value_heads=2 intermediate_size=1408"
)
field() { python3 -c "import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])" "$1" "$2"; }
median() { python3 -c "import statistics,sys; print(statistics.median(float(x) for x in sys.argv[1:]))" "$@"; }

printf '%-28s %10s %14s %14s %8s %12s %12s\n' config params "fsdplab tok/s" "torch tok/s" ratio "GFLOP/s" "sgemm peak"
for entry in "${configs[@]}"; do
  label=${entry%%|*}
  args="${entry#*|} B=$batch T=$length iterations=$iterations"
  ours_rates=() torch_rates=()
  for ((round = 0; round < rounds; round++)); do
    # shellcheck disable=SC2086
    ours=$(scripts/bench_model $args)
    # shellcheck disable=SC2086
    theirs=$(python3 scripts/bench_torch.py $args 2>/dev/null | tail -n 1)
    ours_rates+=("$(field "$ours" tokens_per_s)")
    torch_rates+=("$(field "$theirs" tokens_per_s)")
  done
  ours_rate=$(median "${ours_rates[@]}")
  torch_rate=$(median "${torch_rates[@]}")
  ratio=$(python3 -c "print(f'{$ours_rate / $torch_rate:.2f}x')")
  printf '%-28s %10s %14s %14s %8s %12s %12s\n' "$label" "$(field "$ours" params)" "$ours_rate" "$torch_rate" \
    "$ratio" "$(field "$ours" gflops)" "$(field "$ours" sgemm_peak_gflops)"
done
echo "(B=$batch, T=$length; tokens/s: median over $rounds alternating rounds of the median of $iterations steps after"
echo " one warm-up; 1 thread each; GFLOP/s and peak from fsdplab's last round;" \
  "torch $(python3 -c 'import torch; print(torch.__version__)'))"
