# lab 01 — sharding. The lab itself asserts that the concatenated shards equal the flattened original.
# Each rank's line: "rank r owns flat [b, e): S B = D B of the unit's U B (P%) + Z B of padding". The padding is
# counted once, apart from the shares: the data bytes add up to the unit, the shares to 100% within the printing's
# rounding (0.05 points a rank), and data + padding is the shard, on every rank.
# (python3 -c: check runs its command under timeout, which cannot run a shell function.)
LAB01_SHARES_ADD_UP=$(cat <<'PY'
import re, sys
ranks, log = int(sys.argv[1]), open(sys.argv[2]).read()
rows = re.findall(r"^rank (\d+) owns flat \[\d+, \d+\): (\d+) B = (\d+) B of the unit's (\d+) B \(([\d.]+)%\) "
                  r"\+ (\d+) B of padding$", log, re.M)
assert len(rows) == ranks, f"{len(rows)} rank lines for {ranks} ranks"
units = {int(r[3]) for r in rows}
assert len(units) == 1, f"ranks disagree on the unit's bytes: {units}"
unit = units.pop()
assert all(int(r[1]) == int(r[2]) + int(r[5]) for r in rows), "a shard is not data + padding"
assert sum(int(r[2]) for r in rows) == unit, f"data bytes {sum(int(r[2]) for r in rows)} != the unit's {unit}"
total = sum(float(r[4]) for r in rows)
assert abs(total - 100) <= 0.05 * ranks + 1e-9, f"shares add up to {total}%"
print(f"{ranks} ranks: data {unit} B, shares {total:.1f}%, padding {sum(int(r[5]) for r in rows)} B")
PY
)
for ranks in 2 3 4; do
  run_lab "01_shard -np $ranks: shards reassemble" $ranks runs/check/01_np$ranks 01_shard
  check "01_shard -np $ranks: prints the per-rank table" grep -q "rank $((ranks - 1)) owns flat" \
    "$(log_of "01_shard -np $ranks: shards reassemble")"
  check "01_shard -np $ranks: the ranks' shares of the unit add up to 100%, padding counted once" \
    python3 -c "$LAB01_SHARES_ADD_UP" $ranks "$(log_of "01_shard -np $ranks: shards reassemble")"
done
check_fails "01_shard -np 1 is refused, naming the value and the command that works" \
  "needs 2 to 8 ranks, got 1; run it as: make lab-01 NP=2" env OUT=runs/check/01_np1 $MPIRUN -np 1 lab/01_shard
check_fails "01_shard SEED=abc is refused, naming the variable" "SEED='abc' is not an integer" \
  env OUT=runs/check/01_bad SEED=abc $MPIRUN -np 2 lab/01_shard
