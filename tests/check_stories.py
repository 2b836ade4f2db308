#!/usr/bin/env python3
"""TinyStories text as the seed's pipeline sees it: our token files and lab 05's loader against HF `tokenizers`.

The seed's pipeline reads the dataset's text file (TinyStoriesV2-GPT4-*.txt: stories between "<|endoftext|>" lines)
as the dataset's own loader does, in Python: the file read as text (universal newlines), split at "<|endoftext|>",
each story .strip()'d, empty ones dropped. It tokenizes each story alone (HF tokenizers, Qwen2's vocabulary) and puts
<|endoftext|> (151643) between stories. This check writes a sample in the dataset's format, with no network: the
generated stories (tokenize_tool stories) laid out as the dataset's file, with spaces, tabs, blank lines, CRLF and
Unicode spaces around stories and separators, plus hand-written edge cases (the file starting with a space as
TinyStoriesV2-GPT4-valid.txt's first story does, inner blank lines, CRLF and a lone CR, a separator inside a line,
empty and blank pieces, Unicode spaces at the edges, decomposed accents, emoji and CJK). Then it wants, story by
story, edges included, the ids the seed's pipeline makes, from both of our paths:
  - the token file scripts/prepare_tinystories.sh writes (tokenize_tool write-tokens), and
  - the stream lab 05's loader holds after reading the text (DATA=<text>; tokenize_tool load-text dumps it).
--tokenizer qwen2 (the default) compares with HF tokenizers built from qwen.tiktoken (tests/check_tokenizer_parity.py
builds it); --tokenizer bytes with the stories' UTF-8 bytes, DATA_EOT (256) between them (TOKENIZER=bytes, the tiny
model), and also on 20,000 random pieces (separators whole and cut, whitespace of every kind, CR, bytes that are not
UTF-8: Python reads them as surrogate escapes, never stripped) against Python's own split and strip. Exit 0 when
every story's ids are equal on both paths, 1 otherwise, 77 ("skipped: ...") for qwen2 without the vocabulary or the
tokenizers package.

  tests/check_stories.py --dir DIR [--tokenizer qwen2|bytes] [--vocab PATH] [--stories N] [--seed S]
DIR receives sample.txt (lab 05 trains on it in tests/suites/tokenizer.sh), the token files and the loader's ids.
"""
import argparse
import os
import random
import struct
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(REPO, "tests/bin/tokenize_tool")
MARKER = "<|endoftext|>"

# Edge cases, each as it stands in the file between two separators (the first opens the file).
EDGE_CASES = [
    " Spot. Spot saw the shiny car and said, \"Wow, Kitty, your car is so bright and clean!\"\n",
    "Tom had a red ball.\n\n\nHe threw it high.\n \n\tThe end.\n\n",
    "\r\nAnna ran to the park.\r\nShe jumped in a puddle.\r\n\r\nThe end.\r\n",
    "Old Mac had a farm.\rHe had a cow.\r",
    "\u00a0\u3000Mia smiled at the sun.\u2003\u00a0\n",
    "\x1fBen hid under the bed.\x1c \u0085",
    "The cafe\u0301 was small. Zoe\u0308 liked it.   \nShe sang.   \n",
    "Lily saw a \U0001F436 and said \u4f60\u597d. \"Hi!\" it barked.\n",
    "  Short.",
]
SPACES = ["", "", "", " ", "  ", "\n", "\n\n", "\t", " \n", "\n \n", "\u00a0", "\u3000 "]


def skip(reason):
    print(f"skipped: {reason}")
    sys.exit(77)


def run(command, env=None):
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=env)
    if result.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({result.returncode}):\n{result.stdout}{result.stderr}")
    return result.stdout


