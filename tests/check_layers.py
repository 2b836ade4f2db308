#!/usr/bin/env python3
"""The source tree's shape, read from the files themselves, so that it stays true:

  floors    core/ is one folder a floor, lowest first (FLOORS below, the order the Makefile's CORE_FLOORS names);
            a file includes only headers of its own floor or a lower one, and trace/ (the ground floor every
            layer logs into) includes no core header. core/cuda/ is the CUDA plug-in: it may include any core
            header, and no core header outside it may include one of its.
  circles   a module is a header and its source (core/fsdp/fsdp.h + fsdp.c); module A uses B when either file of A
            includes B's header. No module may reach itself again through such uses (a circle), on any floor.
  plug-in   no file outside core/cuda/ (and the tests that only the CUDA builds compile) is compiled differently
            for CUDA: the word FSDPLAB_CUDA appears nowhere else in core/, lab/, trace/ or scripts/.
  columns   no line of the project's own sources, scripts, Makefile or pages is longer than 120 columns (in a
            Markdown page, a table row or a line of a fenced block, pasted output, may be: neither can be wrapped).
  timed     the GPU's work is queued where PROFILE_KERNELS times it (core/cuda/kernel_profile.h): kernels are
            launched (<<<...>>>) in core/cuda/kernels.cu's launchers only; every other .cu file of core/cuda/ calls a
            launcher inside LAUNCH(...) and a cuBLAS GEMM inside GEMM(...) (the macros of cuda_ops.cu).

Prints every violation (file, line, what and why) and exits 1 if there is one; else a summary and 0.
  tests/check_layers.py [--root DIR]
"""
import argparse
import os
import re
import subprocess
import sys

FLOORS = ["base", "kernels", "memory", "device", "runtime", "data", "comm", "fsdp", "models", "io"]
PLUGIN = "cuda"
MAX_COLUMNS = 120
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
SOURCE = re.compile(r"\.(c|h|cu|cuh|cpp)$")
# Files whose lines are data, not prose or code a reader reads line by line.
LONG_LINES_ALLOWED = re.compile(r"\.(ipynb|json|jsonl|tiktoken|txt|csv|png|pickle|safetensors|bin)$|_assets\.c$")


LAUNCHER_CALL = re.compile(r"\b\w+_launch\s*\(")
GEMM_CALL = re.compile(r"\bcublas\w*[Gg]emm\w*\s*\(")


def untimed_work(root, files):
    """The `timed` rule: each statement (up to ';', comments and preprocessor lines blanked) of a core/cuda/*.cu file
    other than kernels.cu that calls a launcher or a cuBLAS GEMM must be a LAUNCH(...) or GEMM(...) one; `<<<` only
    in kernels.cu."""
    problems = []
    for path in files:
        if not (path.startswith(f"core/{PLUGIN}/") and SOURCE.search(path)):
            continue
        text = open(os.path.join(root, path), encoding="utf-8", errors="replace").read()
        blank = lambda m: re.sub(r"[^\n]", " ", m.group(0))  # keeps the line numbers
        code = re.sub(r"/\*.*?\*/|//[^\n]*", blank, text, flags=re.S)
        code = re.sub(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", blank, code, flags=re.M)  # the preprocessor's lines
        if path != f"core/{PLUGIN}/kernels.cu" and "<<<" in code:
            line = code.count("\n", 0, code.index("<<<")) + 1
            problems.append(f"{path}:{line}: a kernel launched outside core/{PLUGIN}/kernels.cu's launchers (which "
                            "LAUNCH times under PROFILE_KERNELS)")
        if not path.endswith(".cu") or path == f"core/{PLUGIN}/kernels.cu":
            continue
        start = 0
        for statement in code.split(";"):
            line = code.count("\n", 0, start) + 1 + len(statement) - len(statement.lstrip("\n"))
            start += len(statement) + 1
            if LAUNCHER_CALL.search(statement) and "LAUNCH(" not in statement:
                problems.append(f"{path}:{line}: a launcher called outside LAUNCH(...): PROFILE_KERNELS would not "
                                "time it")
            if GEMM_CALL.search(statement) and not re.search(r"\bGEMM(_BF16|_BF16_BATCHED)?\(", statement):
                problems.append(f"{path}:{line}: a cuBLAS GEMM outside GEMM(...): PROFILE_KERNELS would not time it")
    return problems


def tracked_files(root):
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=root, capture_output=True, text=True,
                         check=True).stdout.split()
    return sorted({f for f in out if os.path.isfile(os.path.join(root, f))})


