# The event sink and the Chrome export, on synthetic events (real lab runs are validated in the lab suites).
check "test_trace: sink and chrome export" tests/bin/test_trace
check_fails "fsdptrace: a directory without events is an error naming the file" "rank0.jsonl" \
  trace/fsdptrace chrome runs/check/no_such_run
check "fsdptrace chrome: re-exports a lab run that then validates" bash -c '
  rm -rf runs/check/trace_tool && OUT=runs/check/trace_tool $MPIRUN -np 2 lab/01_shard >/dev/null &&
  rm runs/check/trace_tool/trace.json && trace/fsdptrace chrome runs/check/trace_tool &&
  python3 tests/validate_trace.py --expect-ranks 2 runs/check/trace_tool'
check "fsdptrace summary: a synthetic run's figures equal the hand-computed ones" python3 tests/test_summary.py
check "fsdptrace all: lab 05 writes its views" bash -c '
  rm -rf runs/check/views && OUT=runs/check/views STEPS=1 $MPIRUN -np 2 lab/05_full_step >/dev/null &&
  ls runs/check/views/trace.json runs/check/views/memory.html runs/check/views/memory_snapshot.pickle runs/check/views/summary.txt'
check "memory_snapshot.pickle: loads, fields, addresses consistent with sizes" python3 tests/check_snapshot.py runs/check/views
check "memory.html in headless Chromium: a band per allocation, no console errors" python3 tests/check_memory_page.py runs/check/views
for ranks in 3 4; do
  run_lab "05_full_step -np $ranks STEPS=1 ACC=1: a trace for the viewers" $ranks runs/check/viewers_np$ranks \
    05_full_step STEPS=1 ACC=1
done
check "trace.json in Perfetto UI and Catapult (2, 3, 4 ranks): every flow arrow imported, no 'main thread'" \
  python3 tests/check_trace_viewers.py runs/check/views runs/check/viewers_np3 runs/check/viewers_np4
