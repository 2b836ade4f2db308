# lab 05's runs and its three equivalence checks against 1 rank, shared by the suites that train like it (lab05,
# lab08). Sourced by a suite: tests/run_checks.sh's check and run_lab must be defined.
STEPS05=5 ACC05=2 SEQ05=128 LR05=1e-3 GLOBAL05=8
REFERENCE05=runs/check/05_reference
lab05() { # lab05 NAME RANKS DIR ENV...   (GLOBAL05 sequences per micro-batch over all ranks)
  local name=$1 ranks=$2 dir=$3
  shift 3
  run_lab "$name" "$ranks" "$dir" 05_full_step STEPS=$STEPS05 ACC=$ACC05 SEQ=$SEQ05 LR=$LR05 \
    MBS=$((GLOBAL05 / ranks)) SAVE="$dir/checkpoint" GRADS="$dir/grads" "$@"
}
# equal05 NAME DIR [AGAINST]: the three equivalence checks of the run in DIR against the reference (REFERENCE05,
# GLOBAL05, ACC05: TOKENS05 is the reference's targets per step), AGAINST naming it in the checks' names
equal05() {
  local name=$1 dir=$2 against=${3:-1 rank\'s} config=$REFERENCE05/grads/config.json
  local TOKENS05=$((GLOBAL05 * SEQ05 * ACC05))
  check "$name: losses equal $against" python3 tests/compare_losses.py $REFERENCE05 "$dir" $TOKENS05 $SEQ05 $LR05
  check "$name: gradients equal $against" env OUT=runs/check/compare_$suite tests/bin/qwen2_tool compare "$dir/grads" \
    $REFERENCE05/grads "$(python3 tests/tolerances.py gradients $config $TOKENS05 $SEQ05)" relative
  check "$name: parameters within AdamW's bound" env OUT=runs/check/compare_$suite tests/bin/qwen2_tool compare \
    "$dir/checkpoint" $REFERENCE05/checkpoint "$(python3 tests/tolerances.py adamw $LR05 $STEPS05)" absolute
}
