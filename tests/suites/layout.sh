# The source tree's shape (tests/check_layers.py reads it from the files): core/'s floors include only downward, no
# circle of modules, no FSDPLAB_CUDA outside the CUDA plug-in, no line over 120 columns.
layout_check="the source tree: floors include downward, no circle of modules, the plug-in alone compiled for CUDA,"
layout_check+=" 120 columns"
check "$layout_check" \
  python3 tests/check_layers.py
# The planted mutations (tests/mutations.sh: proof that the lab checks can fail) still apply to the code they target:
# one whose text the code no longer has would prove nothing, silently.
check "tests/mutations.sh: every planted mutation still applies to the code it targets" tests/mutations.sh --applies
# ... and docs/checks.md's table lists each of them, so a reader sees every bug the checks are proven to catch (21 had
# gone unlisted before this check).
check "docs/checks.md's mutation table lists every planted mutation" \
  bash -c 'missing=0
    for name in $(sed -n "/^mutations=(/,/^)/p" tests/mutations.sh | grep -o "^  \"[a-z0-9-]*|" | tr -d " \"|"); do
      grep -q "^| \`$name\` |" docs/checks.md || { echo "not in docs/checks.md: $name"; missing=1; }
    done
    exit $missing'
