# Sharded checkpoints and resume (core/io/dcp.h, lab 05's CHECKPOINT_EVERY and RESUME). A run killed with SIGKILL after
# step 5 resumes from its step-4 checkpoint and ends bit for bit where the uninterrupted run ends: the same losses at
# full precision, the same final parameters, the same step-6 shards (parameters and AdamW moments). On 1 and 4 ranks
# the same checkpoint continues within rounding (the first resumed step's loss within tests/tolerances.py's loss
# bound, the parameters within the AdamW bound over the 2 resumed steps). Then every way a checkpoint can be wrong
# is refused, naming the file and the mismatch.
RESUME_ENV=(STEPS=6 ACC=2 SEQ=128 LR=1e-3 CHECKPOINT_EVERY=2)
R=runs/check/resume_reference
K=runs/check/resume_killed
rm -rf "$R" "$K"
run_lab "resume: the uninterrupted run (2 ranks, a checkpoint every 2 steps)" 2 $R 05_full_step "${RESUME_ENV[@]}" \
  MBS=4 SAVE=$R/checkpoint
check "resume: CHECKPOINT_KEEP=2 kept steps 4 and 6 only, each committed" bash -c "
  [ \"\$(ls $R/checkpoints)\" = \"\$(printf 'step_00000004\nstep_00000006')\" ] &&
  test -f $R/checkpoints/step_00000004/.metadata && test -f $R/checkpoints/step_00000006/.metadata"
check_fails "resume: rank 1 killed with SIGKILL after step 5" "KILL_AT_STEP=5: killing myself with SIGKILL" \
  env OUT=$K "${RESUME_ENV[@]}" MBS=4 KILL_AT_STEP=5 KILL_RANK=1 $MPIRUN -np 2 lab/05_full_step
check "resume: the killed run left step 4 committed and nothing of step 6" bash -c "
  test -f $K/checkpoints/step_00000004/.metadata && ! test -e $K/checkpoints/step_00000006"
# What a kill during a checkpoint's write leaves: a step directory without .metadata. RESUME=auto must pass it by.
mkdir -p $K/checkpoints/step_00000005 && head -c 1000 /dev/urandom >$K/checkpoints/step_00000005/__0_0.distcp.tmp
check "resume: RESUME=auto continues the killed run from step 4 (passing by an uncommitted step 5)" \
  env OUT=$K "${RESUME_ENV[@]}" MBS=4 RESUME=auto SAVE=$K/checkpoint $MPIRUN -np 2 lab/05_full_step
check "resume: it said so" grep -q "resumed from $K/checkpoints/step_00000004: step 4 done" \
  "$(log_of "resume: RESUME=auto continues the killed run from step 4 (passing by an uncommitted step 5)")"
check "resume: the resumed run's trace is valid" python3 tests/validate_trace.py --expect-ranks 2 $K
check "resume: steps 5 and 6 have the uninterrupted run's losses, bit for bit" python3 tests/check_resume.py exact $R $K
check "resume: final parameters bit-identical (SAVE)" \
  cmp $R/checkpoint/model.safetensors $K/checkpoint/model.safetensors
check "resume: step 6's shards bit-identical (parameters, exp_avg, exp_avg_sq)" bash -c "
  cmp $R/checkpoints/step_00000006/__0_0.distcp $K/checkpoints/step_00000006/__0_0.distcp &&
  cmp $R/checkpoints/step_00000006/__1_0.distcp $K/checkpoints/step_00000006/__1_0.distcp"
check "resume: the uncommitted step 5 was cleared away by the next commit" test ! -e $K/checkpoints/step_00000005

# Another world size: chunks re-cut by intersection; MBS keeps the global batch at 8 sequences.
for ranks in 1 4; do
  D=runs/check/resume_np$ranks
  run_lab "resume: step 4 of a 2-rank run continued on $ranks ranks" $ranks $D 05_full_step "${RESUME_ENV[@]}" \
    MBS=$((8 / ranks)) RESUME=$R/checkpoints/step_00000004 SAVE=$D/checkpoint CHECKPOINT_EVERY=0
  check "resume on $ranks ranks: step 5's loss within rounding of the 2-rank run's" python3 tests/check_resume.py \
    reshard $R $D $R/checkpoint/config.json $((8 * 128 * 2)) 128
  check "resume on $ranks ranks: parameters within AdamW's bound over 2 steps" env OUT=runs/check/compare_$suite \
    tests/bin/qwen2_tool compare $D/checkpoint $R/checkpoint "$(python3 tests/tolerances.py adamw 1e-3 2)" absolute
done

# Refusals: each names the file or setting and what is wrong.
B=runs/check/resume_bad
rm -rf $B && mkdir -p $B
good=$R/checkpoints/step_00000004
for name in uncommitted corrupt truncated version99 badjson; do cp -r $good $B/$name; done
rm $B/uncommitted/.metadata
printf '\xff' | dd of=$B/corrupt/__1_0.distcp bs=1 seek=100000 conv=notrunc status=none
truncate -s -4 $B/truncated/__0_0.distcp
sed -i 's/"version":[[:space:]]*1,/"version": 99,/' $B/version99/.metadata
printf '{"format": ' >$B/badjson/.metadata
resume_fails() { # resume_fails NAME PATTERN ENV...
  local name=$1 pattern=$2
  shift 2
  check_fails "resume refused: $name" "$pattern" env OUT=$B/out "${RESUME_ENV[@]}" MBS=4 "$@" \
    $MPIRUN -np 2 lab/05_full_step
}
resume_fails "a directory that does not exist" "RESUME='$B/nowhere'.*nowhere is not a directory" RESUME=$B/nowhere
resume_fails "a checkpoint never committed" "uncommitted: no \.metadata, so the checkpoint was never committed" \
  RESUME=$B/uncommitted
resume_fails "a corrupt shard (one byte changed)" \
  "corrupt/__1_0\.distcp: checksum [0-9a-f]+, the metadata says [0-9a-f]+ \(corrupt\)" \
  RESUME=$B/corrupt
resume_fails "a truncated shard" "truncated/__0_0\.distcp: [0-9]+ bytes, the metadata says [0-9]+" RESUME=$B/truncated
resume_fails "a format version from the future" "version99/\.metadata: version 99; this build reads version 1" \
  RESUME=$B/version99
resume_fails "metadata that is not JSON" "badjson/\.metadata: not valid JSON" RESUME=$B/badjson
resume_fails "another model (CONFIG)" "config\.json: the checkpoint's model has num_hidden_layers 4, not 2" \
  RESUME=$good CONFIG=num_hidden_layers=2
resume_fails "another strategy" "saved with STRATEGY=FULL_SHARD, this run is SHARD_GRAD_OP" RESUME=$good \
  STRATEGY=SHARD_GRAD_OP
resume_fails "a data position this batch size cannot continue" \
  "read 64 data windows, not a whole number of this run's global micro-batches \(2 ranks x MBS 3 = 6" RESUME=$good MBS=3
touch $B/a_file
resume_fails "a CHECKPOINT_DIR that cannot be made, before step 1" "CHECKPOINT_DIR='$B/a_file/ckpt': cannot create" \
  CHECKPOINT_DIR=$B/a_file/ckpt
check "resume refused: ... and no step ran first" \
  bash -c "! grep -q '^1/6' '$(log_of "resume refused: a CHECKPOINT_DIR that cannot be made, before step 1")'"
check "resume: RESUME=auto with no checkpoint yet starts at step 1" bash -c "
  rm -rf $B/fresh && OUT=$B/fresh STEPS=1 RESUME=auto $MPIRUN -np 2 lab/05_full_step |
    grep -q 'RESUME=auto: no committed checkpoint under $B/fresh/checkpoints; starting at step 1'"
# What a user opens: each rank's shard file in Python's safetensors (the real client), holding for every unit the
# element range .metadata gives it, parameters and both moments.
check "resume: the shard files open in Python's safetensors with .metadata's ranges" python3 -c "
import json, sys
from safetensors.numpy import load_file
d = '$R/checkpoints/step_00000006'
meta = json.load(open(d + '/.metadata'))
for f in meta['files']:
    tensors = load_file(d + '/' + f['file'])
    for unit, (begin, end) in zip(meta['units'], f['ranges']):
        for part in ('param', 'exp_avg', 'exp_avg_sq'):
            t = tensors.get(unit['name'] + '.' + part)
            if end > begin and (t is None or t.shape != (end - begin,) or t.dtype.name != 'float32'):
                sys.exit(f\"{f['file']}: {unit['name']}.{part} is {None if t is None else t.shape}, \"
                         f\"expected ({end - begin},)\")
print('ok:', len(meta['files']), 'files,', len(meta['units']), 'units')
"
# The other strategies resume bit for bit too: NO_SHARD (every rank holds everything; rank 0 alone writes it) and
# SHARD_GRAD_OP.
for strategy in NO_SHARD SHARD_GRAD_OP; do
  A=runs/check/resume_${strategy}_a Z=runs/check/resume_${strategy}_b
  rm -rf $A $Z
  check "resume $strategy: 4 steps, and steps 3-4 again from step 2's checkpoint, bit-identical" bash -c "
    OUT=$A STRATEGY=$strategy STEPS=4 CHECKPOINT_EVERY=2 SAVE=$A/hf $MPIRUN -np 2 lab/05_full_step >/dev/null &&
    OUT=$Z STRATEGY=$strategy STEPS=4 RESUME=$A/checkpoints/step_00000002 SAVE=$Z/hf $MPIRUN -np 2 lab/05_full_step &&
    cmp $A/hf/model.safetensors $Z/hf/model.safetensors && python3 tests/check_resume.py exact $A $Z"
done
# Resuming into the same CHECKPOINT_DIR from an earlier step replaces the later history: the run says so, and its first
# commit removes the later checkpoints, so that RESUME=auto cannot take a step of the abandoned run.
A=runs/check/resume_NO_SHARD_a
check "resume from an earlier step: told of the later checkpoints, which the first commit removes" bash -c "
  OUT=runs/check/resume_rewind STRATEGY=NO_SHARD STEPS=3 CHECKPOINT_EVERY=1 CHECKPOINT_DIR=$A/checkpoints \
    RESUME=$A/checkpoints/step_00000002 $MPIRUN -np 2 lab/05_full_step | tee /dev/stderr |
    grep -q 'note: $A/checkpoints holds checkpoints after step 2 (up to $A/checkpoints/step_00000004)' &&
  [ \"\$(ls $A/checkpoints)\" = \"\$(printf 'step_00000002\nstep_00000003')\" ]"
