# lab 07 — mixed precision. The lab runs the same steps in float32 and with MP; check_lab07.py asserts from its events
# and tables that the all-gathers (and bfloat16 reduce-scatters) move exactly half the bytes, the float32 master,
# gradient shard and AdamW states keep their size, the low-precision shard lives from pre_unshard to post_unshard,
# and the losses track float32 within tolerances.mixed_precision_loss_bound; check_memory_model.py that the memory
# model is exact per category in both runs. Then N ranks vs 1 rank in bfloat16 (lab 05 MP=bf16 GRADS) within the
# bound of bfloat16 rounding of a sum over ranks (tolerances.bf16_sum_over_ranks_l1). MP under NO_SHARD, HYBRID_SHARD
# and CPU offload against their float32-reduce (or unoffloaded) twins; the bfloat16 compute against torch's.
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
# Mixed precision under the strategies that reduce otherwise, and with CPU offload (lab 05, step 1's GRADS, ACC 1):
#   NO_SHARD all-reduces each unit's whole gradient, HYBRID_SHARD (and _HYBRID_SHARD_ZERO2) reduce-scatters in the
#   shard group then all-reduces across the replicate group, both in bfloat16 (comm_all_reduce_typed's ring). Each runs
#   with MP=bf16,reduce=fp32 too: the same local gradients, bit for bit, so the two differ only by the bfloat16
#   reduction's rounding, within tolerances.bf16_reduction_l1 (tests/check_mixed_strategies.py grads); the bytes are
#   the bfloat16 collectives' (check_mixed_strategies.py no_shard; check_lab08.py traffic with 2-byte elements); the
#   memory model is exact. 3 ranks: NO_SHARD's all-reduce cuts chunks of unequal size (184,832 = 3 x 61,610 + 2).
mixedreduce() { # mixedreduce NAME RANKS TAG ENV...: MP=bf16,reduce=fp32 and MP=bf16, step-1 gradients compared
  local name=$1 ranks=$2 tag=$3 mp dir
  shift 3
  for mp in bf16,reduce=fp32 bf16; do
    dir=runs/check/07_${tag}_$([ $mp = bf16 ] && echo bf16 || echo reduce_fp32)
    run_lab "05_full_step -np $ranks MP=$mp $name" "$ranks" $dir 05_full_step STEPS=1 ACC=1 SEQ=128 \
      MBS=$((8 / ranks)) MP=$mp GRADS=$dir/grads "$@"
  done
  check "05_full_step -np $ranks MP=bf16 $name: gradients within the bfloat16 reduction's bound of reduce=fp32's" \
    python3 tests/check_mixed_strategies.py grads runs/check/07_${tag}_reduce_fp32/grads runs/check/07_${tag}_bf16/grads
}
mixedreduce "NO_SHARD" 2 no_shard_np2 STRATEGY=NO_SHARD
check "05_full_step -np 2 MP=bf16 NO_SHARD: one bfloat16 all_reduce per unit, 2-byte elements, nothing else" \
  python3 tests/check_mixed_strategies.py no_shard runs/check/07_no_shard_np2_bf16 \
  runs/check/07_no_shard_np2_bf16/grads/config.json 1 1
mixedreduce "NO_SHARD" 3 no_shard_np3 STRATEGY=NO_SHARD MBS=3
mixedreduce "HYBRID_SHARD 2 x 2 streams" 4 hybrid STRATEGY=HYBRID_SHARD SHARD_GROUP=2 COMM_STREAMS=1 \
  BACKWARD_PREFETCH=BACKWARD_PRE
check "05_full_step -np 4 MP=bf16 HYBRID_SHARD 2 x 2: bytes across groups exactly the bfloat16 replicate all-reduces'" \
  python3 tests/check_lab08.py traffic runs/check/07_hybrid_bf16 runs/check/07_hybrid_bf16/grads/config.json 2 1 1 2
