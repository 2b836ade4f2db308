#!/usr/bin/env python3
"""Qwen2's tokenizer, core/data/tokenizer.c vs HF `tokenizers`, both built from the SAME qwen.tiktoken.

The HF side is Qwen2's tokenizer.json rebuilt from the ranks: vocab = each token's byte-level (GPT-2 table) string
with its rank as id; merges recovered from the ranks as HF's tiktoken converter does (for each token of 2+ bytes, run
BPE on its own bytes with only lower-ranked merges; the two parts it stops at are the token's merge), ordered by the
merged token's rank; NFC normaliser; Split(Qwen2's pattern, isolated) + ByteLevel(no prefix space, no regex);
ByteLevel decoder; <|endoftext|> <|im_start|> <|im_end|> as special added tokens (151643..151645).

Checks, each printing its counts:
  1. ids equal on a fixed corpus (stories, punctuation and digit runs, contractions in any case, whitespace runs,
     tabs, CJK, emoji with ZWJ, combining marks, Arabic, special tokens inline), read through each of our loaders:
     qwen.tiktoken, the rebuilt tokenizer.json, and vocab.json + merges.txt;
  2. ids equal on --random (default 2000) random strings from a fixed seed: ASCII, whitespace, code points of
     several scripts;
  3. decode(encode(x)) == NFC(x) for all of them, ours and HF's.
Exit 0 when all hold, 1 otherwise, 77 ("skipped: ...") without the vocabulary file or the tokenizers package.

  tests/check_tokenizer_parity.py [--vocab PATH] [--tool tests/bin/tokenize_tool] [--random N] [--seed S]
"""
import argparse
import base64
import os
import random
import subprocess
import sys
import tempfile
import unicodedata

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"""
           r"""\s+(?!\S)|\s+""")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def skip(reason):
    print(f"skipped: {reason}")
    sys.exit(77)


def byte_to_unicode():
    """GPT-2's table: printable Latin-1 bytes stand for themselves, the others become 256, 257, ... in order."""
    printable = set(range(ord("!"), ord("~") + 1)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    table, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            table[byte] = chr(byte)
        else:
            table[byte] = chr(256 + extra)
            extra += 1
    return table


def read_ranks(path):
    ranks = {}
    with open(path, "rb") as file:
        for line in file:
            if line.strip():
                token, rank = line.split()
                ranks[base64.b64decode(token)] = int(rank)
    return ranks


def recover_merges(ranks):
    """(rank, left, right) for each token BPE can make: its own bytes merged with lower-ranked merges only."""
    merges = []
    for token, rank in ranks.items():
        if len(token) < 2:
            continue
        parts = [bytes([b]) for b in token]
        while len(parts) > 2:
            best = None
            for i in range(len(parts) - 1):
                pair_rank = ranks.get(parts[i] + parts[i + 1])
                if pair_rank is not None and pair_rank < rank and (best is None or pair_rank < best[0]):
                    best = (pair_rank, i)
            if best is None:
                break
            i = best[1]
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        if len(parts) == 2:
            merges.append((rank, parts[0], parts[1]))
    merges.sort()
    return merges


def hf_tokenizer(ranks):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    table = byte_to_unicode()
    as_text = lambda token: "".join(table[b] for b in token)  # noqa: E731
    vocab = {as_text(token): rank for token, rank in ranks.items()}
    merges = [(as_text(left), as_text(right)) for _, left, right in recover_merges(ranks)]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=False))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(text, special=True, normalized=False) for text in SPECIALS])
    first = max(ranks.values()) + 1
    for i, text in enumerate(SPECIALS):
        assert tokenizer.token_to_id(text) == first + i, (text, tokenizer.token_to_id(text))
    return tokenizer, len(merges)


