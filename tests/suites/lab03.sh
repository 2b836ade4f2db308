# lab 03 — reduce-scatter. The lab asserts each shard equals the mean over ranks and the all-reduced slice.
for ranks in 2 3 4; do
  run_lab "03_reduce_scatter -np $ranks: shard == mean" $ranks runs/check/03_np$ranks 03_reduce_scatter
done
check "03_reduce_scatter: reduce_scatter moves half the bytes of all_reduce" python3 tests/check_lab03_traffic.py \
  runs/check/03_np4
check_fails "03_reduce_scatter OUT unusable is refused, naming it" "cannot create output directory OUT='/proc/x'" \
  env OUT=/proc/x $MPIRUN -np 2 lab/03_reduce_scatter
