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
  ls runs/check/views/trace.json runs/check/views/memory.html runs/check/views/player.html \
    runs/check/views/memory_snapshot.pickle runs/check/views/summary.txt'
check "memory_snapshot.pickle: loads, fields, addresses consistent with sizes" \
  python3 tests/check_snapshot.py runs/check/views
check "memory.html in headless Chromium: a band per allocation, no console errors" \
  python3 tests/check_memory_page.py runs/check/views
check "player.html in headless Chromium: unit states, memory and the peak at chosen moments equal the JSONL" \
  python3 tests/check_player.py runs/check/views
for ranks in 3 4; do
  run_lab "05_full_step -np $ranks STEPS=1 ACC=1: a trace for the viewers" $ranks runs/check/viewers_np$ranks \
    05_full_step STEPS=1 ACC=1
done
# Version 3: a hand-timed run on three streams (tests/test_summary.py's) and a real one with prefetching, validated,
# summarised as JSON and opened in both viewers with the others.
check "streams: a synthetic two-stream run exports and validates" bash -c '
  rm -rf runs/check/streams && python3 tests/test_summary.py --write-streams-run runs/check/streams &&
  python3 tests/validate_trace.py --expect-ranks 2 runs/check/streams'
run_lab "05_full_step -np 2 COMM_STREAMS=1 BACKWARD_PREFETCH=BACKWARD_PRE FORWARD_PREFETCH=1 LIMIT_ALL_GATHERS=1" 2 \
  runs/check/prefetch 05_full_step STEPS=1 ACC=1 COMM_STREAMS=1 BACKWARD_PREFETCH=BACKWARD_PRE FORWARD_PREFETCH=1 \
  LIMIT_ALL_GATHERS=1
check "fsdptrace overlap: JSON per rank of the prefetching run, the figures consistent" python3 -c '
import json, subprocess
found = json.loads(subprocess.run(["trace/fsdptrace", "overlap", "runs/check/prefetch"], check=True,
                                  capture_output=True, text=True).stdout)
assert [rank["rank"] for rank in found["ranks"]] == [0, 1], found
for rank in found["ranks"]:
    assert rank["fsdp"]["backward_prefetch"] == "BACKWARD_PRE", rank
    assert rank["stream_comm_ms"]["all_gather"] > 0 and rank["wait_ms"] > 0, rank
    assert rank["wait_ms"] <= rank["exposed_ms"] <= rank["span_ms"], rank
    assert rank["overlap_ms"] <= rank["comm_ms"] + 1e-6 and rank["max_all_gathers_in_flight"] >= 1, rank
print(json.dumps(found["ranks"][0]))'
check "trace.json in Perfetto UI and Catapult (2, 3, 4 ranks, streams): every flow arrow, stream thread and wait \
slice imported, no 'main thread'" \
  python3 tests/check_trace_viewers.py runs/check/views runs/check/viewers_np3 runs/check/viewers_np4 \
  runs/check/streams runs/check/prefetch
check "player.html of the prefetching run: several units unsharded at once, the same checks" \
  python3 tests/check_player.py --expect-overlap runs/check/prefetch
# One run per directory: a run starts by removing an earlier run's views and its rank files beyond this
# world; rank files of two runs are refused, naming both ids; a run without its end event is reported as cut short.
check "OUT reused by a smaller run: the bigger run's rank2.jsonl and old views are gone" bash -c '
  rm -rf runs/check/reuse && OUT=runs/check/reuse $MPIRUN -np 3 lab/01_shard >/dev/null &&
  OUT=runs/check/reuse $MPIRUN -np 2 lab/01_shard | grep -q "removed 6 files of an earlier run" &&
  test ! -e runs/check/reuse/rank2.jsonl &&
  python3 tests/validate_trace.py --expect-ranks 2 runs/check/reuse >/dev/null'
check_fails "fsdptrace: rank files of two runs are refused, naming both run ids" \
  "run id '[^']+', but rank0.jsonl has '[^']+': the rank files come from different runs" bash -c '
  rm -rf runs/check/mixed_a runs/check/mixed_b && OUT=runs/check/mixed_a $MPIRUN -np 2 lab/01_shard >/dev/null &&
  OUT=runs/check/mixed_b $MPIRUN -np 2 lab/01_shard >/dev/null &&
  cp runs/check/mixed_b/rank1.jsonl runs/check/mixed_a/rank1.jsonl && trace/fsdptrace summary runs/check/mixed_a'
check "fsdptrace summary: a run whose rank file lacks the end event is reported as cut short" bash -c '
  rm -rf runs/check/cut && OUT=runs/check/cut $MPIRUN -np 2 lab/01_shard >/dev/null &&
  grep -q "\"kind\":\"end\"" runs/check/cut/rank1.jsonl && sed -i "/\"kind\":\"end\"/d" runs/check/cut/rank1.jsonl &&
  trace/fsdptrace summary runs/check/cut | grep -q "CUT SHORT: rank 1" &&
  ! trace/fsdptrace summary runs/check/cut | grep -q "CUT SHORT: rank 0"'