def write_sample(path, count, seed):
    """The generated stories in the dataset's layout, the edge cases among them; returns the file's text."""
    generated = [story.strip() for story in run([TOOL, "stories", str(count), str(seed)]).split(MARKER)]
    generated = [story for story in generated if story]
    rng = random.Random(seed)
    pieces = [EDGE_CASES[0]]
    edges = iter(EDGE_CASES[1:])
    for i, story in enumerate(generated):
        if i % 20 == 10:
            pieces.append(next(edges, ""))
        if i % 25 == 3:
            pieces.append(rng.choice(["", "\n", "  \n\t"]))  # an empty or blank piece: no story
        piece = rng.choice(SPACES) + story + rng.choice(SPACES)
        if rng.random() < 0.1:
            piece = piece.replace("\n", "\r\n")
        pieces.append(piece)
    pieces.extend(edges)
    text = ""
    for i, piece in enumerate(pieces):
        if i > 0:
            text += rng.choice([f"\n{MARKER}\n", f"\n{MARKER}\n", f"\r\n{MARKER}\r\n", f"{MARKER}", f"\n{MARKER}"])
        text += piece
    text += rng.choice(["", "\n", "\n\n  "])
    with open(path, "w", encoding="utf-8", newline="") as file:
        file.write(text)
    return text


# Random text's pieces (--tokenizer bytes): separators whole and cut, every kind of whitespace Python strips and
# some it does not, CR and CRLF, UTF-8 and bytes Python's decoder refuses (kept as surrogate escapes: never stripped).
RANDOM_PIECES = [b" ", b"  ", b"\t", b"\n", b"\r", b"\r\n", b"\x0b", b"\x0c", b"\x1c", b"\x1f", MARKER.encode(),
                 MARKER.encode(), b"<|endof", b"text|>", b"<", b"a", b"Tom ran.", b"\xc3\xa9", b"\xc2\xa0", b"\xc2\x85",
                 "\u3000".encode(), "\u2003".encode(), "\u2028".encode(), "\u200b".encode(), "\ufeff".encode(),
                 b"\xff", b"\x80", b"\xe3\x80", b"\xc0\xa0", b"\xed\xa0\x80", b"\x00"]


def write_random(path, seed):
    rng = random.Random(seed)
    data = b"".join(rng.choice(RANDOM_PIECES) for _ in range(20000))
    with open(path, "wb") as file:
        file.write(data)


def dataset_stories(path, errors="strict"):
    """The dataset's own loader: text mode (universal newlines), split at the separator, strip, drop the empty."""
    with open(path, encoding="utf-8", errors=errors) as file:
        text = file.read()
    return [story.strip() for story in text.split(MARKER) if story.strip()]


def read_token_file(path):
    with open(path, "rb") as file:
        data = file.read()
    magic, version, width, count = struct.unpack("<8sIIQ", data[:24])
    assert magic == b"FSDPTOKS" and version == 1 and len(data) == 24 + count * width, (path, magic, version, width)
    return list(struct.unpack(f"<{count}{'H' if width == 2 else 'I'}", data[24:]))


def read_ids(path):
    with open(path) as file:
        return [int(i) for i in file.read().split()]


def split_at(ids, eot):
    stories, current = [], []
    for i in ids:
        if i == eot:
            stories.append(current)
            current = []
        else:
            current.append(i)
    return stories + [current]


