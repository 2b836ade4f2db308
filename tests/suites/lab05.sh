# lab 05 — the full FSDP step. Every variant must train exactly like one rank without sharding: the same global
# batch (MBS x ranks = 8 sequences) gives losses equal to 1e-5 relative and parameters equal to 1e-5 absolute
# (AdamW turns rounding differences in near-zero gradients into steps of up to lr; lr x steps = 5e-3 here).
lab05() { # lab05 NAME RANKS DIR ENV...
  local name=$1 ranks=$2 dir=$3
  shift 3
  run_lab "$name" "$ranks" "$dir" 05_full_step STEPS=5 ACC=2 MBS=$((8 / ranks)) SAVE="$dir/checkpoint" "$@"
}
lab05 "05_full_step -np 1 NO_SHARD: the reference" 1 runs/check/05_reference STRATEGY=NO_SHARD
check "05_full_step prints the seed-style log" grep -qE '^1/5: Loss = [0-9]+\.[0-9]{6}, Peak = [0-9.]+ MB, Time = [0-9.]+s$' \
  "$(log_of "05_full_step -np 1 NO_SHARD: the reference")"
for variant in "FULL_SHARD" "SHARD_GRAD_OP" "NO_SHARD" "FULL_SHARD NO_SYNC=1" "FULL_SHARD CKPT=1" "FULL_SHARD WRAP=size:100000"; do
  set -- $variant
  strategy=$1
  shift
  for ranks in 2 4; do
    tag="$(echo "$variant" | tr ' =' '__')_np$ranks"
    lab05 "05_full_step -np $ranks $variant" $ranks "runs/check/05_$tag" STRATEGY=$strategy "$@"
    check "05_full_step -np $ranks $variant: losses equal 1 rank's" python3 tests/compare_losses.py \
      runs/check/05_reference "runs/check/05_$tag"
    check "05_full_step -np $ranks $variant: parameters equal 1 rank's" env OUT=runs/check/compare \
      tests/bin/qwen2_tool compare "runs/check/05_$tag/checkpoint" runs/check/05_reference/checkpoint 1e-5
  done
done
run_lab "05_full_step -np 2 ACC=1 one step: for the state order" 2 runs/check/05_states 05_full_step STEPS=1 ACC=1
check "05_full_step: state transitions in PyTorch FSDP1's order" python3 tests/check_state_order.py runs/check/05_states 4
for variant in "" "CKPT=1" "STRATEGY=SHARD_GRAD_OP NO_SYNC=1" "WRAP=size:100000" \
  "CONFIG=hidden_size=512,num_hidden_layers=8,num_attention_heads=8,num_key_value_heads=2,intermediate_size=1408 MBS=2 SEQ=64"; do
  name="05_full_step memory model within 10% (${variant:-tiny})"
  check "$name" bash -c "env OUT=runs/check/05_memory STEPS=2 $variant $MPIRUN -np 2 lab/05_full_step > runs/check/05_memory.log &&
    python3 tests/check_memory_model.py runs/check/05_memory.log"
done
run_lab "05_full_step -np 2 STEPS=50: the loss falls" 2 runs/check/05_fifty 05_full_step STEPS=50
check "05_full_step: loss after 50 steps well below the first" python3 -c "
import json
losses = [e['loss'] for e in map(json.loads, open('runs/check/05_fifty/rank0.jsonl')) if e['kind'] == 'step' and e['micro'] == -1]
print(f'step 1: {losses[0]:.4f}, step 50: {losses[-1]:.4f}')
assert len(losses) == 50 and losses[-1] < losses[0] - 2.0, 'the loss did not fall by 2 nats over 50 steps'"
check_fails "05_full_step STRATEGY=HYBRID is refused, naming the value" "STRATEGY='HYBRID' is not allowed" \
  env OUT=runs/check/05_bad STRATEGY=HYBRID $MPIRUN -np 2 lab/05_full_step
check_fails "05_full_step MBS=0 is refused, naming the value" "MBS='0' is not an integer in 1..4096" \
  env OUT=runs/check/05_bad MBS=0 $MPIRUN -np 2 lab/05_full_step
# The README's main command, `make run`: lab 05 launched through the Makefile's MPIRUN (--allow-run-as-root for root),
# its settings from make's command line or from the environment alike, OUT passed on as any other setting.
check "make run NP=1 STEPS=1 ACC=1: make's command line reaches lab 05" bash -c \
  "OUT=runs/check/05_make_run make -s --no-print-directory run NP=1 STEPS=1 ACC=1 | tee /dev/stderr |
   grep -c -e '^Ranks = 1, ' -e '^1/1: Loss = ' -e '^events: *runs/check/05_make_run/' | grep -qx 3"
check "STEPS=1 ACC=1 make run: 2 ranks by default, settings from the environment" bash -c \
  "OUT=runs/check/05_make_run STEPS=1 ACC=1 make -s --no-print-directory run | tee /dev/stderr |
   grep -c -e '^Ranks = 2, ' -e '^1/1: Loss = ' | grep -qx 2"
