#!/usr/bin/env python3
"""fsdplab's exercises: each lab's mechanism as a graded assignment (docs/exercises.md).

The solution regions are marked in the sources, one line each side, and change nothing:
    /* EXERCISE 03-mean BEGIN: <the task, one line> */
    ... the solution ...
    /* EXERCISE 03-mean END */
exercises/exercises.json describes each region (lab, file, title, task, hints, invariant, the trace to read, the stub
that replaces the solution, minutes; optionally `checks`, a regex of the check names it can fail, where a lab has
several regions) and each lab (its check suite, the quick subset of its checks as a regex of check names, what to
read first).

  scripts/exercise.py list                          every region, in order, with its lab, file:line and minutes
  scripts/exercise.py lint [--root DIR]             markers balanced, every manifest region in the tree exactly once
                                                    (in its file), every region in the manifest, every lab >= 1 region
  scripts/exercise.py make LAB [--dir DIR] [--only ID...]
                                                    a learner's copy of the tree (default runs/exercise/LAB; built
                                                    objects included, so only what changes recompiles) with LAB's
                                                    regions replaced by their stubs and a comment: task, hints,
                                                    invariant. An existing copy made so is reused (restored first).
  scripts/exercise.py grade LAB [--dir DIR] [--quick]
                                                    builds the copy, runs LAB's checks there (tests/run_checks.sh;
                                                    --quick: the quick subset), one line per check; a failure names the
                                                    region(s) likely at fault (file:line in the copy), what the check
                                                    asserts, what it said, the trace to read; ends "score: N/M"
  scripts/exercise.py solution [--dir DIR] [LAB]    puts the solutions back (every region of the copy, or LAB's)
  scripts/exercise.py same [--dir DIR]              whether every region file of the copy equals this tree's
  scripts/exercise.py verify [--dir DIR] [ID...]    for each region (default: all): the stub builds (-Werror), the
                                                    lab's quick grade fails naming the region, the restored files
                                                    equal the original; then each lab's quick grade full marks
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

ROOT = os.path.realpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
MANIFEST = "exercises/exercises.json"
STATE = ".exercise.json"  # in a learner's copy: which lab, which regions are stubbed, where the solutions are
SOURCE_FOLDERS = ("core", "lab", "trace")
SOURCE_SUFFIXES = (".c", ".h", ".cu", ".cuh")
MARKER = re.compile(r"^(\s*)/\* EXERCISE ([0-9]{2}-[a-z0-9-]+) (BEGIN|END)(: (.+))? \*/$")
MAX_COLUMNS = 120
REGION_FIELDS = ("id", "lab", "file", "title", "task", "hints", "invariant", "trace", "stub", "minutes")


def load_manifest(root=ROOT):
    with open(os.path.join(root, MANIFEST), encoding="utf-8") as f:
        return json.load(f)


def source_files(root):
    for folder in SOURCE_FOLDERS:
        for directory, subdirectories, names in os.walk(os.path.join(root, folder)):
            subdirectories.sort()
            for name in sorted(names):
                if name.endswith(SOURCE_SUFFIXES):
                    path = os.path.join(directory, name)
                    yield os.path.relpath(path, root)


def scan(root):
    """({id: [(file, begin line index, end line index, indent)]}, [problems]) of the tree at root (0-based lines)."""
    regions, problems = {}, []
    for rel in source_files(root):
        with open(os.path.join(root, rel), encoding="utf-8") as f:
            lines = f.read().split("\n")
        open_region = None
        for index, line in enumerate(lines):
            if "EXERCISE" not in line or ("BEGIN" not in line and "END" not in line):
                continue
            match = MARKER.match(line)
            if match is None:
                if re.search(r"/\*\s*EXERCISE\b", line):
                    problems.append(f"{rel}:{index + 1}: a malformed marker (want /* EXERCISE NN-name BEGIN: task */ "
                                    f"or /* EXERCISE NN-name END */): {line.strip()}")
                continue
            indent, region_id, kind = match.group(1), match.group(2), match.group(3)
            if kind == "BEGIN":
                if open_region is not None:
                    problems.append(f"{rel}:{index + 1}: EXERCISE {region_id} BEGIN inside {open_region[0]} (opened "
                                    f"at line {open_region[1] + 1}): regions do not nest")
                if not match.group(5):
                    problems.append(f"{rel}:{index + 1}: EXERCISE {region_id} BEGIN without its one-line task")
                open_region = (region_id, index, indent)
            else:
                if match.group(4):
                    problems.append(f"{rel}:{index + 1}: EXERCISE {region_id} END carries text (only BEGIN does)")
                if open_region is None:
                    problems.append(f"{rel}:{index + 1}: EXERCISE {region_id} END without a BEGIN")
                elif open_region[0] != region_id:
                    problems.append(f"{rel}:{index + 1}: EXERCISE {region_id} END closes {open_region[0]} (opened at "
                                    f"line {open_region[1] + 1})")
                else:
                    regions.setdefault(region_id, []).append((rel, open_region[1], index, open_region[2]))
                open_region = None
        if open_region is not None:
            problems.append(f"{rel}:{open_region[1] + 1}: EXERCISE {open_region[0]} BEGIN never ends (no END)")
    return regions, problems


def lab_numbers(root):
    return sorted({name[:2] for name in os.listdir(os.path.join(root, "lab")) if re.match(r"^[0-9]{2}_.*\.c$", name)})


def lint(root):
    manifest = load_manifest(root)
    regions, problems = scan(root)
    seen = set()
    for region in manifest["regions"]:
        missing = [field for field in REGION_FIELDS if field not in region]
        rid = region.get("id", "?")
        if missing:
            problems.append(f"{MANIFEST}: region {rid}: missing {', '.join(missing)}")
            continue
        if rid in seen:
            problems.append(f"{MANIFEST}: region {rid} listed twice")
        seen.add(rid)
        if not rid.startswith(region["lab"] + "-"):
            problems.append(f"{MANIFEST}: region {rid}: its id does not start with its lab {region['lab']}")
        if region["lab"] not in manifest["labs"]:
            problems.append(f"{MANIFEST}: region {rid}: lab {region['lab']} has no entry under labs")
        if not region["stub"] or any("*/" in line and not line.rstrip().endswith("*/") for line in region["stub"]):
            problems.append(f"{MANIFEST}: region {rid}: the stub must be lines of C")
        found = regions.get(rid, [])
        if not found:
            problems.append(f"{rid}: in {MANIFEST} but no /* EXERCISE {rid} BEGIN */ ... END pair in the tree "
                            f"(expected in {region['file']})")
        elif len(found) > 1:
            problems.append(f"{rid}: marked {len(found)} times ({', '.join(f'{f}:{b + 1}' for f, b, _, _ in found)}); "
                            f"a region is marked exactly once")
        elif found[0][0] != region["file"]:
            problems.append(f"{rid}: marked in {found[0][0]}, but {MANIFEST} says {region['file']}")
        elif found[0][2] == found[0][1] + 1:
            problems.append(f"{rid}: {found[0][0]}:{found[0][1] + 1}: the region is empty")
    for rid, found in sorted(regions.items()):
        if rid not in seen:
            problems.append(f"{found[0][0]}:{found[0][1] + 1}: region {rid} is not in {MANIFEST}")
    covered = {region.get("lab") for region in manifest["regions"]}
    for lab in lab_numbers(root):
        if lab not in covered:
            problems.append(f"lab {lab}: no exercise region (every lab has at least one)")
    return problems


def read_lines(path):
    with open(path, encoding="utf-8") as f:
        return f.read().split("\n")


def write_lines(path, lines):
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))


def find_region(root, rel, rid):
    """(lines, begin index, end index, indent) of region rid in root/rel; exits naming the problem if absent."""
    lines = read_lines(os.path.join(root, rel))
    begin = end = None
    for index, line in enumerate(lines):
        match = MARKER.match(line)
        if match and match.group(2) == rid:
            if match.group(3) == "BEGIN":
                begin, indent = index, match.group(1)
            elif begin is not None:
                end = index
                break
    if begin is None or end is None:
        sys.exit(f"exercise: {rel} in {root} has no complete region {rid} (run scripts/exercise.py lint --root {root})")
    return lines, begin, end, indent


def stub_lines(region, indent, lab_dir):
    """The stub as it stands in a learner's copy: a comment with the task, hints and invariant, then the stub."""
    width = MAX_COLUMNS - len(indent) - 3
    comment = [f"/* TODO exercise {region['id']} (lab {region['lab']}, about {region['minutes']} minutes): "
               f"{region['title']}."]
    comment += textwrap.wrap(f"Task: {region['task']}", width, initial_indent=" * ", subsequent_indent=" *   ")
    for hint in region["hints"]:
        comment += textwrap.wrap(f"Hint: {hint}", width, initial_indent=" * ", subsequent_indent=" *   ")
    comment += textwrap.wrap(f"Invariant: {region['invariant']}", width, initial_indent=" * ",
                             subsequent_indent=" *   ")
    setting = dir_setting(lab_dir, region["lab"])
    comment += textwrap.wrap(f"Grade: make grade LAB={region['lab']}{setting} (QUICK=1: its fast subset); "
                             f"the solution back: make solution LAB={region['lab']}{setting}", width,
                             initial_indent=" * ",
                             subsequent_indent=" *   ")
    comment[-1] += " */"
    comment = [line.replace("*/", "* /") if i < len(comment) - 1 else line for i, line in enumerate(comment)]
    return [indent + line for line in comment] + [indent + line for line in region["stub"]]


