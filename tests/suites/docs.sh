# The docs check: every command README.md, docs/*.md and the labs' headers show, run as a learner types it, as the
# notebooks are run.
# The pages' fences say what each block is (tests/docs_commands.py, docs/checks.md "The docs check"):
#   ```sh        run here, from the repository root, one check per command; it must exit 0
#   ```sh fails  run here; it must be refused (exit non-zero within the timeout, with a message)
#   ```sh env    `export NAME=value` lines for the learner's shell (README.md's setup for root): every command of
#                every page runs with them, as in the shell of a learner who typed them
#   ```sh long, ```sh gpu, ```sh net, ```sh check    listed and syntax-checked (bash -n) only: too long for a check,
#                a GPU, the network, or the checks themselves (`make check` runs this suite)
#   and a table column headed `run`: each code span in it is a command, run as ```sh's are
# Each page's commands run in order in a sandbox of their own, runs/check/docs/<page>/: a copy of the repository root
# made of links to every entry but runs/, so a command writes its runs/ there, not over the learner's, and a page
# cannot lean on another page's runs. The environment is the learner's shell: the settings docs/reference.md lists
# are unset (a value left over from the checks would change what runs), as are make's own variables; then two
# settings keep the suite short: STEPS=2 (the labs train 2 steps, unless the command sets STEPS itself) and
# INIT_MODELS=tiny (lab 09 builds tiny alone, not qwen2-0.5b's 3 GB per rank). About 3 minutes on 2 cores.
# The labs' headers too: the commands of each lab/NN_name.c's "What to run" block (lines " *   make lab-NN ...",
# " *   mpirun ...", " *   NAME=value make ...", up to the two-space gap before the explanation; an explanation
# starting "long:" is syntax-checked only, "fails:" must be refused), run as a ```sh block's, with the same settings.
DOCS_PAGES=(README.md $(find docs -name '*.md' | LC_ALL=C sort) $(ls lab/[0-9][0-9]_*.c | LC_ALL=C sort))
check "docs: fences labelled, commands and links name files in the repository, 120 columns, README within 200 lines" \
  python3 tests/docs_commands.py lint "${DOCS_PAGES[@]}"

DOCS_SETTINGS=(STEPS=2 INIT_MODELS=tiny)
docs_unset=(-u MAKEFLAGS -u MAKELEVEL -u MFLAGS -u MPIRUN)
for name in $(awk -F'|' '/^\| `[A-Z]/ {print $2}' docs/reference.md | grep -oE '`[A-Z][A-Z0-9_]*`' | tr -d '`'); do
  docs_unset+=(-u "$name")
done

# docs_sandbox DIR: DIR becomes the repository root again, by links, with an empty runs/ of its own.
docs_sandbox() {
  local dir=$1 entry
  rm -rf "$dir" && mkdir -p "$dir/runs"
  for entry in * .[!.]*; do
    case $entry in runs | .git) continue ;; esac
    [ -e "$entry" ] && ln -s "$PWD/$entry" "$dir/$entry"
  done
}

mapfile -d '' docs_records < <(python3 tests/docs_commands.py list "${DOCS_PAGES[@]}")
# The learner's shell setup first: every `sh env` block's assignments, for every command of every page.
for ((i = 0; i + 2 < ${#docs_records[@]}; i += 3)); do
  [ "${docs_records[i]}" = "sh env" ] && read -r -a assignments <<<"${docs_records[i + 2]}" &&
    DOCS_SETTINGS=("${assignments[@]}" "${DOCS_SETTINGS[@]}")
done
# Without torch (FSDPLAB_NO_PYTHON_DEPS=1) the commands that launch PyTorch FSDP are skipped, as the parity checks are.
docs_have_torch=$(python3 -c 'import torch, transformers' >/dev/null 2>&1 && echo 1 || echo 0)
declare -A docs_sandboxes=()
for ((i = 0; i + 2 < ${#docs_records[@]}; i += 3)); do
  kind=${docs_records[i]} where=${docs_records[i + 1]} command=${docs_records[i + 2]}
  page=${where%:*}
  sandbox=runs/check/docs/$(printf '%s' "${page%.md}" | tr '/.' '__')
  if [ -z "${docs_sandboxes[$page]:-}" ]; then
    docs_sandbox "$sandbox"
    docs_sandboxes[$page]=1
  fi
  shown=$(printf '%s' "$command" | tr '\n' ' ' | tr -s ' ' | cut -c1-100)
  if [ "$kind" = sh ] && [ "$docs_have_torch" = 0 ] && [[ "$command" =~ FSDP=(torch|both) ]]; then
    check "docs $where: $shown" bash -c 'echo "skipped: torch and transformers are not installed"; exit 77'
    continue
  fi
  case $kind in
    sh) check "docs $where: $shown" env -C "$sandbox" "${docs_unset[@]}" "${DOCS_SETTINGS[@]}" bash -c "$command" ;;
    "sh env") check "docs $where (shell setup, in every command's environment): $shown" test -n "$command" ;;
    "sh fails") check_fails "docs $where, refused: $shown" . \
      env -C "$sandbox" "${docs_unset[@]}" "${DOCS_SETTINGS[@]}" bash -c "$command" ;;
    *) check "docs $where (${kind#sh }: syntax only): $shown" bash -n -c "$command" ;;
  esac
done
check "docs: the pages show commands (${#docs_records[@]} fields read)" test $((${#docs_records[@]} / 3)) -ge 20
docs_header_commands=$(printf '%s\n' "${docs_records[@]}" | grep -c '^lab/[0-9][0-9]_.*\.c:[0-9]*$')
check "docs: every lab's header shows commands ($docs_header_commands read)" test "$docs_header_commands" -ge 18
