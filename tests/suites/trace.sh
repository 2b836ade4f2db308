# The event sink and the Chrome export, on synthetic events (real lab runs are validated in the lab suites).
check "test_trace: sink and chrome export" tests/bin/test_trace
check_fails "fsdptrace: a directory without events is an error naming the file" "rank0.jsonl" \
  trace/fsdptrace chrome runs/check/no_such_run
check "fsdptrace chrome: re-exports a lab run that then validates" bash -c '
  rm -rf runs/check/trace_tool && OUT=runs/check/trace_tool $MPIRUN -np 2 lab/01_shard >/dev/null &&
  rm runs/check/trace_tool/trace.json && trace/fsdptrace chrome runs/check/trace_tool &&
  python3 tests/validate_trace.py --expect-ranks 2 runs/check/trace_tool'
