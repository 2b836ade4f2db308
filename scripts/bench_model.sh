#!/usr/bin/env bash
# Forward + backward speed of fsdplab's Qwen2 vs PyTorch (HF Qwen2ForCausalLM, eager, fp32), one CPU thread each,
# same config and batch, in one run; prints tokens/s, the ratio ours/torch (target >= 1.0), and fsdplab's achieved
# GFLOP/s against a measured single-thread cblas_sgemm peak.
#
#   scripts/bench_model.sh            (make bench-model does the same after building)
#   ITERATIONS=10 B=4 T=128 scripts/bench_model.sh
set -euo pipefail
cd "$(dirname "$0")/.."
make -s scripts/bench_model >/dev/null

iterations=${ITERATIONS:-5}
batch=${B:-4}
length=${T:-128}
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OUT=${OUT:-runs/bench_model}

if ! python3 -c "import torch, transformers" 2>/dev/null; then
  echo "bench_model: torch/transformers missing (scripts/install_deps.sh installs them)" >&2
  exit 1
fi

configs=(
  "tiny|model=tiny"
  "mid (hidden 512, 8 layers)|model=tiny hidden=512 layers=8 heads=8 kv_heads=2 intermediate=1408"
)
field() { python3 -c "import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])" "$1" "$2"; }

printf '%-28s %10s %14s %14s %8s %12s %12s\n' config params "fsdplab tok/s" "torch tok/s" ratio "GFLOP/s" "sgemm peak"
for entry in "${configs[@]}"; do
  label=${entry%%|*}
  args="${entry#*|} B=$batch T=$length iterations=$iterations"
  # shellcheck disable=SC2086
  ours=$(scripts/bench_model $args)
  # shellcheck disable=SC2086
  theirs=$(python3 scripts/bench_torch.py $args 2>/dev/null | tail -n 1)
  ours_rate=$(field "$ours" tokens_per_s)
  torch_rate=$(field "$theirs" tokens_per_s)
  ratio=$(python3 -c "print(f'{$ours_rate / $torch_rate:.2f}x')")
  printf '%-28s %10s %14s %14s %8s %12s %12s\n' "$label" "$(field "$ours" params)" "$ours_rate" "$torch_rate" \
    "$ratio" "$(field "$ours" gflops)" "$(field "$ours" sgemm_peak_gflops)"
done
echo "(B=$batch, T=$length, median of $iterations steps after one warm-up, 1 thread each; torch $(python3 -c 'import torch; print(torch.__version__)'))"
