#!/usr/bin/env python3
"""The commands README.md and docs/*.md show, found mechanically, and the pages' own rules (tests/suites/docs.sh).

The convention (docs/checks.md, "The docs check"): every fenced block says what it holds in its info string.
  ```sh          commands a learner types at the repository root, as root, on a CPU machine: the check runs each
  ```sh fails    commands that must be refused (exit non-zero, not a timeout): the check runs each and wants that
  ```sh env      `export NAME=value ...` lines for the learner's shell (README.md's setup): the check runs every
                 command of every page with them
  ```sh long     commands too long for the check (minutes to hours): syntax-checked only
  ```sh gpu      commands that need an NVIDIA GPU: syntax-checked only
  ```sh net      commands that download (PyPI, the Hugging Face hub): syntax-checked only
  ```sh check    the checks themselves (make check, make check-NN, the installer): syntax-checked only, since
                 `make check` runs this check
  ```text        output, never run; ```c, ```python, ```json: code to read, never run
A fence without an info string, or with another one, is an error: nothing escapes the check by accident. In a command
block, a line ending in a backslash continues on the next; blank lines and lines starting with # are skipped; a
trailing # comment stays (bash ignores it). A table whose header has a column named `run` holds commands too: each
code span in that column is a command of kind sh.

The labs' headers (a FILE ending in .c: lab/NN_name.c) hold commands too, in the block that starts at the header's
" * What to run" line and ends at its first empty " *" line. A command is a line of that block indented by exactly
three spaces (" *   ") whose text starts with `make `, `mpirun ` or an assignment NAME=value (as in
`STEPS=10 make lab-05`); the command is that text up to the first gap of two spaces, the explanation after it. Lines
indented deeper continue an explanation; other lines (env: ..., prose) are not commands. The explanation may start
with `long:` (too long for the check: syntax-checked only, as ```sh long) or `fails:` (must be refused, as ```sh
fails); any other command is run as ```sh's are. A header must show at least one command, the first being its own
`make lab-NN`; a command may not end in `...` (an abbreviation cannot be run) and must launch make or mpirun.

  tests/docs_commands.py list FILE...    one record per command, NUL-separated: kind, FILE:LINE, command
  tests/docs_commands.py lint FILE...    the pages' rules; prints each violation and exits 1 if any:
      every fence labelled as above; no `$ ` prompt in a command block; no run command that would start the checks
      (make check, tests/run_checks.sh) or `make clean`; lines within 120 columns outside ```text blocks (real
      output stays verbatim) and tables (a row cannot wrap); README.md within 200 lines; every relative link and
      image names a file or folder inside the repository; every script, lab, notebook or docs path a command names
      exists.
"""
import os
import re
import sys

RUN_KINDS = {"sh", "sh fails"}
SYNTAX_KINDS = {"sh long", "sh gpu", "sh net", "sh check"}
ENV_KIND = "sh env"
EXPORT_LINE = re.compile(r"^export((?: [A-Za-z_][A-Za-z0-9_]*=[^\s#'\"$`]*)+)\s*(?:#.*)?$")
OTHER_LANGUAGES = {"text", "c", "python", "json"}
MAX_COLUMNS = 120
README_MAX_LINES = 200
ROOT = os.path.realpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def fences(path):
    """Yields (info, first_line_number, lines) for each fenced block of the page; lines are (number, text)."""
    info, start, body = None, 0, []
    with open(path, encoding="utf-8") as page:
        for number, line in enumerate(page, 1):
            line = line.rstrip("\n")
            if info is None:
                match = re.match(r"^```(.*)$", line)
                if match:
                    info, start, body = " ".join(match.group(1).split()), number, []
            elif line.strip() == "```":
                yield info, start, body
                info = None
            else:
                body.append((number, line))
    if info is not None:
        yield info, start, None  # never closed


def commands(body):
    """The commands of a block: (line number, text), continuation lines joined with their newlines."""
    found, pending, first = [], [], 0
    for number, line in body:
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if not pending:
            first = number
        pending.append(line)
        if line.rstrip().endswith("\\"):
            continue
        found.append((first, "\n".join(pending)))
        pending = []
    if pending:
        found.append((first, "\n".join(pending)))
    return found


