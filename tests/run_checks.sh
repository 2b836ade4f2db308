#!/usr/bin/env bash
# Runs check suites and prints one line per check, then the closing summary "N passed, N failed".
#
#   tests/run_checks.sh SUITE...                      (SUITE = a file tests/suites/SUITE.sh), one after another
#   tests/run_checks.sh --lanes "SUITE..." "SUITE..."   lanes side by side (`make check`): each lane's suites one
#                                                       after another; the first lane prints as it goes, the others
#                                                       into runs/check/lanes/<N>.log, printed once the first is done;
#                                                       one closing line for all. Suites that share a build tree or a
#                                                       run directory belong in one lane.
#
# A suite is a bash file that calls, for each check:
#   check NAME COMMAND...                     passes when COMMAND exits 0
#   check_fails NAME PATTERN COMMAND...       passes when COMMAND exits non-zero and its output matches PATTERN
#   run_lab NAME NP DIR LAB [ENV=VALUE...]    runs lab/LAB on NP ranks into DIR, then validates DIR's trace
# Each check's output goes to runs/check/logs/NAME.log; a failure prints its tail. MPIRUN comes from the Makefile.
# A command that exits 77 (the automake convention) after printing "skipped: <reason>" counts as skipped.
# CHECK_ONLY=REGEX (grep -E) runs only the checks whose names match it; the others are neither run nor counted
# (`make grade LAB=NN QUICK=1` runs a lab's quick subset so, exercises/exercises.json naming it).
set -u
cd "$(dirname "$0")/.."

MPIRUN=${MPIRUN:-mpirun}
CHECK_TIMEOUT=${CHECK_TIMEOUT:-300}
LOG_DIR=runs/check/logs
mkdir -p "$LOG_DIR"
LANE_DIR=runs/check/lanes

# --counts FILE (a lane of --lanes): no closing line; the counts and failed names go to FILE for the first lane.
counts_file=
if [ "${1:-}" = --counts ]; then
  counts_file=$2
  shift 2
fi
other_lanes=()
if [ "${1:-}" = --lanes ]; then
  shift
  read -r -a first_lane <<<"$1"
  shift
  rm -rf "$LANE_DIR"
  mkdir -p "$LANE_DIR"
  lane=1
  for suites in "$@"; do
    read -r -a lane_suites <<<"$suites"
    "$0" --counts "$LANE_DIR/$lane.counts" "${lane_suites[@]}" >"$LANE_DIR/$lane.log" 2>&1 &
    other_lanes+=("$lane:$!")
    lane=$((lane + 1))
  done
  set -- "${first_lane[@]}"
fi
passed=0
failed=0
skipped=0
failed_names=()

log_of() { printf '%s/%s.log' "$LOG_DIR" "$(printf '%s' "$1" | tr -c 'A-Za-z0-9_.-' '_')"; }

record() { # record NAME STATUS LOG
  if [ "$2" = 77 ]; then
    skipped=$((skipped + 1))
    printf 'SKIP  %s   (%s)\n' "$1" "$(grep -m1 -o 'skipped: .*' "$3" || echo 'skipped: no reason given')"
  elif [ "$2" = 0 ]; then
    passed=$((passed + 1))
    printf 'PASS  %s\n' "$1"
  else
    failed=$((failed + 1))
    failed_names+=("$1")
    printf 'FAIL  %s   (log: %s)\n' "$1" "$3"
    tail -n 25 "$3" | sed 's/^/      | /'
  fi
}

# selected NAME: whether CHECK_ONLY (unset: every check) selects the check NAME
selected() { [ -z "${CHECK_ONLY:-}" ] || printf '%s\n' "$1" | grep -qE -- "$CHECK_ONLY"; }

check() {
  local name=$1 log
  shift
  selected "$name" || return 0
  log=$(log_of "$name")
  timeout "$CHECK_TIMEOUT" "$@" >"$log" 2>&1
  record "$name" $? "$log"
}

check_fails() {
  local name=$1 pattern=$2 log status
  shift 2
  selected "$name" || return 0
  log=$(log_of "$name")
  timeout "$CHECK_TIMEOUT" "$@" >"$log" 2>&1
  status=$?
  if [ $status -ne 0 ] && [ $status -ne 124 ] && grep -qE -- "$pattern" "$log"; then status=0
  else
    printf '\nexpected a non-zero exit (got %d) and output matching: %s\n' "$status" "$pattern" >>"$log"
    status=1
  fi
  record "$name" $status "$log"
}

# One lab run: the lab's own assertions decide its exit status; then the trace it wrote must pass the validator.
run_lab() {
  local name=$1 ranks=$2 dir=$3 lab=$4
  shift 4
  selected "$name" || return 0
  rm -rf "$dir"
  check "$name" env OUT="$dir" "$@" $MPIRUN -np "$ranks" "lab/$lab"
  check "$name: trace valid" python3 tests/validate_trace.py --expect-ranks "$ranks" "$dir"
}

for suite in "$@"; do
  if [ ! -f "tests/suites/$suite.sh" ]; then
    echo "run_checks: no suite tests/suites/$suite.sh" >&2
    exit 2
  fi
  printf -- '--- %s\n' "$suite"
  suite_start=$SECONDS
  # shellcheck source=/dev/null
  source "tests/suites/$suite.sh"
  printf -- '--- %s: %d s\n' "$suite" $((SECONDS - suite_start))
done

if [ -n "$counts_file" ]; then
  printf '%d %d %d\n' $passed $failed $skipped >"$counts_file"
  [ $failed -gt 0 ] && printf '%s\n' "${failed_names[@]}" >>"$counts_file"
  exit 0
fi
for entry in "${other_lanes[@]}"; do
  lane=${entry%%:*}
  wait "${entry#*:}"
  printf -- '=== lane %d (ran beside the one above; log: %s)\n' "$lane" "$LANE_DIR/$lane.log"
  cat "$LANE_DIR/$lane.log"
  if [ ! -s "$LANE_DIR/$lane.counts" ]; then
    failed=$((failed + 1))
    failed_names+=("lane $lane ended without its counts (see its log)")
    continue
  fi
  { read -r lane_passed lane_failed lane_skipped
    passed=$((passed + lane_passed)) failed=$((failed + lane_failed)) skipped=$((skipped + lane_skipped))
    while IFS= read -r name; do failed_names+=("$name"); done; } <"$LANE_DIR/$lane.counts"
done

echo
[ $failed -gt 0 ] && printf 'failed: %s\n' "${failed_names[*]}"
if [ $skipped -gt 0 ]; then echo "$passed passed, $failed failed, $skipped skipped"
else echo "$passed passed, $failed failed"; fi
[ $failed -eq 0 ]