def compare(name, ids, expected_stories, texts, eot):
    """Story by story: the stream's stories (split at eot) against the expected ids of each stripped story."""
    got = split_at(ids, eot)
    bad = [k for k in range(min(len(got), len(expected_stories))) if got[k] != expected_stories[k]]
    edges = sum(1 for k in range(min(len(got), len(expected_stories)))
                if got[k][:1] == expected_stories[k][:1] and got[k][-1:] == expected_stories[k][-1:])
    ok = not bad and len(got) == len(expected_stories)
    print(f"{name}: {len(ids)} ids, {len(got)} stories; {len(expected_stories) - len(bad)}/{len(expected_stories)} "
          f"equal, first and last ids equal in {edges}: {'OK' if ok else 'NOT OK'}")
    if len(got) != len(expected_stories):
        print(f"  {len(got)} stories where the dataset has {len(expected_stories)}")
    for k in bad[:5]:
        print(f"  story {k} {texts[k][:60]!r}...{texts[k][-30:]!r}\n    ours starts {got[k][:6]} ends {got[k][-6:]}\n"
              f"    want starts {expected_stories[k][:6]} ends {expected_stories[k][-6:]}")
    return ok


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", required=True)
    parser.add_argument("--tokenizer", choices=["qwen2", "bytes"], default="qwen2")
    parser.add_argument("--vocab", default=os.environ.get("QWEN2_TOKENIZER") or
                        os.path.join(REPO, "data/qwen2/qwen.tiktoken"))
    parser.add_argument("--stories", type=int, default=240)
    parser.add_argument("--seed", type=int, default=34)
    args = parser.parse_args()
    qwen2 = args.tokenizer == "qwen2"
    if qwen2 and not os.path.isfile(args.vocab):
        skip(f"no Qwen2 vocabulary at {args.vocab} (scripts/get_qwen2_tokenizer.sh fetches it)")
    if qwen2:
        try:
            import tokenizers  # noqa: F401
        except ImportError:
            skip("the Python package tokenizers is not installed")
    os.makedirs(args.dir, exist_ok=True)
    sample = os.path.join(args.dir, "sample.txt")
    write_sample(sample, args.stories, args.seed)
    texts = dataset_stories(sample)
    assert texts[0].startswith("Spot.") and len(texts) == args.stories + len(EDGE_CASES), len(texts)

    if qwen2:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from check_tokenizer_parity import hf_tokenizer, read_ranks
        hf, _ = hf_tokenizer(read_ranks(args.vocab))
        eot = hf.token_to_id(MARKER)
        expected = [encoding.ids for encoding in hf.encode_batch(texts, add_special_tokens=False)]
        source = f"HF tokenizers from {args.vocab}"
    else:
        eot = 256
        expected = [list(text.encode("utf-8")) for text in texts]
        source = "the stories' UTF-8 bytes"
    tokens = sum(len(ids) for ids in expected) + len(expected) - 1
    print(f"{sample}: {len(texts)} stories as the dataset's loader gives them ({len(EDGE_CASES)} hand-written edge "
          f"cases among them), {tokens} ids by {source}, {eot} between stories")

    env = dict(os.environ, OUT=os.path.join(args.dir, "load_text_run"))
    bin_path = os.path.join(args.dir, f"{args.tokenizer}.bin")
    ids_path = os.path.join(args.dir, f"{args.tokenizer}.ids")
    env["TOKENIZER"] = "bytes" if not qwen2 else "qwen2"
    if qwen2:
        env["QWEN2_TOKENIZER"] = args.vocab
    print(run(["scripts/prepare_tinystories.sh", sample, bin_path], env).strip())
    vocab = ["--vocab", "bytes" if not qwen2 else args.vocab]
    run([TOOL, *vocab, "load-text", sample, ids_path], env)
    ok = compare("token file (scripts/prepare_tinystories.sh)", read_token_file(bin_path), expected, texts, eot)
    ok &= compare("lab 05's loader (DATA=<text>, tokenize_tool load-text)", read_ids(ids_path), expected, texts, eot)
    if not qwen2:  # random bytes (Qwen2's tokenizer refuses invalid UTF-8): the split alone, against Python's
        random_path = os.path.join(args.dir, "random.txt")
        write_random(random_path, args.seed)
        random_texts = dataset_stories(random_path, errors="surrogateescape")
        random_expected = [list(text.encode("utf-8", errors="surrogateescape")) for text in random_texts]
        random_bin = os.path.join(args.dir, "random.bin")
        run([TOOL, "--vocab", "bytes", "write-tokens", random_path, random_bin], env)
        ok &= compare(f"random bytes ({len(random_texts)} stories, Python's split and strip)",
                      read_token_file(random_bin), random_expected, random_texts, eot)
    print("OK" if ok else "NOT OK")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