def fixed_corpus():
    stories = (
        "Once upon a time, there was a little girl named Lily. She loved to play outside in the sunshine.\n"
        "One day, she saw a big, red ball in the park. \"Can I play with it?\" she asked her mom.\n\n"
        "Her mom smiled and said, \"Yes, you can!\" Lily was very happy. The end.")
    return [
        stories,
        stories + "\n<|endoftext|>\n" + stories.upper(),
        "Hello world", " Hello", "  two spaces", "trailing   ", "\n", "\r\n", "a\r\nb\rc\n\nd",
        "!!!??? ... ,,, ;;; --- *** ((( ))) [[]] {{}} ~~~ @@@ ### $$$ %%% ^^^ &&& ||| \\\\ // <<>> ''' \"\"\"",
        "..\n\n!!\r\n", "x ... y!!!\n\nz", "-->", "  --  ", "a+b=c; d*e/f",
        "1234567890 3.14159 1,000,000 2024-06-01 ½ ² ٣ ৪ 四 Ⅻ",
        "I'm you're he's we've they'll I'd can't", "I'M YOU'RE HE'S WE'VE THEY'LL I'D CAN'T",
        "You'Re We'Ve They'Ll I'D She'S Don'T", "I'MPORTANT HE'SAID YOU'REALLY WE'VERY I'DO IT'LLAMA 'Tis",
        "'s's 'S'S ''s 's' x'sy", "it's 100's of 'em",
        "spaces      between\t\ttabs \t mixed \n  \n   \n", "\t\t\tindent\n\t\tdedent", "   ", "\t", " \n \n ",
        "a\u00a0b\u2003c\u3000d\u2028e\u0085f",
        "中文分词测试：你好，世界！我们今天去公园玩。", "日本語のテキスト、カタカナとひらがな。", "한국어 문장입니다.",
        "emoji 😀😃😄 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️ 🇩🇪🇯🇵", "keycaps 1️⃣ #️⃣",
        "combining: e\u0301 a\u0308 n\u0303 o\u0302\u0323 \u1e9b\u0323 A\u030a \u212b \u0041\u0300",
        "مرحبا بالعالم! هذا نص عربي ١٢٣", "עברית: שלום עולם", "Ελληνικά: Γειά σου Κόσμε", "Русский текст, ёЁ.",
        "हिन्दी पाठ", "ไทย ภาษา", "Ünïcödé çàfé naïve résumé Straße ǅ ǈ ﬁ ﬃ",
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n",
        "<|endoftext|><|endoftext|>x<|im_end|>", "<|endoftext", "<|im_start |>", "a<|endoftext|>b",
        "code: def f(x):\n    return x ** 2  # square\n\nprint(f(3))\n",
        "URL https://example.com/path?q=1&r=2#frag email a.b@c.de",
        "mixed123abc456 abc123 123abc a1b2c3", "\u200b\u200c\u200d\ufeff zero widths",
        "x" * 300, " " * 300, "ab" * 200, "\n" * 50, "!" * 100, "é" * 100,
    ]


