# lab 03 — reduce-scatter. The lab asserts each shard equals the mean over ranks and the all-reduced slice.
for ranks in 2 3 4; do
  # the bandwidth table up to 64 MiB on 2 ranks; 4 MiB when 3-4 ranks share 2 cores (it is printed, not checked)
  run_lab "03_reduce_scatter -np $ranks: shard == mean" $ranks runs/check/03_np$ranks 03_reduce_scatter \
    BW_MB=$([ "$ranks" = 2 ] && echo 64 || echo 4)
done
check "03_reduce_scatter: reduce_scatter moves half the bytes of all_reduce" python3 tests/check_lab03_traffic.py \
  runs/check/03_np4
check_fails "03_reduce_scatter OUT unusable is refused, naming it" "cannot create output directory OUT='/proc/x'" \
  env OUT=/proc/x $MPIRUN -np 2 lab/03_reduce_scatter