def regions_of(manifest, lab=None, ids=None):
    chosen = [r for r in manifest["regions"] if (lab is None or r["lab"] == lab) and (not ids or r["id"] in ids)]
    if ids:
        unknown = set(ids) - {r["id"] for r in manifest["regions"]}
        if unknown:
            sys.exit(f"exercise: no region {', '.join(sorted(unknown))} (scripts/exercise.py list)")
    return chosen


def lab_of(value):
    lab = f"{int(value):02d}" if str(value).isdigit() else str(value)
    if lab not in load_manifest()["labs"]:
        labs = ", ".join(load_manifest()["labs"])
        sys.exit(f"exercise: LAB={value} is not a lab with exercises; choose one of {labs}")
    return lab


def default_dir(lab):
    return os.path.join("runs", "exercise", lab)


def shown_path(directory):
    """The copy's path as the learner types it: relative to where they stand, when it is below."""
    here = os.path.abspath(os.getcwd())
    return os.path.relpath(directory, here) if directory.startswith(here + os.sep) else directory


def dir_setting(directory, lab):
    """' DIR=...' for a make command about this copy; nothing for the default copy."""
    if os.path.abspath(directory) == os.path.abspath(default_dir(lab)):
        return ""
    return f" DIR={shown_path(directory)}"


