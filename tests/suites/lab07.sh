# lab 07 — mixed precision. The lab runs the same steps in float32 and with MP; check_lab07.py asserts from its events
# and tables that the all-gathers (and bfloat16 reduce-scatters) move exactly half the bytes, the float32 master,
# gradient shard and AdamW states keep their size, the low-precision shard lives from pre_unshard to post_unshard,
# and the losses track float32 within tolerances.mixed_precision_loss_bound; check_memory_model.py that the memory
# model is exact per category in both runs. Then N ranks vs 1 rank in bfloat16 (lab 05 MP=bf16 GRADS) within the
# bound of bfloat16 rounding of a sum over ranks (tolerances.bf16_sum_over_ranks_l1).
lab07() { # lab07 NAME RANKS DIR ENV...
  local name=$1 ranks=$2 dir=$3
  shift 3
  run_lab "$name" "$ranks" "$dir" 07_mixed_precision "$@"
  check "$name: memory model exact in both runs" python3 tests/check_memory_model.py "$(log_of "$name")"
  check "$name: bytes halve, masters unchanged, losses track float32" python3 tests/check_lab07.py "$dir" \
    "$(log_of "$name")"
}
lab07 "07_mixed_precision -np 2 MP=bf16" 2 runs/check/07_np2
lab07 "07_mixed_precision -np 3 MP=bf16,reduce=fp32" 3 runs/check/07_np3_reduce_fp32 MP=bf16,reduce=fp32
lab07 "07_mixed_precision -np 4 MP=bf16 (ring buffers)" 4 runs/check/07_np4 STEPS=6
lab07 "07_mixed_precision -np 2 MP=bf16 streams, BACKWARD_PRE, forward prefetch" 2 runs/check/07_np2_streams \
  STEPS=6 COMM_STREAMS=1 BACKWARD_PREFETCH=BACKWARD_PRE FORWARD_PREFETCH=1
check "07_mixed_precision -np 2 MP=bf16 streams: trace.json opens in Perfetto UI and Catapult (every arrow)" \
  python3 tests/check_trace_viewers.py runs/check/07_np2_streams
# N ranks vs 1 rank: step 1's gradients of lab 05 with MP=bf16 on the same global batch (8 sequences, ACC 1).
mixed05() { # mixed05 NAME RANKS DIR ENV...
  local name=$1 ranks=$2 dir=$3
  shift 3
  run_lab "$name" "$ranks" "$dir" 05_full_step STEPS=1 ACC=1 SEQ=128 MBS=$((8 / ranks)) MP=bf16 GRADS="$dir/grads" "$@"
}
mixed05 "05_full_step -np 1 MP=bf16: the reference" 1 runs/check/07_grads_np1
for ranks in 2 4; do
  mixed05 "05_full_step -np $ranks MP=bf16" $ranks runs/check/07_grads_np$ranks
  check "05_full_step -np $ranks MP=bf16: gradients within bfloat16's bound of 1 rank's" python3 \
    tests/check_mixed_grads.py runs/check/07_grads_np1/grads runs/check/07_grads_np$ranks/grads 1024 128
done
# bfloat16 compute as torch's: torch's op rules, then the model against HF's in bfloat16 (logits, loss, every gradient)
# within the flip bound (tests/check_torch_bf16.py derives it); skipped without torch.
check "MP=bf16 computes as torch's bfloat16 ops and model (per-op rules; logits and gradients within the flip bound)" \
  python3 tests/check_torch_bf16.py
check_fails "07_mixed_precision MP=fp32 is refused: nothing to compare" "MP='fp32': lab 07 compares" \
  env OUT=runs/check/07_bad MP=fp32 $MPIRUN -np 2 lab/07_mixed_precision
