#!/usr/bin/env bash
# Fetches Qwen2's vocabulary, qwen.tiktoken (151,643 byte-level BPE tokens as "base64token rank" lines, the ranks
# Qwen2's tokenizer.json merges by), into data/qwen2/qwen.tiktoken, for core/data/tokenizer.c and its checks.
#
# Source: PyPI only (no Hugging Face hub needed): the wheel of dashscope 2.0.2 ships it as
# dashscope/resources/qwen.tiktoken. The file is Qwen's, released under the Apache License 2.0 (as the dashscope
# package is); it is downloaded, never committed (data/ is in .gitignore).
#
# Usage: scripts/get_qwen2_tokenizer.sh [DEST]     (default data/qwen2/qwen.tiktoken beside this script's repo)
# Idempotent: a file already there with the expected sha256 is kept. Exits non-zero with the reason when the file
# cannot be fetched (no network, pip missing, a wheel without the file, a different hash).
set -euo pipefail

expected_sha256=b2b1b8dfb5cc5f024bafc373121c6aba3f66f9a5a0269e243470a1de16a33186
expected_bytes=2561218
repo=$(cd "$(dirname "$0")/.." && pwd)
dest=${1:-$repo/data/qwen2/qwen.tiktoken}

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

if [ -f "$dest" ] && [ "$(sha256_of "$dest")" = "$expected_sha256" ]; then
  echo "get_qwen2_tokenizer: $dest present (sha256 matches)"
  exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "get_qwen2_tokenizer: downloading dashscope==2.0.2 (wheel, no dependencies) from PyPI"
if ! python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$work" dashscope==2.0.2 >"$work/pip.log" 2>&1
then
  cat "$work/pip.log" >&2
  echo "get_qwen2_tokenizer: cannot download dashscope==2.0.2 from PyPI (network, or pip missing);" \
    "$dest not fetched" >&2
  exit 1
fi
wheel=$(ls "$work"/dashscope-2.0.2-*.whl 2>/dev/null | head -n1)
if [ -z "$wheel" ]; then
  echo "get_qwen2_tokenizer: pip download left no dashscope-2.0.2 wheel in $work" >&2
  exit 1
fi
if ! python3 - "$wheel" "$work/qwen.tiktoken" <<'PY'
import sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as archive:
    try:
        data = archive.read("dashscope/resources/qwen.tiktoken")
    except KeyError:
        sys.exit(f"get_qwen2_tokenizer: {wheel} holds no dashscope/resources/qwen.tiktoken")
open(out, "wb").write(data)
PY
then
  exit 1
fi
actual=$(sha256_of "$work/qwen.tiktoken")
if [ "$actual" != "$expected_sha256" ]; then
  echo "get_qwen2_tokenizer: qwen.tiktoken from $wheel has sha256 $actual" \
    "($(stat -c %s "$work/qwen.tiktoken") bytes), expected $expected_sha256 ($expected_bytes bytes); not installed" >&2
  exit 1
fi
mkdir -p "$(dirname "$dest")"
mv "$work/qwen.tiktoken" "$dest.tmp"
mv "$dest.tmp" "$dest"
echo "get_qwen2_tokenizer: $dest ($expected_bytes bytes, sha256 ok)"