def random_strings(count, seed):
    rng = random.Random(seed)
    ranges = [(0x20, 0x7E), (0xA0, 0xFF), (0x100, 0x17E), (0x370, 0x3FF), (0x400, 0x4FF), (0x590, 0x5FF),
              (0x600, 0x6FF), (0x900, 0x97F), (0xE00, 0xE7F), (0x300, 0x36F), (0x3040, 0x30FF), (0x4E00, 0x9FFF),
              (0xAC00, 0xD7A3), (0x1F300, 0x1F64F), (0x1F900, 0x1F9FF), (0x2000, 0x206F), (0xFF00, 0xFFEF)]
    words = ["the", "The", "THE", " and", "'s", "'S", "'t", "'T", "'re", "'RE", "'Re", "'ve", "'m", "'M", "'ll",
             "'LL", "'d", "'D", "don't", "I'M", "You'Re", "<|endoftext|>", "<|im_start|>", "<|im_end|>", "123",
             "3.14", "...", "!!", "?!", "--", "\u200d", "\ufe0f", "👨‍👩‍👧"]
    whitespace = [" ", "  ", "\t", "\n", "\r\n", "\r", "\n\n", " \n", "\u00a0", "\u3000", "\u2003", "\x0b", "\x0c"]
    strings = []
    for _ in range(count):
        pieces = []
        for _ in range(rng.randint(1, 40)):
            kind = rng.random()
            if kind < 0.3:
                pieces.append("".join(rng.choice("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
                                      for _ in range(rng.randint(1, 10))))
            elif kind < 0.5:
                pieces.append(rng.choice(whitespace))
            elif kind < 0.6:
                pieces.append(rng.choice(words))
            elif kind < 0.7:
                pieces.append("".join(rng.choice("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
                                      for _ in range(rng.randint(1, 4))))
            else:
                low, high = rng.choice(ranges)
                pieces.append("".join(chr(rng.randint(low, high)) for _ in range(rng.randint(1, 6))))
        strings.append("".join(pieces))
    return strings


def run_tool(tool, vocab, command, payload):
    result = subprocess.run([tool, "--vocab", vocab, command], input=payload, capture_output=True)
    if result.returncode != 0:
        sys.exit(f"{tool} {command} failed: {result.stderr.decode(errors='replace')}")
    return result.stdout


def our_encode(tool, vocab, texts):
    payload = b"".join(b"%d\n%s" % (len(data), data) for data in (text.encode() for text in texts))
    lines = run_tool(tool, vocab, "encode-batch", payload).decode().split("\n")
    assert len(lines) == len(texts) + 1 and lines[-1] == "", (len(lines), len(texts))
    return [[int(i) for i in line.split()] for line in lines[:-1]]


def our_decode(tool, vocab, id_lists):
    out = run_tool(tool, vocab, "decode-batch", "".join(" ".join(map(str, ids)) + "\n" for ids in id_lists).encode())
    texts, at = [], 0
    while at < len(out):
        newline = out.index(b"\n", at)
        length = int(out[at:newline])
        texts.append(out[newline + 1:newline + 1 + length])
        at = newline + 1 + length
    return texts


def compare(name, texts, ours, hf):
    mismatches = [i for i in range(len(texts)) if ours[i] != hf[i]]
    print(f"{name}: {len(texts) - len(mismatches)}/{len(texts)} equal")
    for i in mismatches[:5]:
        first = next((k for k in range(min(len(ours[i]), len(hf[i]))) if ours[i][k] != hf[i][k]),
                     min(len(ours[i]), len(hf[i])))
        print(f"  text {texts[i]!r}\n    ours {ours[i][max(0, first - 3):first + 5]}  "
              f"hf {hf[i][max(0, first - 3):first + 5]} (at token {first})")
    return not mismatches


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--vocab", default=os.environ.get("QWEN2_TOKENIZER") or
                        os.path.join(REPO, "data/qwen2/qwen.tiktoken"))
    parser.add_argument("--tool", default=os.path.join(REPO, "tests/bin/tokenize_tool"))
    parser.add_argument("--random", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=16)
    args = parser.parse_args()
    if not os.path.isfile(args.vocab):
        skip(f"no Qwen2 vocabulary at {args.vocab} (scripts/get_qwen2_tokenizer.sh fetches it)")
    try:
        import tokenizers
    except ImportError:
        skip("the Python package tokenizers is not installed")

    ranks = read_ranks(args.vocab)
    hf, merge_count = hf_tokenizer(ranks)
    print(f"HF tokenizers {tokenizers.__version__}: {len(ranks)} tokens, {merge_count} merges recovered from "
          f"{args.vocab}")
    ok = True
    corpus, randoms = fixed_corpus(), random_strings(args.random, args.seed)
    with tempfile.TemporaryDirectory() as work:
        tokenizer_json = os.path.join(work, "tokenizer.json")
        hf.save(tokenizer_json)
        os.makedirs(os.path.join(work, "split"))
        hf.model.save(os.path.join(work, "split"))
        hf_corpus = [encoding.ids for encoding in hf.encode_batch(corpus, add_special_tokens=False)]
        for loader, vocab in [("qwen.tiktoken", args.vocab), ("tokenizer.json", tokenizer_json),
                              ("vocab.json + merges.txt", os.path.join(work, "split", "vocab.json"))]:
            ok &= compare(f"fixed corpus via {loader}", corpus, our_encode(args.tool, vocab, corpus), hf_corpus)
    hf_random = [encoding.ids for encoding in hf.encode_batch(randoms, add_special_tokens=False)]
    ours_random = our_encode(args.tool, args.vocab, randoms)
    ok &= compare(f"random strings (seed {args.seed})", randoms, ours_random, hf_random)

    texts = corpus + randoms
    ours_ids = our_encode(args.tool, args.vocab, texts)
    ours_back = our_decode(args.tool, args.vocab, ours_ids)
    hf_back = hf.decode_batch([encoding.ids for encoding in hf.encode_batch(texts, add_special_tokens=False)],
                              skip_special_tokens=False)
    bad = [i for i, text in enumerate(texts) if ours_back[i] != unicodedata.normalize("NFC", text).encode()]
    bad_hf = [i for i, text in enumerate(texts) if hf_back[i] != unicodedata.normalize("NFC", text)]
    print(f"decode(encode(x)) == NFC(x): ours {len(texts) - len(bad)}/{len(texts)}, "
          f"HF {len(texts) - len(bad_hf)}/{len(texts)}")
    for i in bad[:5]:
        print(f"  text {texts[i]!r}\n    ours {ours_back[i]!r}")
    ok &= not bad and not bad_hf
    tokens = sum(len(ids) for ids in ours_ids)
    print(f"{'OK' if ok else 'NOT OK'}: {len(corpus)} fixed cases x 3 loaders, {len(randoms)} random strings, "
          f"{tokens} tokens")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
