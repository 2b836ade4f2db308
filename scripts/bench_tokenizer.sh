#!/usr/bin/env bash
# Qwen2's tokenizer on one thread: core/data/tokenizer.c (through tests/bin/tokenize_tool) vs HF `tokenizers` built from
# the same qwen.tiktoken (tests/check_tokenizer_parity.py's construction), encoding the same text. Prints both rates
# in tokens/s and ours / HF. Ours encodes the text whole, repeatedly for about SECONDS, its pre-token cache warm
# after the first pass. HF is timed two ways, caches warm likewise: the text whole (encode: slow on one string of
# megabytes, offsets and all), and its lines through encode_batch_fast (no offsets; RAYON_NUM_THREADS=1 keeps the
# batch on one thread); the ratio is against the faster of the two.
#
# Usage: scripts/bench_tokenizer.sh [TEXT_FILE] [SECONDS]
#        (default text: 9000 generated stories, data_generate_stories, about 4 MB; SECONDS default 5)
# Needs the vocabulary ($QWEN2_TOKENIZER or data/qwen2/qwen.tiktoken: scripts/get_qwen2_tokenizer.sh) and `make`.
set -euo pipefail
cd "$(dirname "$0")/.."
vocab=${QWEN2_TOKENIZER:-data/qwen2/qwen.tiktoken}
seconds=${2:-5}
tool=tests/bin/tokenize_tool
[ -x "$tool" ] || { echo "bench_tokenizer: $tool missing: run make first" >&2; exit 1; }
[ -f "$vocab" ] || { echo "bench_tokenizer: no vocabulary at $vocab (scripts/get_qwen2_tokenizer.sh)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
text=${1:-}
if [ -z "$text" ]; then
  text=$work/stories.txt
  "$tool" stories 9000 > "$text"
fi
export RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=1
ours=$("$tool" --vocab "$vocab" bench "$text" "$seconds")
python3 - "$vocab" "$text" "$seconds" "$ours" <<'PY'
import os, sys, time
sys.path.insert(0, "tests")
from check_tokenizer_parity import hf_tokenizer, read_ranks
vocab, path, seconds, ours = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4].split()
tokenizer, _ = hf_tokenizer(read_ranks(vocab))
text = open(path, encoding="utf-8").read()
lines = text.splitlines(keepends=True)


def rate(encode):
    tokens = elapsed = 0
    while elapsed == 0 or elapsed < seconds / 2:
        start = time.perf_counter()
        tokens += encode()
        elapsed += time.perf_counter() - start
    return tokens / elapsed, tokens, elapsed


whole = rate(lambda: len(tokenizer.encode(text, add_special_tokens=False).ids))
batch = rate(lambda: sum(len(e.ids) for e in tokenizer.encode_batch_fast(lines, add_special_tokens=False)))
ours_tokens, ours_rate = int(ours[1]), float(ours[7])
print(f"text: {path} ({os.path.getsize(path)} bytes, {len(lines)} lines)")
print(f"ours (core/data/tokenizer.c), whole text:        {ours_rate:12,.0f} tokens/s  "
      f"({ours_tokens} tokens in {ours[5]} s)")
print(f"HF tokenizers, 1 thread, whole text:        {whole[0]:12,.0f} tokens/s  "
      f"({whole[1]} tokens in {whole[2]:.3f} s)")
print(f"HF tokenizers, 1 thread, encode_batch_fast: {batch[0]:12,.0f} tokens/s  "
      f"({batch[1]} tokens in {batch[2]:.3f} s)")
print(f"ours / HF (the faster): {ours_rate / max(whole[0], batch[0]):.2f}x")
PY
