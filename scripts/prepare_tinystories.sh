#!/usr/bin/env bash
# TinyStories as the PyTorch script that scripts/train.sh mirrors trains on it, as a token file lab 05 reads
# (DATA=<file>.bin): each story as the dataset gives it (the text split at "<|endoftext|>", each story stripped of the
# whitespace around it, inner newlines kept, empty ones dropped; core/data/data.h: data_story_next), tokenized alone by
# Qwen2's tokenizer (core/data/tokenizer.h; the ids Qwen2-0.5B was trained with), <|endoftext|> (151643) between
# stories: that script's ids, story by story (tests/check_stories.py checks them against HF tokenizers). Lab 05's
# DATA=<TEXT> reads the text the same way.
#
#   scripts/prepare_tinystories.sh TEXT [OUT.bin]     a local TinyStories text file (the dataset's own format: stories
#                                                     separated by "<|endoftext|>" lines) -> OUT.bin (default:
#                                                     TEXT with .bin for its extension)
#   scripts/prepare_tinystories.sh --fetch [OUT.bin]  first downloads TinyStoriesV2-GPT4-valid.txt (about 22 MB) from
#                                                     the dataset's page on the Hugging Face hub,
#                                                     https://huggingface.co/datasets/roneneldan/TinyStories
#                                                     (TinyStoriesV2-GPT4-train.txt is the 2 GB training split:
#                                                     download it yourself and pass it as TEXT) into data/tinystories/
#   TOKENIZER=bytes scripts/prepare_tinystories.sh TEXT   byte ids instead (<|endoftext|> as 256), for MODEL=tiny
#
# Then: DATA=data/tinystories/TinyStoriesV2-GPT4-valid.bin MODEL=qwen2-0.5b mpirun -np 2 lab/05_full_step
# (lab 05 also reads the text file itself, DATA=<TEXT>, tokenizing it on every rank at start; the token file skips
# that, and the 2 GB split needs it). The vocabulary comes from scripts/get_qwen2_tokenizer.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

URL=https://huggingface.co/datasets/roneneldan/TinyStories/resolve/main/TinyStoriesV2-GPT4-valid.txt
text=${1:-}
if [ -z "$text" ]; then
  sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
if [ "$text" = --fetch ]; then
  mkdir -p data/tinystories
  text=data/tinystories/TinyStoriesV2-GPT4-valid.txt
  if [ ! -s "$text" ]; then
    echo "prepare_tinystories: downloading $URL" >&2
    if ! curl -fL --retry 2 -o "$text.tmp" "$URL"; then
      rm -f "$text.tmp"
      echo "prepare_tinystories: cannot download $URL (no network here?); download it elsewhere and pass its path" >&2
      exit 1
    fi
    mv "$text.tmp" "$text"
  fi
fi
if [ ! -f "$text" ]; then
  echo "prepare_tinystories: TEXT='$text' is not a file" >&2
  exit 2
fi
out=${2:-${text%.*}.bin}
vocab=()
case "${TOKENIZER:-qwen2}" in
  bytes) vocab=(--vocab bytes) ;;
  qwen2) scripts/get_qwen2_tokenizer.sh >&2 ;;
  *) vocab=(--vocab "$TOKENIZER") ;;
esac
make -s tests/bin/tokenize_tool >&2
tests/bin/tokenize_tool "${vocab[@]}" write-tokens "$text" "$out"