def table_commands(path):
    """(line number, command) for each code span in the `run` column of the page's tables (outside fences)."""
    column, in_fence = None, False
    with open(path, encoding="utf-8") as page:
        lines = page.read().split("\n")
    for number, line in enumerate(lines, 1):
        if line.startswith("```"):
            in_fence = not in_fence
        if in_fence or not line.startswith("|"):
            column = None if not line.startswith("|") else column
            continue
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        following = lines[number] if number < len(lines) else ""
        if column is None and "run" in cells and re.match(r"^\|\s*:?-{3,}", following):
            column = cells.index("run")
        elif column is not None and not re.match(r"^\|\s*:?-{3,}", line) and column < len(cells):
            for span in re.findall(r"`([^`]+)`", cells[column]):
                yield number, span


HEADER_COMMAND = re.compile(r"^ \*   ((?:make |mpirun |[A-Za-z_][A-Za-z0-9_]*=)\S.*)$")
HEADER_KINDS = {"long:": "sh long", "fails:": "sh fails"}


def header_commands(path):
    """(kind, line number, command, problem or None) for each command of a lab header's "What to run" block."""
    found, inside = [], False
    with open(path, encoding="utf-8") as source:
        for number, line in enumerate(source, 1):
            line = line.rstrip("\n")
            if not inside:
                inside = line.startswith(" * What to run")
                continue
            if line.rstrip() in (" *", "*/", " */"):
                break
            match = HEADER_COMMAND.match(line)
            if not match:
                continue
            command, _, explanation = match.group(1).partition("  ")
            command, explanation = command.strip(), explanation.strip()
            kind = next((k for prefix, k in HEADER_KINDS.items() if explanation.startswith(prefix)), "sh")
            problem = None
            if command.endswith("...") or " ... " in command:
                problem = "an abbreviated command ('...') cannot be run: write it out"
            elif not re.search(r"(^|\s)(make|mpirun)\s", command + " "):
                problem = "a command of a lab header launches make or mpirun"
            found.append((kind, number, command, problem))
    return found


def header_problems(path):
    """The rules of a lab header's "What to run" block (see the module's docstring)."""
    problems, commands_found = [], header_commands(path)
    number = re.match(r"^(\d\d)_", os.path.basename(path))
    if not commands_found:
        problems.append((path, "no command in a ' * What to run' block (lines ' *   make lab-NN ...')"))
    elif number and not commands_found[0][2].startswith(f"make lab-{number.group(1)}"):
        problems.append((f"{path}:{commands_found[0][1]}", f"the first command is make lab-{number.group(1)} "
                         "(the form that works as root and on any number of cores)"))
    problems += [(f"{path}:{line}", problem) for _, line, _, problem in commands_found if problem]
    return problems


def command_blocks(path):
    """(kind, line number, command) in page order: the fenced blocks' commands and the tables' run columns."""
    if path.endswith(".c") or path.endswith(".h"):
        return [(kind, number, command) for kind, number, command, _ in header_commands(path)]
    found = []
    for info, start, body in fences(path):
        if body is not None and (info in RUN_KINDS or info in SYNTAX_KINDS or info == ENV_KIND):
            found += [(info, number, command) for number, command in commands(body)]
    found += [("sh", number, command) for number, command in table_commands(path)]
    return sorted(found, key=lambda record: record[1])


def list_commands(paths):
    out = sys.stdout.buffer
    for path in paths:
        for kind, number, command in command_blocks(path):
            if kind == ENV_KIND:  # the assignments alone: NAME=value ...
                match = EXPORT_LINE.match(command)
                command = match.group(1).strip() if match else ""
            for field in (kind, f"{path}:{number}", command):
                out.write(field.encode() + b"\0")


# Paths a command may name that must exist in the repository (build outputs are not among them: a check runs after
# `make`, but a page may show a build that is not made here, such as build/cuda/).
BUILD_OUTPUTS = ("trace/fsdptrace", "scripts/bench_model")  # and tests/bin/*
NAMED_PATH = re.compile(r"(?<![\w/.-])(?:\./)?((?:scripts|tests|notebooks|docs|trace)/[\w./-]+|lab/\d\d_\w+)")
STARTS_CHECKS = re.compile(r"\bmake\b[^#\n]*\b(check|clean)\b|tests/run_checks\.sh")


