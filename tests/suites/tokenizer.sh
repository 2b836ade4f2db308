# Qwen2's tokenizer (core/tokenizer.c) against HF tokenizers built from the same qwen.tiktoken: ids on a fixed corpus
# through each loader and on 2,000 random strings, decode(encode(x)) == NFC(x). Without data/qwen2/qwen.tiktoken
# ($QWEN2_TOKENIZER; scripts/get_qwen2_tokenizer.sh fetches it) or the tokenizers package, the check says skipped.
# The unit test (tests/test_tokenizer.c, in the unit suite) needs no vocabulary.
check "tokenizer parity: ids equal HF tokenizers (fixed corpus x 3 loaders, 2000 random strings), decode round trip" \
  python3 tests/check_tokenizer_parity.py
check_fails "tokenize_tool: \$QWEN2_TOKENIZER naming no file is refused by name" "/nonexistent/qwen.tiktoken: No such file" \
  env QWEN2_TOKENIZER=/nonexistent/qwen.tiktoken tests/bin/tokenize_tool encode /dev/null