def floor_of(path):
    """The floor's index of a core/ file, len(FLOORS) for the plug-in, None outside core/."""
    parts = path.split("/")
    if len(parts) < 3 or parts[0] != "core":
        return None
    if parts[1] == PLUGIN:
        return len(FLOORS)
    return FLOORS.index(parts[1]) if parts[1] in FLOORS else -1


def resolve(including, name, root):
    """The repository path an #include "name" in `including` reads: the repository root first (-I.), then beside
    the file, as the compiler looks (quotes: the including file's folder, then -I.)."""
    beside = os.path.normpath(os.path.join(os.path.dirname(including), name))
    if os.path.isfile(os.path.join(root, beside)):
        return beside
    if os.path.isfile(os.path.join(root, name)):
        return os.path.normpath(name)
    return None


def module_of(path):
    return re.sub(r"\.(c|h|cu|cuh)$", "", path)


def find_circle(graph):
    """One circle of the module graph as a list of modules (first == last), or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    args = parser.parse_args()
    root = os.path.normpath(args.root)
    files = tracked_files(root)
    problems = []
    graph = {}
    includes = 0

    for path in files:
        if not SOURCE.search(path):
            continue
        text = open(os.path.join(root, path), encoding="utf-8", errors="replace").read()
        floor = floor_of(path)
        if floor == -1:
            problems.append(f"{path}: core/{path.split('/')[1]}/ is not a floor (the floors: {', '.join(FLOORS)}, "
                            f"and the plug-in core/{PLUGIN}/)")
        for match in INCLUDE.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            target = resolve(path, match.group(1), root)
            if target is None:
                continue  # a system or generated header (cuda_runtime.h, the emulator's): not ours to order
            includes += 1
            if path.startswith("trace/") and target.startswith("core/"):
                problems.append(f"{path}:{line}: includes {target}: trace/ is the ground floor and includes no core "
                                "header (core logs into trace, never the other way)")
            target_floor = floor_of(target)
            if floor is not None and floor >= 0 and target_floor is not None and target_floor > floor:
                problems.append(f"{path}:{line}: includes {target}: an arrow back up, from floor "
                                f"{(FLOORS + [PLUGIN])[floor]} to {(FLOORS + [PLUGIN])[target_floor]}")
            if path.startswith("core/") and target.startswith("core/"):
                a, b = module_of(path), module_of(target)
                if a != b:
                    graph.setdefault(a, set()).add(b)
        if "FSDPLAB_CUDA" in text and floor is not None and floor != len(FLOORS):
            problems.append(f"{path}: mentions FSDPLAB_CUDA: only core/{PLUGIN}/ is compiled for CUDA; the rest "
                            "reaches the plug-in through its tables (core/runtime/plugin.h)")
    for path in files:
        if path.split("/")[0] in ("lab", "trace", "scripts") and SOURCE.search(path):
            if "FSDPLAB_CUDA" in open(os.path.join(root, path), errors="replace").read():
                problems.append(f"{path}: mentions FSDPLAB_CUDA: only core/{PLUGIN}/ is compiled for CUDA")

    problems += untimed_work(root, files)

    circle = find_circle(graph)
    if circle:
        problems.append("a circle of modules: " + " -> ".join(circle))

    long_lines = 0
    for path in files:
        if LONG_LINES_ALLOWED.search(path) or path.startswith("tests/data/"):
            continue
        try:
            lines = open(os.path.join(root, path), encoding="utf-8").read().split("\n")
        except (UnicodeDecodeError, OSError):
            continue
        fenced = False
        for number, text in enumerate(lines, 1):
            if path.endswith(".md"):
                if text.lstrip().startswith("```"):
                    fenced = not fenced
                    continue
                if fenced or text.lstrip().startswith("|"):
                    continue
            if len(text) > MAX_COLUMNS:
                long_lines += 1
                problems.append(f"{path}:{number}: {len(text)} columns (at most {MAX_COLUMNS})")

    for problem in problems:
        print(problem)
    modules = len(set(graph) | {m for targets in graph.values() for m in targets})
    print(f"{len(files)} files, {includes} includes of our headers, {modules} core modules on {len(FLOORS)} floors "
          f"and the plug-in: {len(problems)} problem{'s' if len(problems) != 1 else ''}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