def read_state(directory):
    path = os.path.join(directory, STATE)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def restore(directory, ids):
    """The solution (this tree's region text) back into the copy's regions ids."""
    manifest = load_manifest()
    for region in regions_of(manifest, ids=ids):
        lines, begin, end, _ = find_region(directory, region["file"], region["id"])
        original, obegin, oend, _ = find_region(ROOT, region["file"], region["id"])
        if lines[begin + 1:end] != original[obegin + 1:oend]:
            write_lines(os.path.join(directory, region["file"]), lines[:begin + 1] + original[obegin + 1:oend] +
                        lines[end:])


def copy_tree(directory):
    os.makedirs(directory, exist_ok=True)
    # the tree as it is, built objects included (make then recompiles only the stubbed files), minus runs and .git
    excluded = ["--exclude=./runs", "--exclude=./.git"]
    if directory.startswith(ROOT + os.sep):  # a copy inside the tree (DIR=mycopy) is not copied into itself
        excluded.append("--exclude=./" + os.path.relpath(directory, ROOT))
    tar = subprocess.Popen(["tar", "-C", ROOT] + excluded + ["-cf", "-", "."], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-C", directory, "-xf", "-"], stdin=tar.stdout, check=True)
    if tar.wait() != 0:
        sys.exit(f"exercise: copying {ROOT} into {directory} failed")


def command_make(args):
    lab = lab_of(args.lab)
    directory = os.path.abspath(args.dir or default_dir(lab))
    if directory == ROOT:
        sys.exit("exercise: DIR is this repository; an exercise goes into a copy (DIR=runs/exercise/NN, the default)")
    state = read_state(directory)
    if state is not None:
        restore(directory, state["regions"])  # a copy made before: reused, its earlier stubs undone
    elif os.path.isdir(directory) and os.listdir(directory):
        sys.exit(f"exercise: {directory} exists and is no exercise copy; name another DIR or remove it")
    else:
        copy_tree(directory)
    manifest = load_manifest()
    chosen = regions_of(manifest, lab, args.only)
    shown = shown_path(directory)
    for region in chosen:
        lines, begin, end, indent = find_region(directory, region["file"], region["id"])
        write_lines(os.path.join(directory, region["file"]),
                    lines[:begin + 1] + stub_lines(region, indent, directory) + lines[end:])
    with open(os.path.join(directory, STATE), "w", encoding="utf-8") as f:
        json.dump({"lab": lab, "regions": [r["id"] for r in chosen], "origin": ROOT}, f, indent=1)
    print(f"exercise lab {lab}: a copy of the tree in {shown}, with {len(chosen)} region(s) to write:")
    for region in chosen:
        _, begin, _, _ = find_region(directory, region["file"], region["id"])
        print(f"  {region['id']:14} {shown}/{region['file']}:{begin + 1}  {region['title']} "
              f"(about {region['minutes']} min)")
    print(f"read first: {manifest['labs'][lab]['read']}")
    setting = dir_setting(directory, lab)
    print(f"then: make grade LAB={lab}{setting} QUICK=1 (fast), make grade LAB={lab}{setting} (every check)")
    return 0


def mpirun_default():
    if os.environ.get("MPIRUN"):
        return os.environ["MPIRUN"]
    return "mpirun " + ("--allow-run-as-root " if os.geteuid() == 0 else "") + "--oversubscribe"


def build(directory, quick, lab):
    """make in the copy: lab LAB's program, lab 05's (labs 05 and 08 train with it) and the comparison tool (quick),
    or everything; (ok, output)."""
    if quick:
        programs = sorted(os.path.splitext(name)[0] for name in os.listdir(os.path.join(directory, "lab"))
                          if re.match(r"^[0-9]{2}_.*\.c$", name) and name[:2] in (lab, "05"))
        targets = [f"lab/{name}" for name in programs] + ["build/tests/bin/qwen2_tool"]
    else:
        targets = ["all"]
    result = subprocess.run(["make", "-s", "--no-print-directory", "-j2"] + targets, cwd=directory,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return result.returncode == 0, result.stdout


# What a failed check's log says that a learner needs: its verdicts first (mismatches, expected vs got, errors: a
# verdict ending in ':' brings the indented lines under it), then lines naming a rank; never mpirun's boilerplate.
# A crashed rank: the signal, and the functions of its backtrace (the stub may leave a buffer unset).
VERDICT = re.compile(r"MISMATCH|FAIL|[Ee]xpected|got |[Ee]rror|[Aa]ssert|differ|mismatch|!=|wrong|\bnan\b|Abort|"
                     r"Signal:|refused|out of|exceed|not ")
NAMING = re.compile(r"rank \d|unit '|check:")
NOISE = re.compile(r"^-{5,}|^Primary job|^mpirun (noticed|detected)|^\s*$|process rank .* exited|^  Process name|"
                   r"^  Exit code|^expected a non-zero exit|^\s*rank \d+ +bytes sent|with errorcode|"
                   r"You may or may not see output|MCA parameter|MPI_ABORT was invoked|NOTE: invoking MPI_ABORT|"
                   r"Signal code|Failing at address|^\[[^]]*\] \[ *\d+\]|End of error message|exited on signal")
FRAME = re.compile(r"\[ *\d+\] ([^(\s]*)\((\w+)\+0x")  # a backtrace's frame: the binary, the function


def telling_lines(log_path, limit=6):
    try:
        with open(log_path, encoding="utf-8", errors="replace") as f:
            raw = [line.rstrip()[:300] for line in f]
    except OSError:
        return []
    lines = [line for line in raw if not NOISE.search(line)]
    said = []
    frames = list(dict.fromkeys(m.group(2) for m in map(FRAME.search, raw)
                                if m and ".so" not in m.group(1) and m.group(2) not in ("main", "_start")))
    for pattern in (VERDICT, NAMING):
        picked = []
        for index, line in enumerate(lines):
            if pattern.search(line):
                picked.append(line)
                follow = index + 1
                while line.endswith(":") and follow < len(lines) and lines[follow][:1] in (" ", "\t"):
                    picked.append(lines[follow])
                    follow += 1
        picked = list(dict.fromkeys(picked))
        if picked:
            said = picked[:limit]
            break
    if not said:
        said = lines[-limit:]
    if frames:
        said.append("a rank crashed in " + " <- ".join(frames[:6]) + " (a buffer the stub leaves unset?)")
    elif any("Signal:" in line for line in raw):
        said.append("a rank crashed (a buffer the stub leaves unset?); the log has its backtrace")
    return said


def changed_regions(directory, lab):
    """The lab's regions whose text in the copy differs from the solution's."""
    changed = []
    for region in regions_of(load_manifest(), lab):
        lines, begin, end, _ = find_region(directory, region["file"], region["id"])
        original, obegin, oend, _ = find_region(ROOT, region["file"], region["id"])
        if lines[begin + 1:end] != original[obegin + 1:oend]:
            changed.append(region)
    return changed


def command_grade(args):
    lab = lab_of(args.lab)
    manifest = load_manifest()
    info = manifest["labs"][lab]
    directory = os.path.abspath(args.dir or default_dir(lab))
    if not os.path.isdir(directory):
        sys.exit(f"exercise: no copy at {directory}; make one first: make exercise LAB={lab}")
    shown = shown_path(directory)
    subset = "the quick subset of " if args.quick else ""
    print(f"grading lab {lab} in {shown}: {subset}tests/suites/{info['suite']}.sh")
    ok, output = build(directory, args.quick, lab)
    if not ok:
        print("FAIL  the copy does not build (-Werror: every warning is an error); the compiler says:")
        for line in [line for line in output.splitlines() if re.search(r"error|warning", line)][:12]:
            print("      | " + re.sub(r"^(?=[\w./-]+\.(c|h|cu):\d+)", shown + "/", line))
        print("score: 0/1 (it must build before any check runs)")
        return 1
    env = dict(os.environ, MPIRUN=mpirun_default(), CHECK_TIMEOUT=os.environ.get("CHECK_TIMEOUT", "120"))
    env.pop("CHECK_ONLY", None)
    if args.quick:
        env["CHECK_ONLY"] = info["quick"]
    result = subprocess.run(["tests/run_checks.sh", info["suite"]], cwd=directory, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    passed = failed = skipped = 0
    failed_runs = set()
    suspects = changed_regions(directory, lab)
    for line in result.stdout.splitlines():
        match = re.match(r"^(PASS|FAIL|SKIP)  (.*?)(   \(log: (.*)\))?$", line)
        if not match:
            continue
        status, name, log = match.group(1), match.group(2), match.group(4)
        if status == "PASS":
            passed += 1
            print(f"PASS  {name}")
            continue
        if status == "SKIP":
            skipped += 1
            print(line)
            continue
        failed += 1
        print(f"FAIL  {name}")
        if name.endswith(": trace valid") and name[:-len(": trace valid")] in failed_runs:
            print("      (the run above failed: its trace is missing or cut short)")
            continue
        failed_runs.add(name)
        for said in telling_lines(os.path.join(directory, log)) if log else []:
            print(f"      the check says: {said}")
        candidates = suspects or regions_of(manifest, lab)
        narrowed = [r for r in candidates if "checks" not in r or re.search(r["checks"], name)]
        for region in narrowed or candidates:
            _, begin, _, _ = find_region(directory, region["file"], region["id"])
            print(f"      likely at fault: exercise {region['id']} ({region['title']}) at "
                  f"{shown}/{region['file']}:{begin + 1}")
            print(f"        what it asserts: {region['invariant']}")
            print(f"        where to look:   {region['trace']} (under {shown}/)")
        if log:
            print(f"      full log: {shown}/{log}")
    if passed + failed == 0:
        print(f"FAIL  no check ran (suite {info['suite']}, quick {info['quick']!r}); the runner said:")
        for line in result.stdout.splitlines()[-8:]:
            print("      | " + line)
        failed = 1
    extra = f" ({skipped} skipped)" if skipped else ""
    print(f"score: {passed}/{passed + failed}{extra}")
    return 0 if failed == 0 and result.returncode == 0 else 1


def command_solution(args):
    state = None
    directory = os.path.abspath(args.dir or default_dir(lab_of(args.lab) if args.lab else "."))
    if args.dir is None and args.lab is None:
        sys.exit("exercise: name the copy: make solution DIR=runs/exercise/NN (or LAB=NN for the default copy)")
    state = read_state(directory)
    if state is None:
        sys.exit(f"exercise: {directory} is no exercise copy (no {STATE})")
    ids = [r["id"] for r in regions_of(load_manifest(), lab_of(args.lab))] if args.lab else None
    restore(directory, ids or [r["id"] for r in load_manifest()["regions"]])
    print(f"the solutions are back in {directory} ({'lab ' + lab_of(args.lab) if args.lab else 'every region'})")
    return 0


def differing_files(directory):
    files = sorted({r["file"] for r in load_manifest()["regions"]})
    return [rel for rel in files if read_lines(os.path.join(directory, rel)) != read_lines(os.path.join(ROOT, rel))]


def command_same(args):
    directory = os.path.abspath(args.dir)
    differ = differing_files(directory)
    for rel in differ:
        print(f"differs: {rel}")
    print(f"{len(differ)} region files of {directory} differ from {ROOT}'s")
    return 1 if differ else 0


def run_self(*arguments):
    result = subprocess.run([sys.executable, os.path.abspath(__file__)] + list(arguments), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    return result.returncode, result.stdout


def command_verify(args):
    manifest = load_manifest()
    chosen = regions_of(manifest, ids=args.ids)
    directory = os.path.abspath(args.dir or os.path.join("runs", "exercise", "verify"))
    failures = 0
    for region in chosen:
        rid, lab = region["id"], region["lab"]
        status, output = run_self("make", lab, "--dir", directory, "--only", rid)
        if status == 0:
            status, output = run_self("grade", lab, "--dir", directory, "--quick")
            good = status != 0 and f"likely at fault: exercise {rid} " in output and "does not build" not in output
            score = re.findall(r"score: .*", output)
            verdict = (f"stub builds, quick grade fails ({score[-1] if score else 'no score'}) naming it" if good else
                       f"expected a build and a failing quick grade naming {rid}")
        else:
            good, verdict = False, "make failed"
        restore(directory, [rid])
        same = not differing_files(directory)
        print(f"{'PASS' if good and same else 'FAIL'}  {rid}: {verdict}; restored "
              f"{'equals' if same else 'DIFFERS from'} the original", flush=True)
        if not (good and same):
            failures += 1
            print(textwrap.indent(output[-3000:], "      | "), flush=True)
    # the solutions back everywhere: each lab's quick grade has full marks (one build, at the first)
    for lab in dict.fromkeys(region["lab"] for region in chosen):
        status, output = run_self("grade", lab, "--dir", directory, "--quick")
        full = status == 0 and re.search(r"^score: (\d+)/\1$", output, re.M)
        print(f"{'PASS' if full else 'FAIL'}  lab {lab} restored: quick grade "
              f"{re.findall(r'score: .*', output)[-1] if 'score:' in output else 'no score'}", flush=True)
        if not full:
            failures += 1
            print(textwrap.indent(output[-3000:], "      | "), flush=True)
    print(f"verify: {len(chosen)} regions, {failures} failures")
    return 1 if failures else 0


def command_list(args):
    manifest = load_manifest()
    regions, _ = scan(ROOT)
    total = 0
    for region in manifest["regions"]:
        where = regions.get(region["id"])
        at = f"{where[0][0]}:{where[0][1] + 1}" if where else f"{region['file']} (MISSING)"
        total += region["minutes"]
        print(f"{region['id']:14} lab {region['lab']}  {at:32} {region['minutes']:3} min  {region['title']}")
    print(f"{len(manifest['regions'])} exercises, about {total} minutes")
    return 0


def command_lint(args):
    root = os.path.abspath(args.root)
    problems = lint(root)
    for problem in problems:
        print(problem)
    manifest = load_manifest(root)
    print(f"{len(manifest['regions'])} regions in {MANIFEST}, {len(lab_numbers(root))} labs: {len(problems)} problems")
    return 1 if problems else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list")
    p = sub.add_parser("lint")
    p.add_argument("--root", default=ROOT)
    p = sub.add_parser("make")
    p.add_argument("lab")
    p.add_argument("--dir")
    p.add_argument("--only", nargs="+")
    p = sub.add_parser("grade")
    p.add_argument("lab")
    p.add_argument("--dir")
    p.add_argument("--quick", action="store_true")
    for name in ("solution", "restore"):
        p = sub.add_parser(name)
        p.add_argument("lab", nargs="?")
        p.add_argument("--dir")
    p = sub.add_parser("same")
    p.add_argument("--dir", required=True)
    p = sub.add_parser("verify")
    p.add_argument("ids", nargs="*")
    p.add_argument("--dir")
    args = parser.parse_args()
    command = {"list": command_list, "lint": command_lint, "make": command_make, "grade": command_grade,
               "solution": command_solution, "restore": command_solution, "same": command_same,
               "verify": command_verify}[args.command]
    return command(args)


if __name__ == "__main__":
    sys.exit(main())
