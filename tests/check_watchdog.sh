#!/usr/bin/env bash
# The watchdog: one rank of a lab 05 run is stopped (SIGSTOP) mid-training; the other must abort on its own, within
# TIMEOUT plus a margin, naming the collective (op, unit, seq) and how long it waited, and its JSONL must say so.
#
#   tests/check_watchdog.sh RUNDIR [ENV=VALUE...]     (ENV: e.g. COMM_STREAMS=1 BACKWARD_PREFETCH=BACKWARD_PRE)
set -u
cd "$(dirname "$0")/.."
dir=$1
shift
rm -rf "$dir"
mkdir -p "$dir"
timeout_s=3
env OUT="$dir" TIMEOUT=$timeout_s STEPS=100000 "$@" ${MPIRUN:-mpirun} -np 2 lab/05_full_step > "$dir/output.log" 2>&1 &
launcher=$!
# wait until training runs (the first step line), then stop one rank
for _ in $(seq 1 300); do grep -q '^1/' "$dir/output.log" 2>/dev/null && break; sleep 0.1; done
# the lab's processes, from /proc (no procps needed): the last one started is one of the two ranks
victim=
for cmdline in /proc/[0-9]*/cmdline; do
  pid=${cmdline#/proc/}; pid=${pid%/cmdline}
  [ "$(tr '\0' ' ' < "$cmdline" 2>/dev/null | cut -d' ' -f1)" = lab/05_full_step ] || continue
  grep -q "^OUT=$dir$" <(tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null) && victim=$pid
done
if [ -z "$victim" ]; then echo "FAIL: no lab process to stop"; kill $launcher 2>/dev/null; exit 1; fi
kill -STOP "$victim"
stopped=$(date +%s%N)
# the run must end by itself well within TIMEOUT + margin (30 s: start-up of the abort, 2 cores)
for _ in $(seq 1 300); do kill -0 $launcher 2>/dev/null || break; sleep 0.1; done
ended=$(date +%s%N)
if kill -0 $launcher 2>/dev/null; then
  echo "FAIL: still running 30 s after a rank was stopped (TIMEOUT=$timeout_s): the run hangs"
  kill -KILL "$victim" 2>/dev/null; kill -KILL $launcher 2>/dev/null; exit 1
fi
kill -CONT "$victim" 2>/dev/null; kill -KILL "$victim" 2>/dev/null
wait $launcher
status=$?
tenths=$(( (ended - stopped) / 100000000 ))
echo "the run ended $((tenths / 10)).$((tenths % 10)) s after rank pid $victim was stopped, exit status $status"
grep -m1 "timed out" "$dir/output.log" || { echo "FAIL: no 'timed out' message"; tail -20 "$dir/output.log"; exit 1; }
timed_out="rank [01]: (all_gather|reduce_scatter|all_reduce) on unit '[^']+' \(seq [0-9]+, stream [a-z_]+\) timed out:"
timed_out+=" not complete after $timeout_s s|the size agreement timed out after $timeout_s s"
timed_out+="|\(all-reduce\) timed out: not complete after $timeout_s s"
grep -qE "$timed_out" "$dir/output.log" ||
  { echo "FAIL: the message does not name op, unit, seq, stream and the time waited"; exit 1; }
[ "$status" -ne 0 ] || { echo "FAIL: exit status 0 after a timeout"; exit 1; }
# the collectives record it in the JSONL (a lab-level all-reduce that times out aborts at once, naming it)
grep -q "(all-reduce) timed out" "$dir/output.log" || grep -qh '"kind":"mark".*timed out' "$dir"/rank*.jsonl ||
  { echo "FAIL: no event in the JSONL says it timed out"; exit 1; }
echo "OK: a stopped rank is named as a timeout, the run aborted, the JSONL records it"
