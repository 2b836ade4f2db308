# exercises — every lab as a graded assignment (docs/exercises.md, scripts/exercise.py, exercises/exercises.json).
#   lint      the markers balanced, every region of the manifest in the tree exactly once, every lab with a region;
#             and lint fails, naming the problem, on planted violations in scratch copies of the sources
#   regions   for every region: the stubbed copy builds (-Werror), its lab's quick grade fails and names the region,
#             the solution restored makes the region files equal this tree's (with lab 01's stubs in place, the quick
#             grades of the labs that do not use them still pass); then, every solution back, each lab's quick grade has
#             full marks
# One copy of the tree (built objects included) serves every region: make recompiles only the stubbed file.
EX=runs/check/exercises
S=$EX/copy
rm -rf $EX
mkdir -p $EX
check "exercises: lint: markers balanced, every region once, every lab covered" scripts/exercise.py lint
# a scratch copy of what lint reads (the sources and the manifest), with one violation planted by a python edit
EX_PLANT='
import json, re, shutil, sys
root, what = sys.argv[1], sys.argv[2]
shutil.rmtree(root, ignore_errors=True)
for folder in ("core", "lab", "trace", "exercises", "scripts"):
    shutil.copytree(folder, f"{root}/{folder}")
def edit(path, pattern, replacement):
    text = open(f"{root}/{path}").read()
    changed = re.sub(pattern, replacement, text, count=1, flags=re.M)
    assert changed != text, f"{pattern} not found in {path}"
    open(f"{root}/{path}", "w").write(changed)
if what == "unbalanced":    # the BEGIN of 03-mean removed: its END stands alone
    edit("core/comm/comm.c", r"^ */\* EXERCISE 03-mean BEGIN:.*\n", "")
elif what == "missing":     # both markers of 10-rows removed: the manifest names a region the tree lacks
    edit("core/fsdp/flat_param.c", r"^ */\* EXERCISE 10-rows BEGIN:.*\n", "")
    edit("core/fsdp/flat_param.c", r"^ */\* EXERCISE 10-rows END \*/\n", "")
elif what == "twice":       # 02-unshard marked a second time
    edit("core/comm/comm.c", r"^(static const char \*reduce_name)", "/* EXERCISE 02-unshard BEGIN: again */\n"
         "/* EXERCISE 02-unshard END */\n\\1")
elif what == "uncovered":   # lab 06 left without a region: its entry gone from the manifest, its markers too
    manifest = json.load(open(f"{root}/exercises/exercises.json"))
    manifest["regions"] = [r for r in manifest["regions"] if r["lab"] != "06"]
    json.dump(manifest, open(f"{root}/exercises/exercises.json", "w"))
    edit("core/fsdp/fsdp.c", r"^ */\* EXERCISE 06-prefetch BEGIN:.*\n", "")
    edit("core/fsdp/fsdp.c", r"^ */\* EXERCISE 06-prefetch END \*/\n", "")
'
for plant in "unbalanced|EXERCISE 03-mean END without a BEGIN" \
  "missing|10-rows: in exercises/exercises.json but no /\* EXERCISE 10-rows BEGIN \*/ \.\.\. END pair" \
  "twice|02-unshard: marked 2 times" "uncovered|lab 06: no exercise region"; do
  what=${plant%%|*}
  check_fails "exercises: lint fails on a planted violation ($what), naming it" "${plant#*|}" \
    bash -c "python3 -c '$EX_PLANT' $EX/lint_$what $what && python3 $EX/lint_$what/scripts/exercise.py lint \
      --root $EX/lint_$what"
done
# every region: stubbed, built, graded (quick: must fail naming it), restored (must equal the original)
regions=$(python3 -c 'import json; print(" ".join(r["lab"] + ":" + r["id"]
  for r in json.load(open("exercises/exercises.json"))["regions"]))')
for entry in $regions; do
  lab=${entry%%:*} id=${entry#*:}
  check_fails "exercises: $id stubbed: the copy builds, lab $lab's quick grade fails naming the region" \
    "likely at fault: exercise $id " \
    bash -c "scripts/exercise.py make $lab --dir $S --only $id && scripts/exercise.py grade $lab --dir $S --quick"
  # a stub breaks its own lab, not the others: the padding at 2 ranks (lab 02) and in lab 03's and 04's own buffers
  # changes nothing (the tiny model's units are multiples of 64 floats), nor does lab 04 read a shard's range
  case $id in 01-padding) others="02 03 04" ;; 01-range) others="04" ;; *) others= ;; esac
  for other in $others; do
    check "exercises: $id stubbed, lab $other's quick grade (it does not use the region) still full marks" \
      bash -c "set -o pipefail; scripts/exercise.py grade $other --dir $S --quick | tee /dev/stderr |
        grep -qE '^score: ([0-9]+)/\1\$'"
  done
  check "exercises: $id restored: every region file equals this tree's" \
    bash -c "scripts/exercise.py solution --dir $S && scripts/exercise.py same --dir $S"
done
# a stub that warns does not build (-Werror), and the grade says so before running anything
check_fails "exercises: a region written with a warning: the grade says the copy does not build, naming it" \
  "error: unused variable .{1,3}unused_here" \
  bash -c "scripts/exercise.py make 03 --dir $S --only 03-mean && python3 -c '
import sys; path = sys.argv[1]; text = open(path).read()
open(path, \"w\").write(text.replace(\"c->factor = 1.0f;\", \"int unused_here = 0; c->factor = 1.0f;\", 1))' \
    $S/core/comm/comm.c && scripts/exercise.py grade 03 --dir $S --quick"
check "exercises: its solution restored: every region file equals this tree's" \
  bash -c "scripts/exercise.py solution --dir $S && scripts/exercise.py same --dir $S"
# every solution back: each lab's quick grade has full marks (the first rebuilds the copy once)
for lab in $(printf '%s\n' $regions | cut -d: -f1 | uniq); do
  check "exercises: lab $lab, the solutions restored: its quick grade has full marks" \
    bash -c "set -o pipefail; scripts/exercise.py grade $lab --dir $S --quick | tee /dev/stderr |
      grep -qE '^score: ([0-9]+)/\1\$'"
done
