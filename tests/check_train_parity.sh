#!/usr/bin/env bash
# scripts/train.sh FSDP=both on the tiny model, 2 ranks, 3 steps, ACC=2: fsdplab's and PyTorch FSDP's per-step
# losses must agree to 1e-5 relative (the printed 6 decimals resolve ~2e-7). Skipped (exit 77) without torch.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! python3 -c "import torch, transformers" 2>/dev/null; then
  echo "skipped: torch or transformers is not installed (scripts/install_deps.sh installs them)"
  exit 77
fi
dir=runs/check/train_both
rm -rf "$dir"
TRAIN_DIR=$dir PROCESSES=2 MODEL=tiny MBS=4 ACC=2 STEPS=3 FSDP=both scripts/train.sh
python3 scripts/compare_runs.py "$dir/fsdplab.log" "$dir/torch.log" --max-loss-diff 1e-5
