# lab 09 — CPU offload and deferred initialisation. The lab runs tiny without and with offload, then builds tiny and
# qwen2-0.5b both ways (initialisation only: no step of qwen2-0.5b); check_lab09.py asserts, from its output and its
# events, the memory model per pool (device and host), bit-identical losses and parameters, one h2d copy per
# all-gather and one d2h copy per reduce-scatter, and the initialisation peaks and shards.
run_lab "09_offload_and_init -np 2: offload, and init of tiny and qwen2-0.5b" 2 runs/check/09_np2 09_offload_and_init
check "09_offload_and_init -np 2: memory model per pool, same arithmetic, the copies, init peaks" \
  python3 tests/check_lab09.py runs/check/09_np2 \
  "$(log_of "09_offload_and_init -np 2: offload, and init of tiny and qwen2-0.5b")"
# Three ranks: the ring's running sums stay on the device (comm_buffer), the accumulation buffer moves to the host.
run_lab "09_offload_and_init -np 3: offload, init of tiny" 3 runs/check/09_np3 09_offload_and_init INIT_MODELS=tiny
check "09_offload_and_init -np 3: memory model per pool, same arithmetic, the copies, init peaks" \
  python3 tests/check_lab09.py runs/check/09_np3 "$(log_of "09_offload_and_init -np 3: offload, init of tiny")" \
  --init-models tiny
check "09_offload_and_init -np 3: memory.html draws each rank's device pool as before (host pool views after them)" \
  python3 tests/check_memory_page.py runs/check/09_np3
check "09_offload_and_init -np 3: trace.json opens in Perfetto UI and Catapult (copies, host counters, every arrow)" \
  python3 tests/check_trace_viewers.py runs/check/09_np3
# OFFLOAD=1 in lab 05 (scripts/train.sh passes it on): the same losses and the same saved parameters, bit for bit,
# under other strategies, no_sync, checkpointing and the overlap options.
same09() { # same09 NAME RANKS ENV...: lab 05 with OFFLOAD=0 and OFFLOAD=1, losses and SAVE compared byte for byte
  local name=$1 ranks=$2 tag
  shift 2
  tag=$(echo "$name" | tr -c 'A-Za-z0-9_' '_')
  for offload in 0 1; do
    run_lab "05_full_step $name OFFLOAD=$offload" "$ranks" "runs/check/09_05_${tag}_$offload" 05_full_step STEPS=3 \
      SAVE="runs/check/09_05_${tag}_$offload/checkpoint" OFFLOAD=$offload "$@"
  done
  check "05_full_step $name: OFFLOAD=1 gives the same losses and parameters, bit for bit" python3 -c "
import json, sys
def losses(d): return [(e['step'], e['micro'], e['loss']) for r in range($ranks)
                       for e in map(json.loads, open(f'{d}/rank{r}.jsonl')) if e['kind'] == 'step']
a, b = losses('runs/check/09_05_${tag}_0'), losses('runs/check/09_05_${tag}_1')
same = a == b and len(a) > 0
same = same and open('runs/check/09_05_${tag}_0/checkpoint/model.safetensors', 'rb').read() == \
    open('runs/check/09_05_${tag}_1/checkpoint/model.safetensors', 'rb').read()
print('same' if same else f'different: {a} vs {b}')
sys.exit(0 if same else 1)"
}
same09 "FULL_SHARD ACC=2" 2 STRATEGY=FULL_SHARD ACC=2
same09 "SHARD_GRAD_OP NO_SYNC CKPT streams" 2 STRATEGY=SHARD_GRAD_OP NO_SYNC=1 CKPT=1 COMM_STREAMS=1 \
  BACKWARD_PREFETCH=BACKWARD_PRE FORWARD_PREFETCH=1
# Offload under lab 08's HYBRID_SHARD (2 x 2): the h2d copy lands in the shard group's chunk, the all-gather in place
# runs in the shard group, the d2h copy follows the replicate group's all-reduce.
same09 "HYBRID_SHARD 2x2 streams" 4 STRATEGY=HYBRID_SHARD SHARD_GROUP=2 COMM_STREAMS=1 BACKWARD_PREFETCH=BACKWARD_PRE
# The device pool's budget: tiny's step needs 44 MiB reserved on the device; with offload 38 MiB.
budget09="device pool out of memory allocating [0-9]+ bytes of [a-z_]+ for '[^']+': its budget is 41943040 bytes"
budget09+=" \(DEVICE_MEMORY_MB=40\)"
check_fails "05_full_step DEVICE_MEMORY_MB=40 without offload runs out of device memory, naming the budget" \
  "$budget09" \
  env OUT=runs/check/09_budget_0 DEVICE_MEMORY_MB=40 $MPIRUN -np 2 lab/05_full_step
run_lab "05_full_step DEVICE_MEMORY_MB=40 OFFLOAD=1 fits" 2 runs/check/09_budget_1 05_full_step DEVICE_MEMORY_MB=40 \
  OFFLOAD=1