mixedreduce "_HYBRID_SHARD_ZERO2 2 x 2" 4 hybrid_zero2 STRATEGY=_HYBRID_SHARD_ZERO2 SHARD_GROUP=2
# The memory model of each, to the byte; and with the root's shard the largest (a 4000-word embedding, as Qwen2-0.5B's
# 151,936 words make it: the H200 run showed the model counting the root's _mp_shard beside the first layer's, a pair
# only forward prefetch makes), with streams and BACKWARD_PRE, forward prefetch off and on.
for variant in "2 STRATEGY=NO_SHARD" "3 STRATEGY=NO_SHARD MBS=3" \
  "2 CONFIG=vocab_size=4000 COMM_STREAMS=1 BACKWARD_PREFETCH=BACKWARD_PRE FORWARD_PREFETCH=0" \
  "2 CONFIG=vocab_size=4000 COMM_STREAMS=1 BACKWARD_PREFETCH=BACKWARD_PRE FORWARD_PREFETCH=1" \
  "4 STRATEGY=HYBRID_SHARD SHARD_GROUP=2 MBS=2 COMM_STREAMS=1 BACKWARD_PREFETCH=BACKWARD_PRE" \
  "4 STRATEGY=_HYBRID_SHARD_ZERO2 SHARD_GROUP=2 MBS=2" "4 STRATEGY=HYBRID_SHARD SHARD_GROUP=1 MBS=2" \
  "4 STRATEGY=HYBRID_SHARD SHARD_GROUP=2 MBS=2 MP=bf16,reduce=fp32"; do
  set -- $variant
  check "05_full_step -np $* MP=bf16: memory model exact to the byte" bash -c "env OUT=runs/check/07_memory STEPS=2 \
    MP=bf16 ${*:2} $MPIRUN -np $1 lab/05_full_step > runs/check/07_memory.log &&
    python3 tests/check_memory_model.py runs/check/07_memory.log"
done
# CPU offload with MP=bf16 (FULL_SHARD ACC=2; HYBRID_SHARD 2 x 2 with streams): offload moves bytes, never changes
# them: the losses and the saved parameters equal the run without offload bit for bit; the h2d copies move the
# float32 shard (cast to bfloat16 on the device, as torch), the d2h copies the float32 gradient shard.
mixedoffload() { # mixedoffload NAME RANKS TAG ENV...
  local name=$1 ranks=$2 tag=$3 offload
  shift 3
  for offload in 0 1; do
    run_lab "05_full_step -np $ranks MP=bf16 $name OFFLOAD=$offload" "$ranks" "runs/check/07_${tag}_$offload" \
      05_full_step STEPS=3 MP=bf16 OFFLOAD=$offload SAVE="runs/check/07_${tag}_$offload/checkpoint" "$@"
  done
  check "05_full_step -np $ranks MP=bf16 $name: OFFLOAD=1 gives the same losses and parameters, bit for bit" bash -c "
    cmp runs/check/07_${tag}_0/checkpoint/model.safetensors runs/check/07_${tag}_1/checkpoint/model.safetensors &&
    diff <(grep -o '^[0-9]*/[0-9]*: Loss = [0-9.]*' '$(log_of "05_full_step -np $ranks MP=bf16 $name OFFLOAD=0")') \
         <(grep -o '^[0-9]*/[0-9]*: Loss = [0-9.]*' '$(log_of "05_full_step -np $ranks MP=bf16 $name OFFLOAD=1")')"
  check "05_full_step -np $ranks MP=bf16 $name OFFLOAD=1: memory model exact per pool" python3 \
    tests/check_memory_model.py "$(log_of "05_full_step -np $ranks MP=bf16 $name OFFLOAD=1")"
  check "05_full_step -np $ranks MP=bf16 $name OFFLOAD=1: h2d of the float32 shard per all-gather, d2h per reduce" \
    python3 tests/check_mixed_strategies.py copies "runs/check/07_${tag}_1"
}
mixedoffload "FULL_SHARD ACC=2" 2 offload ACC=2
mixedoffload "HYBRID_SHARD 2 x 2 streams" 4 offload_hybrid STRATEGY=HYBRID_SHARD SHARD_GROUP=2 COMM_STREAMS=1 \
  BACKWARD_PREFETCH=BACKWARD_PRE
# bfloat16 compute as torch's: torch's op rules, then the model against HF's in bfloat16 (logits, loss, every gradient)
# within the flip bound (tests/check_torch_bf16.py derives it); skipped without torch.
check "MP=bf16 computes as torch's bfloat16 ops and model (per-op rules; logits and gradients within the flip bound)" \
  python3 tests/check_torch_bf16.py
check_fails "07_mixed_precision MP=fp32 is refused: nothing to compare" "MP='fp32': lab 07 compares" \
  env OUT=runs/check/07_bad MP=fp32 $MPIRUN -np 2 lab/07_mixed_precision
