# lab 08 — HYBRID_SHARD. Four things must hold:
#   training   HYBRID_SHARD and _HYBRID_SHARD_ZERO2 on 4 ranks train as 1 rank does on the same global batch: the
#              losses, step 1's gradients and the parameters within check-05's bounds (tests/lab05_equal.sh, derived
#              in tests/tolerances.py), for the 2 x 2 mesh and the degenerate ones (4 x 1: every rank a replica; 1 x 4:
#              FULL_SHARD), and with NO_SYNC: a skipped replicate all-reduce, a sum for its mean or shards cut over the
#              world instead of the group are off by O(1) in the gradients;
#   traffic    the bytes across groups are exactly the replicate all-reduces' 2 (R-1)/R of each unit's shard,
#              derived from the config alone (tests/check_lab08.py), and every other collective stays in its shard
#              group;
#   memory     the memory model equals the measured peak of every category (lab 05's table and lab 08's modes);
#   torch      PyTorch's HYBRID_SHARD (and _HYBRID_SHARD_ZERO2) on the same 2 x 2 mesh, from the same init and
#              batches, gives the same losses (tests/check_train_parity.sh's derived bound).
source tests/lab05_equal.sh
REFERENCE05=runs/check/08_reference
lab05 "08: 05_full_step -np 1 NO_SHARD: the reference" 1 $REFERENCE05 STRATEGY=NO_SHARD
for variant in "HYBRID_SHARD SHARD_GROUP=2" "_HYBRID_SHARD_ZERO2 SHARD_GROUP=2" "HYBRID_SHARD SHARD_GROUP=1" \
  "HYBRID_SHARD SHARD_GROUP=4" "HYBRID_SHARD SHARD_GROUP=2 NO_SYNC=1"; do
  set -- $variant
  strategy=$1
  shift
  tag="$(echo "$variant" | tr ' =' '__')"
  dir=runs/check/08_$tag
  lab05 "08: 05_full_step -np 4 $variant" 4 $dir STRATEGY=$strategy COMM_STREAMS=1 BACKWARD_PREFETCH=BACKWARD_PRE "$@"
  equal05 "08: 05_full_step -np 4 $variant" $dir
  shard=${1#SHARD_GROUP=}
  reductions=$([ "${2:-}" = NO_SYNC=1 ] && echo 1 || echo $ACC05)
  check "08: 05_full_step -np 4 $variant: bytes across groups exactly the replicate all-reduces'" \
    python3 tests/check_lab08.py traffic $dir $REFERENCE05/grads/config.json $shard $reductions $STEPS05
done
# CLIP: the gradient norm's all-reduce runs in the shard group (each replicate group holds the same shards; a world sum
# would count each R times): the traffic check finds any collective outside the rank's two groups.
REFERENCE05=runs/check/08_reference_clip
lab05 "08: 05_full_step -np 1 NO_SHARD CLIP=0.5: the reference" 1 $REFERENCE05 STRATEGY=NO_SHARD CLIP=0.5
clip08="08: 05_full_step -np 4 HYBRID_SHARD SHARD_GROUP=2 CLIP=0.5"
lab05 "$clip08" 4 runs/check/08_clip STRATEGY=HYBRID_SHARD SHARD_GROUP=2 CLIP=0.5
equal05 "$clip08" runs/check/08_clip
check "$clip08: clip_grad_norm in the shard group, bytes across exact" \
  python3 tests/check_lab08.py traffic runs/check/08_clip $REFERENCE05/grads/config.json 2 $ACC05 $STEPS05
# Padding: a decoder layer of the tiny model is 184,832 floats, 2 short of a multiple of 3: shard groups of 3 (6 ranks
# as 2 x 3) pad each unit; against a reference of 6 sequences per micro-batch.
GLOBAL05=6 REFERENCE05=runs/check/08_reference_6
lab05 "08: 05_full_step -np 1 NO_SHARD MBS=6: the reference for 6 ranks" 1 $REFERENCE05 STRATEGY=NO_SHARD
lab05 "08: 05_full_step -np 6 HYBRID_SHARD SHARD_GROUP=3 (padded units)" 6 runs/check/08_hybrid_np6 \
  STRATEGY=HYBRID_SHARD SHARD_GROUP=3
equal05 "08: 05_full_step -np 6 HYBRID_SHARD SHARD_GROUP=3 (padded units)" runs/check/08_hybrid_np6
check "08: 05_full_step -np 6 HYBRID_SHARD SHARD_GROUP=3: bytes across groups exactly the replicate all-reduces'" \
  python3 tests/check_lab08.py traffic runs/check/08_hybrid_np6 $REFERENCE05/grads/config.json 3 $ACC05 $STEPS05
GLOBAL05=8 REFERENCE05=runs/check/08_reference
for strategy in HYBRID_SHARD _HYBRID_SHARD_ZERO2; do
  check "08: memory model exact to the byte, reserved within its bound ($strategy 2 x 2)" bash -c "
    env OUT=runs/check/08_memory STEPS=2 STRATEGY=$strategy SHARD_GROUP=2 MBS=2 $MPIRUN -np 4 lab/05_full_step \
      > runs/check/08_memory.log && python3 tests/check_memory_model.py runs/check/08_memory.log"
done
# The lab itself: every mode, its memory model exact, the groups in the trace, less across nodes than FULL_SHARD.
run_lab "08_hybrid_shard -np 4: FULL_SHARD, HYBRID_SHARD, _HYBRID_SHARD_ZERO2, NO_SHARD" 4 runs/check/08_lab \
  08_hybrid_shard
check "08_hybrid_shard -np 4: memory model exact, shards of 1/2, less across nodes, groups in the trace" \
  python3 tests/check_lab08.py lab runs/check/08_lab \
  "$(log_of "08_hybrid_shard -np 4: FULL_SHARD, HYBRID_SHARD, _HYBRID_SHARD_ZERO2, NO_SHARD")"
# Checkpoints: the first shard group writes the shards (the replicas hold the same), every rank loads its chunk; a
# resumed HYBRID_SHARD run ends bit for bit where the uninterrupted one does.
H=runs/check/08_resume_reference
run_lab "08: HYBRID_SHARD 2 x 2, a checkpoint every 2 steps" 4 $H 05_full_step STRATEGY=HYBRID_SHARD SHARD_GROUP=2 \
  STEPS=4 ACC=2 MBS=2 CHECKPOINT_EVERY=2
check "08: HYBRID_SHARD checkpoints hold files of the first shard group only" bash -c \
  "[ \"\$(cd $H/checkpoints/step_00000002 && ls *.distcp | tr '\n' ' ')\" = '__0_0.distcp __1_0.distcp ' ]"
run_lab "08: HYBRID_SHARD resumed from step 2" 4 runs/check/08_resumed 05_full_step STRATEGY=HYBRID_SHARD \
  SHARD_GROUP=2 STEPS=4 ACC=2 MBS=2 RESUME=$H/checkpoints/step_00000002
check "08: HYBRID_SHARD resumed: steps 3 and 4 have the uninterrupted run's losses, bit for bit" \
  python3 tests/check_resume.py exact $H runs/check/08_resumed
# Another mesh: the chunks are re-cut by intersection, as for another world size (the resume note names the change).
run_lab "08: HYBRID_SHARD 2 x 2's step-2 checkpoint resumed as 1 x 4" 4 runs/check/08_resumed_1x4 05_full_step \
  STRATEGY=HYBRID_SHARD SHARD_GROUP=4 STEPS=4 ACC=2 MBS=2 RESUME=$H/checkpoints/step_00000002
check "08: resumed as 1 x 4: step 3's loss within rounding of the 2 x 2 run's, the change of mesh noted" bash -c "
  python3 tests/check_resume.py reshard $H runs/check/08_resumed_1x4 $REFERENCE05/grads/config.json \
    \$((4 * 2 * 2 * 128)) 128 && grep -q 'note: SHARD_GROUP was 2 in the checkpoint, is 4 now' \
    '$(log_of "08: HYBRID_SHARD 2 x 2's step-2 checkpoint resumed as 1 x 4")'"
check_fails "08: SHARD_GROUP=3 on 4 ranks is refused, naming both" \
  "SHARD_GROUP='3' does not divide the world size 4" \
  env OUT=runs/check/08_bad STRATEGY=HYBRID_SHARD SHARD_GROUP=3 $MPIRUN -np 4 lab/05_full_step
check_fails "08_hybrid_shard SHARD_GROUP=3 on 4 ranks is refused, naming both" \
  "SHARD_GROUP='3' does not divide the world size 4" \
  env OUT=runs/check/08_bad SHARD_GROUP=3 $MPIRUN -np 4 lab/08_hybrid_shard
check "train.sh FSDP=both STRATEGY=HYBRID_SHARD 2 x 2: fsdplab's losses equal PyTorch FSDP's (derived bound)" \
  tests/check_train_parity.sh hybrid
check "train.sh FSDP=both STRATEGY=_HYBRID_SHARD_ZERO2 2 x 2: fsdplab's losses equal PyTorch FSDP's (derived bound)" \
  tests/check_train_parity.sh hybrid_zero2
check "08_hybrid_shard's trace.json in Perfetto UI and Catapult: each group's arrows, and only those" \
  python3 tests/check_trace_viewers.py runs/check/08_lab
