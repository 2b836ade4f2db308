# lab 02 — unshard / reshard. The lab asserts gathered == original and that memory returns to the shard level.
for ranks in 2 4; do
  run_lab "02_gather -np $ranks: views equal original, memory returns" $ranks runs/check/02_np$ranks 02_gather
done
check "02_gather: unsharded buffer is the whole unit, live before == after, the cache reuses the block" \
  python3 tests/check_lab02_memory.py runs/check/02_np2
run_lab "02_gather -np 2 ALLOC=malloc: no cache" 2 runs/check/02_malloc 02_gather ALLOC=malloc
check "02_gather ALLOC=malloc: the second unshard takes a new segment" python3 tests/check_lab02_memory.py \
  runs/check/02_malloc
check_fails "02_gather -np 9 is refused, naming the value" "needs 2 to 8 ranks, got 9" \
  env OUT=runs/check/02_np9 $MPIRUN -np 9 lab/02_gather
