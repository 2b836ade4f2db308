#!/usr/bin/env bash
# scripts/train.sh FSDP=both on the tiny model, 2 ranks, 3 steps, ACC=2: fsdplab's and PyTorch FSDP's per-step
# losses must agree within the bounds tests/tolerances.py derives: rounding (the first step starts from the same
# bytes) plus, for each later step, the loss drift AdamW can make of gradient rounding. Both are loose next to the
# measured differences (about 1e-7); the tight checks of the same arithmetic are the HF gradient parity and the AdamW
# parity. Skipped (exit 77) without torch.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! python3 -c "import torch, transformers" 2>/dev/null; then
  echo "skipped: torch or transformers is not installed (scripts/install_deps.sh installs them)"
  exit 77
fi
# With an argument, the same on Qwen2's vocabulary: `qwen2` cuts qwen2-0.5b to one small layer (CONFIG) and keeps
# its 151,936-row embedding, so the text goes through Qwen2's tokenizer on both sides (qwen2_tool batches hands
# torch the ids lab 05 reads). Skipped without the vocabulary. With `bf16`: both sides with mixed precision (MP=bf16:
# torch's MixedPrecision(param_dtype=bfloat16, reduce_dtype=bfloat16)), 5 steps, each within
# tolerances.torch_bf16_loss_tolerance of the loss (both round every op's output to bfloat16 at the same places:
# only summation-order flips separate them) plus, per step taken, tolerances.torch_bf16_drift: lr x the measured
# difference of the two sides' step-1 gradients (torch writes its own, TORCH_GRADS), which must itself stay far
# below what a wrong gradient would make.
dir=runs/check/train_both model=tiny config= seq=128 mp=fp32 steps=3
if [ "${1:-}" = qwen2 ]; then
  vocabulary=${QWEN2_TOKENIZER:-data/qwen2/qwen.tiktoken}
  if [ ! -f "$vocabulary" ]; then
    echo "skipped: no Qwen2 vocabulary at $vocabulary (scripts/get_qwen2_tokenizer.sh fetches it)"
    exit 77
  fi
  dir=runs/check/train_both_qwen2 model=qwen2 seq=64
  config=hidden_size=64,num_hidden_layers=1,intermediate_size=128,num_attention_heads=2,num_key_value_heads=1
fi
ranks=2 mbs=4 acc=2 lr=1e-3 strategy=${STRATEGY:-FULL_SHARD}
# With `hybrid` (lab 08): HYBRID_SHARD on 4 ranks as a 2 x 2 mesh (SHARD_GROUP=2; torch gets the same mesh through
# init_device_mesh), the same global batch of 8 sequences. `hybrid_zero2`: _HYBRID_SHARD_ZERO2 likewise.
case "${1:-}" in
  hybrid) dir=runs/check/train_both_hybrid ranks=4 mbs=2 strategy=HYBRID_SHARD ;;
  hybrid_zero2) dir=runs/check/train_both_hybrid_zero2 ranks=4 mbs=2 strategy=_HYBRID_SHARD_ZERO2 ;;
esac
if [ "${1:-}" = bf16 ]; then
  dir=runs/check/train_both_bf16 mp=bf16 steps=5
fi
# `bf16_fsdp2`: the same with FSDP2 on both sides (lab 05 FSDP_VERSION=2 MP=bf16; torch's fully_shard with
# MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=bfloat16)), within the same bounds: the arithmetic they bound
# (bfloat16 outputs rounded at the same places, summation order) is the same, only where each element is kept moves.
if [ "${1:-}" = bf16_fsdp2 ]; then
  dir=runs/check/train_both_bf16_fsdp2 mp=bf16 steps=5
  export FSDP_VERSION=2
fi
# `output_bf16_fsdp2`: FSDP2 on both sides with MixedPrecisionPolicy(param_dtype=float32, reduce_dtype=bfloat16,
# output_dtype=bfloat16) (MP=fp32,reduce=bf16,output=bf16): float32 compute, each decoder layer's output and the
# logits rounded to bfloat16, and in backward the gradients of the layers' inputs and of the logits, the gradients
# reduced in bfloat16; held to the bfloat16 bounds above (5 steps), which count a rounding at every op's output: an
# upper bound for these few.
if [ "${1:-}" = output_bf16_fsdp2 ]; then
  dir=runs/check/train_both_output_bf16_fsdp2 mp=fp32,reduce=bf16,output=bf16 steps=5
  export FSDP_VERSION=2
fi
# `fsdp2_prefetch`: FSDP2 on both sides, float32, with the explicit prefetch lists (FORWARD_PREFETCH_MODULES=2
# BACKWARD_PREFETCH_MODULES=2: torch's set_modules_to_forward_prefetch / set_modules_to_backward_prefetch on each
# layer; fsdplab on its comm streams), within the default bounds: the lists change when data moves, never a value.
if [ "${1:-}" = fsdp2_prefetch ]; then
  dir=runs/check/train_both_fsdp2_prefetch
  export FSDP_VERSION=2 COMM_STREAMS=1 FORWARD_PREFETCH_MODULES=2 BACKWARD_PREFETCH_MODULES=2
fi
rm -rf "$dir"
tokens=$((ranks * mbs * acc * seq))
GRADS="$dir/grads" TORCH_GRADS=$([ "$mp" != fp32 ] && echo "$dir/torch_grads" || true) TRAIN_DIR=$dir PROCESSES=$ranks \
  MODEL=$model CONFIG=$config MBS=$mbs ACC=$acc SEQ=$seq LR=$lr \
  STRATEGY=$strategy SHARD_GROUP=2 STEPS=$steps MP=$mp FSDP=both scripts/train.sh
if [ "$model" = qwen2 ] && ! grep -q "Qwen2 tokenizer" "$dir/fsdplab.log"; then
  echo "FAIL: $dir/fsdplab.log does not say the text went through Qwen2's tokenizer"
  exit 1
fi
if [ "${1:-}" = fsdp2_prefetch ] &&
  ! grep -q "fully_shard prefetch lists: each decoder layer" "$dir/torch/stderr.log"; then
  echo "FAIL: $dir/torch/stderr.log does not say torch set the prefetch lists"
  exit 1
fi
if [ "${1:-}" = fsdp2_prefetch ]; then # fsdplab's side used its lists: layers k .. k+2 unsharded in forward, ...
  python3 tests/check_lab10.py prefetch "$dir/fsdplab" 2 2
fi
if [ "$mp" != fp32 ]; then
  drift=$(python3 tests/tolerances.py torch_bf16_drift "$dir/grads" "$dir/torch_grads" $lr)
  exec python3 scripts/compare_runs.py "$dir/fsdplab.log" "$dir/torch.log" \
    --max-loss-diff "$(python3 tests/tolerances.py torch_bf16_loss "$dir/grads/config.json" $tokens $seq)" \
    --drift "$drift"
fi
python3 scripts/compare_runs.py "$dir/fsdplab.log" "$dir/torch.log" \
  --max-loss-diff "$(python3 tests/tolerances.py loss "$dir/grads/config.json" $tokens $seq)" \
  --drift "$(python3 tests/tolerances.py drift "$dir/grads" $tokens $seq $lr)"