def lint_command(where, kind, command, problem):
    if command.startswith("$ "):
        problem(where, "a command block holds commands, not a '$ ' prompt (output goes in a text block)")
    if kind in RUN_KINDS and STARTS_CHECKS.search(command.split("#")[0]):
        problem(where, "the docs check would run this (the checks themselves, or a clean of the tree): "
                "show it as 'sh check' or 'sh long'")
    for named in NAMED_PATH.findall(command.split(" #")[0]):
        named = named.rstrip(".")
        candidates = [named, named + ".c"] if named.startswith("lab/") else [named]
        if not any(os.path.exists(os.path.join(ROOT, c)) for c in candidates) \
                and not (named.startswith("tests/bin/") or named in BUILD_OUTPUTS):
            problem(where, f"names {named}, which is not in the repository")


def lint_links(path, lines, problem):
    in_fence = False
    for number, line in enumerate(lines, 1):
        if line.startswith("```"):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        for target in re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue  # a web address, or an anchor on this page
            resolved = os.path.realpath(os.path.join(os.path.dirname(os.path.abspath(path)), target.split("#")[0]))
            if not (resolved == ROOT or resolved.startswith(ROOT + os.sep)):
                problem(f"{path}:{number}", f"link {target} leaves the repository")
            elif not os.path.exists(resolved):
                problem(f"{path}:{number}", f"link {target}: no such file")


def lint(paths):
    problems = []

    def problem(where, what):
        problems.append(f"{where}: {what}")

    for path in paths:
        if path.endswith(".c") or path.endswith(".h"):  # a lab's header: its commands (120 columns: check_layers)
            for where, what in header_problems(path):
                problem(where, what)
            for kind, number, command in command_blocks(path):
                lint_command(f"{path}:{number}", kind, command, problem)
            continue
        with open(path, encoding="utf-8") as page:
            lines = page.read().split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        if os.path.realpath(path) == os.path.join(ROOT, "README.md") and len(lines) > README_MAX_LINES:
            problem(path, f"{len(lines)} lines; README.md stays within {README_MAX_LINES} (the depth is in docs/)")
        text_lines = set()
        for info, start, body in fences(path):
            if body is None:
                problem(f"{path}:{start}", "a fence that is never closed")
            elif info == "text":
                text_lines.update(number for number, _ in body)
            elif info == ENV_KIND:
                for number, command in commands(body):
                    if not EXPORT_LINE.match(command):
                        problem(f"{path}:{number}", "an 'sh env' block holds only lines 'export NAME=value ...' "
                                "(plain values, an optional # comment)")
            elif info in RUN_KINDS or info in SYNTAX_KINDS:
                for number, command in commands(body):
                    lint_command(f"{path}:{number}", info, command, problem)
            elif info not in OTHER_LANGUAGES:
                problem(f"{path}:{start}", f"fence info '{info}' is none of: " + ", ".join(
                    sorted(RUN_KINDS | SYNTAX_KINDS | OTHER_LANGUAGES | {ENV_KIND})) + " (docs/checks.md)")
        for number, command in table_commands(path):
            lint_command(f"{path}:{number}", "sh", command, problem)
        for number, line in enumerate(lines, 1):
            if number not in text_lines and not line.startswith("|") and len(line) > MAX_COLUMNS:
                problem(f"{path}:{number}", f"{len(line)} columns (at most {MAX_COLUMNS} outside text blocks "
                        "and tables)")
        lint_links(path, lines, problem)
    for line in problems:
        print(line)
    print(f"{len(paths)} pages and headers, {len(problems)} problems")
    return 1 if problems else 0


def main(argv):
    if len(argv) < 3 or argv[1] not in ("list", "lint"):
        print(__doc__, file=sys.stderr)
        return 2
    if argv[1] == "list":
        list_commands(argv[2:])
        return 0
    return lint(argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
