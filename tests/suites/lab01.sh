# lab 01 — sharding. The lab itself asserts that the concatenated shards equal the flattened original.
for ranks in 2 3; do
  run_lab "01_shard -np $ranks: shards reassemble" $ranks runs/check/01_np$ranks 01_shard
  check "01_shard -np $ranks: prints the per-rank table" grep -q "rank $((ranks - 1)) owns flat" \
    "$(log_of "01_shard -np $ranks: shards reassemble")"
done
check_fails "01_shard -np 1 is refused, naming the value" "needs 2 to 8 ranks, got 1" \
  env OUT=runs/check/01_np1 $MPIRUN -np 1 lab/01_shard
check_fails "01_shard SEED=abc is refused, naming the variable" "SEED='abc' is not an integer" \
  env OUT=runs/check/01_bad SEED=abc $MPIRUN -np 2 lab/01_shard
