#!/usr/bin/env bash
# Host waits and launches per step of lab 05 on the CUDA emulator (make CUDA=emulated), per rank: the emulator's
# counts (CUDA_EMULATOR_SYNC_LOG: every cudaStreamSynchronize, cudaEventSynchronize and cudaDeviceSynchronize, the
# kernel launches and cuBLAS calls, the copies and fills within GPU memory with their bytes, the host's stops:
# its looks at the GPU, synchronizes and event queries, with work queued since the last; the GEMMs among the
# launches) of a STEPS=3 run
# minus a STEPS=1 run, halved, so start-up and the end's once-only work cancel. docs/gpu.md's tables of host waits
# and launches per step come from it.
#
#   tests/host_waits.sh [LAB05_BINARY] [VAR=value ...]     (default build/cuda_emulated/lab/05_full_step)
#
# Lab 05 runs on 2 ranks with DEVICE=cuda BACKEND=mpi ACC=2 SEQ=32 MBS=2 unless the arguments say otherwise. Prints
# one line: "stream S event E device D launches L copies C bytes B stops P gemms G" (per step, per rank, averaged
# over the ranks). HOST_WAITS_OUT=dir keeps the STEPS=3 run's output there (its trace, PROFILE_KERNELS' tables).
set -euo pipefail
binary=build/cuda_emulated/lab/05_full_step
if [ $# -gt 0 ] && [[ "$1" != *=* ]]; then binary=$1; shift; fi
MPIRUN=${MPIRUN:-mpirun --allow-run-as-root --oversubscribe}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
count() { # STEPS -> the log's per-rank lines, summed over ranks then divided by the ranks
  local steps=$1 log=$work/sync_$1.log
  shift
  local out=$work/run_$steps
  if [ "$steps" = 3 ] && [ -n "${HOST_WAITS_OUT:-}" ]; then out=$HOST_WAITS_OUT; fi
  env OUT=$out CUDA_EMULATOR_SYNC_LOG=$log DEVICE=cuda BACKEND=mpi ACC=2 SEQ=32 MBS=2 STEPS=$steps "$@" \
    $MPIRUN -np 2 "$binary" > $work/out_$steps.txt 2>&1 || { cat $work/out_$steps.txt >&2; exit 1; }
  awk '{s += $4; e += $6; d += $8; l += $10; c += $12; b += $14; q += $16; g += $18; n++}
    END {printf "%d %d %d %d %d %.0f %d %d %d\n", s, e, d, l, c, b, q, g, n}' $log
}
read -r s1 e1 d1 l1 c1 b1 q1 g1 n1 <<< "$(count 1 "$@")"
read -r s3 e3 d3 l3 c3 b3 q3 g3 n3 <<< "$(count 3 "$@")"
awk -v s1=$s1 -v e1=$e1 -v d1=$d1 -v l1=$l1 -v c1=$c1 -v b1=$b1 -v n1=$n1 -v s3=$s3 -v e3=$e3 -v d3=$d3 -v l3=$l3 \
  -v c3=$c3 -v b3=$b3 -v q1=$q1 -v q3=$q3 -v g1=$g1 -v g3=$g3 'BEGIN {
  printf "stream %g event %g device %g launches %g copies %g bytes %.0f stops %g gemms %g\n", (s3 - s1) / 2 / n1,
    (e3 - e1) / 2 / n1, (d3 - d1) / 2 / n1, (l3 - l1) / 2 / n1, (c3 - c1) / 2 / n1, (b3 - b1) / 2 / n1,
    (q3 - q1) / 2 / n1, (g3 - g1) / 2 / n1 }'
