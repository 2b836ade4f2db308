# lab 06 — prefetch and overlap. The lab runs every mode; check_lab06.py asserts, from its output and its events,
# bit-identical arithmetic across modes, the memory model per mode, overlap where prefetch puts it and none where it
# cannot be, and at most 2 all-gathers in flight.
for ranks in 2 3; do
  dir=runs/check/06_np$ranks
  run_lab "06_prefetch -np $ranks: every mode" $ranks $dir 06_prefetch
  check "06_prefetch -np $ranks: same arithmetic, exact memory model, overlap only with streams" \
    python3 tests/check_lab06.py $dir "$(log_of "06_prefetch -np $ranks: every mode")"
done
check_fails "06_prefetch MODES=sideways is refused, naming the modes" \
  "MODES='sideways': no mode 'sideways'; choose from blocking, none, BACKWARD_PRE" \
  env OUT=runs/check/06_bad MODES=sideways $MPIRUN -np 2 lab/06_prefetch
